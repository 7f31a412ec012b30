//! Figures derived from a `Snapshot`: percentiles, mean, spread, rates, share of a CPU and what
//! the tracer itself costs. Computed here once; the table, the JSON and the dashboard all take
//! them from this module. Small pure functions, guarded against division by zero.

use std::time::Duration;

use hdrhistogram::Histogram;
use memcg_trace_common::bucket_bounds;

use crate::{
    model::Floor,
    snapshot::{HistData, ProbeStats, ProgCost, Snapshot},
};

/// Percentiles reported everywhere.
pub const QUANTILES: [f64; 6] = [0.5, 0.9, 0.99, 0.999, 0.9999, 1.0];

/// `a / b`, or None when b is zero.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b != 0.0).then(|| a / b)
}

/// Per-second rate of `n` events over `d`.
pub fn rate(n: u64, d: Duration) -> Option<f64> {
    ratio(n as f64, d.as_secs_f64())
}

/// The workload's CPU time (its cgroup's), and the same less what the instrumentation cost it:
/// every traced call of the workload at its backend's full cost per call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkloadCpu {
    pub cpu_ns: u64,
    /// None where the instrumentation's cost is the whole CPU time or more.
    pub untraced_ns: Option<f64>,
}

impl WorkloadCpu {
    /// Of the snapshot's workload rows, with the floors measured (None without the CPU time).
    pub fn of(snap: &Snapshot, floors: &[Floor], cpu_ns: Option<u64>) -> Option<WorkloadCpu> {
        let cpu_ns = cpu_ns?;
        let instrumented: f64 = snap
            .probes
            .iter()
            .filter(|p| p.backend.has_latency())
            .filter_map(|p| {
                let per_call = floors
                    .iter()
                    .find(|f| f.backend == p.backend)?
                    .per_call_ns?;
                Some(p.workload.as_ref()?.count as f64 * per_call)
            })
            .sum();
        let untraced = cpu_ns as f64 - instrumented;
        Some(WorkloadCpu {
            cpu_ns,
            untraced_ns: (untraced > 0.0).then_some(untraced),
        })
    }
}

/// What one probe's workload calls took of the workload's CPU, as shares of it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuShares {
    /// The calls' time on the CPU (what they spent off it, asleep in reclaim say, is not the
    /// workload's CPU).
    pub total: Option<f64>,
    /// Their self time on the CPU (the time in traced calls nested in them taken out).
    pub own: Option<f64>,
    /// The instrumentation inside that self time: the floor's p50 per call, and per nested
    /// call what its full cost adds beyond that.
    pub instrumentation: Option<f64>,
    /// Self time less the instrumentation, of the workload's CPU less the tracer's full cost.
    pub net: Option<f64>,
}

/// The shares of `cpu` that the workload calls `calls` took, with `floor` their backend's.
pub fn cpu_shares(calls: &HistData, floor: Option<&Floor>, cpu: Option<&WorkloadCpu>) -> CpuShares {
    let Some(cpu) = cpu else {
        return CpuShares::default();
    };
    let of_cpu = |ns: f64| ratio(ns, cpu.cpu_ns as f64);
    let instrumentation_ns = floor.map(|f| {
        let beyond_p50 = f
            .per_call_ns
            .map_or(0.0, |c| (c - f.p50_ns as f64).max(0.0));
        calls.count as f64 * f.p50_ns as f64 + calls.nested as f64 * beyond_p50
    });
    let own = calls.self_on_cpu_ns() as f64;
    CpuShares {
        total: of_cpu(calls.sum_ns.saturating_sub(calls.off_ns) as f64),
        own: of_cpu(own),
        // Whole ns, as recorded.
        instrumentation: instrumentation_ns.and_then(|i| of_cpu(i.trunc())),
        net: instrumentation_ns.and_then(|i| ratio((own - i).max(0.0), cpu.untraced_ns?)),
    }
}

/// The histogram as an HdrHistogram: each bucket's calls recorded at the bucket midpoint
/// (clamped to the observed min and max), so percentiles are within half a bucket (1.6%).
pub fn hdr(h: &HistData) -> Histogram<u64> {
    hdr_with(h, 3)
}

/// Significant digits of the HdrHistogram that recordings carry (`hdr_v2`): the resolution the
/// data really has. memcg-trace's buckets split each power of two into 32; HdrHistogram's
/// 2 digits would claim 128 (finer than the data), its 1 digit is 16 per power of two, which
/// merges pairs of buckets exactly (both split the octave linearly).
pub const INTERCHANGE_DIGITS: u8 = 1;

