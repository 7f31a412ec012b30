//! The workload: its command line (named workloads such as hackbench), a fresh memory cgroup
//! for it (cgroup v2 where the memory controller is enabled, else v1), the child started inside
//! it before it runs an instruction of its own, and the cgroup removed afterwards, also after a
//! crash of an earlier run.

use std::{
    ffi::CString,
    fs,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};

pub mod sockets;

/// Prefix of the cgroups memcg-trace creates: `memcg-trace.<pid>`.
pub const PREFIX: &str = "memcg-trace.";

/// A cgroup hierarchy with the memory controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Mount point.
    pub root: PathBuf,
    /// cgroup v2 (unified) or v1.
    pub v2: bool,
}

/// The cgroup v2 mount, with or without controllers: the hierarchy whose ids
/// `bpf_get_current_cgroup_id()` returns.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        if post.split_whitespace().next() != Some("cgroup2") {
            return None;
        }

        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// The cgroup id of a cgroup v2 directory (its kernfs inode number).
pub fn cgroup_id(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata(dir).ok().map(|m| m.ino())
}

/// The depth of cgroup directory `dir` below the root of its hierarchy (the root's parent is
/// on another file system): the level the kernel gives it (`cgroup->level`). 0 if unreadable.
pub fn cgroup_level(dir: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(dev) = fs::metadata(dir).map(|m| m.dev()) else {
        return 0;
    };
    let mut level = 0;
    let mut current = dir;
    while let Some(parent) = current.parent() {
        if fs::metadata(parent).map(|m| m.dev()).ok() != Some(dev) {
            break;
        }
        level += 1;
        current = parent;
    }
    level
}

/// The kernel's depth of a cgroup v2 (`cgroup->level`), which the eBPF programs compare at,
/// as far as paths tell it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CgroupLevel {
    /// Not known: a workload that moves below its cgroup is not followed.
    #[default]
    Unknown,
    /// Told by paths: in the initial cgroup namespace, the depth below the mount plus that of
    /// the mount's root.
    Exact(u32),
    /// Inside a cgroup namespace, paths start at the namespace's root, whose depth only the
    /// kernel knows: the level is that of this process's own cgroup plus this (negative where
    /// this process sits deeper than the cgroup).
    FromOwn(i64),
    /// A cgroup v2 whose depth neither paths nor the kernel can tell here: why.
    Unreadable(&'static str),
}

impl CgroupLevel {
    /// The level, given that of this process's own cgroup v2 (asked only for `FromOwn`);
    /// 0 where unknown (the root's level, which a workload's cgroup never has).
    pub fn resolve(self, own: impl FnOnce() -> Result<u32>) -> Result<u32> {
        match self {
            CgroupLevel::Unknown => Ok(0),
            CgroupLevel::Exact(l) => Ok(l),
            CgroupLevel::Unreadable(why) => bail!("the depth of its cgroup is unknown: {why}"),
            CgroupLevel::FromOwn(d) => {
                let own = own()?;
                u32::try_from(own as i64 + d)
                    .ok()
                    .filter(|&l| l > 0)
                    .ok_or_else(|| {
                        anyhow!("this process's cgroup is at level {own}, the workload's {d:+} from it: not a cgroup below the root")
                    })
            }
        }
    }
}

/// `/proc/self/ns/cgroup` of the initial cgroup namespace (its inode number,
/// `PROC_CGROUP_INIT_INO`, is fixed in the kernel).
const INIT_CGROUP_NS: &str = "cgroup:[4026531835]";

/// Levels a cgroup path goes down (`..` goes up one).
fn path_depth(path: &str) -> i64 {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(|c| if c == ".." { -1 } else { 1 })
        .sum()
}

/// [`CgroupLevel`] of cgroup v2 directory `dir`: its depth below its mount, plus the depth of
/// the mount's root (a mounted subtree's), plus, in a cgroup namespace, that of the
/// namespace's root, found from this process's own cgroup.
pub fn kernel_level(dir: &Path) -> CgroupLevel {
    let visible = cgroup_level(dir);
    if visible == 0 {
        return CgroupLevel::Unknown;
    }

    let Some(root) = cgroup2_mount_root(dir) else {
        return CgroupLevel::Unreadable("no cgroup v2 mount in /proc/self/mountinfo holds it");
    };
    let below_ns_root = visible as i64 + path_depth(&root);
    let ns = fs::read_link("/proc/self/ns/cgroup").ok();

    // Kernels without cgroup namespaces (before 4.6) have no such link.
    if ns.is_none_or(|n| n == Path::new(INIT_CGROUP_NS)) {
        return u32::try_from(below_ns_root).map_or(
            CgroupLevel::Unreadable("its mount's root lies above the hierarchy's"),
            CgroupLevel::Exact,
        );
    }

    let own = fs::read_to_string("/proc/self/cgroup").ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("0::").map(|p| path_depth(p.trim())))
    });
    own.map_or(
        CgroupLevel::Unreadable("/proc/self/cgroup has no cgroup v2 line"),
        |own| CgroupLevel::FromOwn(below_ns_root - own),
    )
}

