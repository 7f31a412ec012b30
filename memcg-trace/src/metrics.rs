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

/// The exposition of `doc` (None: nothing traced yet, during start-up: only `memcg_trace_up 0`).
pub fn encode(doc: Option<&Document>, format: Format) -> String {
    let mut registry = Registry::with_prefix("memcg_trace");
    registry.register_collector(Box::new(Figures(doc.cloned().map(Arc::new))));
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
struct Figures(Option<Arc<Document>>);

/// Call-site series per probe and context (`--callers`), the costliest: a bounded label set.
pub const CALLER_SERIES: usize = 10;

/// A row of a breakdown of a probe's calls (call site, memcg): context, name, calls, summed ns.
type Part = (String, String, u64, u64);

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
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        {
            let up = e.encode_descriptor(
                "up",
                "Whether figures are served: the probes are attached (during start-up and shutdown, not)",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(self.0.is_some() as i64).encode(up)?;
        }
        let Some(d) = &self.0 else {
            return Ok(());
        };
        let masks = d
            .meta
            .context_masks
            .as_ref()
            .map(|m| m.source.clone())
            .unwrap_or_else(|| "none".into());
        {
            let mut m = e.encode_descriptor(
                "build",
                "The kernel, its preemption model, memcg-trace's version and where the context masks came from",
                None,
                MetricType::Info,
            )?;
            m.encode_info(&[
                ("kernel_release", d.meta.kernel_release.as_str()),
                ("preemption_model", d.meta.preemption_model.as_str()),
                ("version", d.meta.tool_version.as_str()),
                ("context_masks", masks.as_str()),
            ])?;
        }
        // The rows: the probe's contexts, or (`workload`) its workload row, whose calls are
        // some of the contexts' calls: in families of their own, so that a sum over the
        // contexts' series counts every call once.
        let backends: Vec<String> = d.probes.iter().map(|p| p.backend.to_string()).collect();
        let threads = d.meta.context_masks.as_ref().is_some_and(|m| m.threads);
        let rows = |workload: bool| -> Vec<Row> {
            d.probes
                .iter()
                .zip(&backends)
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
                            unmatched: Some(c.orphans),
                            censored: Some(c.censored),
                            threads: (threads && c.context == "task")
                                .then_some((c.irq_thread, c.softirq_thread)),
                            latency: c.latency.as_ref(),
                        });
                    let w = p
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
                    ctx.chain(w)
                })
                .collect()
        };
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
            &mut e,
            "calls",
            "Calls of the traced function per context (tracepoints: hits), since serve started",
            &|r| Some(r.calls),
        )?;
        counter(
            &mut e,
            "workload_calls",
            "Calls of the workload (its tasks' task-context calls; with --by-memcg, the calls in every context charging its memcg): some of calls_total's, since serve started",
            &|r| Some(r.calls),
        )?;
        counter(
            &mut e,
            "lost",
            "Calls lost in any way the tracer counts",
            &|r| r.lost,
        )?;
        counter(
            &mut e,
            "censored",
            "Calls that left the CPU and are not timed (of the lost): the latency histogram's tail misses them",
            &|r| r.censored,
        )?;
        counter(
            &mut e,
            "unmatched",
            "Exits that found no entry of their own",
            &|r| r.unmatched,
        )?;
        if threads {
            counter(
                &mut e,
                "irq_thread_calls",
                "Task-context calls made by threaded interrupt handlers (irq/*): some of calls_total's task calls (PREEMPT_RT, threadirqs)",
                &|r| r.threads.map(|t| t.0),
            )?;
            counter(
                &mut e,
                "softirq_thread_calls",
                "Task-context calls made by softirq threads (ksoftirqd/N, ktimers/N) outside a softirq handler: some of calls_total's task calls (PREEMPT_RT, threadirqs)",
                &|r| r.threads.map(|t| t.1),
            )?;
        }
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
            let mut m =
                e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
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
        // Call sites (`--callers`) and charged memcgs (`--by-memcg`): the top CALLER_SERIES
        // of each probe and context (by time; counts only: by calls), so that the label set
        // stays bounded (the JSON has every row).
        let callers = |p: &crate::export::ProbeOut| -> Vec<Part> {
            p.callers
                .iter()
                .map(|s| (s.context.clone(), s.site.clone(), s.calls, s.sum_ns))
                .collect()
        };
        let memcgs = |p: &crate::export::ProbeOut| -> Vec<Part> {
            p.memcgs
                .iter()
                .map(|m| (m.context.clone(), m.cgroup.clone(), m.calls, m.sum_ns))
                .collect()
        };
        for (prefix, label, flag, what, parts) in [
            (
                "caller",
                "site",
                "--callers",
                "call site",
                &callers as &dyn Fn(&crate::export::ProbeOut) -> Vec<Part>,
            ),
            ("memcg", "cgroup", "--by-memcg", "charged memcg", &memcgs),
        ] {
            let all: Vec<Vec<Part>> = d.probes.iter().map(parts).collect();
            if all.iter().all(Vec::is_empty) {
                continue;
            }
            // Rows with the same labels (a memcg re-created at one path, two addresses named
            // alike) are one series: merged, in the order of their first.
            let top = |v: &[Part]| -> Vec<Part> {
                let mut out: Vec<Part> = Vec::new();
                for c in crate::export::CTX_ORDER {
                    let mut merged: Vec<Part> = Vec::new();
                    for s in v.iter().filter(|s| s.0 == c) {
                        match merged.iter_mut().find(|m| m.1 == s.1) {
                            Some(m) => {
                                m.2 += s.2;
                                m.3 += s.3;
                            }
                            None => merged.push(s.clone()),
                        }
                    }
                    out.extend(merged.into_iter().take(CALLER_SERIES));
                }
                out
            };
            for (suffix, help, unit, timed) in [
                ("calls", format!("Calls per {what} ({flag}; the top {CALLER_SERIES} by time per probe and context)"), None, false),
                ("latency", format!("Summed latency of the timed calls per {what} ({flag}; the same rows)"), Some(&Unit::Seconds), true),
            ] {
                let name = format!("{prefix}_{suffix}");
                let mut m = e.encode_descriptor(&name, &help, unit, MetricType::Counter)?;
                for ((p, b), v) in d.probes.iter().zip(&backends).zip(&all) {
                    if timed && p.backend.to_string() == "tracepoint" {
                        continue;
                    }
                    for s in top(v) {
                        let labels = [
                            ("probe", p.name.as_str()),
                            ("context", s.0.as_str()),
                            (label, s.1.as_str()),
                            ("backend", b.as_str()),
                        ];
                        let value = if timed { s.3 as f64 / 1e9 } else { s.2 as f64 };
                        ConstCounter::new(value).encode(m.encode_family(&labels)?)?;
                    }
                }
            }
        }
        // The per-probe families' labels, once.
        let probe_labels: Vec<[(&str, &str); 3]> = d
            .probes
            .iter()
            .zip(&backends)
            .map(|(p, b)| {
                [
                    ("probe", p.name.as_str()),
                    ("symbol", p.target.as_str()),
                    ("backend", b.as_str()),
                ]
            })
            .collect();
        {
            let mut m = e.encode_descriptor(
                "recursion_misses",
                "Runs of the probe's programs the kernel skipped (recursion guard)",
                None,
                MetricType::Counter,
            )?;
            for (p, labels) in d.probes.iter().zip(&probe_labels) {
                ConstCounter::new(p.recursion_misses).encode(m.encode_family(labels)?)?;
            }
        }
        {
            // A gauge: live, the kernel's hits are read before the programs' runs, and the
            // figure can fall back as the runs catch up.
            let mut m = e.encode_descriptor(
                "kprobe_skipped_calls",
                "Calls of the probe whose kprobe programs the kernel ran at neither end, at most (bpf_prog_active held: counted by the kernel only from 6.7), kprobe backend",
                None,
                MetricType::Gauge,
            )?;
            for (p, labels) in d.probes.iter().zip(&probe_labels) {
                ConstGauge::new(p.kprobe_skipped as i64).encode(m.encode_family(labels)?)?;
            }
        }
        {
            // Beside the counts, never folded into them: how many calls the figures may lack.
            let mut m = e.encode_descriptor(
                "calls_lost_at_most",
                "Every way a call of the probe can have gone untimed, added up (an upper bound; at the end of a run the calls still pending too)",
                None,
                MetricType::Gauge,
            )?;
            for (p, labels) in d.probes.iter().zip(&probe_labels) {
                ConstGauge::new(p.lost_upper as i64).encode(m.encode_family(labels)?)?;
            }
        }
        let t = &d.meta.tracer;
        {
            let m = e.encode_descriptor(
                "daemon_cpu",
                "CPU time of the memcg-trace daemon since it started tracing",
                Some(&Unit::Seconds),
                MetricType::Counter,
            )?;
            ConstCounter::new(t.cpu_ns as f64 / 1e9).encode(m)?;
        }
        {
            let m = e.encode_descriptor(
                "daemon_peak_rss",
                "Peak resident memory of the memcg-trace daemon",
                Some(&Unit::Bytes),
                MetricType::Gauge,
            )?;
            ConstGauge::new(t.peak_rss_kib as i64 * 1024).encode(m)?;
        }
        if let Some(f) = d
            .meta
            .floors
            .iter()
            .filter_map(|f| f.per_call_ns)
            .reduce(f64::max)
        {
            let m = e.encode_descriptor(
                "tracer_cost_per_call",
                "What one traced call costs in all (programs, trampoline or kprobe), measured at start-up",
                Some(&Unit::Seconds),
                MetricType::Gauge,
            )?;
            ConstGauge::new(f / 1e9).encode(m)?;
        }
        Ok(())
    }
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
        let mut d = fixture();
        d.probes[0].contexts[0].irq_thread = 11;
        d.probes[0].contexts[0].softirq_thread = 5;
        let t = encode(Some(&d), Format::Text);
        assert!(!t.contains("thread_calls"), "{t}");
        d.meta
            .context_masks
            .as_mut()
            .expect("the fixture's masks")
            .threads = true;
        let t = encode(Some(&d), Format::Text);
        for (name, v) in [("irq_thread_calls", 11), ("softirq_thread_calls", 5)] {
            assert!(
                t.contains(&format!("# TYPE memcg_trace_{name}_total counter")),
                "{t}"
            );
            let lines: Vec<&str> = t
                .lines()
                .filter(|l| l.starts_with(&format!("memcg_trace_{name}_total{{")))
                .collect();
            // One series per probe, its task row only.
            assert_eq!(lines.len(), d.probes.len(), "{t}");
            assert!(lines.iter().all(|l| l.contains("context=\"task\"")), "{t}");
            assert!(
                lines.iter().any(|l| l.starts_with(&format!(
                    "memcg_trace_{name}_total{{probe=\"charge\",context=\"task\""
                )) && l.ends_with(&format!(" {v}"))),
                "{t}"
            );
        }
    }

    #[test]
    fn censored_calls_are_served_beside_the_histogram() {
        let mut d = fixture();
        d.probes[0].contexts[0].censored = 7;
        let t = encode(Some(&d), Format::Text);
        assert!(
            t.contains("# TYPE memcg_trace_censored_total counter"),
            "{t}"
        );
        let line = t
            .lines()
            .find(|l| l.starts_with("memcg_trace_censored_total{probe=\"charge\",context=\"task\""))
            .unwrap_or_else(|| panic!("{t}"));
        assert!(line.ends_with(" 7"), "{line}");
        // Its table row marks the tail figures as lower bounds; the others' rows do not.
        let table = crate::table::summary(&d);
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
                let b = buckets(l);
                assert_eq!(b.len(), BUCKET_OCTAVES.count() + 1);
                let all: u64 = l.buckets.iter().map(|x| x.count).sum();
                assert_eq!(
                    b.iter().map(|x| x.1).sum::<u64>(),
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
                let upto: u64 = b.iter().take_while(|x| x.0 <= 1.024e-6).map(|x| x.1).sum();
                assert_eq!(below, upto, "{} {}", p.name, c.context);
            }
        }
    }

    #[test]
    fn call_sites_are_exposed_only_when_traced_and_at_most_the_top_per_context() {
        let mut d = fixture();
        let t = encode(Some(&d), Format::Text);
        assert!(
            !t.contains("memcg_trace_caller_"),
            "no --callers, no series:\n{t}"
        );
        let charge = d.probes.iter_mut().find(|p| p.name == "charge").unwrap();
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
        let t = encode(Some(&d), Format::Text);
        let calls: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("memcg_trace_caller_calls_total{"))
            .collect();
        assert_eq!(calls.len(), CALLER_SERIES, "{t}");
        assert!(
            calls[0].starts_with("memcg_trace_caller_calls_total{probe=\"charge\",context=\"task\",site=\"caller_0+0x10\",backend=\"fentry\"} 1000"),
            "{}",
            calls[0]
        );
        assert!(t.contains("memcg_trace_caller_latency_seconds_total{probe=\"charge\",context=\"task\",site=\"caller_0+0x10\",backend=\"fentry\"} 2"), "{t}");
        assert!(
            !t.contains("caller_14+"),
            "beyond the top {CALLER_SERIES}: {t}"
        );
    }

    #[test]
    fn charged_memcgs_are_exposed_only_when_traced_and_at_most_the_top_per_context() {
        let mut d = fixture();
        assert!(!encode(Some(&d), Format::Text).contains("memcg_trace_memcg_"));
        let charge = d.probes.iter_mut().find(|p| p.name == "charge").unwrap();
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
        let t = encode(Some(&d), Format::Text);
        let calls: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("memcg_trace_memcg_calls_total{"))
            .collect();
        assert_eq!(calls.len(), CALLER_SERIES, "{t}");
        assert!(
            calls[0].starts_with("memcg_trace_memcg_calls_total{probe=\"charge\",context=\"softirq\",cgroup=\"/m0\",backend=\"fentry\"} 500"),
            "{}",
            calls[0]
        );
        assert!(t.contains("memcg_trace_memcg_latency_seconds_total{probe=\"charge\",context=\"softirq\",cgroup=\"/m0\",backend=\"fentry\"} 3"), "{t}");
        assert!(
            !t.contains("cgroup=\"/m12\""),
            "beyond the top {CALLER_SERIES}: {t}"
        );
        // A memcg re-created at one path: one series, the calls of both.
        let charge = d.probes.iter_mut().find(|p| p.name == "charge").unwrap();
        let mut again = charge.memcgs[0].clone();
        again.id = 999;
        again.calls = 7;
        charge.memcgs.push(again);
        let t = encode(Some(&d), Format::Text);
        let m0: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("memcg_trace_memcg_calls_total{") && l.contains("\"/m0\""))
            .collect();
        assert_eq!(m0.len(), 1, "{t}");
        assert!(m0[0].ends_with(" 507.0"), "{}", m0[0]);
        assert!(!t.contains("memcg_trace_caller_"), "{t}");
    }

    #[test]
    fn the_recording_as_prometheus_text() {
        let d = fixture();
        let t = encode(Some(&d), Format::Text);
        assert!(t.contains("# TYPE memcg_trace_calls_total counter"), "{t}");
        // What the counts may lack, beside them.
        let p = &d.probes[0];
        assert!(
            t.contains(&format!(
                "memcg_trace_calls_lost_at_most{{probe=\"{}\",symbol=\"{}\",backend=\"fentry\"}} {}",
                p.name, p.target, p.lost_upper
            )) && t.contains("# TYPE memcg_trace_kprobe_skipped_calls gauge"),
            "{t}"
        );
        let charge = d.probes.iter().find(|p| p.name == "charge").unwrap();
        let task = charge
            .contexts
            .iter()
            .find(|c| c.context == "task")
            .unwrap();
        let line = format!(
            "memcg_trace_calls_total{{probe=\"charge\",context=\"task\",symbol=\"{}\",backend=\"fentry\"}} {}",
            charge.target, task.count
        );
        assert!(t.contains(&line), "{line}\n{t}");
        // Every call once in calls_total, whose series are the contexts': a sum over them
        // is the probe's calls. The workload's calls, some of them, are a family of their own.
        let summed: u64 = t
            .lines()
            .filter(|l| l.starts_with("memcg_trace_calls_total{probe=\"charge\","))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(
            summed,
            charge.contexts.iter().map(|c| c.count).sum::<u64>(),
            "{t}"
        );
        let w = charge
            .workload
            .as_ref()
            .expect("the recording's workload row");
        let line = format!(
            "memcg_trace_workload_calls_total{{probe=\"charge\",symbol=\"{}\",backend=\"fentry\"}} {}",
            charge.target, w.count
        );
        assert!(t.contains(&line), "{line}\n{t}");
        assert!(
            t.contains("memcg_trace_workload_latency_seconds_bucket{"),
            "{t}"
        );
        assert!(!t.contains("context=\"workload\""), "{t}");
        assert!(t.contains("memcg_trace_latency_seconds_bucket{"), "{t}");
        assert!(t.contains("le=\"+Inf\""), "{t}");
        assert!(t.contains("memcg_trace_build_info{"), "{t}");
        assert!(t.lines().any(|l| l == "memcg_trace_up 1"), "{t}");
        assert!(!t.contains("# EOF"), "{t}");
        let om = encode(Some(&d), Format::OpenMetrics);
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