/// The histogram at `digits` significant digits (see `hdr`), with the observed minimum and
/// maximum recorded as themselves (one call each), so that a reader finds them in the right
/// bucket.
pub fn hdr_with(h: &HistData, digits: u8) -> Histogram<u64> {
    let mut out = Histogram::<u64>::new_with_bounds(1, 1 << 40, digits).expect("valid hdr bounds");

    // A recording from elsewhere may say min > max; a call may take longer than the 18
    // minutes (2^40 ns) the histogram tracks: kept in range, never a panic.
    let (min, max) = (h.min_ns.max(1), h.max_ns.max(h.min_ns).max(1));
    let first = h.buckets.iter().position(|&n| n > 0);
    let last = h.buckets.iter().rposition(|&n| n > 0);
    for (i, &n) in h.buckets.iter().enumerate() {
        if n == 0 {
            continue;
        }

        let (lo, hi) = bucket_bounds(i);
        let mut value = lo + (hi - 1 - lo) / 2;
        let mut rest = n;
        if h.max_ns > 0 {
            value = value.clamp(min, max);

            // The extremes, where they lie in their buckets (a recording from elsewhere may
            // put them elsewhere: then only the midpoint).
            for (at, x) in [(first, min), (last, max)] {
                if at == Some(i) && rest > 0 && (lo..hi).contains(&x) {
                    let _ = out.record(x.clamp(1, out.high()));
                    rest -= 1;
                }
            }
        }

        let v = value.clamp(1, out.high());
        if rest > 0 && out.record_n(v, rest).is_err() {
            // Only a count beyond u64 fails; the rest of the histogram still stands.
            break;
        }
    }
    out
}

#[cfg(test)]
mod hdr_tests {
    use super::*;

    #[test]
    fn the_extremes_are_recorded_as_themselves() {
        // 3 digits: finer than a memcg-trace bucket, so a midpoint would show.
        let h = HistData::of(&[1_025, 1_100, 5_000, 9_000, 60_001]);
        let d = hdr_with(&h, 3);
        assert_eq!(d.min(), d.lowest_equivalent(h.min_ns));
        assert_eq!(d.max(), d.highest_equivalent(h.max_ns));
        assert_eq!(d.len(), 5);
    }
}

/// Latency figures of one histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    /// Calls timed (the bucket total).
    pub timed: u64,
    /// Sum of latencies, ns.
    pub sum_ns: u64,
    /// Shortest, ns.
    pub min_ns: u64,
    /// Longest, ns.
    pub max_ns: u64,
    /// Mean, ns.
    pub mean_ns: f64,
    /// Standard deviation, ns (from the histogram).
    pub stddev_ns: f64,
    /// Time on the CPU inside the calls (their latencies less their time off the CPU, where
    /// measured) as a share of one CPU over the window (1.0 = one CPU). A call whose time off
    /// the CPU is unknown counts whole: an upper bound then.
    pub cpu_share: Option<f64>,
    /// `(quantile, ns)`, each within `[min_ns, max_ns]`; the quantile 1.0 is the maximum.
    pub percentiles: Vec<(f64, u64)>,
}

impl Latency {
    /// The latency at quantile `q`, if it was asked for.
    pub fn at(&self, q: f64) -> Option<u64> {
        self.percentiles
            .iter()
            .find(|(x, _)| (x - q).abs() < 1e-9)
            .map(|(_, ns)| *ns)
    }
}

/// Latency figures of `h` over a window of `window`, at `quantiles`; None when no call was
/// timed (counts-only backends, or no calls).
pub fn latency(h: &HistData, window: Duration, quantiles: &[f64]) -> Option<Latency> {
    let timed = h.timed();
    if timed == 0 {
        return None;
    }

    let hdr = hdr(h);
    let (lo, hi) = (h.min_ns, h.max_ns.max(h.min_ns));
    Some(Latency {
        timed,
        sum_ns: h.sum_ns,
        min_ns: h.min_ns,
        max_ns: h.max_ns,
        mean_ns: h.sum_ns as f64 / timed as f64,
        stddev_ns: hdr.stdev(),
        cpu_share: ratio(
            h.sum_ns.saturating_sub(h.off_ns) as f64,
            window.as_nanos() as f64,
        ),
        percentiles: quantiles
            .iter()
            .map(|&q| {
                // HDR reports a bucket's highest equivalent value, which can lie outside the
                // observed range.
                let ns = if q >= 1.0 {
                    h.max_ns
                } else {
                    hdr.value_at_quantile(q).clamp(lo, hi)
                };
                (q, ns)
            })
            .collect(),
    })
}

