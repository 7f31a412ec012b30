//! The `Snapshot`: plain data the collector produces each tick and the only thing the outputs
//! (table, JSON, dashboard) consume. Derived numbers are in `figures`.

use std::time::Duration;

use memcg_trace_common::{bucket_bounds, bucket_end, Counters, Hist, NUM_BUCKETS, NUM_CTX};

use crate::probes::Backend;

/// A latency histogram summed over CPUs, in the shared bucket layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistData {
    /// Paired calls (tracepoints: hits).
    pub count: u64,
    /// Sum of durations, ns.
    pub sum_ns: u64,
    /// Shortest duration, ns (0 when empty).
    pub min_ns: u64,
    /// Longest duration, ns.
    pub max_ns: u64,
    /// Calls per bucket.
    pub buckets: Vec<u64>,
    /// Self time, ns, summed: each call's duration minus the traced calls nested in it (see
    /// `memcg_trace_common::Nest`); equal to `sum_ns` where nothing nests.
    pub self_ns: u64,
    /// Traced calls directly nested in these (`memcg_trace_common::Hist::nested`).
    pub nested: u64,
    /// Their time off the CPU, ns (`memcg_trace_common::Hist::off_ns`).
    pub off_ns: u64,
    /// The part of `off_ns` spent in traced calls nested in these
    /// (`memcg_trace_common::Hist::nested_off_ns`).
    pub nested_off_ns: u64,
}

impl Default for HistData {
    fn default() -> Self {
        HistData {
            count: 0,
            sum_ns: 0,
            min_ns: 0,
            max_ns: 0,
            buckets: vec![0; NUM_BUCKETS],
            self_ns: 0,
            nested: 0,
            off_ns: 0,
            nested_off_ns: 0,
        }
    }
}

impl HistData {
    /// The self time on the CPU, ns: `self_ns` less the calls' own time off the CPU (their
    /// time off it less the part spent in nested traced calls, which `self_ns` already left
    /// out).
    pub fn self_on_cpu_ns(&self) -> u64 {
        let own_off = self.off_ns.saturating_sub(self.nested_off_ns);
        self.self_ns.saturating_sub(own_off)
    }

    /// Adds one CPU's histogram.
    pub fn add_cpu(&mut self, h: &Hist) {
        // The copy is no consistent cut either: the program adds a call's time to `sum_ns` and
        // then its self time to `self_ns` (its time off the CPU to `off_ns`, then the nested
        // calls' part of it), and a copy that read the total before and the part after the
        // update holds a part beyond its whole. Capped at the whole (the next read has both).
        self.sum_ns += h.sum_ns;
        self.self_ns += h.self_ns.min(h.sum_ns);
        self.nested += h.nested;
        self.off_ns += h.off_ns;
        self.nested_off_ns += h.nested_off_ns.min(h.off_ns);

        // The copy of a CPU's histogram is read while that CPU may record a call: the program
        // writes the extremes before the bucket, and the copy can hold the bucket and not yet
        // the extreme. An extreme outside the buckets' range is taken to the nearest value of
        // the outermost bucket (the exact one comes with the next read); else a reader of the
        // interval's histogram would find that call at the stale extreme.
        let first = h.buckets.iter().position(|&n| n > 0);
        let last = h.buckets.iter().rposition(|&n| n > 0);
        let mut max = h.max_ns;
        if let Some(i) = last {
            max = max.max(bucket_bounds(i).0);
        }

        self.max_ns = self.max_ns.max(max);
        let min = match (h.min_ns_inv, first) {
            (0, None) => None,
            (0, Some(i)) => Some(bucket_end(i) - 1),
            (inv, None) => Some(!inv),
            (inv, Some(i)) => Some((!inv).min(bucket_end(i) - 1)),
        };
        if let Some(m) = min {
            self.min_ns = if self.min_ns == 0 {
                m
            } else {
                self.min_ns.min(m)
            };
        }

        // The kernel keeps no count apart from the buckets' (every call it counts is timed).
        for (a, b) in self.buckets.iter_mut().zip(h.buckets.iter()) {
            *a += b;
            self.count += b;
        }
    }

