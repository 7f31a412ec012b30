//! A/B with the noise: several recordings per side (`diff A1 A2 A3 -- B1 B2 B3`), and per
//! probe, context and figure the mean over the runs of each side, its relative standard
//! deviation, the change of the means, and whether the change is beyond the run-to-run noise:
//! Welch's t-test on the per-run values (two-sided; unequal variances), its p-value from the
//! Student t distribution (statrs). The figures: calls/s, calls per workload operation (where
//! the workload reports its operations: hackbench's messages), p50, p99 and mean latency per
//! (probe, context) and per workload row, and the run's duration (for a workload, its run time
//! under the tracer).

use std::fmt::Write as _;

use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::{
    export::{ContextOut, Document, Latency, WorkloadOut},
    units::{fmt_count, fmt_ns},
};

/// The significance level a change must reach to be called beyond the noise, unless given.
pub const ALPHA: f64 = 0.05;

/// Mean, sample standard deviation and number of one side's per-run values.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Spread {
    /// Runs that had the figure.
    pub n: usize,
    /// Mean over the runs.
    pub mean: f64,
    /// Sample standard deviation (n - 1); 0 for one run.
    pub sd: f64,
    /// `sd / mean` (None when the mean is 0).
    pub rsd: Option<f64>,
    /// The per-run values, in the order the files were given.
    pub runs: Vec<f64>,
}

impl Spread {
    /// The spread of `v`; None when empty.
    pub fn of(v: &[f64]) -> Option<Spread> {
        let count = v.len();
        if count == 0 {
            return None;
        }

        let mean = v.iter().sum::<f64>() / count as f64;
        let sd = if count > 1 {
            (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (count - 1) as f64).sqrt()
        } else {
            0.0
        };
        Some(Spread {
            n: count,
            mean,
            sd,
            rsd: (mean != 0.0).then(|| sd / mean.abs()),
            runs: v.to_vec(),
        })
    }
}

/// Welch's t-test of B against A.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Welch {
    /// t statistic.
    pub t: f64,
    /// Welch-Satterthwaite degrees of freedom.
    pub df: f64,
    /// Two-sided p-value.
    pub p: f64,
}

/// Welch's t-test; None with fewer than two runs on a side (no variance to compare with), and
/// for two sides without any spread whose means differ (percentiles fall on bucket values, so
/// equal runs say nothing of the noise). Equal constant sides: p = 1.
pub fn welch(a: &Spread, b: &Spread) -> Option<Welch> {
    if a.n < 2 || b.n < 2 {
        return None;
    }

    let (va, vb) = (a.sd.powi(2) / a.n as f64, b.sd.powi(2) / b.n as f64);
    let se2 = va + vb;
    let diff = b.mean - a.mean;
    if se2 == 0.0 {
        return (diff == 0.0).then(|| Welch {
            t: 0.0,
            df: (a.n + b.n - 2) as f64,
            p: 1.0,
        });
    }

    let t = diff / se2.sqrt();
    let df = se2.powi(2) / (va.powi(2) / (a.n - 1) as f64 + vb.powi(2) / (b.n - 1) as f64);
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;

    // The upper tail directly (1 - cdf loses the small p-values).
    let p = (2.0 * dist.sf(t.abs())).clamp(0.0, 1.0);
    Some(Welch { t, df, p })
}

/// A count (calls/s, calls/op) that every run of a side repeated exactly, differing between the
/// sides: no run-to-run noise to test against, and the change is beyond it (`Some(true)`).
/// Not for latencies, whose percentiles fall on bucket values: equal runs there say nothing
/// of the noise. Calls per workload operation repeat exactly where the workload does the same
/// work each run (hackbench's kmem charges per message).
fn counts_apart(unit: Unit, a: &Spread, b: &Spread) -> Option<bool> {
    (matches!(unit, Unit::CallsPerS | Unit::CallsPerOp)
        && a.n >= 2
        && b.n >= 2
        && a.sd == 0.0
        && b.sd == 0.0
        && a.mean != b.mean)
        .then_some(true)
}

