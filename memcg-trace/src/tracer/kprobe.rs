//! kprobes and kretprobes created through tracefs (`kprobe_events`) rather than the perf kprobe
//! PMU, for two things the PMU does not give: the kretprobe's `maxactive` (the PMU's default is
//! max(10, 2 x CPUs) instances, and every call beyond that returns unseen: 3-7% of charge calls
//! on Debian 6.18 under hackbench), and the kernel's miss counts per probe (`kprobe_profile`) on
//! every kernel version. The program is attached with a tracepoint perf event and
//! PERF_EVENT_IOC_SET_BPF; the events are removed again when the `KprobeEvent` is dropped, and
//! those of a run that was killed are removed by the next.

use std::{
    fs::{self, OpenOptions},
    io::Write as _,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Context as _, Result};

/// Instances of each kretprobe: calls of the function in flight at once that can be seen
/// returning (the kernel's limit is 4096).
pub const MAXACTIVE: u32 = 4096;

/// The tracefs directory, if mounted.
pub fn tracefs() -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("kprobe_events").exists())
}

/// The event group of this process: `memcg_trace_<pid>`.
fn group(pid: u32) -> String {
    format!("memcg_trace_{pid}")
}

fn append(tracefs: &Path, line: &str) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .append(true)
        .open(tracefs.join("kprobe_events"))?;
    f.write_all(format!("{line}\n").as_bytes())
}

/// A kprobe or kretprobe event of this process with a BPF program attached.
pub struct KprobeEvent {
    tracefs: PathBuf,
    /// `memcg_trace_<pid>/<name>`.
    event: String,
    /// The event name alone (as `kprobe_profile` lists it).
    name: String,
    perf: OwnedFd,
    /// A kretprobe.
    pub ret: bool,
}

impl KprobeEvent {
    /// Creates `kprobe_events` entry for `function` (a kretprobe with [`MAXACTIVE`] instances
    /// when `ret`) and attaches the loaded program `prog_fd` to it.
    /// The event is named after the program (`program`), unique in the object.
    pub fn attach(function: &str, ret: bool, program: &str, prog_fd: RawFd) -> Result<Self> {
        let tracefs =
            tracefs().ok_or_else(|| anyhow!("tracefs with kprobe_events is not mounted"))?;
        let pid = std::process::id();
        let name = format!("memcg_trace_{pid}_{program}");
        let event = format!("{}/{name}", group(pid));
        let def = if ret {
            format!("r{MAXACTIVE}:{event} {function}")
        } else {
            format!("p:{event} {function}")
        };
        append(&tracefs, &def).map_err(|e| anyhow!("kprobe_events {def:?}: {e}"))?;

        // From here on the event exists: a failure removes it (Drop).
        let id_path = tracefs.join("events").join(&event).join("id");
        let cleanup = Remove {
            tracefs: tracefs.clone(),
            event: event.clone(),
        };

        // The kprobe is registered (disarmed) with the event, so the kernel's list shows how it
        // will run before any call can hit it. (x86 only: arm64 has no kprobes on ftrace, and
        // its breakpoint handler leaves preempt_count as it is.)
        if cfg!(target_arch = "x86_64") {
            if let Ok(list) = fs::read_to_string(KPROBES_LIST) {
                if off_ftrace(&list, function, ret) == Some(true) {
                    bail!(
                        "the kprobe on {function} is not on its ftrace site ({KPROBES_LIST} shows no [FTRACE]): it would run from a breakpoint, whose handler enters NMI context, and every call would be taken as an NMI's"
                    );
                }
            }
        }

        let id: u64 = fs::read_to_string(&id_path)
            .with_context(|| format!("read {}", id_path.display()))?
            .trim()
            .parse()
            .with_context(|| format!("parse {}", id_path.display()))?;
        let perf = perf_tracepoint(id)?;

        // SAFETY: ioctls on a perf event fd we own, with a program fd the caller owns.
        unsafe {
            if libc::ioctl(perf.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog_fd) != 0 {
                bail!(
                    "attach the program to {event}: {}",
                    std::io::Error::last_os_error()
                );
            }

            if libc::ioctl(perf.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) != 0 {
                bail!("enable {event}: {}", std::io::Error::last_os_error());
            }
        }

        std::mem::forget(cleanup);
        Ok(KprobeEvent {
            tracefs,
            event,
            name,
            perf,
            ret,
        })
    }

