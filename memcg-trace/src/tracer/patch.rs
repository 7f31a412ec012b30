//! Rewrites the eBPF object before it is loaded, where Rust eBPF cannot say what the programs
//! mean: each `ld_imm64` of [`PERCPU_VAR_MARKER`] becomes a `BPF_PSEUDO_BTF_ID` load of the
//! kernel's per-CPU variable holding the preempt count, so the programs reach it with
//! `bpf_this_cpu_ptr` and a plain load instead of a `bpf_probe_read_kernel` call.
//!
//! Each `call` of helper number [`RDONLY_CAST_MARKER`] likewise becomes a
//! `BPF_PSEUDO_KFUNC_CALL` of the kernel's `bpf_rdonly_cast`, so the programs read an address
//! they computed with a plain fault-safe load instead of a `bpf_probe_read_kernel` call.
//!
//! Each load whose offset is a [`LeanField::marker`] (the patched programs' reads of the task's
//! fields) gets the field's offset from the kernel's layout, so that the programs load it
//! without first loading the offset from the read-only layout.
//!
//! Only the instructions of executable sections are touched; the object's relocations, BTF and
//! line info stay valid because an instruction's size and position do not change.

use anyhow::{bail, Result};
use memcg_trace_common::{KernelLayout, LeanField, PERCPU_VAR_MARKER, RDONLY_CAST_MARKER};

/// `BPF_LD | BPF_IMM | BPF_DW`: the first half of a 64-bit immediate load.
const LD_IMM64: u8 = 0x18;
/// `src_reg` of an `ld_imm64` whose immediate is a BTF id of a kernel variable.
const BPF_PSEUDO_BTF_ID: u8 = 3;
/// `BPF_JMP | BPF_CALL`.
const CALL: u8 = 0x85;
/// `src_reg` of a `call` whose immediate is the BTF id of a kernel function (a kfunc).
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
/// `BPF_LDX | BPF_MEM | BPF_DW`: a u64 load.
const LDX_DW: u8 = 0x79;
/// `SHF_EXECINSTR`.
const SHF_EXECINSTR: u64 = 0x4;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The section header table of a little-endian ELF64 object: (offset, entry size, entries).
fn section_table(elf: &[u8]) -> Result<(usize, usize, usize)> {
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        bail!("the eBPF object is not a little-endian ELF64 file");
    }

    let bad = || anyhow::anyhow!("the eBPF object's section headers are truncated");
    Ok((
        u64_at(elf, 0x28).ok_or_else(bad)? as usize,
        u16_at(elf, 0x3a).ok_or_else(bad)? as usize,
        u16_at(elf, 0x3c).ok_or_else(bad)? as usize,
    ))
}

/// The (offset, size) of every executable section of a little-endian ELF64 object.
fn code_sections(elf: &[u8]) -> Result<Vec<(usize, usize)>> {
    let bad = || anyhow::anyhow!("the eBPF object's section headers are truncated");
    let (shoff, shentsize, shnum) = section_table(elf)?;
    let mut out = Vec::new();
    for i in 0..shnum {
        let header = shoff + i * shentsize;
        let flags = u64_at(elf, header + 8).ok_or_else(bad)?;
        let (off, size) = (
            u64_at(elf, header + 0x18).ok_or_else(bad)? as usize,
            u64_at(elf, header + 0x20).ok_or_else(bad)? as usize,
        );

        // SHT_NOBITS sections have no bytes in the file.
        if flags & SHF_EXECINSTR != 0 && u32_at(elf, header + 4) != Some(8) {
            if off.checked_add(size).is_none_or(|end| end > elf.len()) {
                bail!("the eBPF object's section {i} lies outside the file");
            }

            out.push((off, size));
        }
    }
    Ok(out)
}

