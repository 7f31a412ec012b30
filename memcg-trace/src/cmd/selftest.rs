//! `memcg-trace selftest` (hidden): the programs' code checked on this kernel. The bucketing
//! and the pairing run through BPF_PROG_TEST_RUN on given inputs (sequences of entries and
//! exits with skipped halves, nesting, interrupts, switches, migration), the pairs the programs
//! defer go through the real userspace verifier, and the context classification is checked on
//! tracepoints of known context, including sources the calibration does not use. Prints one
//! line per check and ends with `selftest: N failures`.

use std::time::Duration;

use anyhow::Result;
use memcg_trace_common::{
    bucket_by_log, CtxUse, Deferred, KernelLayout, CTX_HARDIRQ, CTX_NAMES, CTX_SOFTIRQ, CTX_TASK,
    DEFERRED_MIGRATED, DEFERRED_OFF_UNKNOWN, DEFERRED_OUTERMOST, DEFERRED_SWITCHED, EVICTED_KEPT,
    NUM_CTX, TASK_SLOTS,
};

use crate::{
    calibrate, kernel,
    session::check_privileges,
    tracer::{
        checks::{self, Outcome, RigKind, Step},
        deferred::{Mark, Verifier},
        possible_cpus, Object,
    },
};

/// What must come of a pairing case's steps.
type Check = fn(&Outcome) -> Result<(), String>;

/// A pairing case: steps, and what must come of them.
struct Case {
    name: &'static str,
    /// CPUs the case needs.
    cpus: usize,
    /// The kind of kernel the programs are loaded for.
    kernel: RigKind,
    steps: Vec<Step>,
    check: Check,
}

/// A preemptible kernel whose CPUs' task clocks are comparable (Debian's).
const PREEMPT: RigKind = RigKind {
    preemptible: true,
    cross_cpu_clock: true,
    kprobe_defers: true,
    interleaving: false,
};
/// A preemptible kernel traced with fentry, whose program runs interleave on one CPU.
const PREEMPT_INTERLEAVING: RigKind = RigKind {
    preemptible: true,
    cross_cpu_clock: true,
    kprobe_defers: true,
    interleaving: true,
};
/// A kernel that is not preemptible: task calls that left the CPU are timed in the kernel.
const NO_PREEMPT: RigKind = RigKind {
    preemptible: false,
    cross_cpu_clock: true,
    kprobe_defers: false,
    interleaving: false,
};

const T: u64 = 0xffff_8880_0000_1000;
const T2: u64 = 0xffff_8880_0000_2000;
/// A threaded interrupt handler and a softirq thread: the test program reads a task's kind from
/// the top byte of its id (1 and 2; T's and T2's are neither).
const T_IRQ: u64 = 0x01ff_8880_0000_3000;
const T_SOFTIRQ: u64 = 0x02ff_8880_0000_4000;

// The sequences' notation: a short constructor per kind of step, its arguments in the order
// of the variant's fields (`Step`), so that a sequence reads as a table of runs.

/// [`Step::Entry`].
#[allow(non_snake_case)]
fn E(key: u64, ctx: u32, task: u64, switches: u64, now: u64, workload: bool, cpu: u32) -> Step {
    Step::Entry {
        key,
        ctx,
        task,
        switches,
        now,
        workload,
        cpu,
    }
}

/// [`Step::EntryFentry`].
#[allow(non_snake_case)]
fn EF(key: u64, ctx: u32, misses: u64, now: u64, cpu: u32) -> Step {
    Step::EntryFentry {
        key,
        ctx,
        misses,
        now,
        cpu,
    }
}

/// [`Step::EntryMisses`].
#[allow(non_snake_case)]
fn EM(key: u64, task: u64, switches: u64, misses: u64, now: u64, fentry: bool, cpu: u32) -> Step {
    Step::EntryMisses {
        key,
        task,
        switches,
        misses,
        now,
        fentry,
        cpu,
    }
}

/// [`Step::ExitFentry`].
#[allow(non_snake_case)]
fn XF(key: u64, ctx: u32, task: u64, misses: Option<u64>, now: u64, cpu: u32) -> Step {
    Step::ExitFentry {
        key,
        ctx,
        task,
        misses,
        now,
        cpu,
    }
}

/// [`Step::ExitKprobe`].
#[allow(non_snake_case)]
fn XK(key: u64, ctx: u32, task: u64, switches: u64, now: u64, cpu: u32) -> Step {
    Step::ExitKprobe {
        key,
        ctx,
        task,
        switches,
        now,
        cpu,
    }
}

/// [`Step::ExitKprobeClock`].
#[allow(non_snake_case)]
fn XKC(key: u64, ctx: u32, task: u64, switches: u64, clock: u64, now: u64, cpu: u32) -> Step {
    Step::ExitKprobeClock {
        key,
        ctx,
        task,
        switches,
        clock,
        now,
        cpu,
    }
}

/// [`Step::ExitMisses`].
#[allow(non_snake_case)]
fn XM(key: u64, task: u64, switches: u64, misses: u64, now: u64, fentry: bool, cpu: u32) -> Step {
    Step::ExitMisses {
        key,
        task,
        switches,
        misses,
        now,
        fentry,
        cpu,
    }
}

/// Every entry and exit run is accounted for: entries = paired + ambiguous + deferred +
/// deferred_lost + stale + evicted + pending, exits = paired + ambiguous + deferred +
/// deferred_lost + orphans + evicted exits + outside.
fn accounted(o: &Outcome) -> Result<(), String> {
    let sum = |f: fn(&memcg_trace_common::Counters) -> u64| o.counters.iter().map(f).sum::<u64>();
    let entries = sum(|c| c.entries);
    let ended =
        sum(|c| c.paired + c.ambiguous + c.deferred + c.deferred_lost + c.stale + c.evicted)
            + o.pending;
    let exits = sum(|c| c.exits);
    let matched = sum(|c| {
        c.paired
            + c.ambiguous
            + c.deferred
            + c.deferred_lost
            + c.orphans
            + c.evicted_exits
            + c.outside
    });
    if entries != ended || exits != matched {
        return Err(format!(
            "not every run accounted for: entries {entries} vs {ended}, exits {exits} vs {matched}"
        ));
    }

    for (ctx, h) in o.hist.iter().enumerate() {
        if h.count != o.counters[ctx].paired {
            return Err(format!(
                "{}: histogram holds {} calls, {} paired",
                CTX_NAMES[ctx], h.count, o.counters[ctx].paired
            ));
        }

        // Per call site (the test's site of a call is its frame with bit 0 set) and per
        // charged memcg (its frame with bits 0 and 1 set): the rows' calls and the "other"
        // row add up to the paired calls, their time to the histogram's.
        let c = &o.counters[ctx];
        breakdown_adds_up("call site", &o.sites, ctx, c.callers_other, h, 1)?;
        breakdown_adds_up("memcg", &o.memcgs, ctx, c.memcgs_other, h, 3)?;
    }

    if let Some(d) = o
        .deferred
        .iter()
        .find(|d| d.caller & 1 == 0 || d.memcg & 3 != 3)
    {
        return Err(format!(
            "deferred pair without its entry's call site or memcg: {d:?}"
        ));
    }
    Ok(())
}

/// The rows of one context of a breakdown (`rows`: context, id, calls, summed ns) and its
/// `other` count add up to the histogram `h`, and every id carries the test's `tag` bits.
fn breakdown_adds_up(
    what: &str,
    rows: &[(u32, u64, u64, u64)],
    ctx: usize,
    other: u64,
    h: &crate::snapshot::HistData,
    tag: u64,
) -> Result<(), String> {
    let rows = rows.iter().filter(|r| r.0 == ctx as u32);
    let (calls, ns) = rows.clone().fold((0, 0), |a, r| (a.0 + r.2, a.1 + r.3));
    if calls + other != h.count || ns != h.sum_ns {
        return Err(format!(
            "{}: {what} rows hold {calls} calls ({ns} ns) + {other} other, the histogram {} ({} ns)",
            CTX_NAMES[ctx], h.count, h.sum_ns
        ));
    }

    if let Some(r) = rows.clone().find(|r| r.1 & tag != tag) {
        return Err(format!(
            "{}: {what} {:#x} is no entry's",
            CTX_NAMES[ctx], r.1
        ));
    }
    Ok(())
}

