//! The JSON document (`"schema": "memcg-trace/2"`): assembled here from a `Snapshot`, its
//! figures and what the session knows about the run, written atomically, and read back
//! (recordings of schema memcg-trace/1 too). `schema/memcg-trace-2.schema.json` is its
//! specification; tests validate real output against it and parse it back into these types.
//!
//! Here: the document's top-level types (the schema); `probes` has those of each probe's
//! rows. Its parts: `document` (assembled from a snapshot), `read` (read back, checked,
//! upgraded, made a snapshot again), `files` (written atomically).

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{anyhow, Context as _, Result};
use base64::Engine as _;
use hdrhistogram::serialization::{Serializer as _, V2DeflateSerializer};
use memcg_trace_common::{bucket_bounds, bucket_index, Counters, NUM_BUCKETS, NUM_CTX};
use serde::{Deserialize, Serialize};

use crate::{
    figures::{self, rate, ratio, QUANTILES},
    kernel,
    model::{Floor, NotAttached},
    probes::Backend,
    snapshot::{CtxStats, HistData, ProbeStats, ProgCost, Snapshot},
};

mod document;
mod files;
mod probes;
mod read;

pub use self::{document::*, files::*, probes::*, read::*};

/// The schema identifier of this document version.
pub const SCHEMA: &str = "memcg-trace/2";

/// The previous version, still read.
pub const SCHEMA_V1: &str = "memcg-trace/1";

/// A recording.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Document {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Where and when.
    pub meta: Meta,
    /// Attached probes with their figures.
    pub probes: Vec<ProbeOut>,
    /// Probes that could not be attached, with reasons.
    pub not_attached: Vec<NotAttachedOut>,
    /// The run tick by tick (absent in recordings made before memcg-trace kept it, and in
    /// snapshots taken before the first tick).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<crate::history::History>,
    /// The schema the document was read from when it was older (not written).
    #[serde(skip)]
    pub upgraded_from: Option<String>,
}

/// Nanoseconds since the Unix epoch exceed 2^53, beyond which JavaScript and older jq readers
/// lose precision: they are written as decimal strings (numbers are still read).
mod unix_ns {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            S(String),
            // Nanoseconds since 1970 fit in a u64 until the year 2554.
            N(u64),
        }

        match Either::deserialize(d)? {
            Either::S(s) => s.parse().map_err(D::Error::custom),
            Either::N(n) => Ok(n.into()),
        }
    }
}

/// Where and when the recording was made.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    /// memcg-trace version.
    pub tool_version: String,
    /// `uname -r`.
    pub kernel_release: String,
    /// Preemption model, in the kernel's words.
    pub preemption_model: String,
    /// Relevant kernel build options (value "n" when not set); empty when unknown.
    pub kernel_config: BTreeMap<String, String>,
    /// CPU model name.
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Start of tracing, Unix time in ns (a decimal string).
    #[serde(with = "unix_ns")]
    pub start_unix_ns: u128,
    /// End of tracing, Unix time in ns (a decimal string).
    #[serde(with = "unix_ns")]
    pub end_unix_ns: u128,
    /// Time traced, ns: from the first probe attached to the last detached.
    pub duration_ns: u64,
    /// Whether the kernel's bpf stats were on for the whole recording (program run times).
    pub bpf_stats: bool,
    /// What memcg-trace itself cost.
    pub tracer: DaemonCost,
    /// The preempt_count masks the context split used.
    pub context_masks: Option<kernel::ContextMasks>,
    /// How the time task calls spent off the CPU was told (the contexts' `off_cpu_*` and
    /// `on_cpu_ns`); absent in recordings made before memcg-trace told it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_cpu: Option<String>,
    /// How the programs read the kernel (preempt count, current task, the charged memcg, call
    /// sites) on
    /// this machine; absent in recordings made before memcg-trace told it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads: Option<String>,
    /// What could not be calibrated, one line each (empty: everything was measured).
    #[serde(default)]
    pub calibration: Vec<String>,
    /// The instrumentation floor per latency backend in use.
    #[serde(default)]
    pub floors: Vec<Floor>,
    /// The workload, when memcg-trace ran one.
    pub workload: Option<Workload>,
}

impl Meta {
    /// The floor of `backend`, if it was measured.
    pub fn floor(&self, backend: Backend) -> Option<&Floor> {
        self.floors.iter().find(|f| f.backend == backend)
    }
}

