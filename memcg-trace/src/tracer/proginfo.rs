//! The shape of a loaded program as the kernel runs it: its instructions after the verifier's
//! rewrites (helpers it inlined are gone, calls it kept are there), the JIT's machine code size,
//! and the helper calls left in it. From `BPF_OBJ_GET_INFO_BY_FD`, which aya does not expose
//! for the translated instructions.

use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// A loaded program's code, as the kernel holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgCode {
    /// Instructions after the verifier's rewrites (a 64-bit immediate load counts as two).
    pub xlated_insns: u64,
    /// Bytes of JIT-compiled machine code.
    pub jited_bytes: u64,
    /// Call sites of kernel helpers the verifier did not inline.
    pub helper_calls: u64,
    /// Call sites of BPF subprograms (`bpf_loop` callbacks the verifier inlined, and functions
    /// the compiler kept out of line).
    pub subprog_calls: u64,
    /// Instructions the verifier processed to prove the program safe (0 before 5.16).
    pub verified_insns: u64,
}

/// `struct bpf_prog_info` up to `verified_insns` (include/uapi/linux/bpf.h).
const INFO_LEN: usize = 220;
const OFF_JITED_LEN: usize = 16;
const OFF_XLATED_LEN: usize = 20;
const OFF_XLATED_INSNS: usize = 32;
const OFF_VERIFIED: usize = 216;
const OFF_TYPE: usize = 0;
const OFF_ID: usize = 4;
const OFF_NAME: usize = 64;
const OFF_RUN_TIME: usize = 192;
const OFF_RUN_CNT: usize = 200;
const OFF_MISSES: usize = 208;
/// `BPF_PROG_GET_NEXT_ID`.
const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
/// `BPF_PROG_GET_FD_BY_ID`.
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
/// `BPF_OBJ_GET_INFO_BY_FD`.
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `BPF_JMP | BPF_CALL`.
const CALL: u8 = 0x85;

/// Fills `info`; returns the length the kernel wrote (its struct may be shorter).
fn get_info(fd: BorrowedFd<'_>, info: &mut [u8; INFO_LEN]) -> Result<usize> {
    #[repr(C)]
    struct Attr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }

    let mut attr = Attr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: INFO_LEN as u32,
        info: info.as_mut_ptr() as u64,
    };

    // SAFETY: the attribute and the info buffer outlive the call and are sized as declared.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    if ret < 0 {
        bail!(
            "BPF_OBJ_GET_INFO_BY_FD: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(attr.info_len as usize)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// `bpf(cmd, {a, b, c})` for the commands whose attribute is three u32s; returns the result.
fn bpf3(cmd: libc::c_long, a: u32, b: u32, c: u32) -> std::io::Result<(i64, [u32; 3])> {
    let mut attr = [a, b, c];

    // SAFETY: the attribute outlives the call and is sized as declared.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 12usize) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((r, attr))
}

/// A program's run time, run count and recursion misses (`run_time_ns`, `run_cnt`,
/// `recursion_misses`): one system call, where its fdinfo takes six. None where the kernel's
/// info is shorter (recursion misses came in 5.12) or the call fails.
pub fn stats(fd: BorrowedFd<'_>) -> Option<(u64, u64, u64)> {
    let mut info = [0u8; INFO_LEN];
    let len = get_info(fd, &mut info).ok()?;
    (len >= OFF_MISSES + 8).then(|| {
        (
            u64_at(&info, OFF_RUN_TIME),
            u64_at(&info, OFF_RUN_CNT),
            u64_at(&info, OFF_MISSES),
        )
    })
}

/// One program loaded in the kernel, by anyone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loaded {
    /// Program id.
    pub id: u32,
    /// `enum bpf_prog_type` value (2 kprobe, 5 tracepoint, 17 raw tracepoint, 26 tracing).
    pub prog_type: u32,
    /// Its name (the kernel keeps 15 characters).
    pub name: String,
    /// Runs counted while bpf stats were on.
    pub run_cnt: u64,
    /// Their total run time, ns.
    pub run_time_ns: u64,
    /// Runs skipped by the recursion guard.
    pub recursion_misses: u64,
    /// Its code.
    #[serde(flatten)]
    pub code: ProgCode,
}

