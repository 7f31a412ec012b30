//! Recording on this machine's kernel: the selftest through the real programs (both objects),
//! the tracepoint backend's figures, the outputs (HDR log, eBPF log, call sites, memcgs) and
//! bad input.

use super::*;

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

/// The arrays the programs share with userspace (`BPF_F_MMAPABLE`: the cells, the CPUs'
/// states with the entries counted there, the switch witness's counts, the front slots) are
/// read from their mappings only, never by a map syscall: such a syscall holds its CPU's
/// `bpf_prog_active`, and a kprobe program that fires there meanwhile does not run. A
/// recording of a few ticks under strace: no map command reads a map created with the flag,
/// by the fd the kernel gave it (until that fd is closed). (This kernel has no kprobes,
/// so the tracepoint programs count in the CPUs' states, read every tick, as the entries of
/// the latency backends are where those attach.)
#[test]
fn host_shared_arrays_are_never_read_by_syscall() {
    let name = "host_shared_arrays_are_never_read_by_syscall";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    if xtask::which("strace").is_err() {
        skip(
            name,
            "strace is not installed (cargo xtask setup installs it)",
        );
        return;
    }
    let dir = scratch(name);
    let log = dir.join("strace.log");
    let log_arg = log.to_string_lossy().into_owned();
    let wrapper = [
        "strace",
        "-f",
        "-e",
        "trace=bpf,close",
        "-o",
        log_arg.as_str(),
    ];
    record_tracepoint_in(&wrapper, &dir.join("tp.json"), None, &["sleep", "3"]);

    let trace = std::fs::read_to_string(&log).expect("strace log");
    let (mapped, read) = syscall_reads_of_mapped_arrays(&trace);
    assert!(
        mapped.iter().any(|n| n == "CPU_STATE") && mapped.iter().any(|n| n == "CELLS"),
        "strace saw no mappable CPU_STATE and CELLS created (saw {mapped:?})"
    );
    assert!(
        read.is_empty(),
        "mappable arrays read by map syscalls: {read:?}"
    );
}

/// From an strace log of `bpf` and `close` calls (`-f`: each line starts with a pid, padded to
/// five columns, so a pid below 10000 is followed by two spaces; a call another thread's line
/// cut in two is `<unfinished ...>`, then `<... resumed>`): the names of
/// the maps created with `BPF_F_MMAPABLE`, and the reads of such a map by map command
/// (lookups, key walks) made while its fd was open ("name: call" each). (Writes are left out:
/// start-up writes some before any program is attached; the ticks only read.)
fn syscall_reads_of_mapped_arrays(trace: &str) -> (Vec<String>, Vec<String>) {
    let mut unfinished: std::collections::HashMap<&str, String> = Default::default();
    let mut calls = Vec::new();
    for line in trace.lines() {
        let (pid, call) = line.split_once(' ').unwrap_or(("", line));
        let call = call.trim_start();
        if let Some(head) = call.strip_suffix(" <unfinished ...>") {
            unfinished.insert(pid, head.to_string());
        } else if let Some(at) = call.find("resumed>") {
            if let Some(head) = unfinished.remove(pid) {
                calls.push(format!("{head}{}", &call[at + "resumed>".len()..]));
            }
        } else {
            calls.push(call.to_string());
        }
    }

    let field = |call: &str, key: &str| -> Option<String> {
        let rest = &call[call.find(key)? + key.len()..];
        let end = rest.find([',', '}', '"', ')']).unwrap_or(rest.len());
        Some(rest[..end].trim().to_string())
    };
    let returned = |call: &str| -> Option<u32> { call.rsplit("= ").next()?.trim().parse().ok() };
    let mut open: std::collections::HashMap<u32, String> = Default::default();
    let (mut mapped, mut read) = (Vec::new(), Vec::new());
    for call in &calls {
        if call.starts_with("bpf(BPF_MAP_CREATE") {
            if call.contains("BPF_F_MMAPABLE") {
                let name = field(call, "map_name=\"").unwrap_or_default();
                if let Some(fd) = returned(call) {
                    open.insert(fd, name.clone());
                    mapped.push(name);
                }
            }
        } else if call.starts_with("close(") {
            if let Some(fd) = field(call, "close(").and_then(|f| f.parse::<u32>().ok()) {
                open.remove(&fd);
            }
        } else if call.starts_with("bpf(BPF_MAP_LOOKUP")
            || call.starts_with("bpf(BPF_MAP_GET_NEXT_KEY")
        {
            let fd = field(call, "map_fd=").and_then(|f| f.parse::<u32>().ok());
            if let Some(name) = fd.and_then(|fd| open.get(&fd)) {
                read.push(format!("{name}: {call}"));
            }
        }
    }
    (mapped, read)
}

