//! The document's per-probe parts: each probe's rows by context, with their latency figures,
//! call sites, stacks and memcgs, the workload's rows and shares, the programs' statistics and
//! what was not attached.

use super::*;

/// One program's statistics.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProgramOut {
    /// Program name.
    pub name: String,
    /// Runs while bpf stats were on.
    pub run_cnt: u64,
    /// Run time while bpf stats were on, ns.
    pub run_time_ns: u64,
    /// Mean ns per run.
    pub ns_per_run: Option<f64>,
    /// Runs the kernel skipped because the program was already running on that CPU.
    pub recursion_misses: u64,
}

/// One percentile.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Quantile {
    /// Quantile in [0, 1].
    pub q: f64,
    /// Latency, ns.
    pub ns: u64,
}

/// One non-empty bucket.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Bucket {
    /// Inclusive lower bound, ns.
    pub min_ns: u64,
    /// Exclusive upper bound, ns.
    pub max_ns: u64,
    /// Calls.
    pub count: u64,
}

/// One (probe, context) pair. The counters account for every program run: `entries` =
/// `paired + ambiguous + deferred + deferred_lost + stale + evicted` (+ pending at the end),
/// `exits` = `paired + ambiguous + deferred + deferred_lost + orphans + evicted_exits +
/// outside`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ContextOut {
    /// task, softirq, hardirq or nmi.
    pub context: String,
    /// Calls counted: timed calls, or tracepoint hits.
    pub count: u64,
    /// Calls per second of the recording.
    pub rate_per_s: Option<f64>,
    /// Entry program runs (tracepoint: hits).
    pub entries: u64,
    /// Exit program runs.
    pub exits: u64,
    /// Calls paired and timed in the kernel.
    #[serde(default)]
    pub paired: u64,
    /// Calls paired whose pairing userspace confirmed against the kernel's recursion counters.
    #[serde(default)]
    pub deferred: u64,
    /// Of the deferred calls: confirmed (and timed).
    #[serde(default)]
    pub confirmed: u64,
    /// Of the deferred calls: rejected (the entry program missed a run while they were in
    /// flight).
    #[serde(default)]
    pub rejected: u64,
    /// Of the rejected calls the kernel had counted inside an enclosing call, their own self
    /// times summed, ns (the whole duration where their nesting is unknown): that call's self
    /// time was reduced by their durations, yet their own self time is nobody's. Over all probes
    /// and contexts, the self times plus these are at least `outermost_ns`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unproven_nested_ns: u64,
    /// Deferred calls lost because the ring buffer was full.
    #[serde(default)]
    pub deferred_lost: u64,
    /// fentry interrupt pairs not counted: the entry program missed a run on that CPU while
    /// the call was in flight.
    #[serde(default)]
    pub ambiguous: u64,
    /// Task-context calls during which the task left the CPU (timed wall-clock).
    pub switched: u64,
    /// Of those, calls whose exit ran on another CPU.
    #[serde(default)]
    pub migrated: u64,
    /// Of the switched calls that would have been deferred (a preemptible kernel), those the
    /// programs proved themselves and timed in the kernel: the task never moved off its CPU
    /// and the entry program missed no run there meanwhile. Absent where none (and in
    /// recordings made before, which deferred them all).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub proven_on_cpu: u64,
    /// Time the timed calls spent off the CPU (asleep, preempted, waiting to run), ns, summed:
    /// the scheduler's own accounting of the task's time away (`se.exec_start` and
    /// `se.sum_exec_runtime`). Only task-context calls that left the CPU have any.
    #[serde(default)]
    pub off_cpu_ns: u64,
    /// The longest time off the CPU of one call, ns.
    #[serde(default)]
    pub off_cpu_max_ns: u64,
    /// Timed calls that left the CPU whose time off it is not known: migrated where two CPUs'
    /// task clocks are not comparable (interrupt or steal time accounting, an unstable clock),
    /// or whose clock read went back. They add nothing to `off_cpu_ns`.
    #[serde(default)]
    pub off_cpu_unknown: u64,
    /// Calls that left the CPU whose time off it is only a lower bound: this kernel's task
    /// clock leaves out the interrupt and steal time while the task was away
    /// (CONFIG_IRQ_TIME_ACCOUNTING, CONFIG_PARAVIRT_TIME_ACCOUNTING); their time on the CPU,
    /// and every share of CPU made of it, is then at most what it would say.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub off_cpu_at_least: u64,
    /// Time on the CPU: `latency.sum_ns - off_cpu_ns`; absent for counts-only backends, for
    /// recordings made before memcg-trace told time off the CPU, and where any is unknown.
    #[serde(default)]
    pub on_cpu_ns: Option<u64>,
    /// Exits without their own entry.
    #[serde(alias = "unmatched")]
    pub orphans: u64,
    /// Exits without an entry outside the tracing window (the entry program not attached yet
    /// or any more): calls that began or ended outside it, not lost.
    #[serde(default)]
    pub outside: u64,
    /// Entries whose exit was lost (found stale later).
    #[serde(default)]
    pub stale: u64,
    /// Entries pushed out of a full set of pending calls.
    #[serde(default)]
    pub evicted: u64,
    /// Exits of evicted calls, told apart from orphan exits (not lost a second time); absent
    /// in recordings made before, whose orphan exits hold them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub evicted_exits: u64,
    /// Entry runs whose context could not be read.
    #[serde(default)]
    pub no_context_entries: u64,
    /// Exit runs whose context could not be read.
    #[serde(alias = "no_context")]
    pub no_context_exits: u64,
    /// Calls seen but not timed: orphans + stale + evicted + deferred_lost + rejected +
    /// ambiguous + no_context_entries + no_context_exits.
    #[serde(default)]
    pub lost: u64,
    /// With `--callers`: timed calls whose call site found no room in the kernel's bounded
    /// map (the "other" row): the sites' calls of this context and these add up to `count`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub callers_other: u64,
    /// With `--by-memcg`: calls whose memcg found no room in the kernel's bounded map (the
    /// "other" row): the memcgs' calls of this context and these add up to `count`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memcgs_other: u64,
    /// Timed calls whose self time is not known (their frame was not on the CPU's nesting
    /// stack at exit: they migrated, or nesting is not followed, as for fentry on preemptible
    /// kernels); `latency.self_ns` counts their whole duration, so it is then an upper bound.
    #[serde(default)]
    pub self_unknown: u64,
    /// Summed duration of the timed calls that ran inside no other traced call followed on
    /// their CPU, ns: traced time counted once. Over all probes and contexts it equals the
    /// summed self times when every call was timed and every self time is known; with
    /// rejected pairs, it is at most the summed self times plus `unproven_nested_ns`.
    #[serde(default)]
    pub outermost_ns: u64,
    /// Calls that left the CPU (slept, were preempted or moved) and are not timed: pairs that
    /// could not be proven (`rejected`), pairs lost on the way to userspace
    /// (`deferred_lost`), task pairs that cannot be told from a stale entry (`ambiguous`,
    /// the legacy object), and task calls pushed out as the oldest of 17 in flight on their CPU
    /// (`evicted`; where runs interleave, also a call whose slot was taken meanwhile). They are the slow tail: where this is not 0 the upper percentiles,
    /// the maximum and the mean of `latency` are lower bounds (the table marks them `>=`).
    #[serde(default)]
    pub censored: u64,
    /// Task context: entries made by threaded interrupt handlers (kernel threads `irq/...`),
    /// which the kernel counts as task context. Counted only where threads do interrupt work
    /// (PREEMPT_RT, `threadirqs`: `meta.context_masks.threads`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub irq_thread: u64,
    /// Task context: entries made by softirq threads (`ksoftirqd/N`, `ktimers/N`) outside a
    /// softirq handler.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub softirq_thread: u64,
    /// Latency figures; absent for counts-only backends.
    pub latency: Option<Latency>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The contexts in table order.
