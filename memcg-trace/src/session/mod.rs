//! One live trace, from the first moment to the last: signal handlers, privileges, the
//! workload's memcg, calibration, probe resolution and attach (with the reason for every probe
//! that could not be attached), the collector, the workload's process; and on the way out the
//! final figures, detach, memcg removal and the exit status. `record`, `top`, `bench` (and every
//! live command to come) are thin consumers of a `Session`; none reaches into another command.
//!
//! Here: the run itself. Its parts: `options` (what it is started with, what it reports), `start`
//! (start-up as steps: prepare, attach, begin), `attach` (the kernel inspected, the programs loaded
//! and attached, the floors measured), `privileges` (capabilities, start-up priority), `signals`
//! (stop signals never lost), `resources` (the daemon's and the workload's CPU time, peak memory).

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::PathBuf,
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{anyhow, bail, Context as _, Result};
use futures_util::FutureExt as _;
use memcg_trace_common::MAX_PROBES;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::hdrlog::HdrLog;
use crate::{
    calibrate,
    collector::{Collector, Final},
    export::{DaemonCost, Phase, RunMeta, Workload},
    figures::ratio,
    kernel::{self, Symbols},
    model::{Floor, NotAttached},
    probes::{self, AttachMode, Backend, Request},
    snapshot::Snapshot,
    tracer::{Features, LoadOptions, Tracer},
    units::parse_duration,
    workload::{self, Memcg},
};

mod attach;
mod options;
mod privileges;
mod resources;
mod signals;
mod start;

pub use self::{attach::*, options::*, privileges::*, resources::*, signals::*};

/// A live trace.
pub struct Session {
    /// [`INJECT_PANIC`] was set to 1.
    inject_panic: bool,
    signals: Signals,
    /// Taken when the session finishes.
    collector: Option<Collector>,
    snapshots: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    memcg: Option<Memcg>,
    /// The workload's calls are told by the memcg they charge (`Workload::by_memcg`).
    workload_memcg: bool,
    child: Option<tokio::process::Child>,
    /// The workload's CPU clocks when it started.
    workload_cpu0: Option<WorkloadCpu>,
    /// The workload's CPU time and where it comes from, once known.
    workload_cpu: Option<(u64, String)>,
    /// Its memcg's OOM kills when it started, and the kills since, once it exited.
    oom_kills0: Option<u64>,
    oom_kills: Option<u64>,
    argv: Vec<String>,
    exit_status: Option<i32>,
    notes: HashMap<String, Vec<String>>,
    failed: Vec<NotAttached>,
    masks: Option<kernel::ContextMasks>,
    off_cpu: String,
    /// How the programs read the kernel (`Meta::reads`).
    reads: String,
    /// Why the loader parsed the kernel's whole BTF (`DaemonCost::loader_btf_parsed`).
    loader_btf_parsed: Option<String>,
    /// The run tick by tick.
    history: crate::history::Recorder,
    /// Whether to keep it (not for `serve`, which has no recording).
    keep_history: bool,
    floors: Vec<Floor>,
    calibration: Vec<String>,
    /// The preemption model the programs were set for: a dynamic kernel's can be changed
    /// while they run.
    preemption_model: String,
    /// The other models a dynamic kernel was seen running as since, at the ticks.
    preemption_changes: Vec<String>,
    /// Writes to a dynamic kernel's model file, and whether one was seen: a change and its
    /// reversal between two ticks leave the model as it was.
    preemption_writes: Option<kernel::ModelWrites>,
    preemption_written: std::sync::atomic::AtomicBool,
    started: SystemTime,
    startup: Duration,
    phases: Vec<Phase>,
    cpu0: Duration,
    tick: Duration,
    hdr_log: Option<HdrLog>,
}

/// What a finished session leaves: the final figures and what a recording says about the run.
pub struct Finished {
    /// Final figures, read after every program was detached.
    pub snapshot: Snapshot,
    /// Everything else a recording holds.
    pub meta: RunMeta,
    /// The process exit status to return.
    pub exit_code: i32,
    /// The interval log (`--hdr-log`): where it was written, or why it could not be.
    pub hdr_log: Option<Result<PathBuf, String>>,
}

impl Finished {
    /// Says where the interval log went; an error if it could not be written (the caller has
    /// written everything else first).
    pub fn report_hdr_log(&self) -> Result<()> {
        match &self.hdr_log {
            Some(Ok(p)) => {
                eprintln!("memcg-trace: wrote {}", p.display());
                Ok(())
            }
            Some(Err(e)) => Err(anyhow!("{e}")),
            None => Ok(()),
        }
    }
}

