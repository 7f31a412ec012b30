//! The values the outputs read besides the snapshot, made by the tracer and the session:
//! plain data, importing nothing of either (the tracer re-exports them where it makes them).

use crate::probes::Backend;

/// The function the floor is measured on.
pub const FLOOR_FUNCTION: &str = "bpf_fentry_test1";

/// The instrumentation measured on this kernel for one backend: a pair of the tracer's
/// programs around `bpf_fentry_test1` (which returns its argument plus one), called from
/// BPF_PROG_TEST_RUN.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Floor {
    /// The backend measured.
    pub backend: Backend,
    /// Calls measured.
    pub calls: u64,
    /// Latency the pair records around a function that does almost nothing: the part of every
    /// sample that is the tracer's own (the rest of the entry program after its clock read,
    /// the trampoline or kprobe hops, the start of the exit program), ns.
    pub p50_ns: u64,
    /// 90th percentile of the same, ns.
    pub p90_ns: u64,
    /// Smallest, ns.
    pub min_ns: u64,
    /// Run time of the entry and exit programs per call, from bpf stats enabled for this
    /// measurement only, ns.
    pub programs_ns: Option<f64>,
    /// What one traced call costs in all (programs, trampoline or kprobe, clock reads): the
    /// time a call of the function takes with the pair attached minus without, ns. A call of a
    /// traced function that runs inside another traced call adds this to the outer sample.
    pub per_call_ns: Option<f64>,
}

/// A probe that could not be attached, and why.
#[derive(Debug, Clone)]
pub struct NotAttached {
    /// Display name.
    pub name: String,
    /// One line per candidate or backend tried.
    pub reasons: Vec<String>,
}