    /// Calls that were timed (the bucket total; tracepoint hits have none).
    pub fn timed(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// A histogram of exact values, as the kernel would count them (tests and examples).
    pub fn of(values: &[u64]) -> HistData {
        let mut hist = HistData::default();
        for &v in values {
            hist.count += 1;
            hist.sum_ns += v;
            hist.self_ns += v;
            hist.max_ns = hist.max_ns.max(v);
            hist.min_ns = if hist.min_ns == 0 {
                v
            } else {
                hist.min_ns.min(v)
            };
            hist.buckets[memcg_trace_common::bucket_index(v)] += 1;
        }
        hist
    }

    /// Adds another histogram of the same layout.
    pub fn merge(&mut self, o: &HistData) {
        if o.count == 0 && o.timed() == 0 {
            return;
        }

        self.count += o.count;
        self.sum_ns += o.sum_ns;
        self.self_ns += o.self_ns;
        self.nested += o.nested;
        self.off_ns += o.off_ns;
        self.nested_off_ns += o.nested_off_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
        if o.min_ns != 0 {
            self.min_ns = if self.min_ns == 0 {
                o.min_ns
            } else {
                self.min_ns.min(o.min_ns)
            };
        }

        for (a, b) in self.buckets.iter_mut().zip(&o.buckets) {
            *a += b;
        }
    }

    /// `self - earlier`: the calls between two snapshots (an interval, or since a reset). Its
    /// min and max are those of that window, to bucket resolution: the bounds of its lowest and
    /// highest non-empty bucket, kept within the whole run's min and max.
    pub fn since(&self, earlier: &HistData) -> HistData {
        let buckets: Vec<u64> = self
            .buckets
            .iter()
            .zip(&earlier.buckets)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        let (mut min_ns, mut max_ns) = (0, 0);
        if earlier.timed() == 0 {
            (min_ns, max_ns) = (self.min_ns, self.max_ns);
        } else if let (Some(lo), Some(hi)) = (
            buckets.iter().position(|n| *n > 0),
            buckets.iter().rposition(|n| *n > 0),
        ) {
            min_ns = bucket_bounds(lo).0.max(self.min_ns);
            max_ns = (bucket_end(hi) - 1).min(self.max_ns).max(min_ns);
        }

        // Parts within their wholes in the window too. A read torn the other way (a call's
        // total in it, its self time not yet) makes the next window's self time grow more than
        // its total, and the cap drops that call's self time from the windows (at most one
        // call's per CPU and read); the cumulative figures, read again each time, keep it.
        let sum_ns = self.sum_ns.saturating_sub(earlier.sum_ns);
        let off_ns = self.off_ns.saturating_sub(earlier.off_ns);
        HistData {
            count: self.count.saturating_sub(earlier.count),
            sum_ns,
            min_ns,
            max_ns,
            buckets,
            self_ns: self.self_ns.saturating_sub(earlier.self_ns).min(sum_ns),
            nested: self.nested.saturating_sub(earlier.nested),
            off_ns,
            nested_off_ns: self
                .nested_off_ns
                .saturating_sub(earlier.nested_off_ns)
                .min(off_ns),
        }
    }
}

/// Cost of one eBPF program, from the kernel's bpf stats.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgCost {
    /// Program name (e.g. `fexit_0`).
    pub name: String,
    /// Runs while stats were on.
    pub run_cnt: u64,
    /// Total run time, ns.
    pub run_time_ns: u64,
    /// Runs skipped because the program was already running on that CPU.
    pub recursion_misses: u64,
}

