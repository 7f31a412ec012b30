//! A run's history, tick by tick: per probe and row (context, or the workload), the calls and
//! the interval p50, p99 and max of each tick. Kept by the live session, written into the
//! recording (`history`), shown by `view` (the rate and p99 panes, stepped through with the
//! arrow keys). Compact: four numbers per row and tick; the full interval histograms are the
//! interval log's (`--hdr-log`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{
    figures,
    snapshot::{HistData, ProbeStats, Snapshot},
};

/// At most this many ticks are kept (2 h 16 min at a 1 s tick; 32 bytes per row and tick, so
/// a few MiB at most); beyond, every second tick is merged into its neighbour, halving the
/// resolution of the whole run.
pub const MAX_TICKS: usize = 8192;

/// The history of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// End of each tick, ms since tracing started.
    pub t_ms: Vec<u64>,
    /// One series per probe and row.
    pub rows: Vec<Series>,
}

/// One row's series, aligned with [`History::t_ms`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Probe name.
    pub probe: String,
    /// Context name, or "workload".
    pub context: String,
    /// Calls in each tick.
    pub calls: Vec<u64>,
    /// p50 of the calls timed in each tick, ns (0: none timed, or counts only).
    pub p50_ns: Vec<u64>,
    /// p99, likewise.
    pub p99_ns: Vec<u64>,
    /// Longest call of each tick, ns, likewise.
    pub max_ns: Vec<u64>,
}

/// One row's figures in one tick.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Point {
    calls: u64,
    p50_ns: u64,
    p99_ns: u64,
    max_ns: u64,
}

impl Series {
    fn push(&mut self, p: Point) {
        self.calls.push(p.calls);
        self.p50_ns.push(p.p50_ns);
        self.p99_ns.push(p.p99_ns);
        self.max_ns.push(p.max_ns);
    }

    /// Adds a short tick to the last one: calls add, percentiles the larger (an upper bound).
    fn merge_last(&mut self, p: Point) {
        if let Some(c) = self.calls.last_mut() {
            *c += p.calls;
        }

        for (v, x) in [
            (&mut self.p50_ns, p.p50_ns),
            (&mut self.p99_ns, p.p99_ns),
            (&mut self.max_ns, p.max_ns),
        ] {
            if let Some(l) = v.last_mut() {
                *l = (*l).max(x);
            }
        }
    }

    /// Calls per second in tick `i` of `h`.
    pub fn rate(&self, h: &History, i: usize) -> Option<f64> {
        let end = *h.t_ms.get(i)?;
        let start = if i == 0 { 0 } else { h.t_ms[i - 1] };
        figures::rate(
            *self.calls.get(i)?,
            Duration::from_millis(end.saturating_sub(start)),
        )
    }
}

/// Builds a [`History`] from the snapshots of a live session.
#[derive(Debug, Default)]
pub struct Recorder {
    last: Option<Snapshot>,
    history: History,
}

/// A probe's rows in this tick (context name, the histogram since `before`, its calls): each
/// context's, then the workload's.
fn tick_rows<'a>(
    snap: &'a Snapshot,
    p: &ProbeStats,
    before: Option<&ProbeStats>,
) -> Vec<(&'a str, HistData, u64)> {
    let empty = HistData::default();
    let mut rows = Vec::new();
    for (i, c) in p.contexts.iter().enumerate() {
        let calls = p
            .ctx_calls(i)
            .saturating_sub(before.map_or(0, |b| b.ctx_calls(i)));
        let h = c.hist.since(before.map_or(&empty, |b| &b.contexts[i].hist));
        rows.push((snap.ctx_name(i), h, calls));
    }

    if let Some(w) = &p.workload {
        let h = w.since(before.and_then(|b| b.workload.as_ref()).unwrap_or(&empty));
        let calls = h.count;
        rows.push(("workload", h, calls));
    }
    rows
}

impl Recorder {
    /// Takes in the next snapshot (cumulative, as the collector sends them).
    pub fn push(&mut self, snap: &Snapshot) {
        if let Some(last) = &self.last {
            if snap.elapsed <= last.elapsed {
                return;
            }
        }

        let ticks = self.history.t_ms.len();
        let now_ms = snap.elapsed.as_millis() as u64;
        let merge = self.joins_last_tick(now_ms);

        for p in &snap.probes {
            let before = self
                .last
                .as_ref()
                .and_then(|l| l.probes.iter().find(|q| q.name == p.name));
            for (context, h, calls) in tick_rows(snap, p, before) {
                let Some(series) = self.series_mut(&p.name, context, ticks, calls) else {
                    continue;
                };
                let latency = p
                    .backend
                    .has_latency()
                    .then(|| figures::latency(&h, Duration::ZERO, &[0.5, 0.99]))
                    .flatten();
                let point = Point {
                    calls,
                    p50_ns: latency.as_ref().and_then(|l| l.at(0.5)).unwrap_or(0),
                    p99_ns: latency.as_ref().and_then(|l| l.at(0.99)).unwrap_or(0),
                    max_ns: latency.as_ref().map_or(0, |l| l.max_ns),
                };
                if merge {
                    series.merge_last(point);
                } else {
                    series.push(point);
                }
            }
        }

        if merge {
            *self.history.t_ms.last_mut().expect("merge needs a tick") = now_ms;
        } else {
            self.history.t_ms.push(now_ms);
        }

        // Rows without a snapshot row this tick (a probe gone) stay aligned.
        let tick_count = self.history.t_ms.len();
        for s in &mut self.history.rows {
            while s.calls.len() < tick_count {
                s.push(Point::default());
            }
        }

        if tick_count > MAX_TICKS {
            self.halve();
        }

        self.last = Some(snap.clone());
    }