/// The strace parser reads lines of any pid's width (strace pads pids to five columns: a
/// four-digit pid made every line unreadable once, so the test saw no map created), calls cut
/// by another thread's line, and fds closed and reused.
#[test]
fn strace_lines_of_any_pid_width_are_read() {
    let create = |pid: &str, name: &str, fd: u32| {
        format!("{pid}bpf(BPF_MAP_CREATE, {{map_type=BPF_MAP_TYPE_ARRAY, key_size=4, value_size=8, max_entries=2, map_flags=BPF_F_MMAPABLE, inner_map_fd=0, map_name=\"{name}\", map_ifindex=0}}, 152) = {fd}")
    };
    let lookup = |pid: &str, fd: u32| {
        format!("{pid}bpf(BPF_MAP_LOOKUP_ELEM, {{map_fd={fd}, key=0x7ffd, value=0x7ffe, flags=BPF_ANY}}, 32) = 0")
    };
    let trace = [
        create("5676  ", "CPU_STATE", 27),
        create("12345 ", "CELLS", 17),
        "5676  bpf(BPF_MAP_CREATE, {map_type=BPF_MAP_TYPE_HASH, map_flags=0, map_name=\"CALLERS\"}, 152) = 30".to_string(),
        lookup("5677  ", 30),
        "5677  bpf(BPF_MAP_LOOKUP_ELEM, {map_fd=27, key=0x1 <unfinished ...>".to_string(),
        lookup("12346 ", 17),
        "5677  <... bpf resumed>, value=0x2, flags=BPF_ANY}, 32) = 0".to_string(),
        "5676  close(17)                          = 0".to_string(),
        lookup("5676  ", 17),
    ]
    .join("\n");
    let (mapped, read) = syscall_reads_of_mapped_arrays(&trace);
    assert_eq!(mapped, ["CPU_STATE", "CELLS"]);
    assert_eq!(read.len(), 2, "{read:?}");
    assert!(read[0].starts_with("CELLS: "), "{read:?}");
    assert!(read[1].starts_with("CPU_STATE: "), "{read:?}");
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
    check_bad_names_paths_and_files(&dir);
    check_untraceable_functions_and_probes();
    check_a_cgroup_without_the_memory_controller();
    check_not_root();
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

/// Unknown probes and functions, outputs that cannot be written, recordings that cannot be
/// read, a cgroup or a workload that does not exist.
fn check_bad_names_paths_and_files(dir: &Path) {
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
}

/// A function present in this kernel but refused by every backend, and a probe named with
/// `--probe` that cannot attach: each said, nothing traced.
fn check_untraceable_functions_and_probes() {
    // Each backend says why.
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
}

/// A cgroup without the memory controller (where the host has one).
fn check_a_cgroup_without_the_memory_controller() {
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
}

/// Not root: the missing capabilities are named.
fn check_not_root() {
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
    let Some(h) = hierarchy_for_by_memcg(name) else {
        return;
    };
    let memcg_a = TestMemcg::new(&h.root, "mt-test-a");
    let memcg_b = TestMemcg::new(&h.root, "mt-test-b");
    let json = scratch(name).join("by-memcg.json");
    let script = format!(
        "{hb} -g 1 -l 100 >/dev/null & sh -c 'echo $$ > {}/cgroup.procs; exec {hb} -g 1 -l 300' >/dev/null; wait",
        memcg_b.0.display()
    );
    let out = run(&[
        "record",
        "--attach",
        "tracepoint",
        "--bpf-stats",
        "--by-memcg",
        "--cgroup",
        memcg_a.0.to_str().unwrap(),
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
    let mut report = check_calls_by_memcg(&doc, &stdout, &h, [&memcg_a, &memcg_b]);
    if !h.v2 {
        let own = v1_cgroup_without_the_flag(name, &hb, &memcg_a);
        report.push_str(&format!("; v1 --cgroup without the flag: workload {own}"));
    }

    summary(name, &report);
}

/// This host's memcg hierarchy, where the test can run (v1, the scenario the flag is for; or v2
/// with the memory controller enabled for the root's children); None with the skip said.
fn hierarchy_for_by_memcg(name: &str) -> Option<memcg_trace::workload::Hierarchy> {
    let hierarchy = match memcg_trace::workload::find_hierarchy() {
        Ok(h) => h,
        Err(e) => {
            skip(name, &format!("{e:#}"));
            return None;
        }
    };
    if !hierarchy.v2 {
        // The scenario the flag is for: a database in a v1 memcg.
    } else if !fs::read_to_string(hierarchy.root.join("cgroup.subtree_control"))
        .unwrap_or_default()
        .contains("memory")
    {
        skip(
            name,
            "the v2 root does not enable the memory controller for its children",
        );
        return None;
    }
    Some(hierarchy)
}

/// Each call of `--by-memcg`'s recording under the memcg it charges (`memcgs`: A, the
/// workload's, and B), A and B named by their paths, B about three times A's task calls,
/// interrupt-context calls charging them seen, the workload's row exactly A's calls; returns
/// the report.
fn check_calls_by_memcg(
    doc: &memcg_trace::export::Document,
    stdout: &str,
    h: &memcg_trace::workload::Hierarchy,
    memcgs: [&TestMemcg; 2],
) -> String {
    let [a, b] = memcgs;
    let stat = probe(doc, "stat");
    let rel = |m: &TestMemcg| format!("/{}", m.0.strip_prefix(&h.root).unwrap().display());
    let id = |m: &TestMemcg| memcg_trace::memcgs::id_of(&m.0).unwrap();
    let calls = |m: &TestMemcg, ctx: Option<&str>| -> u64 {
        stat.memcgs
            .iter()
            .filter(|r| r.id == id(m) && ctx.is_none_or(|c| r.context == c))
            .map(|r| r.calls)
            .sum()
    };
    for m in [a, b] {
        for r in stat.memcgs.iter().filter(|r| r.id == id(m)) {
            assert_eq!(
                r.cgroup,
                rel(m),
                "the row of id {} is named by its path",
                r.id
            );
        }
    }

    let (ta, tb) = (calls(a, Some("task")), calls(b, Some("task")));
    assert!(
        ta > 0 && tb > 2 * ta && tb < 5 * ta,
        "task-context calls charging A {ta}, B {tb} (B ran three times A's hackbench)\n{stdout}"
    );
    let irq = calls(a, None) + calls(b, None) - ta - tb;
    assert!(
        irq > 0,
        "no interrupt-context call charging A or B (RCU frees of their objects)\n{stdout}"
    );
    let w = doc.meta.workload.as_ref().expect("workload recorded");
    assert!(w.by_memcg, "{w:?}");
    let own = stat.workload.as_ref().expect("workload figures").count;
    assert_eq!(
        own,
        calls(a, None),
        "the workload's calls are those charging A, in every context\n{stdout}"
    );
    assert!(
        stdout.contains("stat task memcgs") && stdout.contains(&rel(b)),
        "{stdout}"
    );
    format!(
        "{} hierarchy: task A {ta}, B {tb}; interrupt contexts {irq}; workload {own}",
        if h.v2 { "v2" } else { "v1" }
    )
}

/// Without the flag: a v1 memcg's tasks have no v2 id, so the workload is still told by the
/// memcg charged. Returns the workload's calls.
fn v1_cgroup_without_the_flag(name: &str, hb: &str, a: &TestMemcg) -> u64 {
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
        hb,
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
    own
}
