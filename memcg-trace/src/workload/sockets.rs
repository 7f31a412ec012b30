//! The `sockets` workload: loopback TCP streams to clients that each live in a memory cgroup of
//! their own, so that socket memory is charged where the debates about it are (Shakeel Butt's
//! netperf runs, 2022 and 2025): on the receive side, in the NET_RX softirq that the sender's
//! `local_bh_enable` runs, against the receiving socket's memcg, which is not the memcg of the
//! task the softirq interrupted.
//!
//! The steps, each a function below:
//! 1. the cgroups: this process moves into a leaf `sockets-server` below its own cgroup, turns
//!    the memory controller on for the children, and makes `sockets-client-<i>` (cgroup v2; on
//!    v1, in the root cgroup, or where the kernel refuses, every process stays in the
//!    workload's cgroup, said on stderr);
//! 2. the clients: forked from this single-threaded process, each joins its cgroup, connects to
//!    the server's loopback port and reads until the end of the stream;
//! 3. the stream: one thread per connection writes that client's share of the messages;
//! 4. the end: every client must have read every byte; its cgroup is removed, and the workload's
//!    cgroup is given back as it was (controller off again, this process back in it).

use std::{
    ffi::CString,
    fs,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicI32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};

/// How many clients (processes, one memcg each).
pub const CLIENTS: usize = 4;

/// Bytes of one message, the workload's operation.
pub const MESSAGE: usize = 64 * 1024;

/// How long the server waits for its clients to connect.
const CONNECT_WAIT: Duration = Duration::from_secs(30);

/// The cgroups the workload made below its own, to give back at the end.
struct Cgroups {
    /// The workload's own cgroup (where it was started).
    own: PathBuf,
    /// `own/sockets-server`, where this process moved.
    server: PathBuf,
    /// `own/sockets-client-<i>`, one per client.
    clients: Vec<PathBuf>,
    /// Whether the memory controller was turned on in `own` by us.
    turned_on: bool,
}

/// Sends `messages` messages of 64 KiB over loopback TCP to `CLIENTS` clients, each in a memcg
/// of its own where the kernel allows it.
pub fn run(messages: u64) -> Result<()> {
    catch_stop_signals();
    let cgroups = match make_cgroups() {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!(
                "memcg-trace workload sockets: the clients share the workload's memcg: {e:#}"
            );
            None
        }
    };
    let sent = serve(cgroups.as_ref(), messages);
    give_back(cgroups);

    // Stopped (memcg-trace's SIGTERM at --duration or Ctrl-C): the cgroups are given back, then
    // the signal ends the process as it would have.
    let sig = STOPPED.load(Ordering::SeqCst);
    if sig != 0 {
        // SAFETY: back to the default action, then the signal to this process.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
    sent
}

/// The stop signal received while streaming (0: none).
static STOPPED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop(sig: libc::c_int) {
    STOPPED.store(sig, Ordering::SeqCst);
}

/// The signals that stop the workload.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Has the stop signals end the stream instead of the process, so that the cgroups are given
/// back (the clients set the default actions back).
fn catch_stop_signals() {
    for sig in STOP_SIGNALS {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_stop as *const () as libc::sighandler_t) };
    }
}

/// Whether a stop signal came.
fn stopped() -> bool {
    STOPPED.load(Ordering::SeqCst) != 0
}

/// Steps 2 and 3, and the clients' exits: the cgroups are given back by the caller whatever
/// happens here.
fn serve(cgroups: Option<&Cgroups>, messages: u64) -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").context("sockets: listen on loopback")?;
    let shares = shares(messages, CLIENTS);
    let mut pids = Vec::new();
    for (i, share) in shares.iter().enumerate() {
        let started = cgroups
            .map(|c| procs_file(&c.clients[i]))
            .transpose()
            .and_then(|procs| start_client(&listener, i as u8, *share, procs.as_ref()));
        match started {
            Ok(pid) => pids.push(pid),
            Err(e) => {
                reap(&pids, true);
                return Err(e);
            }
        }
    }

    let streamed = stream(&listener, &shares);

    // No client can connect any more (one that did not is not left waiting in the backlog).
    drop(listener);
    let exits = reap(&pids, streamed.is_err());
    streamed?;
    if let Some((i, status)) = exits.iter().enumerate().find(|(_, s)| **s != 0) {
        bail!("sockets: client {i} did not read its whole stream (wait status {status:#x})");
    }
    Ok(())
}