/// Every program loaded in the kernel, with its statistics and code.
pub fn loaded() -> Result<Vec<Loaded>> {
    let mut out = Vec::new();
    let mut id = 0;
    loop {
        id = match bpf3(BPF_PROG_GET_NEXT_ID, id, 0, 0) {
            Ok((_, a)) => a[1],
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => bail!("BPF_PROG_GET_NEXT_ID: {e}"),
        };

        // Gone meanwhile: skip it.
        let Ok((fd, _)) = bpf3(BPF_PROG_GET_FD_BY_ID, id, 0, 0) else {
            continue;
        };

        // SAFETY: a new descriptor the kernel just returned, owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut info = [0u8; INFO_LEN];
        get_info(fd.as_fd(), &mut info)?;
        let name = &info[OFF_NAME..OFF_NAME + 16];
        let name =
            String::from_utf8_lossy(&name[..name.iter().position(|&b| b == 0).unwrap_or(16)])
                .into_owned();
        out.push(Loaded {
            id: u32_at(&info, OFF_ID),
            prog_type: u32_at(&info, OFF_TYPE),
            name,
            run_cnt: u64_at(&info, OFF_RUN_CNT),
            run_time_ns: u64_at(&info, OFF_RUN_TIME),
            recursion_misses: u64_at(&info, OFF_MISSES),
            code: code(fd.as_fd())?,
        });
    }
    Ok(out)
}

/// Counts the call sites in translated instructions: (helpers, subprograms).
pub fn calls(xlated: &[u8]) -> (u64, u64) {
    let (mut helpers, mut subprogs) = (0, 0);
    for insn in xlated.chunks_exact(8) {
        if insn[0] == CALL {
            match insn[1] >> 4 {
                0 => helpers += 1,
                1 => subprogs += 1,
                _ => {}
            }
        }
    }
    (helpers, subprogs)
}

/// The code of the program behind `fd`.
pub fn code(fd: BorrowedFd<'_>) -> Result<ProgCode> {
    let mut info = [0u8; INFO_LEN];
    get_info(fd, &mut info)?;
    let xlated_len = u32_at(&info, OFF_XLATED_LEN) as usize;
    let jited = u32_at(&info, OFF_JITED_LEN) as u64;
    let verified = u32_at(&info, OFF_VERIFIED) as u64;
    let mut xlated = vec![0u8; xlated_len];
    let mut info = [0u8; INFO_LEN];
    info[OFF_XLATED_LEN..OFF_XLATED_LEN + 4].copy_from_slice(&(xlated_len as u32).to_le_bytes());
    info[OFF_XLATED_INSNS..OFF_XLATED_INSNS + 8]
        .copy_from_slice(&(xlated.as_mut_ptr() as u64).to_le_bytes());
    get_info(fd, &mut info)?;
    if let Ok(dir) = std::env::var("MEMCG_TRACE_DUMP_XLATED") {
        let _ = std::fs::write(format!("{dir}/{}.bin", fd.as_raw_fd()), &xlated);
    }

    // The kernel hands out translated instructions only to those allowed raw dumps
    // (bpf_dump_raw_ok); otherwise it reports the length and leaves the buffer zeroed.
    let (helper_calls, subprog_calls) = calls(&xlated);
    Ok(ProgCode {
        xlated_insns: (xlated_len / 8) as u64,
        jited_bytes: jited,
        helper_calls,
        subprog_calls,
        verified_insns: verified,
    })
}

#[cfg(test)]
mod tests {
    use super::calls;

    #[test]
    fn counts_helper_and_subprogram_calls_only() {
        let insns: Vec<u8> = [
            [0x85, 0x00, 0, 0, 5, 0, 0, 0],    // call helper 5
            [0x85, 0x10, 0, 0, 3, 0, 0, 0],    // call subprogram +3
            [0x85, 0x20, 0, 0, 9, 0, 0, 0],    // call kfunc
            [0xb7, 0x00, 0, 0, 0x85, 0, 0, 0], // mov r0, 0x85: not a call
            [0x95, 0, 0, 0, 0, 0, 0, 0],       // exit
        ]
        .concat();
        assert_eq!(calls(&insns), (1, 1));
        assert_eq!(calls(&[]), (0, 0));
    }
}