    /// Whether a snapshot at `now_ms` joins the last tick instead of starting one: a tick
    /// shorter than half the one before (the final snapshot, taken at the stop, anywhere up to
    /// a tick after the last) joins it: no spiky rate, no zero-length tick.
    fn joins_last_tick(&self, now_ms: u64) -> bool {
        let t_ms = &self.history.t_ms;
        let ticks = t_ms.len();
        if ticks == 0 {
            return false;
        }

        let last = t_ms[ticks - 1];
        let before = if ticks > 1 { t_ms[ticks - 2] } else { 0 };
        2 * now_ms.saturating_sub(last) < last - before
    }

    /// The series of (`probe`, `context`), added (zeros in the `ticks` before) if this tick is
    /// its first with `calls`; None for a row not seen yet and without calls now.
    fn series_mut(
        &mut self,
        probe: &str,
        context: &str,
        ticks: usize,
        calls: u64,
    ) -> Option<&mut Series> {
        let rows = &mut self.history.rows;
        match rows
            .iter()
            .position(|s| s.probe == probe && s.context == context)
        {
            Some(i) => Some(&mut rows[i]),
            None if calls == 0 => None,
            None => {
                // A row seen first now: nothing in the ticks before.
                rows.push(Series {
                    probe: probe.to_string(),
                    context: context.into(),
                    calls: vec![0; ticks],
                    p50_ns: vec![0; ticks],
                    p99_ns: vec![0; ticks],
                    max_ns: vec![0; ticks],
                });
                rows.last_mut()
            }
        }
    }

    /// Merges each pair of ticks into one: calls add, the percentiles of the pair are the
    /// larger of the two (an upper bound: the pair's histograms are not kept).
    fn halve(&mut self) {
        let history = &mut self.history;
        let pairs = |v: &[u64], f: fn(u64, u64) -> u64| -> Vec<u64> {
            v.chunks(2)
                .map(|c| c.iter().copied().reduce(f).unwrap_or(0))
                .collect()
        };
        history.t_ms = history
            .t_ms
            .chunks(2)
            .map(|c| *c.last().expect("non-empty"))
            .collect();
        for s in &mut history.rows {
            s.calls = pairs(&s.calls, |a, b| a + b);
            s.p50_ns = pairs(&s.p50_ns, u64::max);
            s.p99_ns = pairs(&s.p99_ns, u64::max);
            s.max_ns = pairs(&s.max_ns, u64::max);
        }
    }

    /// The history so far.
    pub fn history(&self) -> &History {
        &self.history
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::for_tests::snap;

    #[test]
    fn ticks_hold_interval_calls_and_percentiles() {
        let mut recorder = Recorder::default();

        // 45k task calls of 700 ns per second, 30 softirq calls per second.
        for i in 1..=4 {
            recorder.push(&snap(i, i * 45_000, 700, i * 30));
        }

        let history = recorder.history();
        assert_eq!(history.t_ms, vec![1000, 2000, 3000, 4000]);
        let task = history
            .rows
            .iter()
            .find(|s| s.context == "task")
            .expect("task row");
        assert_eq!(task.calls, vec![45_000; 4]);
        assert!(
            task.p50_ns.iter().all(|&p| (512..1024).contains(&p)),
            "{task:?}"
        );
        assert_eq!(task.rate(history, 2), Some(45_000.0));
        let soft = history
            .rows
            .iter()
            .find(|s| s.context == "softirq")
            .expect("softirq");
        assert_eq!(soft.calls.iter().sum::<u64>(), 120);

        // A repeated snapshot adds no tick.
        recorder.push(&snap(4, 4 * 45_000, 700, 120));
        assert_eq!(recorder.history().t_ms.len(), 4);

        // The stop's snapshot 1 ms after the last tick joins it: the calls are kept, the
        // tick is not a 1 ms spike.
        let mut last = snap(4, 4 * 45_000 + 50, 700, 120);
        last.elapsed += Duration::from_millis(1);
        recorder.push(&last);
        let h = recorder.history();
        assert_eq!(h.t_ms, vec![1000, 2000, 3000, 4001]);
        let task = h.rows.iter().find(|s| s.context == "task").unwrap();
        assert_eq!(task.calls, vec![45_000, 45_000, 45_000, 45_050]);
    }

    #[test]
    fn a_long_run_is_halved_not_cut() {
        let mut recorder = Recorder::default();
        for i in 1..=(MAX_TICKS as u64 + 1) {
            recorder.history.t_ms.push(i);
            let _ = i;
        }

        recorder.history.rows.push(Series {
            probe: "x".into(),
            context: "task".into(),
            calls: vec![1; MAX_TICKS + 1],
            p50_ns: vec![5; MAX_TICKS + 1],
            p99_ns: vec![9; MAX_TICKS + 1],
            max_ns: vec![9; MAX_TICKS + 1],
        });
        recorder.halve();
        let h = recorder.history();
        assert_eq!(h.t_ms.len(), MAX_TICKS / 2 + 1);
        assert_eq!(h.rows[0].calls.iter().sum::<u64>(), MAX_TICKS as u64 + 1);
        assert_eq!(*h.t_ms.last().unwrap(), MAX_TICKS as u64 + 1);
    }
}