/// One figure of one row, both sides.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Figure {
    /// Probe (or `run` for the run-wide figures).
    pub probe: String,
    /// Context, `workload`, or `-` for the run-wide figures.
    pub context: String,
    /// `calls/s`, `calls/op`, `time/op`, `p50`, `p99`, `mean` or `duration`.
    pub figure: String,
    /// Where the function behind the probe differs between the sides (kernels that moved the
    /// work to another function): `A's release: function -> B's release: function`. Calls per
    /// workload operation then compare the work; latencies compare different functions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub functions: Option<String>,
    /// Where the backend that traced the probe differs between the sides (`auto` takes fentry
    /// on one kernel, kprobe on another): `A's -> B's`. Latencies then hold different floors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backends: Option<String>,
    /// Unit of the values: `ns`, `calls/s`, `s`.
    pub unit: String,
    /// Side A.
    pub a: Option<Spread>,
    /// Side B.
    pub b: Option<Spread>,
    /// `(mean B - mean A) / mean A`.
    pub change: Option<f64>,
    /// The test, where both sides have two runs or more.
    pub welch: Option<Welch>,
    /// Welch's p adjusted for the number of figures tested in this comparison
    /// (Benjamini-Hochberg): among the figures called beyond noise, the expected share of
    /// unchanged ones is at most `alpha`.
    pub q: Option<f64>,
    /// `q < alpha` (or every run of both sides the same, and the sides apart).
    pub beyond_noise: Option<bool>,
}

/// The whole comparison.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Comparison {
    /// The level used for `beyond_noise`.
    pub alpha: f64,
    /// The files of side A, as given.
    pub a_files: Vec<String>,
    /// The files of side B.
    pub b_files: Vec<String>,
    /// Kernel release and workload of each side (the first run's; a note when runs differ).
    pub a_about: String,
    /// Side B's.
    pub b_about: String,
    /// Rows in order: probes as they come, contexts in the usual order, then the workload
    /// row, then the run-wide figures.
    pub figures: Vec<Figure>,
}

/// What a side is: kernel, command line, workload.
fn about(docs: &[Document]) -> String {
    let first = &docs[0];
    let workload = first
        .meta
        .workload
        .as_ref()
        .map(|w| w.argv.join(" "))
        .unwrap_or_else(|| "system-wide".into());
    let mut out = format!("{} ({workload})", first.meta.kernel_release);
    if docs
        .iter()
        .any(|x| x.meta.kernel_release != first.meta.kernel_release)
    {
        out.push_str("; runs on different kernels");
    }

    // Backends differ in their floor (hundreds of ns under emulation): their latencies do not
    // compare.
    let backends = |x: &Document| x.probes.iter().map(|p| p.backend).collect::<Vec<_>>();
    if docs.iter().any(|x| backends(x) != backends(first)) {
        out.push_str("; runs with different backends");
    }
    out
}

fn pct(l: &Latency, q: f64) -> Option<f64> {
    l.percentiles
        .iter()
        .find(|x| (x.q - q).abs() < 1e-9)
        .map(|x| x.ns as f64)
}

/// The unit of a compared figure.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Unit {
    Ns,
    CallsPerS,
    CallsPerOp,
    S,
}

impl Unit {
    /// As written in the comparison (`Figure::unit`).
    fn as_str(self) -> &'static str {
        match self {
            Unit::Ns => "ns",
            Unit::CallsPerS => "calls/s",
            Unit::CallsPerOp => "calls/op",
            Unit::S => "s",
        }
    }
}

/// One figure of one run.
struct RunFigure {
    name: &'static str,
    unit: Unit,
    value: Option<f64>,
}

impl RunFigure {
    fn new(name: &'static str, unit: Unit, value: Option<f64>) -> Self {
        RunFigure { name, unit, value }
    }
}

/// The figures of one row of one run: `calls` with the workload's operations give calls/op,
/// and with the mean latency the time per operation (every call at the timed calls' mean, as
/// the table's "per operation" line): what the probe's function costs the workload a unit of
/// its work, the figure that survives a change of function or of how often it is called.
fn row_figures(
    rate: Option<f64>,
    calls: Option<u64>,
    ops: Option<u64>,
    l: Option<&Latency>,
) -> Vec<RunFigure> {
    let per_op = calls.zip(ops).map(|(c, o)| c as f64 / o as f64);
    let mean = l.and_then(|l| l.mean_ns);
    vec![
        RunFigure::new("calls/s", Unit::CallsPerS, rate),
        RunFigure::new("calls/op", Unit::CallsPerOp, per_op),
        RunFigure::new("time/op", Unit::Ns, per_op.zip(mean).map(|(n, m)| n * m)),
        RunFigure::new("p50", Unit::Ns, l.and_then(|l| pct(l, 0.5))),
        RunFigure::new("p99", Unit::Ns, l.and_then(|l| pct(l, 0.99))),
        RunFigure::new("mean", Unit::Ns, mean),
    ]
}