/// Self times add up to the traced time counted once: the summed self time of every timed
/// call (the kernel's histograms and the deferred pairs) equals the summed duration of the
/// outermost calls when nothing was lost, left pending or of unknown nesting, and is never
/// below it (a lost call's nested calls are in nobody's time).
fn self_times(o: &Outcome) -> Result<(), String> {
    // Both probe slots' calls (a sequence may nest one probe's calls in the other's).
    let mut self_ns: u64 = o.hist.iter().map(|h| h.self_ns).sum::<u64>()
        + o.probe1.iter().map(|(_, h)| h.self_ns).sum::<u64>();
    let mut outer: u64 = o.counters.iter().map(|c| c.outermost_ns).sum::<u64>()
        + o.probe1.iter().map(|(c, _)| c.outermost_ns).sum::<u64>();
    let mut clean = o.pending == 0
        && o.probe1.iter().all(|(c, _)| {
            c.stale + c.evicted + c.orphans + c.ambiguous + c.deferred_lost + c.self_unknown == 0
        });
    for (ctx, h) in o.hist.iter().enumerate() {
        let counters = &o.counters[ctx];
        if h.self_ns > h.sum_ns {
            return Err(format!(
                "{}: self {} ns above the total {} ns",
                CTX_NAMES[ctx], h.self_ns, h.sum_ns
            ));
        }
        clean &= counters.stale
            + counters.evicted
            + counters.orphans
            + counters.ambiguous
            + counters.deferred_lost
            + counters.self_unknown
            == 0;
    }

    for d in &o.deferred {
        let ns = d.end - d.start;
        if d.child_ns == u64::MAX {
            clean = false;
            self_ns += ns;
        } else {
            self_ns += ns.saturating_sub(d.child_ns);
        }

        if d.flags & DEFERRED_OUTERMOST != 0 {
            outer += ns;
        }
    }

    if (clean && self_ns != outer) || self_ns < outer {
        return Err(format!(
            "self times add up to {self_ns} ns, the outermost calls to {outer} ns{}",
            if clean { "" } else { " (with losses)" }
        ));
    }
    Ok(())
}

/// The self time of the calls timed in one context.
fn self_time(o: &Outcome, ctx: u32, want: u64) -> Result<(), String> {
    expect(
        &format!("{} self ns", CTX_NAMES[ctx as usize]),
        o.hist[ctx as usize].self_ns,
        want,
    )
}

/// The calls of `ctx` counted as outermost (no traced call open around them) took `want` ns.
fn outermost(o: &Outcome, ctx: u32, want: u64) -> Result<(), String> {
    expect(
        &format!("{} outermost ns", CTX_NAMES[ctx as usize]),
        o.counters[ctx as usize].outermost_ns,
        want,
    )
}

fn expect(what: &str, got: u64, want: u64) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: {got}, expected {want}"))
    }
}

fn timed(o: &Outcome, ctx: u32, calls: u64, sum_ns: u64) -> Result<(), String> {
    let hist = &o.hist[ctx as usize];
    expect(
        &format!("{} calls timed", CTX_NAMES[ctx as usize]),
        hist.count,
        calls,
    )?;
    expect(
        &format!("{} ns timed", CTX_NAMES[ctx as usize]),
        hist.sum_ns,
        sum_ns,
    )?;

    // One call is its own maximum and minimum: the programs' extremes (compare-and-swap
    // where runs interleave) must hold it, not only its bucket.
    if calls == 1 {
        let what = |x: &str| format!("{} {x} ns", CTX_NAMES[ctx as usize]);
        expect(&what("max"), hist.max_ns, sum_ns)?;
        expect(&what("min"), hist.min_ns, sum_ns)?;
    }
    Ok(())
}

/// The deferred pairs as (start, end, context, flags); whether a pair was outermost is
/// checked by `self_times`.
fn deferred(o: &Outcome, want: &[(u64, u64, u32, u8)]) -> Result<(), String> {
    let got: Vec<(u64, u64, u32, u8)> = o
        .deferred
        .iter()
        .map(|d| (d.start, d.end, d.ctx as u32, d.flags & !DEFERRED_OUTERMOST))
        .collect();
    if got == want {
        Ok(())
    } else {
        Err(format!("deferred pairs {got:?}, expected {want:?}"))
    }
}

/// The time off the CPU each deferred pair carries.
fn off_cpu(o: &Outcome, want: &[u64]) -> Result<(), String> {
    let got: Vec<u64> = o.deferred.iter().map(|d| d.off_ns).collect();
    if got == want {
        Ok(())
    } else {
        Err(format!("deferred off-CPU ns {got:?}, expected {want:?}"))
    }
}

/// The cases, by what they test, in the order they run.
fn cases() -> Vec<Case> {
    [
        pairing_cases(),
        nesting_cases(),
        interrupts_cases(),
        left_the_cpu_cases(),
        migrated_cases(),
        evicted_cases(),
        no_split_and_workload_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// A call paired with its own entry, and what is not: skipped entries and exits, fentry's
/// hardirq pairs.
fn pairing_cases() -> Vec<Case> {
    let task = CTX_TASK;
    let hard = CTX_HARDIRQ;
    vec![
        Case {
            name: "a task call is paired with its own entry",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![E(0xa0, task, T, 5, 1000, false, 0), XK(0xa0, task, T, 5, 1600, 0)],
            check: |o| timed(o, CTX_TASK, 1, 600),
        },
        Case {
            name: "task calls of an interrupt thread and of a softirq thread are counted apart",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T_IRQ, 5, 1000, false, 0),
                XK(0xa0, task, T_IRQ, 5, 1100, 0),
                E(0x90, task, T_SOFTIRQ, 5, 1200, false, 0),
                XK(0x90, task, T_SOFTIRQ, 5, 1400, 0),
                E(0x80, task, T, 5, 1500, false, 0),
                XK(0x80, task, T, 5, 1800, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 3, 100 + 200 + 300)?;
                expect("irq thread", o.counters[0].irq_thread, 1)?;
                expect("softirq thread", o.counters[0].softirq_thread, 1)
            },
        },
        Case {
            name: "exit skipped, then a new call at the same frame",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                E(0xa0, task, T, 5, 2000, false, 0),
                XK(0xa0, task, T, 5, 2500, 0),
            ],
            check: |o| {
                expect("lost exits", o.counters[0].stale, 1)?;
                timed(o, CTX_TASK, 1, 500)
            },
        },
        Case {
            name: "entry skipped: the exit is an orphan, never a sample",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![XK(0xa0, task, T, 5, 3000, 0)],
            check: |o| {
                expect("orphan exits", o.counters[0].orphans, 1)?;
                timed(o, CTX_TASK, 0, 0)
            },
        },
        Case {
            name: "fentry hardirq pair (could be a stale entry and an orphan exit): deferred, not counted",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xb0, hard, 0, 0, 1000, false, 0),
                XF(0xb0, hard, 0, None, 5000, 0),
            ],
            check: |o| {
                timed(o, CTX_HARDIRQ, 0, 0)?;
                deferred(o, &[(1000, 5000, CTX_HARDIRQ, 0)])
            },
        },
        Case {
            name: "fentry hardirq pair, entry program's misses on this CPU unmoved: the call's own entry, counted",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                EF(0xb0, hard, 7, 1000, 0),
                XF(0xb0, hard, 0, Some(7), 1300, 0),
            ],
            check: |o| {
                timed(o, CTX_HARDIRQ, 1, 300)?;
                deferred(o, &[])
            },
        },
        Case {
            name: "fentry hardirq pair, entry program missed a run on this CPU meanwhile: not counted",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                EF(0xb0, hard, 7, 1000, 0),
                XF(0xb0, hard, 0, Some(8), 5000, 0),
            ],
            check: |o| {
                expect("ambiguous", o.counters[CTX_HARDIRQ as usize].ambiguous, 1)?;
                timed(o, CTX_HARDIRQ, 0, 0)?;
                deferred(o, &[])
            },
        },
    ]
}

