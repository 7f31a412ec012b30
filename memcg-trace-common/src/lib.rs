//! The types and the histogram bucket layout that the eBPF programs and the userspace daemon
//! agree on. `no_std`, `#[repr(C)]`, and used unchanged on both sides.
//!
//! Latency buckets are log-linear: values below 2^[`SUB_BITS`] ns get one bucket each; every
//! power of two above that is split into 2^[`SUB_BITS`] equal sub-buckets. With `SUB_BITS = 5`
//! a bucket is at most 1/32 of its lower bound wide, so a value reported as the bucket's
//! midpoint is within 1/64 (1.6%) of the truth.
//!
//! ```
//! use memcg_trace_common::{bucket_index, bucket_bounds};
//! let i = bucket_index(1500);
//! let (lo, hi) = bucket_bounds(i);
//! assert!(lo <= 1500 && 1500 < hi);
//! ```
#![no_std]

/// Linear sub-buckets per power of two, as a power of two.
pub const SUB_BITS: u32 = 5;
/// Number of sub-buckets per power of two.
pub const SUB_BUCKETS: u64 = 1 << SUB_BITS;
/// Values at or above 2^`MAX_POW` ns (68.7 s) fall into the last bucket.
pub const MAX_POW: u32 = 36;
/// Buckets per histogram: `SUB_BUCKETS` exact ones, then `SUB_BUCKETS` per power of two. A power
/// of two, so the eBPF side can bound an index with a mask the verifier understands.
pub const NUM_BUCKETS: usize = (SUB_BUCKETS + (MAX_POW - SUB_BITS) as u64 * SUB_BUCKETS) as usize;
const _: () = assert!(NUM_BUCKETS.is_power_of_two());

/// Probe slots: each logical probe or `--func` target gets one, with its own program pair.
pub const MAX_PROBES: usize = 12;
/// Execution contexts, the kernel's `in_task()` split.
pub const NUM_CTX: usize = 4;
/// Task context: `in_task()` is true.
pub const CTX_TASK: u32 = 0;
/// Serving a softirq (SOFTIRQ_OFFSET set; bottom halves merely disabled is still task).
pub const CTX_SOFTIRQ: u32 = 1;
/// In a hardware interrupt handler.
pub const CTX_HARDIRQ: u32 = 2;
/// In an NMI.
pub const CTX_NMI: u32 = 3;
/// Context names in index order, as the kernel spells them.
pub const CTX_NAMES: [&str; NUM_CTX] = ["task", "softirq", "hardirq", "nmi"];

/// A de Bruijn sequence B(2, 6): the top six bits of `DE_BRUIJN << p` differ for every
/// `p` in 0..64.
const DE_BRUIJN: u64 = 0x022f_dd63_cc95_386d;

/// The exponent `p` for each top six bits of `DE_BRUIJN << p` (see [`ilog2`]).
const LOG2_OF_TOP_BITS: [u8; 64] = {
    let mut table = [0u8; 64];
    let mut p = 0;
    while p < 64 {
        table[((DE_BRUIJN << p) >> 58) as usize] = p as u8;
        p += 1;
    }
    table
};

/// Floor of log2 for `v > 0` (0 for 0), without loops, branches or `leading_zeros`, so that it
/// compiles to one short straight sequence the BPF verifier accepts on every kernel (the
/// binary search it replaces became about 50 instructions of conditional moves on every
/// histogram update): the bits below the highest are filled in, the highest is isolated, and
/// its position is read from the de Bruijn table.
#[inline(always)]
pub const fn ilog2(v: u64) -> u32 {
    let mut bits = v;
    bits |= bits >> 1;
    bits |= bits >> 2;
    bits |= bits >> 4;
    bits |= bits >> 8;
    bits |= bits >> 16;
    bits |= bits >> 32;
    let top = bits ^ (bits >> 1);
    LOG2_OF_TOP_BITS[(top.wrapping_mul(DE_BRUIJN) >> 58) as usize & 63] as u32
}

/// The bucket a latency of `ns` nanoseconds is counted in: for the usual latencies (below
/// [`SHORT_NS`]) one load from a table, for the slow ones up to [`MID_NS`] one load from
/// another, else computed ([`bucket_by_log`]). A table saves about 40 of the exit program's
/// ~330 instructions a call, for one more cache line read (the few in use stay hot: a
/// function's latencies cluster).
#[inline(always)]
pub const fn bucket_index(ns: u64) -> usize {
    if ns < SHORT_NS {
        return SHORT_BUCKETS[ns as usize] as usize;
    }
    if ns < MID_NS {
        return MID_BASE + MID_BUCKETS[(ns >> MID_SHIFT) as usize] as usize;
    }
    bucket_by_log(ns)
}

/// Latencies below this (ns) have their bucket read from a table ([`SHORT_BUCKETS`],
/// [`SHORT_CALLER_BUCKETS`]).
pub const SHORT_NS: u64 = 4096;

/// The bucket of each latency below [`SHORT_NS`], as [`bucket_by_log`] computes it; a byte
/// each (those buckets are below 256).
pub const SHORT_BUCKETS: [u8; SHORT_NS as usize] = short_table(false);

/// The table of the buckets of the latencies below [`SHORT_NS`]: the call-site histograms'
/// (`callers`) or the latency histograms'.
const fn short_table(callers: bool) -> [u8; SHORT_NS as usize] {
    let mut table = [0u8; SHORT_NS as usize];
    let mut ns = 0;
    while ns < SHORT_NS {
        table[ns as usize] = if callers {
            caller_bucket_by_log(ns)
        } else {
            bucket_by_log(ns)
        } as u8;
        ns += 1;
    }
    table
}
const _: () = assert!(bucket_by_log(SHORT_NS - 1) < 256);

/// From [`SHORT_NS`] on, a bucket holds a range of at least 2^`MID_SHIFT` ns that starts at a
/// multiple of it (its sub-bucket bits lie above those), so `ns >> MID_SHIFT` tells its bucket.
pub const MID_SHIFT: u32 = SHORT_NS.trailing_zeros() - SUB_BITS;
/// Latencies from [`SHORT_NS`] up to this (ns, exclusive: 524 us) have their bucket read from
/// [`MID_BUCKETS`], by `ns >> MID_SHIFT`.
pub const MID_NS: u64 = SHORT_NS << MID_SHIFT;
/// The first bucket above [`SHORT_NS`]: [`MID_BUCKETS`] holds the buckets less this.
pub const MID_BASE: usize = bucket_by_log(SHORT_NS);

/// The bucket of each latency from [`SHORT_NS`] to [`MID_NS`] less [`MID_BASE`], by `ns >>
/// MID_SHIFT` (the entries below `SHORT_NS >> MID_SHIFT` are not used); a byte each.
pub const MID_BUCKETS: [u8; SHORT_NS as usize] = {
    let mut table = [0u8; SHORT_NS as usize];
    let mut i = SHORT_NS >> MID_SHIFT;
    while i < SHORT_NS {
        table[i as usize] = (bucket_by_log(i << MID_SHIFT) - MID_BASE) as u8;
        i += 1;
    }
    table
};
const _: () = assert!(bucket_by_log(MID_NS - 1) - MID_BASE < 256);

/// The bucket of `ns`, computed from its highest bit (see [`bucket_index`]).
#[inline(always)]
pub const fn bucket_by_log(ns: u64) -> usize {
    if ns < SUB_BUCKETS {
        return ns as usize;
    }
    let p = ilog2(ns);
    if p >= MAX_POW {
        return NUM_BUCKETS - 1;
    }
    let sub = (ns >> (p - SUB_BITS)) & (SUB_BUCKETS - 1);
    (SUB_BUCKETS + (p - SUB_BITS) as u64 * SUB_BUCKETS + sub) as usize
}

/// The half-open range `[lo, hi)` of nanoseconds counted in bucket `i`. The last bucket also
/// holds everything above its range.
pub const fn bucket_bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < SUB_BUCKETS {
        return (i, i + 1);
    }
    let p = (i - SUB_BUCKETS) / SUB_BUCKETS + SUB_BITS as u64;
    let sub = (i - SUB_BUCKETS) % SUB_BUCKETS;
    let width = 1u64 << (p - SUB_BITS as u64);
    let lo = (1u64 << p) + sub * width;
    (lo, lo + width)
}

/// The exclusive upper bound of what bucket `i` holds: [`bucket_bounds`]' except for the last
/// bucket, which holds every longer call too (68.7 s and more): unbounded.
pub const fn bucket_end(i: usize) -> u64 {
    if i >= NUM_BUCKETS - 1 {
        u64::MAX
    } else {
        bucket_bounds(i).1
    }
}

/// Names of the programs and maps in the eBPF object: the one list both sides use. The eBPF crate
/// defines its programs with these names (`probe_slot!`, `floor_pair!`); userspace finds them
/// by these names, and a test checks the built object holds exactly these.
pub mod names {
    use super::MAX_PROBES;

    /// Builds a per-slot name table from one prefix: `fentry_0`, `fentry_1`, ...
    macro_rules! per_slot {
        ($p:literal) => {
            [
                concat!($p, "_0"),
                concat!($p, "_1"),
                concat!($p, "_2"),
                concat!($p, "_3"),
                concat!($p, "_4"),
                concat!($p, "_5"),
                concat!($p, "_6"),
                concat!($p, "_7"),
                concat!($p, "_8"),
                concat!($p, "_9"),
                concat!($p, "_10"),
                concat!($p, "_11"),
            ]
        };
    }

    /// fentry programs, by probe slot.
    pub const FENTRY: [&str; MAX_PROBES] = per_slot!("fentry");
    /// fexit programs, by probe slot.
    pub const FEXIT: [&str; MAX_PROBES] = per_slot!("fexit");
    /// Patched fentry programs, by probe slot: the same pairing built for kernels whose fentry
    /// runs do not interleave on a CPU and whose task and cgroup fields it reads by plain
    /// loads, at offsets the loader writes into the loads (`patch::lean_fields`); its tests of
    /// those conditions the compiler folded away. The loader takes them where those conditions
    /// hold (`fentry_build`).
    pub const FENTRY_PATCHED: [&str; MAX_PROBES] = per_slot!("fentry_patched");
    /// Patched fexit programs, by probe slot (see [`FENTRY_PATCHED`]).
    pub const FEXIT_PATCHED: [&str; MAX_PROBES] = per_slot!("fexit_patched");
    /// Lean fentry programs, by probe slot: the patched ones (see [`FENTRY_PATCHED`]) built
    /// for the plain settings too (no call sites, stacks or charged memcgs). The loader takes
    /// them where all of it holds (`fentry_build`).
    pub const FENTRY_LEAN: [&str; MAX_PROBES] = per_slot!("fentry_lean");
    /// Lean fexit programs, by probe slot (see [`FENTRY_LEAN`]).
    pub const FEXIT_LEAN: [&str; MAX_PROBES] = per_slot!("fexit_lean");
    /// kprobe programs, by probe slot.
    pub const KPROBE: [&str; MAX_PROBES] = per_slot!("kprobe");
    /// kretprobe programs, by probe slot.
    pub const KRETPROBE: [&str; MAX_PROBES] = per_slot!("kretprobe");
    /// tp_btf programs (counts-only backend), by probe slot.
    pub const TP: [&str; MAX_PROBES] = per_slot!("tp");