impl Session {
    /// Waits for the next thing that happens: a snapshot, the workload's exit, a signal.
    pub async fn next(&mut self) -> Result<Event> {
        tokio::select! {
            r = self.snapshots.changed() => {
                r.map_err(|_| anyhow!("the collector stopped"))?;

                // The tests' way to prove a bug's panic still cleans up (memcg, links, terminal).
                if self.inject_panic {
                    panic!("injected by {INJECT_PANIC}");
                }

                let snap = self.snapshots.borrow_and_update().clone();
                self.check_preemption_model();
                if let Some(l) = self.hdr_log.as_mut() {
                    l.interval(&snap);
                }

                if self.keep_history {
                    self.history.push(&snap);
                }
                Ok(Event::Tick(snap))
            }
            st = async { self.child.as_mut().expect("guarded").wait().await }, if self.child.is_some() => {
                use std::os::unix::process::ExitStatusExt as _;
                let st = st?;
                let code = st.code().or_else(|| st.signal().map(|s| 128 + s));
                self.child = None;
                self.exit_status = code;
                self.workload_cpu = self.workload_cpu0.as_ref().and_then(|w| w.used(true));
                self.oom_kills = self.oom_kills_now();
                Ok(Event::WorkloadExited(code))
            }
            s = self.signals.recv() => Ok(Event::Signal(s)),
        }
    }

    /// Takes a snapshot now instead of waiting for the tick, so that `latest` includes every
    /// call made until this moment. The snapshot also comes as the next `Tick` event.
    pub async fn refresh(&self) -> Result<Arc<Snapshot>> {
        self.collector
            .as_ref()
            .expect("refreshed before finishing")
            .now()
            .await
    }

    /// Keep no history: nothing will be recorded (`serve`).
    pub fn without_history(&mut self) {
        self.keep_history = false;
        self.history = Default::default();
    }

    /// The latest snapshot.
    pub fn latest(&self) -> Arc<Snapshot> {
        self.snapshots.borrow().clone()
    }

    /// Changes the collector's tick.
    pub fn set_tick(&mut self, tick: Duration) {
        self.tick = tick;
        if let Some(c) = &self.collector {
            c.set_tick(tick);
        }
    }

    /// The workload's command line (empty without one).
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// The instrumentation floor per latency backend in use.
    pub fn floors(&self) -> &[Floor] {
        &self.floors
    }

    /// What could not be calibrated.
    pub fn calibration(&self) -> &[String] {
        &self.calibration
    }

    /// The memcg the workload runs in.
    pub fn cgroup(&self) -> Option<PathBuf> {
        self.memcg.as_ref().map(|m| m.path.clone())
    }

    /// What a recording made now would say about the run (the dashboard's save key).
    pub fn meta_now(&self) -> RunMeta {
        let cpu = cpu_time().saturating_sub(self.cpu0);
        self.meta(Duration::ZERO, cpu, None)
    }

    /// The workload's CPU time since the start, ns: as read when it exited, or, still
    /// running, from its cgroup now (the dashboard's share of it).
    pub fn workload_cpu_ns(&self) -> Option<u64> {
        self.workload_cpu().map(|c| c.0)
    }

    /// The workload's CPU time: as read when it exited, or, still running, from its cgroup
    /// now.
    fn workload_cpu(&self) -> Option<(u64, String)> {
        self.workload_cpu
            .clone()
            .or_else(|| self.workload_cpu0.as_ref().and_then(|w| w.used(false)))
    }

    /// The tasks of its memcg OOM-killed since the workload started: as read when it
    /// exited, or from the memcg now.
    pub fn oom_kills(&self) -> Option<u64> {
        self.oom_kills.or_else(|| self.oom_kills_now())
    }

    fn oom_kills_now(&self) -> Option<u64> {
        let now = self.memcg.as_ref()?.oom_kills()?;
        Some(now.saturating_sub(self.oom_kills0?))
    }

    fn meta(&self, detach: Duration, cpu: Duration, elapsed: Option<Duration>) -> RunMeta {
        RunMeta {
            start: self.started,
            masks: self.masks.clone(),
            off_cpu: Some(self.off_cpu.clone()),
            reads: Some(self.reads.clone()),
            history: self.keep_history.then(|| self.history.history().clone()),
            daemon: DaemonCost {
                startup_ns: self.startup.as_nanos() as u64,
                detach_ns: detach.as_nanos() as u64,
                cpu_ns: cpu.as_nanos() as u64,
                cpu_share: elapsed.and_then(|e| ratio(cpu.as_secs_f64(), e.as_secs_f64())),
                peak_rss_kib: peak_rss_kib(),
                tick_ns: self.tick.as_nanos() as u64,
                startup_phases: self.phases.clone(),
                loader_btf_parsed: self.loader_btf_parsed.clone(),
                // From the snapshot (`export::document`).
                other_programs: Vec::new(),
            },
            workload: self.memcg.as_ref().map(|m| Workload {
                argv: self.argv.clone(),
                exit_status: self.exit_status,
                cgroup: m.path.display().to_string(),
                by_memcg: self.workload_memcg,
                cpu_ns: self.workload_cpu().map(|c| c.0),
                cpu_source: self.workload_cpu().map(|c| c.1),
                oom_kills: self.oom_kills(),
                // Only a workload that ran to the end made the operations it was asked for.
                operations: workload::operations(&self.argv)
                    .filter(|_| self.exit_status == Some(0))
                    .map(|(count, unit)| crate::export::Operations {
                        count,
                        unit: unit.to_string(),
                    }),
            }),
            notes: self.notes.clone(),
            not_attached: self.failed.clone(),
            floors: self.floors.clone(),
            calibration: self.calibration_now(),
            preemption_model: Some(self.preemption_model.clone()),
        }
    }

