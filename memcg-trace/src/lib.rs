//! memcg-trace: a live eBPF tracer of the memory-cgroup charging hot paths.
//!
//! The data path, one module a step:
//!
//! ```text
//! kernel function -> eBPF entry/exit pair (memcg-trace-ebpf) -> per-CPU maps
//!   -> tracer (reads the maps)  -> collector (one tokio task, one Snapshot a tick)
//!   -> snapshot (plain data)    -> figures (percentiles, rates, costs; computed once)
//!   -> table | export (JSON) | tui (dashboard)
//! ```
//!
//! Besides the snapshot, the outputs read `model` (the floors measured, the probes not
//! attached): plain values the tracer and the session make, in a module that imports neither.
//!
//! `session` is one live trace around it (signals, privileges, calibration, probe resolution,
//! attach, the workload's memcg and process, clean-up); the commands in `cmd` are thin
//! consumers of a session or of recordings, and `cli` only dispatches to them.
//!
//! ```
//! use memcg_trace::{figures, snapshot::HistData};
//! let h = HistData::of(&[800, 900, 1000, 25_000]);
//! let l = figures::latency(&h, std::time::Duration::from_secs(1), &figures::QUANTILES).unwrap();
//! assert!(l.at(0.5).unwrap().abs_diff(900) <= 15);
//! assert_eq!(l.at(1.0), Some(25_000));
//! ```

pub mod calibrate;
pub mod callers;
pub mod cli;
pub mod cmd;
pub mod collector;
pub mod compare;
pub mod export;
pub mod figures;
pub mod hdrlog;
pub mod history;
pub mod kernel;
pub mod memcgs;
pub mod metrics;
pub mod model;
#[cfg(test)]
mod outputs_tests;
pub mod plot;
pub mod probes;
pub mod session;
pub mod snapshot;
pub mod table;
pub mod tracer;
pub mod tui;
pub mod units;
pub mod workload;
