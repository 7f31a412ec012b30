//! Helpers shared by the host, CLI, dashboard and VM tests: finding the binary, visible skips,
//! and the checks every recording must pass.

pub mod callgraph;
use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use memcg_trace::export::{ContextOut, Document, Latency, ProbeOut};
use serde_json::Value;

/// The memcg-trace binary under test: `$MEMCG_TRACE_BIN`, else the workspace's release build.
pub fn bin() -> PathBuf {
    let path = std::env::var_os("MEMCG_TRACE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(xtask::release_bin);
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo xtask build` (cargo xtask test does)",
        path.display()
    );
    path
}

/// The release binary for guests of `arch`: [`bin`] on x86_64; on arm64 the cross-compiled
/// one (`MEMCG_TRACE_BIN_ARM64`, else where `cargo xtask build --arch arm64` leaves it).
pub fn bin_for(arch: xtask::kernels::Arch) -> PathBuf {
    if arch == xtask::kernels::Arch::X86_64 {
        return bin();
    }

    let path = std::env::var_os("MEMCG_TRACE_BIN_ARM64")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| xtask::release_bin_for(arch));
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo xtask build --arch arm64` (cargo xtask test does)",
        path.display()
    );
    path
}

/// Prints a skip where the test runner cannot swallow it, and records it for `cargo xtask
/// test` (which counts it as skipped, not passed): the caller returns right after.
pub fn skip(name: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "skipping {name}: {reason}");
    record_skip("test", name, reason);
}

/// A skipped part of a test that goes on with the rest: printed and recorded apart from whole
/// tests.
pub fn skip_case(name: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "skipping {name}: {reason}");
    record_skip("case", name, reason);
}

/// A test's one-line account of what it ran (runs, inputs, figures): printed, and shown by
/// `cargo xtask test` at the end even though cargo hides a passing test's output.
/// `cmd` with the stop signals at their default action in the child, as a terminal's shell
/// starts a program: a test run under `nohup` (SIGHUP ignored), or started with `&` by a
/// shell without job control (SIGINT ignored), would pass those on, and memcg-trace keeps a
/// stop signal it was started with ignored ignored.
pub fn stop_signals_default(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;

    // SAFETY: signal(2) is async-signal-safe, and the closure touches nothing else between
    // fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        })
    }
}

pub fn summary(name: &str, line: &str) {
    println!("{name}: {line}");
    record_skip("summary", name, line);
}

