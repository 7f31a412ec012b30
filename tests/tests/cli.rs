//! Black-box tests of the commands that work on recordings, on a committed VM recording: they
//! need neither root nor a kernel feature.

use memcg_trace_tests::*;
use std::path::Path;

fn fixture() -> std::path::PathBuf {
    xtask::workspace_root().join("tests/fixtures/6.12-fentry.json")
}

#[test]
fn report_prints_the_recordings_figures() {
    let f = fixture();
    let doc = load_recording(&f);
    let out = run(&["report", f.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);

    // The same footnotes and invariants as at record time.
    check_invariants(&doc, &text);
    assert!(text.contains(&doc.meta.kernel_release));
    assert!(
        text.lines()
            .any(|l| l.starts_with("charge") && l.contains(" workload ")),
        "{text}"
    );
}

#[test]
fn diff_of_a_recording_with_itself_changes_nothing() {
    let f = fixture();
    let out = run(&["diff", f.to_str().unwrap(), f.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("charge") || l.starts_with("stat") || l.starts_with("rstat"))
        .collect();
    assert!(rows.len() >= 3, "{text}");
    for r in rows {
        let changes: Vec<&str> = r.split_whitespace().filter(|w| w.ends_with('%')).collect();
        assert_eq!(changes.len(), 3, "{r}");
        assert!(changes.iter().all(|c| *c == "+0.0%"), "{r}");
    }
}

#[test]
fn diff_shows_a_change() {
    let fixture_path = fixture();
    let dir = scratch("diff_shows_a_change");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fixture_path).unwrap()).unwrap();
    // Twice the calls in the same time: +100.0% calls/s for charge in task context.
    let ctx = &mut doc["probes"][0]["contexts"][0];
    let r = ctx["rate_per_s"].as_f64().unwrap();
    ctx["rate_per_s"] = serde_json::json!(r * 2.0);
    let b = dir.join("b.json");
    std::fs::write(&b, serde_json::to_string(&doc).unwrap()).unwrap();
    let out = run(&["diff", fixture_path.to_str().unwrap(), b.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("charge") && l.contains(" task "))
        .expect("charge task row");
    assert!(row.contains("+100.0%"), "{row}");
}

/// Several runs a side: a change of 15% with 1% run-to-run noise is called beyond the noise,
/// figures that did not move are within it, and the statistics are the ones stated (means,
/// relative standard deviations, Welch's p) in the JSON, the table and the markdown.
#[test]
fn diff_of_runs_tells_a_change_from_the_noise() {
    let f = fixture();
    let dir = scratch("diff_of_runs_tells_a_change_from_the_noise");
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    let r0 = base["probes"][0]["contexts"][0]["rate_per_s"]
        .as_f64()
        .unwrap();
    let write = |name: &str, factor: f64| {
        let mut v = base.clone();
        v["probes"][0]["contexts"][0]["rate_per_s"] = serde_json::json!(r0 * factor);
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
        p.to_str().unwrap().to_string()
    };
    let a_files = [
        write("a1.json", 0.99),
        write("a2.json", 1.0),
        write("a3.json", 1.01),
    ];
    let b_files = [
        write("b1.json", 1.14),
        write("b2.json", 1.15),
        write("b3.json", 1.16),
    ];
    let args = |format: &str| -> Vec<String> {
        let mut v = vec!["diff".to_string(), "--format".into(), format.into()];
        v.extend(a_files.iter().cloned());
        v.push("--".into());
        v.extend(b_files.iter().cloned());
        v
    };
    let run_with = |format: &str| {
        let argv = args(format);
        let out = run(&argv.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&run_with("json")).unwrap();
    check_diff_json(&json, &base);

    // The table and the markdown say the same.
    let table = run_with("table");
    let row = table
        .lines()
        .find(|l| l.starts_with("charge") && l.contains(" task ") && l.contains("calls/s"))
        .expect("charge task calls/s row");
    assert!(
        row.contains("+15.0%") && row.contains("beyond noise") && row.contains("±1.0%"),
        "{row}"
    );
    let md = run_with("markdown");
    assert!(
        md.lines()
            .any(|l| l.starts_with("| charge | task | calls/s |") && l.contains("| beyond noise |")),
        "{md}"
    );

    // A side without its other half is one clear line.
    let out = run(&["diff", &a_files[0]]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("diff compares two sides"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// `diff`'s JSON of the runs of `diff_of_runs_tells_a_change_from_the_noise` (`base`: the
/// recording they were made from): the verdicts, statistics and per-operation figures.
fn check_diff_json(json: &serde_json::Value, base: &serde_json::Value) {
    let figs = json["figures"].as_array().unwrap();
    let find = |probe: &str, ctx: &str, fig: &str| {
        figs.iter()
            .find(|x| x["probe"] == probe && x["context"] == ctx && x["figure"] == fig)
            .unwrap_or_else(|| panic!("{probe} {ctx} {fig} missing"))
    };
    let moved = find("charge", "task", "calls/s");
    assert_eq!(moved["beyond_noise"], true, "{moved}");
    let change = moved["change"].as_f64().unwrap();
    assert!((change - 0.15).abs() < 1e-9, "{change}");

    // rsd of 0.99, 1.0, 1.01 (sample sd 0.01).
    let rsd = moved["a"]["rsd"].as_f64().unwrap();
    assert!((rsd - 0.01).abs() < 1e-9, "{rsd}");
    let welch_p = moved["welch"]["p"].as_f64().unwrap();
    assert!(welch_p < 1e-3, "{welch_p}");

    // Identical on both sides: no change, p = 1.
    let same = find("charge", "task", "p50");
    assert_eq!(same["beyond_noise"], false, "{same}");
    assert_eq!(same["welch"]["p"].as_f64(), Some(1.0));
    assert_eq!(find("stat", "task", "calls/s")["beyond_noise"], false);

    // Calls per hackbench message, of the workload's own calls: the recording's workload is
    // hackbench -g 2 -l 100, 2 x 20 x 20 x 100 = 80,000 messages. The system's rows have
    // none (their calls are not the workload's operations').
    let count = base["probes"][0]["workload"]["count"].as_f64().unwrap();
    let per_op = find("charge", "workload", "calls/op")["a"]["mean"]
        .as_f64()
        .unwrap();
    assert!((per_op - count / 80_000.0).abs() < 1e-9, "{per_op}");

    // Time per message: every call of the workload at its mean (each side's runs are equal
    // here, so the mean of the products is the product of the means).
    let mean = base["probes"][0]["workload"]["latency"]["mean_ns"]
        .as_f64()
        .unwrap();
    let time_op = find("charge", "workload", "time/op")["a"]["mean"]
        .as_f64()
        .unwrap();
    assert!(
        (time_op - per_op * mean).abs() < 1e-6 * time_op,
        "{time_op} ns a message, {per_op} calls at {mean} ns"
    );
    assert!(
        json["figures"]
            .as_array()
            .unwrap()
            .iter()
            .all(
                |f| !matches!(f["figure"].as_str(), Some("calls/op" | "time/op"))
                    || f["context"] == "workload"
            ),
        "calls/op or time/op of a system-wide row: {json}"
    );
    assert_eq!(json["a_files"].as_array().unwrap().len(), 3);
}

/// The text of every `<text>` element of an SVG, which must be well-formed XML.
fn svg_texts(path: &std::path::Path) -> (Vec<String>, usize) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not well-formed XML: {e}", path.display()));
    let texts = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or_default().trim().to_string())
        .collect();
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .count();
    (texts, lines)
}

/// `plot` of two recordings: one image per row, valid SVG, each holding both recordings'
/// series, named in the legend by file, kernel, function and backend, with readable axes.
#[test]
fn plot_overlays_recordings_with_their_labels() {
    let fixture_path = fixture();
    let dir = scratch("plot_overlays_recordings_with_their_labels");

    // B: the same recording under another name, its charge calls twice as slow.
    let slower = twice_as_slow(&fixture_path);
    let slower_path = dir.join("slower.json");
    std::fs::write(&slower_path, serde_json::to_string(&slower).unwrap()).unwrap();
    let out_dir = dir.join("plots");
    let out = run(&[
        "plot",
        fixture_path.to_str().unwrap(),
        slower_path.to_str().unwrap(),
        "-o",
        out_dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    for row in [
        "charge-task",
        "stat-task",
        "rstat-task",
        "rstat-hardirq",
        "charge-workload",
    ] {
        assert!(
            listed.contains(&format!("{row}.svg")),
            "{row} missing: {listed}"
        );
    }

    let (texts, lines) = svg_texts(&out_dir.join("charge-task.svg"));
    let has = |s: &str| texts.iter().any(|t| t.contains(s));
    for want in [
        "6.12-fentry: 6.12.117+deb12-amd64 obj_cgroup_charge via fentry (task)",
        "slower: 6.12.117+deb12-amd64 obj_cgroup_charge via fentry (task)",
        "percentile spectrum",
        "histogram",
        "percentile",
        "latency",
        "99%",
        "99.9%",
    ] {
        assert!(has(want), "charge-task.svg lacks {want:?}: {texts:?}");
    }

    // Two recordings, two panels: at least four lines.
    assert!(lines >= 4, "{lines} lines");

    // Axis labels carry units.
    assert!(
        texts.iter().any(|t| t.ends_with("us") || t.ends_with("ns")),
        "{texts:?}"
    );
    check_plot_refuses_bad_input(&slower, &dir, &out_dir);
}

/// The recording `f` with its first probe's task calls twice as slow (their buckets' bounds,
/// minimum and maximum doubled).
fn twice_as_slow(f: &Path) -> serde_json::Value {
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
    let l = &mut doc["probes"][0]["contexts"][0]["latency"];
    for k in ["min_ns", "max_ns"] {
        l[k] = serde_json::json!(l[k].as_u64().unwrap() * 2);
    }

    for b in l["buckets"].as_array_mut().unwrap() {
        for k in ["min_ns", "max_ns"] {
            b[k] = serde_json::json!(b[k].as_u64().unwrap() * 2);
        }
    }
    doc
}

/// `plot` without recordings, or of recordings without latency: one clear line each.
fn check_plot_refuses_bad_input(v: &serde_json::Value, dir: &Path, out_dir: &Path) {
    let out = run(&["plot"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("plot needs recordings"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let mut tp = v.clone();
    for p in tp["probes"].as_array_mut().unwrap() {
        for c in p["contexts"].as_array_mut().unwrap() {
            c["latency"] = serde_json::Value::Null;
        }
        p["workload"] = serde_json::Value::Null;
    }

    let tpf = dir.join("counts.json");
    std::fs::write(&tpf, serde_json::to_string(&tp).unwrap()).unwrap();
    let out = run(&[
        "plot",
        tpf.to_str().unwrap(),
        "-o",
        out_dir.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing to plot"), "{err}");
}

/// `plot --hdr-log`: calls/s over time from an interval log written by memcg-trace's own
/// writer, one line per tag, the rate of each interval its calls over its length.
#[test]
fn plot_draws_calls_per_second_from_an_interval_log() {
    use memcg_trace::{
        hdrlog::HdrLog,
        probes::Backend,
        snapshot::{CtxStats, HistData, ProbeStats, Snapshot},
    };
    let dir = scratch("plot_draws_calls_per_second_from_an_interval_log");
    let snap = |ms: u64, n: u64| {
        let mut contexts: [CtxStats; memcg_trace_common::NUM_CTX] = Default::default();
        contexts[0].hist = HistData::of(&vec![1_000; n as usize]);
        Snapshot {
            elapsed: std::time::Duration::from_millis(ms),
            probes: vec![ProbeStats {
                name: "charge".into(),
                target: "obj_cgroup_charge".into(),
                backend: Backend::Fentry,
                contexts,
                programs: Vec::new(),
                workload: None,
                kprobe_missed: 0,
                kprobe_skipped: 0,
                held_switches: None,
                window: None,
                callers: Vec::new(),
                memcgs: Vec::new(),
                stacks: Vec::new(),
                stack_sample: 1,
            }],
            ..Default::default()
        }
    };
    let log = dir.join("run.hlog");
    let mut l = HdrLog::create(&log).unwrap();
    l.begin(std::time::SystemTime::now(), "test");
    l.interval(&snap(1000, 100));
    l.interval(&snap(2000, 400));
    l.finish(&snap(3000, 1000)).unwrap();
    let out_dir = dir.join("plots");
    let out = run(&[
        "plot",
        "--hdr-log",
        log.to_str().unwrap(),
        "-o",
        out_dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (texts, lines) = svg_texts(&out_dir.join("rate.svg"));
    assert!(texts.iter().any(|t| t == "charge.task"), "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("calls/s")), "{texts:?}");
    assert!(lines >= 1);

    // The y axis reaches the fastest interval's rate: 600 calls in 1 s.
    assert!(texts.iter().any(|t| t == "600"), "{texts:?}");
    let out = run(&[
        "plot",
        "--hdr-log",
        dir.join("missing.hlog").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

/// The sockets workload as a command of its own: every message reaches its client (a client
/// that read less makes it fail), and it says its operations. Unprivileged or on cgroup v1 its
/// clients share its cgroup (said on stderr); the memcg part runs in the VM tests.
#[test]
fn the_sockets_workload_delivers_every_message() {
    let out = run(&["workload", "sockets", "203"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.starts_with("203 sockets operations\nTime: "),
        "{}\n{stdout}\n{stderr}",
        out.status
    );
    let out = run(&["workload", "nope"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1) && stderr.contains("open-loop, kmalloc, sockets"),
        "{stderr}"
    );
}