/// Compares the runs of A with the runs of B.
pub fn compare(
    a: &[Document],
    b: &[Document],
    a_files: Vec<String>,
    b_files: Vec<String>,
    alpha: f64,
) -> Comparison {
    let mut figures = Vec::new();
    for name in probe_names(a, b) {
        let functions = (
            change(a, b, name, true, |p| p.target.clone()),
            change(a, b, name, false, |p| p.backend.to_string()),
        );
        for ctx in crate::export::CTX_ORDER {
            if a.iter()
                .chain(b)
                .all(|d| context_row(d, name, ctx).is_none())
            {
                continue;
            }

            let per_run = |d: &Document| context_figures(d, name, ctx);
            figures.extend(compared_row(a, b, name, ctx, &functions, &per_run));
        }

        if a.iter().chain(b).any(|d| workload_row(d, name).is_some()) {
            let per_run = |d: &Document| workload_figures(d, name);
            figures.extend(compared_row(a, b, name, "workload", &functions, &per_run));
        }
    }

    let duration = |d: &Document| {
        vec![RunFigure::new(
            "duration",
            Unit::S,
            Some(d.meta.duration_ns as f64 / 1e9),
        )]
    };
    figures.extend(compared_row(a, b, "run", "-", &(None, None), &duration));
    adjust_for_the_tests_made(&mut figures, alpha);
    Comparison {
        alpha,
        a_about: about(a),
        b_about: about(b),
        a_files,
        b_files,
        figures,
    }
}

/// The probes of either side, in the order they first appear.
fn probe_names<'a>(a: &'a [Document], b: &'a [Document]) -> Vec<&'a str> {
    let mut probes: Vec<&str> = Vec::new();
    for d in a.iter().chain(b) {
        for p in &d.probes {
            if !probes.contains(&p.name.as_str()) {
                probes.push(&p.name);
            }
        }
    }
    probes
}

/// The figures of one row (`probe`, `context`): per figure `per_run` gives, each side's spread
/// over its runs, the change of the means and Welch's test. A figure no run has is left out.
/// `functions`: where the probe's function and backend differ between the sides.
fn compared_row(
    a: &[Document],
    b: &[Document],
    probe: &str,
    context: &str,
    (functions, backends): &(Option<String>, Option<String>),
    per_run: &dyn Fn(&Document) -> Vec<RunFigure>,
) -> Vec<Figure> {
    let mut figures = Vec::new();
    let names = per_run(&a[0]);
    for (i, RunFigure { name, unit, .. }) in names.iter().enumerate() {
        let side = |docs: &[Document]| {
            let v: Vec<f64> = docs.iter().filter_map(|d| per_run(d)[i].value).collect();
            Spread::of(&v)
        };
        let (sa, sb) = (side(a), side(b));
        if sa.is_none() && sb.is_none() {
            continue;
        }

        let change = match (&sa, &sb) {
            (Some(x), Some(y)) if x.mean != 0.0 => Some((y.mean - x.mean) / x.mean),
            _ => None,
        };
        let welch_test = match (&sa, &sb) {
            (Some(x), Some(y)) => welch(x, y),
            _ => None,
        };

        // Decided by `adjust_for_the_tests_made` for the tested figures, once every p is known.
        let beyond_noise = welch_test
            .as_ref()
            .map(|_| false)
            .or_else(|| counts_apart(*unit, sa.as_ref()?, sb.as_ref()?));
        figures.push(Figure {
            probe: probe.to_string(),
            context: context.to_string(),
            figure: name.to_string(),
            functions: functions.clone(),
            backends: backends.clone(),
            unit: unit.as_str().to_string(),
            beyond_noise,
            a: sa,
            b: sb,
            change,
            welch: welch_test,
            q: None,
        });
    }
    figures
}