/// The (offset, size) of the section named `name` of a little-endian ELF64 object.
fn section(elf: &[u8], name: &[u8]) -> Result<Option<(usize, usize)>> {
    let bad = || anyhow::anyhow!("the eBPF object's section headers are truncated");
    let (shoff, shentsize, shnum) = section_table(elf)?;
    let shstrndx = u16_at(elf, 0x3e).ok_or_else(bad)? as usize;
    let strtab = u64_at(elf, shoff + shstrndx * shentsize + 0x18).ok_or_else(bad)? as usize;
    for i in 0..shnum {
        let h = shoff + i * shentsize;
        let n = strtab + u32_at(elf, h).ok_or_else(bad)? as usize;
        let at = elf.get(n..n + name.len() + 1).ok_or_else(bad)?;
        if &at[..name.len()] == name && at[name.len()] == 0 {
            let off = u64_at(elf, h + 0x18).ok_or_else(bad)? as usize;
            let size = u64_at(elf, h + 0x20).ok_or_else(bad)? as usize;
            if off.checked_add(size).is_none_or(|end| end > elf.len()) {
                bail!("the eBPF object's section {i} lies outside the file");
            }

            return Ok(Some((off, size)));
        }
    }
    Ok(None)
}

/// Drops the line info of the object's `.BTF.ext` (source lines per instruction, for the
/// verifier's messages): its length in the header becomes 0, so neither the loader nor the
/// kernel reads the records. They are half of the object; the loader would keep a parsed copy
/// of them through start-up, where the daemon's peak memory is set. Returns whether it did.
pub fn drop_line_info(elf: &mut [u8]) -> Result<bool> {
    let Some((off, size)) = section(elf, b".BTF.ext")? else {
        return Ok(false);
    };

    // struct btf_ext_header: magic, version, flags, hdr_len, func_info_off, func_info_len,
    // line_info_off, line_info_len, ...
    if size < 24 || u16_at(elf, off) != Some(0xeb9f) {
        bail!("the eBPF object's .BTF.ext has no valid header");
    }

    let len = off + 20;
    if u32_at(elf, len) == Some(0) {
        return Ok(false);
    }
    elf[len..len + 4].copy_from_slice(&0u32.to_le_bytes());
    Ok(true)
}

/// The length in bytes of the object's CO-RE relocation records (`.BTF.ext` core_relo_len; 0
/// when the header predates them or there is no `.BTF.ext`). Only an object with none can be
/// loaded without the kernel's full BTF.
pub fn core_relocations(elf: &[u8]) -> Result<u32> {
    let Some((off, size)) = section(elf, b".BTF.ext")? else {
        return Ok(0);
    };
    if size < 24 || u16_at(elf, off) != Some(0xeb9f) {
        bail!("the eBPF object's .BTF.ext has no valid header");
    }

    let hdr_len = u32_at(elf, off + 4).unwrap_or(0) as usize;
    if hdr_len < 32 || size < 32 {
        return Ok(0);
    }
    Ok(u32_at(elf, off + 28).unwrap_or(0))
}

/// Walks every instruction of the executable sections of `elf` (an `ld_imm64` is one
/// instruction of 16 bytes, others 8) and hands each to `rewrite`, which changes it in place
/// and says whether it did; returns how many it changed.
fn rewrite_insns(elf: &mut [u8], mut rewrite: impl FnMut(&mut [u8]) -> bool) -> Result<usize> {
    let mut changed = 0;
    for (off, size) in code_sections(elf)? {
        let code = &mut elf[off..off + size];
        let mut pos = 0;
        while pos + 8 <= code.len() {
            let width = if code[pos] == LD_IMM64 { 16 } else { 8 };
            if pos + width > code.len() {
                break;
            }
            changed += rewrite(&mut code[pos..pos + width]) as usize;
            pos += width;
        }
    }
    Ok(changed)
}

