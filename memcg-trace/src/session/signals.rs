//! The stop signals: noted from the first moment of start-up, never lost, turned into an
//! end of the session (or of start-up, at its next stop point).

use super::*;

/// The stop signals: SIGINT, SIGTERM and SIGHUP.
pub(super) const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The stop signals this process was started with ignored, as a bit per signal number: `nohup`
/// ignores SIGHUP, and a shell without job control SIGINT for a command run with `&`. Those
/// stay ignored (a handler would undo what the user asked for, and one sent before it was in
/// place would be dropped by the kernel anyway). Read once, before any handler exists
/// ([`block_stop_signals`] with `true`): a process-wide fact, as dispositions are.
static IGNORED_AT_START: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether `sig` is one of the stop signals this process was started with ignored.
pub fn ignored_at_start(sig: libc::c_int) -> bool {
    IGNORED_AT_START.load(std::sync::atomic::Ordering::Relaxed) & (1 << sig) != 0
}

/// The stop signal that arrived (0: none yet), set by an action of its own beside the
/// runtime's ([`Signals::install`]). Start-up's long steps (attach, the floors) run without
/// await points, where the runtime cannot see a signal: they look here between their parts
/// ([`stop_point`]). A process-wide fact, as a signal's arrival is; never cleared: a process
/// that was asked to stop starts no further session (`bench`'s rounds end on a signal).
static STOPPED_BY: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The stop signal that arrived since the handlers were installed, if one did.
pub fn stop_requested() -> Option<i32> {
    match STOPPED_BY.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        s => Some(s),
    }
}

/// A point between two parts of start-up: held there by a test ([`HOLD_START`]), and ended
/// there with [`Interrupted`] if a stop signal came.
pub(super) fn stop_point(point: &str) -> Result<()> {
    hold_start(point);
    match stop_requested() {
        Some(s) => Err(Interrupted(s).into()),
        None => Ok(()),
    }
}

/// Registers, once per process, the actions that note a stop signal in [`STOPPED_BY`], for the
/// stop signals not ignored at start (an action would install a handler, undoing the ignore).
fn note_stop_signals() -> Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        for sig in STOP_SIGNALS.into_iter().filter(|s| !ignored_at_start(*s)) {
            // SAFETY: the action only stores to an atomic, which is async-signal-safe.
            unsafe {
                signal_hook_registry::register(sig, move || {
                    STOPPED_BY.store(sig, std::sync::atomic::Ordering::Relaxed)
                })
            }
            .map_err(|e| format!("a handler for signal {sig}: {e}"))?;
        }
        Ok(())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// Records which stop signals are ignored now (before any handler of ours exists).
fn note_ignored() {
    let mut bits = 0u64;
    for sig in STOP_SIGNALS {
        // SAFETY: a query (no new action): sigaction writes the current one to `old`.
        let ignored = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
        };
        if ignored {
            bits |= 1 << sig;
        }
    }
    IGNORED_AT_START.store(bits, std::sync::atomic::Ordering::Relaxed);
}

/// Blocks (`true`) or unblocks the stop signals in the calling thread. `cli::main` blocks them
/// first of all, before any thread exists (threads inherit the mask; children get an empty one
/// from std's spawn), and a session unblocks them once its handlers and their actions are in
/// place: a stop signal that comes meanwhile waits in the kernel and is delivered then, never
/// dropped. (Installing a handler is not atomic: signal-hook-registry, under tokio, sets the
/// OS handler before it registers the action, and a signal in between reached no action: a
/// SIGINT at start-up was lost and the whole workload traced.) The commands that have no
/// session unblock them at once.
pub fn block_stop_signals(block: bool) {
    if block {
        note_ignored();
    }

    // SAFETY: sigset_t is a plain bit set that sigemptyset initialises; pthread_sigmask only
    // reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in STOP_SIGNALS {
            libc::sigaddset(&mut set, s);
        }

        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };

        // Fails only for an invalid `how`.
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Test-only switch: a directory; start-up stops at each point named by a file `<point>.hold`
/// there (file `<point>.held` written) until `<point>.go` exists or a stop signal has been
/// noted ([`stop_requested`]; 60 s at most), so that a
/// test sends its signal inside the window every time. Points: `before-handlers` (signals
/// blocked, no handler yet), `before-unblock` (handlers and actions in place, signals still
/// blocked), and the [`stop_point`]s of attaching: `symbols`, `masks`, `load`, `attach-N`
/// (before the Nth probe), `floor-BACKEND`.
pub const HOLD_START: &str = "MEMCG_TRACE_TEST_HOLD_START";

/// Holds start-up at `point` where [`HOLD_START`] asks for it.
fn hold_start(point: &str) {
    let Some(dir) = std::env::var_os(HOLD_START).map(PathBuf::from) else {
        return;
    };
    if !dir.join(format!("{point}.hold")).exists() {
        return;
    }

    let _ = fs::write(dir.join(format!("{point}.held")), b"");
    let go = dir.join(format!("{point}.go"));
    let t0 = Instant::now();

    // A stop signal noted ends the hold too: a test waits for that, not for a moment.
    while !go.exists() && stop_requested().is_none() && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A stream of the stop signal `sig`, or none where the process was started with it ignored
/// ([`ignored_at_start`]).
pub fn listen(sig: libc::c_int, kind: SignalKind) -> Result<Option<Signal>> {
    Ok(if ignored_at_start(sig) {
        None
    } else {
        Some(signal(kind)?)
    })
}

/// The next signal of `s`; never, for a signal not listened to.
pub async fn next_of(s: &mut Option<Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// SIGINT, SIGTERM and SIGHUP, listened to from the first moment of a session; none for a
/// signal the process was started with ignored ([`ignored_at_start`]).
pub(super) struct Signals(Option<Signal>, Option<Signal>, Option<Signal>);

impl Signals {
    /// Installs the handlers, then unblocks the signals (blocked since `cli::main` began):
    /// one that arrived before is delivered now, to a handler with its action.
    pub(super) fn install() -> Result<Signals> {
        hold_start("before-handlers");
        let signals = Signals(
            listen(libc::SIGINT, SignalKind::interrupt())?,
            listen(libc::SIGTERM, SignalKind::terminate())?,
            listen(libc::SIGHUP, SignalKind::hangup())?,
        );
        note_stop_signals()?;
        hold_start("before-unblock");
        block_stop_signals(false);
        Ok(signals)
    }

    pub(super) async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = next_of(&mut self.0) => libc::SIGINT,
            _ = next_of(&mut self.1) => libc::SIGTERM,
            _ = next_of(&mut self.2) => libc::SIGHUP,
        }
    }

    /// A signal that already arrived, without waiting. Start-up runs without await points, so
    /// the runtime's signal driver has not read the signals that came meanwhile: a yield lets
    /// it (tokio wakes a yielded task only after polling its drivers).
    pub(super) async fn pending(&mut self) -> Option<i32> {
        tokio::task::yield_now().await;
        self.recv().now_or_never()
    }
}

/// Test-only switch: a session with this variable set panics at its first tick.
pub const INJECT_PANIC: &str = "MEMCG_TRACE_INJECT_PANIC";

/// The error a session start ends with when a stop signal arrives before tracing began.
#[derive(Debug)]
pub struct Interrupted(pub i32);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped by signal {} before tracing began", self.0)
    }
}

impl std::error::Error for Interrupted {}

/// The exit status a command returns when start-up was interrupted by a signal, if that was
/// the error.
pub fn interrupted_exit_code(e: &anyhow::Error) -> Option<i32> {
    e.downcast_ref::<Interrupted>().map(|i| 128 + i.0)
}
