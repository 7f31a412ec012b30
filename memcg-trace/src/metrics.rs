//! The figures as Prometheus metrics (`memcg-trace serve`): made from the recording's
//! [`Document`], the same path the table and the JSON take, and encoded by `prometheus-client`
//! as the Prometheus text format (0.0.4) or OpenMetrics.
//!
//! Label sets are bounded: probe, context (task, softirq, hardirq, nmi), symbol (the function
//! or tracepoint traced) and backend, a few dozen series per metric at most. The workload's
//! rows, whose calls are some of the contexts', have families of their own (`workload_*`), so
//! that a sum over a family's series counts every call once.
//! The latency histogram's buckets are the octaves of the in-kernel histogram, whose bucket
//! bounds fall on powers of two: each `le` bucket holds exactly the calls shorter than its bound
//! (a call of exactly 2^k ns, which `le` would put in the 2^k bucket, is in the next: the
//! in-kernel buckets are half-open), not an interpolation.

use std::sync::Arc;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _, NoLabelSet},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::{Registry, Unit},
};

use crate::export::{Document, Latency};

/// The histogram's bucket bounds: 2^7 ns (128 ns) to 2^34 ns (17.2 s), one per octave, and
/// +Inf: 29 buckets.
pub const BUCKET_OCTAVES: std::ops::RangeInclusive<u32> = 7..=34;

/// The OpenMetrics content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exposition format a scraper asked for (its `Accept` header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text 0.0.4 (what `promtool check metrics` reads).
    Text,
    /// OpenMetrics 1.0.
    OpenMetrics,
}

impl Format {
    /// From an `Accept` header.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    /// The `Content-Type` of the answer.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS,
        }
    }
}

/// The exposition of `doc` (None: nothing traced yet, during start-up: only `memcg_trace_up 0`),
/// its breakdowns' series chosen from it alone (a scrape of a server keeps its own: [`Listed`]).
pub fn encode(doc: Option<&Document>, format: Format) -> String {
    let mut listed = Listed::default();
    if let Some(d) = doc {
        listed.update(d);
    }

    encode_listed(doc, &listed, format)
}

/// The exposition of `doc` with the breakdowns' series that `listed` holds.
pub fn encode_listed(doc: Option<&Document>, listed: &Listed, format: Format) -> String {
    let mut registry = Registry::with_prefix("memcg_trace");
    registry.register_collector(Box::new(Figures(
        doc.cloned().map(Arc::new),
        listed.clone(),
    )));
    let mut out = String::new();
    let r = match format {
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, &registry),
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry),
    };

    // Writing into a String does not fail.
    r.expect("encode into a String");
    out
}

/// Per bucket (not cumulative) counts at the octave bounds, in seconds, and +Inf.
pub fn buckets(l: &Latency) -> Vec<(f64, u64)> {
    let mut out: Vec<(f64, u64)> = BUCKET_OCTAVES
        .map(|k| ((1u64 << k) as f64 / 1e9, 0))
        .collect();
    out.push((f64::INFINITY, 0));
    for b in &l.buckets {
        // In-kernel buckets never straddle an octave bound: all of it is below the first
        // bound above its lower end.
        let i = BUCKET_OCTAVES
            .clone()
            .position(|k| b.min_ns < (1u64 << k) && b.max_ns <= (1u64 << k))
            .unwrap_or(out.len() - 1);
        out[i].1 += b.count;
    }
    out
}

#[derive(Debug)]
struct Figures(Option<Arc<Document>>, Listed);

/// A breakdown's row joins the series while among this many of its probe and context, the
/// costliest (by time; counts only: by calls).
pub const CALLER_SERIES: usize = 10;

/// At most this many series per breakdown, probe and context: a bounded label set.
pub const LISTED_MAX: usize = 4 * CALLER_SERIES;

/// A breakdown of a probe's calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Breakdown {
    /// By call site (`--callers`).
    Callers,
    /// By charged memcg (`--by-memcg`).
    Memcgs,
}

/// The breakdowns, in the exposition's order.
const BREAKDOWNS: [Breakdown; 2] = [Breakdown::Callers, Breakdown::Memcgs];