/// The root (the fourth field of `/proc/self/mountinfo`: the path, in this cgroup namespace,
/// of the cgroup at the mount point) of the cgroup v2 mount that holds `dir`.
fn cgroup2_mount_root(dir: &Path) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            if post.split_whitespace().next() != Some("cgroup2") {
                return None;
            }

            let mut f = pre.split_whitespace().skip(3);
            let (root, mount) = (f.next()?, f.next()?);
            dir.starts_with(mount)
                .then(|| (mount.len(), root.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, root)| root)
}

/// Finds the hierarchy to use from /proc/self/mountinfo: v2 when its root offers the memory
/// controller, else the v1 memory hierarchy.
pub fn find_hierarchy() -> Result<Hierarchy> {
    let info = fs::read_to_string("/proc/self/mountinfo").context("read /proc/self/mountinfo")?;
    let mut v1 = None;
    for line in info.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let mount = pre.split_whitespace().nth(4).unwrap_or_default();
        let mut post = post.split_whitespace();
        let fstype = post.next().unwrap_or_default();
        let opts = post.nth(1).unwrap_or_default();
        if fstype == "cgroup2" {
            let controllers =
                fs::read_to_string(Path::new(mount).join("cgroup.controllers")).unwrap_or_default();
            if controllers.split_whitespace().any(|c| c == "memory") {
                return Ok(Hierarchy {
                    root: mount.into(),
                    v2: true,
                });
            }
        } else if fstype == "cgroup" && opts.split(',').any(|o| o == "memory") && v1.is_none() {
            v1 = Some(Hierarchy {
                root: mount.into(),
                v2: false,
            });
        }
    }

    v1.ok_or_else(|| anyhow!("no memory controller: neither a cgroup v2 mount offering \"memory\" nor a v1 memory hierarchy is mounted"))
}

/// A memcg this process created (or was given with `--cgroup`).
#[derive(Debug)]
pub struct Memcg {
    /// Its directory.
    pub path: PathBuf,
    /// The cgroup v2 id that identifies the workload's tasks in the eBPF programs (0: none).
    /// On a v1 memcg it is that of a companion v2 cgroup the workload also joins.
    pub cgroup_id: u64,
    /// The depth of that v2 cgroup in the kernel's v2 hierarchy.
    pub cgroup_level: CgroupLevel,
    /// The companion v2 cgroup on v1 systems.
    companion: Option<PathBuf>,
    /// Whether we created it (and so remove it).
    owned: bool,
    v2: bool,
    /// Held while we own the memcg (and its companion): it is not stale.
    _locks: Vec<DirLock>,
}

/// The `oom_kill` count of a `memory.events` or `memory.oom_control` file.
pub fn oom_kill_of(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == "oom_kill").then(|| v.trim().parse().ok()).flatten()
    })
}

/// Whether process `pid` exists.
pub fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

fn tasks(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// `dir` and every cgroup below it, deepest first.
fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(subtree(&e.path()));
            }
        }
    }

    out.push(dir.to_path_buf());
    out
}