pub const CTX_ORDER: [&str; 5] = ["task", "all", "softirq", "hardirq", "nmi"];

/// The timed calls of one call site of a probe in one context (`--callers`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CallerOut {
    /// `task`, `softirq`, `hardirq` or `nmi`.
    pub context: String,
    /// The calling function, `function+0xoffset` of the return address (with ` [module]` for
    /// module text); `unknown` when the return address could not be read.
    pub site: String,
    /// The return address, hex (this boot's; KASLR moves it between boots).
    pub address: String,
    /// Calls.
    pub calls: u64,
    /// Share of the context's timed calls.
    pub share_of_calls: Option<f64>,
    /// Sum of their latencies, ns.
    pub sum_ns: u64,
    /// Share of the context's summed latency.
    pub share_of_time: Option<f64>,
    /// Median latency, ns (interpolated in quarter-octave buckets).
    pub p50_ns: Option<u64>,
    /// 99th percentile, ns (likewise).
    pub p99_ns: Option<u64>,
    /// The histogram, sparse: [bucket, calls] pairs of the quarter-octave buckets
    /// (`caller_bucket_bounds`).
    pub buckets: Vec<[u64; 2]>,
}

/// A sampled short stack of a probe in one context (`--callers-depth`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StackOut {
    /// `task`, `softirq`, `hardirq` or `nmi`.
    pub context: String,
    /// The call site, then the return addresses above it, innermost first, as
    /// `function+0xoffset`; `(not unwound)` second when the unwinder did not reach the site.
    pub frames: Vec<String>,
    /// The same, hex (this boot's).
    pub addresses: Vec<String>,
    /// Sampled entries with this stack (one entry in `ProbeOut::stack_sample` per CPU was).
    pub sampled: u64,
    /// Share of the context's sampled entries.
    pub share: Option<f64>,
}