/// Calls inside calls: the same function and another probe's, in task context and in
/// interrupts, asleep or not; what an enclosing call's self time keeps.
fn nesting_cases() -> Vec<Case> {
    let task = CTX_TASK;
    let soft = CTX_SOFTIRQ;
    let hard = CTX_HARDIRQ;
    vec![
        Case {
            name: "the same function nested in task context",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                E(0x90, task, T, 5, 1100, false, 0),
                XK(0x90, task, T, 5, 1300, 0),
                XK(0xa0, task, T, 5, 2000, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 2, 200 + 1000)?;

                // The inner call's time is not the outer one's own.
                self_time(o, CTX_TASK, 200 + 800)
            },
        },
        Case {
            name: "not preemptible: another task's calls while a task call is off the CPU are not nested in it",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                // T is switched out inside its call; T2 makes a traced call on the CPU, with
                // one nested in it.
                E(0x90, task, T2, 7000, 1200, false, 0),
                E(0x88, task, T2, 7000, 1250, false, 0),
                XK(0x88, task, T2, 7000, 1300, 0),
                XK(0x90, task, T2, 7000, 1500, 0),
                // T is back (its switch count and clock moved), and its own nested call.
                E(0x80, task, T, 5400, 3000, false, 0),
                XK(0x80, task, T, 5400, 3100, 0),
                XK(0xa0, task, T, 5400, 4000, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 4, 3000 + 300 + 50 + 100)?;

                // T2's calls are not subtracted from T's; T's own nested call is.
                self_time(o, CTX_TASK, 2900 + 250 + 50 + 100)?;
                expect("self unknown", o.counters[0].self_unknown, 0)?;
                expect("outermost ns", o.counters[0].outermost_ns, 3000 + 300)
            },
        },
        Case {
            name: "not preemptible: a call entering while another CPU's exit has cleared the used marks of a slot still taken (vacate's window) takes another slot",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                // T's call sleeps; the marks read "none taken" for a moment; T2's call has
                // the same first choice of slot (0x1a0 and 0xa0: task_slot_hint 10).
                Step::UsedCleared { cpu: 0 },
                E(0x1a0, task, T2, 7000, 1200, false, 0),
                XK(0x1a0, task, T2, 7000, 1500, 0),
                XK(0xa0, task, T, 5400, 2000, 0),
            ],
            check: |o| {
                // Both paired: T's call was neither overwritten (its exit an orphan) nor
                // made to evict T2's.
                timed(o, CTX_TASK, 2, 300 + 1000)?;
                expect("orphan exits", o.counters[0].orphans, 0)?;
                expect("evicted", o.counters[0].evicted, 0)?;
                expect("ambiguous", o.counters[0].ambiguous, 0)
            },
        },
        Case {
            name: "not preemptible: a nested call asleep: its time off the CPU is not taken twice from the enclosing call's self time on the CPU",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                // The nested call sleeps (reclaim): 1500 ns off the CPU, all of the enclosing
                // call's time off it.
                E(0x90, task, T, 5000, 1100, false, 0),
                XK(0x90, task, T, 6500, 3000, 0),
                XK(0xa0, task, T, 6500, 3500, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 2, 1900 + 2500)?;
                self_time(o, CTX_TASK, 1900 + 600)?;
                let h = &o.hist[CTX_TASK as usize];
                expect("off-CPU ns", h.off_ns, 1500 + 1500)?;
                expect("of it, in nested calls", h.nested_off_ns, 1500)?;

                // Self on the CPU: the nested call's 400 and the enclosing call's 600 (its
                // self time less its own time off the CPU, none).
                expect("self ns on the CPU", h.self_on_cpu_ns(), 400 + 600)
            },
        },
        Case {
            name: "one probe's call nested in another's (try_charge in charge), asleep: enclosed, and its time off the CPU is the enclosing call's nested one",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                Step::Probe(1),
                E(0xa0, task, T, 5000, 1000, false, 0),
                Step::Probe(0),
                E(0x90, task, T, 5000, 1100, false, 0),
                XK(0x90, task, T, 6500, 3000, 0),
                Step::Probe(1),
                XK(0xa0, task, T, 6500, 3500, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 1, 1900)?;

                // Inside the other probe's call: not outermost.
                outermost(o, CTX_TASK, 0)?;
                let (c, h) = &o.probe1[CTX_TASK as usize];
                expect("enclosing probe's calls", h.count, 1)?;
                expect("enclosing probe's self unknown", c.self_unknown, 0)?;
                expect("enclosing probe's self ns", h.self_ns, 600)?;
                expect("enclosing probe's nested calls", h.nested, 1)?;
                expect("enclosing probe's outermost ns", c.outermost_ns, 2500)?;
                expect("of its time off the CPU, nested", h.nested_off_ns, 1500)?;
                expect("its self ns on the CPU", h.self_on_cpu_ns(), 600)
            },
        },
        Case {
            name: "one probe's hardirq call inside another probe's task call of the task it interrupted: enclosed",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                Step::Probe(1),
                E(0xa0, task, T, 5, 1000, false, 0),
                Step::Probe(0),
                E(0xb0, hard, 0, 5, 1200, false, 0),
                XK(0xb0, hard, 0, 5, 1300, 0),
                Step::Probe(1),
                XK(0xa0, task, T, 5, 2000, 0),
            ],
            check: |o| {
                timed(o, CTX_HARDIRQ, 1, 100)?;
                outermost(o, CTX_HARDIRQ, 0)?;
                let (c, h) = &o.probe1[CTX_TASK as usize];
                expect("enclosing probe's self ns", h.self_ns, 900)?;
                expect("enclosing probe's outermost ns", c.outermost_ns, 1000)
            },
        },
        Case {
            name: "preemptible: a nested call asleep: the enclosing call's deferred pair carries its nested calls' time off the CPU",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                E(0x90, task, T, 5000, 1100, false, 0),
                XK(0x90, task, T, 6500, 3000, 0),
                XK(0xa0, task, T, 6500, 3500, 0),
            ],
            check: |o| {
                deferred(
                    o,
                    &[
                        (1100, 3000, CTX_TASK, DEFERRED_SWITCHED),
                        (1000, 3500, CTX_TASK, DEFERRED_SWITCHED),
                    ],
                )?;
                let got: Vec<(u64, u64, u64)> = o
                    .deferred
                    .iter()
                    .map(|d| (d.child_ns, d.off_ns, d.child_off_ns))
                    .collect();
                if got != [(0, 1500, 0), (1900, 1500, 1500)] {
                    return Err(format!(
                        "(nested ns, off-CPU ns, of it nested) {got:?}, expected [(0, 1500, 0), (1900, 1500, 1500)]"
                    ));
                }
                Ok(())
            },
        },
        Case {
            name: "not preemptible: a task call that finds another task's call left open on its CPU at exit: its self time unknown, never short",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                // T is switched out; T2's call, one nested in it done, then T2 sleeps in it.
                E(0x90, task, T2, 7000, 1200, false, 0),
                E(0x88, task, T2, 7000, 1250, false, 0),
                XK(0x88, task, T2, 7000, 1300, 0),
                XK(0xa0, task, T, 5400, 3000, 0),
                XK(0x90, task, T2, 7400, 4000, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 3, 2000 + 2800 + 50)?;
                expect("self unknown", o.counters[0].self_unknown, 2)?;
                self_time(o, CTX_TASK, 2000 + 2800 + 50)
            },
        },
        Case {
            name: "not preemptible: exits out of order never give a call another's nested time",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                // T's call, with one nested; T is switched out inside it.
                E(0xa0, task, T, 5000, 1000, false, 0),
                E(0x98, task, T, 5000, 1100, false, 0),
                XK(0x98, task, T, 5000, 1200, 0),
                // T2's call begins; T2 is switched out inside it.
                E(0x90, task, T2, 7000, 1300, false, 0),
                // T's call ends; T's next call begins, and T is switched out again.
                XK(0xa0, task, T, 5300, 2000, 0),
                E(0x80, task, T, 5300, 2100, false, 0),
                // T2's call ends, setting back what it found at its entry (T's first call
                // open, its nested call's 100 ns in the sums): none of it is T's second call's.
                XK(0x90, task, T2, 7400, 3000, 0),
                XK(0x80, task, T, 5600, 4000, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 4, 1000 + 100 + 1700 + 1900)?;
                expect("self unknown", o.counters[0].self_unknown, 3)?;
                self_time(o, CTX_TASK, 1000 + 100 + 1700 + 1900)
            },
        },
        Case {
            name: "a task call interrupted by the same function in softirq",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                E(0xc0, soft, 0, 0, 1200, false, 0),
                XK(0xc0, soft, 0, 0, 1500, 0),
                XK(0xa0, task, T, 5, 2000, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 1, 1000)?;
                timed(o, CTX_SOFTIRQ, 1, 300)?;

                // An interrupt's traced call is inside the call it interrupted.
                self_time(o, CTX_TASK, 700)?;
                self_time(o, CTX_SOFTIRQ, 300)
            },
        },
        Case {
            name: "a task call interrupted by the same function in hardirq (fentry)",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                E(0xb0, hard, 0, 0, 1200, false, 0),
                XF(0xb0, hard, 0, None, 1250, 0),
                XF(0xa0, task, T, None, 2000, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 1, 1000)?;

                // The deferred interrupt call's time is subtracted at once (and its pair is
                // not outermost).
                self_time(o, CTX_TASK, 950)?;
                expect("outermost", o.deferred[0].flags as u64 & DEFERRED_OUTERMOST as u64, 0)?;
                deferred(o, &[(1200, 1250, CTX_HARDIRQ, 0)])
            },
        },
    ]
}

