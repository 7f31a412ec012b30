//! What aya needs of the kernel's BTF, without aya's parse of all of it.
//!
//! aya 0.14 parses the whole of `/sys/kernel/btf/vmlinux` into owned types in every
//! `EbpfLoader::new` (24-28 MiB of heap for a Debian kernel, more than everything else the
//! daemon holds) and takes a parsed `Btf` to load each fentry, fexit, tp_btf and iterator
//! program. Of the kernel's types it then uses only the ids of functions (`FUNC name`, fentry,
//! fexit and `bpf_iter_*`) and of raw tracepoints' typedefs (`btf_trace_NAME`): the object has
//! no CO-RE relocation that would need more (checked on every load, see `loader`), since the
//! kernel's layout reaches the programs as read-only globals read from our own lazy parse.
//!
//! - [`attach_btf`] builds a BTF in which every type keeps its id up to the last one needed,
//!   but only the target functions and `btf_trace_` typedefs keep their kind and name; every
//!   other type is a nameless pointer to void. aya still holds 72 bytes per type (about 8 MiB
//!   for Debian's 6.12, where the targets sit at 90% of the ids), but none of the members,
//!   parameters and enumerators of the full parse.
//! - [`loader`] makes the `EbpfLoader` in a thread of its own that cannot open files: a
//!   seccomp filter of that thread alone makes every open fail, so the loader's own parse
//!   finds nothing. It needs no capability (the thread sets its own no_new_privs first) and
//!   ends with the thread. Where it cannot be done (a kernel without seccomp filters, an
//!   object with CO-RE relocations) the loader is made the ordinary way, and the recording
//!   says why (`meta.tracer.loader_btf_parsed`).

use std::{
    collections::HashSet,
    fs::File,
    io::{BufReader, Read, Seek, SeekFrom},
};

use anyhow::{anyhow, bail, Result};
use aya::{Btf, EbpfLoader, Endianness};

use super::patch;

/// The kernel's BTF.
const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const KIND_PTR: u32 = 2;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC: u32 = 12;

/// The prefix of the typedefs that name raw tracepoints (tp_btf attaches by them).
const TRACEPOINT_TYPEDEF: &[u8] = b"btf_trace_";

/// An `EbpfLoader` for `object` that has not parsed the kernel's BTF, where the object needs
/// none of it; otherwise one that has, and why (the second value).
pub fn loader(object: &[u8]) -> (EbpfLoader<'static>, Option<String>) {
    let why = match patch::core_relocations(object) {
        Ok(0) => match without_kernel_btf() {
            Ok(l) => return (l, None),
            Err(e) => format!("{e:#}"),
        },
        Ok(n) => format!("the object has {n} bytes of CO-RE relocations"),
        Err(e) => format!("{e:#}"),
    };
    (EbpfLoader::new(), Some(why))
}

fn without_kernel_btf() -> Result<EbpfLoader<'static>> {
    std::thread::Builder::new()
        .name("loader".into())
        .spawn(|| -> Result<EbpfLoader<'static>> {
            no_file_opens()?;
            if File::open(VMLINUX).is_ok() {
                bail!("{VMLINUX} still opens in the loader's thread");
            }
            Ok(EbpfLoader::new())
        })
        .map_err(|e| anyhow!("cannot start the loader's thread: {e}"))?
        .join()
        .map_err(|_| anyhow!("the loader's thread panicked"))?
}

/// The audit architecture of this build's system calls (seccomp checks it first).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;
/// The plain `open` call, where the architecture has one.
#[cfg(target_arch = "x86_64")]
const SYS_OPEN: u32 = libc::SYS_open as u32;
#[cfg(target_arch = "aarch64")]
const SYS_OPEN: u32 = libc::SYS_openat as u32;

