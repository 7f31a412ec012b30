//! The live dashboard (`memcg-trace`, `memcg-trace top`) and the recording viewer
//! (`memcg-trace view`). A collector thread owns the tracer and sends a `Snapshot` each tick
//! over a channel; the UI loop drains it, applies keys to the `App` and redraws only when
//! something changed. The terminal is restored on every way out, panics included.

pub mod app;
pub mod ui;

use std::{
    io::IsTerminal as _,
    path::{Path, PathBuf},
    process::Child,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{anyhow, bail, Result};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use self::app::{Action, App, Header, Key};
use crate::{
    cli::ProbeSel,
    export::{self, TracerCost, Workload},
    kernel,
    record::{self, attach_all, check_privileges},
    snapshot::Snapshot,
    workload,
};

/// `top` options.
#[derive(clap::Args, Debug, Default)]
pub struct TopArgs {
    #[command(flatten)]
    pub sel: ProbeSel,
    /// Poll interval (e.g. 1s, 250ms); `+`/`-` change it live.
    #[arg(long, value_parser = crate::cli::parse_duration, default_value = "1s")]
    pub tick: Duration,
    /// Run the workload in this existing memcg instead of a fresh one.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// A named workload instead of a command: `hackbench` or `hackbench:ARGS`.
    #[arg(long, conflicts_with = "command")]
    pub workload: Option<String>,
    /// Leave the dashboard when the workload exits (default: stay on its final figures).
    #[arg(long)]
    pub exit: bool,
    /// Workload to run in a fresh memcg while the dashboard shows its charging.
    #[arg(last = true)]
    pub command: Vec<String>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

fn require_tty() -> Result<()> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!("not a terminal: the dashboard needs one; use `memcg-trace record` for a headless recording");
    }
    Ok(())
}

/// Restores the terminal when dropped, whichever way the dashboard ends.
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

fn map_key(k: event::KeyEvent) -> Option<Key> {
    if k.kind != KeyEventKind::Press {
        return None;
    }
    Some(match k.code {
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Key::CtrlC,
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Tab => Key::Tab,
        KeyCode::Esc => Key::Esc,
        KeyCode::Char(c) => Key::Char(c),
        _ => return None,
    })
}

/// Writes a JSON snapshot of the dashboard's figures; returns where.
type SaveFn = Box<dyn Fn(&Snapshot) -> Result<PathBuf>>;

/// What the UI loop needs from a live session; None when viewing a recording.
struct Live {
    snapshots: mpsc::Receiver<Snapshot>,
    tick_ms: Arc<AtomicU64>,
    child: Option<(Child, Vec<String>)>,
    exit_with_workload: bool,
    save: SaveFn,
}

/// Runs the UI loop until the user quits, a signal arrives, or (with --exit) the workload ends.
/// Returns the workload's exit status, if it ended.
fn ui_loop(app: &mut App, mut live: Option<Live>) -> Result<Option<i32>> {
    let mut terminal =
        ratatui::try_init().map_err(|e| anyhow!("cannot set up the terminal: {e}"))?;
    let _guard = TerminalGuard;
    let mut status = None;
    loop {
        if STOP.load(Ordering::SeqCst) {
            break;
        }
        if let Some(l) = live.as_mut() {
            while let Ok(s) = l.snapshots.try_recv() {
                app.on_snapshot(s);
            }
            if let Some((child, argv)) = l.child.as_mut() {
                if let Some(st) = child.try_wait()? {
                    use std::os::unix::process::ExitStatusExt as _;
                    let code = st.code().or_else(|| st.signal().map(|s| 128 + s));
                    status = code;
                    app.workload = Some(format!(
                        "workload: {} exited {}; figures frozen, q to quit",
                        argv.join(" "),
                        code.map(|c| c.to_string()).unwrap_or_else(|| "?".into())
                    ));
                    // The final figures include everything the workload did.
                    while let Ok(s) = l.snapshots.recv_timeout(Duration::from_millis(50)) {
                        app.on_snapshot(s);
                    }
                    app.paused = true;
                    app.dirty = true;
                    l.child = None;
                    if l.exit_with_workload {
                        break;
                    }
                }
            }
        }
        if app.dirty {
            terminal.draw(|f| ui::draw(f, app))?;
            app.dirty = false;
        }
        if event::poll(Duration::from_millis(100))? {
            match event::read()? {
                Event::Key(k) => {
                    let Some(key) = map_key(k) else { continue };
                    match app.on_key(key) {
                        Action::Quit => break,
                        Action::Save => {
                            app.message = Some(match (live.as_ref(), app.current.as_ref()) {
                                (Some(l), Some(s)) => match (l.save)(s) {
                                    Ok(p) => format!("saved {}", p.display()),
                                    Err(e) => format!("save failed: {e:#}"),
                                },
                                _ => "nothing to save yet".into(),
                            });
                        }
                        Action::Tick(t) => {
                            if let Some(l) = &live {
                                l.tick_ms.store(t.as_millis() as u64, Ordering::SeqCst);
                            }
                            app.message = Some(format!(
                                "tick {}",
                                crate::report::fmt_ns(t.as_nanos() as f64)
                            ));
                        }
                        Action::None => {}
                    }
                }
                Event::Resize(..) => app.dirty = true,
                _ => {}
            }
        }
    }
    Ok(status)
}