/// Rewrites every marker load in `elf` into a load of the kernel variable `btf_id`; returns
/// how many it rewrote.
pub fn percpu_var(elf: &mut [u8], btf_id: u32) -> Result<usize> {
    let lo = (PERCPU_VAR_MARKER as u32).to_le_bytes();
    let hi = ((PERCPU_VAR_MARKER >> 32) as u32).to_le_bytes();
    rewrite_insns(elf, |insn| {
        if insn.len() != 16
            || insn[1] >> 4 != 0
            || insn[4..8] != lo
            || insn[8..12] != [0; 4]
            || insn[12..16] != hi
        {
            return false;
        }

        // dst_reg stays; src_reg = BPF_PSEUDO_BTF_ID; imm = the id; the second half's imm =
        // 0: the id is in vmlinux, not a module.
        insn[1] = (insn[1] & 0x0f) | (BPF_PSEUDO_BTF_ID << 4);
        insn[4..8].copy_from_slice(&btf_id.to_le_bytes());
        insn[12..16].copy_from_slice(&[0; 4]);
        true
    })
}

/// Rewrites every `call` of helper number [`RDONLY_CAST_MARKER`] in `elf` into a call of the
/// vmlinux kfunc `btf_id`; returns how many it rewrote.
pub fn rdonly_cast(elf: &mut [u8], btf_id: u32) -> Result<usize> {
    let marker = RDONLY_CAST_MARKER.to_le_bytes();
    rewrite_insns(elf, |insn| {
        if insn[0] != CALL || insn[1] != 0 || insn[4..8] != marker {
            return false;
        }

        // dst 0, src BPF_PSEUDO_KFUNC_CALL; off 0: the function is in vmlinux.
        insn[1] = BPF_PSEUDO_KFUNC_CALL << 4;
        insn[2..4].copy_from_slice(&[0; 2]);
        insn[4..8].copy_from_slice(&btf_id.to_le_bytes());
        true
    })
}

/// The offsets the patched programs' marked loads take on a kernel of `layout`, in
/// [`LeanField::ALL`]'s order; None where one does not fit a load's 16-bit offset (the patched
/// and lean programs are then not used).
pub fn lean_offsets(layout: &KernelLayout) -> Option<[i16; LeanField::ALL.len()]> {
    let mut out = [0i16; LeanField::ALL.len()];
    for (o, f) in out.iter_mut().zip(LeanField::ALL) {
        *o = i16::try_from(f.offset(layout)).ok()?;
    }
    Some(out)
}

