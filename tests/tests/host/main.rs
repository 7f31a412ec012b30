//! Host tests, as root, on this machine's kernel: the tracepoint backend attached for real
//! during a workload in a memcg, the in-kernel code under BPF_PROG_TEST_RUN, bad input, signals.
//!
//! Here: the serial lock and the helpers the areas share. The tests, by area: [`recording`]
//! (the selftest, the tracepoint backend, the outputs, bad input), [`lifecycle`] (stop
//! signals, the workload taken along, stale memcgs, priority), [`cgroups`] (workloads that
//! make cgroups), [`privileges`] (what a session keeps, a service account).

use std::{
    fs,
    path::Path,
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use memcg_trace_tests::*;

mod cgroups;
mod lifecycle;
mod privileges;
mod recording;

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

/// `record --attach tracepoint -- CMD` into a scratch JSON; checks it succeeded, validates the
/// recording and its invariants, and returns it with the printed summary.
fn record_tracepoint(name: &str, cmd: &[&str]) -> (memcg_trace::export::Document, String) {
    record_tracepoint_to(&scratch(name).join("tp.json"), None, cmd)
}

/// [`record_tracepoint`] into `json`, with the eBPF object `object` where given
/// (`MEMCG_TRACE_BPF_OBJECT`: full or legacy).
fn record_tracepoint_to(
    json: &Path,
    object: Option<&str>,
    cmd: &[&str],
) -> (memcg_trace::export::Document, String) {
    record_tracepoint_in(&[], json, object, cmd)
}

/// [`record_tracepoint_to`] with memcg-trace started by `wrapper` (a command that ends by
/// running its arguments: memcg-trace's command line).
fn record_tracepoint_in(
    wrapper: &[&str],
    json: &Path,
    object: Option<&str>,
    cmd: &[&str],
) -> (memcg_trace::export::Document, String) {
    let mut record = match wrapper.split_first() {
        None => Command::new(bin()),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin());
            c
        }
    };
    if let Some(object) = object {
        record.env("MEMCG_TRACE_BPF_OBJECT", object);
    }

    // The kernel's run counts (--bpf-stats), for the invariants' cross-check of the hits.
    let out = record
        .args(["record", "--attach", "tracepoint", "--bpf-stats", "-o"])
        .arg(json)
        .arg("--")
        .args(cmd)
        .output()
        .expect("run memcg-trace");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "record ({}) failed ({}):\n{stdout}\n{}",
        object.unwrap_or("auto object"),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = load_recording(json);
    check_invariants(&doc, &stdout);
    (doc, stdout)
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