    /// Bench floors: (a) empty programs and (b) clock at entry and exit, per program type, in
    /// (entry, exit) order; tracepoints have one program each.
    pub const FLOOR_EMPTY_FENTRY: [&str; 2] = ["floor_empty_fentry", "floor_empty_fexit"];
    /// Floor (b), fentry/fexit.
    pub const FLOOR_CLOCK_FENTRY: [&str; 2] = ["floor_clock_fentry", "floor_clock_fexit"];
    /// Floor (a), kprobe/kretprobe.
    pub const FLOOR_EMPTY_KPROBE: [&str; 2] = ["floor_empty_kprobe", "floor_empty_kretprobe"];
    /// Floor (b), kprobe/kretprobe.
    pub const FLOOR_CLOCK_KPROBE: [&str; 2] = ["floor_clock_kprobe", "floor_clock_kretprobe"];
    /// Floor (a), tracepoint.
    pub const FLOOR_EMPTY_TP: [&str; 1] = ["floor_empty_tp"];
    /// Floor (b), tracepoint: one per-CPU increment.
    pub const FLOOR_CLOCK_TP: [&str; 1] = ["floor_clock_tp"];

    /// Context-check programs, one per row of [`super::CTX_SOURCES`].
    pub const CTX_CHECK: [&str; super::CTX_CHECK_ROWS as usize] = [
        "ctx_check_0",
        "ctx_check_1",
        "ctx_check_2",
        "ctx_check_3",
        "ctx_check_4",
        "ctx_check_5",
        "ctx_check_6",
    ];
    /// The BPF_PROG_TEST_RUN entry of `memcg-trace selftest` (see [`super::test_op`]).
    pub const SELFTEST: &str = "selftest";
    /// The test-run entry that reads the caller's cgroup level (a cgroup namespace hides it).
    pub const OWN_CGROUP_LEVEL: &str = "own_cgroup_level";
    /// BPF iterator over the kernel's programs: (id, address of the per-CPU stats) of each.
    pub const PROG_ITER: &str = "prog_stats";
    /// The switch witness (tp_btf on `sched_switch`): counts, per CPU, the context switches
    /// that find the CPU's `bpf_prog_active` held ([`super::HeldSwitches`]).
    pub const HELD_SWITCH: &str = "held_switch";
    /// The tracepoint the switch witness is attached to.
    pub const HELD_SWITCH_TARGET: &str = "sched_switch";

    /// Counters and histogram by (CPU, probe, context) ([`super::Cell`]): a shared array
    /// userspace maps into memory.
    pub const MAP_CELLS: &str = "CELLS";
    /// The workload's calls by (CPU, probe[, context]) ([`super::workload_cell`]), shared the
    /// same way: each such call is counted and timed there only.
    pub const MAP_WORKLOAD_CELLS: &str = "WORKLOAD_CELLS";
    /// Ring buffer of deferred calls (see [`super::Deferred`]).
    pub const MAP_DEFERRED: &str = "DEFERRED";
    /// The switch witness's counts, one [`super::HeldSwitches`] per CPU.
    pub const MAP_HELD_SWITCHES: &str = "HELD_SWITCHES";
    /// The CPUs' states, one element per CPU (`CpuState`), with the calls waiting for their
    /// exit and the entries counted; mapped by userspace.
    pub const MAP_CPU_STATE: &str = "CPU_STATE";
    /// Per probe slot: the per-CPU address of the entry program's recursion-miss counter, or
    /// [`super::MISSES_BY_WITNESS`].
    pub const MAP_PROG_MISSES: &str = "PROG_MISSES";
    /// Per probe slot: the tracing window ([`super::WINDOW_OPEN`] while both programs are on).
    pub const MAP_WINDOW: &str = "WINDOW";
    /// Context-check counts, see [`super::ctx_check_index`].
    pub const MAP_CTX_CHECK: &str = "CTX_CHECK";
    /// Raw preempt_count bits seen per context-check row: (any, all) pairs.
    pub const MAP_CTX_BITS: &str = "CTX_BITS";
    /// Floor (b) per-CPU state of the bench.
    pub const MAP_FLOOR: &str = "FLOOR";
    /// Timed calls per call site, with `--callers` (see [`super::CallerKey`]).
    pub const MAP_CALLERS: &str = "CALLERS";
    /// Calls per charged memcg, with `--by-memcg` (see [`super::MemcgKey`]).
    pub const MAP_MEMCGS: &str = "MEMCGS";
    /// The slots in front of `CALLERS` (see [`super::FrontSlot`]).
    pub const MAP_CALLER_FRONT: &str = "CALLER_FRONT";
    /// The slots in front of `MEMCGS` (see [`super::FrontSlot`]).
    pub const MAP_MEMCG_FRONT: &str = "MEMCG_FRONT";
    /// Sampled short stacks (`--callers-depth`, see [`super::StackKey`]).
    pub const MAP_STACKS: &str = "STACKS";
    /// Per probe slot: how to reach the charged memcg from the argument ([`super::MemcgPath`]).
    pub const MAP_MEMCG_PATH: &str = "MEMCG_PATH";
    /// Whether a memcg is the workload's or below it (`Config::workload_memcg`), by id: the
    /// workload's subtree put in by userspace each tick, and the verdicts of the programs
    /// on memcgs it did not know yet (made since the last tick, or not the workload's), found
    /// by climbing their parents to the workload's memcg or the root. LRU: a verdict pushed
    /// out is found again (the workload's own memcg by its id, the others by climbing); the
    /// programs never replace a verdict already there.
    pub const MAP_WORKLOAD_MEMCGS: &str = "WORKLOAD_MEMCGS";
    /// The id of the workload's memcg, where a climb stops (one entry; 0: none).
    pub const MAP_WORKLOAD_ROOT: &str = "WORKLOAD_ROOT";
    /// Read-only global: the kernel layout.
    pub const GLOBAL_LAYOUT: &str = "LAYOUT";
    /// Read-only global: the settings ([`super::Config`]).
    pub const GLOBAL_CONFIG: &str = "CONFIG";

    /// Maps userspace reads through a shared mapping, never through the map syscalls: those
    /// hold the CPU's BPF recursion guard while preemptible, and a kprobe firing on that CPU
    /// meanwhile would be lost.
    pub const SHARED_MAPS: [&str; 4] = [
        MAP_CELLS,
        MAP_WORKLOAD_CELLS,
        MAP_HELD_SWITCHES,
        MAP_CPU_STATE,
    ];

    /// Every program the object must hold.
    pub fn all_programs() -> impl Iterator<Item = &'static str> {
        FENTRY
            .into_iter()
            .chain(FEXIT)
            .chain(FENTRY_LEAN)
            .chain(FEXIT_LEAN)
            .chain(KPROBE)
            .chain(KRETPROBE)
            .chain(TP)
            .chain(FLOOR_EMPTY_FENTRY)
            .chain(FLOOR_CLOCK_FENTRY)
            .chain(FLOOR_EMPTY_KPROBE)
            .chain(FLOOR_CLOCK_KPROBE)
            .chain(FLOOR_EMPTY_TP)
            .chain(FLOOR_CLOCK_TP)
            .chain(CTX_CHECK)
            .chain([SELFTEST, OWN_CGROUP_LEVEL, PROG_ITER, HELD_SWITCH])
    }
}

/// Context-check column for "context unreadable".
pub const CTX_UNKNOWN: u32 = NUM_CTX as u32;
/// Columns of the context-check grid: the four contexts and "unknown".
pub const CTX_CHECK_COLS: u32 = NUM_CTX as u32 + 1;
/// Rows of the context-check grid, one per [`CTX_SOURCES`] entry.
pub const CTX_CHECK_ROWS: u32 = 7;

/// What a context-check row is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtxUse {
    /// The mask calibration reads its preempt_count bits (and the self-test checks it).
    Calibration,
    /// Only the self-test checks it: a source independent of the calibration's.
    Check,
}

/// Tracepoints whose context is known, per context-check row: the context they run in, what the
/// row is for, and the tracepoints tried in order (the first that attaches is used).
pub const CTX_SOURCES: [(u32, CtxUse, &[&str]); CTX_CHECK_ROWS as usize] = [
    // A system call's entry: task context on every kernel. (Not sched_switch, as before: on
    // PREEMPT_RT a softirq handler that blocks on a sleeping lock switches out while still
    // serving its softirq, which the kernel's `in_serving_softirq()` says there.)
    (CTX_TASK, CtxUse::Check, &["sys_enter", "sched_switch"]),
    (CTX_SOFTIRQ, CtxUse::Calibration, &["softirq_entry"]),
    (
        CTX_HARDIRQ,
        CtxUse::Calibration,
        &["local_timer_entry", "irq_handler_entry"],
    ),
    // Timer-wheel callbacks run in the TIMER softirq (the self-test arms some: a socket
    // receive timeout is a timer-wheel timer).
    (CTX_SOFTIRQ, CtxUse::Check, &["timer_expire_entry"]),
    // IPIs: another hardirq source than the timer the calibration watches (the self-test sends
    // some with membarrier): x86's vector tracepoint, else the generic one arm64 fires.
    (
        CTX_HARDIRQ,
        CtxUse::Check,
        &["call_function_entry", "ipi_entry"],
    ),
    (
        CTX_HARDIRQ,
        CtxUse::Check,
        &["call_function_single_entry", "reschedule_entry"],
    ),
    // After each NMI handler, in NMI context; NMIs come from the PMU when perf can raise them.
    (CTX_NMI, CtxUse::Calibration, &["nmi_handler"]),
];

/// Cell of the context-check grid counting hits expected in `expected` and classified as `got`
/// ([`CTX_UNKNOWN`] when the context could not be read).
#[inline(always)]
pub const fn ctx_check_index(expected: u32, got: u32) -> u32 {
    expected * CTX_CHECK_COLS + got
}

/// One latency histogram for a (probe, context) pair on one CPU.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Hist {
    /// Sum of their durations, ns.
    pub sum_ns: u64,
    /// Longest duration, ns.
    pub max_ns: u64,
    /// Shortest duration, ns, stored bit-inverted so that an all-zero map entry means "none".
    pub min_ns_inv: u64,
    /// Calls counted per bucket; see [`bucket_index`]. Their sum is the histogram's count
    /// (not kept apart: one store less a call).
    pub buckets: [u64; NUM_BUCKETS],
    /// Self time of these calls, ns, summed: each call's duration minus the durations of the
    /// traced calls nested in it on its CPU (see [`Nest`]); a call whose nesting was not seen
    /// adds its whole duration (and is counted in `Counters::self_unknown`).
    pub self_ns: u64,
    /// Traced calls that ran directly nested in these calls (of those whose self time is
    /// known): each leaves the part of its instrumentation outside its own timed window in
    /// the enclosing call's self time, which userspace takes out with the floor.
    pub nested: u64,
    /// Time off the CPU of these calls (those that left it, where known), ns, summed: their
    /// CPU time is `sum_ns` less this.
    pub off_ns: u64,
    /// The part of `off_ns` that the traced calls nested in these calls spent off the CPU
    /// (of the calls whose self time and time off the CPU are known; at most each call's own
    /// time off): already outside `self_ns`, so the self time on the CPU is `self_ns` less
    /// (`off_ns` less this), not less `off_ns` (a nested call asleep in reclaim would count
    /// twice).
    pub nested_off_ns: u64,
}