/// Probe `name`'s row of context `ctx` in run `d`, where it has calls.
fn context_row<'a>(d: &'a Document, name: &str, ctx: &str) -> Option<&'a ContextOut> {
    d.probes
        .iter()
        .find(|p| p.name == name)
        .and_then(|p| p.contexts.iter().find(|c| c.context == ctx))
        .filter(|c| c.count > 0)
}

/// The figures of probe `name`'s row of context `ctx` in run `d`.
fn context_figures(d: &Document, name: &str, ctx: &str) -> Vec<RunFigure> {
    let row = context_row(d, name, ctx);

    // A run where the probe was attached but saw no call here: 0 calls/s (kmem accounting
    // off, say), not a missing run.
    let attached = d.probes.iter().any(|p| p.name == name);

    // Calls per operation of the workload: of its own calls only (the workload row), not of
    // the system's.
    row_figures(
        row.and_then(|c| c.rate_per_s).or(attached.then_some(0.0)),
        row.map(|c| c.count).or(attached.then_some(0)),
        None,
        row.and_then(|c| c.latency.as_ref()),
    )
}

/// Probe `name`'s workload row in run `d`, where it has calls.
fn workload_row<'a>(d: &'a Document, name: &str) -> Option<&'a WorkloadOut> {
    d.probes
        .iter()
        .find(|p| p.name == name)
        .and_then(|p| p.workload.as_ref())
        .filter(|w| w.count > 0)
}

/// The figures of probe `name`'s workload row in run `d`, calls per operation among them.
fn workload_figures(d: &Document, name: &str) -> Vec<RunFigure> {
    let row = workload_row(d, name);
    let attached = d
        .probes
        .iter()
        .any(|p| p.name == name && p.workload.is_some());
    row_figures(
        row.and_then(|w| w.rate_per_s).or(attached.then_some(0.0)),
        row.map(|w| w.count).or(attached.then_some(0)),
        ops(d),
        row.and_then(|w| w.latency.as_ref()),
    )
}

/// Every row is a test: at 0.05, one unchanged figure in twenty would come out beyond noise by
/// chance. The p values are adjusted for the number tested (Benjamini-Hochberg), and a tested
/// figure is beyond the noise where its adjusted value is under `alpha`.
fn adjust_for_the_tests_made(figures: &mut [Figure], alpha: f64) {
    let ps: Vec<f64> = figures
        .iter()
        .filter_map(|f| f.welch.as_ref().map(|w| w.p))
        .collect();
    let mut qs = benjamini_hochberg(&ps).into_iter();
    for f in figures.iter_mut().filter(|f| f.welch.is_some()) {
        let q = qs.next();
        f.q = q;
        f.beyond_noise = q.map(|q| q < alpha);
    }
}

/// Where what `of` takes from probe `name` (its function, its backend) differs between the
/// sides: each side's value(s) (several where its runs differ), after its kernel release if
/// `releases`, `A -> B`; None where they are the same.
fn change(
    a: &[Document],
    b: &[Document],
    name: &str,
    releases: bool,
    of: impl Fn(&crate::export::ProbeOut) -> String,
) -> Option<String> {
    let side = |docs: &[Document]| -> (String, std::collections::BTreeSet<String>) {
        let functions = docs
            .iter()
            .flat_map(|d| d.probes.iter().filter(|p| p.name == name))
            .map(&of)
            .collect();
        (docs[0].meta.kernel_release.clone(), functions)
    };
    let ((ra, fa), (rb, fb)) = (side(a), side(b));
    let join = |f: &std::collections::BTreeSet<String>| {
        if f.is_empty() {
            "not attached".to_string()
        } else {
            f.iter().cloned().collect::<Vec<_>>().join(", ")
        }
    };

    // Two builds of one release (a patch against its base) are told by side.
    let (ra, rb) = if ra == rb {
        ("A".to_string(), "B".to_string())
    } else {
        (ra, rb)
    };
    (fa != fb).then(|| {
        if releases {
            format!("{ra}: {} -> {rb}: {}", join(&fa), join(&fb))
        } else {
            format!("{} -> {}", join(&fa), join(&fb))
        }
    })
}