/// A full ring, and the interrupt calls whose exit was skipped.
fn interrupts_cases() -> Vec<Case> {
    let task = CTX_TASK;
    let soft = CTX_SOFTIRQ;
    let hard = CTX_HARDIRQ;
    vec![
        Case {
            name: "a full ring: the pairs it cannot take are counted lost, each run still accounted for",
            cpus: 1,
            kernel: PREEMPT,
            // More calls that left the CPU (each deferred to userspace, a `RING_RECORD` in the
            // 1 MiB ring) than the ring holds, none read meanwhile.
            steps: (0..RING_FULL_CALLS)
                .flat_map(|i| {
                    let t = 1000 + i * 1000;
                    [
                        E(0xa0, task, T, 5000, t, false, 0),
                        XK(0xa0, task, T, 5600, t + 900, 0),
                    ]
                })
                .collect(),
            check: |o| {
                let counters = &o.counters[CTX_TASK as usize];
                let sent_and_lost = counters.deferred + counters.deferred_lost;
                expect("pairs sent and lost", sent_and_lost, RING_FULL_CALLS)?;
                expect("pairs read back", o.deferred.len() as u64, counters.deferred)?;
                if counters.deferred_lost == 0 || counters.deferred < (1 << 20) / RING_RECORD - 64 {
                    return Err(format!(
                        "{} pairs in the ring, {} lost: expected it full",
                        counters.deferred, counters.deferred_lost
                    ));
                }

                timed(o, CTX_TASK, 0, 0)
            },
        },
        Case {
            name: MIGRATED_LEAVES_NOTHING_OPEN,
            cpus: 2,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                XK(0xa0, task, T, 6, 2000, 1),
                Step::Ran { task: T2, cpu: 0 },
                E(0xb0, hard, 0, 0, 3000, false, 0),
                XK(0xb0, hard, 0, 0, 3100, 0),
                E(0xa0, task, T, 6, 4000, false, 0),
                XK(0xa0, task, T, 6, 4200, 0),
            ],
            check: |o| {
                expect("migrated", o.counters[0].migrated, 1)?;
                timed(o, CTX_TASK, 2, 1000 + 200)?;
                timed(o, CTX_HARDIRQ, 1, 100)?;
                outermost(o, CTX_TASK, 1000 + 200)?;
                outermost(o, CTX_HARDIRQ, 100)
            },
        },
        Case {
            name: "an interrupt call whose exit was skipped leaves nothing open: the next interrupt calls are outermost",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xb0, hard, 0, 0, 1000, false, 0),
                E(0xc0, soft, 0, 0, 2000, false, 0),
                XK(0xc0, soft, 0, 0, 2100, 0),
                E(0xb8, hard, 0, 0, 3000, false, 0),
                XK(0xb8, hard, 0, 0, 3050, 0),
            ],
            check: |o| {
                expect("hardirq stale", o.counters[CTX_HARDIRQ as usize].stale, 1)?;
                timed(o, CTX_SOFTIRQ, 1, 100)?;
                timed(o, CTX_HARDIRQ, 1, 50)?;
                outermost(o, CTX_SOFTIRQ, 100)?;
                outermost(o, CTX_HARDIRQ, 50)
            },
        },
        Case {
            name: "not preemptible: an interrupt of another task while a task call is off the CPU is not nested in it",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                Step::Ran { task: T2, cpu: 0 },
                E(0xb0, hard, 0, 0, 2000, false, 0),
                XK(0xb0, hard, 0, 0, 2100, 0),
                Step::Ran { task: T, cpu: 0 },
                XK(0xa0, task, T, 6, 5000, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 1, 4000)?;
                self_time(o, CTX_TASK, 4000)?;
                outermost(o, CTX_TASK, 4000)?;
                outermost(o, CTX_HARDIRQ, 100)
            },
        },
        Case {
            name: "a softirq call whose exit was skipped: stale at the next softirq entry",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                E(0xc0, soft, 0, 0, 1100, false, 0),
                XK(0xa0, task, T, 5, 2000, 0),
                E(0xc0, soft, 0, 0, 3000, false, 0),
                XK(0xc0, soft, 0, 0, 3100, 0),
            ],
            check: |o| {
                timed(o, CTX_TASK, 1, 1000)?;
                expect("softirq lost exits", o.counters[1].stale, 1)?;
                timed(o, CTX_SOFTIRQ, 1, 100)
            },
        },
    ]
}

/// Task calls that left the CPU: timed wall-clock with their time off it, proven in the kernel
/// or deferred to userspace.
fn left_the_cpu_cases() -> Vec<Case> {
    let task = CTX_TASK;
    vec![
        Case {
            name: "a task call that left the CPU is timed wall-clock with its time off the CPU, confirmed by userspace",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                XK(0xa0, task, T, 8000, 9000, 0),
            ],
            check: |o| {
                expect("switched", o.counters[0].switched, 1)?;
                timed(o, CTX_TASK, 0, 0)?;
                deferred(o, &[(1000, 9000, CTX_TASK, DEFERRED_SWITCHED)])?;
                off_cpu(o, &[3000])
            },
        },
        Case {
            name: "a task call that left the CPU without moving off it, no entry run missed there meanwhile: proven and timed in the kernel",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                EM(0xa0, T, 5000, 7, 1000, false, 0),
                XM(0xa0, T, 8000, 7, 9000, false, 0),
            ],
            check: |o| {
                let c = &o.counters[0];
                expect("switched", c.switched, 1)?;
                expect("proven on their CPU", c.proven_on_cpu, 1)?;
                expect("off-CPU ns", c.off_cpu_ns, 3000)?;
                deferred(o, &[])?;
                timed(o, CTX_TASK, 1, 8000)
            },
        },
        Case {
            name: "fexit, runs interleaving: a call that left the CPU without moving, no entry run missed: proven in the kernel",
            cpus: 1,
            kernel: PREEMPT_INTERLEAVING,
            steps: vec![
                EM(0xa0, T, 5000, 7, 1000, true, 0),
                XM(0xa0, T, 8000, 7, 9000, true, 0),
            ],
            check: |o| {
                expect("proven on their CPU", o.counters[0].proven_on_cpu, 1)?;
                deferred(o, &[])?;
                timed(o, CTX_TASK, 1, 8000)
            },
        },
        Case {
            // The made-up pair the proof must not let through: the call at 1000 lost its exit;
            // the task's next call at that frame lost its entry (the count moved on the CPU);
            // that call's exit finds the stale entry.
            name: "a stale entry, then an entry run missed on the CPU: the exit that finds it is deferred, not proven",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                EM(0xa0, T, 5000, 7, 1000, false, 0),
                XM(0xa0, T, 8000, 8, 9000, false, 0),
            ],
            check: |o| {
                expect("proven on their CPU", o.counters[0].proven_on_cpu, 0)?;
                timed(o, CTX_TASK, 0, 0)?;
                deferred(o, &[(1000, 9000, CTX_TASK, DEFERRED_SWITCHED)])
            },
        },
        Case {
            name: MOVED_AND_BACK_UNPROVEN,
            cpus: 2,
            kernel: PREEMPT,
            steps: vec![
                EM(0xa0, T, 5000, 7, 1000, false, 0),
                Step::Ran { task: T, cpu: 1 },
                XM(0xa0, T, 8000, 7, 9000, false, 0),
            ],
            check: |o| {
                expect("proven on their CPU", o.counters[0].proven_on_cpu, 0)?;
                timed(o, CTX_TASK, 0, 0)?;
                deferred(o, &[(1000, 9000, CTX_TASK, DEFERRED_SWITCHED)])
            },
        },
        Case {
            name: "a task call whose entry did not know the missed runs: deferred, whatever its exit reads",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                XM(0xa0, T, 8000, 0, 9000, false, 0),
            ],
            check: |o| {
                expect("proven on their CPU", o.counters[0].proven_on_cpu, 0)?;
                deferred(o, &[(1000, 9000, CTX_TASK, DEFERRED_SWITCHED)])
            },
        },
    ]
}

