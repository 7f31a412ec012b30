//! A run's life: stop signals at every moment of start-up and after, the workload taken
//! along, stale memcgs swept, start-up's priority.

use super::*;

#[test]
fn host_sigterm_writes_json_and_removes_memcg() {
    let name = "host_sigterm_writes_json_and_removes_memcg";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let dir = scratch(name);
    let json = dir.join("term.json");
    let child = Command::new(bin())
        .args([
            "record",
            "-q",
            "-o",
            json.to_str().unwrap(),
            "--",
            "sleep",
            "60",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_workload(Duration::from_secs(60));

    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = load_recording(&json);
    assert!(doc.meta.workload.is_some());
    assert!(
        leftover_memcgs().is_empty(),
        "memcg left after SIGTERM: {:?}",
        leftover_memcgs()
    );
}

#[test]
fn host_sigkill_takes_the_workload_along_and_the_next_run_removes_the_memcg() {
    let name = "host_sigkill_takes_the_workload_along_and_the_next_run_removes_the_memcg";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let mut child = Command::new(bin())
        .args(["record", "-q", "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stale = wait_for_workload(Duration::from_secs(60));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        stale.exists(),
        "the memcg survives a SIGKILL of memcg-trace"
    );

    // The workload does not outlive memcg-trace (the kernel kills it with its parent).
    let procs = stale.join("cgroup.procs");
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&procs)
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the workload outlived memcg-trace: {}",
            std::fs::read_to_string(&procs).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let out = run(&["record", "-q", "--", "true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("removed stale memcg"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stale.exists(), "{} still exists", stale.display());
    assert!(leftover_memcgs().is_empty(), "{:?}", leftover_memcgs());
}

/// flock(2) on a directory, held while the returned file lives.
fn flock_dir(dir: &Path) -> fs::File {
    use std::os::fd::AsRawFd as _;
    let file = fs::File::open(dir).unwrap();

    // SAFETY: flock on a descriptor we own.
    assert_eq!(
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0,
        "flock {}: {}",
        dir.display(),
        std::io::Error::last_os_error()
    );
    file
}

#[test]
fn host_stale_memcgs_are_told_by_their_lock_not_by_the_pid_in_their_name() {
    let name = "host_stale_memcgs_are_told_by_their_lock_not_by_the_pid_in_their_name";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let hierarchy = memcg_trace::workload::find_hierarchy().unwrap();

    // Left by a killed run whose pid was reused since (pid 1 is always alive): stale.
    let reused = hierarchy.root.join("memcg-trace.1");

    // A live run's, from another pid namespace: its pid means nothing here (and no process
    // has it), but it holds its lock: not stale.
    let held = hierarchy.root.join("memcg-trace.4194399");
    let _ = fs::create_dir(&reused);
    let _ = fs::create_dir(&held);
    let lock = flock_dir(&held);
    let out = run(&["record", "-q", "--attach", "tracepoint", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let held_kept = held.exists();
    drop(lock);
    let _ = fs::remove_dir(&held);
    assert!(out.status.success(), "{err}");
    assert!(
        !reused.exists(),
        "a memcg nobody holds was kept because its pid is alive: {err}"
    );
    assert!(
        err.contains("removed stale memcg") && err.contains("memcg-trace.1"),
        "{err}"
    );
    assert!(held_kept, "a held memcg was removed as stale: {err}");
    assert!(leftover_memcgs().is_empty(), "{:?}", leftover_memcgs());
}

#[test]
fn host_stop_signals_at_any_moment_of_start_up_leave_nothing_behind() {
    let name = "host_stop_signals_at_any_moment_of_start_up_leave_nothing_behind";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let dir = scratch(name);

    // Runs ended by the signal's default action, during start-up (128+N, no recording), and
    // after tracing began (128+N and a recording).
    let (mut early, mut start_up, mut traced) = (0, 0, 0);

    // From before the handlers exist to well after the workload started (start-up takes
    // about 0.25 s here): each point of start-up is hit by some delay.
    for (i, delay_ms) in [
        0u64, 5, 15, 30, 50, 80, 120, 170, 230, 300, 450, 700, 1500, 3000,
    ]
    .into_iter()
    .enumerate()
    {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            let marker = format!("{}.{i}{sig}", 600 + i);
            let json = dir.join(format!("{i}-{sig}.json"));
            let _ = fs::remove_file(&json);
            let child = stop_signals_default(
                Command::new(bin())
                    .args(["record", "-q", "--attach", "tracepoint", "-o"])
                    .arg(&json)
                    .args(["--", "sleep", &marker])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped()),
            )
            .spawn()
            .unwrap();
            thread::sleep(Duration::from_millis(delay_ms));

            // SAFETY: kill(2) of our child.
            unsafe { libc::kill(child.id() as i32, sig) };
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            let what = format!("signal {sig} after {delay_ms} ms: {:?}: {err}", out.status);

            // Before the handlers exist the signal's default action ends the process, which
            // has created nothing yet; from then on it ends like a shell: 128 + N.
            use std::os::unix::process::ExitStatusExt as _;
            assert!(
                out.status.code() == Some(128 + sig) || out.status.signal() == Some(sig),
                "{what}"
            );
            assert!(err.lines().count() <= 1, "{what}");
            assert_left_nothing(&what, &marker);

            // A recording, where one was written, is whole.
            if json.exists() {
                load_recording(&json);
                traced += 1;
            } else if out.status.code().is_some() {
                start_up += 1;
            } else {
                early += 1;
            }
        }
    }

    summary(
        name,
        &format!(
            "{} runs left nothing behind: {early} ended before the handlers, {start_up} in start-up, {traced} while tracing",
            early + start_up + traced
        ),
    );
    assert!(start_up > 0 && traced > 0, "the delays missed a phase");
}

/// Started with SIGHUP ignored, as `nohup` starts it: a SIGHUP, sent at once (in start-up) or
/// while tracing, neither stops the run nor is taken by a handler; SIGINT still stops it
/// like a shell (130, a whole recording). Before, the handler replaced the ignore: a SIGHUP
/// in start-up was dropped by the kernel and the whole workload traced, and one while
/// tracing ended a `nohup` run.
#[test]
fn host_a_stop_signal_ignored_at_start_stays_ignored() {
    let name = "host_a_stop_signal_ignored_at_start_stays_ignored";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let dir = scratch(name);
    let json = dir.join("run.json");
    let _ = fs::remove_file(&json);
    let marker = "30.71";
    let mut cmd = Command::new(bin());
    cmd.args(["record", "-q", "--attach", "tracepoint", "-o"])
        .arg(&json)
        .args(["--", "sleep", marker])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    {
        use std::os::unix::process::CommandExt as _;

        // SAFETY: signal(2) is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
    }

    let mut child = cmd.spawn().unwrap();

    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    wait_for_workload(Duration::from_secs(60));

    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP stopped a run started with SIGHUP ignored"
    );

    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let what = "SIGINT after two ignored SIGHUPs";
    let out = wait_exit(child, Duration::from_secs(60), what);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGINT), "{what}: {err}");
    load_recording(&json);
    assert_left_nothing(what, marker);
    summary(
        name,
        "SIGHUP at start-up and while tracing ignored, as nohup asks; SIGINT then ended it with 130 and a recording",
    );
}

/// A stop signal sent while start-up is held inside the window around the handlers'
/// installation (`MEMCG_TRACE_TEST_HOLD_START`): before any handler exists, and with the
/// handlers in place but the signals not yet unblocked. Every run must end like a shell
/// (128 + N) with the one-line "stopped by signal N before tracing began", never trace the
/// workload nor die by the signal's default action. Without the mask the first point dies by
/// the signal; without the unblock the signal is never delivered and the run goes on.
#[test]
fn host_a_stop_signal_inside_the_handler_window_is_delivered_late_never_lost() {
    let name = "host_a_stop_signal_inside_the_handler_window_is_delivered_late_never_lost";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let points = ["before-handlers", "before-unblock"];
    let mut runs = 0;
    for (i, point) in points.iter().enumerate() {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            let hold = scratch(&format!("{name}-{i}-{sig}"));
            fs::write(hold.join(format!("{point}.hold")), b"").unwrap();
            let marker = format!("{}.{i}{sig}", 700 + i);
            let child = stop_signals_default(
                Command::new(bin())
                    .args(["record", "-q", "--attach", "tracepoint", "-o"])
                    .arg(hold.join("run.json"))
                    .args(["--", "sleep", &marker])
                    .env(memcg_trace::session::HOLD_START, &hold)
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped()),
            )
            .spawn()
            .unwrap();
            assert!(
                appears(&hold.join(format!("{point}.held")), 30),
                "{point}: start-up never reached the hold"
            );

            // SAFETY: kill(2) of our child.
            unsafe { libc::kill(child.id() as i32, sig) };
            fs::write(hold.join(format!("{point}.go")), b"").unwrap();

            // A lost signal would trace the whole sleep: stop waiting well before.
            let (out, lost) = ends_within(child, 60);
            let err = String::from_utf8_lossy(&out.stderr);
            let what = format!("signal {sig} held at {point}: {:?}: {err}", out.status);
            assert!(
                !lost,
                "{what}: the signal was lost (still tracing after 60 s)"
            );
            assert_eq!(out.status.code(), Some(128 + sig), "{what}");
            assert!(
                err.contains(&format!("stopped by signal {sig} before tracing began")),
                "{what}"
            );
            assert!(!hold.join("run.json").exists(), "{what}: a recording");
            assert_left_nothing(&what, &marker);
            runs += 1;
        }
    }

    summary(
        name,
        &format!("{runs} signals sent inside the handler window: each delivered once unblocked"),
    );
}

