//! What the daemon and the workload cost: CPU time (the daemon's, the workload's cgroup's)
//! and peak memory.

use super::*;

pub(super) fn rusage() -> libc::rusage {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    }
}

/// The CPU clocks a workload's CPU time is read from, at its start.
#[derive(Debug)]
pub(super) struct WorkloadCpu {
    /// Its memcg, where that is a cgroup v2 one, and the cgroup's usage then, ns.
    cgroup: Option<(PathBuf, u64)>,
    /// The CPU time of this process's reaped children then (`RUSAGE_CHILDREN`), where the
    /// workload is the only one and alone in its memcg.
    children: Option<Duration>,
}

impl WorkloadCpu {
    pub(super) fn start(m: &workload::Memcg) -> Self {
        WorkloadCpu {
            cgroup: (m.cgroup_id != 0)
                .then(|| cgroup_usage_ns(&m.path).map(|u| (m.path.clone(), u)))
                .flatten(),
            // In a v1 memcg given with --cgroup, other tasks charge it too: their CPU time is
            // not ours to read.
            children: m.owned().then(children_cpu_time),
        }
    }

    /// CPU time used since the start, and its source. `reaped`: the workload has been
    /// waited for (its tree's rusage is in this process's children's).
    pub(super) fn used(&self, reaped: bool) -> Option<(u64, String)> {
        if let Some((dir, u0)) = &self.cgroup {
            if let Some(u) = cgroup_usage_ns(dir) {
                return Some((
                    u.saturating_sub(*u0),
                    "its cgroup's cpu.stat usage_usec".into(),
                ));
            }
        }

        let c0 = self.children.filter(|_| reaped)?;
        Some((
            children_cpu_time().saturating_sub(c0).as_nanos() as u64,
            "the rusage of its process tree".into(),
        ))
    }
}

/// A cgroup v2 directory's CPU usage (`cpu.stat` usage_usec, kept for every cgroup), ns.
fn cgroup_usage_ns(dir: &std::path::Path) -> Option<u64> {
    let s = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|us| us.saturating_mul(1000))
}

/// User + system CPU time of this process's children that were waited for.
fn children_cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// User + system CPU time of this process so far (the workload, a child, is not included).
pub fn cpu_time() -> Duration {
    let u = rusage();
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Peak resident set size of this process, KiB.
pub fn peak_rss_kib() -> u64 {
    rusage().ru_maxrss as u64
}