    /// Hits and misses of this probe (`kprobe_profile`): a miss is a call the kprobe could not
    /// handle (another kprobe was running on that CPU; for a kretprobe, no free instance). A
    /// hit is a call the kprobe handled, whether or not the kernel then ran the program (it
    /// skips it while another BPF program runs on that CPU, `bpf_prog_active`, and counts that
    /// as the program's miss only from 6.7): hits less the program's runs are the runs it
    /// skipped, on every kernel. The kprobe is armed when its perf event is opened, just before
    /// the program is attached: a hit in between counts as skipped (a few at most, on the safe
    /// side of the bound).
    pub fn profile(&self) -> Option<(u64, u64)> {
        let text = fs::read_to_string(self.tracefs.join("kprobe_profile")).ok()?;
        text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next()? == self.name).then_some(())?;
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
    }

    /// Stops the probe, then takes its final hits and misses (`profile`) and removes it. The
    /// final figures of a run are taken once its probes are gone, when `kprobe_profile` no
    /// longer lists them. Disabling the perf event is not enough: the kprobe stays armed and
    /// its program runs until the perf event is released, which disarms it and detaches the
    /// program (with the kernel waiting for handlers in flight); then no hit and no run comes
    /// after the read.
    pub fn close(mut self) -> Option<(u64, u64)> {
        drop(std::mem::replace(&mut self.perf, dev_null()));
        self.profile()
    }
}

/// The kernel's list of registered kprobes (debugfs).
const KPROBES_LIST: &str = "/sys/kernel/debug/kprobes/list";

/// Whether the kprobe (`ret`: kretprobe) at the entry of `function` in the kernel's kprobe list
/// runs off the ftrace site: from int3, whose handler on x86 enters NMI context for a
/// breakpoint in the kernel (`NMI_OFFSET + HARDIRQ_OFFSET` in preempt_count; 5.10 on, at
/// least), so that the programs would read every call's context as NMI. That is every kprobe
/// on a kernel without KPROBES_ON_FTRACE or without dynamic ftrace. None where the list does
/// not show it. Lines: "ADDRESS  TYPE  SYMBOL+OFFSET  [MODULE] [FLAGS...]", TYPE k or r. The
/// entry is +0x0, or +0x4 where the kernel is built for indirect branch tracking: a kprobe on
/// a function is placed after its `endbr64`, where the ftrace call is. Off the ftrace site
/// only if no kprobe at the entry is on it (another tool's may be listed too).
pub fn off_ftrace(list: &str, function: &str, ret: bool) -> Option<bool> {
    let kind = if ret { "r" } else { "k" };
    let entry = [format!("{function}+0x0"), format!("{function}+0x4")];
    let mut seen = None;
    for l in list.lines() {
        let mut f = l.split_whitespace();
        let (Some(_), Some(t), Some(sym)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if t == kind && entry.iter().any(|e| e == sym) {
            if l.contains("[FTRACE]") {
                return Some(false);
            }
            seen = Some(true);
        }
    }
    seen
}

impl Drop for KprobeEvent {
    fn drop(&mut self) {
        // SAFETY: ioctl on a perf event fd we own.
        unsafe { libc::ioctl(self.perf.as_raw_fd(), PERF_EVENT_IOC_DISABLE, 0) };

        // The event is busy while the perf event is open: close it first.
        let perf = std::mem::replace(&mut self.perf, dev_null());
        drop(perf);
        let _ = append(&self.tracefs, &format!("-:{}", self.event));
    }
}

/// Removes an event when dropped (the error paths of `attach`).
struct Remove {
    tracefs: PathBuf,
    event: String,
}

impl Drop for Remove {
    fn drop(&mut self) {
        let _ = append(&self.tracefs, &format!("-:{}", self.event));
    }
}

fn dev_null() -> OwnedFd {
    fs::File::open("/dev/null")
        .map(OwnedFd::from)
        .expect("open /dev/null")
}

const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
const PERF_TYPE_TRACEPOINT: u32 = 2;

/// perf_event_open for a tracepoint event id, on CPU 0 for all tasks: a BPF program attached to
/// a trace event runs on every CPU.
fn perf_tracepoint(id: u64) -> Result<OwnedFd> {
    // struct perf_event_attr, the fields that matter; the rest stays zero.
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&PERF_TYPE_TRACEPOINT.to_ne_bytes());
    attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&id.to_ne_bytes());

    // sample_period = 1
    attr[16..24].copy_from_slice(&1u64.to_ne_bytes());

    // wakeup_events = 1 (offset 48)
    attr[48..52].copy_from_slice(&1u32.to_ne_bytes());

    // SAFETY: perf_event_open with a zeroed, sized attr; fd checked below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1i32,
            0i32,
            -1i32,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        bail!(
            "perf_event_open for trace event {id}: {}",
            std::io::Error::last_os_error()
        );
    }

    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Removes the kprobe events of memcg-trace runs that no longer exist (killed with SIGKILL),
