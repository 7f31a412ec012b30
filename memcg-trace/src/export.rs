//! The JSON document (`"schema": "memcg-trace/1"`): assembled here from a `Snapshot`, its
//! figures and what the session knows about the run, written atomically, and read back.
//! `schema/memcg-trace-1.schema.json` is its specification; tests validate real output against
//! it and parse it back into these types.

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{anyhow, Context as _, Result};
use base64::Engine as _;
use hdrhistogram::serialization::{Serializer as _, V2Serializer};
use memcg_trace_common::{bucket_bounds, CTX_NAMES};
use serde::{Deserialize, Serialize};

use crate::{
    figures::{self, rate, ratio, QUANTILES},
    kernel,
    probes::Backend,
    snapshot::{HistData, Snapshot},
    tracer::NotAttached,
};

/// The schema identifier of this document version.
pub const SCHEMA: &str = "memcg-trace/1";

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
}

/// Where and when the recording was made.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    /// memcg-trace version.
    pub tool_version: String,
    /// `uname -r`.
    pub kernel_release: String,
    /// Preemption model.
    pub preemption_model: String,
    /// Relevant kernel build options (value "n" when not set); empty when unknown.
    pub kernel_config: BTreeMap<String, String>,
    /// CPU model name.
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Start of tracing, Unix time in ns.
    pub start_unix_ns: u128,
    /// End of tracing, Unix time in ns.
    pub end_unix_ns: u128,
    /// Time traced, ns.
    pub duration_ns: u64,
    /// Whether kernel bpf stats were on (self-cost figures need them).
    pub bpf_stats: bool,
    /// What memcg-trace itself cost.
    pub tracer: DaemonCost,
    /// The preempt_count masks the context split used.
    pub context_masks: Option<crate::kernel::ContextMasks>,
    /// The workload, when memcg-trace ran one.
    pub workload: Option<Workload>,
}

/// The daemon's own cost (the programs' cost is per probe, from bpf stats).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DaemonCost {
    /// From the start of `record` until every probe was attached, ns.
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
}

/// One program's cost.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProgramOut {
    /// Program name.
    pub name: String,
    /// Runs while stats were on.
    pub run_cnt: u64,
    /// Total run time, ns.
    pub run_time_ns: u64,
    /// Mean ns per run.
    pub ns_per_run: Option<f64>,
    /// Runs lost to recursion protection.
    pub recursion_misses: u64,
}

/// One percentile.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Quantile {
    /// Quantile in [0, 1].
    pub q: f64,
    /// Latency, ns.
    pub ns: u64,
}

/// One non-empty bucket.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Bucket {
    /// Inclusive lower bound, ns.
    pub min_ns: u64,
    /// Exclusive upper bound, ns.
    pub max_ns: u64,
    /// Calls.
    pub count: u64,
}

/// One (probe, context) pair.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextOut {
    /// task, softirq, hardirq or nmi.
    pub context: String,
    /// Calls counted (paired calls, or tracepoint hits).
    pub count: u64,
    /// Calls per second of the recording.
    pub rate_per_s: Option<f64>,
    /// Entry program runs.
    pub entries: u64,
    /// Exit program runs.
    pub exits: u64,
    /// Exits without a matching entry.
    pub unmatched: u64,
    /// Task-context calls that left the CPU, dropped.
    pub switched: u64,
    /// Calls whose context could not be read.
    pub no_context: u64,
    /// Latency figures; absent for counts-only backends.
    pub latency: Option<Latency>,
}

/// Latency of one (probe, context) pair.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    /// Sum of durations, ns: the CPU time spent inside the function.
    pub sum_ns: u64,
    /// Share of the wall time spent inside the function, summed over CPUs (1.0 = one CPU).
    pub cpu_share: Option<f64>,
    /// Shortest, ns.
    pub min_ns: u64,
    /// Longest, ns.
    pub max_ns: u64,
    /// Mean, ns.
    pub mean_ns: Option<f64>,
    /// Standard deviation, ns (from the histogram).
    pub stddev_ns: Option<f64>,
    /// Percentiles.
    pub percentiles: Vec<Quantile>,
    /// Non-empty buckets.
    pub buckets: Vec<Bucket>,
    /// HdrHistogram V2 encoding, base64 (readable by standard HdrHistogram tools).
    pub hdr_v2: String,
}

/// One attached probe.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeOut {
    /// Logical name or function.
    pub name: String,
    /// Function or tracepoint attached to.
    pub target: String,
    /// fentry, kprobe or tracepoint.
    pub backend: Backend,
    /// Calls in all contexts.
    pub count: u64,
    /// Dropped calls in all contexts.
    pub dropped: u64,
    /// Recursion misses of all its programs.
    pub recursion_misses: u64,
    /// Why other candidates or backends were not used.
    pub notes: Vec<String>,
    /// The programs' own cost.
    pub programs: Vec<ProgramOut>,
    /// Per context.
    pub contexts: Vec<ContextOut>,
    /// The workload's share, when memcg-trace ran one: task-context calls made by tasks of the
    /// workload's cgroup.
    pub workload: Option<WorkloadOut>,
}