/// The calls of a probe in one context that charge one memcg (`--by-memcg`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemcgOut {
    /// `task`, `softirq`, `hardirq` or `nmi`.
    pub context: String,
    /// The memcg's path in the memory controller's hierarchy (`/` the root; `unknown` when the
    /// argument could not be read, `removed cgroup ID` when it was gone before it was named).
    pub cgroup: String,
    /// Its id: the inode number of its directory (its cgroup's kernfs id).
    pub id: u64,
    /// Calls.
    pub calls: u64,
    /// Share of the context's calls.
    pub share_of_calls: Option<f64>,
    /// Sum of their latencies, ns (0 for counts-only backends).
    pub sum_ns: u64,
    /// Share of the context's summed latency.
    pub share_of_time: Option<f64>,
    /// Median latency, ns (interpolated in quarter-octave buckets).
    pub p50_ns: Option<u64>,
    /// 99th percentile, ns (likewise).
    pub p99_ns: Option<u64>,
    /// The histogram, sparse: [bucket, calls] pairs of the quarter-octave buckets
    /// (`caller_bucket_bounds`).
    pub buckets: Vec<[u64; 2]>,
}

/// Latency of one (probe, context) pair.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    /// Sum of latencies, ns: time between the entry program's clock read and the exit
    /// program's, summed.
    pub sum_ns: u64,
    /// Self time, ns, summed: each call's latency minus the latencies of the traced calls
    /// that ran nested in it on its CPU (its callees among the probes, and interrupts'
    /// traced calls). Self times of all probes add up to the time in traced code without
    /// counting any twice. Absent in recordings made before it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_ns: Option<u64>,
    /// Traced calls that ran directly nested in these calls (those of known self time): the
    /// part of each one's instrumentation outside its own timed window is in `self_ns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested_calls: Option<u64>,
    /// Time these calls spent off the CPU (those that left it, where known), ns: their CPU
    /// time is `sum_ns` less this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_cpu_ns: Option<u64>,
    /// The part of `off_cpu_ns` spent in traced calls nested in these (asleep in a nested
    /// probe's reclaim, say), already outside `self_ns`: the self time on the CPU is `self_ns`
    /// less (`off_cpu_ns` less this). Absent in recordings made before it was measured (their
    /// self shares subtracted such time twice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested_off_cpu_ns: Option<u64>,
    /// The time these calls spent on the CPU (`sum_ns` less `off_cpu_ns`) as a share of the
    /// recording's wall time (1.0 = one CPU); absent where some call's time off the CPU is not
    /// known (then at most `wall_share`). Before 0.1 of schema 2 this held the wall share: a
    /// recording without `wall_share` is read so.
    pub cpu_share: Option<f64>,
    /// `sum_ns` as a share of the recording's wall time: time inside the calls, sleep and
    /// preemption included (a call asleep for a second in reclaim counts a second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_share: Option<f64>,
    /// Shortest, ns.
    pub min_ns: u64,
    /// Longest, ns.
    pub max_ns: u64,
    /// Mean, ns.
    pub mean_ns: Option<f64>,
    /// Standard deviation, ns (from the histogram).
    pub stddev_ns: Option<f64>,
    /// Percentiles.
    pub percentiles: Vec<Quantile>,
    /// Percentiles minus the backend's instrumentation floor (its median), clamped at 0:
    /// what the function itself took, if the floor is the same in and out of it.
    #[serde(default)]
    pub percentiles_floor_corrected: Vec<Quantile>,
    /// Non-empty buckets.
    pub buckets: Vec<Bucket>,
    /// The histogram in HdrHistogram's interchange form, base64: the compressed V2 encoding
    /// (cookie 0x1c849314, zlib; strings start `HISTF`) that every port's `decode` reads,
    /// at 1 significant digit (16 sub-buckets per power of two: pairs of memcg-trace's buckets
    /// merged, the resolution the header states), min and max recorded as themselves.
    /// Recordings made before hold the uncompressed form (`HISTE`) at a claimed 3 digits.
    pub hdr_v2: String,
}