/// What happened to the calls of one (probe, context) on one CPU (its [`Cell`], plus its
/// workload cell, which holds the exits of the workload's calls). Every entry and every exit
/// program run lands in exactly one of these, so the totals, summed over the CPUs and both
/// cells, account for every run (a migrated call's exit is counted on the CPU it ends on):
///
/// - `entries == paired + ambiguous + deferred + deferred_lost + stale + evicted + (pending)`
/// - `exits == paired + ambiguous + deferred + deferred_lost + orphans + evicted_exits + outside`
///
/// (for the tracepoint backend, which has no exit, `entries` counts the hits).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Counters {
    /// Entry program runs in this context (each is recorded as a pending call). The fentry
    /// and kprobe programs count them in their CPU's pending set (`PendingSet::entries`), not
    /// in the cell, and userspace adds them here.
    pub entries: u64,
    /// Tracepoint backend, task context: hits by the workload's tasks (next to `entries`, in
    /// its cache line: every [`Cell`] starts one; counting them costs no second lookup and no
    /// second miss).
    pub workload_hits: u64,
    /// Exit program runs attributed to this context (the pending call's, or the one read at
    /// exit for an orphan).
    pub exits: u64,
    /// Calls paired with their own entry and timed in the kernel's histogram.
    pub paired: u64,
    /// Calls paired, but whose pairing userspace must confirm against the kernel's recursion
    /// counters (see `Deferred`); sent to the ring buffer.
    pub deferred: u64,
    /// Deferred calls lost because the ring buffer was full.
    pub deferred_lost: u64,
    /// Of the paired and deferred calls: task-context calls during which the task left the CPU
    /// (slept, was preempted or migrated). They are timed wall-clock.
    pub switched: u64,
    /// Of the switched calls: those whose exit ran on another CPU than their entry.
    pub migrated: u64,
    /// Of the switched calls that would be deferred (see `Deferred`): those proven in the
    /// kernel instead, and timed there. The task never moved to another CPU during the call,
    /// and the entry program missed no run on that CPU meanwhile (`Pending::misses`), so the
    /// entry the exit found is its own: a skipped entry of this task could only have been
    /// skipped on that CPU.
    pub proven_on_cpu: u64,
    /// Exits that found no pending entry of their own (the entry was skipped, or evicted and
    /// no longer remembered).
    pub orphans: u64,
    /// Exits of calls counted `evicted`, remembered in `PendingSet::evicted` (on any CPU): not
    /// timed, and not lost a second time.
    pub evicted_exits: u64,
    /// Exits without an entry outside the tracing window: while the entry program was not
    /// attached yet (the exit program is attached first) or no longer (it is detached first).
    /// Those calls began or ended outside the window; they are not lost.
    pub outside: u64,
    /// Pending entries found stale and discarded: their exit can no longer come (a later call
    /// at the same frame, or the interrupt that made them ended) - the exit was lost.
    pub stale: u64,
    /// Pending entries discarded to make room when every slot was taken.
    pub evicted: u64,
    /// Interrupt-context pairs of fentry not counted: the entry program missed a run on this
    /// CPU while the call was in flight, so the pair may join a stale entry with another call's
    /// exit.
    pub ambiguous: u64,
    /// Entry runs whose context could not be read (the per-CPU base could not be verified);
    /// nothing is recorded. Counted in the task row.
    pub no_context_entries: u64,
    /// Exit runs that found no pending entry and whose context could not be read. Counted in
    /// the task row.
    pub no_context_exits: u64,
    /// Of the switched calls timed in the kernel: time the task spent off the CPU during them,
    /// ns, summed (the scheduler's own accounting: see `Pending::clock`). Their on-CPU
    /// time is their latency minus this. (Userspace's snapshots add the deferred calls it
    /// confirmed to this and the two below.)
    pub off_cpu_ns: u64,
    /// The longest such time of one call, ns.
    pub off_cpu_max_ns: u64,
    /// Of the switched calls timed in the kernel: calls whose time off the CPU cannot be told:
    /// migrated where two CPUs' task clocks are not comparable (see
    /// `KernelLayout::cross_cpu_clock`), or whose clock read went back (see [`off_cpu`]); they
    /// add nothing to `off_cpu_ns`.
    pub off_cpu_unknown: u64,
    /// With `Config::callers`: timed calls whose call site found no room in the bounded
    /// `CALLERS` map (or lost a race for it); they are the "other" row, so that the sites' calls
    /// and these add up to the timed calls.
    pub callers_other: u64,
    /// With `--by-memcg`: calls whose memcg found no room in the `MEMCGS` map (or lost a race
    /// for it); the "other" row of the per-memcg rows, which add up to the context's calls. It
    pub memcgs_other: u64,
    /// Timed calls whose self time is not known, and counted as their whole duration: calls
    /// that were not the innermost open call on their CPU at exit (they migrated, or another
    /// task's call was left open there meanwhile; see [`Nest`]), and every call where nesting
    /// is not followed (fentry on preemptible kernels).
    pub self_unknown: u64,
    /// Durations of the timed calls that had no enclosing traced call to be subtracted from
    /// (the outermost ones, and those whose parent was not followed), ns, summed: the time
    /// spent in traced code counted once. With every self time known, the self times of all
    /// probes and contexts add up to exactly this.
    pub outermost_ns: u64,
    /// Task-context entries made by a threaded interrupt handler (a kernel thread named
    /// `irq/...`: every handler on PREEMPT_RT, most with `threadirqs`). Task context by the
    /// kernel's definition, counted apart so that "task" does not hold them silently. Only
    /// where `KernelLayout::task_comm` is set.
    pub irq_thread: u64,
    /// Task-context entries made by a softirq thread (`ksoftirqd/N`, RT's `ktimers/N`) outside
    /// a softirq handler (inside one they are softirq context).
    pub softirq_thread: u64,
}

impl Counters {
    /// Adds another CPU's counters.
    pub fn add(&mut self, o: &Counters) {
        self.entries += o.entries;
        self.exits += o.exits;
        self.paired += o.paired;
        self.deferred += o.deferred;
        self.deferred_lost += o.deferred_lost;
        self.switched += o.switched;
        self.migrated += o.migrated;
        self.proven_on_cpu += o.proven_on_cpu;
        self.orphans += o.orphans;
        self.evicted_exits += o.evicted_exits;
        self.outside += o.outside;
        self.stale += o.stale;
        self.evicted += o.evicted;
        self.ambiguous += o.ambiguous;
        self.no_context_entries += o.no_context_entries;
        self.no_context_exits += o.no_context_exits;
        self.workload_hits += o.workload_hits;
        self.off_cpu_ns += o.off_cpu_ns;
        self.off_cpu_max_ns = self.off_cpu_max_ns.max(o.off_cpu_max_ns);
        self.off_cpu_unknown += o.off_cpu_unknown;
        self.callers_other += o.callers_other;
        self.memcgs_other += o.memcgs_other;
        self.self_unknown += o.self_unknown;
        self.outermost_ns += o.outermost_ns;
        self.irq_thread += o.irq_thread;
        self.softirq_thread += o.softirq_thread;
    }
}

/// The window of a probe slot is open: its entry and exit programs are both attached.
pub const WINDOW_OPEN: u64 = 1;

/// Slots per (CPU, probe) for task-context calls waiting for their exit: calls of one function
/// that entered on one CPU and are still in flight there, preempted, sleeping or migrated.
pub const TASK_SLOTS: usize = 16;
const _: () = assert!(TASK_SLOTS.is_power_of_two() && TASK_SLOTS <= 64);

/// Where a task call with frame `key` starts looking for its slot: calls spread over the slots,
/// and an exit usually finds its entry at the first look.
#[inline(always)]
pub const fn task_slot_hint(key: u64) -> usize {
    ((key >> 4) ^ (key >> 12)) as usize & (TASK_SLOTS - 1)
}

/// Slots per (CPU, probe) in all: the task slots, then one per interrupt context. An interrupt
/// context does not nest within itself on one CPU (a softirq never interrupts a softirq, nor a
/// hardirq a hardirq, nor an NMI an NMI), so at most one call of a function is in flight there.
pub const PENDING_SLOTS: usize = TASK_SLOTS + NUM_CTX - 1;

/// The slot of an interrupt context (`CTX_SOFTIRQ`, `CTX_HARDIRQ` or `CTX_NMI`).
#[inline(always)]
pub const fn irq_slot(ctx: u32) -> usize {
    TASK_SLOTS + ctx as usize - 1
}

/// One call waiting for its exit.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The call's identity: the address of its frame (fentry: the trampoline's argument save
    /// area, shared by the entry and exit programs of one call; kprobe: the stack pointer at
    /// entry). Unique among the calls in flight; 0 marks a free slot.
    pub key: u64,
    /// `bpf_ktime_get_ns()` at the end of the entry program.
    pub ts: u64,
    /// Task context: the task (its `task_struct` address).
    pub task: u64,
    /// Task context: the task's `nvcsw + nivcsw` at entry; unchanged at exit proves the task
    /// never left the CPU in between.
    pub switches: u64,
    /// Task context: the task's off-CPU clock just after `ts`, `se.exec_start -
    /// se.sum_exec_runtime`: it moves by the time the task spends off the CPU (see
    /// [`off_cpu`]); read again at exit for a call that left the CPU.
    pub clock: u64,
    /// The context at entry (`CTX_*`).
    pub ctx: u16,
    /// `PENDING_*` flags.
    pub flags: u16,
    /// With `PENDING_MISSES_KNOWN`: what the entry program read at entry of the runs it missed
    /// on this CPU (`PROG_MISSES`: its recursion misses here, or the switch witness's count
    /// here), its low 32 bits (it cannot move by 2^32 while one call is in flight). Unchanged
    /// at the exit on this CPU, with the task never moved to another CPU (`migrations`), it
    /// proves the exit's own entry ran: the call is timed in the kernel even where it left
    /// the CPU (see `Counters::proven_on_cpu`). In these four bytes rather than a word of its
    /// own: the exit program's copy of a slot and the cross-CPU search's each hold one on a
    /// stack the older verifiers (6.1) allow no more of.
    pub misses: u32,
    /// With `Config::callers`: the return address into the function that made the call (0
    /// when it could not be read).
    pub caller: u64,
    /// With `Config::by_memcg`: the id of the memcg the call charges, read from its argument
    /// (0: not read).
    pub memcg: u64,
    /// This CPU's `Nest::ns` at entry (self time, see [`Nest`]).
    pub nest_ns: u64,
    /// This CPU's `Nest::calls` at entry.
    pub nest_calls: u64,
    /// This CPU's `Nest::off` at entry.
    pub nest_off: u64,
    /// This CPU's `Nest::owner` at entry: who the innermost open call was.
    pub nest_owner: u64,
    /// This CPU's `Nest::top` at entry: the innermost open call then.
    pub nest_top: u64,
    /// This call's own number on its CPU (`Nest::seq` at entry).
    pub nest_id: u64,
    /// Task context: the task's `se.nr_migrations` at entry. An exit that finds a pending call
    /// of its task and frame on its CPU takes it as its own only if the task has not moved to
    /// another CPU since, or no newer entry of that task and frame is pending on another CPU:
    /// else it is a stale entry (its call exited on another CPU, or its exit was lost) and the
    /// exit's own entry is elsewhere. Without the search of other CPUs (the legacy object) such
    /// a pair cannot be told from a call that left and came back, and is not timed (ambiguous).
    pub migrations: u64,
}

/// The call was made by a task of the workload's cgroup.
pub const PENDING_WORKLOAD: u16 = 1;
/// `Pending::misses` was read at entry.
pub const PENDING_MISSES_KNOWN: u16 = 2;
/// A `PROG_MISSES` entry for a kprobe whose kernel counts no kprobe program misses (before
/// 6.7): its runs missed on a CPU are told by the switch witness's count there
/// ([`HeldSwitches::held`]), which moves whenever one may have been (no per-CPU address is 1).
pub const MISSES_BY_WITNESS: u64 = 1;
/// At entry, the innermost open call on the CPU (`nest_owner`) was running and encloses this
/// call: an interrupt call of a lower context still pending there, or a call of the task this
/// call runs in or interrupted (see [`Nest`]).
pub const PENDING_ENCLOSED: u16 = 4;

