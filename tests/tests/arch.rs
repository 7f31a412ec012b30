//! One eBPF bytecode for every architecture: the cross-compiled arm64 binary must embed byte
//! for byte the eBPF objects of the x86_64 one (what differs per architecture is chosen when
//! they are loaded, see `KernelLayout::arch`).

use std::{collections::BTreeSet, fs};

use memcg_trace_tests::*;

/// The eBPF ELF objects (little-endian, `e_machine` EM_BPF) embedded in `bin`, each as its
/// bytes: from its header to the end of its section header table, the end of such an object.
fn ebpf_objects(bin: &[u8]) -> Vec<Vec<u8>> {
    const EM_BPF: u16 = 247;
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(p) = bin[pos..].windows(4).position(|w| w == b"\x7fELF") {
        let at = pos + p;
        pos = at + 4;
        let elf = &bin[at..];

        // ELFCLASS64, little-endian, EM_BPF.
        if elf.len() < 64 || elf[4] != 2 || elf[5] != 1 || u16_at(elf, 18) != EM_BPF {
            continue;
        }

        let shoff = u64_at(elf, 0x28) as usize;
        let (shentsize, shnum) = (u16_at(elf, 0x3a) as usize, u16_at(elf, 0x3c) as usize);
        let Some(end) = shentsize
            .checked_mul(shnum)
            .and_then(|n| n.checked_add(shoff))
            .filter(|e| shnum > 0 && *e <= elf.len())
        else {
            continue;
        };
        out.push(elf[..end].to_vec());
        pos = at + end;
    }
    out
}

#[test]
fn the_arm64_binary_embeds_the_same_ebpf_objects() {
    let name = "the_arm64_binary_embeds_the_same_ebpf_objects";

    // The binary built in this run (`cargo xtask test` with arm64 kernels selected), never a
    // stale one left in target/ by an earlier build.
    let Some(arm64) = std::env::var_os("MEMCG_TRACE_BIN_ARM64")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
    else {
        skip(
            name,
            "MEMCG_TRACE_BIN_ARM64 not set (cargo xtask test sets it when it builds the arm64 binary)",
        );
        return;
    };
    let x86 = fs::read(bin()).expect("the x86_64 binary");
    let arm = fs::read(&arm64).expect("the arm64 binary");
    let (a, b) = (ebpf_objects(&x86), ebpf_objects(&arm));

    // The full object and the legacy one.
    assert_eq!(a.len(), 2, "eBPF objects in the x86_64 binary");
    let set = |v: &[Vec<u8>]| v.iter().cloned().collect::<BTreeSet<_>>();
    assert!(
        set(&a) == set(&b),
        "the arm64 binary's eBPF objects differ from the x86_64 one's ({} and {} objects, sizes {:?} and {:?})",
        a.len(),
        b.len(),
        a.iter().map(Vec::len).collect::<Vec<_>>(),
        b.iter().map(Vec::len).collect::<Vec<_>>()
    );
}
