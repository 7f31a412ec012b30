//! The text tables: the summary printed by `record` and `report`, and the A/B comparison of
//! `diff`. Built from the JSON document types, so that a recording and a live run print the same
//! thing.

use std::fmt::Write as _;

use crate::{
    export::{Document, Latency, Quantile},
    figures,
    units::{fmt_count, fmt_ns, pct_change},
};

fn pct(qs: &[Quantile], q: f64) -> String {
    qs.iter()
        .find(|x| (x.q - q).abs() < 1e-9)
        .map(|x| fmt_ns(x.ns as f64))
        .unwrap_or_else(|| "-".into())
}

const HEADER: [&str; 16] = [
    "probe",
    "context",
    "backend",
    "calls",
    "calls/s",
    "p50",
    "p50-floor",
    "p90",
    "p99",
    "p99.9",
    "max",
    "mean",
    "total",
    "self",
    "%cpu",
    "lost",
];

/// A column's alignment and width.
#[derive(Clone, Copy)]
enum Col {
    Left(usize),
    Right(usize),
}

/// `cells` in columns of `cols`, one space apart.
fn columns(cells: &[String], cols: &[Col]) -> String {
    debug_assert_eq!(cells.len(), cols.len(), "a cell for every column");
    let cell = |(c, col): (&String, &Col)| match *col {
        Col::Left(w) => format!("{c:<w$}"),
        Col::Right(w) => format!("{c:>w$}"),
    };
    cells
        .iter()
        .zip(cols)
        .map(cell)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The columns of [`HEADER`].
const COLS: [Col; 16] = {
    use Col::*;
    [
        Left(16),
        Left(8),
        Left(10),
        Right(9),
        Right(9),
        Right(8),
        Right(9),
        Right(8),
        Right(8),
        Right(8),
        Right(8),
        Right(8),
        Right(9),
        Right(9),
        Right(6),
        Right(7),
    ]
};

fn line(cells: &[String]) -> String {
    columns(cells, &COLS)
}

/// What a row says beside its figures.
struct Marks {
    /// Calls lost, and of them those that left the CPU (`ContextOut::censored`); None for the
    /// workload rows.
    lost: Option<(u64, u64)>,
    /// Some call's nesting unknown (`ContextOut::self_unknown`): counted whole, so the self
    /// time is an upper bound.
    self_at_most: bool,
}

/// One table row.
fn row(
    probe: &str,
    ctx: &str,
    label: &str,
    count: u64,
    rate: Option<f64>,
    lat: Option<&Latency>,
    marks: Marks,
) -> String {
    let Marks { lost, self_at_most } = marks;
    let censored = lost.map_or(0, |l| l.1);

    // Calls that left the CPU and are not timed: the tail is missing them.
    let low = |s: String| {
        if censored > 0 && !s.is_empty() {
            format!(">={s}")
        } else {
            s
        }
    };
    let dash = |s: String| if s.is_empty() { "-".to_string() } else { s };
    let mut cells = vec![
        probe.to_string(),
        ctx.to_string(),
        label.to_string(),
        fmt_count(count as f64),
        rate.map(fmt_count).unwrap_or_else(|| "-".into()),
    ];
    match lat {
        Some(l) if !l.percentiles.is_empty() => cells.extend([
            pct(&l.percentiles, 0.5),
            pct(&l.percentiles_floor_corrected, 0.5),
            pct(&l.percentiles, 0.9),
            low(pct(&l.percentiles, 0.99)),
            low(pct(&l.percentiles, 0.999)),
            low(fmt_ns(l.max_ns as f64)),
            low(l.mean_ns.map(fmt_ns).unwrap_or_default()),
            fmt_ns(l.sum_ns as f64),
            l.self_ns
                .map(|s| {
                    let at = if self_at_most { "<=" } else { "" };
                    format!("{at}{}", fmt_ns(s as f64))
                })
                .unwrap_or_default(),
            // On the CPU; where some call's time off it is unknown, at most the wall share.
            match (l.cpu_share, l.wall_share) {
                (Some(s), _) => format!("{:.2}", s * 100.0),
                (None, Some(w)) => format!("<={:.2}", w * 100.0),
                (None, None) => String::new(),
            },
        ]),
        _ => cells.extend(std::iter::repeat_n(String::new(), 10)),
    }

    cells.push(lost.map(|n| fmt_count(n.0 as f64)).unwrap_or_default());
    line(&cells.into_iter().map(dash).collect::<Vec<_>>())
}

/// Where the workload's CPU time went: its CPU time, the share of it in traced code (the
/// probes' self times added: nothing counted twice), and per probe its total (entry to exit,
/// nested probes inside) and self shares, with the instrumentation's own part beside them.
pub fn workload_cpu(doc: &Document) -> String {
    let mut out = String::new();
    let Some((cpu, source)) = doc
        .meta
        .workload
        .as_ref()
        .and_then(|w| Some((w.cpu_ns?, w.cpu_source.clone().unwrap_or_default())))
    else {
        return out;
    };
    let Some(shares) = crate::export::workload_shares(&doc.probes) else {
        return out;
    };

    // Where some call's time off the CPU is unknown it counts as CPU, where some call's nesting
    // is unknown its whole time as its own: at most (`WorkloadOut::shares_at_most`).
    let at = if shares.at_most { "<=" } else { "" };
    let pc = |v: Option<f64>| {
        v.map(|v| format!("{at}{:.2}%", v * 100.0))
            .unwrap_or_else(|| "-".into())
    };
    let _ = writeln!(
        out,
        "workload CPU: {} ({source}); in the traced functions {} of it (self times added), of which instrumentation {}",
        fmt_ns(cpu as f64),
        pc(Some(shares.self_share)),
        pc(shares.floor_share)
    );
    for (p, w) in shares.rows {
        let _ = writeln!(
            out,
            "  {:<16} self {:>7} (net of instrumentation {:>7})  total {:>7}",
            p.name,
            pc(w.self_share_of_workload_cpu),
            pc(w.net_self_share_of_workload_cpu),
            pc(w.share_of_workload_cpu),
        );
    }
    out
}

/// Per operation of the workload, where it reports them and ran to the end (hackbench's
/// messages, a built-in workload's count): each probe's calls of the workload and their time
/// (at the timed calls' mean), over the operations. Empty for other workloads.
pub fn per_operation(doc: &Document) -> String {
    let Some(ops) = doc
        .meta
        .workload
        .as_ref()
        .and_then(|w| w.operations.as_ref())
    else {
        return String::new();
    };
    let rows: Vec<String> = doc
        .probes
        .iter()
        .filter_map(|p| {
            let workload = p.workload.as_ref()?;
            let calls = workload.count as f64 / ops.count as f64;

            // The time of every call at the timed calls' mean (calls lost untimed included).
            Some(match workload.latency.as_ref().and_then(|l| l.mean_ns) {
                Some(mean) => format!(
                    "{} {calls:.3} calls {}",
                    p.name,
                    fmt_ns(mean * workload.count as f64 / ops.count as f64)
                ),
                None => format!("{} {calls:.3} calls", p.name),
            })
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }

    format!(
        "per operation ({} {}): {}\n",
        ops.count,
        ops.unit,
        rows.join("; ")
    )
}

/// The footnote line of a probe: calls, every way calls were lost, calls that left the CPU.
/// Tests parse it back against the JSON.
pub fn probe_footnote(p: &crate::export::ProbeOut) -> String {
    let sum = |f: fn(&crate::export::ContextOut) -> u64| p.contexts.iter().map(f).sum::<u64>();
    format!(
        "{} via {}: {} calls, {} lost (orphan exits {}, lost exits {}, evicted {}, unproven {}, ring full {}, no context {}), {} recursion misses, {} kprobe misses{}; loss at most {}; {} left the CPU ({} migrated){}; {} outside the window",
        p.target,
        p.backend,
        p.count,
        p.lost,
        sum(|c| c.orphans),
        sum(|c| c.stale),
        sum(|c| c.evicted),
        sum(|c| c.rejected + c.ambiguous),
        sum(|c| c.deferred_lost),
        sum(|c| c.no_context_entries + c.no_context_exits),
        p.recursion_misses,
        p.kprobe_missed,
        // The kernel counted more kprobe hits than the programs ran (before 6.7 these runs
        // are in no recursion count): calls neither program saw.
        match p.kprobe_skipped {
            n if n > p.programs.iter().map(|g| g.recursion_misses).min().unwrap_or(0) => {
                format!(", {n} calls whose kprobe programs the kernel did not run")
            }
            _ => String::new(),
        },
        p.loss_share
            .map(|s| format!("{:.2}%", s * 100.0))
            .unwrap_or_else(|| "-".into()),
        sum(|c| c.switched),
        sum(|c| c.migrated),
        // Recordings made before memcg-trace told time off the CPU say nothing about it.
        if p
            .contexts
            .iter()
            .any(|c| c.on_cpu_ns.is_some() || c.off_cpu_unknown > 0 || c.off_cpu_at_least > 0)
        {
            format!(
                ", off it {} (longest {}{})",
                fmt_ns(sum(|c| c.off_cpu_ns) as f64),
                fmt_ns(p.contexts.iter().map(|c| c.off_cpu_max_ns).max().unwrap_or(0) as f64),
                match (sum(|c| c.off_cpu_unknown), sum(|c| c.off_cpu_at_least)) {
                    (0, 0) => String::new(),
                    (n, 0) => format!(", {n} unknown"),
                    (0, b) => format!(", {b} at least: interrupt or steal time left out"),
                    (n, b) => format!(", {n} unknown, {b} at least: interrupt or steal time left out"),
                }
            )
        } else {
            String::new()
        },
        sum(|c| c.outside),
    ) + &threads_note(p)
        + &proven_note(p)
        + &witness_note(p)
}

/// Of the calls that left the CPU on a preemptible kernel, how many the programs proved
/// themselves (the task never moved off its CPU: `ContextOut::proven_on_cpu`) and how many went
/// to userspace's coarser check; empty where none was proven.
fn proven_note(p: &crate::export::ProbeOut) -> String {
    let proven: u64 = p.contexts.iter().map(|c| c.proven_on_cpu).sum();
    if proven == 0 {
        return String::new();
    }

    // The task row's (interrupt pairs deferred never left the CPU).
    let deferred: u64 = p
        .contexts
        .iter()
        .filter(|c| c.switched > 0 || c.proven_on_cpu > 0)
        .map(|c| c.deferred)
        .sum();
    format!("; of the calls that left the CPU {proven} proven on their CPU by the programs, {deferred} deferred to the per-tick check")
}

/// How the calls that left the CPU were proven where the switch witness did it (kprobe before
/// 6.7 on a preemptible kernel); empty elsewhere.
fn witness_note(p: &crate::export::ProbeOut) -> String {
    match p.held_switches {
        Some(n) => format!(
            "; calls that left the CPU checked by the switch witness: {n} switches found a BPF section held (the calls in flight then rejected)"
        ),
        None => String::new(),
    }
}

/// The task context's calls made by threads that do interrupt work (counted where threads do
/// it: PREEMPT_RT, `threadirqs`), said after the footnote; empty where there are none.
fn threads_note(p: &crate::export::ProbeOut) -> String {
    let irq: u64 = p.contexts.iter().map(|c| c.irq_thread).sum();
    let soft: u64 = p.contexts.iter().map(|c| c.softirq_thread).sum();
    if irq + soft == 0 {
        return String::new();
    }

    format!("; of the task context's calls {irq} by threaded interrupt handlers (irq/*), {soft} by softirq threads outside a softirq")
}

/// Call sites shown per probe and context in the summary (the JSON has all).
pub const CALLERS_SHOWN: usize = 5;

/// One row of a breakdown of a probe's calls (a call site, a memcg).
struct Part<'a> {
    context: &'a str,
    name: &'a str,
    calls: u64,
    share_of_calls: Option<f64>,
    share_of_time: Option<f64>,
    p50_ns: Option<u64>,
    p99_ns: Option<u64>,
}

/// A breakdown of a probe's calls per context (`what`: "call sites", "memcgs"), the `top`
/// first: calls, share of the context's calls and time, p50 and p99; then how many more rows
/// there are and the calls none had room for (`other` of the context), so that the rows
/// account for every call.
fn breakdown(
    p: &crate::export::ProbeOut,
    what: &str,
    parts: &[Part],
    other: impl Fn(&crate::export::ContextOut) -> u64,
    top: usize,
) -> String {
    let mut out = String::new();
    for c in &p.contexts {
        let rows: Vec<_> = parts.iter().filter(|s| s.context == c.context).collect();
        if rows.is_empty() && other(c) == 0 {
            continue;
        }

        let _ = writeln!(
            out,
            "{} {} {what} ({} calls): {:>9} {:>7} {:>7} {:>9} {:>9}",
            p.name,
            c.context,
            fmt_count(c.count as f64),
            "calls",
            "calls%",
            "time%",
            "p50",
            "p99"
        );
        let pc = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}%", v * 100.0));
        let ns = |x: Option<u64>| x.map_or("-".into(), |v| fmt_ns(v as f64));
        let width = rows
            .iter()
            .take(top)
            .map(|s| s.name.len())
            .max()
            .unwrap_or(0)
            .clamp(20, 56);
        for s in rows.iter().take(top) {
            let _ = writeln!(
                out,
                "  {:<width$} {:>9} {:>7} {:>7} {:>9} {:>9}",
                s.name,
                fmt_count(s.calls as f64),
                pc(s.share_of_calls),
                pc(s.share_of_time),
                ns(s.p50_ns),
                ns(s.p99_ns),
            );
        }

        if rows.len() > top {
            let rest: u64 = rows.iter().skip(top).map(|s| s.calls).sum();
            let _ = writeln!(
                out,
                "  {:<width$} {:>9}",
                format!("{} more {what}", rows.len() - top),
                fmt_count(rest as f64)
            );
        }

        if other(c) > 0 {
            let _ = writeln!(
                out,
                "  {:<width$} {:>9}",
                "other (no room in the kernel's map)",
                fmt_count(other(c) as f64)
            );
        }
    }
    out
}