/// `memcg-trace view FILE.json`: the dashboard on a recording, read-only.
pub fn view(file: &Path) -> Result<i32> {
    let doc = export::read(file)?;
    require_tty()?;
    install_signal_handlers();
    let mut app = App::new(
        Header {
            kernel: doc.meta.kernel_release.clone(),
            preemption: doc.meta.preemption_model.clone(),
            recording: Some(file.display().to_string()),
        },
        Duration::from_nanos(doc.meta.tracer.tick_ns.max(1)),
    );
    app.mode = app::Mode::Cumulative;
    app.workload = doc.meta.workload.as_ref().map(|w| {
        format!(
            "workload: {} exited {} in {}",
            w.argv.join(" "),
            w.exit_status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "?".into()),
            w.cgroup
        )
    });
    app.on_snapshot(export::to_snapshot(&doc));
    ui_loop(&mut app, None)?;
    Ok(0)
}

/// `memcg-trace` / `memcg-trace top`: the live dashboard.
pub fn top(mut args: TopArgs) -> Result<i32> {
    if let Some(w) = &args.workload {
        args.command = record::named_workload(w)?;
    }
    require_tty()?;
    check_privileges()?;
    let mut memcg = None;
    if !args.command.is_empty() {
        memcg = Some(workload::prepare(args.cgroup.as_deref(), true)?);
    }
    let t0 = Instant::now();
    let cgid = memcg.as_ref().map(|m| m.cgroup_id).unwrap_or(0);
    let (mut tracer, notes) = attach_all(&args.sel, true, cgid)?;
    tracer.done_attaching();
    let startup = t0.elapsed();
    let failed = tracer.failed.clone();
    let masks = tracer.masks.clone();
    install_signal_handlers();
    let release = kernel::release();
    let config = kernel::config(&release);
    let mut app = App::new(
        Header {
            preemption: kernel::preemption_model(config.as_ref()),
            kernel: release,
            recording: None,
        },
        args.tick,
    );
    // The collector: owns the tracer, one snapshot per tick.
    let (tx, rx) = mpsc::channel();
    let tick_ms = Arc::new(AtomicU64::new(args.tick.as_millis().max(1) as u64));
    let stop = Arc::new(AtomicBool::new(false));
    let collector = {
        let (tick_ms, stop) = (tick_ms.clone(), stop.clone());
        thread::spawn(move || -> Result<()> {
            let mut next = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                if Instant::now() >= next {
                    if tx.send(tracer.snapshot()?).is_err() {
                        break;
                    }
                    next = Instant::now() + Duration::from_millis(tick_ms.load(Ordering::SeqCst));
                }
                thread::sleep(Duration::from_millis(20));
            }
            tracer.finish()?;
            Ok(())
        })
    };
    let child = match &memcg {
        Some(m) => {
            let child = m
                .command(&args.command)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| anyhow!("cannot run {:?}: {e}", args.command[0]))?;
            app.workload = Some(format!(
                "workload: {} in {}, running",
                args.command.join(" "),
                m.path.display()
            ));
            Some((child, args.command.clone()))
        }
        None => None,
    };
    let start = SystemTime::now();
    let cgroup = memcg.as_ref().map(|m| m.path.display().to_string());
    let argv = args.command.clone();
    let tick = args.tick;
    let save = Box::new(move |snap: &Snapshot| -> Result<PathBuf> {
        let doc = record::make_document(
            snap,
            record::Run {
                masks: masks.clone(),
                start,
                end: SystemTime::now(),
                tracer: TracerCost {
                    startup_ns: startup.as_nanos() as u64,
                    detach_ns: 0,
                    cpu_ns: record::cpu_time().as_nanos() as u64,
                    cpu_share: None,
                    peak_rss_kib: record::peak_rss_kib(),
                    tick_ns: tick.as_nanos() as u64,
                },
                workload: cgroup.clone().map(|cgroup| Workload {
                    argv: argv.clone(),
                    exit_status: None,
                    cgroup,
                }),
            },
            &notes,
            &failed,
        );
        let secs = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let path = PathBuf::from(format!("memcg-trace-{secs}.json"));
        export::write_atomic(&path, &doc)?;
        Ok(path)
    });
    let live = Live {
        snapshots: rx,
        tick_ms,
        child,
        exit_with_workload: args.exit,
        save,
    };
    let result = ui_loop(&mut app, Some(live));
    stop.store(true, Ordering::SeqCst);
    let collected = collector
        .join()
        .map_err(|_| anyhow!("the collector thread panicked"))?;
    if let Some(mut m) = memcg {
        m.remove()?;
    }
    collected?;
    Ok(result?.unwrap_or(0))
}