impl Breakdown {
    /// Its families' prefix.
    fn family(self) -> &'static str {
        match self {
            Breakdown::Callers => "caller",
            Breakdown::Memcgs => "memcg",
        }
    }

    /// The label of its rows.
    fn label(self) -> &'static str {
        match self {
            Breakdown::Callers => "site",
            Breakdown::Memcgs => "cgroup",
        }
    }

    /// The option that makes it.
    fn flag(self) -> &'static str {
        match self {
            Breakdown::Callers => "--callers",
            Breakdown::Memcgs => "--by-memcg",
        }
    }

    /// What a row is.
    fn what(self) -> &'static str {
        match self {
            Breakdown::Callers => "call site",
            Breakdown::Memcgs => "charged memcg",
        }
    }

    /// A probe's rows, in the recording's order (the costliest first).
    fn rows(self, p: &crate::export::ProbeOut) -> Vec<BreakdownRow<'_>> {
        match self {
            Breakdown::Callers => p
                .callers
                .iter()
                .map(|s| BreakdownRow {
                    context: &s.context,
                    label: &s.site,
                    calls: s.calls,
                    sum_ns: s.sum_ns,
                })
                .collect(),
            Breakdown::Memcgs => p
                .memcgs
                .iter()
                .map(|m| BreakdownRow {
                    context: &m.context,
                    label: &m.cgroup,
                    calls: m.calls,
                    sum_ns: m.sum_ns,
                })
                .collect(),
        }
    }

    /// The calls of a context's row that found no room in the kernel's map.
    fn other(self, c: &crate::export::ContextOut) -> u64 {
        match self {
            Breakdown::Callers => c.callers_other,
            Breakdown::Memcgs => c.memcgs_other,
        }
    }
}

/// A row of a breakdown of a probe.
struct BreakdownRow<'a> {
    context: &'a str,
    /// The label's value: the call site, the memcg's path.
    label: &'a str,
    calls: u64,
    sum_ns: u64,
}

/// A context's rows of one label merged (see [`merged`]).
struct Merged<'a> {
    label: &'a str,
    calls: u64,
    sum_ns: u64,
}