/// What the tracer costs, from the kernel's bpf stats of its programs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TracerCost {
    /// Program run time per traced call, ns (None without bpf stats or calls).
    pub per_call_ns: Option<f64>,
    /// Program run time as a share of one CPU over the window.
    pub cpu_share: Option<f64>,
    /// Program runs.
    pub runs: u64,
}

/// The tracer's cost from its programs' total run time and runs, for `calls` traced calls over
/// `window`. Without bpf stats (run time 0) there is no figure.
pub fn cost(time: u64, runs: u64, calls: u64, window: Duration) -> TracerCost {
    let measured = time > 0;
    TracerCost {
        per_call_ns: if measured {
            ratio(time as f64, calls as f64)
        } else {
            None
        },
        cpu_share: if measured {
            ratio(time as f64, window.as_nanos() as f64)
        } else {
            None
        },
        runs,
    }
}

fn cost_of<'a>(
    programs: impl Iterator<Item = &'a ProgCost>,
    calls: u64,
    window: Duration,
) -> TracerCost {
    let (mut time, mut runs) = (0u64, 0u64);
    for p in programs {
        time = time.saturating_add(p.run_time_ns);
        runs = runs.saturating_add(p.run_cnt);
    }

    cost(time, runs, calls, window)
}

/// The tracer's cost for one probe.
pub fn probe_cost(p: &ProbeStats, window: Duration) -> TracerCost {
    cost_of(p.programs.iter(), p.calls(), window)
}

/// The tracer's cost over all probes of a snapshot.
pub fn tracer_cost(s: &Snapshot) -> TracerCost {
    let calls = s.probes.iter().map(ProbeStats::calls).sum();
    cost_of(s.probes.iter().flat_map(|p| &p.programs), calls, s.elapsed)
}

