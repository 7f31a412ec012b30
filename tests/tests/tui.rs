//! The dashboard in a real terminal (tmux): live on this machine's kernel with a workload in a
//! memcg, and on a recording from a VM; plus the errors it gives before touching the terminal.

use std::{
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use memcg_trace_tests::*;

/// Tests that attach and create memcgs run one at a time (they check that none is left).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// tmux with a terminal type set: CI runs without one.
fn tmux_cmd() -> Command {
    let mut c = Command::new("tmux");
    if std::env::var_os("TERM").is_none_or(|t| t.is_empty() || t == "dumb") {
        c.env("TERM", "xterm-256color");
    }
    c
}

fn tmux(args: &[&str]) -> String {
    let out = tmux_cmd().args(args).output().expect("run tmux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tmux_ready(name: &str) -> bool {
    if tmux_cmd().arg("-V").output().is_err() {
        skip(name, "tmux missing (cargo xtask setup installs it)");
        return false;
    }
    true
}

/// A tmux session running `cmd` in a shell that prints `EXIT=<status>` afterwards.
struct Session(String);

impl Session {
    fn start(name: &str, cmd: &str) -> Session {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", name])
            .output();
        let shell = format!("{cmd}; echo EXIT=$?; sleep 60");
        let ok = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                "120",
                "-y",
                "36",
                "sh",
                "-c",
                &shell,
            ])
            .status()
            .expect("tmux new-session");
        assert!(ok.success());
        Session(name.to_string())
    }

    fn screen(&self) -> String {
        tmux(&["capture-pane", "-p", "-t", &self.0])
    }

    fn cursor_visible(&self) -> bool {
        tmux(&["display", "-p", "-t", &self.0, "#{cursor_flag}"]).trim() == "1"
    }

    fn alternate(&self) -> bool {
        tmux(&["display", "-p", "-t", &self.0, "#{alternate_on}"]).trim() == "1"
    }

    fn keys(&self, k: &str) {
        tmux(&["send-keys", "-t", &self.0, k]);
    }

    /// Waits until `pred(screen)` holds; panics with the screen otherwise.
    fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }

            assert!(
                start.elapsed() < timeout,
                "timed out waiting for {what}; screen:\n{screen}"
            );
            thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

/// The calls/s figure of the first table row for `probe` in `context`.
fn rate_of(screen: &str, probe: &str, context: &str) -> Option<String> {
    screen.lines().find_map(|l| {
        let cells: Vec<&str> = l.trim_matches('│').split_whitespace().collect();
        (cells.len() >= 3 && cells[0] == probe && cells[1] == context).then(|| cells[2].to_string())
    })
}

#[test]
fn tui_live_dashboard_with_a_workload() {
    let name = "tui_live_dashboard_with_a_workload";
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        skip(name, "needs root");
        return;
    }

    if !tmux_ready(name) {
        return;
    }

    let bin = bin();
    let session = Session::start(
        "memcg-trace-live",
        &format!(
            "{} top --tick 500ms -- sh -c 'while true; do hackbench -g 1 -l 100 >/dev/null; done'",
            bin.display()
        ),
    );
    let screen = session.wait_for(
        "stat rows with a non-zero rate",
        Duration::from_secs(60),
        |sc| {
            matches!(rate_of(sc, "stat", "task"), Some(r) if r != "0" && r != "-")
                && matches!(rate_of(sc, "stat", "workload"), Some(r) if r != "0" && r != "-")
        },
    );
    assert!(
        session.alternate(),
        "the dashboard runs on the alternate screen"
    );
    assert!(screen.contains("memcg-trace "), "{screen}");
    session.keys("?");
    session.wait_for("the help overlay", Duration::from_secs(10), |sc| {
        sc.contains("this help")
    });
    session.keys("?");
    session.keys("q");
    let end = session.wait_for("the exit status", Duration::from_secs(30), |sc| {
        sc.contains("EXIT=")
    });
    assert!(end.contains("EXIT=0"), "{end}");
    assert!(
        !session.alternate(),
        "the terminal left the alternate screen"
    );
    assert!(leftover_memcgs().is_empty(), "{:?}", leftover_memcgs());
    let _ = writeln_screen(name, &screen);
}

