//! Confirms the pairs the programs could not prove (see `memcg_trace_common::Deferred`). Such a
//! pair is wrong only if it joins a stale entry with an exit whose own entry was skipped by the
//! kernel's recursion protection, and every such skip is counted in the entry program's
//! recursion misses. So a deferred call counts if that count did not move while it ran:
//! between a reading of the count taken before the call started and one taken after it ended.
//! Otherwise it is rejected, and counted as such.

use std::collections::VecDeque;

use memcg_trace_common::{
    Deferred, DEFERRED_OFF_UNKNOWN, DEFERRED_OUTERMOST, DEFERRED_SWITCHED, DEFERRED_WORKLOAD,
    NUM_CTX,
};

use crate::snapshot::HistData;

/// CLOCK_MONOTONIC in ns, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };

    // SAFETY: clock_gettime fills the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A reading of one entry program's recursion misses, with the times just before and after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// Just before the reading: every miss that happened earlier is counted in `misses`.
    pub before: u64,
    /// The entry program's recursion misses.
    pub misses: u64,
    /// After the reading: every miss counted happened before `after`.
    pub after: u64,
}

/// What became of the deferred calls of one (probe, context).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Calls confirmed, with their latencies.
    pub hist: HistData,
    /// Calls rejected: the entry program missed a run while they were in flight.
    pub rejected: u64,
    /// Of the rejected calls, those the kernel had already counted inside an enclosing call
    /// (not `DEFERRED_OUTERMOST`): their own self times (their durations less the traced calls
    /// nested in them; the whole duration where that is unknown), ns, summed. That enclosing
    /// call's self time was reduced by their durations, yet their own self time is nobody's
    /// (the nested calls count theirs).
    pub unproven_nested_ns: u64,
    /// Of the confirmed calls that left the CPU: their time off it, ns, summed.
    pub off_cpu_ns: u64,
    /// The longest time off the CPU of one confirmed call, ns.
    pub off_cpu_max_ns: u64,
    /// Confirmed calls that left the CPU whose time off it is unknown.
    pub off_cpu_unknown: u64,
    /// Confirmed calls whose self time is unknown (counted whole in `hist.self_ns`).
    pub self_unknown: u64,
    /// Confirmed calls inside no other traced call: their latencies, ns.
    pub outermost_ns: u64,
}

/// The verifier of one tracer: marks per probe, calls waiting for a later mark, outcomes.
#[derive(Debug)]
pub struct Verifier {
    marks: Vec<VecDeque<Mark>>,
    waiting: VecDeque<Deferred>,
    /// Outcomes by probe slot and context.
    pub outcomes: Vec<[Outcome; NUM_CTX]>,
    /// Confirmed workload calls by probe slot.
    pub workload: Vec<HistData>,
    /// When false (no miss counts for this program type on this kernel), every deferred call
    /// is rejected.
    verifiable: Vec<bool>,
    /// With `--callers`: confirmed calls by call site.
    pub callers: Option<crate::callers::Confirmed>,
    /// With `--by-memcg`: confirmed calls by charged memcg.
    pub memcgs: Option<crate::callers::Confirmed>,
}

impl Verifier {
    /// A verifier for `probes` slots.
    pub fn new(probes: usize) -> Self {
        Verifier {
            marks: vec![VecDeque::new(); probes],
            waiting: VecDeque::new(),
            outcomes: vec![Default::default(); probes],
            workload: vec![HistData::default(); probes],
            verifiable: vec![true; probes],
            callers: None,
            memcgs: None,
        }
    }

    /// The verifier keeping each deferred call's site (`callers`) and memcg (`memcgs`) for the
    /// breakdowns that are on.
    pub fn with_breakdowns(mut self, callers: bool, memcgs: bool) -> Self {
        self.callers = callers.then(Default::default);
        self.memcgs = memcgs.then(Default::default);
        self
    }

    /// Whether the calls of `probe` can be verified at all.
    pub fn set_verifiable(&mut self, probe: usize, v: bool) {
        if let Some(x) = self.verifiable.get_mut(probe) {
            *x = v;
        }
    }