/// Calls lost (seen but not timed) and calls missed (whose programs the kernel did not run,
/// at most) over all probes of a snapshot.
pub fn losses(s: &Snapshot) -> (u64, u64) {
    (
        s.probes.iter().map(ProbeStats::lost).sum(),
        s.probes
            .iter()
            .map(|p| p.skipped_calls() + p.kprobe_missed)
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcg_trace_common::bucket_index;

    /// The workload's CPU shares of one probe's workload calls: on the CPU (time asleep out),
    /// self (nested calls' time out, their sleep not twice), the instrumentation inside the self
    /// time (p50 a call, and a nested call's cost beyond it), and the net share of the CPU less
    /// the tracer's full cost; none of the last two without a floor, no net share where the
    /// tracer's cost is all the CPU time, nothing without the CPU time.
    #[test]
    fn the_workload_cpu_shares_of_a_probe() {
        let calls = HistData {
            count: 100,
            sum_ns: 1_000_000,
            self_ns: 800_000,
            nested: 10,
            off_ns: 200_000,
            nested_off_ns: 50_000,
            ..Default::default()
        };
        let floor = Floor {
            backend: crate::probes::Backend::Fentry,
            calls: 1000,
            p50_ns: 500,
            p90_ns: 600,
            min_ns: 400,
            programs_ns: None,
            per_call_ns: Some(1_500.0),
        };
        let mut snap = crate::snapshot::for_tests::snap(1, 100, 10_000, 0);
        snap.probes[0].workload = Some(calls.clone());
        let floors = std::slice::from_ref(&floor);
        let cpu = WorkloadCpu::of(&snap, floors, Some(10_000_000));

        // 100 workload calls at 1,500 ns each in all.
        assert_eq!(
            cpu,
            Some(WorkloadCpu {
                cpu_ns: 10_000_000,
                untraced_ns: Some(9_850_000.0)
            })
        );
        let shares = cpu_shares(&calls, Some(&floor), cpu.as_ref());

        // Self on the CPU: 800,000 less its own sleep (200,000 - 50,000 nested).
        let own = 650_000.0;

        // 100 calls x 500 + 10 nested x (1,500 - 500).
        let instrumentation = 60_000.0;
        assert_eq!(
            shares,
            CpuShares {
                total: Some(800_000.0 / 1e7),
                own: Some(own / 1e7),
                instrumentation: Some(instrumentation / 1e7),
                net: Some((own - instrumentation) / 9_850_000.0),
            }
        );
        let without_floor = cpu_shares(&calls, None, cpu.as_ref());
        assert_eq!(
            (without_floor.instrumentation, without_floor.net),
            (None, None)
        );
        assert_eq!(without_floor.own, shares.own);

        // The tracer's cost is the whole CPU time: no net share.
        let all = WorkloadCpu::of(&snap, floors, Some(150_000)).unwrap();
        assert_eq!(all.untraced_ns, None);
        assert_eq!(cpu_shares(&calls, Some(&floor), Some(&all)).net, None);
        assert_eq!(WorkloadCpu::of(&snap, floors, None), None);
        assert_eq!(cpu_shares(&calls, Some(&floor), None), CpuShares::default());
    }

    #[test]
    fn percentiles_stay_within_the_claimed_1_6_percent() {
        // Spreads over six decades and more, and the worst case for a midpoint: every value at
        // the bottom or the top of its bucket. Each percentile against the exact one, held to
        // half a bucket (1/64), which docs/usage.md and memcg-trace-common claim as 1.6%.
        let spread: Vec<u64> = (0..20_000u64)
            .map(|i| 20 + (i * i * 37) % 5_000_000)
            .collect();
        let edges = |top: bool| -> Vec<u64> {
            (10..36)
                .flat_map(|p| (0..32u64).map(move |s| (p, s)))
                .map(|(p, s)| {
                    let (lo, hi) = bucket_bounds(bucket_index((1u64 << p) + (s << (p - 5))));
                    if top {
                        hi - 1
                    } else {
                        lo
                    }
                })
                .collect()
        };

        // Up to 25 s, quadratically spread.
        let heavy: Vec<u64> = (1..5_000u64).map(|i| 1_000 * i * i + 33).collect();
        for mut values in [spread, edges(false), edges(true), heavy] {
            values.sort_unstable();
            let hist = HistData::of(&values);
            let lat = latency(&hist, Duration::from_secs(1), &QUANTILES).unwrap();
            for q in [0.5, 0.9, 0.99, 0.999, 0.9999] {
                let exact =
                    values[((q * values.len() as f64).ceil() as usize).saturating_sub(1)] as f64;
                let got = lat.at(q).unwrap() as f64;
                let err = (got - exact).abs() / exact;
                assert!(
                    err <= 1.0 / 64.0,
                    "q={q}: got {got}, exact {exact}, error {err:.5} (more than half a bucket)"
                );
            }

            assert_eq!(hdr(&hist).len(), values.len() as u64);
            assert_eq!(lat.at(1.0), Some(*values.last().unwrap()));
        }
    }

    #[test]
    fn single_value_is_reported_exactly_through_min_max_clamp() {
        let lat = latency(
            &HistData::of(&[1234, 1234, 1234]),
            Duration::from_secs(1),
            &QUANTILES,
        )
        .unwrap();
        for (_, ns) in &lat.percentiles {
            assert_eq!(*ns, 1234);
        }
    }

    #[test]
    fn percentiles_are_clamped_to_the_observed_range() {
        // 3000 and 3050 share a bucket whose midpoint and top lie above 3050.
        let lat = latency(
            &HistData::of(&[3000, 3050]),
            Duration::from_secs(1),
            &QUANTILES,
        )
        .unwrap();
        for (q, ns) in &lat.percentiles {
            assert!((3000..=3050).contains(ns), "q={q}: {ns}");
        }
    }

    #[test]
    fn derived_figures_guard_division_by_zero() {
        assert_eq!(rate(10, Duration::ZERO), None);
        assert_eq!(rate(10, Duration::from_secs(2)), Some(5.0));
        assert!(latency(&HistData::default(), Duration::from_secs(1), &QUANTILES).is_none());
        let l = latency(&HistData::of(&[100, 300]), Duration::ZERO, &QUANTILES).unwrap();
        assert_eq!(l.mean_ns, 200.0);
        assert_eq!(l.cpu_share, None);
        let c = cost_of([ProgCost::default()].iter(), 0, Duration::ZERO);
        assert_eq!((c.per_call_ns, c.cpu_share), (None, None));
    }

    #[test]
    fn tracer_cost_is_run_time_per_call() {
        let progs = [
            ProgCost {
                name: "fentry_0".into(),
                run_cnt: 10,
                run_time_ns: 300,
                recursion_misses: 0,
            },
            ProgCost {
                name: "fexit_0".into(),
                run_cnt: 10,
                run_time_ns: 500,
                recursion_misses: 0,
            },
        ];
        let c = cost_of(progs.iter(), 10, Duration::from_micros(8));
        assert_eq!(c.per_call_ns, Some(80.0));
        assert_eq!(c.cpu_share, Some(0.1));
        assert_eq!(c.runs, 20);
    }
}