/// `top -- CMD` ends on the workload's whole run: once it exits, the dashboard shows the run's
/// figures (cumulative, from its final snapshot), whatever its length: a workload shorter than
/// one tick had no interval at all, a longer one's last interval may have had no call.
#[test]
fn tui_top_ends_on_the_whole_run() {
    let name = "tui_top_ends_on_the_whole_run";
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        skip(name, "needs root");
        return;
    }

    if !tmux_ready(name) {
        return;
    }

    let bin = bin();

    // Shorter than the tick (0.4 s here), and several ticks long.
    for (loops, tick) in [(300, "2s"), (3000, "500ms")] {
        let session = Session::start(
            "memcg-trace-ends",
            &format!(
                "{} top --tick {tick} -p stat -- hackbench -g 2 -l {loops}",
                bin.display()
            ),
        );
        let screen = session.wait_for("the workload's end", Duration::from_secs(120), |sc| {
            sc.contains("whole run shown")
        });
        assert!(
            screen.contains("exited 0 after") && screen.contains("cumulative"),
            "-l {loops}: {screen}"
        );
        for ctx in ["task", "workload"] {
            let rate = rate_of(&screen, "stat", ctx);
            assert!(
                matches!(&rate, Some(r) if r != "0" && r != "-"),
                "-l {loops}: stat {ctx}: calls/s {rate:?} at the end of the run:\n{screen}"
            );
        }

        session.keys("q");
        let end = session.wait_for("the exit status", Duration::from_secs(30), |sc| {
            sc.contains("EXIT=")
        });
        assert!(end.contains("EXIT=0"), "-l {loops}: {end}");
        let _ = writeln_screen(name, &screen);
    }
}

fn writeln_screen(name: &str, screen: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    writeln!(
        std::io::stderr(),
        "{name}: screen before quitting:\n{screen}"
    )
}

#[test]
fn tui_view_of_a_recording_made_in_a_vm() {
    let name = "tui_view_of_a_recording_made_in_a_vm";
    if !tmux_ready(name) {
        return;
    }

    let fixture = xtask::workspace_root().join("tests/fixtures/6.12-fentry.json");

    // The committed recording is real output and still matches the schema.
    let doc = load_recording(&fixture);
    let session = Session::start(
        "memcg-trace-view",
        &format!("{} view {}", bin().display(), fixture.display()),
    );

    // The whole first frame: tmux can be captured while the terminal is still drawing it.
    let screen = session.wait_for(
        "the recording's rows and histogram",
        Duration::from_secs(20),
        |sc| rate_of(sc, "charge", "task").is_some() && sc.contains("latency: p50"),
    );
    assert!(screen.contains(&doc.meta.kernel_release), "{screen}");
    assert!(screen.contains("recording"), "{screen}");
    assert!(
        screen.contains("latency: p50 p99 p99.9"),
        "histogram of the selected row: {screen}"
    );
    session.keys("s");
    session.wait_for("the read-only notice", Duration::from_secs(10), |sc| {
        sc.contains("read-only")
    });
    session.keys("q");
    let end = session.wait_for("the exit status", Duration::from_secs(20), |sc| {
        sc.contains("EXIT=")
    });
    assert!(end.contains("EXIT=0"), "{end}");
    assert!(!session.alternate());
}

#[test]
fn tui_view_of_two_recordings_shows_the_change() {
    let name = "tui_view_of_two_recordings_shows_the_change";
    if !tmux_ready(name) {
        return;
    }

    let dir = scratch(name);
    let fixture = xtask::workspace_root().join("tests/fixtures/6.12-fentry.json");

    // B: the same calls over twice the time, half the rate.
    let mut b: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
    let d = b["meta"]["duration_ns"].as_u64().unwrap();
    b["meta"]["duration_ns"] = (2 * d).into();
    let bp = dir.join("b.json");
    std::fs::write(&bp, serde_json::to_string(&b).unwrap()).unwrap();
    let session = Session::start(
        "memcg-trace-ab",
        &format!(
            "{} view {} {}",
            bin().display(),
            fixture.display(),
            bp.display()
        ),
    );
    let screen = session.wait_for("the A/B table", Duration::from_secs(20), |sc| {
        sc.contains("change") && sc.contains("B charge task latency")
    });
    assert!(screen.contains("A vs B"), "{screen}");
    let charge = screen
        .lines()
        .find(|l| l.contains("charge") && l.contains("task"))
        .unwrap_or_else(|| panic!("no charge task row: {screen}"));
    assert!(charge.contains("-50.0%"), "calls/s halved: {charge}");
    session.keys("q");
    let end = session.wait_for("the exit status", Duration::from_secs(20), |sc| {
        sc.contains("EXIT=")
    });
    assert!(end.contains("EXIT=0"), "{end}");
}

