//! The dashboard: on a live session (`memcg-trace`, `memcg-trace top`) or on a recording
//! (`memcg-trace view`). One tokio loop takes in the session's events (snapshots from the
//! collector, the workload's exit, signals) and the terminal's keys, applies them to the `App`
//! and redraws only when something changed. The terminal is restored on every way out, panics
//! included.

pub mod app;
pub mod ui;

use std::{io::IsTerminal as _, path::PathBuf, time::SystemTime};

use anyhow::{anyhow, bail, Result};
use futures_util::StreamExt as _;
use ratatui::crossterm::event::{
    Event, EventStream, KeyCode, KeyEvent, KeyEventKind, KeyModifiers,
};

use self::app::{Action, App, Key, Mode};
use crate::{
    export,
    session::{End, Event as SessionEvent, Session},
    units::fmt_ns,
};

/// Fails with one line when stdin or stdout is not a terminal.
pub fn require_tty() -> Result<()> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!("not a terminal: the dashboard needs one; use `memcg-trace record` for a headless recording");
    }
    Ok(())
}

/// The terminal in dashboard mode; restored when dropped, whichever way the dashboard ends.
struct Terminal(ratatui::DefaultTerminal);

impl Terminal {
    fn new() -> Result<Terminal> {
        ratatui::try_init()
            .map(Terminal)
            .map_err(|e| anyhow!("cannot set up the terminal: {e}"))
    }