/// The rows of one context, those with the same label (a memcg re-created at one path, two
/// addresses named alike) merged into the first. None: no row.
fn merged<'a>(rows: &[BreakdownRow<'a>], context: &str) -> Option<Vec<Merged<'a>>> {
    let mut out: Vec<Merged> = Vec::new();
    for r in rows.iter().filter(|r| r.context == context) {
        match out.iter_mut().find(|m| m.label == r.label) {
            Some(m) => {
                m.calls += r.calls;
                m.sum_ns += r.sum_ns;
            }
            None => out.push(Merged {
                label: r.label,
                calls: r.calls,
                sum_ns: r.sum_ns,
            }),
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Which rows of the breakdowns (`--callers`, `--by-memcg`) are series, and their last
/// figures. Prometheus computes `rate()` and `increase()` per series: a series that came and
/// went with the ranking would be read as a counter reset or a gap. So a row that became a
/// series stays one for the rest of the run, at its last figures if it leaves the recording;
/// a row joins while among the top [`CALLER_SERIES`] of its probe and context, until that has
/// [`LISTED_MAX`]. What the series leave out is a gauge of its own (`*_unlisted_calls`).
#[derive(Clone, Debug, Default)]
pub struct Listed {
    /// (breakdown, probe, context, label value) -> (calls, summed ns).
    rows: std::collections::BTreeMap<(Breakdown, String, &'static str, String), (u64, u64)>,
}

impl Listed {
    /// Takes in a newer recording: its top rows join, every series takes its figures (never
    /// lower than before: the breakdowns only grow).
    pub fn update(&mut self, d: &Document) {
        for breakdown in BREAKDOWNS {
            for p in &d.probes {
                let rows = breakdown.rows(p);
                for c in crate::export::CTX_ORDER {
                    let Some(v) = merged(&rows, c) else { continue };
                    let mut listed = self
                        .series(breakdown, &p.name)
                        .filter(|((x, _), _)| *x == c)
                        .count();
                    for (i, m) in v.into_iter().enumerate() {
                        let key = (breakdown, p.name.clone(), c, m.label.to_string());
                        match self.rows.get_mut(&key) {
                            Some(f) => *f = (f.0.max(m.calls), f.1.max(m.sum_ns)),
                            None if i < CALLER_SERIES && listed < LISTED_MAX => {
                                self.rows.insert(key, (m.calls, m.sum_ns));
                                listed += 1;
                            }
                            None => {}
                        }
                    }
                }
            }
        }
    }

    /// Whether a breakdown's row is a series.
    fn has(&self, breakdown: Breakdown, probe: &str, context: &'static str, label: &str) -> bool {
        self.rows
            .contains_key(&(breakdown, probe.to_string(), context, label.to_string()))
    }

    /// A breakdown's series of a probe: (context, label value) and (calls, summed ns).
    fn series<'a>(
        &'a self,
        breakdown: Breakdown,
        probe: &'a str,
    ) -> impl Iterator<Item = ((&'a str, &'a str), &'a (u64, u64))> + 'a {
        self.rows
            .iter()
            .filter(move |(k, _)| k.0 == breakdown && k.1 == probe)
            .map(|(k, v)| ((k.2, k.3.as_str()), v))
    }
}

/// One row's series: its labels and figures (lost, unmatched, censored: None for workload rows).
struct Row<'a> {
    labels: Vec<(&'static str, &'a str)>,
    calls: u64,
    lost: Option<u64>,
    unmatched: Option<u64>,
    censored: Option<u64>,
    /// Task rows where threads do interrupt work: the calls of threaded interrupt handlers and
    /// of softirq threads among them.
    threads: Option<(u64, u64)>,
    latency: Option<&'a Latency>,
}

impl Collector for Figures {
    /// The families in steps: whether figures are served, the build, each probe's rows, the
    /// breakdowns' series, the per-probe families, the daemon's cost.
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_up(&mut e, self.0.is_some())?;
        let Some(d) = &self.0 else {
            return Ok(());
        };
        encode_build(&mut e, d)?;
        let backends: Vec<String> = d.probes.iter().map(|p| p.backend.to_string()).collect();
        encode_rows(&mut e, d, &backends)?;
        encode_breakdowns(&mut e, d, &self.1, &backends)?;
        encode_probe_families(&mut e, d, &backends)?;
        encode_daemon(&mut e, d)
    }
}

type Encoded = Result<(), std::fmt::Error>;

/// `up`: whether the probes are attached.
fn encode_up(e: &mut DescriptorEncoder, served: bool) -> Encoded {
    {
        let up = e.encode_descriptor(
            "up",
            "Whether figures are served: the probes are attached (during start-up and shutdown, not)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(served as i64).encode(up)?;
    }
    Ok(())
}

/// `build`: the kernel, its preemption model, the version, the context masks' source.
fn encode_build(e: &mut DescriptorEncoder, d: &Document) -> Encoded {
    let masks = d
        .meta
        .context_masks
        .as_ref()
        .map(|m| m.source.clone())
        .unwrap_or_else(|| "none".into());
    {
        let mut build = e.encode_descriptor(
            "build",
            "The kernel, its preemption model, memcg-trace's version and where the context masks came from",
            None,
            MetricType::Info,
        )?;
        build.encode_info(&[
            ("kernel_release", d.meta.kernel_release.as_str()),
            ("preemption_model", d.meta.preemption_model.as_str()),
            ("version", d.meta.tool_version.as_str()),
            ("context_masks", masks.as_str()),
        ])?;
    }
    Ok(())
}

/// Each probe's rows by context, and its workload row: counters and latency histograms.
fn encode_rows(e: &mut DescriptorEncoder, d: &Document, backends: &[String]) -> Encoded {
    let threads = d.meta.context_masks.as_ref().is_some_and(|m| m.threads);
    let rows = |workload: bool| rows_of(d, backends, workload, threads);
    encode_row_counters(e, &rows, threads)?;
    encode_row_latencies(e, &rows)
}

/// The rows: the probe's contexts, or (`workload`) its workload row, whose calls are some of
/// the contexts' calls: in families of their own, so that a sum over the contexts' series
/// counts every call once. `threads`: the task rows carry the interrupt threads' calls.
fn rows_of<'a>(
    d: &'a Document,
    backends: &'a [String],
    workload: bool,
    threads: bool,
) -> Vec<Row<'a>> {
    d.probes
        .iter()
        .zip(backends)
        .flat_map(|(p, b)| {
            let ctx = p
                .contexts
                .iter()
                .filter(move |_| !workload)
                .map(move |c| Row {
                    labels: vec![
                        ("probe", p.name.as_str()),
                        ("context", c.context.as_str()),
                        ("symbol", p.target.as_str()),
                        ("backend", b.as_str()),
                    ],
                    calls: c.count,
                    lost: Some(c.lost),
                    // Exits without their own entry: the evicted calls' too.
                    unmatched: Some(c.orphans + c.evicted_exits),
                    censored: Some(c.censored),
                    // The task row (`all` without the context split).
                    threads: (threads && crate::kernel::ctx_index(&c.context) == Some(0))
                        .then_some((c.irq_thread, c.softirq_thread)),
                    latency: c.latency.as_ref(),
                });
            let workload_rows = p
                .workload
                .iter()
                .filter(move |_| workload)
                .map(move |w| Row {
                    labels: vec![
                        ("probe", p.name.as_str()),
                        ("symbol", p.target.as_str()),
                        ("backend", b.as_str()),
                    ],
                    calls: w.count,
                    lost: None,
                    unmatched: None,
                    censored: None,
                    threads: None,
                    latency: w.latency.as_ref(),
                });
            ctx.chain(workload_rows)
        })
        .collect()
}

