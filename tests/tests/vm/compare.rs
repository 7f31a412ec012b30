//! A/B: `diff` of runs with and without kmem accounting, and of one kernel against another.

use super::*;

/// The A/B workflow end to end on the switch the kmem-accounting debate was about: Debian's
/// 6.12 booted three times as it is and three times with `cgroup.memory=nokmem`, `record
/// --attach auto` under hackbench each time, then `memcg-trace diff A1 A2 A3 -- B1 B2 B3`
/// (with two a side and B without spread, Welch's test has one degree of freedom: too weak to
/// call even a change to 0 beyond 5% noise). With kmem accounting
/// off, `obj_cgroup_charge` is never called: its calls per hackbench message drop to 0, beyond
/// the noise; page charging goes on (`rstat` still has calls on both sides). The verdict is
/// held on calls/op, which counts and does not time: under emulation a boot's calls/s moved by
/// 40% (13.2k, 12.8k, 24.9k over three boots: Welch's p 0.051 against a change to exactly 0),
/// while the calls a hackbench message makes do not depend on how fast the emulator ran. The
/// rates are held to their direction only.
#[test]
fn vm_compare_kmem_6_12() {
    let name = "vm_compare_kmem_6_12";
    let short = "6.12";
    let Some(kernel) = one_kernel(name, short) else {
        return;
    };
    let out = xtask::workspace_root().join("target/vm/compare-test");
    let _ = fs::remove_dir_all(&out);
    let runs = xtask::compare::kmem_runs(
        &kernel,
        &[
            bin(),
            memcg_trace::workload::hackbench().expect("hackbench (rt-tests)"),
        ],
        3,
        "-g 2 -l 50",
        accel(),
        &out,
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    for f in runs.a.iter().chain(&runs.b) {
        load_recording(f);
    }

    let diff = |format: &str| diff_of(&runs, format);
    let json: serde_json::Value = serde_json::from_str(&diff("json")).unwrap();
    let figs = json["figures"].as_array().unwrap();
    let find = |probe: &str, ctx: &str, fig: &str| {
        figs.iter()
            .find(|x| x["probe"] == probe && x["context"] == ctx && x["figure"] == fig)
            .unwrap_or_else(|| panic!("{probe} {ctx} {fig} missing: {json}"))
    };
    let rate = find("charge", "task", "calls/s");
    let runs = |side: &str| -> Vec<f64> {
        rate[side]["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    assert!(runs("a").iter().all(|&r| r > 0.0), "{rate}");
    assert!(runs("b").iter().all(|&r| r == 0.0), "{rate}");

    // The workload's own calls per message.
    let per_op = find("charge", "workload", "calls/op");
    assert!(per_op["a"]["mean"].as_f64().unwrap() > 0.0, "{per_op}");
    assert_eq!(per_op["b"]["mean"].as_f64(), Some(0.0), "{per_op}");
    assert_eq!(per_op["beyond_noise"], true, "{per_op}");
    let rstat = find("rstat", "task", "calls/s");
    assert!(
        rstat["a"]["mean"].as_f64().unwrap() > 0.0 && rstat["b"]["mean"].as_f64().unwrap() > 0.0,
        "{rstat}"
    );
    let dur = find("run", "-", "duration");
    assert_eq!(
        (dur["a"]["n"].as_u64(), dur["b"]["n"].as_u64()),
        (Some(3), Some(3))
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("{name}:\n{}", diff("table")).as_bytes(),
    );
}

/// `memcg-trace diff --format FORMAT` of the two sides' recordings; fails the test if diff does.
fn diff_of(runs: &xtask::compare::KmemRuns, format: &str) -> String {
    diff_sides(&runs.a, &runs.b, format)
}

/// `memcg-trace diff` of recordings `a` against `b`, in `format`.
fn diff_sides(a: &[std::path::PathBuf], b: &[std::path::PathBuf], format: &str) -> String {
    let out = std::process::Command::new(bin())
        .args(["diff", "--format", format])
        .args(a)
        .arg("--")
        .args(b)
        .output()
        .expect("run memcg-trace diff");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("diff's output is UTF-8")
}

/// One kernel against another (`cargo xtask demo --compare --a A --b B`): both booted
/// alternately, two runs each, and `memcg-trace diff` of the recordings. Each side's runs are
/// its kernel; every default probe has its calls per hackbench message on both sides, and that
/// figure repeats within a side (the work per message is the kernel's, not the run's); a probe
/// whose function (or backend: `auto` decides per kernel) differs between the kernels says so
/// on its rows, naming both, and a probe where they stayed says nothing. The verdicts the runs
/// alone decide are checked (`verdict_from_runs`), and those of a side against itself.
fn compare_kernels(name: &str, a: &str, b: &str, functions_change: bool) {
    let (Some(ka), Some(kb)) = (one_kernel(name, a), one_kernel(name, b)) else {
        return;
    };
    let out = xtask::workspace_root().join(format!("target/vm/compare-{a}-{b}-test"));
    let _ = fs::remove_dir_all(&out);
    let runs = xtask::compare::ab_runs(
        [("a", &ka), ("b", &kb)],
        &[
            bin(),
            memcg_trace::workload::hackbench().expect("hackbench (rt-tests)"),
        ],
        2,
        "-g 1 -l 50",
        accel(),
        &out,
    )
    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let docs = |files: &[std::path::PathBuf]| -> Vec<memcg_trace::export::Document> {
        files.iter().map(|f| load_recording(f)).collect()
    };
    let (da, db) = (docs(&runs.a), docs(&runs.b));
    for (d, k) in da
        .iter()
        .map(|d| (d, &ka))
        .chain(db.iter().map(|d| (d, &kb)))
    {
        assert_eq!(
            d.meta.kernel_release, k.release,
            "{name}: a run of the wrong kernel"
        );
    }

    let json: serde_json::Value = serde_json::from_str(&diff_of(&runs, "json")).unwrap();
    let table = diff_of(&runs, "table");
    let figs = json["figures"].as_array().unwrap();
    let mut changed = Vec::new();

    // (beyond noise, the row) where the runs alone decide it (`verdict_from_runs`).
    let mut verdicts = Vec::new();
    for p in DEFAULT_PROBES {
        let rows: Vec<&serde_json::Value> = figs.iter().filter(|f| f["probe"] == p).collect();
        assert!(!rows.is_empty(), "{name}: no row of {p}\n{table}");
        let sides = [(&ka.release, &da[0]), (&kb.release, &db[0])];
        if let Some(said) = check_what_changed(name, p, sides, &rows, &table) {
            changed.push(said);
        }

        check_calls_per_op(name, p, &rows, &table);
        verdicts.extend(decided_verdicts(name, p, &rows, &table));
    }

    // Between two kernels the runs alone may decide no row at all: 6.12 -> 7.3 once had every
    // row's two ranges apart, none of them repeating exactly. (A change that is not to zero,
    // where the runs repeat exactly on each side, is decided when there: 6.1 -> 6.12's charge
    // calls per message, 2.168 -> 2.225 in every run.) So a side against itself, its runs
    // swapped, where every row's ranges are the same and the runs decide it: within noise.
    check_side_against_itself(name, &runs.a);
    let told: Vec<&String> = verdicts.iter().filter(|v| v.0).map(|v| &v.1).collect();

    // 6.1 and 6.12 trace the same three functions; 7.3 moved all three.
    assert_eq!(
        !changed.is_empty(),
        functions_change,
        "{name}: functions changed between {} and {}: {changed:?}\n{table}",
        ka.release,
        kb.release
    );
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "{name}: functions changed: {}; {} rows decided by their runs, beyond noise: {told:?}\n{table}",
            changed.join("; "),
            verdicts.len()
        )
        .as_bytes(),
    );
}

/// Probe `p`'s rows say where its function (or backend: `auto` decides per kernel) changed
/// between the kernels (`sides`: each release and a run's recording), naming both, and say
/// nothing where they stayed; returns what the table says of a changed function.
fn check_what_changed(
    name: &str,
    p: &str,
    sides: [(&String, &memcg_trace::export::Document); 2],
    rows: &[&serde_json::Value],
    table: &str,
) -> Option<String> {
    let [(ra, da), (rb, db)] = sides;
    let target = |d: &memcg_trace::export::Document| probe(d, p).target.clone();
    let (ta, tb) = (target(da), target(db));
    let said = format!("{ra}: {ta} -> {rb}: {tb}");

    // `auto` may take another backend on the other kernel (kprobe on preemptible 7.3).
    let backend = |d: &memcg_trace::export::Document| probe(d, p).backend.to_string();
    let (ba, bb) = (backend(da), backend(db));
    for r in rows {
        if ta == tb {
            assert!(
                r.get("functions").is_none(),
                "{name}: {p} ({ta} on both) says: {r}"
            );
        } else {
            assert_eq!(
                r["functions"].as_str(),
                Some(said.as_str()),
                "{name}: {p}: {r}"
            );
        }

        if ba == bb {
            assert!(
                r.get("backends").is_none(),
                "{name}: {p} ({ba} on both) says: {r}"
            );
        } else {
            assert_eq!(
                r["backends"].as_str(),
                Some(format!("{ba} -> {bb}").as_str()),
                "{name}: {p}: {r}"
            );
        }
    }

    if ta != tb {
        assert!(
            table.contains(&format!("* {p}: {said}")),
            "{name}: the table does not say {p}'s function changed\n{table}"
        );
        return Some(said);
    }
    None
}

/// Probe `p`'s calls per hackbench message, two runs a side, on both; charge's repeat within
/// a side (the kmem charges of a message are the kernel's, not the run's).
fn check_calls_per_op(name: &str, p: &str, rows: &[&serde_json::Value], table: &str) {
    let per_op = rows
        .iter()
        .find(|r| r["context"] == "workload" && r["figure"] == "calls/op")
        .unwrap_or_else(|| panic!("{name}: {p}: no calls/op row\n{table}"));
    for side in ["a", "b"] {
        let s = &per_op[side];
        assert!(
            s["n"].as_u64() == Some(2) && s["mean"].as_f64().unwrap_or(0.0) > 0.0,
            "{name}: {p} calls/op, side {side}: {per_op}"
        );
    }

    if p == "charge" {
        // The kmem charges of a hackbench message repeat run to run on one kernel.
        for side in ["a", "b"] {
            let rsd = per_op[side]["rsd"].as_f64().unwrap_or(1.0);
            assert!(
                rsd <= 0.05,
                "{name}: charge calls/op side {side} rsd {rsd}: {per_op}"
            );
        }
    }
}

/// The rows the runs alone decide (`verdict_from_runs`) have that verdict; returns them,
/// (beyond noise, the row).
fn decided_verdicts(
    name: &str,
    p: &str,
    rows: &[&serde_json::Value],
    table: &str,
) -> Vec<(bool, String)> {
    let mut verdicts = Vec::new();
    for r in rows {
        if let Some(v) = verdict_from_runs(r) {
            // (Not beyond noise: "within noise", or no verdict where nothing spreads.)
            assert_eq!(
                r["beyond_noise"].as_bool() == Some(true),
                v,
                "{name}: {p}: the verdict is not what the runs say\n{r}\n{table}"
            );
            verdicts.push((v, format!("{p} {} {}", r["context"], r["figure"])));
        }
    }
    verdicts
}

/// A side against itself, its runs swapped: every row the runs decide is within noise, and
/// there is such a row.
fn check_side_against_itself(name: &str, side: &[std::path::PathBuf]) {
    let swapped: Vec<std::path::PathBuf> = side.iter().rev().cloned().collect();
    let same: serde_json::Value =
        serde_json::from_str(&diff_sides(side, &swapped, "json")).unwrap();
    let mut same_rows = 0;
    for r in same["figures"].as_array().unwrap() {
        if let Some(v) = verdict_from_runs(r) {
            assert!(
                !v && r["beyond_noise"].as_bool() != Some(true),
                "{name}: side a against itself, a row beyond noise: {r}"
            );
            same_rows += 1;
        }
    }

    assert!(
        same_rows > 0,
        "{name}: side a against itself: no row with two runs a side"
    );
}

/// The verdict a row of `diff` must have where its runs alone decide it, two runs a side
/// (the review's 12d: the kmem A/B only tries a change to exactly zero):
/// - the two sides' ranges overlap: within noise. Their means are then at most half the two
///   ranges apart, and each side's standard error is half its range, so Welch's t is at most
///   (ra + rb) / sqrt(ra^2 + rb^2) <= sqrt(2): p > 0.29 at the 1 to 2 degrees of freedom of two
///   runs a side, before any correction for the number of rows (which only raises it);
/// - every run the same on each side and the sides differ, in calls (per second or per
///   operation): beyond noise, as no spread at all is (latencies read from buckets can
///   repeat exactly without telling anything).
///
/// Some(whether beyond noise), or None where the spread and the correction decide.
fn verdict_from_runs(row: &serde_json::Value) -> Option<bool> {
    let runs = |side: &str| -> Option<Vec<f64>> {
        row[side]["runs"]
            .as_array()?
            .iter()
            .map(|v| v.as_f64())
            .collect()
    };
    let (a, b) = (runs("a")?, runs("b")?);
    if a.len() != 2 || b.len() != 2 {
        return None;
    }

    let range = |v: &[f64]| (v[0].min(v[1]), v[0].max(v[1]));
    let ((alo, ahi), (blo, bhi)) = (range(&a), range(&b));
    if alo <= bhi && blo <= ahi {
        return Some(false);
    }

    let calls = matches!(row["figure"].as_str(), Some("calls/s" | "calls/op"));
    (calls && alo == ahi && blo == bhi).then_some(true)
}

#[test]
fn vm_compare_kernels_6_1_6_12() {
    compare_kernels("vm_compare_kernels_6_1_6_12", "6.1", "6.12", false);
}

#[test]
fn vm_compare_kernels_6_12_7_3() {
    compare_kernels("vm_compare_kernels_6_12_7_3", "6.12", "7.3", true);
}