/// The notes under a table: the probes whose function or backend differs between the sides.
fn function_notes(c: &Comparison) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for f in &c.figures {
        let mut said = Vec::new();
        if let Some(x) = &f.functions {
            said.push(format!("{x} (the function behind the probe changed: calls/op compare the work, latencies different functions)"));
        }

        if let Some(x) = &f.backends {
            said.push(format!(
                "traced by {x} (the backend changed: latencies hold different floors)"
            ));
        }

        if said.is_empty() {
            continue;
        }

        let line = format!("* {}: {}", f.probe, said.join("; "));
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}

/// A row's probe cell: marked where its function or backend differs between the sides.
fn probe_cell(f: &Figure) -> String {
    if f.functions.is_some() || f.backends.is_some() {
        format!("{}*", f.probe)
    } else {
        f.probe.clone()
    }
}

/// Benjamini-Hochberg adjusted p values (q), in the order given: q of the i-th smallest p of m is
/// the least `p_j * m / j` over j >= i, at most 1.
pub fn benjamini_hochberg(ps: &[f64]) -> Vec<f64> {
    let count = ps.len();
    let mut order: Vec<usize> = (0..count).collect();
    order.sort_by(|&i, &j| ps[i].total_cmp(&ps[j]));
    let mut adjusted = vec![1.0; count];
    let mut least: f64 = 1.0;
    for (rank, &i) in order.iter().enumerate().rev() {
        least = least.min(ps[i] * count as f64 / (rank + 1) as f64);
        adjusted[i] = least;
    }
    adjusted
}

/// The operations the run's workload reports (see `workload::operations`).
/// The operations a run's workload made: as recorded, or, in a recording from before they were,
/// from its command line where it ran to the end.
fn ops(d: &Document) -> Option<u64> {
    let w = d.meta.workload.as_ref()?;
    match &w.operations {
        Some(o) => Some(o.count),
        None if w.exit_status == Some(0) => crate::workload::operations(&w.argv).map(|(n, _)| n),
        None => None,
    }
}

fn value(v: f64, unit: &str) -> String {
    match unit {
        "ns" => fmt_ns(v),
        "calls/s" => fmt_count(v),
        "calls/op" => format!("{v:.3}"),
        _ => format!("{v:.3}s"),
    }
}

/// The cells of one figure: A mean, A rsd, B mean, B rsd, change, p, verdict.
fn cells(f: &Figure) -> [String; 7] {
    let mean = |s: &Option<Spread>| {
        s.as_ref()
            .map(|s| value(s.mean, &f.unit))
            .unwrap_or_else(|| "-".into())
    };
    let rsd = |s: &Option<Spread>| match s {
        Some(s) if s.n > 1 => s
            .rsd
            .map(|r| format!("±{:.1}%", r * 100.0))
            .unwrap_or_else(|| "-".into()),
        _ => "-".into(),
    };
    [
        mean(&f.a),
        rsd(&f.a),
        mean(&f.b),
        rsd(&f.b),
        f.change
            .map(|c| format!("{:+.1}%", c * 100.0))
            .unwrap_or_else(|| "-".into()),
        f.welch
            .as_ref()
            .map(|w| {
                if w.p < 0.001 {
                    "<0.001".to_string()
                } else {
                    format!("{:.3}", w.p)
                }
            })
            .unwrap_or_else(|| "-".into()),
        match (f.beyond_noise, &f.a, &f.b) {
            (Some(true), Some(a), Some(b)) if f.welch.is_none() && a.sd == 0.0 && b.sd == 0.0 => {
                "beyond noise (every run the same)".into()
            }
            (Some(true), ..) => "beyond noise".into(),
            (Some(false), ..) => "within noise".into(),
            (None, Some(a), Some(b)) if a.n < 2 || b.n < 2 => "n/a (1 run on a side)".into(),
            (None, Some(_), Some(_)) => "n/a (no spread)".into(),
            _ => "n/a (no calls on a side)".into(),
        },
    ]
}

const HEADER: [&str; 10] = [
    "probe", "context", "figure", "A mean", "A rsd", "B mean", "B rsd", "change", "p", "verdict",
];

fn preamble(c: &Comparison) -> String {
    format!(
        "A: {} runs, {}\nB: {} runs, {}\nWelch's t-test on the per-run values, two-sided; beyond noise: p adjusted for the {} figures tested (Benjamini-Hochberg) < {}\n",
        c.a_files.len(),
        c.a_about,
        c.b_files.len(),
        c.b_about,
        c.figures.iter().filter(|f| f.welch.is_some()).count(),
        c.alpha
    )
}