/// Makes every file open of the calling thread fail with ENOENT, from now until it ends: a
/// seccomp filter of this thread alone (no TSYNC), which needs no capability once the thread
/// has no_new_privs (an attribute of the thread too). Nothing else of the process changes.
fn no_file_opens() -> Result<()> {
    use libc::{
        sock_filter, sock_fprog, BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W,
        SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO,
    };
    let stmt = |code: u32, k: u32| sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8| sock_filter {
        code: (BPF_JMP | BPF_JEQ | BPF_K) as u16,
        jt,
        jf: 0,
        k,
    };

    // struct seccomp_data: nr at 0, arch at 4.
    let filter = [
        stmt(BPF_LD | BPF_W | BPF_ABS, 4),
        jeq(AUDIT_ARCH, 1),
        stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        stmt(BPF_LD | BPF_W | BPF_ABS, 0),
        jeq(libc::SYS_openat as u32, 3),
        jeq(libc::SYS_openat2 as u32, 2),
        jeq(SYS_OPEN, 1),
        stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | libc::ENOENT as u32),
    ];
    let prog = sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut sock_filter,
    };
    let errno = |what: &str| anyhow!("{what}: {}", std::io::Error::last_os_error());

    // SAFETY: prctl with integer arguments; it sets this thread's no_new_privs.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(errno("no_new_privs for the loader's thread"));
    }

    // SAFETY: `prog` points at `filter`, both alive through the call, which copies them.
    if unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const sock_fprog,
        )
    } != 0
    {
        return Err(errno("seccomp filter for the loader's thread"));
    }
    Ok(())
}

/// The kernel's BTF cut down to what loading programs for `names` needs: each type keeps its
/// id up to the last one kept, but only the functions named `NAME` and the raw tracepoints'
/// typedefs `btf_trace_NAME` keep kind and name. aya keeps every type it parses, 72 bytes
/// each, so the types after the last needed one are left out too.
pub fn attach_btf<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Btf> {
    let mut funcs = HashSet::new();
    let mut tracepoints = HashSet::new();
    for n in names {
        funcs.insert(n.as_bytes().to_vec());
        tracepoints.insert([TRACEPOINT_TYPEDEF, n.as_bytes()].concat());
    }

    let f = File::open(VMLINUX).map_err(|e| anyhow!("cannot read {VMLINUX}: {e}"))?;
    let stub = ids_only(f, |kind, name| match kind {
        KIND_FUNC => funcs.contains(name),
        KIND_TYPEDEF => tracepoints.contains(name),
        _ => false,
    })?;
    Btf::parse(&stub, Endianness::default()).map_err(|e| anyhow!("parsing the cut-down BTF: {e}"))
}

