//! Host tests, as root, on this machine's kernel: the tracepoint backend attached for real
//! during a workload in a memcg, the in-kernel code under BPF_PROG_TEST_RUN, bad input, signals.

use std::{
    fs,
    path::Path,
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use memcg_trace_tests::*;

/// Host tests create and look for memcgs; they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Root and BTF, or a visible skip. Holds the serial lock for the caller's test.
fn host_ready(name: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        skip(name, "needs root (CAP_BPF, CAP_PERFMON, cgroup writes)");
        return None;
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        skip(name, "kernel has no BTF");
        return None;
    }
    Some(guard)
}

#[test]
fn host_selftest_in_kernel_bucketing_and_context() {
    let Some(_serial) = host_ready("host_selftest_in_kernel_bucketing_and_context") else {
        return;
    };
    let out = run(&["selftest"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "selftest failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_selftest(&stdout);
}

/// The object for kernels before 5.19, loaded here on request (`MEMCG_TRACE_BPF_OBJECT`): the
/// same checks pass, except that every sequence with a call that exits on another CPU must now
/// leave it unmatched (that object has no search of the other CPUs). A bad value is refused
/// with one line before anything is loaded.
#[test]
fn host_selftest_legacy_object() {
    let Some(_serial) = host_ready("host_selftest_legacy_object") else {
        return;
    };
    let out = Command::new(bin())
        .arg("selftest")
        .env("MEMCG_TRACE_BPF_OBJECT", "legacy")
        .output()
        .expect("run memcg-trace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "selftest (legacy object) failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_selftest(&stdout);
    let migrated: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("selftest: pairing: ") && l.contains("migrated"))
        .collect();
    // Each with the legacy object's own expectation (a call left unmatched, or a pair it
    // cannot tell from a stale entry counted ambiguous), never the full object's.
    assert!(
        migrated
            .iter()
            .any(|l| l.ends_with("(legacy object: unmatched instead): ok"))
            && migrated
                .iter()
                .all(|l| l.contains(" (legacy object: ") && l.ends_with("): ok")),
        "migrated cases under the legacy object:\n{stdout}"
    );
    let full = run(&["selftest"]);
    assert!(full.status.success(), "selftest (full object) failed");
    assert!(
        !String::from_utf8_lossy(&full.stdout).contains("legacy object"),
        "the full object is the default on this kernel"
    );
    let bad = Command::new(bin())
        .arg("selftest")
        .env("MEMCG_TRACE_BPF_OBJECT", "ancient")
        .output()
        .expect("run memcg-trace");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("expected auto, full or legacy"), "{err}");
}

/// `record --attach tracepoint -- CMD` into a scratch JSON; checks it succeeded, validates the
/// recording and its invariants, and returns it with the printed summary.
fn record_tracepoint(name: &str, cmd: &[&str]) -> (memcg_trace::export::Document, String) {
    let json = scratch(name).join("tp.json");
    let mut args = vec![
        "record",
        "--attach",
        "tracepoint",
        // The kernel's run counts, for the invariants' cross-check of the hits.
        "--bpf-stats",
        "-o",
        json.to_str().unwrap(),
        "--",
    ];
    args.extend_from_slice(cmd);
    let out = run(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "record failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = load_recording(&json);
    check_invariants(&doc, &stdout);
    (doc, stdout)
}

#[test]
fn host_record_tracepoint_with_hackbench_in_a_memcg() {
    let name = "host_record_tracepoint_with_hackbench_in_a_memcg";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let Some(hb) = hackbench_or_skip(name) else {
        return;
    };
    let (doc, stdout) = record_tracepoint(name, &[&hb, "-g", "2", "-l", "100"]);
    let stat = probe(&doc, "stat");
    assert_eq!(stat.backend.to_string(), "tracepoint");
    // This kernel (6.18, no data symbols in kallsyms, no kprobes): the cheapest reads, which
    // the counts and the workload's rows below then prove right. Elsewhere it says which.
    let reads = doc.meta.reads.as_deref().expect("meta.reads");
    let has = memcg_trace::kernel::kallsyms_has;
    if has("bpf_rdonly_cast") && !has("__preempt_count") && !has("pcpu_hot") {
        assert!(
            reads.contains("load (bpf_rdonly_cast)") && reads.contains("per-CPU pointer"),
            "{reads}"
        );
    }
    if !std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        assert!(reads.contains("tracepoint hits counted per CPU"), "{reads}");
    }
    assert!(stdout.contains("programs read: "), "{stdout}");
    assert!(
        ctx_count(stat, "task") > 0,
        "no task-context stat updates seen: {stat:?}"
    );
    assert!(
        stat.contexts.iter().all(|c| c.latency.is_none()),
        "tracepoints carry no latency"
    );
    let w = doc.meta.workload.as_ref().expect("workload recorded");
    assert_eq!(w.exit_status, Some(0));
    // Attribution: the workload's own task-context calls, a non-empty part of the system's.
    let own = stat.workload.as_ref().expect("workload figures").count;
    assert!(
        own > 0 && own <= ctx_count(stat, "task"),
        "workload {own} vs system task {}",
        ctx_count(stat, "task")
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("stat") && l.contains(" workload ")),
        "{stdout}"
    );
    assert!(
        leftover_memcgs().is_empty(),
        "memcgs left behind: {:?}",
        leftover_memcgs()
    );
    // Functions the tracepoint backend cannot trace are reported with the reason.
    let charge = doc
        .not_attached
        .iter()
        .find(|n| n.name == "charge")
        .expect("charge reported as not attached");
    assert!(
        charge.reasons.iter().any(|r| r.contains("no tracepoint")),
        "{charge:?}"
    );
}