/// A probe's call sites (`--callers`), per context, the `top` costliest first (see
/// [`breakdown`]).
pub fn callers(p: &crate::export::ProbeOut, top: usize) -> String {
    let parts: Vec<Part> = p
        .callers
        .iter()
        .map(|s| Part {
            context: &s.context,
            name: &s.site,
            calls: s.calls,
            share_of_calls: s.share_of_calls,
            share_of_time: s.share_of_time,
            p50_ns: s.p50_ns,
            p99_ns: s.p99_ns,
        })
        .collect();
    breakdown(p, "call sites", &parts, |c| c.callers_other, top)
}

/// A probe's sampled short stacks (`--callers-depth`), per context, the `top` most sampled:
/// share of the context's sampled entries, then the frames from the call site up.
pub fn stacks(p: &crate::export::ProbeOut, top: usize) -> String {
    let mut out = String::new();
    for c in &p.contexts {
        let rows: Vec<_> = p.stacks.iter().filter(|s| s.context == c.context).collect();
        if rows.is_empty() {
            continue;
        }

        let sampled: u64 = rows.iter().map(|s| s.sampled).sum();
        let _ = writeln!(
            out,
            "{} {} stacks ({} entries sampled, 1 in {} per CPU):",
            p.name,
            c.context,
            fmt_count(sampled as f64),
            p.stack_sample.unwrap_or(1)
        );
        for s in rows.iter().take(top) {
            let _ = writeln!(
                out,
                "  {:>6}  {}",
                s.share.map_or("-".into(), |v| format!("{:.1}%", v * 100.0)),
                s.frames.join(" <- ")
            );
        }

        if rows.len() > top {
            let rest: u64 = rows.iter().skip(top).map(|s| s.sampled).sum();
            let _ = writeln!(
                out,
                "  {:>6}  {} more stacks",
                format!("{:.1}%", rest as f64 * 100.0 / sampled.max(1) as f64),
                rows.len() - top
            );
        }
    }
    out
}