/// The bytes that follow a type's 12-byte header, by kind (0 for kinds with none).
fn extra_bytes(kind: u32, vlen: u64) -> Option<u64> {
    Some(match kind {
        // int, var, decl_tag
        1 | 14 | 17 => 4,
        // ptr, fwd, typedef, volatile, const, restrict, func, float, type_tag
        2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
        // array
        3 => 12,
        // struct, union, datasec, enum64
        4 | 5 | 15 | 19 => vlen * 12,
        // enum, func_proto
        6 | 13 => vlen * 8,
        _ => return None,
    })
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The BTF read from `r` (little-endian) with the same type ids up to the last function or
/// typedef `keep` (given kind and name) accepts: those keep kind, name and (functions)
/// linkage, every other type becomes a nameless pointer to void, and no type refers to
/// another. Read as a stream: the string section, then the types through a small buffer.
pub fn ids_only<R: Read + Seek>(mut r: R, keep: impl Fn(u32, &[u8]) -> bool) -> Result<Vec<u8>> {
    let bad = |what: &str| anyhow!("the kernel's BTF is not as expected: {what}");
    let mut hdr = [0u8; 24];
    r.read_exact(&mut hdr).map_err(|_| bad("no header"))?;
    if hdr[..2] != [0x9f, 0xeb] {
        bail!(bad("no little-endian BTF header"));
    }

    let (hdr_len, type_off, type_len, str_off, str_len) = (
        le32(&hdr, 4) as u64,
        le32(&hdr, 8) as u64,
        le32(&hdr, 12) as u64,
        le32(&hdr, 16) as u64,
        le32(&hdr, 20) as usize,
    );
    let mut strings = vec![0u8; str_len];
    r.seek(SeekFrom::Start(hdr_len + str_off))
        .and_then(|_| r.read_exact(&mut strings))
        .map_err(|_| bad("string section out of range"))?;
    r.seek(SeekFrom::Start(hdr_len + type_off))
        .map_err(|_| bad("type section out of range"))?;
    let mut reader = BufReader::with_capacity(1 << 16, r);

    // The header is written last.
    let mut out = vec![0u8; 24];
    let mut names = vec![0u8];
    let mut kept_end = out.len();
    let mut at = 0u64;
    let mut head = [0u8; 12];
    while at < type_len {
        reader
            .read_exact(&mut head)
            .map_err(|_| bad("a type cut short"))?;
        let (name_off, info) = (le32(&head, 0) as usize, le32(&head, 4));
        let kind = (info >> 24) & 0x1f;
        let extra = extra_bytes(kind, (info & 0xffff) as u64)
            .ok_or_else(|| bad(&format!("unknown kind {kind}")))?;
        reader
            .seek_relative(extra as i64)
            .map_err(|_| bad("a type cut short"))?;
        at += 12 + extra;
        let name = strings
            .get(name_off..)
            .and_then(|s| s.split(|&b| b == 0).next())
            .ok_or_else(|| bad("a name out of range"))?;
        if matches!(kind, KIND_FUNC | KIND_TYPEDEF) && !name.is_empty() && keep(kind, name) {
            out.extend_from_slice(&(names.len() as u32).to_le_bytes());
            names.extend_from_slice(name);
            names.push(0);

            // A function's vlen is its linkage; the kind flag is not ours to keep.
            out.extend_from_slice(&(info & !(1 << 31)).to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            kept_end = out.len();
        } else {
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&(KIND_PTR << 24).to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
        }
    }

    if at != type_len {
        bail!(bad("the last type overruns its section"));
    }

    drop(strings);
    out.truncate(kept_end);
    let types = (out.len() - 24) as u32;
    out[..4].copy_from_slice(&[0x9f, 0xeb, 1, 0]);
    for (i, v) in [24, 0, types, types, names.len() as u32]
        .into_iter()
        .enumerate()
    {
        out[4 + 4 * i..8 + 4 * i].copy_from_slice(&v.to_le_bytes());
    }

    out.extend_from_slice(&names);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;
    use aya_obj::btf::BtfKind;

    fn blob(types: &[[u32; 3]], strings: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0x9f, 0xeb, 1, 0];
        let tl = (types.len() * 12) as u32;
        for v in [24, 0, tl, tl, strings.len() as u32] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }

        for t in types {
            for v in t {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }

        bytes.extend_from_slice(strings);
        bytes
    }

    /// Every function and raw tracepoint asked for has the id in the cut-down BTF that it has
    /// in aya's full parse of this machine's kernel; nothing else is named, and nothing after
    /// the last one asked for is kept.
    #[test]
    fn the_cut_down_btf_keeps_the_ids_of_what_is_asked_for() {
        let Ok(raw) = std::fs::read(VMLINUX) else {
            eprintln!("skipping the_cut_down_btf_keeps_the_ids_of_what_is_asked_for: no {VMLINUX}");
            return;
        };
        let full = Btf::parse(&raw, Endianness::default()).expect("aya parses the kernel's BTF");
        let names = [
            "mod_memcg_state",
            "bpf_fentry_test1",
            "bpf_iter_bpf_prog",
            "sched_switch",
            "irq_handler_entry",
            "no_such_function_or_tracepoint",
        ];
        let stub = attach_btf(names).unwrap();
        let mut last = 0;
        for name in names {
            let want = full.id_by_type_name_kind(name, BtfKind::Func).ok();
            assert_eq!(
                stub.id_by_type_name_kind(name, BtfKind::Func).ok(),
                want,
                "{name}"
            );
            let tp = format!("btf_trace_{name}");
            let want_tp = full.id_by_type_name_kind(&tp, BtfKind::Typedef).ok();
            assert_eq!(
                stub.id_by_type_name_kind(&tp, BtfKind::Typedef).ok(),
                want_tp,
                "{tp}"
            );
            last = last.max(want.unwrap_or(0)).max(want_tp.unwrap_or(0));
        }

        assert!(last > 0, "none of {names:?} in this kernel's BTF");
        for (name, kind) in [
            ("task_struct", BtfKind::Struct),
            ("schedule", BtfKind::Func),
        ] {
            assert!(full.id_by_type_name_kind(name, kind).is_ok(), "{name}");
            assert!(
                stub.id_by_type_name_kind(name, kind).is_err(),
                "{name} kept"
            );
        }

        // Ids past the last type kept are gone.
        let cut = ids_only(Cursor::new(&raw), |_, _| false).unwrap();
        assert_eq!(
            cut.len(),
            24 + 1,
            "nothing kept: a header and the empty name"
        );
    }

    #[test]
    fn a_function_keeps_its_id_and_linkage_and_the_rest_is_nameless() {
        // 1: int "int" (4 extra bytes), 2: struct "s" with one member "m" (12 extra bytes),
        // 3: func "f" (global linkage), 4: typedef "btf_trace_t", 5: func "g".
        let strings = b"\0int\0s\0m\0f\0btf_trace_t\0g\0";
        let mut types = Vec::new();
        for v in [1u32, 1 << 24, 4, 32] {
            types.extend_from_slice(&v.to_le_bytes());
        }

        for v in [5u32, (4 << 24) | 1, 4, 7, 1, 0] {
            types.extend_from_slice(&v.to_le_bytes());
        }

        for v in [9u32, (12 << 24) | 1, 2, 11, 8 << 24, 1, 23, 12 << 24, 2] {
            types.extend_from_slice(&v.to_le_bytes());
        }

        let mut bytes = vec![0x9f, 0xeb, 1, 0];
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }

        bytes.extend_from_slice(&types);
        bytes.extend_from_slice(strings);
        let keep = |kind: u32, name: &[u8]| {
            (kind == KIND_FUNC && name == b"f") || (kind == KIND_TYPEDEF && name == b"btf_trace_t")
        };
        let raw = ids_only(Cursor::new(&bytes), keep).unwrap();

        // Four types (through the last kept), then the names "f" and "btf_trace_t".
        assert_eq!(le32(&raw, 12), 4 * 12, "types through the last kept one");
        assert_eq!(
            le32(&raw, 24 + 2 * 12 + 4),
            (12 << 24) | 1,
            "f's kind and linkage"
        );
        assert_eq!(
            le32(&raw, 24 + 4),
            KIND_PTR << 24,
            "the int is a nameless pointer"
        );
        assert_eq!(&raw[24 + 4 * 12..], b"\0f\0btf_trace_t\0");
        let cut = Btf::parse(&raw, Endianness::default()).unwrap();
        assert_eq!(cut.id_by_type_name_kind("f", BtfKind::Func).unwrap(), 3);
        assert_eq!(
            cut.id_by_type_name_kind("btf_trace_t", BtfKind::Typedef)
                .unwrap(),
            4
        );

        // Not asked for, or neither function nor typedef: not named; "g" came after the last
        // kept type. Accepting everything keeps every function and typedef, and only those.
        assert!(cut.id_by_type_name_kind("int", BtfKind::Int).is_err());
        assert!(cut.id_by_type_name_kind("s", BtfKind::Struct).is_err());
        assert!(cut.id_by_type_name_kind("g", BtfKind::Func).is_err());
        let all = Btf::parse(
            &ids_only(Cursor::new(&bytes), |_, _| true).unwrap(),
            Endianness::default(),
        )
        .unwrap();
        assert_eq!(all.id_by_type_name_kind("g", BtfKind::Func).unwrap(), 5);
        assert!(all.id_by_type_name_kind("s", BtfKind::Struct).is_err());
    }

    #[test]
    fn a_broken_btf_is_refused_not_misread() {
        let keep = |_: u32, _: &[u8]| true;
        assert!(ids_only(Cursor::new(&[]), keep).is_err());
        assert!(ids_only(Cursor::new(&[0u8; 24]), keep).is_err());

        // A type section beyond the data.
        let mut bytes = blob(&[], b"\0");
        bytes[12..16].copy_from_slice(&1000u32.to_le_bytes());
        assert!(ids_only(Cursor::new(&bytes), keep).is_err());

        // A type of an unknown kind.
        assert!(ids_only(Cursor::new(&blob(&[[0, 31 << 24, 0]], b"\0")), keep).is_err());

        // A struct whose members run past the section.
        assert!(ids_only(Cursor::new(&blob(&[[0, (4 << 24) | 3, 8]], b"\0")), keep).is_err());

        // A name outside the string section.
        assert!(ids_only(Cursor::new(&blob(&[[99, 12 << 24, 0]], b"\0")), keep).is_err());
    }
}