/// The pending calls of one probe on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct PendingSet {
    /// Slots; free ones have key 0.
    pub calls: [Pending; PENDING_SLOTS],
    /// Task slots that may be taken, one bit each: set after a slot is claimed, cleared after
    /// it is freed (and set again if it was claimed meanwhile). Once the runs touching the set
    /// are done, every taken slot's bit is set; a bit may stay set for a free slot. An entry
    /// that finds no bit set skips the search of the slots.
    pub used: u64,
    /// Entry program runs of this probe on this CPU, by context: `Counters::entries` of the
    /// context's cell, counted here instead, next to `used`, which every entry reads anyway:
    /// an entry then finds no cell (about 28 of the lean fentry program's 207 instructions a
    /// call at 6.12); userspace adds them to the context's counters. Zero for the tracepoint
    /// backend, which counts its hits in the cell or `CpuState::tp_hits`.
    pub entries: [u64; NUM_CTX],
    /// Bytes the probe's exit program passes its call's slot index through (see `pair_exit`):
    /// slot `i`'s index goes through byte `i`, so every run that writes a byte writes the
    /// same value there, and a run of the same exit nested in this one (an interrupt, on
    /// kernels without the guard against a program's recursion, before 5.12) cannot change
    /// what this one reads back.
    pub scratch: [u8; SCRATCH_BYTES],
    /// The last task calls pushed out of this set (`Counters::evicted`), so that their exits
    /// are told from exits whose entry was never seen: such a call is counted lost once, as
    /// evicted, and its exit as `Counters::evicted_exits`, not again as an orphan.
    pub evicted: [Evicted; EVICTED_KEPT],
    /// Where the next evicted call goes in `evicted` (modulo its length).
    pub evicted_next: u64,
}

/// `PendingSet::scratch`'s length: a byte for each slot index (and `TASK_SLOTS`, "none").
pub const SCRATCH_BYTES: usize = PENDING_SLOTS.next_power_of_two();
const _: () = assert!(SCRATCH_BYTES > PENDING_SLOTS && SCRATCH_BYTES <= 256);

/// Evicted calls remembered per (CPU, probe); an older one's exit is an orphan again (counted
/// twice, as before: still an upper bound).
pub const EVICTED_KEPT: usize = 8;
const _: () = assert!(EVICTED_KEPT.is_power_of_two());

/// A task call pushed out of its CPU's set before its exit came (see `PendingSet::evicted`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Evicted {
    /// Its frame (`Pending::key`); 0: none, or its exit came.
    pub key: u64,
    /// Its task.
    pub task: u64,
}

/// A paired call whose pairing userspace confirms before it counts: a task-context call that
/// left the CPU on a kernel where other tasks can hold the entry program's recursion guard
/// (preemptible), or an interrupt-context call traced with fentry (whose entry and exit
/// programs have separate guards). Such a pair could be made of a stale entry and an exit whose
/// own entry was skipped; that needs a recursion miss of the entry program in between, which
/// the kernel counts. Userspace keeps the call only if the count did not move during it.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Deferred {
    /// Entry timestamp, ns (`bpf_ktime_get_ns`, CLOCK_MONOTONIC).
    pub start: u64,
    /// Exit timestamp, ns.
    pub end: u64,
    /// Probe slot.
    pub probe: u32,
    /// Context (`CTX_*`).
    pub ctx: u8,
    /// `DEFERRED_*` flags.
    pub flags: u8,
    /// Traced calls directly nested in this one (`NestFrame::child_calls`, saturated).
    pub child_calls: u16,
    /// The durations of the traced calls nested in this one, ns (`NestFrame::child_ns`);
    /// `u64::MAX`: not known (its self time is then its whole duration).
    pub child_ns: u64,
    /// Switched task calls: time off the CPU, ns (0 with `DEFERRED_OFF_UNKNOWN`).
    pub off_ns: u64,
    /// The part of `off_ns` spent in the traced calls nested in this one (`Hist::nested_off_ns`;
    /// 0 where its self time or time off the CPU is not known).
    pub child_off_ns: u64,
    /// The call site (`Pending::caller`).
    pub caller: u64,
    /// The memcg the call charges (`Pending::memcg`).
    pub memcg: u64,
}

/// The call was made by a task of the workload's cgroup.
pub const DEFERRED_WORKLOAD: u8 = 1;
/// The task left the CPU during the call.
pub const DEFERRED_SWITCHED: u8 = 2;
/// The exit ran on another CPU than the entry.
pub const DEFERRED_MIGRATED: u8 = 4;
/// Time off the CPU unknown: migrated on a kernel whose CPUs' task clocks are not comparable,
/// or the task's off-CPU clock went back (see [`off_cpu`]).
pub const DEFERRED_OFF_UNKNOWN: u8 = 8;
/// No enclosing traced call was followed: userspace adds the confirmed call's duration to
/// `Counters::outermost_ns`.
pub const DEFERRED_OUTERMOST: u8 = 16;

/// The time a task spent off the CPU during a call, from its off-CPU clock at entry and at exit
/// (`Pending::clock`), at most the call's wall time `wall`; None when the clock went back, or
/// moved by more than the call lasted beyond the drift of the two clocks (`OFF_CPU_SLACK`): it
/// does neither for one task on one CPU, so the reads were not a pair (one raced with the
/// scheduler updating the task from another CPU, failed, or came from two CPUs' clocks), and
/// no time is made up. The scheduler adds the time
/// a task ran to `se.sum_exec_runtime` and sets `se.exec_start` to the same instant whenever it
/// accounts a running task (ticks, switch-out), so `exec_start - sum_exec_runtime` stays put
/// while the task runs and jumps by the time it was away when it is switched back in
/// (`exec_start` = the switch-in time, the sum unchanged).
#[inline(always)]
pub const fn off_cpu(entry: u64, exit: u64, wall: u64) -> Option<u64> {
    let delta = exit.wrapping_sub(entry) as i64;
    if delta < 0 {
        None
    } else if delta as u64 > wall {
        if delta as u64 - wall <= off_cpu_slack(wall) {
            Some(wall)
        } else {
            None
        }
    } else {
        Some(delta as u64)
    }
}

/// How far the off-CPU clock (the scheduler's, `rq_clock_task`) may run ahead of the call's
/// wall time (`bpf_ktime_get_ns`) over a call of `wall` ns and still be taken as "off the CPU
/// for all of it": the two clocks' drift (NTP slews the monotonic clock by up to 500 ppm) and
/// the few ns between the two reads at each end.
#[inline(always)]
pub const fn off_cpu_slack(wall: u64) -> u64 {
    (wall >> 10) + 1000
}

/// One CPU's state, kept by the programs (its element of `CPU_STATE`, by CPU number).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuState {
    /// Address of this CPU's preempt count, once found and verified (0 before).
    pub preempt_addr: u64,
    /// This CPU's `__per_cpu_offset`: added to a dynamically allocated per-CPU pointer, it
    /// gives this CPU's instance.
    pub pcpu_offset: u64,
    /// Address of this CPU's pointer to the running task (`KernelLayout::current_task` from
    /// the per-CPU base); 0 when unknown.
    pub current_addr: u64,
    /// The workload's `struct cgroup`, once a task of it was seen here (0 before): a task
    /// whose `cgroups->dfl_cgrp` is this is in the workload without reading the id. Only kept
    /// when memcg-trace created the cgroup (`Config::workload_owned`), which then outlives the
    /// programs: the address cannot be reused by another cgroup meanwhile.
    pub workload_cgrp: u64,
    /// This CPU's number.
    pub cpu: u32,
    /// Entries since the last short stack captured here (`Config::stack_sample`).
    pub since_stack: u32,
    /// Self time on this CPU (see [`Nest`]).
    pub nest: Nest,
    /// Calls waiting for their exit, by probe slot: in this value, which every program looks
    /// up first, so that reaching them costs no lookup of their own. (The whole value is kept
    /// within 32 KiB: see the assertion below.)
    pub pending: [PendingSet; MAX_PROBES],
    /// Tracepoint hits on this CPU by `probe * NUM_CTX + ctx`: [hits, workload hits], where
    /// the tracepoint programs count here (`Config::tp_percpu`); `TP_CELLS` of them.
    pub tp_hits: [[u64; 2]; TP_CELLS],
    /// By probe slot: the memcg the last call's argument led to on this CPU (see
    /// `charged_memcg`): here, not in a map of its own, so that `--by-memcg` costs no lookup
    /// of it (20 ns of a call's 964 in the instruction-counted guest).
    pub memcg_memo: [MemcgMemo; MAX_PROBES],
    /// Unused: the size a whole number of cache lines (see the assertion below).
    pub pad: u64,
}

/// The end of a probe's memcg path (`MemcgPath`) for one argument: a call with the same
/// argument whose first hop reads the same, and whose kernfs node still holds the memcg's id,
/// is taken to charge the same memcg, without the rest of the chase. What lies past the first
/// hop does not change while that hop's object lives (a memcg's css, cgroup and kernfs node are
/// its own for life); the first hop is what does (an object cgroup is moved to the parent memcg
/// when its memcg goes offline). The id read again through the kernfs node catches a memcg
/// removed and another made at the same addresses, node included (kernfs ids are never
/// reused); not one made at the same addresses with its node elsewhere while the old node's
/// memory still holds the old id, between two calls of the probe on one CPU. Only the
/// programs read and write it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgMemo {
    /// Odd while a run writes it: a run nested in that one (an interrupt's call of the same
    /// probe, where the kernel does not keep a program from running nested in itself, as
    /// fentry before 5.12) neither reads nor writes it; a read that finds it moved is dropped.
    pub seq: u64,
    /// The argument (0: empty).
    pub arg: u64,
    /// What its first hop read.
    pub hop: u64,
    /// The memcg found (`Charged`), and whether it is the workload's where that was asked
    /// (a memcg's place in the tree does not change).
    pub id: u64,
    /// See `id`.
    pub kn: u64,
    /// See `id`.
    pub verdict: u64,
}

// Within 32 KiB, the kernel's limit for a per-CPU map value (PCPU_MIN_UNIT_SIZE), which it
// was until the states became elements of a mappable array (the daemon reads a few words of
// each, from the mapping); the states of neighbouring CPUs are kept apart by a whole number
// of cache lines (the array's elements are this size, rounded to 8, from a page boundary).
const _: () = assert!(core::mem::size_of::<CpuState>() <= 32 * 1024);
const _: () = assert!(core::mem::size_of::<CpuState>().is_multiple_of(64));

/// Cells of `CpuState::tp_hits`: `MAX_PROBES * NUM_CTX` rounded up to a power of two, so that
/// a masked index is always in bounds.
pub const TP_CELLS: usize = (MAX_PROBES * NUM_CTX).next_power_of_two();