/// The comparison as a text table.
pub fn table(c: &Comparison) -> String {
    let mut out = preamble(c);
    let line = |v: &[String]| {
        format!(
            "{:<16} {:<8} {:<8} {:>9} {:>7} {:>9} {:>7} {:>8} {:>7}  {}",
            v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]
        )
    };
    let _ = writeln!(out, "{}", line(&HEADER.map(String::from)));
    for f in &c.figures {
        let [am, ar, bm, br, ch, p, v] = cells(f);
        let _ = writeln!(
            out,
            "{}",
            line(&[
                probe_cell(f),
                f.context.clone(),
                f.figure.clone(),
                am,
                ar,
                bm,
                br,
                ch,
                p,
                v
            ])
        );
    }

    for n in function_notes(c) {
        let _ = writeln!(out, "{n}");
    }
    out
}

/// The comparison as a markdown table (for a mail or a report).
pub fn markdown(c: &Comparison) -> String {
    let mut out = String::new();
    for l in preamble(c).lines() {
        let _ = writeln!(out, "{l}  ");
    }

    let _ = writeln!(out);
    let _ = writeln!(out, "| {} |", HEADER.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(HEADER.len()));
    for f in &c.figures {
        let [am, ar, bm, br, ch, p, v] = cells(f);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {am} | {ar} | {bm} | {br} | {ch} | {p} | {v} |",
            probe_cell(f),
            f.context,
            f.figure
        );
    }

    let notes = function_notes(c);
    if !notes.is_empty() {
        let _ = writeln!(out);
    }

    for n in notes {
        let _ = writeln!(out, "{}  ", n.replacen('*', "\\*", 1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn benjamini_hochberg_matches_a_reference() {
        // R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "BH")
        let q = benjamini_hochberg(&[0.01, 0.04, 0.03, 0.005]);
        for (got, want) in q.iter().zip([0.02, 0.04, 0.04, 0.02]) {
            assert!((got - want).abs() < 1e-12, "{q:?}");
        }

        assert_eq!(benjamini_hochberg(&[0.9, 1.0]), vec![1.0, 1.0]);
        assert!(benjamini_hochberg(&[]).is_empty());
    }

    /// Uniform numbers in [0, 1) from a xorshift generator seeded with `seed` (reproducible).
    fn uniform_from(mut seed: u64) -> impl FnMut() -> f64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Many unchanged figures (3 noisy runs a side, 40 figures a comparison, 400
    /// comparisons): a comparison that calls any of them beyond noise is a false alarm. Tested
    /// one by one at 0.05 nearly every comparison would raise one (1 - 0.95^40 = 87%); adjusted,
    /// at most about 5% may.
    #[test]
    fn unchanged_figures_are_rarely_called_beyond_noise() {
        let mut uniform = uniform_from(0x9e37_79b9_7f4a_7c15);
        let mut normal = move || {
            let (u, v) = (uniform().max(1e-300), uniform());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        };
        let (comparisons, rows) = (400, 40);
        let (mut alarms, mut raw_alarms) = (0, 0);
        for _ in 0..comparisons {
            let ps: Vec<f64> = (0..rows)
                .filter_map(|_| {
                    let a: Vec<f64> = (0..3).map(|_| 100.0 + normal()).collect();
                    let b: Vec<f64> = (0..3).map(|_| 100.0 + normal()).collect();
                    welch(&Spread::of(&a)?, &Spread::of(&b)?).map(|w| w.p)
                })
                .collect();
            assert_eq!(ps.len(), rows);
            raw_alarms += ps.iter().any(|&p| p < 0.05) as u32;
            alarms += benjamini_hochberg(&ps).iter().any(|&q| q < 0.05) as u32;
        }

        let share = alarms as f64 / comparisons as f64;
        let raw = raw_alarms as f64 / comparisons as f64;
        assert!(raw > 0.6, "unadjusted: {raw}");
        assert!(
            share <= 0.09,
            "adjusted: {share} of comparisons raised a false alarm"
        );
    }

    /// Two runs a side whose ranges overlap are never beyond noise, before any correction:
    /// Welch's t is at most sqrt(2) there (the VM compare tests hold `diff` to this).
    #[test]
    fn two_runs_a_side_that_overlap_are_within_noise() {
        let mut uniform = uniform_from(0x2545_f491_4f6c_dd1d);
        let mut tried = 0;
        let mut lowest_p = 1.0f64;
        while tried < 20_000 {
            let (a, b) = (
                [uniform(), uniform() * 3.0],
                [uniform() * 2.0, uniform() * 0.5 + 1.0],
            );
            let overlap = a[0].min(a[1]) <= b[0].max(b[1]) && b[0].min(b[1]) <= a[0].max(a[1]);
            if !overlap {
                continue;
            }
            tried += 1;
            let w = welch(&Spread::of(&a).unwrap(), &Spread::of(&b).unwrap()).unwrap();
            assert!(w.t.abs() <= 2f64.sqrt() + 1e-9, "{a:?} {b:?}: {w:?}");
            lowest_p = lowest_p.min(w.p);
        }

        assert!(lowest_p > 0.15, "lowest p {lowest_p}");

        // Touching ranges of equal length: the bound is reached.
        let w = welch(
            &Spread::of(&[0.0, 1.0]).unwrap(),
            &Spread::of(&[1.0, 2.0]).unwrap(),
        )
        .unwrap();
        assert!((w.t.abs() - 2f64.sqrt()).abs() < 1e-9, "{w:?}");
    }

    /// One kernel against another where the function behind a probe changed (6.1's
    /// `obj_cgroup_charge`, 7.3's `__memcg_slab_post_alloc_hook`): that probe's rows say so, in
    /// the JSON, the table and the markdown; a probe whose function stayed says nothing.
    #[test]
    fn a_probe_whose_function_changed_between_kernels_says_so_on_its_rows() {
        let fixture = crate::export::read(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/6.12-fentry.json"
        )))
        .expect("the committed recording");
        let mut run_a = fixture.clone();
        run_a.meta.kernel_release = "6.1.0-57-amd64".into();
        let mut run_b = fixture;
        run_b.meta.kernel_release = "7.3.4+deb13-amd64".into();
        let charge_a = run_a
            .probes
            .iter()
            .find(|p| p.name == "charge")
            .unwrap()
            .target
            .clone();
        run_b
            .probes
            .iter_mut()
            .find(|p| p.name == "charge")
            .unwrap()
            .target = "__memcg_slab_post_alloc_hook".into();
        let (a, b) = (vec![run_a.clone(), run_a], vec![run_b.clone(), run_b]);
        let files = |n: &str| vec![format!("{n}-1.json"), format!("{n}-2.json")];
        let compared = compare(&a, &b, files("a"), files("b"), 0.05);
        let said = format!(
            "6.1.0-57-amd64: {charge_a} -> 7.3.4+deb13-amd64: __memcg_slab_post_alloc_hook"
        );
        let charge: Vec<&Figure> = compared
            .figures
            .iter()
            .filter(|f| f.probe == "charge")
            .collect();
        assert!(!charge.is_empty());
        assert!(
            charge
                .iter()
                .all(|f| f.functions.as_deref() == Some(said.as_str())),
            "{charge:?}"
        );
        assert!(compared
            .figures
            .iter()
            .filter(|f| f.probe != "charge")
            .all(|f| f.functions.is_none()));
        let text = table(&compared);
        assert!(text.lines().any(|l| l.starts_with("charge* ")), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("stat* ")), "{text}");
        assert_eq!(
            text.matches(&format!("* charge: {said}")).count(),
            1,
            "{text}"
        );
        let md = markdown(&compared);
        assert!(
            md.contains("| charge* | ") && md.contains(&format!("\\* charge: {said}")),
            "{md}"
        );
        let json = serde_json::to_string(&compared).unwrap();
        assert!(
            json.contains(&format!("\"functions\":\"{said}\"")),
            "{json}"
        );
        assert!(!json.contains("\"backends\""), "{json}");

        // Two builds of one release: the sides are named A and B.
        let mut b1 = b.clone();
        for d in &mut b1 {
            d.meta.kernel_release = "6.1.0-57-amd64".into();
        }

        let c1 = compare(&a, &b1, files("a"), files("b"), 0.05);
        let figure = c1.figures.iter().find(|f| f.probe == "charge").unwrap();
        assert_eq!(
            figure.functions.as_deref(),
            Some(format!("A: {charge_a} -> B: __memcg_slab_post_alloc_hook").as_str())
        );

        // auto took kprobe for stat on B's kernel: its rows say so, the others do not.
        let mut b2 = b.clone();
        for d in &mut b2 {
            let stat = d.probes.iter_mut().find(|p| p.name == "stat").unwrap();
            stat.backend = crate::probes::Backend::Kprobe;
        }

        let compared = compare(&a, &b2, files("a"), files("b"), 0.05);
        assert!(compared
            .figures
            .iter()
            .filter(|f| f.probe == "stat")
            .all(|f| f.backends.as_deref() == Some("fentry -> kprobe") && f.functions.is_none()));
        assert!(compared
            .figures
            .iter()
            .filter(|f| f.probe != "stat")
            .all(|f| f.backends.is_none()));
        let text = table(&compared);
        assert!(
            text.lines().any(|l| l.starts_with("stat* "))
                && text.contains("* stat: traced by fentry -> kprobe (the backend changed"),
            "{text}"
        );
    }

    #[test]
    fn spread_is_the_sample_standard_deviation() {
        let s = Spread::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!(s.mean, 5.0);

        // Sample sd (n - 1): sqrt(32 / 7).
        assert!((s.sd - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert!(Spread::of(&[]).is_none());
        assert_eq!(Spread::of(&[3.0]).unwrap().sd, 0.0);
    }

    #[test]
    fn welch_matches_a_reference_implementation() {
        // scipy.stats.ttest_ind([1, 2, 3, 4], [5, 6, 7, 12], equal_var=False):
        // t = -2.970442628930023, df = 4.0046189376443415, p = 0.04106668924202211.
        let a = Spread::of(&[5.0, 6.0, 7.0, 12.0]).unwrap();
        let b = Spread::of(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        let w = welch(&a, &b).unwrap();
        assert!((w.t - -2.970442628930023).abs() < 1e-9, "{w:?}");
        assert!((w.df - 4.0046189376443415).abs() < 1e-9, "{w:?}");
        assert!((w.p - 0.04106668924202211).abs() < 1e-6, "{w:?}");
    }

    #[test]
    fn counts_every_run_repeated_are_apart_latencies_are_not_told() {
        let (a, b) = (
            Spread::of(&[2.222, 2.222, 2.222]).unwrap(),
            Spread::of(&[0.0, 0.0, 0.0]).unwrap(),
        );
        assert_eq!(welch(&a, &b), None);
        assert_eq!(counts_apart(Unit::CallsPerOp, &a, &b), Some(true));
        assert_eq!(counts_apart(Unit::CallsPerS, &a, &b), Some(true));

        // Percentiles fall on bucket values: equal runs are no evidence of no noise.
        assert_eq!(counts_apart(Unit::Ns, &a, &b), None);

        // One run a side, or the same count both sides: nothing to call.
        let one = Spread::of(&[2.222]).unwrap();
        assert_eq!(counts_apart(Unit::CallsPerOp, &one, &b), None);
        assert_eq!(counts_apart(Unit::CallsPerOp, &a, &a), None);

        // Any spread: Welch decides.
        let noisy = Spread::of(&[2.0, 2.2, 2.4]).unwrap();
        assert_eq!(counts_apart(Unit::CallsPerOp, &noisy, &b), None);
    }

    #[test]
    fn noise_and_a_real_change_are_told_apart() {
        let a = Spread::of(&[100.0, 102.0, 98.0]).unwrap();
        let same = Spread::of(&[101.0, 99.0, 100.5]).unwrap();
        let up = Spread::of(&[113.0, 114.5, 113.8]).unwrap();
        assert!(welch(&a, &same).unwrap().p > 0.5);
        assert!(welch(&a, &up).unwrap().p < 0.01);

        // One run a side: no verdict.
        assert!(welch(&Spread::of(&[1.0]).unwrap(), &up).is_none());

        // No spread at all: equal means are the same, different ones differ.
        let c = Spread::of(&[5.0, 5.0]).unwrap();
        assert_eq!(welch(&c, &c).unwrap().p, 1.0);
        assert!(welch(&c, &Spread::of(&[6.0, 6.0]).unwrap()).is_none());
    }
}