#[test]
fn host_record_sees_softirq_charging() {
    let name = "host_record_sees_softirq_charging";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let dir = scratch(&format!("{name}-files"));
    // Files created and unlinked in the memcg: their dentries and inodes are freed from RCU
    // callbacks, in softirq, and uncharged there.
    let work = dir.join("files");
    let script = format!(
        "mkdir -p {w}; for r in 1 2 3; do i=0; while [ $i -lt 3000 ]; do : > {w}/f$i; i=$((i+1)); done; rm -rf {w}; mkdir -p {w}; done; sleep 1",
        w = work.display()
    );
    let (doc, _) = record_tracepoint(name, &["sh", "-c", &script]);
    let stat = probe(&doc, "stat");
    assert!(ctx_count(stat, "task") > 0, "{stat:?}");
    assert!(
        ctx_count(stat, "softirq") > 0,
        "no softirq-context stat updates: {stat:?}"
    );
}

#[test]
fn host_workload_exit_status_passes_through() {
    let name = "host_workload_exit_status_passes_through";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let dir = scratch(name);
    let json = dir.join("fail.json");
    let out = run(&[
        "record",
        "-q",
        "-o",
        json.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "echo from-workload; exit 3",
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("from-workload\n"),
        "workload stdout passes through first"
    );
    let doc = load_recording(&json);
    assert_eq!(doc.meta.workload.as_ref().unwrap().exit_status, Some(3));
    assert!(leftover_memcgs().is_empty());
}

/// One line on stderr, `memcg-trace: error: ...` containing `want`, a non-zero exit, no panic.
fn assert_clean_error(args: &[&str], want: &str) {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("memcg-trace: error:"))
        .collect();
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: expected one error line, got:\n{err}"
    );
    assert!(
        lines[0].contains(want),
        "{args:?}: {:?} lacks {want:?}",
        lines[0]
    );
}