/// Self time on one CPU, kept as running sums instead of a stack. `ns` and `calls` sum the
/// traced calls completed at the current nesting level. A call entering takes the next number
/// (`seq`), notes the sums and who was innermost (`Pending::nest_*`), and becomes the innermost
/// open call (`top`, `owner`). At its exit it sets all of it back to what it noted (only the
/// open call where no call was counted inside it: the sums are then still what it noted),
/// plus itself in the sums if the call it found open encloses it: what that call will see. If it is
/// still the innermost call at its exit, every change to the sums meanwhile was made inside
/// its window by a call it encloses (a call enclosed by the one innermost when it entered, set
/// back to a value noted inside its window), so their growth is exactly its nested calls'
/// time. Enclosed: an interrupt-context call by whatever it interrupted; a task call only by
/// its own task's call (another task's, left open when that task was switched out, is not its
/// caller, so its calls leave the sums as they found them). Exits out of order (a call that
/// migrated, or whose task was switched out while another task's call began there and is
/// still open) find another call innermost: their nesting is unknown (self time = duration,
/// counted in `Counters::self_unknown`). A call enclosed by what it interrupted is told at its
/// entry, by who is innermost: an interrupt call of a lower context whose slot is still taken,
/// or the very task the call runs in or interrupted (another task's open call is not running:
/// it was switched out, so an interrupt now is not inside its time). An open state that cannot
/// be running any more (a task's call with no task call pending on the CPU, after a call that
/// migrated away or whose exit was lost; an interrupt call with no lower interrupt call
/// pending) is dropped by the next call that enters: it notes "none open". A few loads and
/// stores a call, no search.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Nest {
    /// Durations of the calls completed at the current level, ns, summed (wrapping).
    pub ns: u64,
    /// How many (wrapping).
    pub calls: u64,
    /// Their time off the CPU, ns, summed (wrapping; see `Hist::nested_off_ns`).
    pub off: u64,
    /// The innermost open call: its task in task context, [`NEST_IRQ`] in an interrupt
    /// context, [`NEST_NONE`] when none is open (as far as this CPU saw).
    pub owner: u64,
    /// The innermost open call's number (`Pending::nest_id`; 0: none).
    pub top: u64,
    /// Calls entered on this CPU: the last number given.
    pub seq: u64,
}

/// `Nest::owner`: no traced call open on the CPU (a fresh map value reads as this).
pub const NEST_NONE: u64 = 0;
/// `Nest::owner`: the innermost open call runs in an interrupt context.
pub const NEST_IRQ: u64 = 1;

/// Settings userspace patches into the programs' read-only globals before load (before
/// [`KernelLayout`] in `.rodata`; the fields the tracepoint path reads are at its end, next
/// to the layout's hot fields).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Config {
    /// Possible CPUs: the bound of the cross-CPU search for a migrated call.
    pub cpus: u32,
    /// Non-zero on preemptible kernels. There, another task can hold an entry program's
    /// recursion guard while preempted, so task-context calls that left the CPU are deferred
    /// (see [`Deferred`]); and fentry programs can interleave on one CPU, so they update
    /// counters atomically.
    pub preemptible: u32,
    /// Non-zero where kprobe task calls that left the CPU are deferred: on preemptible kernels
    /// only. Not without the context split on other kernels (where `preemptible` is set for
    /// the fentry programs, which then interleave): a kprobe program never interleaves, and on
    /// a kernel that does not preempt no task holds `bpf_prog_active` while off the CPU, so no
    /// kprobe entry of another task is skipped meanwhile.
    pub kprobe_defers: u32,
    /// Probe slots in use: the stride of the per-CPU regions of the shared arrays.
    pub probes: u32,
    /// Non-zero when memcg-trace created the workload's cgroup and removes it only after the
    /// programs are detached (see `CpuState::workload_cgrp`).
    pub workload_owned: u32,
    /// The depth of the workload's cgroup v2 below the root (0: unknown): a task of a cgroup
    /// the workload made below its own (and moved into) is the workload's too, as its CPU
    /// time is in the workload's `cpu.stat`. Not followed by the legacy object.
    pub workload_level: u32,
    /// cgroup v2 id of the workload's cgroup (0: no workload). Task-context calls by its tasks
    /// are timed, and their exits counted, in the workload cells.
    pub workload_cgroup: u64,
    /// Non-zero when the tracepoint programs count their hits in the CPU's state
    /// (`CpuState::tp_hits`) instead of the shared cells: the state is at hand (no lookup
    /// of its own). Only on kernels without kprobes, as when userspace could read the states
    /// only through the map syscalls, which make kprobe programs on that CPU miss their runs;
    /// since the states are mapped, it could be on everywhere (not measured yet).
    pub tp_percpu: u32,
    /// Non-zero with `--callers`: the entry programs read the call site and the exit programs
    /// count each timed call under it in `CALLERS`.
    pub callers: u32,
    /// Non-zero with `--by-memcg`: the entry programs read the memcg each call charges (see
    /// [`MemcgPath`]) and the exit programs count the call under it in `MEMCGS`.
    pub by_memcg: u32,
    /// Non-zero when the workload is the memcg a call charges (its id or a descendant's in
    /// `WORKLOAD_MEMCGS`), in every context, instead of the cgroup of the task making it; then
    /// the workload cells have one per context (see [`workload_cell`]).
    pub workload_memcg: u32,
    /// With `--callers-depth`: frames of a call's short stack kept, its call site included
    /// (the frames shown and two more, at most `STACK_DEPTH`; 0: no stacks).
    pub stack_depth: u32,
    /// One entry in this many on a CPU captures its short stack (`--callers-sample`).
    pub stack_sample: u32,
    /// The shard of `CALLERS` and `MEMCGS` a CPU counts in is its number masked by this (the
    /// shards in use less one: see [`BREAKDOWN_SHARDS`]).
    pub shard_mask: u32,
    /// Unused: keeps the struct free of implicit padding (it is copied into the object as
    /// bytes).
    pub spare: u32,
}

/// Call sites kept per run in the `CALLERS` map (all probes and contexts together): the map has
/// this many entries per shard in use (see [`BREAKDOWN_SHARDS`]), shared, so that this many
/// sites always fit in every shard. Once it is full (more sites than that), a call whose site
/// finds no entry in its CPU's shard is counted in `Counters::callers_other`: a site's row
/// may then miss the calls of a shard.
pub const MAX_CALLERS: u32 = 1024;

/// Shards of the breakdown maps (`CALLERS`, `MEMCGS`), at most: each call is counted under its
/// key in the shard of its CPU (the CPU number masked by `Config::shard_mask`), which userspace
/// adds up. CPUs of different shards then update different entries: a call site or memcg that
/// every CPU calls or charges does not move one cache line from CPU to CPU at every call (on a
/// 2-CPU host, `--by-memcg` on the tracepoint cost 162 ns a call with one shard, 97 ns with
/// two). A power of two. The maps have `MAX_CALLERS` (`MAX_MEMCGS`) entries per shard: 2 MiB
/// of kernel memory each, 16 MiB at 8 shards, preallocated, for `--callers` and `--by-memcg`
/// only; userspace reads up to that many more entries a tick. Their front slots
/// ([`FrontSlot`], 2 KiB each) add `front_entries(probes, shards)` each: 130 KiB a probe at 2
/// shards, 518 KiB a probe at 8 (1.5 MiB with the three default probes).
pub const BREAKDOWN_SHARDS: u32 = 8;

/// The shards of the breakdown maps in use with `cpus` possible CPUs: one per CPU up to
/// [`BREAKDOWN_SHARDS`] (a power of two).
pub const fn breakdown_shards(cpus: u32) -> u32 {
    let mut n = 1;
    while n < cpus && n < BREAKDOWN_SHARDS {
        n *= 2;
    }
    n
}

/// Slots in front of a breakdown map per (probe, context, shard), as a power of two: see
/// [`FrontSlot`].
pub const FRONT_SLOT_BITS: u32 = 3;
/// See [`FRONT_SLOT_BITS`].
pub const FRONT_SLOTS: u32 = 1 << FRONT_SLOT_BITS;

/// A slot in front of a breakdown map (`CALLER_FRONT` before `CALLERS`, `MEMCG_FRONT` before
/// `MEMCGS`): an array of [`FRONT_SLOTS`] per (probe, context, shard) (`front_index`), each
/// claimed by the first id (call site, memcg) counted there that hashes to it, by
/// compare-and-swap of its tag. A call whose id owns its slot is counted in it: an inlined
/// array access instead of the hash map's lookup (its hash of the key and bucket walk: about
/// a quarter of what `--by-memcg` added to a tracepoint call, measured on a 2-CPU host); a
/// call whose slot another id holds is counted in the map, as before. Userspace adds the slots
/// and the map's entries of an id up, as it adds the shards. Mappable (`BPF_F_MMAPABLE`): read
/// without a syscall. The legacy object (no compare-and-swap) leaves the slots empty.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrontSlot {
    /// The id that holds the slot, plus one (0: free).
    pub tag: u64,
    /// Its calls.
    pub stat: CallerStat,
}

/// The slot of `FrontSlot` arrays that id `id` of probe slot `probe` in context `ctx` may
/// claim in shard `shard` of `shards`: the (probe, context, shard) region's slot picked by the
/// id's multiplicative hash (call sites are addresses, memcg ids small numbers: both spread).
#[inline(always)]
pub const fn front_index(probe: u32, ctx: u32, shard: u32, shards: u32, id: u64) -> u32 {
    let region = (probe * NUM_CTX as u32 + ctx) * shards + shard;
    let slot = (id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - FRONT_SLOT_BITS)) as u32;
    region * FRONT_SLOTS + slot
}

/// The (probe, context) of slot `index` of a `FrontSlot` array with `shards` shards (the
/// inverse of [`front_index`]'s region).
pub const fn front_region(index: u32, shards: u32) -> (u32, u32) {
    let pc = index / FRONT_SLOTS / shards;
    (pc / NUM_CTX as u32, pc % NUM_CTX as u32)
}

/// Entries of a `FrontSlot` array for `probes` probe slots and `shards` shards.
pub const fn front_entries(probes: u32, shards: u32) -> u32 {
    probes * NUM_CTX as u32 * shards * FRONT_SLOTS
}

/// Linear sub-buckets per power of two of a call site's histogram, as a power of two: coarser
/// than a probe's (a quarter octave, 19% wide at most), so that a thousand sites fit in 2 MiB
/// (a shard's).
pub const CALLER_SUB_BITS: u32 = 2;
/// Buckets of a call site's histogram: every u64 fits (`caller_bucket_index`).
pub const CALLER_BUCKETS: usize = 256;
const _: () = assert!(
    (1 << CALLER_SUB_BITS) + (64 - CALLER_SUB_BITS as usize) * (1 << CALLER_SUB_BITS)
        <= CALLER_BUCKETS
);

/// The bucket of a call site's histogram that counts `ns`: below [`SHORT_NS`] one load from a
/// table (as [`bucket_index`]), else computed ([`caller_bucket_by_log`]).
#[inline(always)]
pub const fn caller_bucket_index(ns: u64) -> usize {
    if ns < SHORT_NS {
        return SHORT_CALLER_BUCKETS[ns as usize] as usize;
    }
    caller_bucket_by_log(ns)
}

/// The call-site bucket of each latency below [`SHORT_NS`], as [`caller_bucket_by_log`]
/// computes it.
pub const SHORT_CALLER_BUCKETS: [u8; SHORT_NS as usize] = short_table(true);

/// The call-site bucket of `ns`, computed from its highest bit (see [`caller_bucket_index`]).
#[inline(always)]
pub const fn caller_bucket_by_log(ns: u64) -> usize {
    let sub = 1u64 << CALLER_SUB_BITS;
    if ns < sub {
        return ns as usize;
    }
    let p = ilog2(ns);
    let s = (ns >> (p - CALLER_SUB_BITS)) & (sub - 1);
    (sub + (p - CALLER_SUB_BITS) as u64 * sub + s) as usize
}