/// One attached probe.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeOut {
    /// Logical name or function.
    pub name: String,
    /// Function or tracepoint attached to.
    pub target: String,
    /// fentry, kprobe or tracepoint.
    pub backend: Backend,
    /// Calls counted in all contexts.
    pub count: u64,
    /// Calls seen but not timed, all contexts.
    #[serde(alias = "dropped")]
    pub lost: u64,
    /// Runs its programs' recursion protection skipped.
    pub recursion_misses: u64,
    /// Calls its kprobes missed (kprobe backend).
    #[serde(default)]
    pub kprobe_missed: u64,
    /// Calls whose kprobe programs the kernel skipped at entry and exit (another program was
    /// running on that CPU), at most: per side the kernel's hits of the kprobe less the runs
    /// counted, the fewer of the two (kprobe backend).
    #[serde(default)]
    pub kprobe_skipped: u64,
    /// Where the switch witness proves the deferred pairs (kprobe before 6.7 on a preemptible
    /// kernel): the context switches that found a BPF section held, each of which rejects
    /// the deferred calls in flight then. Absent: not proven that way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_switches: Option<u64>,
    /// How long its calls were counted, ns: from its own attach to the end (rates and shares
    /// are over it; absent: the recording's duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ns: Option<u64>,
    /// Every way a call can be lost, added up, the calls still pending at the end included (an
    /// upper bound: see docs/usage.md).
    #[serde(default)]
    pub lost_upper: u64,
    /// `lost_upper` as a share of the calls counted and lost.
    #[serde(default)]
    pub loss_share: Option<f64>,
    /// Calls still pending when tracing stopped.
    #[serde(default)]
    pub pending_at_end: u64,
    /// Why other candidates or backends were not used.
    pub notes: Vec<String>,
    /// The programs, entry first, with the kernel's statistics.
    pub programs: Vec<ProgramOut>,
    /// Per context: task, softirq, hardirq, nmi; or `all` alone where the kernel gives no
    /// context split (`meta.context_masks.percpu` "none").
    pub contexts: Vec<ContextOut>,
    /// The workload's share, when memcg-trace ran one: task-context calls made by tasks of the
    /// workload's cgroup, or, told by the memcg charged (`--by-memcg`, a `--cgroup`), the
    /// calls in every context that charge its memcg or one below it.
    pub workload: Option<WorkloadOut>,
    /// With `--callers`: the call sites of the timed calls, per context, costliest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callers: Vec<CallerOut>,
    /// With `--by-memcg`: the calls per charged memcg, per context, costliest (counts only:
    /// most called) first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memcgs: Vec<MemcgOut>,
    /// With `--callers-depth`: the sampled short stacks of the call sites, per context, most
    /// sampled first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<StackOut>,
    /// With `--callers-depth`: one entry in this many per CPU had its stack sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_sample: Option<u32>,
}