/// `messages` over `clients`, the first ones taking one more where it does not divide.
fn shares(messages: u64, clients: usize) -> Vec<u64> {
    let n = clients as u64;
    (0..n)
        .map(|i| messages / n + u64::from(i < messages % n))
        .collect()
}

/// Step 1: the server's leaf and the clients' cgroups below the workload's own (cgroup v2).
fn make_cgroups() -> Result<Cgroups> {
    let own = own_cgroup()?;
    let server = own.join("sockets-server");
    mkdir(&server)?;

    // A cgroup with processes cannot hand controllers to its children: this process leaves
    // for a leaf first (the workload's only one in a memcg memcg-trace made; in one given
    // with --cgroup others may stay, and the controller is then refused).
    if let Err(e) = fs::write(procs_path(&server), "0") {
        let _ = fs::remove_dir(&server);
        return Err(e).with_context(|| format!("move into {}", server.display()));
    }

    let mut made = Cgroups {
        own,
        server,
        clients: Vec::new(),
        turned_on: false,
    };
    let control = made.own.join("cgroup.subtree_control");
    let on = match fs::read_to_string(&control) {
        Ok(text) => text.split_whitespace().any(|c| c == "memory"),
        Err(e) => {
            let e = anyhow!("read {}: {e}", control.display());
            give_back(Some(made));
            return Err(e);
        }
    };
    if !on {
        if let Err(e) = fs::write(&control, "+memory") {
            let e = anyhow!(
                "turn the memory controller on in {}: {e}",
                control.display()
            );
            give_back(Some(made));
            return Err(e);
        }

        made.turned_on = true;
    }

    for i in 0..CLIENTS {
        let dir = made.own.join(format!("sockets-client-{i}"));
        if let Err(e) = mkdir(&dir) {
            give_back(Some(made));
            return Err(e);
        }

        made.clients.push(dir);
    }
    Ok(made)
}

/// The cgroup v2 directory of this process, where memory is controlled.
fn own_cgroup() -> Result<PathBuf> {
    let hierarchy = super::find_hierarchy()?;
    if !hierarchy.v2 {
        bail!("the memory controller is on cgroup v1 here, where socket memory is charged only below a memory.kmem.tcp.limit_in_bytes");
    }

    let text = fs::read_to_string("/proc/self/cgroup").context("read /proc/self/cgroup")?;
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| anyhow!("not in a cgroup v2 hierarchy"))?;
    let own = hierarchy.root.join(rel.trim_start_matches('/'));
    if own == hierarchy.root {
        bail!("the workload runs in the root cgroup, not a memcg of its own");
    }
    Ok(own)
}

fn mkdir(dir: &Path) -> Result<()> {
    fs::create_dir(dir).with_context(|| format!("create {}", dir.display()))
}

fn procs_path(dir: &Path) -> PathBuf {
    dir.join("cgroup.procs")
}

fn procs_file(dir: &Path) -> Result<CString> {
    CString::new(procs_path(dir).as_os_str().as_bytes()).context("a cgroup path with a NUL")
}

/// Step 2: client `index`, a process that joins `procs` (if any), connects to `port`, says its
/// index and reads `share` messages; it exits 0 when it read exactly that many bytes.
fn start_client(
    listener: &TcpListener,
    index: u8,
    share: u64,
    procs: Option<&CString>,
) -> Result<libc::pid_t> {
    use std::os::fd::AsRawFd as _;
    let port = listener.local_addr()?.port();

    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };

    // SAFETY: this process is single-threaded here (a current-thread runtime, no thread
    // started yet), so the child may allocate; it leaves with _exit, running nothing of ours.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("sockets: fork: {}", std::io::Error::last_os_error());
    }

    if pid > 0 {
        return Ok(pid);
    }

    // SAFETY: in the child, closing its copy of the listener and setting the stop signals'
    // default actions back (the server catches them).
    unsafe {
        libc::close(listener.as_raw_fd());
        for sig in STOP_SIGNALS {
            libc::signal(sig, libc::SIG_DFL);
        }
    }

    let client = || -> Result<()> {
        super::die_with_parent(parent).context("die with the server")?;
        if let Some(p) = procs {
            super::join_in_child(std::slice::from_ref(p))
                .with_context(|| format!("join {}", p.to_string_lossy()))?;
        }

        let read = read_stream(port, index)?;
        let want = share * MESSAGE as u64;
        if read != want {
            bail!("read {read} bytes of {want}");
        }
        Ok(())
    };
    let code = match client() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("memcg-trace workload sockets: client {index}: {e:#}");
            1
        }
    };

    // SAFETY: the forked child ends here without unwinding into the parent's code.
    unsafe { libc::_exit(code) }
}