    fn draw(&mut self, app: &mut App) -> Result<()> {
        if app.dirty {
            self.0.draw(|f| ui::draw(f, app))?;
            app.dirty = false;
        }
        Ok(())
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

fn map_key(k: KeyEvent) -> Option<Key> {
    if k.kind != KeyEventKind::Press {
        return None;
    }
    Some(match k.code {
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Key::CtrlC,
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Left => Key::Left,
        KeyCode::Right => Key::Right,
        KeyCode::Tab => Key::Tab,
        KeyCode::Esc => Key::Esc,
        KeyCode::Char(c) => Key::Char(c),
        _ => return None,
    })
}

/// The next key from the terminal (None: the terminal went away); resizes mark the app dirty.
async fn next_key(events: &mut EventStream, app: &mut App) -> Result<Option<Key>> {
    loop {
        match events.next().await {
            None => return Ok(None),
            Some(Err(e)) => return Err(anyhow!("reading the terminal: {e}")),
            Some(Ok(Event::Key(k))) => {
                if let Some(key) = map_key(k) {
                    return Ok(Some(key));
                }
            }
            Some(Ok(Event::Resize(..))) => {
                app.dirty = true;
                return Ok(Some(Key::Redraw));
            }
            Some(Ok(_)) => {}
        }
    }
}

/// Writes a JSON recording of what the dashboard shows now; returns where.
fn save(session: &Session) -> Result<PathBuf> {
    let doc = export::document(&session.latest(), &session.meta_now());
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let path = PathBuf::from(format!("memcg-trace-{secs}.json"));
    export::write_atomic(&path, &doc)?;
    Ok(path)
}

/// The dashboard's workload line once the workload exited: its status, the OOM kills in its
/// memcg meanwhile, how long it ran.
fn exited_line(
    argv: &[String],
    code: Option<i32>,
    oom_kills: Option<u64>,
    took: std::time::Duration,
) -> String {
    let oom = crate::export::oom_kill_words(oom_kills)
        .map(|w| format!(" ({w})"))
        .unwrap_or_default();
    format!(
        "workload: {} exited {}{oom} after {:.1} s; whole run shown, p to go on, q to quit",
        argv.join(" "),
        code.map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
        took.as_secs_f64()
    )
}

/// Runs the dashboard on a live session until the user quits, a signal arrives, or (with
/// `exit_with_workload`) the workload ends. Returns how it ended.
pub async fn live(app: &mut App, session: &mut Session, exit_with_workload: bool) -> Result<End> {
    if !session.argv().is_empty() {
        app.workload = Some(format!(
            "workload: {} in {}, running",
            session.argv().join(" "),
            session
                .cgroup()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        ));
    }

    app.on_snapshot((*session.latest()).clone());
    let mut term = Terminal::new()?;
    let mut events = EventStream::new();
    let mut exited = None;
    loop {
        term.draw(app)?;
        tokio::select! {
            ev = session.next() => match ev? {
                SessionEvent::Tick(s) => {
                    app.set_workload_cpu(session.workload_cpu_ns());
                    app.on_snapshot((*s).clone());
                }
                SessionEvent::Signal(sig) => return Ok(End::Signal(sig)),
                SessionEvent::WorkloadExited(code) => {
                    exited = Some(code);

                    // The final figures include everything the workload did; shown for the
                    // whole run, whatever its length: its last interval may have had no call,
                    // and a run shorter than a tick had no interval at all.
                    // A snapshot now, not the last tick's (none yet in a run shorter than one).
                    let last = (*session.refresh().await?).clone();
                    let took = last.elapsed;
                    app.set_workload_cpu(session.workload_cpu_ns());
                    app.paused = false;
                    app.on_snapshot(last);
                    app.mode = Mode::Cumulative;
                    app.paused = true;
                    app.ended = true;
                    app.workload = Some(exited_line(
                        session.argv(),
                        code,
                        session.oom_kills(),
                        took,
                    ));
                    app.dirty = true;
                    if exit_with_workload {
                        return Ok(End::Exited(code));
                    }
                }
            },
            key = next_key(&mut events, app) => {
                let Some(key) = key? else { break };
                match app.on_key(key) {
                    Action::Quit => break,
                    Action::Save => {
                        app.message = Some(match save(session) {
                            Ok(p) => format!("saved {}", p.display()),
                            Err(e) => format!("save failed: {e:#}"),
                        });
                    }
                    Action::Tick(t) => {
                        session.set_tick(t);
                        app.message = Some(format!("tick {}", fmt_ns(t.as_nanos() as f64)));
                    }
                    Action::None => {}
                }
            }
        }
    }
    Ok(match exited {
        Some(code) => End::Exited(code),
        None => End::Quit,
    })
}

/// Runs the dashboard on a recording until the user quits or a signal arrives.
pub async fn view(app: &mut App) -> Result<()> {
    use crate::session::{listen, next_of};
    use tokio::signal::unix::SignalKind;

    // A stop signal the process was started with ignored (nohup) stays ignored.
    let mut term_sig = listen(libc::SIGTERM, SignalKind::terminate())?;
    let mut hup = listen(libc::SIGHUP, SignalKind::hangup())?;
    let mut int = listen(libc::SIGINT, SignalKind::interrupt())?;
    let mut term = Terminal::new()?;
    let mut events = EventStream::new();
    loop {
        term.draw(app)?;
        tokio::select! {
            _ = next_of(&mut term_sig) => break,
            _ = next_of(&mut hup) => break,
            _ = next_of(&mut int) => break,
            key = next_key(&mut events, app) => {
                let Some(key) = key? else { break };
                if app.on_key(key) == Action::Quit {
                    break;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The dashboard says when the workload's memcg saw OOM kills, and only then.
    #[test]
    fn the_exited_line_tells_an_oom_kill() {
        let argv = ["tail".to_string(), "/dev/zero".to_string()];
        let took = std::time::Duration::from_millis(2500);
        let line = super::exited_line(&argv, Some(137), Some(1), took);
        assert!(
            line.starts_with(
                "workload: tail /dev/zero exited 137 (1 OOM kill in its memcg) after 2.5 s"
            ),
            "{line}"
        );
        let plain = super::exited_line(&argv, Some(137), Some(0), took);
        assert!(
            plain.starts_with("workload: tail /dev/zero exited 137 after 2.5 s"),
            "{plain}"
        );
        let other = super::exited_line(&argv, Some(0), Some(2), took);
        assert!(
            other.contains("exited 0 (2 OOM kills in its memcg) after"),
            "{other}"
        );
    }
}