/// A probe's calls per charged memcg (`--by-memcg`), per context, the `top` costliest first
/// (see [`breakdown`]), named by cgroup path.
pub fn memcgs(p: &crate::export::ProbeOut, top: usize) -> String {
    let parts: Vec<Part> = p
        .memcgs
        .iter()
        .map(|m| Part {
            context: &m.context,
            name: &m.cgroup,
            calls: m.calls,
            share_of_calls: m.share_of_calls,
            share_of_time: m.share_of_time,
            p50_ns: m.p50_ns,
            p99_ns: m.p99_ns,
        })
        .collect();
    breakdown(p, "memcgs", &parts, |c| c.memcgs_other, top)
}

/// The summary table: one row per (probe, context) with calls, then the workload's rows (its
/// tasks' task-context calls, or, told by the memcg charged, the calls of every context that
/// charge its memcg; backend column "workload"), then footnotes: what was lost, the
/// instrumentation floor, the tracer's cost, calibration problems, probes not attached.
pub fn summary(doc: &Document) -> String {
    let mut out = String::new();
    summary_header(&mut out, doc);
    context_rows(&mut out, doc);
    workload_rows(&mut out, doc);
    out.push_str(&workload_cpu(doc));
    out.push_str(&per_operation(doc));
    for p in &doc.probes {
        out.push_str(&callers(p, CALLERS_SHOWN));
        out.push_str(&stacks(p, CALLERS_SHOWN));
        out.push_str(&memcgs(p, CALLERS_SHOWN));
    }

    let _ = writeln!(out);
    probe_footnotes(&mut out, doc);
    floor_notes(&mut out, doc);
    context_masks_note(&mut out, doc);
    daemon_notes(&mut out, doc);
    for n in &doc.not_attached {
        let _ = writeln!(out, "{:<16} not attached: {}", n.name, n.reasons.join("; "));
    }
    out
}