/// Kills every task in `dir` and in the cgroups the workload made below it, and removes them
/// all, deepest first, waiting up to `timeout` for the tasks to go.
fn kill_and_remove(dir: &Path, v2: bool, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let dirs = subtree(dir);
        let pids: Vec<i32> = dirs.iter().flat_map(|d| tasks(d)).collect();
        if pids.is_empty() {
            break;
        }

        // cgroup.kill (v2) takes the whole subtree at once.
        if !(v2 && fs::write(dir.join("cgroup.kill"), "1").is_ok()) {
            for pid in pids {
                // SAFETY: plain kill(2).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }

        if start.elapsed() > timeout {
            bail!("tasks remain in {} after {:?}", dir.display(), timeout);
        }

        thread::sleep(Duration::from_millis(20));
    }

    // rmdir can see EBUSY briefly while the last task is being reaped.
    for d in subtree(dir) {
        loop {
            match fs::remove_dir(&d) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if start.elapsed() > timeout => {
                    return Err(anyhow!("cannot remove {}: {e}", d.display()))
                }
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    Ok(())
}

/// An advisory lock (flock(2)) on a cgroup directory. A run holds the one on its own memcg for
/// its lifetime, and the kernel drops it when the run's process ends however it ends, so a
/// memcg whose lock can be taken has no live owner: exact across pid reuse and pid namespaces,
/// which a pid in the name is not. Opened close-on-exec: the workload never holds it.
#[derive(Debug)]
struct DirLock {
    _file: fs::File,
}

impl DirLock {
    /// Takes the lock on `dir`: `how` is `LOCK_EX` or `LOCK_SH`, with `LOCK_NB` or not.
    fn take(dir: &Path, how: libc::c_int) -> std::io::Result<DirLock> {
        use std::os::fd::AsRawFd as _;
        let f = fs::File::open(dir)?;
        loop {
            // SAFETY: flock(2) on a descriptor we own.
            if unsafe { libc::flock(f.as_raw_fd(), how) } == 0 {
                return Ok(DirLock { _file: f });
            }

            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Whether a directory entry is one memcg-trace creates: `memcg-trace.<pid>` or, where that
/// name was taken by a run in another pid namespace, `memcg-trace.<pid>.<n>`.
fn ours(name: &str) -> bool {
    name.strip_prefix(PREFIX).is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Removes the cgroups of memcg-trace runs that ended without removing them (a SIGKILL, a
/// crash), and only those: a cgroup is stale when its lock is free (see [`DirLock`]). The
/// caller holds the hierarchy's lock, so no run is between creating its memcg and locking it.
/// Returns what was removed.
fn remove_stale(h: &Hierarchy) -> Vec<PathBuf> {
    let mut roots = vec![(h.root.clone(), h.v2)];
    if !h.v2 {
        roots.extend(cgroup2_mount().map(|m| (m, true)));
    }

    let mut removed = Vec::new();
    for (root, v2) in roots {
        let Ok(rd) = fs::read_dir(&root) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_name().to_str().is_some_and(ours) {
                continue;
            }

            let path = e.path();
            let Ok(lock) = DirLock::take(&path, libc::LOCK_EX | libc::LOCK_NB) else {
                continue;
            };
            if kill_and_remove(&path, v2, Duration::from_secs(5)).is_ok() {
                removed.push(path);
            }

            drop(lock);
        }
    }
    removed
}

impl Memcg {
    /// Creates `memcg-trace.<pid>` in the hierarchy (`.<n>` appended where a live run in another
    /// pid namespace has that name), locked, enabling the memory controller for the root's
    /// children on v2 if needed. The caller holds the hierarchy's lock.
    fn create(h: &Hierarchy) -> Result<Memcg> {
        if h.v2 {
            let sub = h.root.join("cgroup.subtree_control");
            let cur = fs::read_to_string(&sub).unwrap_or_default();
            if !cur.split_whitespace().any(|c| c == "memory") {
                fs::write(&sub, "+memory").map_err(|e| {
                    anyhow!(
                        "cannot enable the memory controller in {}: {e}",
                        sub.display()
                    )
                })?;
            }
        }

        let v2root = if h.v2 { None } else { cgroup2_mount() };
        let base = format!("{PREFIX}{}", std::process::id());
        let mut attempt = 0;
        let (name, path) = loop {
            let name = if attempt == 0 {
                base.clone()
            } else {
                format!("{base}.{attempt}")
            };
            let path = h.root.join(&name);
            let taken = v2root.as_ref().is_some_and(|r| r.join(&name).exists());
            if !taken {
                match fs::create_dir(&path) {
                    Ok(()) => break (name, path),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!(
                        "cannot create memcg {}: {e} (a workload's memcg needs CAP_DAC_OVERRIDE, or --cgroup naming a cgroup delegated to this user)",
                        path.display()
                    ),
                    Err(e) => bail!("cannot create memcg {}: {e}", path.display()),
                }
            }
            attempt += 1;
            if attempt > 64 {
                bail!(
                    "cannot create memcg {}: the names are all taken",
                    path.display()
                );
            }
        };
        let lock = DirLock::take(&path, libc::LOCK_EX | libc::LOCK_NB)
            .map_err(|e| anyhow!("cannot lock memcg {}: {e}", path.display()));
        let mut memcg = Memcg {
            path,
            cgroup_id: 0,
            cgroup_level: CgroupLevel::Unknown,
            companion: None,
            owned: true,
            v2: h.v2,
            _locks: Vec::new(),
        };

        // From here on, dropping `memcg` removes the memcg.
        memcg._locks.push(lock?);
        if h.v2 {
            memcg.cgroup_id = cgroup_id(&memcg.path).unwrap_or(0);
            memcg.cgroup_level = kernel_level(&memcg.path);
        } else if let Some(root) = v2root {
            // v1 memcg: the eBPF side identifies tasks by their v2 cgroup, so the workload also
            // joins a controller-less v2 cgroup of the same name.
            let companion = root.join(&name);
            if fs::create_dir(&companion).is_ok() {
                memcg.companion = Some(companion.clone());
                if let Ok(l) = DirLock::take(&companion, libc::LOCK_EX | libc::LOCK_NB) {
                    memcg._locks.push(l);
                    memcg.cgroup_id = cgroup_id(&companion).unwrap_or(0);
                    memcg.cgroup_level = kernel_level(&companion);
                }
            }
        }
        Ok(memcg)
    }

    /// Uses an existing cgroup, which must be a memcg.
    pub fn existing(path: &Path) -> Result<Memcg> {
        if !path.is_dir() {
            bail!("--cgroup {}: no such cgroup directory", path.display());
        }

        let v2 = path.join("memory.current").exists();
        if !v2 && !path.join("memory.usage_in_bytes").exists() {
            bail!(
                "--cgroup {}: not a memory cgroup (no memory.current or memory.usage_in_bytes)",
                path.display()
            );
        }

        let cgroup_id = if v2 { cgroup_id(path).unwrap_or(0) } else { 0 };

        // A cgroup named like ours is held (shared) while in use, so that no sweep takes it
        // for a stale one.
        let mut locks = Vec::new();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(ours) {
            locks.push(
                DirLock::take(path, libc::LOCK_SH | libc::LOCK_NB).map_err(|e| {
                    anyhow!("--cgroup {}: in use by another run: {e}", path.display())
                })?,
            );
        }
        Ok(Memcg {
            path: path.to_path_buf(),
            cgroup_id,
            cgroup_level: if v2 {
                kernel_level(path)
            } else {
                CgroupLevel::Unknown
            },
            companion: None,
            owned: false,
            v2,
            _locks: locks,
        })
    }

    /// The `cgroup.procs` paths the workload joins, as C strings prepared before fork so the
    /// child only calls async-signal-safe functions.
    pub fn procs_cstrings(&self) -> Vec<CString> {
        std::iter::once(&self.path)
            .chain(self.companion.as_ref())
            .map(|d| {
                CString::new(d.join("cgroup.procs").as_os_str().as_bytes())
                    .expect("no NUL in cgroup path")
            })
            .collect()
    }

    /// `argv` as a command whose process joins this memcg between fork and exec, so the
    /// command's first instruction already runs (and its first allocation is charged) there.
    pub fn command(&self, argv: &[String]) -> std::process::Command {
        use std::os::unix::process::CommandExt as _;
        let procs = self.procs_cstrings();
        let parent = std::process::id() as libc::pid_t;
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]);

        // SAFETY: die_with_parent and join_in_child only make async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || {
                die_with_parent(parent)?;
                join_in_child(&procs)
            });
        }
        cmd
    }

    /// Tasks of the memcg OOM-killed so far: `oom_kill` of `memory.events` (v2: in it and
    /// below it, by any OOM killer) or of `memory.oom_control` (v1, 4.13 and later: in it).
    /// None: not readable.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        oom_kill_of(&fs::read_to_string(self.path.join(file)).ok()?)
    }

    /// Whether this process created the memcg (and removes it when done).
    pub fn owned(&self) -> bool {
        self.owned
    }

    /// Removes the memcg if we created it, killing what is left in it.
    pub fn remove(&mut self) -> Result<()> {
        if !self.owned {
            return Ok(());
        }

        self.owned = false;
        let r = kill_and_remove(&self.path, self.v2, Duration::from_secs(10));
        if let Some(c) = self.companion.take() {
            kill_and_remove(&c, true, Duration::from_secs(10))?;
        }
        r
    }
}

impl Drop for Memcg {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// The memcg a workload runs in: `--cgroup PATH` if given, else a fresh one, after removing the
/// stale memcgs of earlier runs (each named on stderr unless `quiet`).
pub fn prepare(cgroup: Option<&Path>, quiet: bool) -> Result<Memcg> {
    if let Some(p) = cgroup {
        return Memcg::existing(p);
    }
    Memcg::fresh(quiet)
}

impl Memcg {
    /// A fresh memcg, after removing the stale memcgs of earlier runs (each named on stderr
    /// unless `quiet`). The hierarchy's lock is held while stale memcgs are swept and ours is
    /// created and locked: no sweep ever sees a memcg between its creation and its lock.
    pub fn fresh(quiet: bool) -> Result<Memcg> {
        let hierarchy = find_hierarchy()?;
        let _sweep = DirLock::take(&hierarchy.root, libc::LOCK_EX)
            .map_err(|e| anyhow!("cannot lock {}: {e}", hierarchy.root.display()))?;
        for stale in remove_stale(&hierarchy) {
            if !quiet {
                eprintln!(
                    "memcg-trace: removed stale memcg {} of an earlier run",
                    stale.display()
                );
            }
        }
        Memcg::create(&hierarchy)
    }
}

/// Has the kernel kill the calling process (SIGKILL) when `parent`, its parent, dies, so that
/// a workload never outlives a memcg-trace that was killed; fails if the parent is already
/// gone. Meant for `pre_exec` (async-signal-safe). memcg-trace forks from its main thread (one
/// current-thread runtime), whose end is the process's.
pub fn die_with_parent(parent: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: prctl and getppid are async-signal-safe.
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }

        if libc::getppid() != parent {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    Ok(())
}

/// The processes descended from `pid` (not `pid` itself), from /proc: the tree a workload
/// started, which is what memcg-trace stops when the workload runs in a cgroup it does not own
/// (never the cgroup's other members).
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };

            // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|v| v.parse().ok()) {
                parent_of.push((p, ppid));
            }
        }
    }

    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent_of {
            if pp == p && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// A process held by a pidfd: signals reach it and never a later process that reused its pid.
#[derive(Debug)]
pub struct Held(std::os::fd::OwnedFd);

impl Held {
    /// Opens a pidfd for `pid` (None if it is gone or the kernel has no pidfds, before 5.3).
    pub fn open(pid: i32) -> Option<Held> {
        use std::os::fd::FromRawFd as _;

        // SAFETY: pidfd_open with no flags; the fd, if any, is owned by the result.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        (fd >= 0).then(|| Held(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// Sends `sig` to the process, if it still exists.
    pub fn signal(&self, sig: i32) {
        use std::os::fd::AsRawFd as _;

        // SAFETY: pidfd_send_signal on our own pidfd with no info.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }
}

/// Moves the calling process into the cgroups whose `cgroup.procs` files are `procs`. Meant for
/// `pre_exec`: between fork and exec, so the command's first instruction already runs there.
pub fn join_in_child(procs: &[CString]) -> std::io::Result<()> {
    for p in procs {
        join_one(p)?;
    }
    Ok(())
}

fn join_one(procs: &CString) -> std::io::Result<()> {
    // SAFETY: open/write/close are async-signal-safe; the buffer is static.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }

        let n = libc::write(fd, b"0".as_ptr().cast(), 1);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if n != 1 {
            return Err(err);
        }
    }
    Ok(())
}

/// Where hackbench (Debian package rt-tests) is installed: the one lookup memcg-trace and its
/// tests use.
pub fn hackbench() -> Result<PathBuf> {
    find_in_path("hackbench").ok_or_else(|| {
        anyhow!("hackbench not found: install it with `apt-get install rt-tests` (cargo xtask setup does)")
    })
}

/// The file `name` in the directories of PATH, then /usr/bin and /usr/local/bin.
fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/bin", "/usr/local/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The built-in workloads (`memcg-trace workload NAME [N]`, `--workload NAME[:N]`): name, what
/// one operation is, its default count, what it charges.
pub const BUILTIN: &[(&str, &str, u64, &str)] = &[
    (
        "open-loop",
        "opens",
        100_000,
        "open(\"/nonexistent/...\") in a loop: each allocates and frees a struct file (the filp cache is SLAB_ACCOUNT) before the path walk fails (the January 2024 open-loop debate)",
    ),
    (
        "kmalloc",
        "pipes",
        20_000,
        "pipe2() and two closes in a loop: each allocates the pipe's pipe_inode_info and its buffer array with kmalloc(GFP_KERNEL_ACCOUNT), and two struct files, an inode and a dentry from accounted caches, all freed at the last close",
    ),
    (
        "sockets",
        "64 KiB messages",
        100_000,
        "loopback TCP streams to 4 client processes, each in a memcg of its own below the workload's: the receiving socket's memory is charged to the client's memcg in the NET_RX softirq the sender runs (the netperf loopback debates of 2022 and 2025); use --by-memcg to count those charges in the workload's rows",
    ),
];

/// The command line of a named workload: `hackbench[:ARGS]` or `perf-messaging[:ARGS]` (perf
/// bench sched messaging; default ARGS "-g 2 -l 200" for both), or a built-in one, `NAME[:N]`
/// (this binary's `workload NAME N`).
pub fn named(spec: &str) -> Result<Vec<String>> {
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    if let Some((_, _, default, _)) = BUILTIN.iter().find(|b| b.0 == name) {
        let count = match rest.trim() {
            "" => *default,
            r => r.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                anyhow!("--workload {spec}: the count after ':' must be a positive number")
            })?,
        };
        let exe = std::env::current_exe().context("find memcg-trace's own binary")?;
        return Ok(vec![
            exe.display().to_string(),
            "workload".into(),
            name.into(),
            count.to_string(),
        ]);
    }

    match name {
        "perf-messaging" => {
            let args = if rest.trim().is_empty() {
                "-g 2 -l 200"
            } else {
                rest
            };
            let perf = find_in_path("perf").ok_or_else(|| {
                anyhow!("perf not found: install it with `apt-get install linux-perf` (cargo xtask setup does)")
            })?;
            Ok([
                perf.display().to_string(),
                "bench".into(),
                "sched".into(),
                "messaging".into(),
            ]
            .into_iter()
            .chain(args.split_whitespace().map(str::to_string))
            .collect())
        }
        "hackbench" => {
            let args = if rest.trim().is_empty() {
                "-g 2 -l 200"
            } else {
                rest
            };
            Ok(std::iter::once(hackbench()?.display().to_string())
                .chain(args.split_whitespace().map(str::to_string))
                .collect())
        }
        other => bail!(
            "unknown workload {other:?}; known: hackbench[:ARGS], perf-messaging[:ARGS], {}",
            BUILTIN
                .iter()
                .map(|b| format!("{}[:N]", b.0))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The built-in workloads' names, for messages.
pub fn builtin_names() -> String {
    BUILTIN.iter().map(|b| b.0).collect::<Vec<_>>().join(", ")
}

/// Runs built-in workload `name` `n` times in this process and prints `Time: S` (seconds, as
/// hackbench does). The first failure of an operation other than the one meant is an error.
pub fn run_builtin(name: &str, n: u64) -> Result<()> {
    let start = Instant::now();
    match name {
        "open-loop" => {
            let path = c"/nonexistent/memcg-trace-open-loop";
            for _ in 0..n {
                // SAFETY: a valid C string; the call cannot succeed (no such directory).
                let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                if fd >= 0 {
                    // SAFETY: closing the descriptor just returned.
                    unsafe { libc::close(fd) };
                    bail!("open-loop: {} exists", path.to_string_lossy());
                }
            }
        }
        "kmalloc" => {
            for _ in 0..n {
                let mut fds = [0i32; 2];

                // SAFETY: fds has room for the two descriptors pipe2 writes.
                if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                    bail!("kmalloc: pipe2: {}", std::io::Error::last_os_error());
                }

                // SAFETY: closing the two descriptors just returned.
                unsafe {
                    libc::close(fds[0]);
                    libc::close(fds[1]);
                }
            }
        }
        "sockets" => sockets::run(n)?,
        other => bail!(
            "unknown built-in workload {other:?}; known: {}",
            builtin_names()
        ),
    }

    println!(
        "{n} {name} operations\nTime: {:.3}",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The operations a workload reports, from its command line, with their name: hackbench's
/// messages (each of a group's `--fds` senders writes `--loops` messages to each of its `--fds`
/// receivers: groups x fds x fds x loops; defaults 10 groups, 20 fds, 100 loops), those of
/// perf's copy of it (`perf bench sched messaging`, the same count under its option names), or
/// a built-in workload's count (`memcg-trace workload NAME N`). None for any other command, or
/// a command line this does not understand.
pub fn operations(argv: &[String]) -> Option<(u64, &'static str)> {
    // This binary's `workload NAME [N]` (not any command whose second word is `workload`).
    let ours = Path::new(argv.first()?).file_name() == Some("memcg-trace".as_ref());
    if ours && argv.get(1).map(String::as_str) == Some("workload") {
        let b = BUILTIN
            .iter()
            .find(|b| Some(b.0) == argv.get(2).map(String::as_str))?;
        return match argv.get(3..)? {
            [] => Some((b.2, b.1)),
            [n] => n.parse().ok().filter(|n| *n > 0).map(|n| (n, b.1)),
            _ => None,
        };
    }

    let name = Path::new(argv.first()?).file_name()?.to_str()?;
    let (args, unit) = if name == "hackbench" {
        (&argv[1..], "hackbench messages")
    } else if name == "perf" || name.starts_with("perf_") {
        (perf_messaging_args(&argv[1..])?, "perf messaging messages")
    } else {
        return None;
    };
    let (mut groups, mut fds, mut loops) = (10u64, 20u64, 100u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let target = match flag {
            // hackbench's names, then perf bench sched messaging's.
            "-g" | "--groups" | "--group" => &mut groups,
            "-f" | "--fds" | "--nr_fds" => &mut fds,
            "-l" | "--loops" | "--nr_loops" => &mut loops,
            // Flags without a value, and valued ones that do not change the count.
            "-p" | "--pipe" | "-T" | "--threads" | "-t" | "--thread" | "-P" | "--process" => {
                continue
            }
            "-s" | "--datasize" => {
                if inline.is_none() {
                    it.next()?;
                }
                continue;
            }
            _ => return None,
        };
        let v = match inline {
            Some(v) => v,
            None => it.next()?.clone(),
        };
        *target = v.parse().ok()?;
    }
    groups
        .checked_mul(fds)?
        .checked_mul(fds)?
        .checked_mul(loops)
        .filter(|n| *n > 0)
        .map(|n| (n, unit))
}

/// The arguments of `perf [bench [-f FORMAT]] sched messaging ARGS` after `perf`: ARGS (the
/// options of hackbench's count under perf's names), or None for any other perf command, or
/// one repeated (`--repeat`).
fn perf_messaging_args(args: &[String]) -> Option<&[String]> {
    let mut rest = args.strip_prefix(&["bench".to_string()])?;
    loop {
        match rest.first().map(String::as_str)? {
            "-f" | "--format" => rest = rest.get(2..)?,
            f if f.starts_with("--format=") => rest = &rest[1..],
            _ => break,
        }
    }

    rest.strip_prefix(&["sched".to_string(), "messaging".to_string()])
}

/// The error for a command that could not be started.
pub fn cannot_run(argv: &[String], e: std::io::Error) -> anyhow::Error {
    anyhow!(
        "cannot run {:?}: {e}",
        argv.first().map(String::as_str).unwrap_or("")
    )
}

/// Runs `cmd` to completion in a fresh memcg; returns its run time in seconds (hackbench's own
/// `Time:` line when it prints one, else wall time).
pub fn timed_run(cmd: &[String]) -> Result<f64> {
    let mut memcg = Memcg::fresh(true)?;
    let start = Instant::now();
    let out = memcg
        .command(cmd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| cannot_run(cmd, e))?;
    let wall = start.elapsed().as_secs_f64();
    memcg.remove()?;
    if !out.status.success() {
        bail!("{:?} failed: {}", cmd, out.status);
    }

    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("Time:").and_then(|v| v.trim().parse().ok()))
        .unwrap_or(wall))
}

#[cfg(test)]
mod tests {
    use super::operations;
    use super::ours;
    use super::{path_depth, CgroupLevel};

    #[test]
    fn a_cgroup_path_counts_its_levels_and_dot_dot_goes_up() {
        assert_eq!(path_depth("/"), 0);
        assert_eq!(path_depth("/daemon"), 1);
        assert_eq!(path_depth("/a/b/c/"), 3);

        // A cgroup outside this namespace's root, as /proc/<pid>/cgroup shows it.
        assert_eq!(path_depth("/../../init.scope"), -1);
    }

    #[test]
    fn a_level_from_this_process_s_own_is_asked_of_the_kernel_only_then() {
        let never = || -> anyhow::Result<u32> { panic!("asked the kernel") };
        assert_eq!(CgroupLevel::Exact(3).resolve(never).unwrap(), 3);
        assert_eq!(CgroupLevel::Unknown.resolve(never).unwrap(), 0);

        // In a namespace whose root is at level 1, this process in its `daemon` leaf (level 2,
        // seen at depth 1) and the workload's cgroup seen at depth 1: level 2.
        assert_eq!(CgroupLevel::FromOwn(0).resolve(|| Ok(2)).unwrap(), 2);
        assert_eq!(CgroupLevel::FromOwn(-1).resolve(|| Ok(3)).unwrap(), 2);

        // Never the root's level, nor below it.
        assert!(CgroupLevel::FromOwn(-2).resolve(|| Ok(2)).is_err());
        assert!(CgroupLevel::FromOwn(1)
            .resolve(|| Err(anyhow::anyhow!("refused")))
            .is_err());
        // Where neither can tell, an error (a warning at start-up), never a silent 0.
        assert!(CgroupLevel::Unreadable("why")
            .resolve(never)
            .is_err_and(|e| e.to_string().contains("why")));
    }

    #[test]
    fn a_built_in_workload_is_its_own_command_and_reports_its_operations() {
        let argv = super::named("open-loop:500").unwrap();
        assert_eq!(&argv[1..], ["workload", "open-loop", "500"]);

        // (Under cargo test this binary is not named memcg-trace.)
        let mut ours = argv.clone();
        ours[0] = "/usr/bin/memcg-trace".into();
        assert_eq!(operations(&ours), Some((500, "opens")));
        ours.truncate(3);
        assert_eq!(operations(&ours), Some((100_000, "opens")));
        let v = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(operations(&v("./mybench workload kmalloc 1000")), None);
        let mut argv = super::named("kmalloc").unwrap();
        argv[0] = "memcg-trace".into();
        assert_eq!(operations(&argv), Some((20_000, "pipes")));
        assert!(super::named("kmalloc:0").is_err());
        assert!(super::named("kmalloc:x").is_err());
        let e = super::named("nope").unwrap_err().to_string();
        assert!(
            e.contains("open-loop[:N]") && e.contains("kmalloc[:N]"),
            "{e}"
        );

        // Both run here, unprivileged: the operations they make exist on any kernel.
        super::run_builtin("open-loop", 100).unwrap();
        super::run_builtin("kmalloc", 100).unwrap();
        assert!(super::run_builtin("nope", 1).is_err());
    }

    #[test]
    fn hackbench_reports_its_messages() {
        let argv = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();

        // 2 groups x 20 senders x 20 receivers x 200 loops.
        assert_eq!(
            operations(&argv("/usr/bin/hackbench -g 2 -l 200")),
            Some((160_000, "hackbench messages"))
        );
        assert_eq!(operations(&argv("hackbench")).map(|o| o.0), Some(400_000));
        assert_eq!(
            operations(&argv("hackbench --groups=1 --fds 10 -l 5 -T -s 100")).map(|o| o.0),
            Some(500)
        );
        assert_eq!(operations(&argv("hackbench -g x")), None);
        assert_eq!(operations(&argv("hackbench --unknown 3")), None);
        assert_eq!(operations(&argv("stress-ng -c 1")), None);

        // perf bench sched messaging counts the same way under its own option names.
        assert_eq!(
            operations(&argv("/usr/bin/perf bench sched messaging -g 2 -l 200 -t")),
            Some((160_000, "perf messaging messages"))
        );
        assert_eq!(
            operations(&argv(
                "perf bench -f simple sched messaging --group=1 --nr_loops 5 -p"
            ))
            .map(|o| o.0),
            Some(2000)
        );
        assert_eq!(
            operations(&argv("perf_6.1 bench sched messaging")).map(|o| o.0),
            Some(400_000)
        );
        assert_eq!(operations(&argv("perf bench sched pipe")), None);
        assert_eq!(operations(&argv("perf bench -r 3 sched messaging")), None);
        assert_eq!(operations(&argv("perf record -g hackbench")), None);
    }

    #[test]
    fn names_of_our_memcgs() {
        for n in ["memcg-trace.1", "memcg-trace.4194304", "memcg-trace.77.2"] {
            assert!(ours(n), "{n}");
        }

        for n in [
            "memcg-trace.",
            "memcg-trace.x",
            "memcg-trace.1.",
            "memcg-trace.1..2",
            "memcg-trace.12a",
            "memcg-tracer.1",
            "system.slice",
        ] {
            assert!(!ours(n), "{n}");
        }
    }
}