/// Appends `kind\tname\treason` to `$MEMCG_TRACE_SKIP_FILE` (set by `cargo xtask test`).
fn record_skip(kind: &str, name: &str, reason: &str) {
    let Some(path) = std::env::var_os("MEMCG_TRACE_SKIP_FILE") else {
        return;
    };

    // One short write with O_APPEND: lines from parallel tests do not interleave.
    let line = format!("{kind}\t{name}\t{}\n", reason.replace(['\t', '\n'], " "));
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Whether we run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A fresh scratch directory under target/.
pub fn scratch(name: &str) -> PathBuf {
    let d = xtask::workspace_root()
        .join("target/test-scratch")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// Runs the binary with `args`.
pub fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("run memcg-trace")
}

/// Validates a recording against the committed JSON Schema of its version (memcg-trace/2, or
/// /1 for recordings made before it) and parses it back into the types.
pub fn load_recording(path: &Path) -> Document {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let value: Value = serde_json::from_str(&text).expect("recording is JSON");
    let schema = match value.get("schema").and_then(|s| s.as_str()) {
        Some("memcg-trace/1") => include_str!("../../memcg-trace/schema/memcg-trace-1.schema.json"),
        _ => include_str!("../../memcg-trace/schema/memcg-trace-2.schema.json"),
    };
    let schema: Value = serde_json::from_str(schema).expect("schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "{} violates the schema:\n{}",
        path.display(),
        errors.join("\n")
    );
    memcg_trace::export::parse(&text).expect("recording parses into memcg_trace::export::Document")
}

/// The invariants every recording holds, whatever the backend:
/// - every entry and exit program run is accounted for: entries = paired + ambiguous +
///   deferred + deferred_lost + stale + evicted + pending at the end, exits = paired +
///   ambiguous + deferred + deferred_lost + orphans + evicted_exits + outside, deferred =
///   confirmed + rejected; with bpf
///   stats on, the kernel's own run counts of the programs match ours;
/// - the calls counted are the paired and confirmed ones, and every one is in a bucket;
/// - percentiles are ordered, within [min, max], end at max; floor-corrected ones are lower;
/// - the summary table's footnote carries the same numbers as the JSON.
pub fn check_invariants(doc: &Document, summary: &str) {
    check_shares_bounds(doc, summary);
    for p in &doc.probes {
        check_accounting(doc, p);
        check_run_counts(doc, p);
        check_memcg_rows(p);
        check_lost(p);
        check_off_cpu(doc, p);
        for c in &p.contexts {
            if let Some(l) = &c.latency {
                check_latency(p, c, l);
            }
        }

        let line = memcg_trace::table::probe_footnote(p);
        assert!(
            summary.contains(&line),
            "summary lacks {line:?}:\n{summary}"
        );
    }

    check_self_times(doc);
}

/// A figure of probe `p` added over its contexts.
fn sum(p: &ProbeOut, f: impl Fn(&ContextOut) -> u64) -> u64 {
    p.contexts.iter().map(f).sum()
}

/// Every entry and exit program run of probe `p` accounted for (a timed backend), or the
/// kernel's stats carried (the counts-only one).
fn check_accounting(doc: &Document, p: &ProbeOut) {
    let (entries, exits) = (sum(p, |c| c.entries), sum(p, |c| c.exits));

    // memcg-trace/1 did not account for every entry (no stale or evicted counts).
    let v1 = doc.upgraded_from.is_some();
    if p.backend.to_string() != "tracepoint" {
        let ended = sum(p, |c| {
            c.paired + c.ambiguous + c.deferred + c.deferred_lost + c.stale + c.evicted
        }) + p.pending_at_end;
        assert!(
            v1 || entries == ended,
            "{}: {entries} entry runs, but paired + ambiguous + deferred + deferred_lost + stale + evicted + pending = {ended}",
            p.name
        );
        let matched = sum(p, |c| {
            c.paired
                + c.ambiguous
                + c.deferred
                + c.deferred_lost
                + c.orphans
                + c.evicted_exits
                + c.outside
        });
        assert_eq!(
            exits, matched,
            "{}: {exits} exit runs, but paired + ambiguous + deferred + deferred_lost + orphans + evicted exits + outside = {matched}",
            p.name
        );

        // An evicted call's exit is found among the evicted at most once.
        assert!(
            sum(p, |c| c.evicted_exits) <= sum(p, |c| c.evicted),
            "{}: more exits of evicted calls ({}) than calls evicted ({})",
            p.name,
            sum(p, |c| c.evicted_exits),
            sum(p, |c| c.evicted)
        );
        for c in &p.contexts {
            assert_eq!(
                c.deferred,
                c.confirmed + c.rejected,
                "{} {}: every deferred pair decided",
                p.name,
                c.context
            );
            assert_eq!(
                c.count,
                c.paired + c.confirmed,
                "{} {}: calls counted are the paired and confirmed ones",
                p.name,
                c.context
            );
        }
    } else {
        // The hits are the kernel's count of program runs (below), not a figure derived
        // from them: a recording of the counts-only backend must carry the kernel's stats.
        assert!(
            doc.meta.bpf_stats,
            "{}: a tracepoint recording without --bpf-stats cannot be cross-checked",
            p.name
        );
    }
}

/// With bpf stats on, the kernel's own run counts of probe `p`'s programs are ours.
fn check_run_counts(doc: &Document, p: &ProbeOut) {
    let timed = p.backend.to_string() != "tracepoint";
    let (entries, exits) = (sum(p, |c| c.entries), sum(p, |c| c.exits));
    if doc.meta.bpf_stats {
        let entry = p.programs.first().expect("programs listed");
        assert_eq!(
            entry.run_cnt,
            entries + sum(p, |c| c.no_context_entries),
            "{}: the kernel ran {} {} times, the programs counted {entries} entries",
            p.name,
            entry.name,
            entry.run_cnt
        );
        if timed {
            let exit = p.programs.last().expect("programs listed");
            assert_eq!(
                exit.run_cnt,
                exits + sum(p, |c| c.no_context_exits),
                "{}: the kernel ran {} {} times, the programs counted {exits} exits",
                p.name,
                exit.name,
                exit.run_cnt
            );
        }
    }
}

/// By memcg (`--by-memcg`): every call counted is under one memcg or "other", with its time.
fn check_memcg_rows(p: &ProbeOut) {
    if !p.memcgs.is_empty() || p.contexts.iter().any(|c| c.memcgs_other > 0) {
        for c in &p.contexts {
            let rows = p.memcgs.iter().filter(|m| m.context == c.context);
            let calls: u64 = rows.clone().map(|m| m.calls).sum();
            assert_eq!(
                calls + c.memcgs_other,
                c.count,
                "{} {}: memcgs {calls} + other {} vs {} calls",
                p.name,
                c.context,
                c.memcgs_other,
                c.count
            );

            // The "other" row has no time: equal without one, at most with one.
            let ns: u64 = rows.map(|m| m.sum_ns).sum();
            let timed_ns = c.latency.as_ref().map_or(0, |l| l.sum_ns);
            assert!(
                ns == timed_ns || (c.memcgs_other > 0 && ns < timed_ns),
                "{} {}: memcgs' time {ns} vs {timed_ns} (other {})",
                p.name,
                c.context,
                c.memcgs_other
            );
        }
    }
}

/// Each context's calls lost are the sum of their kinds; the probe's lost and counted calls
/// are its contexts'.
fn check_lost(p: &ProbeOut) {
    for c in &p.contexts {
        assert_eq!(
            c.lost,
            c.orphans
                + c.stale
                + c.evicted
                + c.ambiguous
                + c.deferred_lost
                + c.rejected
                + c.no_context_entries
                + c.no_context_exits,
            "{} {}: lost",
            p.name,
            c.context
        );
    }

    assert_eq!(p.lost, sum(p, |c| c.lost), "{}: lost", p.name);
    assert_eq!(p.count, sum(p, |c| c.count), "{}: count", p.name);
}

/// Time off the CPU: only task calls that left it have any; each proven on its CPU or
/// deferred once.
fn check_off_cpu(doc: &Document, p: &ProbeOut) {
    for c in &p.contexts {
        // Time off the CPU: only task calls that left it have any, and only they can have
        // it unknown.
        assert!(
            c.off_cpu_unknown <= c.switched && c.migrated <= c.switched,
            "{} {}: off-CPU unknown {} / migrated {} / switched {}",
            p.name,
            c.context,
            c.off_cpu_unknown,
            c.migrated,
            c.switched
        );

        // Proven by the programs: switched calls that never moved, timed in the kernel
        // (paired), never deferred too. In the task row of a kernel that defers the
        // switched calls, each is proven or deferred (sent or lost in the ring): once.
        if c.context == "task" && c.proven_on_cpu + c.deferred + c.deferred_lost > 0 {
            assert_eq!(
                c.proven_on_cpu + c.deferred + c.deferred_lost,
                c.switched,
                "{} task: proven on their CPU {} + deferred {} + lost in the ring {} is not the calls that left the CPU",
                p.name,
                c.proven_on_cpu,
                c.deferred,
                c.deferred_lost
            );
        }

        assert!(
            c.proven_on_cpu + c.migrated <= c.switched && c.proven_on_cpu <= c.paired,
            "{} {}: proven on their CPU {} / migrated {} / switched {} / paired {}",
            p.name,
            c.context,
            c.proven_on_cpu,
            c.migrated,
            c.switched,
            c.paired
        );
        if c.switched == 0 {
            assert_eq!(
                (c.off_cpu_ns, c.off_cpu_max_ns),
                (0, 0),
                "{} {}: time off the CPU without a call that left it",
                p.name,
                c.context
            );
        }

        // A recording that says how it told time off the CPU has the on-CPU time of every
        // timed row where none of it is unknown.
        if c.latency.is_some() && doc.meta.off_cpu.is_some() {
            assert_eq!(
                c.on_cpu_ns.is_some(),
                c.off_cpu_unknown == 0,
                "{} {}: on-CPU time {:?} with {} unknown",
                p.name,
                c.context,
                c.on_cpu_ns,
                c.off_cpu_unknown
            );
        }
    }
}

/// A context's latency: every call in a bucket, percentiles ordered and each in the bucket of
/// its rank, min and max in the first and last buckets, the floor-corrected ones lower.
fn check_latency(probe: &ProbeOut, ctx: &ContextOut, latency: &Latency) {
    let in_buckets: u64 = latency.buckets.iter().map(|b| b.count).sum();
    assert_eq!(
        in_buckets, ctx.count,
        "{} {}: bucket total",
        probe.name, ctx.context
    );
    let qs: Vec<u64> = latency.percentiles.iter().map(|q| q.ns).collect();
    assert!(
        qs.windows(2).all(|w| w[0] <= w[1]),
        "{} {}: percentiles not ordered {qs:?}",
        probe.name,
        ctx.context
    );
    if ctx.count > 0 {
        // The kernel's min and max against its buckets: each lies in the first or
        // last non-empty bucket.
        let (first, last) = (
            &latency.buckets[0],
            &latency.buckets[latency.buckets.len() - 1],
        );
        assert!(
            (first.min_ns..first.max_ns).contains(&latency.min_ns)
                && (last.min_ns..last.max_ns).contains(&latency.max_ns),
            "{} {}: min {} / max {} outside their buckets {first:?} / {last:?}",
            probe.name,
            ctx.context,
            latency.min_ns,
            latency.max_ns
        );

        // Each percentile recomputed from the buckets: it lies in the bucket that
        // holds its rank (narrowed to [min, max]).
        let bucket_of = |rank: u64| {
            let mut seen = 0;
            latency
                .buckets
                .iter()
                .find(|b| {
                    seen += b.count;
                    seen >= rank
                })
                .expect("rank within the count")
        };
        for q in &latency.percentiles {
            // The rank, rounded up or to the nearest (HDR's convention).
            let n = ctx.count as f64;
            let ranks =
                [(q.q * n).ceil() as u64, (q.q * n + 0.5) as u64].map(|r| r.clamp(1, ctx.count));
            let ok = ranks.iter().any(|&r| {
                let b = bucket_of(r);
                (b.min_ns.max(latency.min_ns)..b.max_ns.min(latency.max_ns + 1)).contains(&q.ns)
            });
            assert!(
                ok,
                "{} {}: p{} = {} ns is not in the bucket of rank {ranks:?} of {}: {:?}",
                probe.name,
                ctx.context,
                q.q * 100.0,
                q.ns,
                ctx.count,
                ranks.map(bucket_of)
            );
        }
    }

    for (raw, net) in latency
        .percentiles
        .iter()
        .zip(&latency.percentiles_floor_corrected)
    {
        assert!(net.ns <= raw.ns && net.q == raw.q);
    }
}

/// Self times (issue "Where the workload's CPU goes"): no context's self time exceeds its
/// total, nor the workload's; over every probe and context the self times add up to the time
/// of the outermost traced calls (traced time counted once) when nothing was lost, left
/// pending or of unknown nesting, and never to less once the rejected pairs the kernel had
/// counted inside an enclosing call (`unproven_nested_ns`: taken out of that call's self
/// time, nobody's self time) are added back.
pub fn check_self_times(doc: &Document) {
    let (mut self_ns, mut outer, mut clean, mut any) = (0u64, 0u64, true, false);
    let mut unproven = 0u64;
    for p in doc
        .probes
        .iter()
        .filter(|p| p.backend.to_string() != "tracepoint")
    {
        clean &= p.lost == 0 && p.pending_at_end == 0;
        for c in &p.contexts {
            let Some(l) = c.latency.as_ref() else {
                continue;
            };
            let Some(s) = l.self_ns else {
                return; // a recording from before self time
            };
            any = true;
            assert!(
                s <= l.sum_ns,
                "{} {}: self {s} ns above the total {} ns",
                p.name,
                c.context,
                l.sum_ns
            );
            self_ns += s;
            outer += c.outermost_ns;
            unproven += c.unproven_nested_ns;
            clean &= c.self_unknown == 0;
        }

        if let Some(l) = p.workload.as_ref().and_then(|w| w.latency.as_ref()) {
            assert!(
                l.self_ns.is_some_and(|s| s <= l.sum_ns),
                "{}: workload self {:?} ns, total {} ns",
                p.name,
                l.self_ns,
                l.sum_ns
            );
        }
    }

    if !any {
        return;
    }

    assert!(
        self_ns + unproven >= outer,
        "self times add up to {self_ns} ns (and {unproven} ns of rejected nested pairs), less \
         than the outermost calls' {outer} ns"
    );
    if clean {
        assert_eq!(
            self_ns, outer,
            "with nothing lost, the self times add up to the outermost calls' time"
        );
    }
}

/// The workload's CPU shares are marked as upper bounds (`<=` in the table,
/// `shares_at_most` in the JSON) exactly where the raw counters say they must be: a timed
/// probe with shares whose task-context calls include some with time off the CPU unknown or
/// only a lower bound (counted as CPU) or with their nesting unknown (their whole time counted
/// as their own), or, when the workload is told by the memcg charged,
/// that has interrupt-context calls (some may be in the workload's rows, whose CPU time is
/// not its cgroup's: the rule the export states, checked here from the counters, and its
/// mark in the table, which must then be there).
fn check_shares_bounds(doc: &Document, summary: &str) {
    let Some(w) = doc.meta.workload.as_ref() else {
        return;
    };
    let mut with_shares = 0;
    let mut bounded = false;
    for p in &doc.probes {
        let Some(pw) = p.workload.as_ref() else {
            continue;
        };
        if pw.self_share_of_workload_cpu.is_none() {
            continue;
        }
        with_shares += 1;
        let task = p.contexts.first();
        let off_unknown = task.is_some_and(|c| c.off_cpu_unknown > 0 || c.off_cpu_at_least > 0);
        let self_unknown = task.is_some_and(|c| c.self_unknown > 0);
        let irq_rows = w.by_memcg && p.contexts.iter().skip(1).any(|c| c.count > 0);
        let want = off_unknown || self_unknown || irq_rows;
        assert_eq!(
            pw.shares_at_most, want,
            "{}: shares_at_most {} where the counters say {want} (off-CPU unknown {off_unknown}, nesting unknown {self_unknown}, interrupt calls in memcg rows {irq_rows})",
            p.name, pw.shares_at_most
        );
        bounded |= want;
    }

    if with_shares == 0 {
        return;
    }

    // Where the summary holds the table (not a quiet run's output), it has the line.
    if !summary
        .lines()
        .any(|l| l.starts_with("probe ") && l.contains(" context "))
    {
        return;
    }

    let line = summary
        .lines()
        .find(|l| l.starts_with("workload CPU: "))
        .unwrap_or_else(|| {
            panic!("no workload CPU line where {with_shares} probes have shares:\n{summary}")
        });
    assert_eq!(
        line.contains("<="),
        bounded,
        "the table's share line marks upper bounds {}, the counters say {bounded}: {line}",
        line.contains("<=")
    );
}

/// Runs one of the tests' HdrHistogram_py scripts (in the venv `cargo xtask setup` makes) and
/// returns its stdout; panics with its output when it fails.
fn python_check(script: &str, args: &[&Path], what: &str) -> String {
    let py = xtask::setup::pyenv().join("bin/python3");
    assert!(
        py.exists(),
        "{} is missing: run `cargo xtask setup` (cargo xtask test does)",
        py.display()
    );
    let out = std::process::Command::new(&py)
        .arg(xtask::workspace_root().join("tests").join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} disagrees with {}:\n{text}{}",
        args.iter()
            .map(|a| a.display().to_string())
            .collect::<Vec<_>>()
            .join(" / "),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// Every histogram of the recording at `path`, decoded by an independent reader
/// (HdrHistogram_py: `tests/hdr_check.py`): total count, min, max, p50 and p99 agree with the
/// recording's own figures within the resolution the histogram's header states.
pub fn check_hdr_independently(path: &Path) {
    let text = python_check("hdr_check.py", &[path], "HdrHistogram_py");
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.contains("histograms decoded, 0 failures") && !last.contains(" 0 histograms"),
        "{last}"
    );
}

/// The HdrHistogram interval log at `log`, read by an independent reader (HdrHistogram_py's
/// `HistogramLogReader`: `tests/hdr_log_check.py`): per tag, the intervals add up exactly to
/// the recording's count of that row, their max is in the bucket of the recording's, they
/// follow each other in time, and no interval has more workload calls than task calls.
pub fn check_hdr_log_independently(log: &Path, recording: &Path) {
    python_check(
        "hdr_log_check.py",
        &[log, recording],
        "HdrHistogram_py's log reader",
    );
}

/// The probe named `name`, which must be attached.
pub fn probe<'a>(doc: &'a Document, name: &str) -> &'a memcg_trace::export::ProbeOut {
    doc.probes
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| {
            panic!(
                "probe {name} not attached; not attached: {:?}",
                doc.not_attached
            )
        })
}

