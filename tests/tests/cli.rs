//! Black-box tests of the commands that work on recordings, on a committed VM recording: they
//! need neither root nor a kernel feature.

use memcg_trace_tests::*;

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
    let f = fixture();
    let dir = scratch("diff_shows_a_change");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    // Twice the calls in the same time: +100.0% calls/s for charge in task context.
    let ctx = &mut v["probes"][0]["contexts"][0];
    let r = ctx["rate_per_s"].as_f64().unwrap();
    ctx["rate_per_s"] = serde_json::json!(r * 2.0);
    let b = dir.join("b.json");
    std::fs::write(&b, serde_json::to_string(&v).unwrap()).unwrap();
    let out = run(&["diff", f.to_str().unwrap(), b.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("charge") && l.contains(" task "))
        .expect("charge task row");
    assert!(row.contains("+100.0%"), "{row}");
}
