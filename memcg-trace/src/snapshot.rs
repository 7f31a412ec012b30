//! The `Snapshot`: plain data the collector produces each tick and the only thing the outputs
//! (table, JSON, dashboard) consume. Derived numbers are in `figures`.

use std::time::Duration;

use memcg_trace_common::{Counters, Hist, NUM_BUCKETS, NUM_CTX};

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
}

impl Default for HistData {
    fn default() -> Self {
        HistData {
            count: 0,
            sum_ns: 0,
            min_ns: 0,
            max_ns: 0,
            buckets: vec![0; NUM_BUCKETS],
        }
    }
}

impl HistData {
    /// Adds one CPU's histogram.
    pub fn add_cpu(&mut self, h: &Hist) {
        self.count += h.count;
        self.sum_ns += h.sum_ns;
        self.max_ns = self.max_ns.max(h.max_ns);
        if h.min_ns_inv != 0 {
            let m = !h.min_ns_inv;
            self.min_ns = if self.min_ns == 0 {
                m
            } else {
                self.min_ns.min(m)
            };
        }
        for (a, b) in self.buckets.iter_mut().zip(h.buckets.iter()) {
            *a += b;
        }
    }

    /// Calls that were timed (the bucket total; tracepoint hits have none).
    pub fn timed(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// A histogram of exact values, as the kernel would count them (tests and examples).
    pub fn of(values: &[u64]) -> HistData {
        let mut h = HistData::default();
        for &v in values {
            h.count += 1;
            h.sum_ns += v;
            h.max_ns = h.max_ns.max(v);
            h.min_ns = if h.min_ns == 0 { v } else { h.min_ns.min(v) };
            h.buckets[memcg_trace_common::bucket_index(v)] += 1;
        }
        h
    }

    /// `self - earlier`, for per-tick figures. Min and max are those of the whole run.
    pub fn since(&self, earlier: &HistData) -> HistData {
        HistData {
            count: self.count.saturating_sub(earlier.count),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
            min_ns: self.min_ns,
            max_ns: self.max_ns,
            buckets: self
                .buckets
                .iter()
                .zip(&earlier.buckets)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
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
    /// Cumulative histogram since start (or the last reset).
    pub hist: HistData,
    /// Cumulative pairing counters.
    pub counters: Counters,
}

impl CtxStats {
    /// Calls dropped rather than attributed: exits without their entry, task-context calls
    /// during which the task left the CPU, and exits whose context could not be read.
    pub fn dropped(&self) -> u64 {
        self.counters.unmatched + self.counters.switched + self.counters.no_context
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
    /// The programs' own cost.
    pub programs: Vec<ProgCost>,
    /// Task-context calls made by tasks of the workload's cgroup, when a workload runs.
    pub workload: Option<HistData>,
}

impl ProbeStats {
    /// Calls in all contexts.
    pub fn calls(&self) -> u64 {
        self.contexts.iter().map(|c| c.hist.count).sum()
    }

    /// Calls dropped in all contexts.
    pub fn dropped(&self) -> u64 {
        self.contexts.iter().map(CtxStats::dropped).sum()
    }

    /// Runs lost to the kernel's recursion protection, all programs.
    pub fn recursion_misses(&self) -> u64 {
        self.programs.iter().map(|p| p.recursion_misses).sum()
    }
}

/// Everything known at one tick.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Time since tracing started.
    pub elapsed: Duration,
    /// Attached probes.
    pub probes: Vec<ProbeStats>,
    /// Programs attached besides the probes' (the bench floors), with their cost.
    pub extra: Vec<ProgCost>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcg_trace_common::bucket_index;

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

    #[test]
    fn per_cpu_sum_merges_min_max() {
        let mut cpu0 = Hist {
            count: 1,
            sum_ns: 50,
            max_ns: 50,
            min_ns_inv: !50,
            buckets: [0; NUM_BUCKETS],
        };
        cpu0.buckets[bucket_index(50)] = 1;
        let cpu1 = Hist {
            count: 0,
            sum_ns: 0,
            max_ns: 0,
            min_ns_inv: 0,
            buckets: [0; NUM_BUCKETS],
        };
        let mut cpu2 = Hist {
            count: 1,
            sum_ns: 9,
            max_ns: 9,
            min_ns_inv: !9,
            buckets: [0; NUM_BUCKETS],
        };
        cpu2.buckets[9] = 1;
        let mut h = HistData::default();
        for c in [&cpu0, &cpu1, &cpu2] {
            h.add_cpu(c);
        }
        assert_eq!((h.count, h.min_ns, h.max_ns, h.timed()), (2, 9, 50, 2));
    }
}