/// Calls of a probe in one context.
pub fn ctx_count(p: &memcg_trace::export::ProbeOut, ctx: &str) -> u64 {
    p.contexts
        .iter()
        .find(|c| c.context == ctx)
        .map(|c| c.count)
        .unwrap_or(0)
}

/// memcgs named memcg-trace.* left in any hierarchy.
pub fn leftover_memcgs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for root in [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/unified",
    ] {
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with("memcg-trace.") {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

/// `memcg-trace selftest` output: the kernel's bucketing agrees with userspace for every value,
/// every pairing sequence came out right, and tracepoints of known context were classified
/// right, on the calibration's sources and on independent ones.
pub fn check_selftest(stdout: &str) {
    assert!(stdout.contains(" 0 mismatches"), "{stdout}");
    assert!(
        stdout
            .lines()
            .filter(|l| l.starts_with("selftest: ns=") && l.ends_with(" ok"))
            .count()
            >= 17,
        "{stdout}"
    );
    let pairing: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("selftest: pairing: "))
        .collect();
    assert!(pairing.len() >= 20, "pairing cases missing:\n{stdout}");
    for l in &pairing {
        assert!(l.ends_with(": ok") || l.contains("skipped"), "{l}");
    }

    for ctx in ["(task,", "(softirq, calibration", "(hardirq, calibration"] {
        let line = stdout
            .lines()
            .find(|l| l.contains(ctx))
            .unwrap_or_else(|| panic!("no {ctx} check:\n{stdout}"));
        assert!(line.ends_with(" ok"), "{line}");
    }

    for ctx in ["softirq", "hardirq"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("selftest: {ctx} classified right on sources")))
            .unwrap_or_else(|| panic!("no independent {ctx} check:\n{stdout}"));
        assert!(line.ends_with(" ok"), "{line}");
    }

    assert!(stdout.contains("selftest: 0 failures"), "{stdout}");
}