/// The half-open range `[lo, hi)` of nanoseconds counted in a call site's bucket `i` (the last
/// one ends at `u64::MAX`).
pub const fn caller_bucket_bounds(i: usize) -> (u64, u64) {
    let sub = 1u64 << CALLER_SUB_BITS;
    let bucket = i as u64;
    if bucket < sub {
        return (bucket, bucket + 1);
    }
    let pow = (bucket - sub) / sub + CALLER_SUB_BITS as u64;
    if pow >= 64 {
        return (u64::MAX, u64::MAX);
    }
    let s = (bucket - sub) % sub;
    let width = 1u64 << (pow - CALLER_SUB_BITS as u64);
    let lo = (1u64 << pow) + s * width;
    (lo, lo.saturating_add(width))
}

/// Frames of a short stack the programs keep at most, the call site included: the deepest
/// shown (`--callers-depth`, 4) and two more, for the frames of the tracer's own trampolines
/// that userspace leaves out (a traced caller's fentry trampoline, and the return address of
/// its patched first instruction).
pub const STACK_DEPTH: usize = 6;

/// Frames of a short stack shown at most, the call site included.
pub const STACK_SHOWN: u32 = 4;

/// Frames the programs unwind to find the call site in, and the frames above it.
pub const STACK_UNWIND: usize = 16;

/// A short stack's second frame when the call site was not among the frames unwound (the
/// stack is unknown above the site).
pub const STACK_UNWOUND: u64 = 1;

/// Short stacks kept per run in the `STACKS` map; those beyond are counted in no row (the
/// stacks are a sample: their calls add up to the sampled entries that found room).
pub const MAX_STACKS: u32 = 4096;

/// A short stack of one probe in one context: the key of `STACKS`, whose value counts the
/// sampled entries that had it.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq, Hash)]
pub struct StackKey {
    /// Return addresses, innermost first: the call site (`CallerKey::caller`), then its
    /// caller's return address, and so on; 0 past the depth asked for or the stack's end;
    /// [`STACK_UNWOUND`] second when the site was not found in the unwound stack.
    pub frames: [u64; STACK_DEPTH],
    /// Probe slot.
    pub probe: u32,
    /// Context (`CTX_*`).
    pub ctx: u32,
}

/// A call site of one probe in one context: the key of `CALLERS`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq, Hash)]
pub struct CallerKey {
    /// The return address into the calling function (0: could not be read).
    pub caller: u64,
    /// Probe slot.
    pub probe: u32,
    /// Context (`CTX_*`).
    pub ctx: u16,
    /// The shard of the CPU that counted the calls (see [`BREAKDOWN_SHARDS`]).
    pub shard: u16,
}

/// Memcgs kept per run in the `MEMCGS` map (all probes and contexts together), as
/// [`MAX_CALLERS`] for call sites: the calls that find no entry in their CPU's shard are counted
/// in `Counters::memcgs_other`.
pub const MAX_MEMCGS: u32 = 1024;

/// Memcgs whose verdict the workload's set holds (`WORKLOAD_MEMCGS`: in the workload or not).
pub const MAX_WORKLOAD_MEMCGS: u32 = 4096;

/// A `WORKLOAD_MEMCGS` value: the memcg is the workload's or below it.
pub const MEMCG_IN_WORKLOAD: u8 = 1;

/// A `WORKLOAD_MEMCGS` value: the memcg is not below the workload's (found by the programs).
pub const MEMCG_OUTSIDE: u8 = 2;

/// Parents the programs climb from a memcg the workload set does not know yet before giving
/// up (deeper trees: the call is not counted as the workload's, and no verdict is kept, so
/// each call charging such a memcg climbs again).
pub const MEMCG_CLIMB: usize = 16;

/// Pointer hops of a [`MemcgPath`] at most.
pub const MEMCG_HOPS: usize = 4;

/// How a probe's programs find the memcg a call charges, from the function's (or tracepoint's)
/// first argument, a pointer: `hops` times, add `off[i]` and load the pointer there; then the
/// u64 at `id_off` is the id (a `kernfs_node`'s, what `stat` gives as the cgroup directory's
/// inode number, on cgroup v1 and v2). Offsets from the running kernel's BTF: e.g. a
/// `struct mem_cgroup *` takes `css.cgroup`, then `cgroup.kn`, then `kernfs_node.id`. An
/// entry of `MEMCG_PATH` by probe slot, written when the probe is attached; `hops == 0`: the
/// probe's argument is not known to lead to a memcg.
///
/// A cgroup or css argument is a memcg's only if it belongs to the memory controller (rstat is
/// shared by every controller: the cpu and io statistics update it too, for cgroups of other
/// hierarchies on cgroup v1): the check reads, from the argument, `check_hops` pointers (at
/// `check_off`), then the u32 at `check_field`, and wants `v & check_mask == check_want`. A
/// call whose argument fails it is counted under [`NOT_A_MEMCG`].
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct MemcgPath {
    /// Pointer loads (1..=`MEMCG_HOPS`; 0: no path).
    pub hops: u32,
    /// Offset of the id in the last struct reached (a `kernfs_node`).
    pub id_off: u32,
    /// Offset added before each load (negative: a `container_of`).
    pub off: [i32; MEMCG_HOPS],
    /// Pointer loads of the check (0: no check; at most 2).
    pub check_hops: u32,
    /// Offset of the u32 the check reads in the last struct reached.
    pub check_field: u32,
    /// The bits of it the check looks at.
    pub check_mask: u32,
    /// What they must be.
    pub check_want: u32,
    /// Offset added before each load of the check.
    pub check_off: [i32; 2],
    /// Offset of the parent pointer in the last struct reached (`kernfs_node.parent`, or
    /// `__parent` from 6.15): the way up from a memcg the workload set does not know yet (see
    /// `WORKLOAD_MEMCGS`).
    pub parent_off: u32,
    /// Padding (the struct is shared with the programs as it is).
    pub _pad: u32,
}

/// The "memcg" of a call whose cgroup argument belongs to another controller (see
/// [`MemcgPath`]): an id no cgroup has (a kernfs id's low 32 bits, its inode number, start at 1),
/// and one a JSON reader takes exactly.
pub const NOT_A_MEMCG: u64 = 1 << 32;

/// A charged memcg of one probe in one context: the key of `MEMCGS`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq, Hash)]
pub struct MemcgKey {
    /// The memcg's id ([`MemcgPath`]; 0: could not be read).
    pub memcg: u64,
    /// Probe slot.
    pub probe: u32,
    /// Context (`CTX_*`).
    pub ctx: u16,
    /// The shard of the CPU that counted the calls (see [`BREAKDOWN_SHARDS`]).
    pub shard: u16,
}

/// The timed calls of one call site (the value of `CALLERS`), or of one memcg (of `MEMCGS`), in
/// one shard. Updated atomically (beyond `BREAKDOWN_SHARDS` CPUs a shard is shared, and fentry
/// programs interleave on preemptible kernels).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerStat {
    /// Calls.
    pub count: u64,
    /// Sum of their latencies, ns.
    pub sum_ns: u64,
    /// Calls per bucket (`caller_bucket_index`).
    pub buckets: [u64; CALLER_BUCKETS],
}

impl Default for CallerStat {
    fn default() -> Self {
        CallerStat {
            count: 0,
            sum_ns: 0,
            buckets: [0; CALLER_BUCKETS],
        }
    }
}

/// Entries per CPU of the shared (mmap-able) arrays: one per (probe, context).
#[inline(always)]
pub const fn cells_per_cpu(probes: u32) -> u32 {
    probes * NUM_CTX as u32
}

/// The index of (cpu, probe, context) in the shared array of cells ([`names::MAP_CELLS`]),
/// which holds one region of [`cells_per_cpu`] entries per CPU; each CPU writes only its own.
#[inline(always)]
pub const fn cell(cpu: u32, probes: u32, probe: u32, ctx: u32) -> u32 {
    cpu * cells_per_cpu(probes) + probe * NUM_CTX as u32 + ctx
}

/// Contexts per (cpu, probe) of the workload cells: every context when the workload
/// is the charged memcg (`Config::workload_memcg`), else the task context only.
#[inline(always)]
pub const fn workload_contexts(workload_memcg: bool) -> u32 {
    if workload_memcg {
        NUM_CTX as u32
    } else {
        1
    }
}

/// The index of (cpu, probe, context) in the workload cells, which holds
/// [`workload_contexts`] cells per (cpu, probe) (`ctx` must be `CTX_TASK` when that is 1).
#[inline(always)]
pub const fn workload_cell(cpu: u32, probes: u32, probe: u32, ctx: u32, contexts: u32) -> u32 {
    (cpu * probes + probe) * contexts
        + if contexts > 1 {
            ctx & (NUM_CTX as u32 - 1)
        } else {
            0
        }
}

/// What the programs keep of one (probe, context) on one CPU: its counters and its histogram,
/// in one element, so that an exit finds both with one lookup. A workload's call is timed, and
/// its exit counted, in its workload cell (see [`workload_cell`]); its entry is counted in its
/// context's cell, which the entry program finds before it tells the call apart. Userspace
/// adds the two, so every total in [`Counters`] stays whole.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Cell {
    pub counters: Counters,
    pub hist: Hist,
    /// To a whole number of cache lines (one CPU's cells share none with another's).
    pub pad: [u64; 7],
}
const _: () = assert!(core::mem::size_of::<Cell>().is_multiple_of(64));

/// Operations of the pairing self-test program, run through BPF_PROG_TEST_RUN with the inputs a
/// real program would read from the kernel (`args[1..]`: probe, key, ctx, task, switches, now,
/// flags, entry-program misses on this CPU, whether those are known).
pub mod test_op {
    /// Record an entry.
    pub const ENTRY: u64 = 1;
    /// An exit as the fexit program handles it (interrupt-context pairs deferred).
    pub const EXIT_FENTRY: u64 = 2;
    /// An exit as the kretprobe program handles it.
    pub const EXIT_KPROBE: u64 = 3;
    /// Count `args[2]` ns in the histogram of (probe `args[1]`, task) with the real bucketing.
    pub const BUCKET: u64 = 4;
    /// Return the context the program runs in (`CTX_*`, or -1 when unreadable).
    pub const CONTEXT: u64 = 5;
    /// Clear the used marks of probe `args[1]`'s task slots on this CPU, as another CPU's
    /// exit does before it looks whether a slot it freed was taken again (`vacate`).
    pub const CLEAR_USED: u64 = 6;
}