/// Calls that migrated, runs that interleave, and the task clocks that time off the CPU.
fn migrated_cases() -> Vec<Case> {
    let task = CTX_TASK;
    vec![
        Case {
            name: "a task call that migrated: its exit finds the entry on the other CPU",
            cpus: 2,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                XK(0xa0, task, T, 8000, 9000, 1),
            ],
            check: |o| {
                expect("migrated", o.counters[0].migrated, 1)?;
                deferred(
                    o,
                    &[(1000, 9000, CTX_TASK, DEFERRED_SWITCHED | DEFERRED_MIGRATED)],
                )?;
                off_cpu(o, &[3000])
            },
        },
        Case {
            name: "runs interleave (fentry, preemptible): the exit times its call from a copy of the slot",
            cpus: 1,
            kernel: PREEMPT_INTERLEAVING,
            steps: vec![E(0xa0, task, T, 5, 1000, false, 0), XK(0xa0, task, T, 5, 1600, 0)],
            check: |o| {
                // Self time is not followed where runs interleave: the call counts whole.
                expect("self unknown", o.counters[0].self_unknown, 1)?;
                expect("pending", o.pending, 0)?;
                timed(o, CTX_TASK, 1, 600)
            },
        },
        Case {
            name: "runs interleave: a migrated call's exit takes its call from the other CPU's slot",
            cpus: 2,
            kernel: PREEMPT_INTERLEAVING,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                XK(0xa0, task, T, 8000, 9000, 1),
            ],
            check: |o| {
                expect("migrated", o.counters[0].migrated, 1)?;
                expect("pending", o.pending, 0)?;
                deferred(
                    o,
                    &[(1000, 9000, CTX_TASK, DEFERRED_SWITCHED | DEFERRED_MIGRATED)],
                )?;
                off_cpu(o, &[3000])
            },
        },
        Case {
            name: "a migrated call where the CPUs' task clocks differ: time off the CPU unknown, not made up",
            cpus: 2,
            kernel: RigKind {
                preemptible: true,
                cross_cpu_clock: false,
                kprobe_defers: true,
    interleaving: false,
            },
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                XK(0xa0, task, T, 8000, 9000, 1),
            ],
            check: |o| {
                deferred(
                    o,
                    &[(
                        1000,
                        9000,
                        CTX_TASK,
                        DEFERRED_SWITCHED | DEFERRED_MIGRATED | DEFERRED_OFF_UNKNOWN,
                    )],
                )?;
                off_cpu(o, &[0])
            },
        },
        Case {
            name: "not preemptible: calls that left the CPU are timed in the kernel, time off the CPU summed; a clock that moved by more than the call lasted is unknown, never off for all of it",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                XK(0xa0, task, T, 8000, 9000, 0),
                // The clock moved by far more than the call lasted (a torn or failed read):
                // unknown.
                E(0xb0, task, T, 20_000, 10_000, false, 0),
                XK(0xb0, task, T, 90_000, 12_000, 0),
                // Ahead of the call by less than the clocks' drift: off for all of it.
                E(0xd0, task, T, 90_000, 20_000, false, 0),
                XK(0xd0, task, T, 92_500, 22_000, 0),
                // Unmoved: never left the CPU.
                E(0xc0, task, T, 92_500, 23_000, false, 0),
                XK(0xc0, task, T, 92_500, 23_500, 0),
            ],
            check: |o| {
                let c = &o.counters[0];
                timed(o, CTX_TASK, 4, 8000 + 2000 + 2000 + 500)?;
                expect("switched", c.switched, 3)?;
                expect("off-CPU ns", c.off_cpu_ns, 3000 + 2000)?;
                expect("off-CPU max ns", c.off_cpu_max_ns, 3000)?;
                expect("off-CPU unknown", c.off_cpu_unknown, 1)?;
                deferred(o, &[])
            },
        },
        Case {
            name: "not preemptible: a clock that moved without a switch (a read torn by another CPU) makes no time off the CPU",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                XKC(0xa0, task, T, 5000, 7000, 9000, 0),
            ],
            check: |o| {
                let c = &o.counters[0];
                timed(o, CTX_TASK, 1, 8000)?;
                expect("switched", c.switched, 0)?;
                expect("off-CPU ns", c.off_cpu_ns, 0)?;
                expect("off-CPU unknown", c.off_cpu_unknown, 0)
            },
        },
        Case {
            name: "not preemptible: an off-CPU clock that went back is unknown, never made-up time",
            cpus: 1,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                XKC(0xa0, task, T, 5001, 4000, 9000, 0),
            ],
            check: |o| {
                let c = &o.counters[0];
                timed(o, CTX_TASK, 1, 8000)?;
                expect("switched", c.switched, 1)?;
                expect("off-CPU ns", c.off_cpu_ns, 0)?;
                expect("off-CPU unknown", c.off_cpu_unknown, 1)
            },
        },
        Case {
            name: "not preemptible, migrated where the CPUs' task clocks differ: counted as unknown",
            cpus: 2,
            kernel: RigKind {
                preemptible: false,
                cross_cpu_clock: false,
                kprobe_defers: false,
    interleaving: false,
            },
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                XK(0xa0, task, T, 8000, 9000, 1),
            ],
            check: |o| {
                let c = &o.counters[0];
                timed(o, CTX_TASK, 1, 8000)?;
                expect("migrated", c.migrated, 1)?;
                expect("off-CPU ns", c.off_cpu_ns, 0)?;
                expect("off-CPU unknown", c.off_cpu_unknown, 1)
            },
        },
    ]
}

