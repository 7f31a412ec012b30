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

/// The index of a (probe, context) pair in the per-CPU histogram and counter arrays.
#[inline(always)]
pub const fn slot_index(probe: u32, ctx: u32) -> u32 {
    probe * NUM_CTX as u32 + ctx
}

/// Entries in the per-CPU histogram and counter arrays.
pub const NUM_SLOTS: u32 = (MAX_PROBES * NUM_CTX) as u32;

/// Entries in the per-CPU workload histogram array: one per probe, task context only (calls made
/// by a task of the workload's cgroup).
pub const WORKLOAD_SLOTS: u32 = MAX_PROBES as u32;

/// Floor of log2 for `v > 0`, written without loops or `leading_zeros` so that it compiles to a
/// few shifts the BPF verifier accepts on every kernel.
#[inline(always)]
pub const fn ilog2(mut v: u64) -> u32 {
    let mut r = 0;
    if v >= 1 << 32 {
        v >>= 32;
        r += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        r += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        r += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        r += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        r += 2;
    }
    if v >= 1 << 1 {
        r += 1;
    }
    r
}

/// The bucket a latency of `ns` nanoseconds is counted in.
#[inline(always)]
pub const fn bucket_index(ns: u64) -> usize {
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

    /// Context-check programs, indexed by the context they expect (task, softirq, hardirq).
    pub const CTX_CHECK: [&str; 3] = ["ctx_check_task", "ctx_check_softirq", "ctx_check_hardirq"];
    /// The BPF_PROG_TEST_RUN entry of `memcg-trace selftest`.
    pub const SELFTEST: &str = "selftest";

    /// Per-CPU histograms by (probe, context).
    pub const MAP_HIST: &str = "HIST";
    /// Per-CPU histograms of the workload's calls, by probe.
    pub const MAP_WORKLOAD_HIST: &str = "WORKLOAD_HIST";
    /// Per-CPU pairing state by (probe, context).
    pub const MAP_SLOTS: &str = "SLOTS";
    /// Context-check counts, see [`super::ctx_check_index`].
    pub const MAP_CTX_CHECK: &str = "CTX_CHECK";
    /// Raw preempt_count bits seen per expected context.
    pub const MAP_CTX_BITS: &str = "CTX_BITS";
    /// Read-only global: the kernel layout.
    pub const GLOBAL_LAYOUT: &str = "LAYOUT";
    /// Read-only global: the workload's cgroup v2 id.
    pub const GLOBAL_WORKLOAD_CGROUP: &str = "WORKLOAD_CGROUP";

    /// Every program the object must hold.
    pub fn all_programs() -> impl Iterator<Item = &'static str> {
        FENTRY
            .into_iter()
            .chain(FEXIT)
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
            .chain([SELFTEST])
    }
}

/// Context-check column for "context unreadable".
pub const CTX_UNKNOWN: u32 = NUM_CTX as u32;
/// Columns of the context-check grid: the four contexts and "unknown".
pub const CTX_CHECK_COLS: u32 = NUM_CTX as u32 + 1;
/// Rows of the context-check grid: task, softirq, hardirq.
pub const CTX_CHECK_ROWS: u32 = 3;

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
    /// Calls whose entry and exit were paired (for tracepoints: hits).
    pub count: u64,
    /// Sum of their durations, ns.
    pub sum_ns: u64,
    /// Longest duration, ns.
    pub max_ns: u64,
    /// Shortest duration, ns, stored bit-inverted so that an all-zero map entry means "none".
    pub min_ns_inv: u64,
    /// Calls counted per bucket; see [`bucket_index`].
    pub buckets: [u64; NUM_BUCKETS],
}

/// Pairing counters for a (probe, context) pair on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Counters {
    /// Entry program runs.
    pub entries: u64,
    /// Exit program runs.
    pub exits: u64,
    /// Exits with no matching entry on this CPU (the entry was overwritten or never recorded).
    pub unmatched: u64,
    /// Task-context calls during which the task was switched out (slept, was preempted or
    /// migrated): their duration includes time off the CPU and the entry may be on another CPU,
    /// so they are dropped, never attributed.
    pub switched: u64,
    /// Exits (or tracepoint hits) whose context could not be read (the per-CPU base could not
    /// be verified); counted in the task slot and dropped.
    pub no_context: u64,
}

/// An entry timestamp waiting for its exit, per CPU and (probe, context).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Start {
    /// `bpf_ktime_get_ns()` at entry; 0 when the slot is free.
    pub ts: u64,
    /// Task context only: the task's pid (thread id) at entry.
    pub tid: u64,
    /// Task context only: the task's `nvcsw + nivcsw` at entry. Unchanged at exit proves the task
    /// never left this CPU in between.
    pub switches: u64,
}

/// The pairing state of one (probe, context) slot on one CPU: the pending entry and the counters,
/// in one map value so each program run needs one lookup.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Slot {
    /// The entry waiting for its exit.
    pub start: Start,
    /// Pairing counters.
    pub counters: Counters,
}

/// Offsets and masks the eBPF programs need, read from the running kernel's BTF by userspace and
/// written into the programs' read-only globals before load (Rust eBPF has no CO-RE).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct KernelLayout {
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
    /// preempt_count masks, as `in_task()` uses them.
    pub nmi_mask: u32,
    /// HARDIRQ_MASK.
    pub hardirq_mask: u32,
    /// SOFTIRQ_OFFSET (serving a softirq, as opposed to bottom halves disabled).
    pub softirq_offset: u32,
    /// Non-zero once userspace filled this in.
    pub valid: u32,
    /// Non-zero when `nivcsw` directly follows `nvcsw` (one read fetches both).
    pub switches_adjacent: u32,
    /// Keeps the struct free of implicit padding.
    pub _pad: u32,
}

/// The preempt_count masks of every kernel so far (include/linux/preempt.h, non-RT).
pub const PREEMPT_MASKS: (u32, u32, u32) = (0x00f0_0000, 0x000f_0000, 0x0000_0100);

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
    // SAFETY: plain #[repr(C)] integer structs without padding.
    unsafe impl aya::Pod for super::Hist {}
    unsafe impl aya::Pod for super::Counters {}
    unsafe impl aya::Pod for super::Start {}
    unsafe impl aya::Pod for super::Slot {}
    unsafe impl aya::Pod for super::KernelLayout {}
}