/// and only those; returns how many.
pub fn remove_stale() -> usize {
    let Some(tracefs) = tracefs() else {
        return 0;
    };
    let Ok(list) = fs::read_to_string(tracefs.join("kprobe_events")) else {
        return 0;
    };
    let mut removed = 0;
    for line in list.lines() {
        // "p:memcg_trace_123/memcg_trace_123_kprobe_0 obj_cgroup_charge"
        let Some(event) = line
            .split_whitespace()
            .next()
            .and_then(|d| d.split_once(':'))
        else {
            continue;
        };
        let event = event.1;
        let Some(pid) = event
            .split_once('/')
            .and_then(|(g, _)| g.strip_prefix("memcg_trace_"))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() as i32 || crate::workload::alive(pid) {
            continue;
        }

        if append(&tracefs, &format!("-:{event}")).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// perf_event_open flag: close the fd on exec.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

#[cfg(test)]
mod tests {
    use super::off_ftrace;

    /// The kernel's `kprobes/list` lines (kernel/kprobes.c `report_probe`): address (zeros
    /// under kptr_restrict), type, symbol+offset, module or a blank, then the flags run
    /// together.
    const LIST: &str = "\
ffffffff8142bc60  k  obj_cgroup_charge+0x0    [FTRACE]
ffffffff8142bc60  r  obj_cgroup_charge+0x0    [FTRACE]
0000000000000000  k  mod_memcg_state+0x0    [DISABLED][FTRACE]
ffffffff81a01234  k  __css_rstat_updated+0x0
ffffffff81a01234  r  __css_rstat_updated+0x0    [OPTIMIZED]
ffffffffc0a01010  k  some_function+0x0  somemod [DISABLED]
ffffffff81a01250  k  count_memcg_events+0x4    [FTRACE]
ffffffff81a01300  k  mod_objcg_state+0x8    [FTRACE]
ffffffff81a01400  k  __mod_memcg_state+0x4    [DISABLED]
ffffffff81a01400  k  __mod_memcg_state+0x4    [FTRACE]
";

    #[test]
    fn a_kprobe_off_its_ftrace_site_is_told_apart() {
        assert_eq!(off_ftrace(LIST, "obj_cgroup_charge", false), Some(false));
        assert_eq!(off_ftrace(LIST, "obj_cgroup_charge", true), Some(false));

        // Registered but not yet armed: still on ftrace.
        assert_eq!(off_ftrace(LIST, "mod_memcg_state", false), Some(false));

        // A breakpoint, or a jump into an optimized detour that was a breakpoint until
        // optimized: off ftrace either way.
        assert_eq!(off_ftrace(LIST, "__css_rstat_updated", false), Some(true));
        assert_eq!(off_ftrace(LIST, "__css_rstat_updated", true), Some(true));
        assert_eq!(off_ftrace(LIST, "some_function", false), Some(true));

        // After an `endbr64` (a kernel built for indirect branch tracking).
        assert_eq!(off_ftrace(LIST, "count_memcg_events", false), Some(false));

        // Another tool's kprobe at the entry beside ours: on ftrace if any is.
        assert_eq!(off_ftrace(LIST, "__mod_memcg_state", false), Some(false));

        // Not at the entry, or not listed: nothing said.
        assert_eq!(off_ftrace(LIST, "mod_objcg_state", false), None);
        assert_eq!(off_ftrace(LIST, "mod_memcg_lruvec_state", false), None);

        // A name that is a prefix of a listed one is not that one.
        assert_eq!(off_ftrace(LIST, "obj_cgroup", false), None);
    }
}