/// Task-context calls made by tasks of the workload's cgroup.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkloadOut {
    /// Calls.
    pub count: u64,
    /// Calls per second of the recording.
    pub rate_per_s: Option<f64>,
    /// Fraction of all task-context calls of this probe.
    pub share_of_task_calls: Option<f64>,
    /// Latency figures; absent for counts-only backends.
    pub latency: Option<Latency>,
}

/// A probe that could not be attached.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NotAttachedOut {
    /// Logical name or function.
    pub name: String,
    /// One line per candidate or backend tried.
    pub reasons: Vec<String>,
}

/// Latency figures of one histogram over a recording of length `secs`; None when nothing was
/// timed there.
fn latency_out(h: &HistData, secs: Duration) -> Latency {
    let mut buf = Vec::new();
    V2Serializer::new()
        .serialize(&figures::hdr(h), &mut buf)
        .expect("serialize hdr");
    let l = figures::latency(h, secs, &QUANTILES);
    Latency {
        sum_ns: h.sum_ns,
        cpu_share: ratio(h.sum_ns as f64, secs.as_nanos() as f64),
        min_ns: h.min_ns,
        max_ns: h.max_ns,
        mean_ns: l.as_ref().map(|l| l.mean_ns),
        stddev_ns: l.as_ref().map(|l| l.stddev_ns),
        percentiles: l
            .map(|l| {
                l.percentiles
                    .into_iter()
                    .map(|(q, ns)| Quantile { q, ns })
                    .collect()
            })
            .unwrap_or_default(),
        buckets: h
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, &count)| {
                let (min_ns, max_ns) = bucket_bounds(i);
                Bucket {
                    min_ns,
                    max_ns,
                    count,
                }
            })
            .collect(),
        hdr_v2: base64::engine::general_purpose::STANDARD.encode(&buf),
    }
}

/// What a recording says about the run besides the figures: assembled by the live session.
#[derive(Debug, Clone)]
pub struct RunMeta {
    /// When tracing started.
    pub start: SystemTime,
    /// When it ended (or the moment of a dashboard save).
    pub end: SystemTime,
    /// The preempt_count masks the context split used.
    pub masks: Option<kernel::ContextMasks>,
    /// The daemon's own cost.
    pub daemon: DaemonCost,
    /// The workload, when the session ran one.
    pub workload: Option<Workload>,
    /// Resolution notes per attached probe, by name.
    pub notes: HashMap<String, Vec<String>>,
    /// Probes that could not be attached.
    pub not_attached: Vec<NotAttached>,
}

fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The recording of a snapshot: the one place a document is assembled (`record`, the
/// dashboard's save key).
pub fn document(snap: &Snapshot, run: &RunMeta) -> Document {
    let release = kernel::release();
    let config = kernel::config(&release);
    let (cpu_model, cpus) = kernel::cpu_info();
    Document {
        schema: SCHEMA.into(),
        meta: Meta {
            tool_version: env!("CARGO_PKG_VERSION").into(),
            preemption_model: kernel::preemption_model(config.as_ref()),
            kernel_release: release,
            kernel_config: config.unwrap_or_default(),
            cpu_model,
            cpus,
            start_unix_ns: unix_ns(run.start),
            end_unix_ns: unix_ns(run.end),
            duration_ns: snap.elapsed.as_nanos() as u64,
            bpf_stats: snap
                .probes
                .iter()
                .any(|p| p.programs.iter().any(|c| c.run_cnt > 0)),
            tracer: run.daemon.clone(),
            context_masks: run.masks.clone(),
            workload: run.workload.clone(),
        },
        probes: probes_out(snap, &run.notes),
        not_attached: run
            .not_attached
            .iter()
            .map(|f| NotAttachedOut {
                name: f.name.clone(),
                reasons: f.reasons.clone(),
            })
            .collect(),
    }
}

/// The per-probe part of the document.
fn probes_out(snap: &Snapshot, notes: &HashMap<String, Vec<String>>) -> Vec<ProbeOut> {
    let secs = snap.elapsed;
    snap.probes
        .iter()
        .map(|p| ProbeOut {
            name: p.name.clone(),
            target: p.target.clone(),
            backend: p.backend,
            count: p.calls(),
            dropped: p.dropped(),
            recursion_misses: p.recursion_misses(),
            notes: notes.get(&p.name).cloned().unwrap_or_default(),
            workload: p.workload.as_ref().map(|w| WorkloadOut {
                count: w.count,
                rate_per_s: rate(w.count, secs),
                share_of_task_calls: ratio(w.count as f64, p.contexts[0].hist.count as f64),
                latency: p.backend.has_latency().then(|| latency_out(w, secs)),
            }),
            programs: p
                .programs
                .iter()
                .map(|c| ProgramOut {
                    name: c.name.clone(),
                    run_cnt: c.run_cnt,
                    run_time_ns: c.run_time_ns,
                    ns_per_run: ratio(c.run_time_ns as f64, c.run_cnt as f64),
                    recursion_misses: c.recursion_misses,
                })
                .collect(),
            contexts: p
                .contexts
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let h = &c.hist;
                    ContextOut {
                        context: CTX_NAMES[i].to_string(),
                        count: h.count,
                        rate_per_s: rate(h.count, secs),
                        entries: c.counters.entries,
                        exits: c.counters.exits,
                        unmatched: c.counters.unmatched,
                        switched: c.counters.switched,
                        no_context: c.counters.no_context,
                        latency: p.backend.has_latency().then(|| latency_out(h, secs)),
                    }
                })
                .collect(),
        })
        .collect()
}