    /// Records a reading of `probe`'s entry program misses. Readings are kept for the whole run
    /// (a call may have started long ago), compressed: of a run of readings with the same count
    /// only the first and the last are needed.
    pub fn mark(&mut self, probe: usize, mark: Mark) {
        if let Some(m) = self.marks.get_mut(probe) {
            let n = m.len();
            if n >= 2 && m[n - 1].misses == mark.misses && m[n - 2].misses == mark.misses {
                m[n - 1] = mark;
            } else {
                m.push_back(mark);
            }
        }
    }

    /// Queues a deferred call from the ring buffer.
    pub fn push(&mut self, d: Deferred) {
        self.waiting.push_back(d);
    }

    /// Calls waiting for a reading taken after they ended.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Decides every waiting call that has a reading after its end; keeps the others.
    pub fn settle(&mut self) {
        let mut keep = VecDeque::new();
        while let Some(d) = self.waiting.pop_front() {
            let probe = d.probe as usize;
            let ctx = d.ctx as usize;
            if probe >= self.marks.len() || ctx >= NUM_CTX {
                continue;
            }

            let marks = &self.marks[probe];

            // The last reading finished before the call started, and the first begun after it
            // ended: equal counts mean no miss while it ran.
            let a = marks.iter().rev().find(|m| m.after <= d.start);
            let Some(b) = marks.iter().find(|m| m.before >= d.end) else {
                keep.push_back(d);
                continue;
            };
            let ok = self.verifiable[probe] && a.is_some_and(|a| a.misses == b.misses);
            let out = &mut self.outcomes[probe][ctx];
            if ok {
                let ns = d.end - d.start;

                // The traced calls nested in it are known unless marked otherwise.
                let (self_ns, nested, self_known) = match ns.checked_sub(d.child_ns) {
                    Some(s) if d.child_ns != u64::MAX => (s, d.child_calls as u64, true),
                    _ => {
                        out.self_unknown += 1;
                        (ns, 0, false)
                    }
                };

                // Its time off the CPU, where known.
                let off = if d.flags & DEFERRED_SWITCHED != 0 && d.flags & DEFERRED_OFF_UNKNOWN == 0
                {
                    d.off_ns
                } else {
                    0
                };

                // What its nested calls spent off the CPU, of its own time off it.
                let nested_off = if self_known {
                    d.child_off_ns.min(off)
                } else {
                    0
                };
                add(&mut out.hist, ns, self_ns, nested, off, nested_off);
                if d.flags & DEFERRED_OUTERMOST != 0 {
                    out.outermost_ns += ns;
                }

                if d.flags & DEFERRED_OFF_UNKNOWN != 0 {
                    out.off_cpu_unknown += 1;
                } else if d.flags & DEFERRED_SWITCHED != 0 {
                    out.off_cpu_ns += d.off_ns;
                    out.off_cpu_max_ns = out.off_cpu_max_ns.max(d.off_ns);
                }

                if d.flags & DEFERRED_WORKLOAD != 0 {
                    add(
                        &mut self.workload[probe],
                        ns,
                        self_ns,
                        nested,
                        off,
                        nested_off,
                    );
                }

                if let Some(c) = self.callers.as_mut() {
                    c.add(d.probe, d.ctx as u32, d.caller, ns);
                }

                if let Some(c) = self.memcgs.as_mut() {
                    c.add(d.probe, d.ctx as u32, d.memcg, ns);
                }
            } else {
                out.rejected += 1;
                if d.flags & DEFERRED_OUTERMOST == 0 {
                    let ns = d.end.saturating_sub(d.start);
                    out.unproven_nested_ns += match ns.checked_sub(d.child_ns) {
                        Some(own) if d.child_ns != u64::MAX => own,
                        _ => ns,
                    };
                }
            }
        }

        self.waiting = keep;
    }
}