/// A stop signal that comes while the probes are being attached ends start-up before the next
/// probe, not once all are attached and their floors measured: start-up is held before the
/// first probe (`attach-0`) until the signal is noted, SIGTERM sent, and the run must end with "stopped by signal 15
/// before tracing began" without ever reaching the second (`attach-1`), leaving nothing
/// behind. Beside a benchmark that keeps every CPU busy, start-up's steps take many times as
/// long, and a stop signal acted on only between them waited that long (a `timeout` sent
/// SIGTERM, then had to kill).
#[test]
fn host_a_stop_signal_while_attaching_ends_start_up_before_the_next_probe() {
    let name = "host_a_stop_signal_while_attaching_ends_start_up_before_the_next_probe";
    let Some(_serial) = host_ready(name) else {
        return;
    };

    // The same start-up without a signal reaches the second probe: otherwise the test could
    // not tell "before the next probe" from "after the last".
    let control = scratch(&format!("{name}-control"));
    for f in ["attach-1.hold", "attach-1.go"] {
        fs::write(control.join(f), b"").unwrap();
    }

    let out = Command::new(bin())
        .args(["record", "-q", "--attach", "tracepoint", "-o"])
        .arg(control.join("run.json"))
        .args(["--", "true"])
        .env(memcg_trace::session::HOLD_START, &control)
        .output()
        .unwrap();
    assert!(
        out.status.success() && control.join("attach-1.held").exists(),
        "a run without a signal did not reach a second probe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hold = scratch(name);
    for p in ["attach-0", "attach-1"] {
        fs::write(hold.join(format!("{p}.hold")), b"").unwrap();
    }

    let marker = "711.5";
    let child = stop_signals_default(
        Command::new(bin())
            .args(["record", "-q", "--attach", "tracepoint", "-o"])
            .arg(hold.join("run.json"))
            .args(["--", "sleep", marker])
            .env(memcg_trace::session::HOLD_START, &hold)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )
    .spawn()
    .unwrap();
    assert!(
        appears(&hold.join("attach-0.held"), 60),
        "start-up never reached the first probe"
    );

    // Were the signal acted on only after attaching, the run would hold at the second probe:
    // it passes there at once, so that such a run ends too, and is caught by the file it
    // leaves.
    fs::write(hold.join("attach-1.go"), b"").unwrap();

    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };

    // No go for the first hold: it ends once the signal is noted (60 s at most, after which
    // a run that never noted it goes on to the second probe).
    let (out, lost) = ends_within(child, 120);
    let err = String::from_utf8_lossy(&out.stderr);
    let what = format!("SIGTERM before the first probe: {:?}: {err}", out.status);
    assert!(
        !lost,
        "{what}: the signal was lost (still running after 120 s)"
    );
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{what}");
    assert!(
        err.contains("stopped by signal 15 before tracing began"),
        "{what}"
    );
    assert!(
        !hold.join("attach-1.held").exists(),
        "{what}: start-up went on to attach the second probe"
    );
    assert!(!hold.join("run.json").exists(), "{what}: a recording");
    assert_left_nothing(&what, marker);
    summary(
        name,
        "SIGTERM before the first probe: start-up ended there (128 + 15), the second probe never attached",
    );
}