/// One (probe, context) pair.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CtxStats {
    /// Timed calls since start: paired in the kernel, and deferred pairs userspace confirmed.
    /// Empty for the counts-only backend.
    pub hist: HistData,
    /// What the programs counted (see `memcg_trace_common::Counters`).
    pub counters: Counters,
    /// Deferred pairs confirmed (they are in `hist`).
    pub confirmed: u64,
    /// Deferred pairs rejected: the entry program missed a run while they were in flight, so
    /// the pair may join a stale entry with another call's exit.
    pub rejected: u64,
    /// Of the rejected pairs counted inside an enclosing call, their own self times, ns: that
    /// call's self time was reduced by their durations, yet their own self time is nobody's
    /// (see `deferred::Outcome::unproven_nested_ns`).
    pub unproven_nested_ns: u64,
    /// Calls that left the CPU whose time off it is only a lower bound: on a kernel whose task
    /// clock leaves out interrupt and steal time (`kernel::task_clock_excludes`), the
    /// interrupts and steal while the task was away are not in it (0 elsewhere).
    pub off_cpu_at_least: u64,
}

impl CtxStats {
    /// Whether the calls' time on the CPU is not known exactly: some call's time off it is
    /// unknown, or only a lower bound.
    pub fn on_cpu_unknown(&self) -> bool {
        self.counters.off_cpu_unknown > 0 || self.off_cpu_at_least > 0
    }

    /// Calls of context `ctx` known to have left the CPU and not timed (see
    /// `export::ContextOut::censored`): every deferred pair is a call that left the CPU, and
    /// an ambiguous task pair is one whose task moved (interrupt pairs are ambiguous for a
    /// skipped entry run, whatever their length); an evicted call was the oldest of 17 calls
    /// in flight on its CPU, or, where runs interleave, one whose slot was taken meanwhile
    /// (task context only; a slow call in the first case, counted so in both).
    pub fn censored(&self, ctx: usize) -> u64 {
        let c = &self.counters;
        self.rejected + c.deferred_lost + if ctx == 0 { c.ambiguous + c.evicted } else { 0 }
    }

    /// Calls seen in this context but not timed: exits without their own entry, entries whose
    /// exit was lost or pushed out, pairs that could not be proven (ambiguous, rejected) or were
    /// lost on the way to userspace, runs whose context could not be read.
    pub fn lost(&self) -> u64 {
        let counters = &self.counters;
        counters.orphans
            + counters.stale
            + counters.evicted
            + counters.ambiguous
            + counters.deferred_lost
            + self.rejected
            + counters.no_context_entries
            + counters.no_context_exits
    }
}

/// One attached probe.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeStats {
    /// Logical name (`charge`) or function (`--func`).
    pub name: String,
    /// Kernel function or tracepoint it is attached to.
    pub target: String,
    /// How.
    pub backend: Backend,
    /// Per context, indexed like `CTX_NAMES`.
    pub contexts: [CtxStats; NUM_CTX],
    /// The programs, entry first, with the kernel's statistics.
    pub programs: Vec<ProgCost>,
    /// The workload's calls, when a workload runs: task-context calls made by tasks of its
    /// cgroup, or, where the workload is told by the memcg charged (`--by-memcg`, a
    /// `--cgroup`), the calls in every context that charge its memcg or one below (for the
    /// counts-only backend only `count` is filled).
    pub workload: Option<HistData>,
    /// Calls the kprobes themselves missed (kprobe backend; the entry event's misses in
    /// `kprobe_profile`): no program ran.
    pub kprobe_missed: u64,
    /// Calls whose kprobe programs the kernel skipped at entry and exit (kprobe backend), at
    /// most: per side the kernel's hits (`kprobe_profile`) less the runs the programs
    /// counted, the fewer of the two sides. A program is skipped while another runs on that
    /// CPU (`bpf_prog_active`), which kernels before 6.7 count nowhere else; from 6.7 the same
    /// runs are the programs' `recursion_misses` too.
    pub kprobe_skipped: u64,
    /// Where the switch witness proves this probe's deferred pairs (kprobe before 6.7 on a
    /// preemptible kernel, `memcg_trace_common::HeldSwitches`): the context switches, on every
    /// CPU, that found a BPF section held (each one rejects the deferred calls in flight
    /// then). None: not proven that way.
    pub held_switches: Option<u64>,
    /// How long its calls were counted: from its own attach (the probes attach one after the
    /// other, each taking a while) to the end; None: the snapshot's `elapsed`.
    pub window: Option<std::time::Duration>,
    /// With `--callers`: the timed calls by call site, costliest first (the calls no site had
    /// room for are each context's `counters.callers_other`).
    pub callers: Vec<crate::callers::Site>,
    /// With `--by-memcg`: the calls by the memcg they charge (the id in `addr`, the cgroup path
    /// in `name`), costliest first (counts-only backend: most calls first); the calls no memcg
    /// had room for are each context's `counters.memcgs_other`.
    pub memcgs: Vec<crate::callers::Site>,
    /// With `--callers-depth`: the sampled short stacks, most sampled first.
    pub stacks: Vec<crate::callers::Stack>,
    /// One entry in this many per CPU had its stack sampled.
    pub stack_sample: u32,
}