/// Rewrites the offset of every u64 load in `elf` that carries a [`LeanField::marker`] into
/// that field's offset from `offsets` ([`lean_offsets`]); returns how many it rewrote.
pub fn lean_fields(elf: &mut [u8], offsets: &[i16; LeanField::ALL.len()]) -> Result<usize> {
    let first = LeanField::ALL[0].marker();
    rewrite_insns(elf, |insn| {
        if insn[0] != LDX_DW {
            return false;
        }

        let off = i16::from_le_bytes([insn[2], insn[3]]);
        let Some(i) = off
            .checked_sub(first)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < offsets.len())
        else {
            return false;
        };
        insn[2..4].copy_from_slice(&offsets[i].to_le_bytes());
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcg_trace_common::MAX_PROBES;

    /// The object this binary carries, in memory aligned like the loader's copy.
    fn object() -> Vec<u8> {
        super::super::EBPF_OBJECT.to_vec()
    }

    #[test]
    fn rewrites_every_marker_of_the_real_object_and_nothing_else() {
        let orig = object();
        if orig.is_empty() {
            eprintln!("skipping rewrites_every_marker_of_the_real_object_and_nothing_else: built with AYA_BUILD_SKIP (no eBPF object)");
            return;
        }

        let mut elf = orig.clone();
        let rewritten = percpu_var(&mut elf, 0x1234_5678).expect("patch");

        // One site per inlined context read: the entry, exit and tracepoint programs of every
        // probe slot read the context at least once.
        assert!(rewritten >= 12 * 3, "only {rewritten} marker loads found");
        let changed: Vec<usize> = (0..orig.len()).filter(|&i| orig[i] != elf[i]).collect();

        // Per site: the register byte, four immediate bytes (the id's four differ from the
        // marker's), at most four of the second half.
        assert!(
            changed.len() <= rewritten * 9,
            "{} bytes changed",
            changed.len()
        );
        assert!(percpu_var(&mut elf, 1).unwrap() == 0, "a marker survived");
        let marker = PERCPU_VAR_MARKER.to_le_bytes();
        assert!(
            !elf.windows(4).any(|w| w == &marker[..4]),
            "marker bytes remain somewhere in the object"
        );
    }

    #[test]
    fn rewrites_every_lean_field_load_of_the_real_object_and_nothing_else() {
        let orig = object();
        if orig.is_empty() {
            eprintln!("skipping rewrites_every_lean_field_load_of_the_real_object_and_nothing_else: built with AYA_BUILD_SKIP (no eBPF object)");
            return;
        }

        let layout = KernelLayout {
            task_nvcsw: 0x101,
            task_nivcsw: 0x109,
            task_migrations: 0x211,
            task_exec_start: 0x319,
            task_sum_exec: 0x421,
            task_cgroups: 0x529,
            cset_dfl_cgrp: 0x631,
            ..Default::default()
        };
        let offsets = lean_offsets(&layout).expect("offsets fit");
        let mut elf = orig.clone();
        let rewritten = lean_fields(&mut elf, &offsets).expect("patch");

        // Every probe slot's patched and lean pairs load each field at least once.
        let pairs = 2 * MAX_PROBES;
        assert!(
            rewritten >= pairs * LeanField::ALL.len(),
            "only {rewritten} marked loads found"
        );

        // Only the two offset bytes of marked loads changed, each marker to its own field's
        // offset; every field's marker was found in every probe slot's patched and lean
        // programs. (Code
        // sections are 8-byte aligned in the file, as their instructions are.)
        let changed: Vec<usize> = (0..orig.len()).filter(|&i| orig[i] != elf[i]).collect();
        assert!(
            changed.len() <= rewritten * 2,
            "{} bytes changed",
            changed.len()
        );
        for &i in &changed {
            assert!(
                (2..4).contains(&(i % 8)),
                "byte {i} changed outside a load's offset"
            );
        }

        let mut insns: Vec<usize> = changed.iter().map(|&i| i - i % 8).collect();
        insns.dedup();
        let mut per_field = [0usize; LeanField::ALL.len()];
        for insn in insns {
            assert_eq!(
                elf[insn], LDX_DW,
                "an instruction at {insn} changed that is no u64 load"
            );
            let was = i16::from_le_bytes([orig[insn + 2], orig[insn + 3]]);
            let now = i16::from_le_bytes([elf[insn + 2], elf[insn + 3]]);
            let field = LeanField::ALL
                .into_iter()
                .find(|f| f.marker() == was)
                .unwrap_or_else(|| panic!("the load at {insn} had offset {was}, no marker"));
            assert_eq!(now, offsets[field as usize], "{field:?}'s load at {insn}");
            per_field[field as usize] += 1;
        }

        for f in LeanField::ALL {
            let n = per_field[f as usize];
            assert!(n >= pairs, "{f:?}: only {n} loads");
        }

        assert_eq!(
            lean_fields(&mut elf, &offsets).unwrap(),
            0,
            "a marker survived"
        );

        // A kernel whose field lies beyond a load's reach has no lean offsets.
        let far = KernelLayout {
            task_sum_exec: 0x8000,
            ..layout
        };
        assert_eq!(lean_offsets(&far), None);
    }

    /// A minimal ELF64 whose one executable section holds `code`: the file, the code's offset
    /// and the section headers' offset.
    fn one_section_elf(code: &[u8]) -> (Vec<u8>, usize, usize) {
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let code_off = elf.len();
        elf.extend(code);
        let shoff = elf.len();
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        elf.extend([0u8; 64]); // the null section
        let mut sh = [0u8; 64];
        sh[4..8].copy_from_slice(&1u32.to_le_bytes()); // SHT_PROGBITS
        sh[8..16].copy_from_slice(&(SHF_EXECINSTR | 2).to_le_bytes());
        sh[0x18..0x20].copy_from_slice(&(code_off as u64).to_le_bytes());
        sh[0x20..0x28].copy_from_slice(&(code.len() as u64).to_le_bytes());
        elf.extend(sh);
        (elf, code_off, shoff)
    }

    #[test]
    fn rewrites_every_cast_call_of_the_real_object_and_nothing_else() {
        let orig = object();
        if orig.is_empty() {
            eprintln!("skipping rewrites_every_cast_call_of_the_real_object_and_nothing_else: built with AYA_BUILD_SKIP (no eBPF object)");
            return;
        }

        let mut elf = orig.clone();
        let casts = rdonly_cast(&mut elf, 0x0abc_def1).expect("patch");

        // One site per inlined preempt count read (as many as the per-CPU variable's loads),
        // and two per current task read.
        let loads = percpu_var(&mut orig.clone(), 1).unwrap();
        assert!(
            casts > loads,
            "{casts} casts for {loads} preempt count reads"
        );
        let changed: Vec<usize> = (0..orig.len()).filter(|&i| orig[i] != elf[i]).collect();

        // Per site: the register byte and four immediate bytes.
        assert!(
            changed.len() <= casts * 5,
            "{} bytes changed",
            changed.len()
        );
        assert_eq!(
            rdonly_cast(&mut elf, 1).unwrap(),
            0,
            "a marker call survived"
        );
    }

    #[test]
    fn drops_the_line_info_of_the_real_object_and_nothing_else() {
        let orig = object();
        if orig.is_empty() {
            eprintln!("skipping drops_the_line_info_of_the_real_object_and_nothing_else: built with AYA_BUILD_SKIP (no eBPF object)");
            return;
        }

        let (off, _) = section(&orig, b".BTF.ext")
            .unwrap()
            .expect("the object has .BTF.ext");
        assert_eq!(
            u16_at(&orig, off),
            Some(0xeb9f),
            "the .BTF.ext header's magic"
        );
        let line_info_len = u32_at(&orig, off + 20).unwrap();
        assert!(line_info_len > 0, "the object carries line info");
        let mut elf = orig.clone();
        assert!(drop_line_info(&mut elf).unwrap());
        let changed: Vec<usize> = (0..orig.len()).filter(|&i| orig[i] != elf[i]).collect();
        assert!(
            !changed.is_empty() && changed.iter().all(|i| (off + 20..off + 24).contains(i)),
            "only the line info length changes: {changed:?}"
        );
        assert_eq!(u32_at(&elf, off + 20), Some(0));

        // The function info stays (the kernel checks it with the subprograms).
        assert_eq!(u32_at(&elf, off + 12), u32_at(&orig, off + 12));
        assert!(!drop_line_info(&mut elf).unwrap(), "nothing left to drop");

        // The loader still reads the object, with every program.
        let count = |b: &[u8]| {
            aya_obj::Object::parse(b)
                .expect("aya reads it")
                .programs
                .len()
        };
        assert_eq!(count(&elf), count(&orig));
        assert!(drop_line_info(&mut [0u8; 8]).is_err());
    }

    /// The cut-down kernel BTF (`kbtf`) is only safe for an object without CO-RE relocations:
    /// the real object has none, and one whose header says it has is seen.
    #[test]
    fn counts_the_core_relocations() {
        let orig = object();
        if orig.is_empty() {
            eprintln!(
                "skipping counts_the_core_relocations: built with AYA_BUILD_SKIP (no eBPF object)"
            );
            return;
        }

        assert_eq!(
            core_relocations(&orig).unwrap(),
            0,
            "the object has CO-RE relocations"
        );
        let (off, size) = section(&orig, b".BTF.ext").unwrap().unwrap();
        assert!(
            u32_at(&orig, off + 4).unwrap() >= 32 && size >= 32,
            "a header with the CO-RE fields"
        );
        let mut elf = orig.clone();
        elf[off + 28..off + 32].copy_from_slice(&48u32.to_le_bytes());
        assert_eq!(core_relocations(&elf).unwrap(), 48);

        // A header too short for them: none.
        elf[off + 4..off + 8].copy_from_slice(&24u32.to_le_bytes());
        assert_eq!(core_relocations(&elf).unwrap(), 0);
        elf[off..off + 2].copy_from_slice(&[0, 0]);
        assert!(core_relocations(&elf).is_err(), "a broken header");
    }

    #[test]
    fn rewrites_a_cast_call_in_place() {
        // mov r2, 9; ld_imm64 r1 whose second half looks like the call; call marker; exit.
        let mut code = vec![0xb7, 0x02, 0, 0, 9, 0, 0, 0];
        code.extend([LD_IMM64, 0x01, 0, 0, 0, 0, 0, 0]);
        code.extend([CALL, 0, 0, 0]);
        code.extend(RDONLY_CAST_MARKER.to_le_bytes());
        code.extend([CALL, 0, 0, 0]);
        code.extend(RDONLY_CAST_MARKER.to_le_bytes());
        code.extend([0x95, 0, 0, 0, 0, 0, 0, 0]);
        let (mut elf, code_off, _) = one_section_elf(&code);
        let before = elf.clone();
        assert_eq!(
            rdonly_cast(&mut elf, 4242).unwrap(),
            1,
            "the ld_imm64's halves are data"
        );
        let insn = &elf[code_off + 24..code_off + 32];
        assert_eq!(insn[0], CALL);
        assert_eq!(insn[1], 0x20, "src BPF_PSEUDO_KFUNC_CALL");
        assert_eq!(u32_at(insn, 4), Some(4242));
        assert_eq!(elf[..code_off + 24], before[..code_off + 24]);
        assert_eq!(elf[code_off + 32..], before[code_off + 32..]);
        assert!(rdonly_cast(&mut [0u8; 8], 1).is_err());
    }

    #[test]
    fn rewrites_a_marker_in_place_and_keeps_the_register() {
        // A minimal ELF64 with one executable section holding: mov r0, 0; ld_imm64 r3, marker;
        // exit.
        let mut code = vec![0xb7, 0x00, 0, 0, 0, 0, 0, 0];
        code.extend([LD_IMM64, 0x03, 0, 0]);
        code.extend((PERCPU_VAR_MARKER as u32).to_le_bytes());
        code.extend([0, 0, 0, 0]);
        code.extend(((PERCPU_VAR_MARKER >> 32) as u32).to_le_bytes());
        code.extend([0x95, 0, 0, 0, 0, 0, 0, 0]);
        let (mut elf, code_off, shoff) = one_section_elf(&code);
        assert_eq!(percpu_var(&mut elf, 77).unwrap(), 1);
        let insn = &elf[code_off + 8..code_off + 24];
        assert_eq!(insn[0], LD_IMM64);
        assert_eq!(insn[1], 0x33, "dst r3 kept, src BPF_PSEUDO_BTF_ID");
        assert_eq!(u32_at(insn, 4), Some(77));
        assert_eq!(u32_at(insn, 12), Some(0));
        assert_eq!(elf[code_off], 0xb7, "the instruction before is untouched");
        assert_eq!(
            elf[code_off + 24],
            0x95,
            "the instruction after is untouched"
        );

        // Not an ELF file: an error, not a panic.
        assert!(percpu_var(&mut [0u8; 8], 1).is_err());
        let mut truncated = elf[..shoff + 10].to_vec();
        assert!(percpu_var(&mut truncated, 1).is_err());
    }
}