/// The workload's CPU shares of the probes that have them (a latency backend and the
/// workload's CPU time known), added up: what the table's and the dashboard's lines say.
pub struct WorkloadShares<'a> {
    /// The probes with a self share, in order, and their workload figures.
    pub rows: Vec<(&'a ProbeOut, &'a WorkloadOut)>,
    /// Their self shares added: the share of the workload's CPU in traced code.
    pub self_share: f64,
    /// The same, net of the instrumentation (None where a probe's is unknown).
    pub net_self_share: Option<f64>,
    /// The instrumentation's share (None where a probe's is unknown).
    pub floor_share: Option<f64>,
    /// Some probe's shares are upper bounds (`WorkloadOut::shares_at_most`).
    pub at_most: bool,
}

/// See [`WorkloadShares`]; None when no probe has a self share.
pub fn workload_shares(probes: &[ProbeOut]) -> Option<WorkloadShares<'_>> {
    let rows: Vec<_> = probes
        .iter()
        .filter_map(|p| Some((p, p.workload.as_ref()?)))
        .filter(|(_, w)| w.self_share_of_workload_cpu.is_some())
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(WorkloadShares {
        at_most: rows.iter().any(|(_, w)| w.shares_at_most),
        self_share: rows
            .iter()
            .filter_map(|(_, w)| w.self_share_of_workload_cpu)
            .sum(),
        net_self_share: rows
            .iter()
            .map(|(_, w)| w.net_self_share_of_workload_cpu)
            .sum(),
        floor_share: rows
            .iter()
            .map(|(_, w)| w.floor_share_of_workload_cpu)
            .sum(),
        rows,
    })
}

/// Task-context calls made by tasks of the workload's cgroup.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkloadOut {
    /// Calls.
    pub count: u64,
    /// Calls per second of the recording.
    pub rate_per_s: Option<f64>,
    /// Fraction of all task-context calls of this probe (of all its calls where the workload
    /// is told by its memcg, `Workload::by_memcg`).
    pub share_of_task_calls: Option<f64>,
    /// Latency figures; absent for counts-only backends.
    pub latency: Option<Latency>,
    /// The workload's CPU time spent in these calls, entry to exit (`latency.sum_ns` less
    /// `latency.off_cpu_ns`, over `meta.workload.cpu_ns`): nested probes are inside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_of_workload_cpu: Option<f64>,
    /// The same for their self time (`latency.self_ns` less `latency.off_cpu_ns`: the
    /// probes nested in them never sleep): the traced calls nested in them left out, so that
    /// the probes' self shares add up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_share_of_workload_cpu: Option<f64>,
    /// The part of the self share that is the instrumentation's own: each call's floor (the
    /// backend's median, inside its timed window) and, for each traced call nested in one of
    /// these, the rest of its full cost per call (outside its own window, so inside this
    /// one's), over the workload's CPU time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_share_of_workload_cpu: Option<f64>,
    /// The self time less the instrumentation inside it (not below 0), over the workload's
    /// CPU time less every traced call's full cost: what the functions themselves took of
    /// the untraced workload, as a profiler of it would see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_self_share_of_workload_cpu: Option<f64>,
    /// The shares are upper bounds: some call's time off the CPU is unknown (counted as CPU),
    /// some task call's nesting is unknown (its whole time counted as its own, so the self
    /// shares count its nested calls twice), or the workload is told by the memcg charged
    /// (`--by-memcg`) and the probe has interrupt-context calls, which its rows may hold and
    /// whose CPU time is not the workload's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shares_at_most: bool,
}

/// A probe that could not be attached.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NotAttachedOut {
    /// Logical name or function.
    pub name: String,
    /// One line per candidate or backend tried.
    pub reasons: Vec<String>,
}
