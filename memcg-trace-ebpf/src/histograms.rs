//! Counting: the per-CPU cells, the histograms a call is recorded into, and the counters.

use crate::*;

/// Adds `v` to a counter, atomically when runs can interleave on this CPU.
#[inline(always)]
pub(crate) fn add(p: &mut u64, v: u64, atomic: bool) {
    if atomic {
        // SAFETY: an aligned u64 in a map value.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p as *mut u64, v) };
    } else {
        *p += v;
    }
}

/// Raises `*p` to `v` if `v` is larger (a maximum). Where runs can interleave on this CPU (a
/// program preempted between reading and writing, then a run of another task writing a
/// larger value) by compare-and-swap, so that the larger value stays: a few tries, each lost
/// only to another run that wrote meanwhile, and the verifier needs the loop bounded. (The
/// legacy build has no compare-and-swap, and its runs must not be preempted: see LEGACY.)
#[inline(always)]
pub(crate) fn raise(p: &mut u64, v: u64, atomic: bool) {
    if !atomic || LEGACY {
        if v > *p {
            *p = v;
        }
        return;
    }
    // SAFETY: an aligned u64 in a map value.
    let mut seen = unsafe { core::ptr::read_volatile(p as *const u64) };
    for _ in 0..RAISE_TRIES {
        if v <= seen {
            return;
        }
        // SAFETY: as above.
        let (now, swapped) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::Relaxed }, { AtomicOrdering::Relaxed }>(
                p as *mut u64,
                seen,
                v,
            )
        };
        if swapped {
            return;
        }
        seen = now;
    }
}

/// How many times [`raise`] tries: each failure is another run's write to the same cell on
/// this CPU between two instructions, so a fourth in a row is beyond any real interleaving.
pub(crate) const RAISE_TRIES: usize = 4;

/// The cell of (probe, ctx) on `cpu`: the workload's (`workload`: a call the entry found to be
/// the workload's; in the task context, or in any where the workload is the charged memcg),
/// else the context's. One lookup finds a call's counters and histogram.
#[inline(always)]
pub(crate) fn cell_of(
    cpu: u32,
    probe: u32,
    ctx: u32,
    workload: bool,
    plain: bool,
) -> Option<&'static mut Cell> {
    let probes = config().probes;
    if probe >= probes {
        return None;
    }
    let by_memcg = !plain && config().workload_memcg != 0;
    let p = if workload && (ctx == CTX_TASK || by_memcg) {
        let contexts = workload_contexts(by_memcg);
        WORKLOAD_CELLS.get_ptr_mut(workload_cell(cpu, probes, probe, ctx, contexts))
    } else {
        CELLS.get_ptr_mut(cell(cpu, probes, probe, ctx & (NUM_CTX as u32 - 1)))
    };
    // SAFETY: pointer from a successful map lookup; only this CPU's programs write its region.
    p.map(|p| unsafe { &mut *p })
}

/// The counters of (probe, ctx) on `cpu`, in the context's cell: every entry (a workload's
/// too: see `Cell`), and the runs that are no workload call's exit (no pending entry, no
/// context, tracepoint hits).
#[inline(always)]
pub(crate) fn counters(cpu: u32, probe: u32, ctx: u32) -> Option<&'static mut Counters> {
    cell_of(cpu, probe, ctx, false, false).map(|c| &mut c.counters)
}

/// Adds one duration, and its self time, to a histogram.
#[inline(always)]
pub(crate) fn record(
    h: &mut Hist,
    ns: u64,
    self_ns: u64,
    nested: u64,
    off: u64,
    nested_off: u64,
    atomic: bool,
) {
    add(&mut h.sum_ns, ns, atomic);
    add(&mut h.self_ns, self_ns, atomic);
    if nested != 0 {
        add(&mut h.nested, nested, atomic);
    }
    if off != 0 {
        add(&mut h.off_ns, off, atomic);
        if nested_off != 0 {
            add(&mut h.nested_off_ns, nested_off, atomic);
        }
    }
    raise(&mut h.max_ns, ns, atomic);
    // The minimum is kept inverted, so that 0 is "no call yet" and lowering it is raising
    // its inverse (`ns` of u64::MAX, whose inverse is 0, is beyond any clock's reach).
    raise(&mut h.min_ns_inv, !ns, atomic);
    let i = bucket_of(ns) & (NUM_BUCKETS - 1);
    add(&mut h.buckets[i], 1, atomic);
}

/// `bucket_index(ns)` as the verifier of every kernel accepts it: the tables' index masked in
/// assembly, which the compiler cannot drop. With only the bound the compiler proved (`ns <
/// SHORT_NS`), 6.1's verifier (which does not evaluate a comparison of two registers) follows
/// a path where the latency's range is impossible (at least 4,096 and at most 4,095), takes
/// the table's address plus it for a plain number and refuses the load; the mask gives the
/// index a valid range on every path. The selftest compares the result with userspace's.
#[inline(always)]
pub(crate) fn bucket_of(ns: u64) -> usize {
    if ns < SHORT_NS {
        // SAFETY: the index is below SHORT_NS, the table's length.
        return unsafe { *SHORT_BUCKETS.get_unchecked(short_index(ns)) } as usize;
    }
    if ns < MID_NS {
        // SAFETY: as above (`ns >> MID_SHIFT` is below SHORT_NS, MID_BUCKETS' length).
        return MID_BASE
            + unsafe { *MID_BUCKETS.get_unchecked(short_index(ns >> MID_SHIFT)) } as usize;
    }
    bucket_by_log(ns)
}

/// `ns` masked to the short tables' range, in assembly (see [`bucket_of`]).
#[inline(always)]
pub(crate) fn short_index(ns: u64) -> usize {
    let mut i = ns;
    // SAFETY: an AND of a register with a constant.
    unsafe {
        core::arch::asm!("{0} &= {m}", inout(reg) i, m = const SHORT_NS - 1,
            options(pure, nomem, nostack, preserves_flags));
    }
    i as usize
}