#[test]
fn tui_view_of_a_recording_steps_through_its_history() {
    let name = "tui_view_of_a_recording_steps_through_its_history";
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        skip(name, "needs root");
        return;
    }

    if !tmux_ready(name) {
        return;
    }

    let Some(hb) = hackbench_or_skip(name) else {
        return;
    };
    let json = scratch(name).join("h.json");
    let out = Command::new(bin())
        .args(["record", "-q", "--tick", "200ms", "-o"])
        .arg(&json)
        // hackbench, then a second with no workload calls: several ticks whatever this
        // machine's speed (hackbench alone took 0.25 s here, one 200 ms tick).
        .args([
            "--",
            "sh",
            "-c",
            &format!("{hb} -g 2 -l 300 >/dev/null; sleep 1"),
        ])
        .output()
        .expect("record");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = load_recording(&json);
    let history = doc
        .history
        .as_ref()
        .expect("the recording keeps its history");
    assert!(history.t_ms.len() >= 2, "{:?}", history.t_ms);
    let first = &doc.probes[0];
    let series = history
        .rows
        .iter()
        .find(|s| s.probe == first.name && s.context == "task")
        .expect("a task series");
    let calls: u64 = series.calls.iter().sum();
    let total = first
        .contexts
        .iter()
        .find(|c| c.context == "task")
        .unwrap()
        .count;
    assert_eq!(calls, total, "the ticks add up to the recording's calls");
    let session = Session::start(
        "memcg-trace-history",
        &format!("{} view {}", bin().display(), json.display()),
    );
    let screen = session.wait_for("the rate pane", Duration::from_secs(20), |sc| {
        sc.contains("calls/s, peak")
    });
    let peak = screen
        .split("calls/s, peak ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("0");
    assert_ne!(peak, "0", "an empty rate pane: {screen}");
    assert!(screen.contains("p99 per tick") || first.backend.to_string() == "tracepoint");
    session.keys("Left");
    session.wait_for("a stepped tick", Duration::from_secs(10), |sc| {
        sc.contains("calls/s at ")
    });
    session.keys("q");
    let end = session.wait_for("the exit status", Duration::from_secs(20), |sc| {
        sc.contains("EXIT=")
    });
    assert!(end.contains("EXIT=0"), "{end}");
}

#[test]
fn tui_errors_come_before_the_terminal_is_touched() {
    let dir = scratch("tui_errors");
    let check = |args: &[&str], want: &str| {
        let out = Command::new(bin()).args(args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("\x1b[?1049h"),
            "{args:?} switched screens"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    };
    check(
        &["view", dir.join("missing.json").to_str().unwrap()],
        "cannot read",
    );
    let truncated = dir.join("truncated.json");
    let full =
        std::fs::read_to_string(xtask::workspace_root().join("tests/fixtures/6.12-fentry.json"))
            .unwrap();
    std::fs::write(&truncated, &full[..full.len() / 2]).unwrap();
    check(&["view", truncated.to_str().unwrap()], "invalid JSON");
    std::fs::write(dir.join("v0.json"), r#"{"schema":"memcg-trace/0"}"#).unwrap();
    check(
        &["view", dir.join("v0.json").to_str().unwrap()],
        "not supported",
    );

    // Not a terminal: stdout is a pipe here.
    check(&["top"], "use `memcg-trace record`");
    assert!(Path::new(&dir).exists());
}

#[test]
fn tui_signal_matrix_top() {
    let name = "tui_signal_matrix_top";
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        skip(name, "needs root");
        return;
    }

    if !tmux_ready(name) {
        return;
    }

    let bin = bin().display().to_string();
    let runs = matrix_runs();
    let mut done = Vec::new();

    // None: a panic injected at the first tick, the way a bug would end it.
    for how in [
        Some(libc::SIGINT),
        Some(libc::SIGTERM),
        Some(libc::SIGHUP),
        None,
    ] {
        let label = how.map_or("panic".to_string(), |s| format!("signal {s}"));
        for r in 0..runs {
            let what = format!("top, {label}, run {r}");
            let marker = format!("800.{r}{}", how.unwrap_or(0));

            // The panic comes at the first tick: a long one leaves time to see the dashboard.
            let tick = if how.is_some() { "500ms" } else { "3s" };
            let args = [bin.as_str(), "top", "--tick", tick, "--", "sleep", &marker];
            let env = if how.is_none() {
                format!("{}=1 ", memcg_trace::session::INJECT_PANIC)
            } else {
                String::new()
            };
            let session = Session::start(
                &format!("memcg-trace-matrix-{r}-{}", how.unwrap_or(0)),
                &format!("{env}{}", args.join(" ")),
            );

            // Signals: once the rows are up; the panic: once the dashboard is drawn, before
            // its first tick.
            session.wait_for("the dashboard", Duration::from_secs(60), |sc| {
                sc.contains("memcg-trace ")
                    && (how.is_none() || rate_of(sc, "stat", "task").is_some())
            });
            assert!(session.alternate(), "{what}: not on the alternate screen");
            if let Some(sig) = how {
                let pid = pid_of(&args).unwrap_or_else(|| panic!("{what}: no memcg-trace process"));

                // SAFETY: kill(2) of a process this test started.
                unsafe { libc::kill(pid, sig) };
            }

            let end = session.wait_for(
                &format!("{what}: the exit status"),
                Duration::from_secs(60),
                |sc| sc.contains("EXIT="),
            );
            let want = how.map_or(101, |sig| 128 + sig);
            assert!(end.contains(&format!("EXIT={want}")), "{what}:\n{end}");
            if how.is_none() {
                assert!(
                    end.contains("internal error"),
                    "{what}: the panic's line is not on the restored terminal:\n{end}"
                );
            }

            assert!(
                !session.alternate(),
                "{what}: the terminal stayed on the alternate screen"
            );
            assert!(session.cursor_visible(), "{what}: the cursor stayed hidden");
            assert_left_nothing(&what, &marker);
        }

        done.push(format!("{label} {runs}/{runs}"));
    }

    summary(name, &done.join(", "));
}