/// The rows' counters: calls, the workload's calls, lost, censored, unmatched, and where
/// threads do interrupt work the threads' calls. `rows(workload)`: see [`rows_of`].
fn encode_row_counters<'a>(
    e: &mut DescriptorEncoder,
    rows: &dyn Fn(bool) -> Vec<Row<'a>>,
    threads: bool,
) -> Encoded {
    let counter = |e: &mut DescriptorEncoder,
                   name: &str,
                   help: &str,
                   f: &dyn Fn(&Row) -> Option<u64>|
     -> Result<(), std::fmt::Error> {
        let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
        for r in rows(name.starts_with("workload_")) {
            if let Some(v) = f(&r) {
                ConstCounter::new(v).encode(m.encode_family(&r.labels)?)?;
            }
        }
        Ok(())
    };
    counter(
        e,
        "calls",
        "Calls of the traced function per context (tracepoints: hits), since serve started",
        &|r| Some(r.calls),
    )?;
    counter(
        e,
        "workload_calls",
        "Calls of the workload (its tasks' task-context calls; with --by-memcg, the calls in every context charging its memcg): some of calls_total's, since serve started",
        &|r| Some(r.calls),
    )?;
    counter(e, "lost", "Calls lost in any way the tracer counts", &|r| {
        r.lost
    })?;
    counter(
        e,
        "censored",
        "Calls that left the CPU and are not timed (of the lost): the latency histogram's tail misses them",
        &|r| r.censored,
    )?;
    counter(
        e,
        "unmatched",
        "Exits that found no entry of their own",
        &|r| r.unmatched,
    )?;
    if threads {
        counter(
            e,
            "irq_thread_calls",
            "Task-context calls made by threaded interrupt handlers (irq/*): some of calls_total's task calls (PREEMPT_RT, threadirqs)",
            &|r| r.threads.map(|t| t.0),
        )?;
        counter(
            e,
            "softirq_thread_calls",
            "Task-context calls made by softirq threads (ksoftirqd/N, ktimers/N) outside a softirq handler: some of calls_total's task calls (PREEMPT_RT, threadirqs)",
            &|r| r.threads.map(|t| t.1),
        )?;
    }
    Ok(())
}

/// The rows' latency histograms, per context and the workload's.
fn encode_row_latencies<'a>(
    e: &mut DescriptorEncoder,
    rows: &dyn Fn(bool) -> Vec<Row<'a>>,
) -> Encoded {
    for (name, help, workload) in [
        (
            "latency",
            "Latency of the calls timed, entry to exit (wall clock), per context",
            false,
        ),
        (
            "workload_latency",
            "Latency of the workload's calls timed, entry to exit (wall clock)",
            true,
        ),
    ] {
        let mut m = e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
        for r in rows(workload) {
            if let Some(l) = r.latency {
                let b = buckets(l);
                let count = b.iter().map(|x| x.1).sum();
                m.encode_family(&r.labels)?.encode_histogram::<NoLabelSet>(
                    l.sum_ns as f64 / 1e9,
                    count,
                    &b,
                    None,
                )?;
            }
        }
    }
    Ok(())
}