/// Orphan exits, a full set of pending calls evicting the oldest, and stale interrupt entries.
fn evicted_cases() -> Vec<Case> {
    let task = CTX_TASK;
    let soft = CTX_SOFTIRQ;
    let hard = CTX_HARDIRQ;
    vec![
        Case {
            name: "another task's exit at a reused frame is an orphan",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                XK(0xa0, task, T2, 5, 2000, 0),
            ],
            check: |o| {
                expect("orphan exits", o.counters[0].orphans, 1)?;
                expect("still pending", o.pending, 1)?;
                timed(o, CTX_TASK, 0, 0)
            },
        },
        Case {
            name: "a full set of pending calls evicts the oldest, whose exit is then its own, not a second loss",
            cpus: 1,
            kernel: PREEMPT,
            steps: {
                let n = TASK_SLOTS as u64 + 1;
                let mut s = crowd(n);
                s.extend(crowd_exits(0..n));
                s
            },
            check: |o| evicted_once(o, 0),
        },
        Case {
            name: "more calls evicted than remembered: the exit of the first evicted is an orphan again, the others' are their own",
            cpus: 1,
            kernel: PREEMPT,
            steps: {
                // Nine evicted, eight remembered.
                let n = TASK_SLOTS as u64 + EVICTED_KEPT as u64 + 1;
                let mut s = crowd(n);
                s.extend(crowd_exits(0..n));
                s
            },
            check: |o| {
                let c = &o.counters[CTX_TASK as usize];
                let kept = EVICTED_KEPT as u64;
                expect("evicted", c.evicted, kept + 1)?;
                expect("exits of evicted calls", c.evicted_exits, kept)?;
                expect("orphan exits", c.orphans, 1)?;
                expect("paired", c.paired, TASK_SLOTS as u64)
            },
        },
        Case {
            name: EVICTED_MIGRATED,
            cpus: 2,
            kernel: PREEMPT,
            steps: {
                let n = TASK_SLOTS as u64 + 1;
                let mut s = crowd(n);
                s.extend(crowd_exits(1..n));
                s.push(XK(0x100, task, T, 6, 6000, 1));
                s
            },
            check: |o| evicted_once(o, 0),
        },
        Case {
            name: "another task's exit at an evicted call's frame is an orphan; the call's own exit is its own",
            cpus: 1,
            kernel: PREEMPT,
            steps: {
                let n = TASK_SLOTS as u64 + 1;
                let mut s = crowd(n);
                s.push(XK(0x100, task, T2, 5, 4000, 0));
                s.extend(crowd_exits(0..n));
                s
            },
            check: |o| evicted_once(o, 1),
        },
        Case {
            name: TWO_MIGRATIONS,
            cpus: 2,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                XK(0xa0, task, T, 6, 2000, 1),
                E(0xa0, task, T, 6, 3000, false, 1),
                XK(0xa0, task, T, 7, 9000, 0),
            ],
            check: |o| {
                let c = &o.counters[CTX_TASK as usize];
                expect("migrated", c.migrated, 2)?;
                expect("stale", c.stale, 0)?;
                expect("pending", o.pending, 0)?;
                timed(o, CTX_TASK, 2, 1000 + 6000)
            },
        },
        Case {
            name: STALE_THEN_MIGRATED,
            cpus: 2,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                E(0xa0, task, T, 6, 3000, false, 1),
                XK(0xa0, task, T, 7, 9000, 0),
            ],
            check: |o| {
                let c = &o.counters[CTX_TASK as usize];
                expect("migrated", c.migrated, 1)?;
                expect("stale", c.stale, 1)?;
                expect("pending", o.pending, 0)?;
                timed(o, CTX_TASK, 1, 6000)
            },
        },
        Case {
            name: STALE_THEN_MIGRATED_INTERLEAVING,
            cpus: 2,
            kernel: PREEMPT_INTERLEAVING,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                E(0xa0, task, T, 6, 3000, false, 1),
                XK(0xa0, task, T, 7, 9000, 0),
            ],
            check: |o| {
                let c = &o.counters[CTX_TASK as usize];
                expect("stale", c.stale, 1)?;
                expect("pending", o.pending, 0)?;
                deferred(
                    o,
                    &[(3000, 9000, CTX_TASK, DEFERRED_SWITCHED | DEFERRED_MIGRATED)],
                )
            },
        },
        Case {
            name: OLD_STALE_ELSEWHERE,
            cpus: 2,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 1),
                E(0xa0, task, T, 6, 3000, false, 0),
                Step::Ran { task: T, cpu: 1 },
                XK(0xa0, task, T, 8, 9000, 0),
            ],
            check: |o| {
                let c = &o.counters[CTX_TASK as usize];
                expect("migrated", c.migrated, 0)?;
                expect("stale", c.stale, 0)?;
                expect("still pending (the stale entry)", o.pending, 1)?;
                timed(o, CTX_TASK, 1, 6000)
            },
        },
        Case {
            name: "a softirq exit with no softirq entry at the frame of a stale hardirq entry: an orphan, the hardirq entry left",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                EF(0xb0, hard, 7, 1000, 0),
                XF(0xb0, soft, 0, Some(7), 5100, 0),
            ],
            check: |o| {
                expect("softirq orphans", o.counters[CTX_SOFTIRQ as usize].orphans, 1)?;
                expect("pending", o.pending, 1)?;
                timed(o, CTX_HARDIRQ, 0, 0)?;
                timed(o, CTX_SOFTIRQ, 0, 0)
            },
        },
        Case {
            name: LEFT_AND_CAME_BACK,
            cpus: 2,
            kernel: NO_PREEMPT,
            steps: vec![
                E(0xa0, task, T, 5, 1000, false, 0),
                Step::Ran { task: T, cpu: 1 },
                XK(0xa0, task, T, 7, 5000, 0),
            ],
            check: |o| {
                let c = &o.counters[CTX_TASK as usize];
                expect("switched", c.switched, 1)?;
                expect("migrated", c.migrated, 0)?;
                expect("stale", c.stale, 0)?;
                timed(o, CTX_TASK, 1, 4000)
            },
        },
        Case {
            name: "a softirq exit at the frame of a stale hardirq entry (x86_64: one irq stack) pairs with the softirq's own entry",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![
                EF(0xb0, hard, 7, 1000, 0),
                EF(0xb0, soft, 7, 5000, 0),
                XF(0xb0, soft, 0, Some(7), 5100, 0),
            ],
            check: |o| {
                timed(o, CTX_SOFTIRQ, 1, 100)?;
                timed(o, CTX_HARDIRQ, 0, 0)?;
                expect("pending", o.pending, 1)?;
                deferred(o, &[])
            },
        },
    ]
}

/// No context split where the kernel does not preempt, and the workload's calls apart.
fn no_split_and_workload_cases() -> Vec<Case> {
    let task = CTX_TASK;
    vec![
        Case {
            name: "no context split on a kernel that does not preempt: a kprobe call that left the CPU is timed in the kernel, an fexit one deferred",
            cpus: 1,
            kernel: RigKind {
                preemptible: true,
                cross_cpu_clock: true,
                interleaving: false,
                kprobe_defers: false,
            },
            steps: vec![
                E(0xa0, task, T, 5000, 1000, false, 0),
                XK(0xa0, task, T, 8000, 9000, 0),
                E(0xb0, task, T, 4, 10_000, false, 0),
                XF(0xb0, task, T, None, 12_000, 0),
            ],
            check: |o| {
                let c = &o.counters[CTX_TASK as usize];
                expect("switched", c.switched, 2)?;
                timed(o, CTX_TASK, 1, 8000)?;
                deferred(o, &[(10_000, 12_000, CTX_TASK, DEFERRED_SWITCHED)])
            },
        },
        Case {
            name: "the workload's calls are counted apart",
            cpus: 1,
            kernel: PREEMPT,
            steps: vec![E(0xa0, task, T, 5, 1000, true, 0), XK(0xa0, task, T, 5, 1400, 0)],
            check: |o| {
                expect("workload calls", o.workload.count, 1)?;
                expect("workload ns", o.workload.sum_ns, 400)
            },
        },
    ]
}

/// The deferred pairs of an outcome through the real verifier: confirmed when the entry
/// program's misses did not move around them, rejected when they did.
fn verify(d: &[Deferred], misses_moved: bool) -> (u64, u64, u64) {
    let mut verifier = Verifier::new(1);
    let mark = |at: u64, misses: u64| Mark {
        before: at,
        misses,
        after: at + 1,
    };
    verifier.mark(0, mark(0, 10));
    for x in d {
        verifier.push(*x);
    }

    verifier.mark(0, mark(u64::MAX / 2, 10 + misses_moved as u64));
    verifier.settle();
    let confirmed = verifier.outcomes[0].iter().map(|o| o.hist.count).sum();
    let rejected = verifier.outcomes[0].iter().map(|o| o.rejected).sum();
    let off = verifier.outcomes[0].iter().map(|o| o.off_cpu_ns).sum();
    (confirmed, rejected, off)
}

/// The entry and CPU of a step (None: no program runs).
fn step_key_cpu(s: &Step) -> Option<(u64, u32, bool)> {
    match *s {
        Step::Entry { key, cpu, .. }
        | Step::EntryFentry { key, cpu, .. }
        | Step::EntryMisses { key, cpu, .. } => Some((key, cpu, true)),
        Step::ExitFentry { key, cpu, .. }
        | Step::ExitKprobe { key, cpu, .. }
        | Step::ExitKprobeClock { key, cpu, .. }
        | Step::ExitMisses { key, cpu, .. } => Some((key, cpu, false)),
        Step::Ran { .. } | Step::Probe(_) | Step::UsedCleared { .. } => None,
    }
}

/// Whether a call of the sequence exits on another CPU than the one it entered on.
fn migrates(steps: &[Step]) -> bool {
    let mut entered: Vec<(u64, u32)> = Vec::new();
    steps
        .iter()
        .filter_map(step_key_cpu)
        .any(|(k, cpu, entry)| {
            if entry {
                entered.push((k, cpu));
                false
            } else {
                entered
                    .iter()
                    .rev()
                    .find(|(e, _)| *e == k)
                    .is_some_and(|&(_, c)| c != cpu)
            }
        })
}

