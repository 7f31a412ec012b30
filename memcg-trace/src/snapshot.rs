//! The `Snapshot`: plain data the poller produces each tick and the only thing the outputs (table,
//! JSON, dashboard) consume. Derived figures are small pure functions here.

use std::time::Duration;

use hdrhistogram::Histogram;
use memcg_trace_common::{bucket_bounds, Counters, Hist, NUM_BUCKETS, NUM_CTX};

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

    /// Mean duration, ns.
    pub fn mean_ns(&self) -> Option<f64> {
        ratio(self.sum_ns as f64, self.timed() as f64)
    }

    /// The histogram as an HdrHistogram: each bucket's calls recorded at the bucket midpoint
    /// (clamped to the observed min and max), so percentiles are within half a bucket (1.6%).
    pub fn to_hdr(&self) -> Histogram<u64> {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1 << 40, 3).expect("valid hdr bounds");
        for (i, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let (lo, hi) = bucket_bounds(i);
            let mut v = lo + (hi - 1 - lo) / 2;
            if self.max_ns > 0 {
                v = v.clamp(self.min_ns.max(1), self.max_ns.max(1));
            }
            h.record_n(v.max(1), n).expect("value within hdr bounds");
        }
        h
    }
}

/// `a / b`, or None when b is zero.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b != 0.0).then(|| a / b)
}

/// Per-second rate of `n` events over `d`.
pub fn rate(n: u64, d: Duration) -> Option<f64> {
    ratio(n as f64, d.as_secs_f64())
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

impl ProgCost {
    /// Mean run time per call, ns.
    pub fn ns_per_run(&self) -> Option<f64> {
        ratio(self.run_time_ns as f64, self.run_cnt as f64)
    }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcg_trace_common::bucket_index;

    fn hist_of(values: &[u64]) -> HistData {
        let mut h = HistData::default();
        for &v in values {
            h.count += 1;
            h.sum_ns += v;
            h.max_ns = h.max_ns.max(v);
            h.min_ns = if h.min_ns == 0 { v } else { h.min_ns.min(v) };
            h.buckets[bucket_index(v)] += 1;
        }
        h
    }

    #[test]
    fn percentiles_stay_within_three_percent() {
        // A spread of values over six decades, each percentile checked against the exact one.
        let mut values: Vec<u64> = (0..20_000u64)
            .map(|i| 20 + (i * i * 37) % 5_000_000)
            .collect();
        values.sort_unstable();
        let hdr = hist_of(&values).to_hdr();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact =
                values[((q * values.len() as f64).ceil() as usize).saturating_sub(1)] as f64;
            let got = hdr.value_at_quantile(q) as f64;
            let err = (got - exact).abs() / exact;
            assert!(
                err <= 0.03,
                "q={q}: got {got}, exact {exact}, error {err:.4}"
            );
        }
        assert_eq!(hdr.len(), values.len() as u64);
    }

    #[test]
    fn single_value_is_reported_exactly_through_min_max_clamp() {
        let hdr = hist_of(&[1234, 1234, 1234]).to_hdr();
        assert!((hdr.value_at_quantile(0.5) as i64 - 1234).abs() <= 2);
    }

    #[test]
    fn derived_figures_guard_division_by_zero() {
        assert_eq!(rate(10, Duration::ZERO), None);
        assert_eq!(rate(10, Duration::from_secs(2)), Some(5.0));
        assert_eq!(HistData::default().mean_ns(), None);
        assert_eq!(ProgCost::default().ns_per_run(), None);
        let h = hist_of(&[100, 300]);
        assert_eq!(h.mean_ns(), Some(200.0));
    }

    #[test]
    fn interval_is_the_difference_of_cumulatives() {
        let a = hist_of(&[100, 200]);
        let b = hist_of(&[100, 200, 5000]);
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