/// Offsets and masks the eBPF programs need, read from the running kernel's BTF by userspace and
/// written into the programs' read-only globals before load (Rust eBPF has no CO-RE).
///
/// Field order is cost: the fields the tracepoint path reads on every run (even those of
/// branches the verifier dropped: the loads stay) come first, then those a workload's task
/// calls add, so that they span as few cache lines as they can (each line a run touches is a
/// miss the floor does not pay; measured in `cargo xtask bench`, see the README).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct KernelLayout {
    /// Non-zero when the programs read the preempt count directly: the loader has replaced
    /// every [`PERCPU_VAR_MARKER`] load with the BTF id of the per-CPU variable holding it
    /// (`bpf_this_cpu_ptr`, a plain load). Zero: through `bpf_probe_read_kernel`.
    pub direct_preempt: u32,
    /// Non-zero when the programs read kernel memory whose address they computed (the preempt
    /// count found by `cpu_state`) with a plain fault-safe load instead of a
    /// `bpf_probe_read_kernel` call: the loader has rewritten every call numbered
    /// [`RDONLY_CAST_MARKER`] into a call of the kfunc `bpf_rdonly_cast` (6.2+), which the
    /// verifier replaces by a register move, and the load through its result is a
    /// `BPF_PROBE_MEM` load. For kernels whose kallsyms has no data symbols, where the preempt
    /// count cannot be named (`direct_preempt` 0).
    pub direct_untrusted: u32,
    /// BTF id (in vmlinux) of the struct the address is cast to: `atomic_t`'s, whose `int
    /// counter` at offset 0 is read. The verifier needs it as a constant.
    pub cast_type_id: u32,
    /// BTF ids of the structs behind `atomic64_t` (an 8-byte `counter` at offset 0) and of
    /// `struct task_struct`, for reading the current task from its per-CPU pointer through
    /// casts (see `current_task`); 0 when absent.
    pub cast_u64_type_id: u32,
    /// See `cast_u64_type_id`.
    pub cast_task_type_id: u32,
    /// preempt_count masks, as `in_task()` uses them.
    pub nmi_mask: u32,
    /// HARDIRQ_MASK.
    pub hardirq_mask: u32,
    /// SOFTIRQ_OFFSET (serving a softirq, as opposed to bottom halves disabled).
    pub softirq_offset: u32,
    /// Non-zero when the programs read the task's switch counts directly through
    /// `bpf_get_current_task_btf` (a plain load) instead of `bpf_probe_read_kernel`.
    pub direct_task: u32,
    /// Non-zero when `task_cgroups`, `cset_dfl_cgrp`, `cgroup_kn` and `kn_id` were all found
    /// (and direct task reads are on).
    pub direct_cgroup: u32,
    /// The path from a task to its cgroup v2 id, for the workload test without a helper call:
    /// `offsetof(struct task_struct, cgroups)`,
    pub task_cgroups: u64,
    /// `offsetof(struct css_set, dfl_cgrp)`,
    pub cset_dfl_cgrp: u64,
    /// Non-zero once userspace filled this in.
    pub valid: u32,
    /// Non-zero when `sum_exec_runtime` directly follows `exec_start` (one read fetches both).
    pub clock_adjacent: u32,
    /// Non-zero when `nivcsw` directly follows `nvcsw` (one read fetches both).
    pub switches_adjacent: u32,
    /// Non-zero when the scheduler's task clock (`rq->clock_task`, in which `exec_start` and
    /// `sum_exec_runtime` are kept) reads the same on every CPU: the kernel subtracts neither
    /// interrupt nor steal time from it (no `rq.prev_irq_time`, no `rq.prev_steal_time_rq`).
    /// Otherwise a migrated call's time off the CPU is not known.
    pub cross_cpu_clock: u32,
    /// BTF id (in vmlinux) of the per-CPU variable holding the preempt count; 0 when BTF has
    /// none. For the loader; the programs do not read it.
    pub preempt_var_id: u32,
    /// BTF id (in vmlinux) of `bpf_rdonly_cast`; 0 when the kernel has none. For the loader.
    pub cast_kfunc_id: u32,
    /// Per-CPU offset of the pointer to the running task (x86's `current_task`, or
    /// `pcpu_hot.current_task` on 6.2-6.14); 0 when BTF has none. With `direct_untrusted`,
    /// the programs read the current task from there instead of calling a helper.
    pub current_task: u64,
    /// Per-CPU offset of the preempt count (`__preempt_count`, or `pcpu_hot.preempt_count` on
    /// 6.2-6.14).
    pub preempt_count: u64,
    /// Per-CPU offset of `runqueues`.
    pub runqueues: u64,
    /// `offsetof(struct task_struct, se) + offsetof(struct sched_entity, cfs_rq)`.
    pub task_se_cfs_rq: u64,
    /// `offsetof(struct cfs_rq, rq)`.
    pub cfs_rq_rq: u64,
    /// `offsetof(struct rq, cpu)`.
    pub rq_cpu: u64,
    /// `offsetof(struct task_struct, nvcsw)`; `nivcsw` follows it.
    pub task_nvcsw: u64,
    /// `offsetof(struct task_struct, nivcsw)`.
    pub task_nivcsw: u64,
    /// `offsetof(struct task_struct, se) + offsetof(struct sched_entity, exec_start)`.
    pub task_exec_start: u64,
    /// `offsetof(struct task_struct, se) + offsetof(struct sched_entity, sum_exec_runtime)`.
    pub task_sum_exec: u64,
    /// `offsetof(struct task_struct, se) + offsetof(struct sched_entity, nr_migrations)`: how
    /// often the task moved to another CPU (see `Pending::migrations`).
    pub task_migrations: u64,
    /// Per-CPU offset of x86's `this_cpu_off` (the CPU's `__per_cpu_offset`); 0 when absent.
    /// Dynamically allocated per-CPU data (a program's stats) is at its pointer plus that; the
    /// base the programs find from `runqueues` also holds `__per_cpu_start`, which is not zero
    /// since the percpu section moved (6.15+).
    pub this_cpu_off: u64,
    /// `offsetof(struct bpf_prog, aux)`.
    pub prog_aux: u64,
    /// `offsetof(struct bpf_prog, stats)`.
    pub prog_stats: u64,
    /// `offsetof(struct bpf_prog_aux, id)`.
    pub prog_aux_id: u64,
    /// `offsetof(struct bpf_prog_stats, misses)`.
    pub stats_misses: u64,
    /// Offset of the preempt count inside that variable (`pcpu_hot.preempt_count` on
    /// 6.2-6.14, 0 for `__preempt_count`).
    pub preempt_member: u64,
    /// `offsetof(struct cgroup, kn)`,
    pub cgroup_kn: u64,
    /// `offsetof(struct kernfs_node, id)`; all four non-zero (or `direct_cgroup` is 0).
    pub kn_id: u64,
    /// Non-zero when the per-CPU offsets above came from /proc/kallsyms, because the kernel's
    /// BTF has no per-CPU section (5.10's). For the record; the programs do not read it.
    pub percpu_from_kallsyms: u64,
    /// Non-zero when no source gave the per-CPU offsets (BTF's per-CPU section, kallsyms,
    /// whose addresses `kptr_restrict` can hide): the preempt count cannot be read. The
    /// offsets are then 0 and the masks 0, so the programs count every call in context 0
    /// (which userspace names `all`: no context split), and read no per-CPU counter.
    pub no_context: u64,
    /// The kernel's architecture ([`ARCH_X86_64`], [`ARCH_ARM64`]): where the preempt count
    /// lives (x86: a per-CPU variable; arm64: the task's `thread_info`, `preempt_count` then
    /// being its offset in `task_struct`) and the layout of a kprobe's registers. The programs
    /// branch on it; the verifier, which knows the read-only layout, keeps one side only.
    pub arch: u64,
    /// arm64: the address of `__per_cpu_start` (kallsyms; 0 when hidden). There per-CPU
    /// symbols are not zero-based as on x86_64: a CPU's `__per_cpu_offset` is its per-CPU
    /// area less this, and a `__percpu` pointer (a program's `stats`) is reached by adding that
    /// offset. 0: the programs do not read another per-CPU pointer (their fentry miss counters
    /// are then read by userspace per tick instead).
    pub percpu_start: u64,
    /// PREEMPT_RT: `offsetof(struct task_struct, softirq_disable_cnt)`. There softirqs run in
    /// tasks and the kernel keeps the softirq count in the task, not in preempt_count
    /// (`softirq_count()` is `current->softirq_disable_cnt & SOFTIRQ_MASK`): the context split
    /// takes that byte from the task ([`rt_context_count`]). 0 on every other kernel.
    pub task_softirq: u64,
    /// `offsetof(struct task_struct, comm)` where threads do interrupt work (PREEMPT_RT, or
    /// `threadirqs` on the command line): the programs then count task-context calls of
    /// interrupt and softirq threads apart ([`thread_kind_of`]). 0 elsewhere.
    pub task_comm: u64,
    /// Offset of the per-CPU `bpf_prog_active` in the per-CPU area (like `runqueues`): the
    /// count the kernel holds while a kprobe or perf program runs and through the map system
    /// calls (`bpf_disable_instrumentation`), and while it is held no kprobe program runs on
    /// that CPU. Read by the switch witness ([`HeldSwitches`]); 0: unknown.
    pub prog_active: u64,
    /// `offsetof(struct cgroup, level)`: the cgroup's depth (the root's is 0). With the two
    /// below, for the legacy object's test of a task below the workload's cgroup, which its
    /// kernels give no helper for.
    pub cgroup_level: u64,
    /// `offsetof(struct cgroup, ancestor_ids)` (before 6.0) or `offsetof(struct cgroup,
    /// ancestors)`: a cgroup's ancestors by depth; 0 when BTF has neither.
    pub cgroup_ancestors: u64,
    /// Non-zero when `cgroup_ancestors` holds ids (`ancestor_ids[]`), 0 when it holds pointers
    /// to the cgroups (`ancestors[]`).
    pub ancestors_are_ids: u64,
    /// Non-zero when the words the programs chase through kernel memory (the charged memcg's
    /// argument and the pointers from it; a call site's frame words and the code before it)
    /// are read by plain fault-safe loads through `bpf_rdonly_cast` (the loader patched the
    /// casts, and `cast_u64_type_id` names `atomic64_t`'s struct), also where the preempt
    /// count is read through its named per-CPU variable and nothing else is cast. Zero:
    /// through `bpf_probe_read_kernel`. Set by the loader.
    pub direct_reads: u64,
    /// `nmi_mask | hardirq_mask | softirq_offset`: a count with none of these bits set is task
    /// context, told with one load and test (the usual case). Set with the masks
    /// ([`KernelLayout::set_context_masks`]); the loader refuses a layout where it differs.
    pub interrupt_masks: u64,
}

impl KernelLayout {
    /// Sets the context split's masks (see [`classify`]) and `interrupt_masks` with them.
    pub fn set_context_masks(&mut self, nmi_mask: u32, hardirq_mask: u32, softirq_offset: u32) {
        self.nmi_mask = nmi_mask;
        self.hardirq_mask = hardirq_mask;
        self.softirq_offset = softirq_offset;
        self.interrupt_masks = (nmi_mask | hardirq_mask | softirq_offset) as u64;
    }

    /// Whether `interrupt_masks` is the masks' union (what the programs' fast path assumes).
    pub fn masks_agree(&self) -> bool {
        self.interrupt_masks == (self.nmi_mask | self.hardirq_mask | self.softirq_offset) as u64
    }
}

/// What the switch witness counts on one CPU, on a cache line of its own (the programs of one
/// CPU write only their own). A kprobe entry of a task call is skipped only while its CPU's
/// `bpf_prog_active` is held, and, as that call is in task context, by another task: one that
/// holds it while off the CPU (preempted or asleep inside a map system call, on a preemptible
/// kernel). That task was switched out of the CPU holding it, and must be switched back in
/// before it lets go; the call, whose exit ran, either ended on that CPU after then or left
/// it before. Either way a switch on that CPU found the count held while the call was in
/// flight: this is what makes a deferred kprobe pair provable on kernels that count no kprobe
/// program misses (before 6.7).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct HeldSwitches {
    /// Context switches on this CPU that found `bpf_prog_active` held, or could not read it.
    pub held: u64,
    /// Context switches seen on this CPU.
    pub seen: u64,
    /// Padding to a cache line.
    pub pad: [u64; 6],
}

/// A task that is none of the threads below.
pub const THREAD_OTHER: u32 = 0;
/// A threaded interrupt handler (`irq/N-name`).
pub const THREAD_IRQ: u32 = 1;
/// A softirq thread (`ksoftirqd/N`, `ktimers/N`).
pub const THREAD_SOFTIRQ: u32 = 2;