/// The daemon's own cost (the programs' cost is per probe).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DaemonCost {
    /// From the start of the command until every probe was attached, ns.
    pub startup_ns: u64,
    /// Detaching every program at the end, ns.
    pub detach_ns: u64,
    /// User + system CPU time of the daemon while tracing, ns.
    pub cpu_ns: u64,
    /// That as a share of one CPU over the recording.
    pub cpu_share: Option<f64>,
    /// Peak resident set size, KiB.
    pub peak_rss_kib: u64,
    /// Poll interval, ns.
    pub tick_ns: u64,
    /// Where the start-up went, in order (absent from recordings before they were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup_phases: Vec<Phase>,
    /// Why aya's loader parsed the kernel's whole BTF (tens of MiB) at start-up; absent when
    /// it was spared that (see `tracer::kbtf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loader_btf_parsed: Option<String>,
    /// Programs attached besides the probes' (the switch witness on `sched_switch`, the
    /// bench's floors), with their runs and run time: what they add to the traced kernel.
    /// Absent when there were none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_programs: Vec<ProgramOut>,
}

/// One phase of the start-up.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Phase {
    /// What it did: `memcg`, `btf`, `masks`, `symbols`, `load`, `attach`, `floor`.
    pub name: String,
    /// How long it took, ns.
    pub ns: u64,
    /// Peak resident set size of the daemon when it ended, KiB.
    #[serde(default)]
    pub peak_rss_kib: u64,
}

/// A workload run under the tracer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Workload {
    /// Command and arguments.
    pub argv: Vec<String>,
    /// Exit status (128+signal when killed); None if it did not finish.
    pub exit_status: Option<i32>,
    /// The memcg it ran in.
    pub cgroup: String,
    /// CPU time the workload used while it ran (user and system), ns: its cgroup's
    /// `cpu.stat` usage, or, where its memcg is not a cgroup v2 one, the rusage of its process
    /// tree once reaped. Absent when neither could be read (a run stopped before the workload
    /// ended, in a v1 hierarchy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ns: Option<u64>,
    /// Where `cpu_ns` comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_source: Option<String>,
    /// Its calls are told by the memcg they charge: those charging its memcg or one below it,
    /// in every context (`--by-memcg`, or a `--cgroup`); else the task-context calls of
    /// its tasks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_memcg: bool,
    /// Tasks of its memcg OOM-killed while it ran (`oom_kill` of the memcg's `memory.events`,
    /// or v1's `memory.oom_control`, since it started: its tasks, or in a memcg given with
    /// `--cgroup` anyone's there). Absent where not readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
    /// The operations it reports (hackbench's messages, a built-in workload's count): the
    /// denominator of calls and time per operation. Absent for other workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operations: Option<Operations>,
}

/// A workload's operations.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Operations {
    /// How many.
    pub count: u64,
    /// What one is (`hackbench messages`, `opens`, `pipes`).
    pub unit: String,
}

impl Workload {
    /// How it ended, in words: `exit N` (`not ended` where tracing stopped first), and the OOM
    /// kills in its memcg meanwhile (`exit 137 (SIGKILL); 1 OOM kill in its memcg`).
    pub fn ended(&self) -> String {
        ended_words(self.exit_status, self.oom_kills)
    }
}

/// A workload's end in words: its exit status and the OOM kills in its memcg while it ran.
/// The kernel's count says a task there was OOM-killed, not which: exit 137 beside a kill is
/// told as SIGKILL with the kill beside it, not as a proof.
pub fn ended_words(exit_status: Option<i32>, oom_kills: Option<u64>) -> String {
    let kills = oom_kill_words(oom_kills);
    let status = match exit_status {
        None => "not ended".to_string(),
        Some(137) if kills.is_some() => "exit 137 (SIGKILL)".to_string(),
        Some(s) => format!("exit {s}"),
    };
    match kills {
        Some(k) => format!("{status}; {k}"),
        None => status,
    }
}

/// The OOM kills in a workload's memcg, in words (`1 OOM kill in its memcg`); None for none.
pub fn oom_kill_words(oom_kills: Option<u64>) -> Option<String> {
    oom_kills
        .filter(|n| *n > 0)
        .map(|n| format!("{n} OOM kill{} in its memcg", if n == 1 { "" } else { "s" }))
}

#[cfg(test)]
mod tests;