/// Writes `doc` to `path` atomically: a temporary file in the same directory, fsync, rename.
pub fn write_atomic(path: &Path, doc: &Document) -> Result<()> {
    let json = serde_json::to_vec_pretty(doc).context("encode JSON")?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a file path", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&json)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        anyhow!("cannot write {}: {e}", path.display())
    })
}

/// Checks up front that `path` can be written (so a long recording is not lost at the end).
pub fn check_writable(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if path.is_dir() {
        return Err(anyhow!("{}: is a directory", path.display()));
    }
    let probe = dir.join(format!(".memcg-trace-probe{}", std::process::id()));
    fs::File::create(&probe)
        .map(|_| {
            let _ = fs::remove_file(&probe);
        })
        .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))
}

/// Reads a recording, with one clear error for each way a file can be wrong.
pub fn read(path: &Path) -> Result<Document> {
    let text =
        fs::read_to_string(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        anyhow!(
            "{}: not a memcg-trace recording (invalid JSON: {e})",
            path.display()
        )
    })?;
    match v.get("schema").and_then(|s| s.as_str()) {
        Some(SCHEMA) => {}
        Some(other) => {
            return Err(anyhow!(
                "{}: schema {other} is not supported (expected {SCHEMA})",
                path.display()
            ))
        }
        None => {
            return Err(anyhow!(
                "{}: not a memcg-trace recording (no \"schema\")",
                path.display()
            ))
        }
    }
    serde_json::from_value(v)
        .map_err(|e| anyhow!("{}: malformed {SCHEMA} document: {e}", path.display()))
}

/// The `Snapshot` a recording describes, so that the dashboard shows recordings exactly as it
/// shows live data (`memcg-trace view`).
pub fn to_snapshot(doc: &Document) -> crate::snapshot::Snapshot {
    use crate::snapshot::{CtxStats, HistData, ProbeStats, ProgCost, Snapshot};
    use memcg_trace_common::{bucket_index, Counters};
    let hist = |count: u64, l: Option<&Latency>| {
        let mut h = HistData {
            count,
            ..Default::default()
        };
        if let Some(l) = l {
            h.sum_ns = l.sum_ns;
            h.min_ns = l.min_ns;
            h.max_ns = l.max_ns;
            for b in &l.buckets {
                h.buckets[bucket_index(b.min_ns)] += b.count;
            }
        }
        h
    };
    Snapshot {
        elapsed: Duration::from_nanos(doc.meta.duration_ns),
        probes: doc
            .probes
            .iter()
            .map(|p| {
                let mut contexts: [CtxStats; memcg_trace_common::NUM_CTX] = Default::default();
                for (i, c) in p.contexts.iter().enumerate().take(contexts.len()) {
                    contexts[i] = CtxStats {
                        hist: hist(c.count, c.latency.as_ref()),
                        counters: Counters {
                            entries: c.entries,
                            exits: c.exits,
                            unmatched: c.unmatched,
                            switched: c.switched,
                            no_context: c.no_context,
                        },
                    };
                }
                ProbeStats {
                    name: p.name.clone(),
                    target: p.target.clone(),
                    backend: p.backend,
                    contexts,
                    programs: p
                        .programs
                        .iter()
                        .map(|x| ProgCost {
                            name: x.name.clone(),
                            run_cnt: x.run_cnt,
                            run_time_ns: x.run_time_ns,
                            recursion_misses: x.recursion_misses,
                        })
                        .collect(),
                    workload: p
                        .workload
                        .as_ref()
                        .map(|w| hist(w.count, w.latency.as_ref())),
                }
            })
            .collect(),
        extra: Vec::new(),
    }
}