/// Adds one latency, and its self time, to a histogram.
fn add(h: &mut HistData, ns: u64, self_ns: u64, nested: u64, off: u64, nested_off: u64) {
    h.off_ns += off;
    h.nested_off_ns += nested_off;
    h.count += 1;
    h.sum_ns += ns;
    h.self_ns += self_ns;
    h.nested += nested;
    h.max_ns = h.max_ns.max(ns);
    h.min_ns = if h.min_ns == 0 { ns } else { h.min_ns.min(ns) };
    h.buckets[memcg_trace_common::bucket_index(ns)] += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcg_trace_common::{CTX_HARDIRQ, CTX_TASK};

    fn call(start: u64, end: u64, ctx: u32) -> Deferred {
        Deferred {
            start,
            end,
            probe: 0,
            ctx: ctx as u8,
            flags: 0,
            child_calls: 0,
            child_ns: 0,
            off_ns: 0,
            child_off_ns: 0,
            caller: 0,
            memcg: 0,
        }
    }

    fn mark(before: u64, misses: u64) -> Mark {
        Mark {
            before,
            misses,
            after: before + 5,
        }
    }

    #[test]
    fn a_call_without_misses_around_it_counts() {
        let mut verifier = Verifier::new(1);
        verifier.mark(0, mark(0, 7));
        verifier.push(call(100, 900, CTX_TASK));
        verifier.settle();
        assert_eq!(verifier.waiting(), 1, "no reading after its end yet");
        verifier.mark(0, mark(1000, 7));
        verifier.settle();
        assert_eq!(verifier.waiting(), 0);
        assert_eq!(verifier.outcomes[0][0].hist.count, 1);
        assert_eq!(verifier.outcomes[0][0].hist.sum_ns, 800);
        assert_eq!(verifier.outcomes[0][0].rejected, 0);
    }

    #[test]
    fn confirmed_calls_that_left_the_cpu_carry_their_time_off_it() {
        let mut verifier = Verifier::new(1);
        verifier.mark(0, mark(0, 7));
        let mut slept = call(100, 900, CTX_TASK);
        slept.flags = DEFERRED_SWITCHED;
        slept.off_ns = 500;
        let mut slept_less = call(1000, 1900, CTX_TASK);
        slept_less.flags = DEFERRED_SWITCHED;
        slept_less.off_ns = 300;
        let mut unknown = call(2000, 2900, CTX_TASK);
        unknown.flags = DEFERRED_SWITCHED | DEFERRED_OFF_UNKNOWN;
        verifier.push(slept);
        verifier.push(slept_less);
        verifier.push(unknown);
        verifier.mark(0, mark(3000, 7));
        verifier.settle();
        let outcome = &verifier.outcomes[0][0];
        assert_eq!(outcome.hist.count, 3);
        assert_eq!(
            (
                outcome.off_cpu_ns,
                outcome.off_cpu_max_ns,
                outcome.off_cpu_unknown
            ),
            (800, 500, 1)
        );

        // Rejected calls add nothing.
        let mut rejected = call(4000, 4900, CTX_TASK);
        rejected.flags = DEFERRED_SWITCHED;
        rejected.off_ns = 900;
        verifier.push(rejected);
        verifier.mark(0, mark(5000, 8));
        verifier.settle();
        let outcome = &verifier.outcomes[0][0];
        assert_eq!((outcome.rejected, outcome.off_cpu_ns), (1, 800));
    }

    /// A confirmed call carries the part of its time off the CPU that its nested calls spent
    /// there, so that its self time on the CPU does not lose it twice; not where its self time
    /// is unknown.
    #[test]
    fn confirmed_calls_carry_their_nested_calls_time_off_the_cpu() {
        let mut verifier = Verifier::new(1);
        verifier.mark(0, mark(0, 7));
        let mut first = call(1000, 3500, CTX_TASK);
        first.flags = DEFERRED_SWITCHED;
        (first.off_ns, first.child_ns, first.child_off_ns) = (1500, 1900, 1500);
        let mut b = call(4000, 5000, CTX_TASK);
        b.flags = DEFERRED_SWITCHED;
        (b.off_ns, b.child_ns, b.child_off_ns) = (300, u64::MAX, 200);
        verifier.push(first);
        verifier.push(b);
        verifier.mark(0, mark(6000, 7));
        verifier.settle();
        let h = &verifier.outcomes[0][0].hist;
        assert_eq!((h.off_ns, h.nested_off_ns), (1800, 1500));
        assert_eq!(h.self_ns, 600 + 1000);

        // first: 600 self, none of its own off the CPU; b: 1000 whole, 300 off it.
        assert_eq!(h.self_on_cpu_ns(), 600 + 700);
    }

    #[test]
    fn a_miss_while_a_call_was_in_flight_rejects_it() {
        let mut verifier = Verifier::new(1);
        verifier.mark(0, mark(0, 7));
        verifier.push(call(100, 900, CTX_HARDIRQ));
        verifier.push(call(1100, 1200, CTX_HARDIRQ));
        verifier.mark(0, mark(1000, 8));
        verifier.mark(0, mark(2000, 8));
        verifier.settle();
        let o = &verifier.outcomes[0][CTX_HARDIRQ as usize];
        assert_eq!((o.hist.count, o.rejected), (1, 1), "the first is rejected");
        assert_eq!(o.hist.sum_ns, 100);

        // Nested (no DEFERRED_OUTERMOST): its 800 ns were taken out of its enclosing call.
        assert_eq!(o.unproven_nested_ns, 800);
    }

    #[test]
    fn a_rejected_nested_call_leaves_out_only_its_own_self_time() {
        let mut verifier = Verifier::new(1);
        verifier.mark(0, mark(0, 7));

        // 800 ns, of which 300 in traced calls nested in it (which count their own).
        let mut with_nested = call(100, 900, CTX_TASK);
        with_nested.child_ns = 300;
        verifier.push(with_nested);

        // Its nesting unknown: the whole duration, an upper bound.
        let mut d = call(200, 700, CTX_TASK);
        d.child_ns = u64::MAX;
        verifier.push(d);
        verifier.mark(0, mark(1000, 8));
        verifier.settle();
        let o = &verifier.outcomes[0][0];
        assert_eq!((o.rejected, o.unproven_nested_ns), (2, 500 + 500));
    }

    #[test]
    fn a_rejected_outermost_call_took_no_time_from_another() {
        let mut verifier = Verifier::new(1);
        verifier.mark(0, mark(0, 7));
        let mut d = call(100, 900, CTX_TASK);
        d.flags = DEFERRED_OUTERMOST;
        verifier.push(d);
        verifier.mark(0, mark(1000, 8));
        verifier.settle();
        let o = &verifier.outcomes[0][0];
        assert_eq!((o.rejected, o.unproven_nested_ns), (1, 0));
    }

    #[test]
    fn a_reading_that_overlaps_the_call_is_not_used() {
        let mut verifier = Verifier::new(1);

        // The reading ends after the call started: a miss it counted may be inside the call.
        verifier.mark(
            0,
            Mark {
                before: 50,
                misses: 1,
                after: 150,
            },
        );
        verifier.push(call(100, 900, CTX_TASK));
        verifier.mark(0, mark(1000, 1));
        verifier.settle();
        assert_eq!(
            verifier.outcomes[0][0].rejected, 1,
            "no reading before the call: cannot confirm"
        );
    }

    #[test]
    fn a_call_that_began_many_readings_ago_is_still_decided() {
        let mut verifier = Verifier::new(1);
        verifier.mark(0, mark(0, 3));
        for t in 1..1000 {
            verifier.mark(0, mark(t * 1000, 3));
            verifier.settle();
        }

        // A call that began before the second reading ends only now.
        verifier.push(call(100, 999_500, CTX_TASK));
        verifier.mark(0, mark(1_000_000, 3));
        verifier.settle();
        assert_eq!(
            verifier.outcomes[0][0].hist.count, 1,
            "confirmed across 1000 readings"
        );
        assert!(
            verifier.marks[0].len() <= 3,
            "equal readings compressed: {}",
            verifier.marks[0].len()
        );
    }

    #[test]
    fn unverifiable_probes_reject_every_deferred_call() {
        let mut verifier = Verifier::new(1);
        verifier.set_verifiable(0, false);
        verifier.mark(0, mark(0, 0));
        verifier.push(call(100, 900, CTX_TASK));
        verifier.mark(0, mark(1000, 0));
        verifier.settle();
        assert_eq!(verifier.outcomes[0][0].rejected, 1);
    }
}
