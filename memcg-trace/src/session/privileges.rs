//! What the daemon may do: the capabilities start-up needs and the two it keeps once
//! attached, and the raised priority of start-up.

use super::*;

/// Checks the capabilities tracing needs, naming the missing ones.
pub fn check_privileges() -> Result<()> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let has = |c: u32| cap_eff & (1 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }

    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .iter()
        .filter(|(c, _)| !has(*c))
        .map(|(_, n)| *n)
        .collect();
    bail!(
        "memcg-trace needs root, or CAP_BPF and CAP_PERFMON (missing: {}); run it with sudo",
        missing.join(", ")
    )
}

/// What a session keeps once its programs are attached and its workload started:
/// CAP_DAC_OVERRIDE, to write the recording where root could (a user's directory) and remove its
/// memcg and kprobe events; CAP_KILL, to stop a workload tree that changed its user. Polling the
/// maps, reading the programs' counts and detaching need no capability, except on kernels
/// before 5.19 with unprivileged BPF off, where CAP_BPF (or CAP_SYS_ADMIN) is kept too
/// ([`bpf_needs_caps`]).
pub const KEPT_CAPS: [caps::Capability; 2] = [
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_KILL,
];

/// Drops every capability but [`KEPT_CAPS`] for good: from the bounding set (where this process
/// may), the ambient, inheritable, effective and permitted sets; and sets no_new_privs, so no
/// later execve can give any back (not even to uid 0). Capabilities are per thread: this runs on
/// the session's only thread, and threads started later inherit the reduced sets.
pub fn drop_privileges() -> Result<()> {
    use caps::{CapSet, CapsHashSet};
    let permitted =
        caps::read(None, CapSet::Permitted).map_err(|e| anyhow!("read capabilities: {e}"))?;
    let unprivileged_bpf_off = fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled")
        .map(|v| v.trim() != "0")
        .unwrap_or(true);
    let bpf_needed = bpf_needs_caps(
        crate::kernel::version(&crate::kernel::release()),
        unprivileged_bpf_off,
    );
    let keep: CapsHashSet = KEPT_CAPS
        .iter()
        .copied()
        .chain(
            bpf_needed
                .then_some([caps::Capability::CAP_BPF, caps::Capability::CAP_SYS_ADMIN])
                .into_iter()
                .flatten(),
        )
        .filter(|c| permitted.contains(c))
        .collect();
    // Needs CAP_SETPCAP, which a service account may not have: then the bounding set stays
    // (it only limits what an execve could gain, and no_new_privs rules that out).
    if permitted.contains(&caps::Capability::CAP_SETPCAP) {
        for c in caps::all() {
            if !keep.contains(&c) {
                let _ = caps::drop(None, CapSet::Bounding, c);
            }
        }
    }

    let _ = caps::clear(None, CapSet::Ambient);
    caps::clear(None, CapSet::Inheritable).map_err(|e| anyhow!("drop capabilities: {e}"))?;
    caps::set(None, CapSet::Effective, &keep).map_err(|e| anyhow!("drop capabilities: {e}"))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(|e| anyhow!("drop capabilities: {e}"))?;

    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        bail!("set no_new_privs: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether every bpf() command, map reads included, needs CAP_BPF or CAP_SYS_ADMIN on a
/// kernel of `version` where unprivileged BPF is off (Debian's default): before 5.19 the
/// syscall refused any command then (`kernel.unprivileged_bpf_disabled`), from 5.19 only the
/// creation of maps and programs. Seen on 5.10: the final read of the per-CPU state failed
/// with EPERM after the session dropped its capabilities. Unknown versions keep them.
pub fn bpf_needs_caps(version: Option<(u32, u32)>, unprivileged_bpf_off: bool) -> bool {
    unprivileged_bpf_off && version.is_none_or(|v| v < (5, 19))
}

/// The nice value of the daemon's thread during start-up (`StartupPriority`).
pub const STARTUP_NICE: i32 = -10;

/// The daemon's priority raised to [`STARTUP_NICE`] while it starts (loading, calibration,
/// attach and the floors: about half a second on hardware, many CPU-bound steps), and put back
/// when dropped, before the workload is started (which would inherit it). Beside a benchmark
/// that already keeps every CPU busy, start-up at its usual priority gets the share of one
/// runnable task among them all: under emulation, beside a 10-task hackbench loop on 2 CPUs,
/// attaching took 62-67 s at nice 0 and 12 s at nice -10 (7 s alone). Only the thread that starts (the runtime's only one); nothing
/// is changed where the priority is at least as high already or cannot be raised.
pub(super) struct StartupPriority {
    was: Option<i32>,
}

impl StartupPriority {
    pub(super) fn raise() -> Self {
        // SAFETY: getpriority and setpriority of the calling thread (`who` 0) take and return
        // plain integers; errno is this thread's.
        let was = unsafe {
            *libc::__errno_location() = 0;
            let was = libc::getpriority(libc::PRIO_PROCESS, 0);

            // (-1 is a nice value too: an error only where errno says so.)
            let failed = was == -1 && *libc::__errno_location() != 0;
            if failed || was <= STARTUP_NICE {
                None
            } else if libc::setpriority(libc::PRIO_PROCESS, 0, STARTUP_NICE) == 0 {
                Some(was)
            } else {
                None
            }
        };
        StartupPriority { was }
    }
}

impl Drop for StartupPriority {
    fn drop(&mut self) {
        if let Some(was) = self.was.take() {
            // SAFETY: as in `raise`.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, was) };
        }
    }
}

#[cfg(test)]
mod caps_tests {
    use super::bpf_needs_caps;

    #[test]
    fn map_reads_need_capabilities_only_before_5_19_with_unprivileged_bpf_off() {
        assert!(bpf_needs_caps(Some((5, 10)), true));
        assert!(bpf_needs_caps(Some((5, 18)), true));
        assert!(!bpf_needs_caps(Some((5, 19)), true));
        assert!(!bpf_needs_caps(Some((6, 1)), true));
        assert!(!bpf_needs_caps(Some((5, 10)), false));

        // A release that cannot be read keeps them.
        assert!(bpf_needs_caps(None, true));
    }
}