impl ProbeStats {
    /// Calls counted in one context: timed calls, or hits of the counts-only backend.
    pub fn ctx_calls(&self, ctx: usize) -> u64 {
        let c = &self.contexts[ctx];
        if self.backend.has_latency() {
            c.hist.count
        } else {
            c.counters.entries
        }
    }

    /// Calls counted in all contexts.
    pub fn calls(&self) -> u64 {
        (0..NUM_CTX).map(|i| self.ctx_calls(i)).sum()
    }

    /// Calls seen but not timed, all contexts.
    pub fn lost(&self) -> u64 {
        self.contexts.iter().map(CtxStats::lost).sum()
    }

    /// Runs the kernel skipped because the same program was already running on that CPU, all
    /// programs.
    pub fn recursion_misses(&self) -> u64 {
        self.programs.iter().map(|p| p.recursion_misses).sum()
    }

    /// Runs the kernel did not run a program for, as far as it tells: the programs' recursion
    /// misses, or, where more, the kprobe hits the programs never saw (the same runs from 6.7,
    /// the only count of them before).
    pub fn skipped_runs(&self) -> u64 {
        self.recursion_misses().max(self.kprobe_skipped)
    }

    /// Calls counted nowhere because the kernel skipped their programs, at most: a call with
    /// only its entry (or only its exit) run is an orphan exit or a stale entry, among the lost;
    /// one with both skipped is in the entry's and the exit's misses alike, so at most the
    /// fewer of the two (or of the kprobe hits not run, where the kernel counts no misses).
    pub fn skipped_calls(&self) -> u64 {
        let missed = match self.programs.as_slice() {
            [entry, exit] => entry.recursion_misses.min(exit.recursion_misses),
            ps => ps.iter().map(|p| p.recursion_misses).sum(),
        };
        missed.max(self.kprobe_skipped)
    }

    /// Every way a call can be lost, added up: calls seen but not timed, calls whose programs
    /// the kernel skipped, calls the kprobes missed. An upper bound: a call with one of its
    /// programs skipped can be counted twice (an orphan exit or stale entry, and a skip).
    pub fn lost_upper(&self) -> u64 {
        self.lost() + self.skipped_calls() + self.kprobe_missed
    }

    /// `lost_upper` as a share of the calls counted and lost.
    pub fn loss_share(&self) -> Option<f64> {
        self.loss_share_with(0)
    }

    /// The same with `more` calls lost besides (those still pending when tracing stopped).
    pub fn loss_share_with(&self, more: u64) -> Option<f64> {
        let lost = (self.lost_upper() + more) as f64;
        let all = self.calls() as f64 + lost;
        (all > 0.0).then(|| lost / all)
    }

    /// Task-context calls during which the task left the CPU (timed wall-clock).
    pub fn switched(&self) -> u64 {
        self.contexts[0].counters.switched
    }
}