    /// What could not be calibrated, and whether the preemption model is still the one the
    /// programs were set for: on a PREEMPT_DYNAMIC kernel root can change it while they run
    /// (/sys/kernel/debug/sched/preempt), and programs set for a kernel that does not preempt
    /// then pair calls that can be preempted, or interleave, as if they could not.
    fn calibration_now(&self) -> Vec<String> {
        let mut out = self.calibration.clone();
        let mut seen = self.preemption_changes.clone();
        let now = kernel::preemption_model(kernel::config(&kernel::release()).as_ref());
        if now != self.preemption_model && !seen.contains(&now) {
            seen.push(now);
        }

        if self.preemption_writes.as_ref().is_some_and(|w| w.written()) {
            self.preemption_written
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }

        if seen.is_empty()
            && self
                .preemption_written
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            out.push(format!(
                "the preemption model was written while tracing and runs as {0} again: a change and its reversal between two ticks would not show, and calls made meanwhile were paired for {0}",
                self.preemption_model
                    .rsplit_once(" as ")
                    .map_or(self.preemption_model.as_str(), |(_, m)| m),
            ));
        }

        if !seen.is_empty() {
            out.push(format!(
                "the preemption model changed while tracing: the programs were set for {}, the kernel ran as {} since; calls made then were paired as the first allows",
                self.preemption_model,
                seen.iter()
                    .map(|m| m.rsplit_once(" as ").map_or(m.as_str(), |(_, m)| m))
                    .collect::<Vec<_>>()
                    .join(", then ")
            ));
        }
        out
    }

    /// At each tick, on a dynamic kernel: the model it runs as now, kept if new.
    fn check_preemption_model(&mut self) {
        // (A PREEMPT_RT kernel says "PREEMPT_RT, PREEMPT_DYNAMIC, running as ...".)
        if !self
            .preemption_model
            .contains("PREEMPT_DYNAMIC, running as")
        {
            return;
        }

        if self.preemption_writes.as_ref().is_some_and(|w| w.written()) {
            self.preemption_written
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }

        let now = kernel::preemption_model(None);
        if now != self.preemption_model && !self.preemption_changes.contains(&now) {
            self.preemption_changes.push(now);
        }
    }

    /// Ends the trace: stops a workload that is still running (SIGTERM, then the memcg's
    /// removal kills what is left), detaches every program and takes the final figures, removes
    /// the memcg, and works out the exit status.
    pub async fn finish(mut self, end: End) -> Result<Finished> {
        if let Some(c) = self.child.as_mut() {
            if let Some(pid) = c.id() {
                // The tree it started, found before the child exits and orphans it; in a
                // cgroup we do not own, exactly these are stopped, never the cgroup's others.
                // Held by pidfds: a pid reused meanwhile is never signalled.
                let tree: Vec<workload::Held> = workload::descendants(pid as i32)
                    .into_iter()
                    .filter_map(workload::Held::open)
                    .collect();
                // SAFETY: plain kill(2) of our own child, not yet reaped.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                let exited = tokio::time::timeout(Duration::from_secs(2), c.wait())
                    .await
                    .is_ok();
                let owned = self.memcg.as_ref().is_some_and(|m| m.owned());
                if !owned {
                    // An owned memcg's removal kills what is left in it; in another's cgroup
                    // what our workload started, and only that, is stopped here.
                    for p in &tree {
                        p.signal(libc::SIGKILL);
                    }

                    if !exited {
                        let _ = c.kill().await;
                    }
                }
            }
        }

        // The daemon's own CPU while tracing; detaching is reported apart.
        let cpu = cpu_time().saturating_sub(self.cpu0);
        let collector = self.collector.take().expect("a session finishes once");
        let Final { snapshot, detach } = collector.finish().await?;
        if self.keep_history {
            self.history.push(&snapshot);
        }

        // Read before the memcg goes: a workload still running at the stop has no count yet.
        self.oom_kills = self.oom_kills();
        if let Some(m) = self.memcg.as_mut() {
            if let Err(e) = m.remove() {
                eprintln!("memcg-trace: warning: {e:#}");
            }
        }

        let meta = self.meta(detach, cpu, Some(snapshot.elapsed));
        let workload = !self.argv.is_empty();
        let exit_code = match end {
            End::Exited(Some(s)) => s,
            End::Exited(None) => 1,
            // A workload cut short by a signal is reported like a shell would; a system-wide
            // recording ended by Ctrl-C is a normal end.
            End::Signal(sig) if workload => 128 + sig,
            End::Signal(_) | End::Deadline | End::Quit => self.exit_status.unwrap_or(0),
        };
        let hdr_log = self.hdr_log.take().map(|l| {
            let dest = l.dest().to_path_buf();
            l.finish(&snapshot)
                .map(|_| dest)
                .map_err(|e| format!("{e:#}"))
        });
        Ok(Finished {
            snapshot,
            meta,
            exit_code,
            hdr_log,
        })
    }
}