/// The bytes client `index` reads from the server until the end of its stream.
fn read_stream(port: u16, index: u8) -> Result<u64> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).context("connect")?;
    conn.write_all(&[index]).context("say its index")?;
    let mut buf = vec![0u8; MESSAGE];
    let mut total = 0u64;
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("read"),
        }
    }
}

/// Step 3: accepts one connection per share and writes each its messages, one thread each.
fn stream(listener: &TcpListener, shares: &[u64]) -> Result<()> {
    use std::os::fd::AsRawFd as _;
    let deadline = Instant::now() + CONNECT_WAIT;
    let mut conns = Vec::new();
    let mut seen = vec![false; shares.len()];
    while conns.len() < shares.len() {
        if stopped() {
            bail!("sockets: stopped by a signal");
        }

        // Waits in poll, not in a loop of accepts: a refused accept allocates and frees a
        // socket (an accounted inode and file), charges that are not the workload's.
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };

        // SAFETY: one valid pollfd.
        let ready =
            unsafe { libc::poll(&mut fd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }

            return Err(e).context("sockets: poll");
        }

        if ready == 0 {
            bail!(
                "sockets: {} of {} clients connected in {CONNECT_WAIT:?}",
                conns.len(),
                shares.len()
            );
        }

        let (mut c, _) = listener.accept().context("sockets: accept")?;

        // The client's first byte is its index: its share, whatever the order of the
        // connections.
        c.set_read_timeout(Some(CONNECT_WAIT))?;
        let mut index = [0u8];
        c.read_exact(&mut index)
            .context("sockets: a client's index")?;
        let i = usize::from(index[0]);
        let share = *shares
            .get(i)
            .filter(|_| !seen[i])
            .ok_or_else(|| anyhow!("sockets: a connection said index {i}, not a client's"))?;
        seen[i] = true;
        conns.push((c, share));
    }

    let message = vec![0x5au8; MESSAGE];
    std::thread::scope(|s| {
        let writers: Vec<_> = conns
            .into_iter()
            .map(|(mut c, n)| {
                let message = &message;
                s.spawn(move || -> std::io::Result<()> {
                    for _ in 0..n {
                        if stopped() {
                            return Err(std::io::Error::from(std::io::ErrorKind::Interrupted));
                        }

                        c.write_all(message)?;
                    }

                    // The end of the stream: the client's read returns 0.
                    c.shutdown(std::net::Shutdown::Write)
                })
            })
            .collect();
        for w in writers {
            w.join()
                .map_err(|_| anyhow!("sockets: a writer panicked"))?
                .context("sockets: write to a client")?;
        }
        Ok(())
    })
}

/// Waits for the clients (killing them first if `kill`); their wait statuses, in order.
fn reap(pids: &[libc::pid_t], kill: bool) -> Vec<i32> {
    pids.iter()
        .map(|&pid| {
            if kill {
                // SAFETY: our own child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }

            let mut status = 0;

            // SAFETY: waiting for our own child.
            while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
            {}
            status
        })
        .collect()
}

/// Step 4: the clients' cgroups removed, the controller off again if we turned it on, this
/// process back in its own cgroup and the server's leaf removed. Best effort, said on stderr:
/// a memcg memcg-trace made is removed with all below it anyway.
fn give_back(cgroups: Option<Cgroups>) {
    let Some(c) = cgroups else {
        return;
    };
    let mut failed = Vec::new();
    for dir in &c.clients {
        if let Err(e) = fs::remove_dir(dir) {
            failed.push(format!("remove {}: {e}", dir.display()));
        }
    }

    if c.turned_on {
        if let Err(e) = fs::write(c.own.join("cgroup.subtree_control"), "-memory") {
            failed.push(format!("turn the memory controller off: {e}"));
        }
    }

    if let Err(e) = fs::write(procs_path(&c.own), "0") {
        failed.push(format!("move back into {}: {e}", c.own.display()));
    } else if let Err(e) = fs::remove_dir(&c.server) {
        failed.push(format!("remove {}: {e}", c.server.display()));
    }

    if !failed.is_empty() {
        eprintln!(
            "memcg-trace workload sockets: cgroups not given back as they were: {}",
            failed.join("; ")
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn messages_are_shared_out_whole() {
        assert_eq!(super::shares(10, 4), [3, 3, 2, 2]);
        assert_eq!(super::shares(3, 4), [1, 1, 1, 0]);
        assert_eq!(super::shares(8, 4).iter().sum::<u64>(), 8);
    }
}