/// Everything known at one tick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Time since tracing started.
    pub elapsed: Duration,
    /// Attached probes.
    pub probes: Vec<ProbeStats>,
    /// Programs attached besides the probes' (the bench floors), with their cost.
    pub extra: Vec<ProgCost>,
    /// Deferred pairs not decided yet (they end after the last reading).
    pub waiting: u64,
    /// Calls still pending in the programs' slots per probe, known in the final snapshot only
    /// (in flight when tracing stopped, or entries whose exit never came).
    pub pending: Vec<u64>,
    /// Whether the kernel's bpf stats were on (program run times are known).
    pub bpf_stats: bool,
    /// Calls are not told apart by context on this kernel (no per-CPU offsets): every call is
    /// in context 0, named `all`.
    pub no_context_split: bool,
}

impl Snapshot {
    /// The name of context `i` in this snapshot's outputs (`all` for context 0 without the
    /// context split).
    pub fn ctx_name(&self, i: usize) -> &'static str {
        crate::kernel::ctx_name(i, !self.no_context_split)
    }
}

/// Helpers for tests over the kernel's counters, whatever fields they have.
#[cfg(test)]
pub(crate) mod counters_for_tests {
    use memcg_trace_common::Counters;

    /// Counters' fields. What makes the transmutes below sound, and each field one element, is
    /// that Counters is the programs' plain value: `repr(C)`, u64 fields only, no padding
    /// (memcg-trace-common, where it is `aya::Pod`); a size not a multiple of 8 fails them to
    /// compile, and a field of another width would break the programs' layout first.
    const FIELDS: usize = std::mem::size_of::<Counters>() / 8;

    /// `k` with each field mapped by `f(its byte offset, its value)`: the kernel's counters
    /// are all u64, so any counter added later is mapped too.
    pub(crate) fn map(k: &Counters, f: impl Fn(usize, u64) -> u64) -> Counters {
        // SAFETY: Counters is repr(C) with u64 fields only, FIELDS of them, no padding.
        let mut fields = unsafe { std::mem::transmute::<Counters, [u64; FIELDS]>(*k) };
        for (i, v) in fields.iter_mut().enumerate() {
            *v = f(i * 8, *v);
        }

        // SAFETY: as above; every bit pattern is a valid u64.
        unsafe { std::mem::transmute::<[u64; FIELDS], Counters>(fields) }
    }

    /// Counters with every field its own value (1, 2, 3, ... in declaration order).
    pub(crate) fn distinct() -> Counters {
        map(&Counters::default(), |offset, _| offset as u64 / 8 + 1)
    }
}

/// Snapshots for tests of the modules that read them.
#[cfg(test)]
pub(crate) mod for_tests {
    use std::time::Duration;

    use memcg_trace_common::{bucket_index, NUM_CTX};

    use super::{Backend, CtxStats, ProbeStats, Snapshot};

    /// A snapshot with one fentry probe whose task context saw `calls` calls of `ns` each and
    /// whose softirq context saw `soft` calls, at `secs` seconds.
    pub(crate) fn snap(secs: u64, calls: u64, ns: u64, soft: u64) -> Snapshot {
        let mut task = CtxStats::default();
        task.hist.count = calls;
        task.hist.sum_ns = calls * ns;
        task.hist.min_ns = if calls > 0 { ns } else { 0 };
        task.hist.max_ns = if calls > 0 { ns } else { 0 };
        task.hist.buckets[bucket_index(ns)] = calls;
        let mut softirq = CtxStats::default();
        softirq.hist.count = soft;
        softirq.hist.sum_ns = soft * 2 * ns;
        softirq.hist.min_ns = 2 * ns;
        softirq.hist.max_ns = 2 * ns;
        softirq.hist.buckets[bucket_index(2 * ns)] = soft;
        let contexts = [task, softirq, CtxStats::default(), CtxStats::default()];
        one_probe(Duration::from_secs(secs), contexts)
    }