/// hackbench, or a visible skip of `name` when it is missing.
pub fn hackbench_or_skip(name: &str) -> Option<String> {
    match memcg_trace::workload::hackbench() {
        Ok(p) => Some(p.display().to_string()),
        Err(e) => {
            skip(name, &format!("{e:#}"));
            None
        }
    }
}

/// Runs of each combination of the signal matrix: 1 in the default run, 20 in
/// `cargo xtask test --long` (`MEMCG_TRACE_MATRIX_RUNS`).
pub fn matrix_runs() -> usize {
    std::env::var("MEMCG_TRACE_MATRIX_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// memcg-trace's programs still loaded in the kernel (any run's), from `memcg-trace programs`,
/// which lists every BPF program the kernel holds (its own iterator aside). The kernel frees
/// a program a moment after its last holder closed it (an RCU grace period): a program still
/// listed after `timeout` was left behind.
pub fn our_programs_loaded(timeout: std::time::Duration) -> Vec<String> {
    let start = std::time::Instant::now();
    loop {
        let left = our_programs_now();
        if left.is_empty() || start.elapsed() > timeout {
            return left;
        }

        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn our_programs_now() -> Vec<String> {
    use memcg_trace_common::names;
    let out = run(&["programs"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The kernel keeps the first 15 bytes of a program's name.
    let ours: Vec<&str> = names::all_programs()
        .filter(|n| *n != names::PROG_ITER)
        .map(|n| &n[..n.len().min(15)])
        .collect();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|n| ours.contains(n))
        .map(str::to_string)
        .collect()
}

/// The pid of a process whose command line is exactly `args`.
pub fn pid_of(args: &[&str]) -> Option<i32> {
    let want: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().to_str()?.parse().ok()?;
        (std::fs::read(e.path().join("cmdline")).ok()? == want).then_some(pid)
    })
}

/// Asserts that a run which ended left nothing behind: no workload `sleep <marker>` (given 5 s
/// to go), no memcg of ours, no program of ours in the kernel.
pub fn assert_left_nothing(what: &str, marker: &str) {
    let start = std::time::Instant::now();
    while pid_of(&["sleep", marker]).is_some() && start.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    assert!(
        pid_of(&["sleep", marker]).is_none(),
        "{what}: the workload outlived memcg-trace"
    );
    assert!(
        leftover_memcgs().is_empty(),
        "{what}: memcgs left: {:?}",
        leftover_memcgs()
    );
    let progs = our_programs_loaded(std::time::Duration::from_secs(5));
    assert!(progs.is_empty(), "{what}: programs left loaded: {progs:?}");
}