/// The kind of a kernel thread from the first four bytes of its `comm` (little-endian, as
/// both architectures load them).
#[inline(always)]
pub const fn thread_kind_of(comm4: u32) -> u32 {
    const IRQ: u32 = u32::from_le_bytes(*b"irq/");
    const KSOFTIRQD: u32 = u32::from_le_bytes(*b"ksof");
    const KTIMERS: u32 = u32::from_le_bytes(*b"ktim");
    match comm4 {
        IRQ => THREAD_IRQ,
        KSOFTIRQD | KTIMERS => THREAD_SOFTIRQ,
        _ => THREAD_OTHER,
    }
}

/// [`KernelLayout::arch`]: x86_64.
pub const ARCH_X86_64: u64 = 0;
/// [`KernelLayout::arch`]: arm64 (aarch64).
pub const ARCH_ARM64: u64 = 1;

/// The 64-bit immediate the programs load where they need the address of the per-CPU variable
/// holding the preempt count. Rust eBPF cannot name a kernel symbol (`__ksym`), so the loader
/// rewrites each such `ld_imm64` into a `BPF_PSEUDO_BTF_ID` load of that variable; when it
/// cannot, `KernelLayout::direct_preempt` stays 0 and the verifier drops the code using it.
pub const PERCPU_VAR_MARKER: u64 = 0x6d65_6d63_6770_6301;

/// The helper number of the `call` instructions the loader rewrites into calls of the kfunc
/// `bpf_rdonly_cast` (`BPF_PSEUDO_KFUNC_CALL` of its BTF id): Rust eBPF cannot declare a kfunc.
/// No helper has this number, so an unrewritten call never loads; the programs reach these
/// calls only when `KernelLayout::direct_untrusted` is set, and the verifier, which knows the
/// read-only layout, drops them otherwise.
pub const RDONLY_CAST_MARKER: i32 = 0x6d63_7401;

/// The fields the patched (and lean) programs load at offsets the loader writes into the loads themselves
/// ([`LeanField::marker`]): the task's switch counts, migrations and off-CPU clock, and the
/// path to its cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LeanField {
    /// [`KernelLayout::task_nvcsw`].
    Nvcsw,
    /// [`KernelLayout::task_nivcsw`].
    Nivcsw,
    /// [`KernelLayout::task_migrations`].
    Migrations,
    /// [`KernelLayout::task_exec_start`].
    ExecStart,
    /// [`KernelLayout::task_sum_exec`].
    SumExec,
    /// [`KernelLayout::task_cgroups`].
    Cgroups,
    /// [`KernelLayout::cset_dfl_cgrp`].
    DflCgrp,
}

// The markers follow `ALL`'s order (`patch::lean_fields` indexes the offsets by them).
const _: () = {
    let mut i = 0;
    while i < LeanField::ALL.len() {
        assert!(LeanField::ALL[i] as usize == i);
        i += 1;
    }
};

impl LeanField {
    /// Every field, in marker order.
    pub const ALL: [LeanField; 7] = [
        LeanField::Nvcsw,
        LeanField::Nivcsw,
        LeanField::Migrations,
        LeanField::ExecStart,
        LeanField::SumExec,
        LeanField::Cgroups,
        LeanField::DflCgrp,
    ];

    /// The 16-bit offset the patched programs' load of this field carries until the loader
    /// rewrites it: negative and far below any stack slot, so that no other load has it, and
    /// so that an unrewritten load never passes the verifier.
    pub const fn marker(self) -> i16 {
        LEAN_FIELD_MARKER_BASE + self as i16
    }

    /// The field's offset in `layout`.
    pub fn offset(self, layout: &KernelLayout) -> u64 {
        match self {
            LeanField::Nvcsw => layout.task_nvcsw,
            LeanField::Nivcsw => layout.task_nivcsw,
            LeanField::Migrations => layout.task_migrations,
            LeanField::ExecStart => layout.task_exec_start,
            LeanField::SumExec => layout.task_sum_exec,
            LeanField::Cgroups => layout.task_cgroups,
            LeanField::DflCgrp => layout.cset_dfl_cgrp,
        }
    }
}

/// [`LeanField::marker`] of the first field.
pub const LEAN_FIELD_MARKER_BASE: i16 = -0x7f00;

/// The preempt_count masks of every kernel so far (include/linux/preempt.h, non-RT).
pub const PREEMPT_MASKS: (u32, u32, u32) = (0x00f0_0000, 0x000f_0000, 0x0000_0100);

/// SOFTIRQ_MASK: the softirq count's byte, in preempt_count and, on PREEMPT_RT, in the task's
/// `softirq_disable_cnt` (the same layout: SOFTIRQ_OFFSET serving, SOFTIRQ_DISABLE_OFFSET
/// per bottom-half disable).
pub const SOFTIRQ_MASK: u32 = 0x0000_ff00;

/// The count the context split reads on PREEMPT_RT: preempt_count (`pc`: its hardirq and NMI
/// fields) with its softirq byte taken from the task's `softirq_disable_cnt` (`task_cnt`), as
/// the kernel's `in_serving_softirq()` reads it there.
#[inline(always)]
pub const fn rt_context_count(pc: u32, task_cnt: u32) -> u32 {
    (pc & !SOFTIRQ_MASK) | (task_cnt & SOFTIRQ_MASK)
}

/// Classify a preempt_count value the way `in_task()` / `in_serving_softirq()` do.
#[inline(always)]
pub const fn classify(pc: u32, nmi_mask: u32, hardirq_mask: u32, softirq_offset: u32) -> u32 {
    if pc & nmi_mask != 0 {
        CTX_NMI
    } else if pc & hardirq_mask != 0 {
        CTX_HARDIRQ
    } else if pc & softirq_offset != 0 {
        CTX_SOFTIRQ
    } else {
        CTX_TASK
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] integer structs without implicit padding.
    unsafe impl aya::Pod for super::Hist {}
    unsafe impl aya::Pod for super::Counters {}
    unsafe impl aya::Pod for super::Pending {}
    unsafe impl aya::Pod for super::PendingSet {}
    unsafe impl aya::Pod for super::Deferred {}
    unsafe impl aya::Pod for super::CpuState {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::KernelLayout {}
    unsafe impl aya::Pod for super::CallerKey {}
    unsafe impl aya::Pod for super::CallerStat {}
    unsafe impl aya::Pod for super::FrontSlot {}
    unsafe impl aya::Pod for super::MemcgKey {}
    unsafe impl aya::Pod for super::StackKey {}
    unsafe impl aya::Pod for super::MemcgPath {}
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn front_slots_cover_their_region_and_lead_back_to_it() {
        let shards = 4;
        let entries = super::front_entries(3, shards);
        // Ids of both kinds, each on its own: memcg ids (small numbers) and call sites (kernel
        // addresses, a few bytes apart).
        let memcgs = |i: u64| 1 + i;
        let sites = |i: u64| 0xffff_ffff_8100_0000 + 7 * i;
        for kind in [&memcgs as &dyn Fn(u64) -> u64, &sites] {
            let mut used = [false; 3 * NUM_CTX * 4 * super::FRONT_SLOTS as usize];
            assert_eq!(used.len() as u32, entries);
            for probe in 0..3 {
                for ctx in 0..NUM_CTX as u32 {
                    for shard in 0..shards {
                        for n in 0..64 {
                            let i = super::front_index(probe, ctx, shard, shards, kind(n));
                            assert!(i < entries, "{i} beyond {entries}");
                            assert_eq!(super::front_region(i, shards), (probe, ctx));
                            used[i as usize] = true;
                        }
                    }
                }
            }
            // Every slot of every region is reached: the hash spreads the ids.
            assert!(used.iter().all(|u| *u));
        }
    }

    #[test]
    fn breakdown_shards_are_one_per_cpu_up_to_the_most() {
        let got: [u32; 9] = [1, 2, 3, 4, 5, 8, 9, 64, 4096].map(super::breakdown_shards);
        assert_eq!(got, [1, 2, 4, 4, 8, 8, 8, 8, 8]);
        assert!(super::BREAKDOWN_SHARDS.is_power_of_two());
    }

    #[test]
    fn ilog2_is_the_position_of_the_highest_bit() {
        assert_eq!(ilog2(0), 0);
        for p in 0..64 {
            let v = 1u64 << p;
            assert_eq!(ilog2(v), p, "2^{p}");
            assert_eq!(ilog2(v | (v - 1)), p, "2^{p} with every lower bit");
            assert_eq!(ilog2(v | 1), p, "2^{p} + 1");
        }
        // And against the standard library over a spread of values.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = state >> (state % 64);
            if v != 0 {
                assert_eq!(ilog2(v), v.ilog2(), "{v:#x}");
            }
        }
    }

    /// Every value below 2^20 against the bounds of its bucket, computed from the index alone
    /// (`bounds`), not by the code under test: the short tables' range whole, and both ways of
    /// computing (`index`, `by_log`) around the tables' edges. The bucket of 2^20 - 1.
    fn every_short_value_in_its_bucket(
        bounds: fn(usize) -> (u64, u64),
        index: fn(u64) -> usize,
        by_log: fn(u64) -> usize,
    ) -> usize {
        let mut bucket = 0;
        for ns in 0..1u64 << 20 {
            while bounds(bucket).1 <= ns {
                bucket += 1;
            }
            let (lo, hi) = bounds(bucket);
            assert!(lo <= ns && ns < hi, "{ns}: bucket {bucket} is [{lo}, {hi})");
            assert_eq!(index(ns), bucket, "{ns}");
            assert_eq!(by_log(ns), bucket, "{ns}");
        }
        bucket
    }

    #[test]
    fn latency_buckets_hold_their_values_and_tile_the_range() {
        let start = every_short_value_in_its_bucket(bucket_bounds, bucket_index, bucket_by_log);
        // Above, each bucket's ends; the last holds everything from 2^MAX_POW on.
        for i in start..NUM_BUCKETS - 1 {
            let (lo, hi) = bucket_bounds(i);
            assert_eq!(
                (bucket_index(lo), bucket_index(hi - 1)),
                (i, i),
                "[{lo}, {hi})"
            );
            assert_eq!(bucket_bounds(i + 1).0, hi);
        }
        let last = bucket_bounds(NUM_BUCKETS - 1).0;
        assert_eq!(bucket_index(last - 1), NUM_BUCKETS - 2);
        assert_eq!(bucket_index(last), NUM_BUCKETS - 1);
        assert_eq!(bucket_index(1 << MAX_POW), NUM_BUCKETS - 1);
        assert_eq!(bucket_index(u64::MAX), NUM_BUCKETS - 1);
    }

    #[test]
    fn caller_buckets_hold_their_values_and_tile_the_range() {
        every_short_value_in_its_bucket(
            caller_bucket_bounds,
            caller_bucket_index,
            caller_bucket_by_log,
        );
        let mut prev_hi = 0;
        for i in 0..CALLER_BUCKETS {
            let (lo, hi) = caller_bucket_bounds(i);
            if lo == u64::MAX {
                break;
            }
            assert_eq!(
                lo,
                prev_hi,
                "bucket {i} starts where {} ended",
                i.wrapping_sub(1)
            );
            assert_eq!(caller_bucket_index(lo), i);
            assert_eq!(caller_bucket_index(hi - 1), i);
            // A quarter octave: never wider than a quarter of its lower bound (from 4 ns).
            assert!(lo < 4 || (hi - lo) * 4 <= lo, "bucket {i}: [{lo}, {hi})");
            prev_hi = hi;
        }
        assert_eq!(
            caller_bucket_bounds(caller_bucket_index(u64::MAX)).1,
            u64::MAX
        );
        assert!(caller_bucket_index(u64::MAX) < CALLER_BUCKETS);
    }
}