/// The summary's first lines: the run (tool, kernel, CPUs, time traced), the workload, and
/// the columns' header.
fn summary_header(out: &mut String, doc: &Document) {
    let meta = &doc.meta;
    let _ = writeln!(
        out,
        "memcg-trace {} on {} ({}, {} CPUs), {:.2}s traced",
        meta.tool_version,
        meta.kernel_release,
        meta.preemption_model,
        meta.cpus,
        meta.duration_ns as f64 / 1e9
    );
    if let Some(w) = &meta.workload {
        let _ = writeln!(
            out,
            "workload: {} ({}) in {}{}",
            w.argv.join(" "),
            w.ended(),
            w.cgroup,
            if w.by_memcg {
                "; its calls: those charging that memcg or one below it, in every context"
            } else {
                ""
            }
        );
    }

    let _ = writeln!(
        out,
        "{}",
        line(&HEADER.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    );
}

/// One row per probe and context that saw calls or lost some (and always the task or "all"
/// row).
fn context_rows(out: &mut String, doc: &Document) {
    for p in &doc.probes {
        let backend = p.backend.to_string();
        for c in p
            .contexts
            .iter()
            .filter(|c| c.count > 0 || c.lost > 0 || c.context == "task" || c.context == "all")
        {
            let _ = writeln!(
                out,
                "{}",
                row(
                    &p.name,
                    &c.context,
                    &backend,
                    c.count,
                    c.rate_per_s,
                    c.latency.as_ref(),
                    Marks {
                        lost: Some((c.lost, c.censored)),
                        self_at_most: c.self_unknown > 0,
                    },
                )
            );
        }
    }
}

/// The workload's row of each probe (backend column "workload").
fn workload_rows(out: &mut String, doc: &Document) {
    let m = &doc.meta;

    // Told by the memcg charged, the workload's calls are those of every context; without the
    // context split, its tasks' calls in any context.
    let no_split = m.context_masks.as_ref().is_some_and(|c| !c.split());
    let workload_ctx = if no_split || m.workload.as_ref().is_some_and(|w| w.by_memcg) {
        "all"
    } else {
        "task"
    };
    for p in &doc.probes {
        if let Some(w) = &p.workload {
            let _ = writeln!(
                out,
                "{}",
                row(
                    &p.name,
                    workload_ctx,
                    "workload",
                    w.count,
                    w.rate_per_s,
                    w.latency.as_ref(),
                    Marks {
                        lost: None,
                        // Its calls are task calls, or with --by-memcg any context's.
                        self_at_most: p.contexts.iter().enumerate().any(|(i, c)| {
                            c.self_unknown > 0 && (i == 0 || workload_ctx == "all")
                        }),
                    },
                )
            );
        }
    }
}

/// Each probe's footnote (what was lost, censored, proven), and with bpf stats on what its
/// programs ran per call.
fn probe_footnotes(out: &mut String, doc: &Document) {
    let m = &doc.meta;
    let window = std::time::Duration::from_nanos(m.duration_ns);
    for p in &doc.probes {
        let _ = writeln!(out, "{:<16} {}", p.name, probe_footnote(p));
        if m.bpf_stats {
            let runs: u64 = p.programs.iter().map(|x| x.run_cnt).sum();
            let time: u64 = p.programs.iter().map(|x| x.run_time_ns).sum();
            if let Some(c) = figures::cost(time, runs, p.count, window).per_call_ns {
                let _ = writeln!(
                    out,
                    "{:<16}   programs ran {} per call ({runs} runs, bpf stats on)",
                    "",
                    fmt_ns(c)
                );
            }
        }
    }
}

/// The instrumentation floor of each backend measured.
fn floor_notes(out: &mut String, doc: &Document) {
    for f in &doc.meta.floors {
        let _ = writeln!(
            out,
            "floor ({}): every sample includes {} of instrumentation (p50; p90 {}, min {}), measured around {} on this kernel; a traced call nested in another adds {} to it; programs run {} per call",
            f.backend,
            fmt_ns(f.p50_ns as f64),
            fmt_ns(f.p90_ns as f64),
            fmt_ns(f.min_ns as f64),
            crate::model::FLOOR_FUNCTION,
            f.per_call_ns.map(fmt_ns).unwrap_or_else(|| "-".into()),
            f.programs_ns.map(fmt_ns).unwrap_or_else(|| "-".into()),
        );
    }
}

/// How the programs told the contexts apart.
fn context_masks_note(out: &mut String, doc: &Document) {
    if let Some(cm) = &doc.meta.context_masks {
        let _ = writeln!(
            out,
            "context masks: softirq {:#x}{}, hardirq {:#x}, nmi {:#x} ({}; nmi {}){}",
            cm.softirq_offset,
            cm.softirq_words(),
            cm.hardirq_mask,
            cm.nmi_mask,
            cm.source,
            cm.nmi,
            if cm.threads {
                "; interrupt and softirq threads' task-context calls counted apart"
            } else {
                ""
            }
        );
    }
}

/// Calibration warnings, what the programs read, the daemon's own cost and the other
/// programs attached beside the probes'.
fn daemon_notes(out: &mut String, doc: &Document) {
    let meta = &doc.meta;
    for c in &meta.calibration {
        let _ = writeln!(out, "WARNING: not calibrated: {c}");
    }

    if let Some(r) = &meta.reads {
        let _ = writeln!(out, "programs read: {r}");
    }

    let tracer = &meta.tracer;
    let _ = writeln!(
        out,
        "daemon: attached in {}, detached in {}, {:.3}% of a CPU at a {} tick, peak RSS {:.1} MiB",
        fmt_ns(tracer.startup_ns as f64),
        fmt_ns(tracer.detach_ns as f64),
        tracer.cpu_share.unwrap_or(0.0) * 100.0,
        fmt_ns(tracer.tick_ns as f64),
        tracer.peak_rss_kib as f64 / 1024.0
    );

    // Program runs are counted only while the kernel's bpf stats are on.
    for p in &tracer.other_programs {
        let _ = match p.ns_per_run {
            Some(ns) if meta.bpf_stats => writeln!(
                out,
                "also attached: {} ran {} times, {} a run",
                p.name,
                p.run_cnt,
                fmt_ns(ns)
            ),
            _ if meta.bpf_stats => {
                writeln!(out, "also attached: {} ran {} times", p.name, p.run_cnt)
            }
            _ => writeln!(
                out,
                "also attached: {} (its runs are counted with --bpf-stats)",
                p.name
            ),
        };
    }
}

/// The columns of [`diff`]'s rows: probe, context, then A, B and the change of calls/s, p50 and
/// p99, and A's and B's mean.
const DIFF_COLUMNS: [&str; 13] = [
    "probe",
    "context",
    "A calls/s",
    "B calls/s",
    "change",
    "A p50",
    "B p50",
    "change",
    "A p99",
    "B p99",
    "change",
    "A mean",
    "B mean",
];

/// The columns of [`diff`]'s table.
const DIFF_COLS: [Col; 13] = {
    use Col::*;
    [
        Left(16),
        Left(8),
        Right(9),
        Right(9),
        Right(8),
        Right(8),
        Right(8),
        Right(8),
        Right(8),
        Right(8),
        Right(8),
        Right(8),
        Right(8),
    ]
};

/// One line of [`diff`]'s table.
fn diff_line(out: &mut String, cells: &[String; 13]) {
    let _ = writeln!(out, "{}", columns(cells, &DIFF_COLS));
}

/// The A/B comparison of two recordings: per probe and context present in either, calls/s,
/// p50, p99 and mean in A and B with the change; probes matched by name.
pub fn diff(a: &Document, b: &Document) -> String {
    let mut out = String::new();
    for (side, d) in [("A", a), ("B", b)] {
        let _ = writeln!(
            out,
            "{side}: {} ({}), {:.2}s",
            d.meta.kernel_release,
            d.meta
                .workload
                .as_ref()
                .map(|w| w.argv.join(" "))
                .unwrap_or_else(|| "system-wide".into()),
            d.meta.duration_ns as f64 / 1e9,
        );
    }

    diff_line(&mut out, &DIFF_COLUMNS.map(String::from));
    let mut names: Vec<&str> = a.probes.iter().map(|p| p.name.as_str()).collect();
    for p in &b.probes {
        if !names.contains(&p.name.as_str()) {
            names.push(&p.name);
        }
    }

    for name in names {
        let pa = a.probes.iter().find(|p| p.name == name);
        let pb = b.probes.iter().find(|p| p.name == name);
        for ctx in crate::export::CTX_ORDER {
            let ca = pa.and_then(|p| p.contexts.iter().find(|c| c.context == ctx));
            let cb = pb.and_then(|p| p.contexts.iter().find(|c| c.context == ctx));
            if ca.map(|c| c.count).unwrap_or(0) == 0 && cb.map(|c| c.count).unwrap_or(0) == 0 {
                continue;
            }

            diff_line(&mut out, &diff_cells(name, ctx, ca, cb));
        }

        if let (Some(x), Some(y)) = (pa, pb) {
            if x.target != y.target || x.backend != y.backend {
                let _ = writeln!(
                    out,
                    "{:<16} note: A traced {} via {}, B {} via {}",
                    name, x.target, x.backend, y.target, y.backend
                );
            }
        }
    }
    out
}

/// The cells of [`diff`]'s row of probe `name` in context `ctx`: A's row `ca`, B's `cb`.
fn diff_cells(
    name: &str,
    ctx: &str,
    ca: Option<&crate::export::ContextOut>,
    cb: Option<&crate::export::ContextOut>,
) -> [String; 13] {
    use crate::export::ContextOut;
    let percentile = |c: Option<&ContextOut>, q: f64| {
        c.and_then(|c| c.latency.as_ref())
            .and_then(|l| l.percentiles.iter().find(|x| (x.q - q).abs() < 1e-9))
            .map(|x| x.ns as f64)
    };
    let mean = |c: Option<&ContextOut>| c.and_then(|c| c.latency.as_ref()).and_then(|l| l.mean_ns);
    let rate = |c: Option<&ContextOut>| c.and_then(|c| c.rate_per_s);
    let ns = |v: Option<f64>| v.map(fmt_ns).unwrap_or_else(|| "-".into());
    [
        name.to_string(),
        ctx.to_string(),
        rate(ca).map(fmt_count).unwrap_or_else(|| "-".into()),
        rate(cb).map(fmt_count).unwrap_or_else(|| "-".into()),
        pct_change(rate(ca), rate(cb)),
        ns(percentile(ca, 0.5)),
        ns(percentile(cb, 0.5)),
        pct_change(percentile(ca, 0.5), percentile(cb, 0.5)),
        ns(percentile(ca, 0.99)),
        ns(percentile(cb, 0.99)),
        pct_change(percentile(ca, 0.99), percentile(cb, 0.99)),
        ns(mean(ca)),
        ns(mean(cb)),
    ]
}
