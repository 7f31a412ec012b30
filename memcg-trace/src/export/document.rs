//! The document assembled: from a snapshot and what the session knows about the run
//! (`RunMeta`), each probe's rows with their figures.

use super::*;

/// Latency figures of one histogram over a recording of length `secs`; `floor` is the
/// backend's instrumentation floor (median), ns.
/// `off_unknown`: some call's time off the CPU is not known (its on-CPU share is then not).
pub(super) fn latency_out(
    h: &HistData,
    secs: Duration,
    floor: Option<u64>,
    off_unknown: bool,
) -> Latency {
    let mut buf = Vec::new();
    V2DeflateSerializer::new()
        .serialize(&figures::hdr_with(h, figures::INTERCHANGE_DIGITS), &mut buf)
        .expect("serialize hdr");
    let lat = figures::latency(h, secs, &QUANTILES);
    let percentiles: Vec<Quantile> = lat
        .as_ref()
        .map(|l| {
            l.percentiles
                .iter()
                .map(|&(q, ns)| Quantile { q, ns })
                .collect()
        })
        .unwrap_or_default();
    Latency {
        sum_ns: h.sum_ns,
        self_ns: Some(h.self_ns),
        nested_calls: Some(h.nested),
        off_cpu_ns: Some(h.off_ns),
        nested_off_cpu_ns: Some(h.nested_off_ns),
        cpu_share: if off_unknown {
            None
        } else {
            ratio(
                h.sum_ns.saturating_sub(h.off_ns) as f64,
                secs.as_nanos() as f64,
            )
        },
        wall_share: ratio(h.sum_ns as f64, secs.as_nanos() as f64),
        min_ns: h.min_ns,
        max_ns: h.max_ns,
        mean_ns: lat.as_ref().map(|l| l.mean_ns),
        stddev_ns: lat.as_ref().map(|l| l.stddev_ns),
        percentiles_floor_corrected: floor
            .map(|f| {
                percentiles
                    .iter()
                    .map(|p| Quantile {
                        q: p.q,
                        ns: p.ns.saturating_sub(f),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        percentiles,
        buckets: h
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, &count)| {
                // The last bucket holds every longer call too: its bound lies past the longest.
                let (min_ns, mut max_ns) = bucket_bounds(i);
                if i == NUM_BUCKETS - 1 {
                    max_ns = max_ns.max(h.max_ns.saturating_add(1));
                }
                Bucket {
                    min_ns,
                    max_ns,
                    count,
                }
            })
            .collect(),
        hdr_v2: base64::engine::general_purpose::STANDARD.encode(&buf),
    }
}

/// What a recording says about the run besides the figures: assembled by the live session.
#[derive(Debug, Clone)]
pub struct RunMeta {
    /// When tracing started.
    pub start: SystemTime,
    /// The preempt_count masks the context split used.
    pub masks: Option<kernel::ContextMasks>,
    /// How time off the CPU was told (`Meta::off_cpu`).
    pub off_cpu: Option<String>,
    /// How the programs read the kernel (`Meta::reads`).
    pub reads: Option<String>,
    /// The daemon's own cost.
    pub daemon: DaemonCost,
    /// The workload, when the session ran one.
    pub workload: Option<Workload>,
    /// Resolution notes per attached probe, by name.
    pub notes: HashMap<String, Vec<String>>,
    /// Probes that could not be attached.
    pub not_attached: Vec<NotAttached>,
    /// The instrumentation floor per latency backend in use.
    pub floors: Vec<Floor>,
    /// What could not be calibrated, one line each.
    pub calibration: Vec<String>,
    /// The run tick by tick, as far as it went.
    pub history: Option<crate::history::History>,
    /// The preemption model the programs were set for (None: the kernel's now).
    pub preemption_model: Option<String>,
}

pub(super) fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// A program's statistics as written.
fn program_out(c: &crate::snapshot::ProgCost) -> ProgramOut {
    ProgramOut {
        name: c.name.clone(),
        run_cnt: c.run_cnt,
        run_time_ns: c.run_time_ns,
        ns_per_run: ratio(c.run_time_ns as f64, c.run_cnt as f64),
        recursion_misses: c.recursion_misses,
    }
}

/// The recording of a snapshot: the one place a document is assembled (`record`, the
/// dashboard's save key).
pub fn document(snap: &Snapshot, run: &RunMeta) -> Document {
    let release = kernel::release();
    let config = kernel::config(&release);
    let (cpu_model, cpus) = kernel::cpu_info();

    // Start, end and duration describe one window: the end is the start plus the duration.
    let start = unix_ns(run.start);
    Document {
        schema: SCHEMA.into(),
        meta: Meta {
            tool_version: env!("CARGO_PKG_VERSION").into(),
            preemption_model: run
                .preemption_model
                .clone()
                .unwrap_or_else(|| kernel::preemption_model(config.as_ref())),
            kernel_release: release,
            kernel_config: config.unwrap_or_default(),
            cpu_model,
            cpus,
            start_unix_ns: start,
            end_unix_ns: start + snap.elapsed.as_nanos(),
            duration_ns: snap.elapsed.as_nanos() as u64,
            bpf_stats: snap.bpf_stats,
            tracer: DaemonCost {
                // Runs are counted only while the kernel's bpf stats are on: without them a
                // few runs seen (another tool turning the stats on a moment) give no cost.
                other_programs: snap
                    .extra
                    .iter()
                    .map(program_out)
                    .map(|p| ProgramOut {
                        ns_per_run: p.ns_per_run.filter(|_| snap.bpf_stats),
                        ..p
                    })
                    .collect(),
                ..run.daemon.clone()
            },
            context_masks: run.masks.clone(),
            off_cpu: run.off_cpu.clone(),
            reads: run.reads.clone(),
            calibration: run.calibration.clone(),
            floors: run.floors.clone(),
            workload: run.workload.clone(),
        },
        probes: probes_out(
            snap,
            &run.notes,
            &run.floors,
            run.workload.as_ref().is_some_and(|w| w.by_memcg),
            run.workload.as_ref().and_then(|w| w.cpu_ns),
        ),
        history: run.history.clone().filter(|h| !h.t_ms.is_empty()),
        upgraded_from: None,
        not_attached: run
            .not_attached
            .iter()
            .map(|f| NotAttachedOut {
                name: f.name.clone(),
                reasons: f.reasons.clone(),
            })
            .collect(),
    }
}

/// A context's row with the kernel's counters of that context written in; `counters_of` reads
/// them back. Each direction is written once, here side by side: a counter added to one and not
/// the other fails `every_counter_is_recorded_and_read_back`. Not recorded: `workload_hits`
/// (the recording has it as the workload row's count).
pub(super) fn with_counters(row: ContextOut, k: &Counters) -> ContextOut {
    ContextOut {
        entries: k.entries,
        exits: k.exits,
        paired: k.paired,
        deferred: k.deferred,
        deferred_lost: k.deferred_lost,
        switched: k.switched,
        migrated: k.migrated,
        proven_on_cpu: k.proven_on_cpu,
        orphans: k.orphans,
        evicted_exits: k.evicted_exits,
        outside: k.outside,
        stale: k.stale,
        evicted: k.evicted,
        ambiguous: k.ambiguous,
        no_context_entries: k.no_context_entries,
        no_context_exits: k.no_context_exits,
        off_cpu_ns: k.off_cpu_ns,
        off_cpu_max_ns: k.off_cpu_max_ns,
        off_cpu_unknown: k.off_cpu_unknown,
        callers_other: k.callers_other,
        memcgs_other: k.memcgs_other,
        self_unknown: k.self_unknown,
        outermost_ns: k.outermost_ns,
        irq_thread: k.irq_thread,
        softirq_thread: k.softirq_thread,
        ..row
    }
}

/// The kernel's counters of a recorded context row (`with_counters` undone).
pub(super) fn counters_of(row: &ContextOut) -> Counters {
    Counters {
        entries: row.entries,
        workload_hits: 0,
        exits: row.exits,
        paired: row.paired,
        deferred: row.deferred,
        deferred_lost: row.deferred_lost,
        switched: row.switched,
        migrated: row.migrated,
        proven_on_cpu: row.proven_on_cpu,
        orphans: row.orphans,
        evicted_exits: row.evicted_exits,
        outside: row.outside,
        stale: row.stale,
        evicted: row.evicted,
        ambiguous: row.ambiguous,
        no_context_entries: row.no_context_entries,
        no_context_exits: row.no_context_exits,
        off_cpu_ns: row.off_cpu_ns,
        off_cpu_max_ns: row.off_cpu_max_ns,
        off_cpu_unknown: row.off_cpu_unknown,
        callers_other: row.callers_other,
        memcgs_other: row.memcgs_other,
        self_unknown: row.self_unknown,
        outermost_ns: row.outermost_ns,
        irq_thread: row.irq_thread,
        softirq_thread: row.softirq_thread,
    }
}

/// The per-probe part of the document.
/// `workload_by_memcg`: the workload rows hold calls of every context (`Workload::by_memcg`).
pub(crate) fn probes_out(
    snap: &Snapshot,
    notes: &HashMap<String, Vec<String>>,
    floors: &[Floor],
    workload_by_memcg: bool,
    workload_cpu_ns: Option<u64>,
) -> Vec<ProbeOut> {
    let floor_of = |b: Backend| floors.iter().find(|f| f.backend == b);
    let workload_cpu = figures::WorkloadCpu::of(snap, floors, workload_cpu_ns);
    snap.probes
        .iter()
        .enumerate()
        .map(|(slot, p)| {
            // Rates and shares over the probe's own window.
            let secs = p.window.unwrap_or(snap.elapsed);
            let backend_floor = floor_of(p.backend);
            let floor = backend_floor.map(|f| f.p50_ns);
            let pending = snap.pending.get(slot).copied().unwrap_or(0);
            ProbeOut {
                name: p.name.clone(),
                target: p.target.clone(),
                backend: p.backend,
                count: p.calls(),
                lost: p.lost(),
                recursion_misses: p.recursion_misses(),
                kprobe_missed: p.kprobe_missed,
                kprobe_skipped: p.kprobe_skipped,
                held_switches: p.held_switches,
                window_ns: p.window.map(|w| w.as_nanos() as u64),
                // Calls still in flight at the end were seen and not timed: lost as well.
                lost_upper: p.lost_upper() + pending,
                loss_share: p.loss_share_with(pending),
                pending_at_end: pending,
                notes: notes.get(&p.name).cloned().unwrap_or_default(),
                workload: p.workload.as_ref().map(|w| {
                    workload_out(
                        p,
                        w,
                        secs,
                        backend_floor,
                        workload_cpu.as_ref(),
                        workload_by_memcg,
                    )
                }),
                programs: p.programs.iter().map(program_out).collect(),
                contexts: contexts_out(snap, p, secs, floor),
                callers: callers_out(snap, p),
                stacks: stacks_out(snap, p),
                stack_sample: (!p.stacks.is_empty()).then_some(p.stack_sample),
                memcgs: memcgs_out(snap, p),
            }
        })
        .collect()
}

/// A probe's workload row `w` over `secs`, with its shares of the workload's CPU.
fn workload_out(
    p: &ProbeStats,
    w: &HistData,
    secs: Duration,
    backend_floor: Option<&Floor>,
    workload_cpu: Option<&figures::WorkloadCpu>,
    workload_by_memcg: bool,
) -> WorkloadOut {
    let timed = p.backend.has_latency();
    let floor = backend_floor.map(|f| f.p50_ns);
    let shares = if timed {
        figures::cpu_shares(w, backend_floor, workload_cpu)
    } else {
        figures::CpuShares::default()
    };
    WorkloadOut {
        // Upper bounds where some call's time off the CPU is unknown (counted as
        // CPU), where some task call's nesting is unknown (its whole time counted as its
        // own: the self shares count its nested calls twice), and where the rows hold
        // interrupt calls charging the workload's memcg (`--by-memcg`): their CPU time is
        // not in its cgroup's.
        shares_at_most: timed
            && (p.contexts.first().is_some_and(CtxStats::on_cpu_unknown)
                || p.contexts
                    .first()
                    .is_some_and(|c| c.counters.self_unknown > 0)
                || (workload_by_memcg && (1..NUM_CTX).any(|i| p.ctx_calls(i) > 0))),
        count: w.count,
        rate_per_s: rate(w.count, secs),
        share_of_task_calls: ratio(
            w.count as f64,
            if workload_by_memcg {
                p.calls()
            } else {
                p.ctx_calls(0)
            } as f64,
        ),
        // Its calls are task calls (with --by-memcg, mostly): their off-CPU time is
        // unknown where any task call's is.
        latency: timed.then(|| {
            let unknown = p.contexts.first().is_some_and(CtxStats::on_cpu_unknown);
            latency_out(w, secs, floor, unknown)
        }),
        share_of_workload_cpu: shares.total,
        self_share_of_workload_cpu: shares.own,
        floor_share_of_workload_cpu: shares.instrumentation,
        net_self_share_of_workload_cpu: shares.net,
    }
}

/// A probe's rows by context (only `all` without the context split), over `secs`.
fn contexts_out(
    snap: &Snapshot,
    p: &ProbeStats,
    secs: Duration,
    floor: Option<u64>,
) -> Vec<ContextOut> {
    let timed = p.backend.has_latency();
    p.contexts
        .iter()
        .enumerate()
        // Without the context split every call is in context 0 (`all`): no
        // interrupt rows, which would claim none were seen.
        .filter(|(i, _)| *i == 0 || !snap.no_context_split)
        .map(|(i, c)| {
            let counters = &c.counters;
            let row = ContextOut {
                context: snap.ctx_name(i).to_string(),
                count: p.ctx_calls(i),
                rate_per_s: rate(p.ctx_calls(i), secs),
                confirmed: c.confirmed,
                rejected: c.rejected,
                unproven_nested_ns: c.unproven_nested_ns,
                off_cpu_at_least: c.off_cpu_at_least,
                // Unknown where any call's time off the CPU is, or only bounded.
                on_cpu_ns: (timed && !c.on_cpu_unknown())
                    .then(|| c.hist.sum_ns.saturating_sub(counters.off_cpu_ns)),
                lost: c.lost(),
                censored: c.censored(i),
                latency: timed.then(|| latency_out(&c.hist, secs, floor, c.on_cpu_unknown())),
                ..Default::default()
            };
            with_counters(row, counters)
        })
        .collect()
}

/// A probe's calls by call site (`--callers`).
fn callers_out(snap: &Snapshot, p: &ProbeStats) -> Vec<CallerOut> {
    p.callers
        .iter()
        .map(|s| {
            let ctx_stats = &p.contexts[(s.ctx as usize) % NUM_CTX];
            CallerOut {
                context: snap.ctx_name(s.ctx as usize).to_string(),
                site: s.name.clone(),
                address: format!("{:#x}", s.addr),
                calls: s.count,
                share_of_calls: ratio(s.count as f64, ctx_stats.hist.count as f64),
                sum_ns: s.sum_ns,
                share_of_time: ratio(s.sum_ns as f64, ctx_stats.hist.sum_ns as f64),
                p50_ns: s.quantile(0.5),
                p99_ns: s.quantile(0.99),
                buckets: s
                    .buckets
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(|(i, n)| [i as u64, *n])
                    .collect(),
            }
        })
        .collect()
}

/// A probe's sampled stacks, each with its share of its context's samples.
fn stacks_out(snap: &Snapshot, p: &ProbeStats) -> Vec<StackOut> {
    p.stacks
        .iter()
        .map(|s| {
            let ctx = (s.ctx as usize) % NUM_CTX;
            let all: u64 = p
                .stacks
                .iter()
                .filter(|o| o.ctx == s.ctx)
                .map(|o| o.count)
                .sum();
            StackOut {
                context: snap.ctx_name(ctx).to_string(),
                frames: s.names.clone(),
                addresses: s.frames.iter().map(|f| format!("{f:#x}")).collect(),
                sampled: s.count,
                share: ratio(s.count as f64, all as f64),
            }
        })
        .collect()
}

/// A probe's calls by the memcg they charge (`--by-memcg`).
fn memcgs_out(snap: &Snapshot, p: &ProbeStats) -> Vec<MemcgOut> {
    let timed = p.backend.has_latency();
    p.memcgs
        .iter()
        .map(|s| {
            let ctx = (s.ctx as usize) % NUM_CTX;
            let ctx_stats = &p.contexts[ctx];
            MemcgOut {
                context: snap.ctx_name(ctx).to_string(),
                cgroup: s.name.clone(),
                id: s.addr,
                calls: s.count,
                share_of_calls: ratio(s.count as f64, p.ctx_calls(ctx) as f64),
                sum_ns: s.sum_ns,
                share_of_time: timed
                    .then(|| ratio(s.sum_ns as f64, ctx_stats.hist.sum_ns as f64))
                    .flatten(),
                p50_ns: timed.then(|| s.quantile(0.5)).flatten(),
                p99_ns: timed.then(|| s.quantile(0.99)).flatten(),
                buckets: s
                    .buckets
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(|(i, n)| [i as u64, *n])
                    .collect(),
            }
        })
        .collect()
}
