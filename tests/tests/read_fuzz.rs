//! Recordings from elsewhere are input: `report`, `diff` and `view` read JSON that may be
//! truncated, hand-edited or hostile. This fuzzes the reader and everything a recording feeds
//! (the summary table, the A/B table, the dashboard drawn into a buffer) from the committed VM
//! recording: truncations, byte flips, removed members, and values replaced by negative, huge,
//! fractional, mistyped or absurd ones. Each case must either be read and shown, or be refused
//! with one line; never a panic.
//!
//! The default run takes a few seconds; `cargo xtask fuzz --minutes N` runs it for longer
//! (`MEMCG_TRACE_FUZZ_SECS`). A failing input is saved under target/fuzz-failures/.

use std::{
    panic::{catch_unwind, AssertUnwindSafe},
    path::PathBuf,
    time::{Duration, Instant},
};

use memcg_trace::{cmd::top::recording_app, export, table, tui::ui};
use proptest::{
    prelude::*,
    test_runner::{Config, RngSeed, TestCaseError, TestRunner},
};
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The committed recording, and the same as a memcg-trace/1 document (the upgrade path).
fn seeds() -> Vec<Value> {
    let text = std::fs::read_to_string(root().join("tests/fixtures/6.12-fentry.json")).unwrap();
    let v2: Value = serde_json::from_str(&text).unwrap();
    let mut v1 = v2.clone();
    v1["schema"] = json!("memcg-trace/1");
    vec![v2, v1]
}

/// Every member and element of `v`, as JSON pointers, each with whether it is a number.
fn pointers(v: &Value, at: String, out: &mut Vec<(String, bool)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push((p.clone(), x.is_number()));
                pointers(x, p, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push((p.clone(), x.is_number()));
                pointers(x, p, out);
            }
        }
        _ => {}
    }
}

/// What a hostile or careless editor puts in place of a value.
fn replacement() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(u64::MAX)),
        Just(json!(u64::MAX / 2 + 1)),
        Just(json!(i64::MIN)),
        Just(json!(1e308)),
        Just(json!(-1e308)),
        Just(json!(0.5)),
        Just(json!(4.9e-324)),
        Just(json!(9007199254740993u64)),
        Just(json!("18446744073709551616")),
        Just(json!("-5")),
        Just(json!("")),
        Just(json!("task")),
        Just(json!("nmi")),
        Just(json!("HISTFAAAAA==")),
        Just(Value::Null),
        Just(json!(true)),
        Just(json!([])),
        Just(json!({})),
        any::<u64>().prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u32>().prop_map(|n| json!(n)),
        "[a-z0-9 ._/-]{0,12}".prop_map(|s| json!(s)),
    ]
}

#[derive(Debug, Clone)]
enum Edit {
    /// Replace the value at the n-th pointer.
    Replace(usize, Value),
    /// Remove the member or element at the n-th pointer.
    Remove(usize),
    /// Copy the value at one pointer over another (duplicates, wrong shapes).
    Copy(usize, usize),
    /// Set the n-th number to another one: documents that stay well-formed but say odd or
    /// inconsistent things.
    Number(usize, Value),
    /// Set every bucket count of the document to one value (sums at their largest).
    AllBuckets(Value),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        2 => (any::<usize>(), replacement()).prop_map(|(i, v)| Edit::Replace(i, v)),
        1 => any::<usize>().prop_map(Edit::Remove),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::Copy(a, b)),
        12 => (any::<usize>(), number()).prop_map(|(i, n)| Edit::Number(i, n)),
        1 => number().prop_map(Edit::AllBuckets),
    ]
}

/// Numbers a recording can hold, weighted toward the edges: zero, small, the limits a reader
/// accepts (2^53 for counts, 2^56 for times) and just beyond, fractions.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => (0u64..4).prop_map(|n| json!(n)),
        3 => any::<u16>().prop_map(|n| json!(n)),
        3 => any::<u32>().prop_map(|n| json!(n)),
        3 => ((1u64 << 53) - 3..=(1u64 << 53) + 1).prop_map(|n| json!(n)),
        3 => ((1u64 << 56) - 3..=(1u64 << 56) + 1).prop_map(|n| json!(n)),
        1 => (0.0f64..1e6).prop_map(|f| json!(f)),
    ]
}

