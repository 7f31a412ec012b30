//! Helpers shared by the host, CLI, dashboard and VM tests: finding the binary, visible skips,
//! and the checks every recording must pass.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use memcg_trace::export::Document;
use serde_json::Value;

/// The memcg-trace binary under test: `$MEMCG_TRACE_BIN`, else the workspace's release build.
pub fn bin() -> PathBuf {
    let p = std::env::var_os("MEMCG_TRACE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| xtask::workspace_root().join("target/release/memcg-trace"));
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo xtask build` (cargo xtask test does)",
        p.display()
    );
    p
}

/// Prints a skip where the test runner cannot swallow it.
pub fn skip(name: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "skipping {name}: {reason}");
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

/// Validates a recording against the committed JSON Schema and parses it back into the types.
pub fn load_recording(path: &Path) -> Document {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let value: Value = serde_json::from_str(&text).expect("recording is JSON");
    let schema: Value = serde_json::from_str(include_str!(
        "../../memcg-trace/schema/memcg-trace-1.schema.json"
    ))
    .expect("schema is JSON");
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
    serde_json::from_value(value).expect("recording parses into memcg_trace::export::Document")
}

/// The invariants every recording holds, whatever the backend:
/// - the exit program ran once per exit counted in the maps, and every exit is either a
///   counted call or a dropped one (nothing lost, nothing counted twice);
/// - percentiles are ordered and within [min, max];
/// - the summary table's footnote carries the same numbers as the JSON.
pub fn check_invariants(doc: &Document, summary: &str) {
    for p in &doc.probes {
        let exits: u64 = p.contexts.iter().map(|c| c.exits).sum();
        let counted: u64 = p
            .contexts
            .iter()
            .map(|c| c.count + c.unmatched + c.switched + c.no_context)
            .sum();
        assert_eq!(
            exits, counted,
            "{}: exits {exits} != calls + dropped {counted}",
            p.name
        );
        let dropped: u64 = p
            .contexts
            .iter()
            .map(|c| c.unmatched + c.switched + c.no_context)
            .sum();
        assert_eq!(p.dropped, dropped, "{}: dropped", p.name);
        assert_eq!(
            p.count,
            p.contexts.iter().map(|c| c.count).sum::<u64>(),
            "{}: count",
            p.name
        );
        let exit_prog = p.programs.last().expect("programs listed");
        if doc.meta.bpf_stats {
            assert_eq!(
                exit_prog.run_cnt, exits,
                "{}: exit program {} ran {} times, the maps count {exits} exits",
                p.name, exit_prog.name, exit_prog.run_cnt
            );
        }
        for c in &p.contexts {
            if let Some(l) = &c.latency {
                let timed: u64 = l.buckets.iter().map(|b| b.count).sum();
                assert_eq!(timed, c.count, "{} {}: bucket total", p.name, c.context);
                let qs: Vec<u64> = l.percentiles.iter().map(|q| q.ns).collect();
                assert!(
                    qs.windows(2).all(|w| w[0] <= w[1]),
                    "{} {}: percentiles not ordered {qs:?}",
                    p.name,
                    c.context
                );
                if c.count > 0 {
                    assert!(l.min_ns <= l.max_ns);
                    assert_eq!(*qs.last().expect("percentiles"), l.max_ns);
                }
            }
        }
        let line = format!(
            "{} via {}: {} calls, {} dropped, {} recursion misses",
            p.target, p.backend, p.count, p.dropped, p.recursion_misses
        );
        assert!(
            summary.contains(&line),
            "summary lacks {line:?}:\n{summary}"
        );
    }
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
/// and tracepoints of known context (task, softirq, hardirq) were each hit and all classified
/// as that context.
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
    for ctx in ["(task)", "(softirq)", "(hardirq)"] {
        let line = stdout
            .lines()
            .find(|l| l.contains(ctx))
            .unwrap_or_else(|| panic!("no {ctx} check:\n{stdout}"));
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