/// The cases whose calls moved between CPUs in ways the legacy object (no search of other
/// CPUs) cannot follow, with what it must make of them instead: (what, check).
fn legacy_outcome(case: &str) -> Option<(&'static str, Check)> {
    fn untimed(o: &Outcome, orphans: u64, ambiguous: u64, pending: u64) -> Result<(), String> {
        let c = &o.counters[CTX_TASK as usize];
        expect("orphans", c.orphans, orphans)?;
        expect("ambiguous", c.ambiguous, ambiguous)?;
        expect("pending", o.pending, pending)?;
        timed(o, CTX_TASK, 0, 0)?;
        deferred(o, &[])
    }
    Some(match case {
        TWO_MIGRATIONS => (
            "the first exit unmatched, the second's local entry is the first call's: ambiguous, nothing timed",
            |o| untimed(o, 1, 1, 1),
        ),
        STALE_THEN_MIGRATED | STALE_THEN_MIGRATED_INTERLEAVING => (
            "the local entry cannot be told stale: ambiguous, nothing timed",
            |o| untimed(o, 0, 1, 1),
        ),
        OLD_STALE_ELSEWHERE => (
            "the local entry cannot be told from a stale one: ambiguous, nothing timed",
            |o| untimed(o, 0, 1, 1),
        ),
        MIGRATED_LEAVES_NOTHING_OPEN => (
            "the migrated exit unmatched, its entry stale at the task's next call there: the later calls outermost",
            |o| {
                let c = &o.counters[CTX_TASK as usize];
                expect("orphans", c.orphans, 1)?;
                expect("stale", c.stale, 1)?;
                timed(o, CTX_TASK, 1, 200)?;
                outermost(o, CTX_TASK, 200)?;
                outermost(o, CTX_HARDIRQ, 100)
            },
        ),
        LEFT_AND_CAME_BACK | MOVED_AND_BACK_UNPROVEN => (
            "cannot be told from a stale entry: ambiguous, nothing timed",
            |o| untimed(o, 0, 1, 0),
        ),
        EVICTED_MIGRATED => (
            "the other CPU's evicted calls are not looked at: the exit an orphan",
            |o| {
                let c = &o.counters[CTX_TASK as usize];
                expect("evicted", c.evicted, 1)?;
                expect("exits of evicted calls", c.evicted_exits, 0)?;
                expect("orphan exits", c.orphans, 1)?;
                expect("paired", c.paired, TASK_SLOTS as u64)
            },
        ),
        _ => return None,
    })
}

const TWO_MIGRATIONS: &str =
    "two migrations of one task at one frame: each exit with its own entry, never the other call's";
const STALE_THEN_MIGRATED: &str =
    "a stale entry of the task and frame (exit lost), then a migrated call: its exit takes its own entry on the other CPU";
const STALE_THEN_MIGRATED_INTERLEAVING: &str =
    "runs interleave: a stale entry of the task and frame, then a migrated call: its exit takes its own entry on the other CPU, from a copy";
const OLD_STALE_ELSEWHERE: &str =
    "a stale entry of the task and frame on another CPU, then a call that moved there and back: its own (newer) entry, not the stale one";
/// The ring's room for one deferred pair: the record and its 8-byte header, 8-aligned.
const RING_RECORD: u64 =
    (std::mem::size_of::<memcg_trace_common::Deferred>() as u64 + 8).div_ceil(8) * 8;
/// Calls of the full-ring case: more than the ring (1 MiB) holds.
const RING_FULL_CALLS: u64 = (1 << 20) / RING_RECORD + 200;

const MIGRATED_LEAVES_NOTHING_OPEN: &str =
    "a call that migrated leaves nothing open on the CPU it entered on: later calls there, interrupt or its own task's, are outermost";
const LEFT_AND_CAME_BACK: &str = "a call that moved to another CPU and back keeps its own entry";
const MOVED_AND_BACK_UNPROVEN: &str =
    "a task call that moved to another CPU and back: deferred, not proven by its first CPU's count";
const EVICTED_MIGRATED: &str =
    "an evicted call that migrated: its exit on another CPU is the evicted call's, not an orphan";

/// `n` task calls of task T entering on CPU 0 one after the other, at frames 0x100.., none
/// returning: past `TASK_SLOTS` each evicts the oldest.
fn crowd(n: u64) -> Vec<Step> {
    (0..n)
        .map(|i| E(0x100 + i, CTX_TASK, T, 5, 1000 + i, false, 0))
        .collect()
}

/// The exits of `crowd`'s calls `which` on CPU 0, the newest first.
fn crowd_exits(which: std::ops::Range<u64>) -> impl Iterator<Item = Step> {
    which.rev().map(|i| XK(0x100 + i, CTX_TASK, T, 5, 5000, 0))
}

/// One call of a full set evicted and counted lost once: its exit found among the evicted
/// (not an orphan), the other calls paired; `orphans`: exits of calls never seen.
fn evicted_once(o: &Outcome, orphans: u64) -> Result<(), String> {
    let c = &o.counters[CTX_TASK as usize];
    expect("evicted", c.evicted, 1)?;
    expect("exits of evicted calls", c.evicted_exits, 1)?;
    expect("orphan exits", c.orphans, orphans)?;
    expect("paired", c.paired, TASK_SLOTS as u64)?;
    expect("pending", o.pending, 0)
}

/// What the legacy object (no search of other CPUs) must make of a migrated call: its exit
/// an orphan, its entry left pending on the CPU it entered on, no pair, nothing timed.
fn unmatched_migration(o: &Outcome) -> Result<(), String> {
    let c = &o.counters[CTX_TASK as usize];
    expect("migrated", c.migrated, 0)?;
    expect("orphans", c.orphans, 1)?;
    expect("pending", o.pending, 1)?;
    timed(o, CTX_TASK, 0, 0)?;
    deferred(o, &[])
}

fn pairing(rigs: &mut checks::Rigs, layout: &KernelLayout) -> Result<u32> {
    let mut bad = 0;

    // The breakdowns' calls counted in the front slots and in the maps, over every sequence.
    let (mut in_front, mut in_maps) = (0, 0);
    let cpus = possible_cpus();
    let legacy = Object::chosen()? == Object::Legacy;
    if legacy {
        println!("selftest: object: the one for kernels before 5.19: migrated calls must be left unmatched");
    }

    for case in cases() {
        if case.cpus > cpus {
            println!(
                "selftest: pairing: {}: skipped (needs {} CPUs, {cpus} here)",
                case.name, case.cpus
            );
            continue;
        }

        let (name, check) = if let Some(f) = legacy.then(|| legacy_outcome(case.name)).flatten() {
            (format!("{} (legacy object: {})", case.name, f.0), f.1)
        } else if legacy && migrates(&case.steps) {
            (
                format!("{} (legacy object: unmatched instead)", case.name),
                unmatched_migration as fn(&Outcome) -> Result<(), String>,
            )
        } else {
            (case.name.to_string(), case.check)
        };
        let outcome = match checks::pairing(rigs, layout, &case.steps, case.kernel) {
            Ok(o) => o,
            Err(e) => match e.downcast_ref::<checks::Refused>() {
                Some(refused) => {
                    bad += 1;
                    println!("selftest: pairing: {name}: FAILED: {refused}");
                    continue;
                }
                None => return Err(e),
            },
        };
        in_front += outcome.in_front;
        in_maps += outcome.in_maps;
        let result = accounted(&outcome)
            .and_then(|_| self_times(&outcome))
            .and_then(|_| check(&outcome))
            .and_then(|_| deferred_verified(&outcome));
        match result {
            Ok(()) => println!("selftest: pairing: {name}: ok"),
            Err(e) => {
                bad += 1;
                println!("selftest: pairing: {name}: FAILED: {e}");
            }
        }
    }

    if !breakdown_counted_both_ways(legacy, in_front, in_maps) {
        bad += 1;
    }
    Ok(bad)
}

