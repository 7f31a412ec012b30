//! memcg-trace: a live eBPF tracer of the memory-cgroup charging hot paths.
//!
//! Data path: kernel function -> eBPF entry/exit pair (memcg-trace-ebpf) -> per-CPU histograms
//! keyed by (probe, context) -> [`tracer::Tracer::snapshot`] -> [`snapshot::Snapshot`] ->
//! outputs ([`report`] table, [`export`] JSON). The outputs never read BPF maps themselves.

pub mod bench;
pub mod cli;
pub mod export;
pub mod kernel;
pub mod probes;
pub mod record;
pub mod report;
pub mod snapshot;
pub mod tracer;
pub mod tui;
pub mod workload;