/// Start-up runs at a raised priority (nice -10: it is CPU-bound, and beside a benchmark that
/// keeps every CPU busy it got one task's share among all of them), and puts it back before
/// the workload starts: the workload (which would inherit it) and the daemon while it traces
/// run at the nice value memcg-trace was started with. Read from /proc while start-up is held
/// before its first probe, then by the workload, of itself and of the daemon (its parent).
/// This thread's nice value, which a child it starts inherits.
fn own_nice() -> i32 {
    nice_of("/proc/thread-self/stat")
}

/// The nice value in a `/proc/.../stat` file (the 19th field; the command's name, the second,
/// is in parentheses and may hold spaces).
fn nice_of(stat: &str) -> i32 {
    let stat = fs::read_to_string(stat).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(16).unwrap().parse().unwrap()
}

/// Whether `path` exists within `secs` seconds.
fn appears(path: &Path, secs: u64) -> bool {
    let t0 = Instant::now();
    while !path.exists() && t0.elapsed() < Duration::from_secs(secs) {
        thread::sleep(Duration::from_millis(5));
    }

    path.exists()
}

/// The child's output once it ends, and whether it had to be killed after `secs` seconds.
fn ends_within(mut child: std::process::Child, secs: u64) -> (Output, bool) {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(secs) {
        thread::sleep(Duration::from_millis(20));
    }

    let lost = child.try_wait().unwrap().is_none();
    if lost {
        let _ = child.kill();
    }
    (child.wait_with_output().unwrap(), lost)
}