/// The deferred pairs of a sequence, confirmed by userspace's verifier where no run was
/// missed and rejected where one was, with the time off the CPU the programs sent.
fn deferred_verified(outcome: &Outcome) -> Result<(), String> {
    if outcome.deferred.is_empty() {
        return Ok(());
    }

    let deferred = outcome.deferred.len() as u64;
    let (confirmed, rejected, off) = verify(&outcome.deferred, false);
    let (confirmed_missed, rejected_missed, off_missed) = verify(&outcome.deferred, true);
    let sent: u64 = outcome.deferred.iter().map(|d| d.off_ns).sum();
    if (confirmed, rejected, confirmed_missed, rejected_missed) != (deferred, 0, 0, deferred) {
        return Err(format!(
            "verifier: without misses {confirmed} confirmed {rejected} rejected; with a miss {confirmed_missed} confirmed {rejected_missed} rejected"
        ));
    }

    if (off, off_missed) != (sent, 0) {
        return Err(format!(
            "verifier: time off the CPU {off} ns confirmed ({off_missed} ns with a miss), {sent} ns sent"
        ));
    }
    Ok(())
}

/// Both ways of counting a breakdown's call ran (`in_front` calls in the front slots, `in_maps`
/// in the maps), over every sequence, as the object has them; said, and whether so.
fn breakdown_counted_both_ways(legacy: bool, in_front: u64, in_maps: u64) -> bool {
    // A crowd's paired calls (`crowd`: TASK_SLOTS of them at consecutive frames, on one CPU,
    // in one context) have TASK_SLOTS / 2 + 1 call sites (a frame with bit 0 set: two frames a
    // site), more than one region has front slots, so some must go to the maps whatever the
    // hash (the assertion below keeps that so).
    const _: () = assert!(TASK_SLOTS as u32 / 2 + 1 > memcg_trace_common::FRONT_SLOTS);
    let (ok, want) = if legacy {
        (
            in_front == 0 && in_maps > 0,
            "none in the front slots (the legacy object has none)",
        )
    } else {
        (
            in_front > 0 && in_maps > 0,
            "some in the front slots, some in the maps behind them",
        )
    };
    println!(
        "selftest: pairing: breakdown calls: {in_front} in the front slots, {in_maps} in the maps ({want}): {}",
        if ok { "ok" } else { "FAILED" }
    );
    ok
}

/// Makes the context-check sources fire while the programs are attached: timer-wheel timers
/// (socket receive timeouts) and IPIs (membarrier to a thread spinning on another CPU).
fn make_context_load() {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let spinner = (possible_cpus() > 1).then(|| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // SAFETY: pins this thread to CPU 1; a plain cpu_set_t.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(1, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
            }

            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    });

    // SAFETY: membarrier with valid commands; errors are ignored (older kernels).
    unsafe {
        const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;
        const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
        libc::syscall(libc::SYS_membarrier, REGISTER_PRIVATE_EXPEDITED, 0, 0);
        for _ in 0..50 {
            libc::syscall(libc::SYS_membarrier, PRIVATE_EXPEDITED, 0, 0);
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    if let Ok((a, _b)) = std::os::unix::net::UnixDatagram::pair() {
        let _ = a.set_read_timeout(Some(Duration::from_millis(3)));
        let mut buf = [0u8; 1];
        for _ in 0..20 {
            let _ = a.recv(&mut buf);
        }
    }

    stop.store(true, Ordering::Relaxed);
    if let Some(s) = spinner {
        let _ = s.join();
    }
}

/// `memcg-trace selftest`.
pub fn run() -> Result<i32> {
    check_privileges()?;
    let btf = kernel::open_btf()?;
    let (layout, masks) = calibrate::masks(kernel::layout(&btf)?);
    drop(btf);
    println!(
        "selftest: masks nmi {:#x} hardirq {:#x} softirq {:#x} ({}; nmi {})",
        masks.nmi_mask, masks.hardirq_mask, masks.softirq_offset, masks.source, masks.nmi
    );
    let mut bad = u32::from(masks.source != "calibrated");

    // One verified object per kind of kernel for every check below, emptied between them.
    let mut rigs = checks::Rigs::default();
    bad += bucketing(&mut rigs, &layout)?;
    bad += syscall_context(&mut rigs, &layout)?;
    bad += pairing(&mut rigs, &layout)?;
    bad += live_contexts(&layout)?;
    println!("selftest: {bad} failures");
    Ok(if bad == 0 { 0 } else { 1 })
}

/// The kernel's histogram bucket of latencies at the edges of the tables and the log scale,
/// against the definition (not the tables both sides read): the mismatches.
fn bucketing(rigs: &mut checks::Rigs, layout: &KernelLayout) -> Result<u32> {
    let values = [
        0u64,
        1,
        31,
        32,
        33,
        63,
        64,
        100,
        358,
        1000,
        1500,
        2049,
        4095,
        4096,
        4097,
        8191,
        8192,
        123_456,
        524_287,
        524_288,
        10_000_000,
        1 << 35,
        (1 << 36) + 5,
        u64::MAX >> 1,
    ];
    let results = checks::bucketing(rigs, layout, &values)?;
    let mut mismatches = 0;
    for (v, got) in &results {
        // The definition, not the tables both sides read.
        let want = bucket_by_log(*v);
        let ok = *got == Some(want);
        mismatches += u32::from(!ok);
        println!(
            "selftest: ns={v} bucket kernel={got:?} userspace={want} {}",
            if ok { "ok" } else { "MISMATCH" }
        );
    }

    println!(
        "selftest: {} values, {mismatches} mismatches",
        results.len()
    );
    Ok(mismatches)
}

/// The context a program run from a syscall sees: task (1 failure otherwise).
fn syscall_context(rigs: &mut checks::Rigs, layout: &KernelLayout) -> Result<u32> {
    let ctx = checks::syscall_context(rigs, layout)?;
    let ok = ctx == Some(CTX_TASK);
    println!(
        "selftest: a program run from a syscall sees context {} {}",
        ctx.map(|c| CTX_NAMES[c as usize]).unwrap_or("unknown"),
        if ok { "ok" } else { "MISMATCH" }
    );
    Ok(u32::from(!ok))
}

/// Live: tracepoints of known context, classified by the same code the probes use; the
/// "check" sources are independent of the calibration's. The failures.
fn live_contexts(layout: &KernelLayout) -> Result<u32> {
    let mut bad = 0;
    let rows = checks::context_check(
        layout,
        &[CtxUse::Calibration, CtxUse::Check],
        Duration::from_millis(1500),
        false,
        make_context_load,
    )?;
    let mut independent = [0u64; NUM_CTX];
    for c in &rows {
        let Some(tp) = &c.tracepoint else {
            println!(
                "selftest: context row {} ({}): no tracepoint of the row exists here",
                c.row, c.expected
            );
            continue;
        };
        let (total, right) = (c.hits(), c.right());
        let wrong = total - right;
        let required =
            c.usage == CtxUse::Calibration && c.expected != "nmi" || c.expected == "task";
        let ok = wrong == 0 && (right > 0 || !required);
        if c.usage == CtxUse::Check {
            if let Some(i) = CTX_NAMES.iter().position(|n| *n == c.expected) {
                independent[i] += right;
            }
        }
        bad += u32::from(!ok);
        println!(
            "selftest: {tp} ({}, {}): {total} hits, {right} classified {}, {wrong} otherwise {:?}, preempt_count bits any {:#x} all {:#x} {}",
            c.expected,
            if c.usage == CtxUse::Calibration { "calibration source" } else { "independent source" },
            c.expected,
            c.counts,
            c.bits_any,
            c.bits_all,
            if !ok { "MISMATCH" } else if total == 0 { "not observed" } else { "ok" }
        );
    }

    for ctx in [CTX_SOFTIRQ, CTX_HARDIRQ] {
        let hits = independent[ctx as usize];
        if ctx == CTX_HARDIRQ && possible_cpus() < 2 {
            println!("selftest: hardirq on independent sources: skipped (IPIs need 2 CPUs)");
            continue;
        }

        let ok = hits > 0;
        bad += u32::from(!ok);
        println!(
            "selftest: {} classified right on sources the calibration does not read: {hits} hits {}",
            CTX_NAMES[ctx as usize],
            if ok { "ok" } else { "NOT OBSERVED" }
        );
    }
    Ok(bad)
}