/// Call sites (`--callers`) and charged memcgs (`--by-memcg`): the rows `listed` made series
/// (a bounded label set: the JSON has every row), and per probe and context the calls of the
/// rows that are not.
fn encode_breakdowns(
    e: &mut DescriptorEncoder,
    d: &Document,
    listed: &Listed,
    backends: &[String],
) -> Encoded {
    for breakdown in BREAKDOWNS {
        let (family, label, flag, what) = (
            breakdown.family(),
            breakdown.label(),
            breakdown.flag(),
            breakdown.what(),
        );
        if d.probes.iter().all(|p| breakdown.rows(p).is_empty()) {
            continue;
        }

        for (suffix, help, unit, timed) in [
            ("calls", format!("Calls per {what} ({flag}; a row becomes a series while among the top {CALLER_SERIES} of its probe and context, by time (counts only: by calls), and stays one for the run; at most {LISTED_MAX} series each, after which no row joins)"), None, false),
            ("latency", format!("Summed latency of the timed calls per {what} ({flag}; the same rows)"), Some(&Unit::Seconds), true),
        ] {
            let name = format!("{family}_{suffix}");
            let mut counter = e.encode_descriptor(&name, &help, unit, MetricType::Counter)?;
            for (p, b) in d.probes.iter().zip(backends) {
                if timed && !p.backend.has_latency() {
                    continue;
                }

                for ((context, value), &(calls, sum_ns)) in listed.series(breakdown, &p.name) {
                    let labels = [
                        ("probe", p.name.as_str()),
                        ("context", context),
                        (label, value),
                        ("backend", b.as_str()),
                    ];
                    let v = if timed { sum_ns as f64 / 1e9 } else { calls as f64 };
                    ConstCounter::new(v).encode(counter.encode_family(&labels)?)?;
                }
            }
        }

        // A gauge: a row that becomes a series takes its calls out of it.
        let (name, help) = (
            format!("{family}_unlisted_calls"),
            format!("Calls of the {what}s that are no series of {family}_calls_total, and those that found no room in the kernel's map ({flag}): with them, the series of a probe and context sum to its calls"),
        );
        let mut gauge = e.encode_descriptor(&name, &help, None, MetricType::Gauge)?;
        for (p, b) in d.probes.iter().zip(backends) {
            for c in crate::export::CTX_ORDER {
                // The calls that found no room in the kernel's map (its `other` row) too.
                let other = p
                    .contexts
                    .iter()
                    .filter(|x| x.context == c)
                    .map(|x| breakdown.other(x))
                    .sum::<u64>();
                let rows = merged(&breakdown.rows(p), c).unwrap_or_default();
                if rows.is_empty() && other == 0 {
                    continue;
                }

                let unlisted: u64 = other
                    + rows
                        .iter()
                        .filter(|r| !listed.has(breakdown, &p.name, c, r.label))
                        .map(|r| r.calls)
                        .sum::<u64>();
                let labels = [
                    ("probe", p.name.as_str()),
                    ("context", c),
                    ("backend", b.as_str()),
                ];
                ConstGauge::new(unlisted as i64).encode(gauge.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

/// The per-probe families: recursion misses, kprobe runs skipped, calls lost at most.
fn encode_probe_families(e: &mut DescriptorEncoder, d: &Document, backends: &[String]) -> Encoded {
    // The per-probe families' labels, once.
    let probe_labels: Vec<[(&str, &str); 3]> = d
        .probes
        .iter()
        .zip(backends)
        .map(|(p, b)| {
            [
                ("probe", p.name.as_str()),
                ("symbol", p.target.as_str()),
                ("backend", b.as_str()),
            ]
        })
        .collect();
    {
        let mut misses = e.encode_descriptor(
            "recursion_misses",
            "Runs of the probe's programs the kernel skipped (recursion guard)",
            None,
            MetricType::Counter,
        )?;
        for (p, labels) in d.probes.iter().zip(&probe_labels) {
            ConstCounter::new(p.recursion_misses).encode(misses.encode_family(labels)?)?;
        }
    }
    {
        // A gauge: live, the kernel's hits are read before the programs' runs, and the
        // figure can fall back as the runs catch up.
        let mut skipped = e.encode_descriptor(
            "kprobe_skipped_calls",
            "Calls of the probe whose kprobe programs the kernel ran at neither end, at most (bpf_prog_active held: counted by the kernel only from 6.7), kprobe backend",
            None,
            MetricType::Gauge,
        )?;
        for (p, labels) in d.probes.iter().zip(&probe_labels) {
            ConstGauge::new(p.kprobe_skipped as i64).encode(skipped.encode_family(labels)?)?;
        }
    }
    {
        // Beside the counts, never folded into them: how many calls the figures may lack.
        let mut lost_at_most = e.encode_descriptor(
            "calls_lost_at_most",
            "Every way a call of the probe can have gone untimed, added up (an upper bound; at the end of a run the calls still pending too)",
            None,
            MetricType::Gauge,
        )?;
        for (p, labels) in d.probes.iter().zip(&probe_labels) {
            ConstGauge::new(p.lost_upper as i64).encode(lost_at_most.encode_family(labels)?)?;
        }
    }
    Ok(())
}

/// The daemon's CPU time and peak memory, and what a traced call costs.
fn encode_daemon(e: &mut DescriptorEncoder, d: &Document) -> Encoded {
    let tracer = &d.meta.tracer;
    {
        let cpu = e.encode_descriptor(
            "daemon_cpu",
            "CPU time of the memcg-trace daemon since it started tracing",
            Some(&Unit::Seconds),
            MetricType::Counter,
        )?;
        ConstCounter::new(tracer.cpu_ns as f64 / 1e9).encode(cpu)?;
    }
    {
        let peak_rss = e.encode_descriptor(
            "daemon_peak_rss",
            "Peak resident memory of the memcg-trace daemon",
            Some(&Unit::Bytes),
            MetricType::Gauge,
        )?;
        ConstGauge::new(tracer.peak_rss_kib as i64 * 1024).encode(peak_rss)?;
    }

    if let Some(f) = d
        .meta
        .floors
        .iter()
        .filter_map(|f| f.per_call_ns)
        .reduce(f64::max)
    {
        let cost = e.encode_descriptor(
            "tracer_cost_per_call",
            "What one traced call costs in all (programs, trampoline or kprobe), measured at start-up",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        ConstGauge::new(f / 1e9).encode(cost)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Document {
        crate::export::read(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/6.12-fentry.json"
        )))
        .expect("the committed recording")
    }

    /// Where threads do interrupt work, the task rows' calls of interrupt and softirq threads
    /// are served; elsewhere (where they are not counted) no such family is.
    #[test]
    fn thread_calls_are_served_where_they_are_counted() {
        let mut doc = fixture();
        doc.probes[0].contexts[0].irq_thread = 11;
        doc.probes[0].contexts[0].softirq_thread = 5;
        let text = encode(Some(&doc), Format::Text);
        assert!(!text.contains("thread_calls"), "{text}");
        doc.meta
            .context_masks
            .as_mut()
            .expect("the fixture's masks")
            .threads = true;
        let text = encode(Some(&doc), Format::Text);
        for (name, v) in [("irq_thread_calls", 11), ("softirq_thread_calls", 5)] {
            assert!(
                text.contains(&format!("# TYPE memcg_trace_{name}_total counter")),
                "{text}"
            );
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("memcg_trace_{name}_total{{")))
                .collect();
            // One series per probe, its task row only.
            assert_eq!(lines.len(), doc.probes.len(), "{text}");
            assert!(
                lines.iter().all(|l| l.contains("context=\"task\"")),
                "{text}"
            );
            assert!(
                lines.iter().any(|l| l.starts_with(&format!(
                    "memcg_trace_{name}_total{{probe=\"charge\",context=\"task\""
                )) && l.ends_with(&format!(" {v}"))),
                "{text}"
            );
        }

        // Without the context split the task calls are in the row named `all`.
        let mut all = doc.clone();
        for p in &mut all.probes {
            p.contexts.retain(|c| c.context == "task");
            p.contexts[0].context = "all".into();
        }

        let t = encode(Some(&all), Format::Text);
        assert!(
            t.lines().any(|l| l.starts_with(
                "memcg_trace_irq_thread_calls_total{probe=\"charge\",context=\"all\""
            ) && l.ends_with(" 11")),
            "{t}"
        );
    }

    #[test]
    fn censored_calls_are_served_beside_the_histogram() {
        let mut doc = fixture();
        doc.probes[0].contexts[0].censored = 7;
        let text = encode(Some(&doc), Format::Text);
        assert!(
            text.contains("# TYPE memcg_trace_censored_total counter"),
            "{text}"
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("memcg_trace_censored_total{probe=\"charge\",context=\"task\""))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.ends_with(" 7"), "{line}");

        // Its table row marks the tail figures as lower bounds; the others' rows do not.
        let table = crate::table::summary(&doc);
        let row = table
            .lines()
            .find(|l| l.starts_with("charge") && l.contains(" task "))
            .unwrap();
        assert_eq!(row.matches(">=").count(), 4, "{row}");
        assert!(
            !table
                .lines()
                .filter(|l| l.starts_with("stat "))
                .any(|l| l.contains(">=")),
            "{table}"
        );
    }

    #[test]
    fn buckets_hold_every_call_at_exact_octave_bounds() {
        let d = fixture();
        for p in &d.probes {
            for c in &p.contexts {
                let Some(l) = &c.latency else { continue };
                let exposed = buckets(l);
                assert_eq!(exposed.len(), BUCKET_OCTAVES.count() + 1);
                let all: u64 = l.buckets.iter().map(|x| x.count).sum();
                assert_eq!(
                    exposed.iter().map(|x| x.1).sum::<u64>(),
                    all,
                    "{} {}",
                    p.name,
                    c.context
                );

                // The calls below 1.024 us by the in-kernel buckets, and by the exposition.
                let below: u64 = l
                    .buckets
                    .iter()
                    .filter(|x| x.max_ns <= 1024)
                    .map(|x| x.count)
                    .sum();
                let upto: u64 = exposed
                    .iter()
                    .take_while(|x| x.0 <= 1.024e-6)
                    .map(|x| x.1)
                    .sum();
                assert_eq!(below, upto, "{} {}", p.name, c.context);
            }
        }
    }

    #[test]
    fn call_sites_are_exposed_only_when_traced_and_at_most_the_top_per_context() {
        let mut doc = fixture();
        let text = encode(Some(&doc), Format::Text);
        assert!(
            !text.contains("memcg_trace_caller_"),
            "no --callers, no series:\n{text}"
        );
        let charge = doc.probes.iter_mut().find(|p| p.name == "charge").unwrap();
        charge.callers = (0..CALLER_SERIES as u64 + 5)
            .map(|i| crate::export::CallerOut {
                context: "task".into(),
                site: format!("caller_{i}+0x10"),
                address: format!("{:#x}", 0xffff_ffff_8100_0000u64 + i),
                calls: 1000 - i,
                share_of_calls: None,
                sum_ns: 2_000_000_000 - i,
                share_of_time: None,
                p50_ns: None,
                p99_ns: None,
                buckets: Vec::new(),
            })
            .collect();
        let text = encode(Some(&doc), Format::Text);
        let calls: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("memcg_trace_caller_calls_total{"))
            .collect();
        assert_eq!(calls.len(), CALLER_SERIES, "{text}");
        assert!(
            calls[0].starts_with("memcg_trace_caller_calls_total{probe=\"charge\",context=\"task\",site=\"caller_0+0x10\",backend=\"fentry\"} 1000"),
            "{}",
            calls[0]
        );
        assert!(text.contains("memcg_trace_caller_latency_seconds_total{probe=\"charge\",context=\"task\",site=\"caller_0+0x10\",backend=\"fentry\"} 2"), "{text}");
        assert!(
            !text.contains("caller_14+"),
            "beyond the top {CALLER_SERIES}: {text}"
        );
    }

    /// The calls of `name`'s series whose line contains `having`, by their label line.
    fn series_of(t: &str, name: &str, having: &str) -> Vec<(String, f64)> {
        t.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(having))
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn a_served_breakdown_row_stays_a_series_once_it_is_one_and_the_rest_is_told() {
        let caller = |i: u64, calls: u64| crate::export::CallerOut {
            context: "task".into(),
            site: format!("caller_{i}+0x10"),
            address: format!("{:#x}", 0xffff_ffff_8100_0000u64 + i),
            calls,
            share_of_calls: None,
            sum_ns: calls * 1000,
            share_of_time: None,
            p50_ns: None,
            p99_ns: None,
            buckets: Vec::new(),
        };
        let mut doc = fixture();
        let charge = doc.probes.iter_mut().find(|p| p.name == "charge").unwrap();

        // 15 sites, the costliest first, as the recording orders them.
        charge.callers = (0..15).map(|i| caller(i, 1000 - i)).collect();
        let mut listed = Listed::default();
        listed.update(&doc);
        let t1 = encode_listed(Some(&doc), &listed, Format::Text);
        let first = series_of(&t1, "memcg_trace_caller_calls_total", "probe=\"charge\"");
        assert_eq!(first.len(), CALLER_SERIES, "{t1}");
        let unlisted = "memcg_trace_caller_unlisted_calls{probe=\"charge\",context=\"task\",backend=\"fentry\"}";
        let rest: u64 = (CALLER_SERIES as u64..15).map(|i| 1000 - i).sum();
        assert!(
            t1.contains(&format!("{unlisted} {rest}")),
            "{unlisted} {rest}\n{t1}"
        );

        // Later the ranking turns: caller_14 becomes the costliest and caller_0 has left the
        // recording. Every series of the first scrape is still served (caller_0 at its last
        // figure), caller_14 joins, and the rest is still told.
        let charge = doc.probes.iter_mut().find(|p| p.name == "charge").unwrap();
        charge.callers = std::iter::once(caller(14, 5000))
            .chain((1..14).map(|i| caller(i, 1000 - i)))
            .collect();
        listed.update(&doc);
        let t2 = encode_listed(Some(&doc), &listed, Format::Text);
        let second = series_of(&t2, "memcg_trace_caller_calls_total", "probe=\"charge\"");
        for (k, v) in &first {
            assert!(
                second.iter().any(|(k2, v2)| k2 == k && v2 >= v),
                "{k} {v} went away or back:\n{t2}"
            );
        }

        assert_eq!(second.len(), CALLER_SERIES + 1, "{t2}");
        assert!(
            second
                .iter()
                .any(|(k, v)| k.contains("caller_14+") && *v == 5000.0),
            "{t2}"
        );
        let told: u64 = (CALLER_SERIES as u64..14).map(|i| 1000 - i).sum();
        assert!(
            t2.contains(&format!("{unlisted} {told}")),
            "{unlisted} {told}\n{t2}"
        );

        // Calls that found no room in the kernel's map are told with the rest.
        let task = doc.probes.iter_mut().find(|p| p.name == "charge").unwrap();
        task.contexts
            .iter_mut()
            .find(|c| c.context == "task")
            .unwrap()
            .callers_other = 77;
        let t2b = encode_listed(Some(&doc), &listed, Format::Text);
        assert!(
            t2b.contains(&format!("{unlisted} {}", told + 77)),
            "{unlisted} {}\n{t2b}",
            told + 77
        );

        // The label set stays bounded: new sites join at most LISTED_MAX a context.
        for round in 0..10u64 {
            let charge = doc.probes.iter_mut().find(|p| p.name == "charge").unwrap();
            charge.callers = (0..CALLER_SERIES as u64)
                .map(|i| caller(100 + round * 100 + i, 10_000 + round * 100 - i))
                .collect();
            listed.update(&doc);
        }

        let t3 = encode_listed(Some(&doc), &listed, Format::Text);
        let third = series_of(&t3, "memcg_trace_caller_calls_total", "probe=\"charge\"");
        assert_eq!(third.len(), LISTED_MAX, "{t3}");

        // A server that chose nothing yet (stateless `encode`): the top of this recording.
        let fresh = encode(Some(&doc), Format::Text);
        assert_eq!(
            series_of(&fresh, "memcg_trace_caller_calls_total", "probe=\"charge\"").len(),
            CALLER_SERIES,
            "{fresh}"
        );
    }

    #[test]
    fn charged_memcgs_are_exposed_only_when_traced_and_at_most_the_top_per_context() {
        let mut doc = fixture();
        assert!(!encode(Some(&doc), Format::Text).contains("memcg_trace_memcg_"));
        let charge = doc.probes.iter_mut().find(|p| p.name == "charge").unwrap();
        charge.memcgs = (0..CALLER_SERIES as u64 + 3)
            .map(|i| crate::export::MemcgOut {
                context: "softirq".into(),
                cgroup: format!("/m{i}"),
                id: 100 + i,
                calls: 500 - i,
                share_of_calls: None,
                sum_ns: 3_000_000_000 - i,
                share_of_time: None,
                p50_ns: None,
                p99_ns: None,
                buckets: Vec::new(),
            })
            .collect();
        let text = encode(Some(&doc), Format::Text);
        let calls: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("memcg_trace_memcg_calls_total{"))
            .collect();
        assert_eq!(calls.len(), CALLER_SERIES, "{text}");
        assert!(
            calls[0].starts_with("memcg_trace_memcg_calls_total{probe=\"charge\",context=\"softirq\",cgroup=\"/m0\",backend=\"fentry\"} 500"),
            "{}",
            calls[0]
        );
        assert!(text.contains("memcg_trace_memcg_latency_seconds_total{probe=\"charge\",context=\"softirq\",cgroup=\"/m0\",backend=\"fentry\"} 3"), "{text}");
        assert!(
            !text.contains("cgroup=\"/m12\""),
            "beyond the top {CALLER_SERIES}: {text}"
        );

        // A memcg re-created at one path: one series, the calls of both.
        let charge = doc.probes.iter_mut().find(|p| p.name == "charge").unwrap();
        let mut again = charge.memcgs[0].clone();
        again.id = 999;
        again.calls = 7;
        charge.memcgs.push(again);
        let text = encode(Some(&doc), Format::Text);
        let m0: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("memcg_trace_memcg_calls_total{") && l.contains("\"/m0\""))
            .collect();
        assert_eq!(m0.len(), 1, "{text}");
        assert!(m0[0].ends_with(" 507.0"), "{}", m0[0]);
        assert!(!text.contains("memcg_trace_caller_"), "{text}");
    }

    #[test]
    fn the_recording_as_prometheus_text() {
        let doc = fixture();
        let text = encode(Some(&doc), Format::Text);
        assert!(
            text.contains("# TYPE memcg_trace_calls_total counter"),
            "{text}"
        );

        // What the counts may lack, beside them.
        let probe = &doc.probes[0];
        assert!(
            text.contains(&format!(
                "memcg_trace_calls_lost_at_most{{probe=\"{}\",symbol=\"{}\",backend=\"fentry\"}} {}",
                probe.name, probe.target, probe.lost_upper
            )) && text.contains("# TYPE memcg_trace_kprobe_skipped_calls gauge"),
            "{text}"
        );
        let charge = doc.probes.iter().find(|p| p.name == "charge").unwrap();
        let task = charge
            .contexts
            .iter()
            .find(|c| c.context == "task")
            .unwrap();
        let line = format!(
            "memcg_trace_calls_total{{probe=\"charge\",context=\"task\",symbol=\"{}\",backend=\"fentry\"}} {}",
            charge.target, task.count
        );
        assert!(text.contains(&line), "{line}\n{text}");

        // Every call once in calls_total, whose series are the contexts': a sum over them
        // is the probe's calls. The workload's calls, some of them, are a family of their own.
        let summed: u64 = text
            .lines()
            .filter(|l| l.starts_with("memcg_trace_calls_total{probe=\"charge\","))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(
            summed,
            charge.contexts.iter().map(|c| c.count).sum::<u64>(),
            "{text}"
        );
        let workload = charge
            .workload
            .as_ref()
            .expect("the recording's workload row");
        let line = format!(
            "memcg_trace_workload_calls_total{{probe=\"charge\",symbol=\"{}\",backend=\"fentry\"}} {}",
            charge.target, workload.count
        );
        assert!(text.contains(&line), "{line}\n{text}");
        assert!(
            text.contains("memcg_trace_workload_latency_seconds_bucket{"),
            "{text}"
        );
        assert!(!text.contains("context=\"workload\""), "{text}");
        assert!(
            text.contains("memcg_trace_latency_seconds_bucket{"),
            "{text}"
        );
        assert!(text.contains("le=\"+Inf\""), "{text}");
        assert!(text.contains("memcg_trace_build_info{"), "{text}");
        assert!(text.lines().any(|l| l == "memcg_trace_up 1"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
        let om = encode(Some(&doc), Format::OpenMetrics);
        assert!(om.ends_with("# EOF\n"), "{om}");
        let starting = encode(None, Format::Text);
        assert!(
            starting.lines().any(|l| l == "memcg_trace_up 0"),
            "{starting}"
        );
        assert_eq!(
            starting.lines().filter(|l| !l.starts_with('#')).count(),
            1,
            "{starting}"
        );
    }
}