/// `--hdr-log`: the interval log is put in place when the run ends, with its header, and no
/// temporary file is left (this host's tracepoint backend has no latency histograms, so the
/// log holds no interval here; the VM tests read real ones with HdrHistogram_py).
#[test]
fn host_hdr_log_is_put_in_place() {
    let name = "host_hdr_log_is_put_in_place";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let dir = scratch(name);
    let log = dir.join("run.hlog");
    let out = run(&[
        "record",
        "-q",
        "-p",
        "stat",
        "-d",
        "1500ms",
        "--tick",
        "250ms",
        "--hdr-log",
        log.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = fs::read_to_string(&log).expect("the log is in place");
    assert!(
        text.starts_with("#[Histogram log format version 1.3]\n"),
        "{text}"
    );
    assert!(
        text.contains("#[StartTime: ") && text.contains("#[BaseTime: "),
        "{text}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("wrote {}", log.display())),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["run.hlog".to_string()], "only the log is left");
}

#[test]
fn host_bad_input_gives_one_clear_line() {
    let name = "host_bad_input_gives_one_clear_line";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let dir = scratch(name);
    assert_clean_error(
        &["record", "--probe", "nonsense", "-d", "1s"],
        "unknown probe \"nonsense\"; valid probes: charge, stat, rstat",
    );
    assert_clean_error(
        &["record", "--func", "no_such_function_xyz", "-d", "1s"],
        "unknown function \"no_such_function_xyz\"",
    );
    let unwritable = "/proc/memcg-trace-test/out.json";
    assert_clean_error(
        &["record", "-d", "1s", "-o", unwritable],
        "cannot write /proc/memcg-trace-test/out.json",
    );
    assert_clean_error(
        &[
            "record",
            "-d",
            "1s",
            "--hdr-log",
            "/proc/memcg-trace-test/x.hlog",
        ],
        "cannot write /proc/memcg-trace-test/x.hlog",
    );
    assert_clean_error(
        &["record", "-d", "1s", "--hdr-log", dir.to_str().unwrap()],
        "is a directory",
    );
    assert_clean_error(
        &["report", dir.join("missing.json").to_str().unwrap()],
        "cannot read",
    );
    let not_json = dir.join("bad.json");
    fs::write(&not_json, "{ truncated").unwrap();
    assert_clean_error(&["report", not_json.to_str().unwrap()], "invalid JSON");
    let other = dir.join("other.json");
    fs::write(&other, r#"{"schema":"memcg-trace/0"}"#).unwrap();
    assert_clean_error(
        &["report", other.to_str().unwrap()],
        "schema memcg-trace/0 is not supported",
    );
    assert_clean_error(
        &["record", "--cgroup", "/nonexistent/cg", "--", "true"],
        "no such cgroup directory",
    );
    assert_clean_error(
        &["record", "-q", "--", "/nonexistent/command"],
        "cannot run \"/nonexistent/command\"",
    );
    // Present in this kernel but refused by every backend here: each backend says why.
    let out = run(&["record", "-q", "--func", "obj_cgroup_charge", "-d", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        skip_case(
            "host_bad_input (untraceable --func)",
            "this kernel can trace obj_cgroup_charge",
        );
    } else {
        assert!(err.contains("cannot trace obj_cgroup_charge"), "{err}");
        assert!(
            err.contains("fentry:") && err.contains("tracepoint:"),
            "every backend tried says why: {err}"
        );
    }
    // Every probe named with --probe must attach: stat does here, charge cannot (no function
    // tracing on this kernel), and the run must say so instead of tracing two of three.
    let out = run(&["record", "-q", "-p", "stat,charge", "-d", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        skip_case(
            "host_bad_input (a named probe that cannot attach)",
            "this kernel can trace charge",
        );
    } else {
        assert!(err.contains("cannot trace charge"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    // A cgroup without the memory controller.
    for dir in ["/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"] {
        if Path::new(dir).join("cgroup.procs").exists()
            && !Path::new(dir).join("memory.current").exists()
        {
            assert_clean_error(
                &["record", "-q", "--cgroup", dir, "--", "true"],
                "not a memory cgroup",
            );
            break;
        }
    }
    // Not root: the missing capabilities are named.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(bin())
        .args(["record", "-d", "1s"])
        .output();
    match out {
        Ok(out) if out.status.code() != Some(127) => {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success());
            assert!(
                err.contains("needs root") && err.contains("CAP_BPF"),
                "{err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        _ => skip_case("host_bad_input (not root)", "setpriv is missing"),
    }
    assert!(
        leftover_memcgs().is_empty(),
        "bad input left memcgs: {:?}",
        leftover_memcgs()
    );
    // clap's own errors (malformed duration) are one usage error with exit 2.
    let out = run(&["record", "--duration", "ten"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid duration \"ten\""));
}

fn wait_for_workload(timeout: Duration) -> std::path::PathBuf {
    let start = Instant::now();
    loop {
        if let Some(cg) = leftover_memcgs().into_iter().find(|p| {
            fs::read_to_string(p.join("cgroup.procs"))
                .map(|s| !s.trim().is_empty())
                .unwrap_or(false)
        }) {
            return cg;
        }
        assert!(
            start.elapsed() < timeout,
            "workload never appeared in a memcg"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

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
    let t = std::time::Instant::now();
    while !std::fs::read_to_string(&procs)
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
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
    let f = fs::File::open(dir).unwrap();
    // SAFETY: flock on a descriptor we own.
    assert_eq!(
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0,
        "flock {}: {}",
        dir.display(),
        std::io::Error::last_os_error()
    );
    f
}

#[test]
fn host_stale_memcgs_are_told_by_their_lock_not_by_the_pid_in_their_name() {
    let name = "host_stale_memcgs_are_told_by_their_lock_not_by_the_pid_in_their_name";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let h = memcg_trace::workload::find_hierarchy().unwrap();
    // Left by a killed run whose pid was reused since (pid 1 is always alive): stale.
    let reused = h.root.join("memcg-trace.1");
    // A live run's, from another pid namespace: its pid means nothing here (and no process
    // has it), but it holds its lock: not stale.
    let held = h.root.join("memcg-trace.4194399");
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
    let v: Vec<i32> = read
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // Raised unless this test already runs at least as high; the workload and the daemon
    // while tracing at this test's (which the daemon started with).
    let own = own_nice();
    assert_eq!(
        (nice_starting, v.as_slice()),
        (own.min(memcg_trace::session::STARTUP_NICE), [own, own].as_slice()),
        "nice while starting, then the workload's and the daemon's while tracing ({read:?}; this test's {own})"
    );
    summary(
        name,
        &format!(
            "nice {nice_starting} while starting; workload {} and daemon {} while tracing",
            v[0], v[1]
        ),
    );
}

#[test]
fn host_a_workload_that_made_its_own_cgroups_is_removed_with_them() {
    let name = "host_a_workload_that_made_its_own_cgroups_is_removed_with_them";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    // The workload makes a cgroup inside its memcg and moves there (v1 or v2).
    let script = r#"cg=$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)
if [ -n "$cg" ]; then base=/sys/fs/cgroup/memory; else
  cg=$(awk -F: '$1=="0"{print $3}' /proc/self/cgroup); base=$(awk '$3=="cgroup2"{print $2; exit}' /proc/mounts); fi
mkdir "$base$cg/inner" && echo $$ > "$base$cg/inner/cgroup.procs" && exec sleep 7.77"#;
    let out = run(&[
        "record",
        "-q",
        "--attach",
        "tracepoint",
        "-d",
        "2s",
        "--",
        "sh",
        "-c",
        script,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("warning"), "{err}");
    assert_left_nothing(
        &format!("a workload in its own inner cgroup ({err})"),
        "7.77",
    );
}

/// A workload that moves into a cgroup v2 of its own below the one memcg-trace made for it (as
/// `systemd-run --scope` and container runtimes do) keeps its calls in the workload row, with
/// either object: the full one asks the kernel (`bpf_get_current_ancestor_cgroup_id`), the
/// legacy one, whose kernels (before 5.18) refuse that helper to tracing programs, reads the
/// cgroup's ancestors itself (here `cgroup.ancestors[]`; 5.10's `ancestor_ids[]` in
/// vm_matrix_5_10).
#[test]
fn host_a_workload_moved_below_its_cgroup_keeps_its_calls() {
    let name = "host_a_workload_moved_below_its_cgroup_keeps_its_calls";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let Some(hb) = hackbench_or_skip(name) else {
        return;
    };
    // The task's cgroup v2 (memcg-trace's, or on a v1 memory hierarchy its v2 companion).
    let script = format!(
        r#"cg=$(awk -F: '$1=="0"{{print $3}}' /proc/self/cgroup); base=$(awk '$3=="cgroup2"{{print $2; exit}}' /proc/mounts)
mkdir "$base$cg/in" && echo $$ > "$base$cg/in/cgroup.procs" && exec {hb} -g 2 -l 100"#
    );
    let mut report = Vec::new();
    for object in ["full", "legacy"] {
        let json = scratch(name).join(format!("{object}.json"));
        let out = Command::new(bin())
            .env("MEMCG_TRACE_BPF_OBJECT", object)
            .args(["record", "--attach", "tracepoint", "--bpf-stats", "-o"])
            .arg(&json)
            .args(["--", "sh", "-c", &script])
            .output()
            .expect("run memcg-trace");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{object} object: record failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let doc = load_recording(&json);
        check_invariants(&doc, &stdout);
        let stat = probe(&doc, "stat");
        let own = stat.workload.as_ref().expect("workload figures").count;
        let task = ctx_count(stat, "task");
        // hackbench makes nearly all task calls; a workload row that did not follow it below
        // its cgroup holds only the shell's few calls before the move.
        assert!(
            own * 2 >= task && own <= task,
            "{object} object: a workload in a cgroup below its own: workload {own} of {task} task calls\n{stdout}"
        );
        assert_left_nothing(
            &format!("{object} object: a workload moved below its cgroup"),
            "-",
        );
        report.push(format!(
            "{object} object: workload {own} of {task} task calls"
        ));
    }
    summary(name, &report.join("; "));
}

/// A field of /proc/<pid>/task/<tid>/status (or /proc/<pid>/status), as hex or decimal.
fn status_field(status: &str, field: &str) -> u64 {
    let v = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"))
        .trim();
    if field.starts_with("Cap") {
        u64::from_str_radix(v, 16).unwrap()
    } else {
        v.parse().unwrap()
    }
}

/// CAP_DAC_OVERRIDE (1) and CAP_KILL (5): what a running session keeps.
const KEPT: u64 = (1 << 1) | (1 << 5);

#[test]
fn host_after_attach_only_dac_override_and_kill_are_kept() {
    let name = "host_after_attach_only_dac_override_and_kill_are_kept";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    // The recording goes into a directory root does not own: writing it needs the kept
    // CAP_DAC_OVERRIDE.
    let dir = scratch(name).join("nobodys");
    fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let json = dir.join("r.json");
    let child = Command::new(bin())
        .args(["record", "-q", "--attach", "tracepoint", "-o"])
        .arg(&json)
        .args(["--", "sleep", "2.31"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_for_workload(Duration::from_secs(60));
    // The workload joins its memcg before exec, and the session drops its capabilities just
    // after starting it: wait for the drop (or fail after 10 s).
    let t = Instant::now();
    while fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|st| status_field(&st, "CapEff:") != KEPT)
        .unwrap_or(false)
        && t.elapsed() < Duration::from_secs(10)
    {
        thread::sleep(Duration::from_millis(20));
    }
    // Every thread of the session.
    let mut threads = 0;
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let st = fs::read_to_string(t.path().join("status")).unwrap();
        threads += 1;
        for (field, want) in [
            ("CapEff:", KEPT),
            ("CapPrm:", KEPT),
            ("CapInh:", 0),
            ("CapAmb:", 0),
            ("CapBnd:", KEPT),
            ("NoNewPrivs:", 1),
        ] {
            assert_eq!(
                status_field(&st, field),
                want,
                "{field} of thread {:?}",
                t.file_name()
            );
        }
    }
    // The workload keeps what it was started with.
    let t = Instant::now();
    let w = loop {
        match pid_of(&["sleep", "2.31"]) {
            Some(w) => break w,
            None if t.elapsed() < Duration::from_secs(10) => {
                thread::sleep(Duration::from_millis(20))
            }
            None => panic!("the workload never ran"),
        }
    };
    let wst = fs::read_to_string(format!("/proc/{w}/status")).unwrap();
    let mine = fs::read_to_string("/proc/self/status").unwrap();
    assert_eq!(
        status_field(&wst, "CapEff:"),
        status_field(&mine, "CapEff:")
    );
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = load_recording(&json);
    assert!(doc.probes.iter().any(|p| p.count > 0));
    assert!(leftover_memcgs().is_empty(), "{:?}", leftover_memcgs());
    summary(
        name,
        &format!("{threads} thread(s) at CapEff {KEPT:#x}, no_new_privs; workload untouched"),
    );
}

#[test]
fn host_a_service_account_with_bpf_and_perfmon_traces() {
    let name = "host_a_service_account_with_bpf_and_perfmon_traces";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    if xtask_which("setpriv").is_none() {
        skip(name, "setpriv (util-linux) is missing");
        return;
    }
    // nobody must be able to run the binary and write the recording: under /tmp, whatever
    // the checkout's directories allow.
    let dir = std::env::temp_dir().join(format!("{name}.{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("memcg-trace");
    fs::copy(bin(), &exe).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let out_dir = dir.join("out");
    fs::create_dir_all(&out_dir).unwrap();
    std::os::unix::fs::chown(&out_dir, Some(65534), Some(65534)).unwrap();
    let as_nobody = |caps: &str, args: &[&str]| {
        let set = format!("-all,{caps}");
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(format!("--inh-caps={set}"))
            .arg(format!("--ambient-caps={set}"))
            .arg(format!("--bounding-set={set}"))
            .arg(&exe)
            .args(args)
            .output()
            .unwrap()
    };
    // System-wide: CAP_BPF and CAP_PERFMON are all it takes.
    let sys = out_dir.join("system.json");
    let o = as_nobody(
        "+bpf,+perfmon",
        &[
            "record",
            "-q",
            "--attach",
            "tracepoint",
            "-d",
            "1s",
            "-o",
            sys.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc = load_recording(&sys);
    assert!(doc.probes.iter().any(|p| p.count > 0));
    // The loader was spared its parse of the kernel's BTF without any capability for it (a
    // seccomp filter of its own thread, see tracer::kbtf).
    assert_eq!(
        doc.meta.tracer.loader_btf_parsed, None,
        "as a service account"
    );
    // A workload's memcg is created in root's hierarchy: without CAP_DAC_OVERRIDE, one line
    // that says what is missing, and nothing left behind.
    let o = as_nobody(
        "+bpf,+perfmon",
        &["record", "-q", "--attach", "tracepoint", "--", "true"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("CAP_DAC_OVERRIDE") && err.lines().count() == 1,
        "{err}"
    );
    // With it, the workload's rows.
    let wl = out_dir.join("workload.json");
    let o = as_nobody(
        "+bpf,+perfmon,+dac_override",
        &[
            "record",
            "-q",
            "--attach",
            "tracepoint",
            "-o",
            wl.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "ls -R /usr/share/doc >/dev/null",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc = load_recording(&wl);
    assert!(doc.meta.workload.is_some());
    assert!(doc
        .probes
        .iter()
        .any(|p| p.workload.as_ref().is_some_and(|w| w.count > 0)));
    // bpf stats need CAP_SYS_ADMIN, and say so.
    let o = as_nobody(
        "+bpf,+perfmon",
        &[
            "record",
            "-q",
            "--attach",
            "tracepoint",
            "-d",
            "1s",
            "--bpf-stats",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("CAP_SYS_ADMIN"),
        "{err}"
    );
    assert!(leftover_memcgs().is_empty(), "{:?}", leftover_memcgs());
}

fn xtask_which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Waits for a child to end, at most `timeout`; kills it and fails otherwise.
fn wait_exit(
    mut child: std::process::Child,
    timeout: Duration,
    what: &str,
) -> std::process::Output {
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > timeout {
            let _ = child.kill();
            panic!("{what}: still running after {timeout:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
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

#[test]
fn host_ebpf_log_is_off_by_default_and_on_with_the_flag() {
    let name = "host_ebpf_log_is_off_by_default_and_on_with_the_flag";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    // The programs log once per CPU when they find its per-CPU base; a workload makes sure
    // every probe runs.
    let with = run(&[
        "record",
        "--ebpf-log",
        "-q",
        "--attach",
        "tracepoint",
        "--",
        "sh",
        "-c",
        "ls / >/dev/null",
    ]);
    let err = String::from_utf8_lossy(&with.stderr);
    assert!(with.status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("memcg-trace: ebpf INFO: CPU") && l.contains("per-CPU base")),
        "no eBPF diagnostics with --ebpf-log:\n{err}"
    );
    let without = run(&[
        "record",
        "-q",
        "--attach",
        "tracepoint",
        "--",
        "sh",
        "-c",
        "ls / >/dev/null",
    ]);
    let err = String::from_utf8_lossy(&without.stderr);
    assert!(without.status.success(), "{err}");
    assert!(
        !err.contains("memcg-trace: ebpf"),
        "eBPF diagnostics without the flag:\n{err}"
    );
}

/// `--callers` names call sites from a copy of the kernel's symbol table taken at start-up:
/// checked against /proc/kallsyms itself, a site well inside a function is named after it,
/// with its offset.
#[test]
fn host_call_sites_are_named_after_the_symbol_that_holds_them() {
    let name = "host_call_sites_are_named_after_the_symbol_that_holds_them";
    if !is_root() {
        skip(name, "needs root (kallsyms addresses)");
        return;
    }
    let (mut names, why) = memcg_trace::callers::Names::new();
    if let Some(why) = why {
        skip(name, &why);
        return;
    }
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let mut syms: Vec<(u64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let a = u64::from_str_radix(it.next()?, 16).ok()?;
            let t = it.next()?;
            let n = it.next()?;
            // Module text is left out: modules come and go.
            (matches!(t, "t" | "T") && it.next().is_none()).then(|| (a, n.to_string()))
        })
        .collect();
    syms.sort();
    syms.dedup_by_key(|s| s.0);
    // Three quarters into every 97th function: well inside it, past any alias at its start.
    let pick: Vec<(u64, String, u64)> = syms
        .windows(2)
        .step_by(97)
        .filter(|w| w[1].0 > w[0].0 + 8)
        .map(|w| (w[0].0, w[0].1.clone(), (w[1].0 - w[0].0) * 3 / 4))
        .collect();
    assert!(pick.len() > 100, "{} symbols", pick.len());
    names.resolve(pick.iter().map(|(a, _, o)| a + o));
    let wrong: Vec<String> = pick
        .iter()
        .filter(|(a, n, o)| names.name(a + o) != format!("{n}+{o:#x}"))
        .map(|(a, n, o)| format!("{n}+{o:#x}: {}", names.name(a + o)))
        .collect();
    // Text at one address under two names (aliases, section markers) may take either name.
    assert!(
        wrong.len() * 100 <= pick.len(),
        "{} of {} named wrong: {:?}",
        wrong.len(),
        pick.len(),
        &wrong[..wrong.len().min(10)]
    );
    summary(
        name,
        &format!("{} sites named, {} by an alias", pick.len(), wrong.len()),
    );
}

/// A memcg for a test, removed on drop (its tasks gone first: the workloads have exited).
struct TestMemcg(std::path::PathBuf);

impl TestMemcg {
    fn new(root: &Path, name: &str) -> Self {
        let p = root.join(format!("{name}-{}", std::process::id()));
        let _ = fs::remove_dir(&p);
        fs::create_dir(&p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        TestMemcg(p)
    }
}

impl Drop for TestMemcg {
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `--by-memcg` on this host's hierarchy (cgroup v1 here: the memory controller's own tree):
/// hackbench in memcg A (the `--cgroup`) and three times as much in memcg B, at once. Each
/// call lands under the memcg it charges, read from `mod_memcg_state`'s own argument, in every
/// context: per context the memcgs' rows add up to the calls (the invariants), A and B are
/// named by their paths, B has about three times A's calls, interrupt-context calls charging
/// them are seen, and the workload's row is exactly A's calls of every context. Then, without
/// the flag, a `--cgroup` still has workload rows told by the memcg (on v1 its tasks have no v2
/// id).
#[test]
fn host_by_memcg_puts_each_call_under_the_memcg_it_charges() {
    let name = "host_by_memcg_puts_each_call_under_the_memcg_it_charges";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let Some(hb) = hackbench_or_skip(name) else {
        return;
    };
    let h = match memcg_trace::workload::find_hierarchy() {
        Ok(h) => h,
        Err(e) => {
            skip(name, &format!("{e:#}"));
            return;
        }
    };
    if !h.v2 {
        // The scenario the flag is for: a database in a v1 memcg.
    } else if !fs::read_to_string(h.root.join("cgroup.subtree_control"))
        .unwrap_or_default()
        .contains("memory")
    {
        skip(
            name,
            "the v2 root does not enable the memory controller for its children",
        );
        return;
    }
    let a = TestMemcg::new(&h.root, "mt-test-a");
    let b = TestMemcg::new(&h.root, "mt-test-b");
    let json = scratch(name).join("by-memcg.json");
    let script = format!(
        "{hb} -g 1 -l 100 >/dev/null & sh -c 'echo $$ > {}/cgroup.procs; exec {hb} -g 1 -l 300' >/dev/null; wait",
        b.0.display()
    );
    let out = run(&[
        "record",
        "--attach",
        "tracepoint",
        "--bpf-stats",
        "--by-memcg",
        "--cgroup",
        a.0.to_str().unwrap(),
        "-o",
        json.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "record failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = load_recording(&json);
    check_invariants(&doc, &stdout);
    let stat = probe(&doc, "stat");
    let rel = |m: &TestMemcg| format!("/{}", m.0.strip_prefix(&h.root).unwrap().display());
    let id = |m: &TestMemcg| memcg_trace::memcgs::id_of(&m.0).unwrap();
    let calls = |m: &TestMemcg, ctx: Option<&str>| -> u64 {
        stat.memcgs
            .iter()
            .filter(|r| r.id == id(m) && ctx.is_none_or(|c| r.context == c))
            .map(|r| r.calls)
            .sum()
    };
    for m in [&a, &b] {
        for r in stat.memcgs.iter().filter(|r| r.id == id(m)) {
            assert_eq!(
                r.cgroup,
                rel(m),
                "the row of id {} is named by its path",
                r.id
            );
        }
    }
    let (ta, tb) = (calls(&a, Some("task")), calls(&b, Some("task")));
    assert!(
        ta > 0 && tb > 2 * ta && tb < 5 * ta,
        "task-context calls charging A {ta}, B {tb} (B ran three times A's hackbench)\n{stdout}"
    );
    let irq = calls(&a, None) + calls(&b, None) - ta - tb;
    assert!(
        irq > 0,
        "no interrupt-context call charging A or B (RCU frees of their objects)\n{stdout}"
    );
    let w = doc.meta.workload.as_ref().expect("workload recorded");
    assert!(w.by_memcg, "{w:?}");
    let own = stat.workload.as_ref().expect("workload figures").count;
    assert_eq!(
        own,
        calls(&a, None),
        "the workload's calls are those charging A, in every context\n{stdout}"
    );
    assert!(
        stdout.contains("stat task memcgs") && stdout.contains(&rel(&b)),
        "{stdout}"
    );
    let mut report = format!(
        "{} hierarchy: task A {ta}, B {tb}; interrupt contexts {irq}; workload {own}",
        if h.v2 { "v2" } else { "v1" }
    );
    if !h.v2 {
        // Without the flag: a v1 memcg's tasks have no v2 id, so the workload is still told by
        // the memcg charged.
        let json = scratch(name).join("v1-cgroup.json");
        let out = run(&[
            "record",
            "--attach",
            "tracepoint",
            "--bpf-stats",
            "--cgroup",
            a.0.to_str().unwrap(),
            "-o",
            json.to_str().unwrap(),
            "--",
            &hb,
            "-g",
            "1",
            "-l",
            "100",
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}");
        let doc = load_recording(&json);
        check_invariants(&doc, &stdout);
        let stat = probe(&doc, "stat");
        assert!(
            doc.meta.workload.as_ref().is_some_and(|w| w.by_memcg),
            "{:?}",
            doc.meta.workload
        );
        assert!(stat.memcgs.is_empty(), "no per-memcg rows without the flag");
        let own = stat.workload.as_ref().map_or(0, |w| w.count);
        assert!(
            own > 0 && own <= stat.count,
            "v1 --cgroup: workload {own} of {}\n{stdout}",
            stat.count
        );
        report.push_str(&format!("; v1 --cgroup without the flag: workload {own}"));
    }
    summary(name, &report);
}