    /// A snapshot at `elapsed` with one fentry probe, charge, whose contexts saw `contexts`.
    pub(crate) fn one_probe(elapsed: Duration, contexts: [CtxStats; NUM_CTX]) -> Snapshot {
        Snapshot {
            elapsed,
            probes: vec![ProbeStats {
                name: "charge".into(),
                target: "obj_cgroup_charge".into(),
                backend: Backend::Fentry,
                contexts,
                programs: vec![],
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcg_trace_common::bucket_index;

    /// An evicted call was the oldest of 17 in flight on its CPU, a slow call not timed: the
    /// tail is censored. Its exit, found among the evicted, does not make it lost twice.
    #[test]
    fn an_evicted_call_is_lost_once_and_censors_the_tail() {
        let mut c = CtxStats::default();
        c.counters.evicted = 3;
        c.counters.evicted_exits = 2;
        c.counters.orphans = 1;
        assert_eq!(c.censored(0), 3);
        assert_eq!(c.lost(), 4);

        // Interrupt contexts evict nothing; their slot's stale entry is another matter.
        let mut irq = CtxStats::default();
        irq.counters.stale = 1;
        assert_eq!(irq.censored(1), 0);
    }

    /// Adding another CPU's counters adds every counter (the longest time off the CPU is the
    /// larger of the two): a counter missing from `Counters::add` fails here.
    #[test]
    fn adding_a_cpu_s_counters_adds_every_counter() {
        let k = counters_for_tests::distinct();
        let mut sum = k;
        sum.add(&k);
        let doubled = counters_for_tests::map(&k, |field, v| {
            if field == std::mem::offset_of!(Counters, off_cpu_max_ns) {
                v
            } else {
                2 * v
            }
        });
        assert_eq!(sum, doubled);
    }

    #[test]
    fn an_interval_has_its_own_min_and_max() {
        let before = HistData::of(&[100, 2_000_000]);
        let now = {
            let mut h = before.clone();
            h.merge(&HistData::of(&[5000, 6000]));
            h
        };
        let d = now.since(&before);
        assert_eq!(d.timed(), 2);

        // Not the run's 100 ns and 2 ms: the interval's, within a bucket (1/32 octave).
        assert!((4900..=5000).contains(&d.min_ns), "{}", d.min_ns);
        assert!((6000..=6143).contains(&d.max_ns), "{}", d.max_ns);
    }

    #[test]
    fn interval_is_the_difference_of_cumulatives() {
        let a = HistData::of(&[100, 200]);
        let b = HistData::of(&[100, 200, 5000]);
        let d = b.since(&a);
        assert_eq!(d.count, 1);
        assert_eq!(d.sum_ns, 5000);
        assert_eq!(d.timed(), 1);
        assert_eq!(d.buckets[bucket_index(5000)], 1);
    }

    /// A read of a CPU's histogram torn by a call being recorded: the bucket of an 8.2 ms
    /// call already counted, the maximum still the earlier 5.1 ms (seen in a 6.1 VM run: the
    /// interval log put that call at 5.1 ms, and HdrHistogram's own reader then disagreed
    /// with the recording's maximum). Same for a new minimum.
    #[test]
    fn a_torn_read_keeps_the_extremes_in_the_buckets() {
        let mut cpu = Hist {
            sum_ns: 5_100_000 + 8_202_632 + 700,
            max_ns: 5_100_000,
            min_ns_inv: !5_100_000,
            buckets: [0; NUM_BUCKETS],
            self_ns: 0,
            nested: 0,
            off_ns: 0,
            nested_off_ns: 0,
        };
        for v in [700, 5_100_000, 8_202_632] {
            cpu.buckets[bucket_index(v)] += 1;
        }

        let mut hist = HistData::default();
        hist.add_cpu(&cpu);
        let (lo, hi) = bucket_bounds(bucket_index(8_202_632));
        assert!((lo..hi).contains(&hist.max_ns), "max {}", hist.max_ns);
        let (lo, hi) = bucket_bounds(bucket_index(700));
        assert!((lo..hi).contains(&hist.min_ns), "min {}", hist.min_ns);

        // The interval log's histogram of it holds the long call in its bucket.
        let out = crate::figures::hdr_with(&hist, crate::figures::INTERCHANGE_DIGITS);
        assert!(
            out.equivalent(out.max(), 8_202_632),
            "interval max {}",
            out.max()
        );

        // An untorn read is left as it is.
        let exact = HistData::of(&[700, 5_100_000, 8_202_632]);
        let mut again = HistData::default();
        let mut whole = cpu;
        whole.max_ns = 8_202_632;
        whole.min_ns_inv = !700;
        again.add_cpu(&whole);
        assert_eq!((again.min_ns, again.max_ns), (exact.min_ns, exact.max_ns));
    }

    /// A live read taken while a call of 4,000 ns (no nested calls, 1,000 ns of it off the
    /// CPU, all in a nested call) is recorded: the totals read before the program added to
    /// them, the parts after. Neither the read nor the interval holds a part beyond its
    /// whole: the dashboard would show a self share above the total share.
    #[test]
    fn a_torn_read_holds_no_part_beyond_its_whole() {
        let mut before = Hist {
            sum_ns: 10_000,
            max_ns: 5_000,
            min_ns_inv: !5_000,
            buckets: [0; NUM_BUCKETS],
            self_ns: 10_000,
            nested: 0,
            off_ns: 2_000,
            nested_off_ns: 2_000,
        };
        before.buckets[bucket_index(5_000)] = 2;
        let mut torn = before;
        torn.self_ns += 4_000;
        torn.nested_off_ns += 1_000;
        let (mut first, mut second) = (HistData::default(), HistData::default());
        first.add_cpu(&before);
        second.add_cpu(&torn);
        assert!(
            second.self_ns <= second.sum_ns && second.nested_off_ns <= second.off_ns,
            "{second:?}"
        );

        // The window between an untorn read and the torn one: the parts' growth without the
        // wholes' (with the whole's growth capped: none), and then the next window, from the
        // torn read to a whole one, gets the call whole.
        let between = second.since(&first);
        assert!(
            between.self_ns <= between.sum_ns && between.nested_off_ns <= between.off_ns,
            "{between:?}"
        );
        let mut after = torn;
        after.sum_ns += 4_000;
        after.off_ns += 1_000;
        after.buckets[bucket_index(4_000)] += 1;
        let mut third = HistData::default();
        third.add_cpu(&after);
        let next = third.since(&second);
        assert_eq!(
            (next.sum_ns, next.self_ns, next.off_ns, next.nested_off_ns),
            (4_000, 4_000, 1_000, 1_000)
        );

        // Over both windows nothing is lost.
        let whole = third.since(&first);
        assert_eq!((whole.self_ns, whole.nested_off_ns), (4_000, 1_000));
    }

    #[test]
    fn per_cpu_sum_merges_min_max() {
        let mut cpu0 = Hist {
            sum_ns: 50,
            max_ns: 50,
            min_ns_inv: !50,
            buckets: [0; NUM_BUCKETS],
            self_ns: 30,
            nested: 1,
            off_ns: 0,
            nested_off_ns: 0,
        };
        cpu0.buckets[bucket_index(50)] = 1;
        let cpu1 = Hist {
            sum_ns: 0,
            max_ns: 0,
            min_ns_inv: 0,
            buckets: [0; NUM_BUCKETS],
            self_ns: 0,
            nested: 0,
            off_ns: 0,
            nested_off_ns: 0,
        };
        let mut cpu2 = Hist {
            sum_ns: 9,
            max_ns: 9,
            min_ns_inv: !9,
            buckets: [0; NUM_BUCKETS],
            self_ns: 9,
            nested: 0,
            off_ns: 0,
            nested_off_ns: 0,
        };
        cpu2.buckets[9] = 1;
        let mut hist = HistData::default();
        for c in [&cpu0, &cpu1, &cpu2] {
            hist.add_cpu(c);
        }

        assert_eq!(
            (hist.count, hist.min_ns, hist.max_ns, hist.timed()),
            (2, 9, 50, 2)
        );
        assert_eq!(
            (hist.sum_ns, hist.self_ns),
            (59, 39),
            "self time summed over CPUs"
        );
    }
}