fn apply(doc: &mut Value, edit: &Edit) {
    let mut all = Vec::new();
    pointers(doc, String::new(), &mut all);
    if all.is_empty() {
        return;
    }

    let paths: Vec<&String> = all.iter().map(|(path, _)| path).collect();
    match edit {
        Edit::AllBuckets(value) => {
            for (path, _) in all.iter().filter(|(path, number)| {
                *number && path.contains("/buckets/") && path.ends_with("/count")
            }) {
                if let Some(target) = doc.pointer_mut(path) {
                    *target = value.clone();
                }
            }
        }
        Edit::Number(index, value) => {
            let numbers: Vec<&String> = all
                .iter()
                .filter(|(_, number)| *number)
                .map(|(path, _)| path)
                .collect();
            if !numbers.is_empty() {
                if let Some(target) = doc.pointer_mut(numbers[index % numbers.len()]) {
                    *target = value.clone();
                }
            }
        }
        Edit::Replace(index, value) => {
            if let Some(target) = doc.pointer_mut(paths[index % paths.len()]) {
                *target = value.clone();
            }
        }
        Edit::Remove(index) => {
            let path = paths[index % paths.len()];
            let (parent, last) = path.rsplit_once('/').unwrap();
            match doc.pointer_mut(parent) {
                Some(Value::Object(object)) => {
                    object.remove(&last.replace("~1", "/").replace("~0", "~"));
                }
                Some(Value::Array(array)) => {
                    if let Ok(at) = last.parse::<usize>() {
                        if at < array.len() {
                            array.remove(at);
                        }
                    }
                }
                _ => {}
            }
        }
        Edit::Copy(from, to) => {
            let value = doc.pointer(paths[from % paths.len()]).cloned();
            if let (Some(value), Some(target)) = (value, doc.pointer_mut(paths[to % paths.len()])) {
                *target = value;
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Text {
    /// Structured edits of a seed, written out.
    Edited(usize, Vec<Edit>),
    /// A seed cut short after this many bytes.
    Truncated(usize, usize),
    /// A seed with bytes overwritten.
    Flipped(usize, Vec<(usize, u8)>),
}

fn text() -> impl Strategy<Value = Text> {
    prop_oneof![
        6 => (0..2usize, prop::collection::vec(edit(), 1..6))
            .prop_map(|(s, e)| Text::Edited(s, e)),
        1 => (0..2usize, any::<usize>()).prop_map(|(s, n)| Text::Truncated(s, n)),
        1 => (0..2usize, prop::collection::vec((any::<usize>(), any::<u8>()), 1..8))
            .prop_map(|(s, f)| Text::Flipped(s, f)),
    ]
}

fn render(seeds: &[Value], t: &Text) -> String {
    match t {
        Text::Edited(s, edits) => {
            let mut v = seeds[*s].clone();
            for e in edits {
                apply(&mut v, e);
            }

            serde_json::to_string(&v).unwrap()
        }
        Text::Truncated(s, n) => {
            let full = serde_json::to_string(&seeds[*s]).unwrap();
            let mut n = n % full.len();
            while !full.is_char_boundary(n) {
                n -= 1;
            }
            full[..n].to_string()
        }
        Text::Flipped(s, flips) => {
            let mut b = serde_json::to_vec(&seeds[*s]).unwrap();
            let len = b.len();
            for (i, x) in flips {
                b[i % len] = *x;
            }
            String::from_utf8_lossy(&b).into_owned()
        }
    }
}

/// What `report`, `diff` and `view` do with a recording's text.
fn read_and_show(text: &str) -> Result<(), String> {
    let doc = export::parse(text).map_err(|e| format!("{e:#}"))?;
    let _ = table::summary(&doc);
    let _ = table::diff(&doc, &doc);
    let app = recording_app(&doc, "fuzz.json");
    for (w, h) in [(120, 36), (40, 12)] {
        let mut term =
            ratatui::Terminal::new(ratatui::backend::TestBackend::new(w, h)).expect("terminal");
        term.draw(|f| ui::draw(f, &app)).expect("draw");
    }
    Ok(())
}

#[test]
fn the_reader_survives_any_recording() {
    let secs: u64 = std::env::var("MEMCG_TRACE_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let seeds = seeds();

    // The seeds themselves are read and shown.
    for s in &seeds {
        read_and_show(&serde_json::to_string(s).unwrap()).unwrap();
    }

    // Panics are caught and reported as failures with their input; keep the default hook quiet.
    std::panic::set_hook(Box::new(|_| {}));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (cases, refused) = (std::cell::Cell::new(0u64), std::cell::Cell::new(0u64));
    let mut batch = 0u64;
    let mut failure = None;
    while failure.is_none() && Instant::now() < deadline {
        let mut runner = TestRunner::new(Config {
            cases: 256,
            failure_persistence: None,
            // A different stream each batch, the same streams each run.
            rng_seed: RngSeed::Fixed(0x6d65_6d63 ^ batch),
            ..Config::default()
        });
        batch += 1;
        let outcome = runner.run(&text(), |t| {
            let text = render(&seeds, &t);
            cases.set(cases.get() + 1);
            match catch_unwind(AssertUnwindSafe(|| read_and_show(&text))) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => {
                    refused.set(refused.get() + 1);
                    if e.contains('\n') || e.is_empty() {
                        return Err(TestCaseError::fail(format!("not one line: {e:?}")));
                    }
                    Ok(())
                }
                Err(p) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    let dir = root().join("target/fuzz-failures");
                    let _ = std::fs::create_dir_all(&dir);
                    let file = dir.join(format!("case-{batch}-{}.json", cases.get()));
                    let _ = std::fs::write(&file, &text);
                    Err(TestCaseError::fail(format!(
                        "panic: {msg} (input: {})",
                        file.display()
                    )))
                }
            }
        });
        failure = outcome.err();
    }

    let _ = std::panic::take_hook();
    if let Some(e) = failure {
        panic!("{e}");
    }

    let (cases, refused) = (cases.get(), refused.get());
    memcg_trace_tests::summary(
        "read_fuzz",
        &format!(
            "{cases} recordings in {secs} s ({batch} batches of 256): {} read and shown, {refused} refused with one line",
            cases - refused
        ),
    );
    assert!(
        refused > 0 && refused < cases,
        "the mutations reached only one outcome"
    );
}