#[test]
fn host_start_up_runs_at_a_raised_priority_and_the_workload_at_its_own() {
    let name = "host_start_up_runs_at_a_raised_priority_and_the_workload_at_its_own";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let hold = scratch(name);
    fs::write(hold.join("attach-0.hold"), b"").unwrap();
    let seen = hold.join("nice.txt");
    let script = format!(
        "echo $(cut -d' ' -f19 /proc/self/stat) $(cut -d' ' -f19 /proc/$PPID/stat) >{}",
        seen.display()
    );
    let child = Command::new(bin())
        .args(["record", "-q", "--attach", "tracepoint", "-o"])
        .arg(hold.join("run.json"))
        .args(["--", "sh", "-c", &script])
        .env(memcg_trace::session::HOLD_START, &hold)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        appears(&hold.join("attach-0.held"), 60),
        "start-up never reached the first probe"
    );
    let nice_starting = nice_of(&format!("/proc/{}/stat", child.id()));
    fs::write(hold.join("attach-0.go"), b"").unwrap();
    let (out, _) = ends_within(child, 120);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    let read = fs::read_to_string(&seen).unwrap_or_default();
    let nice_tracing: Vec<i32> = read
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // Raised unless this test already runs at least as high; the workload and the daemon
    // while tracing at this test's (which the daemon started with).
    let own = own_nice();
    assert_eq!(
        (nice_starting, nice_tracing.as_slice()),
        (own.min(memcg_trace::session::STARTUP_NICE), [own, own].as_slice()),
        "nice while starting, then the workload's and the daemon's while tracing ({read:?}; this test's {own})"
    );
    summary(
        name,
        &format!(
            "nice {nice_starting} while starting; workload {} and daemon {} while tracing",
            nice_tracing[0], nice_tracing[1]
        ),
    );
}

#[test]
fn host_signal_matrix_record() {
    let name = "host_signal_matrix_record";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let dir = scratch(name);
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
            let marker = format!("900.{r}{}", how.unwrap_or(0));
            let json = dir.join(format!("{}-{r}.json", how.unwrap_or(0)));
            let _ = fs::remove_file(&json);
            let mut cmd = Command::new(bin());
            cmd.args(["record", "-q", "--attach", "tracepoint", "-o"])
                .arg(&json)
                .args(["--", "sleep", &marker])
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            if how.is_none() {
                cmd.env(memcg_trace::session::INJECT_PANIC, "1");
            }

            let child = stop_signals_default(&mut cmd).spawn().unwrap();
            let what = format!("record, {label}, run {r}");
            if let Some(sig) = how {
                wait_for_workload(Duration::from_secs(60));

                // SAFETY: kill(2) of our child.
                unsafe { libc::kill(child.id() as i32, sig) };
            }

            let out = wait_exit(child, Duration::from_secs(60), &what);
            let err = String::from_utf8_lossy(&out.stderr);
            match how {
                Some(sig) => {
                    assert_eq!(out.status.code(), Some(128 + sig), "{what}: {err}");
                    load_recording(&json);
                }
                None => {
                    assert_eq!(out.status.code(), Some(101), "{what}: {err}");
                    assert!(
                        err.contains("internal error") && err.lines().count() == 1,
                        "{what}: {err}"
                    );
                    assert!(!json.exists(), "{what}: a recording after a panic");
                }
            }

            assert_left_nothing(&what, &marker);
        }

        done.push(format!("{label} {runs}/{runs}"));
    }

    summary(name, &done.join(", "));
}
