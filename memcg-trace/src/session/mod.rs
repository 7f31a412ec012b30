//! One live trace, from the first moment to the last: signal handlers, privileges, the
//! workload's memcg, calibration, probe resolution and attach (with the reason for every probe
//! that could not be attached), the collector, the workload's process; and on the way out the
//! final figures, detach, memcg removal and the exit status. `record`, `top`, `bench` (and every
//! live command to come) are thin consumers of a `Session`; none reaches into another command.
//!
//! Here: the options and the run itself. Its parts: `attach` (start-up as steps),
//! `privileges` (capabilities, start-up priority), `signals` (stop signals never lost),
//! `resources` (the daemon's and the workload's CPU time, peak memory).

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
mod privileges;
mod resources;
mod signals;

pub use self::{attach::*, privileges::*, resources::*, signals::*};

/// Which probes and how to attach them.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ProbeSel {
    /// Logical probes to trace (comma-separated or repeated); `memcg-trace probes --all` lists them.
    #[arg(long, short = 'p', value_delimiter = ',')]
    pub probe: Vec<String>,
    /// Any other traceable kernel function, traced the same way (repeatable).
    #[arg(long = "func", short = 'f')]
    pub func: Vec<String>,
    /// How to attach: auto tries fentry, then kprobe, then tracepoint, per probe.
    #[arg(long, value_enum, default_value = "auto")]
    pub attach: AttachMode,
    /// Include the optional probes (probes command: list every probe).
    #[arg(long)]
    pub all: bool,
}

/// The options every live command shares (`record`, `top`, `bench`, ...).
#[derive(clap::Args, Debug, Clone)]
pub struct LiveArgs {
    #[command(flatten)]
    pub sel: ProbeSel,
    /// Poll interval (e.g. 1s, 250ms).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub tick: Duration,
    /// Run the workload in this existing memcg instead of a fresh one. Its calls are then those
    /// charging this memcg or one below it, in every context (as with --by-memcg).
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// A named workload instead of a command: `hackbench` or `hackbench:ARGS` (default ARGS:
    /// "-g 2 -l 200"), `perf-messaging[:ARGS]` (perf bench sched messaging, the same default
    /// ARGS); `open-loop[:N]` (N opens of a nonexistent path: a struct file charged
    /// and freed each), `kmalloc[:N]` (N pipes made and closed: kmalloc(GFP_KERNEL_ACCOUNT)
    /// and accounted slab objects) or `sockets[:N]` (N 64 KiB messages over loopback TCP to 4
    /// clients in memcgs of their own: socket memory charged in softirq; with --by-memcg),
    /// built in, each with its operations for calls/op.
    #[arg(long, conflicts_with = "command")]
    pub workload: Option<String>,
    /// Diagnostics from inside the eBPF programs (per-CPU base resolution, context reads,
    /// pairing anomalies) on stderr; off by default and free when off.
    #[arg(long)]
    pub ebpf_log: bool,
    /// Keep the kernel's bpf stats on for the whole run (each program's run count and run
    /// time). They add two clock reads to every program run, so by default they are on only
    /// while the instrumentation floor is measured at start-up.
    #[arg(long)]
    pub bpf_stats: bool,
    /// Read the preempt count and the task's switch counts through bpf_probe_read_kernel
    /// instead of plain loads (costlier; for comparisons, or a kernel that refuses the loads).
    #[arg(long, hide_short_help = true)]
    pub probe_read: bool,
    /// Refuse to trace when the context masks or the instrumentation floor could not be
    /// measured on this kernel (instead of saying so and going on).
    #[arg(long)]
    pub strict: bool,
    /// Also write an HdrHistogram interval log here: each tick's histogram of every (probe,
    /// context) and workload row, tagged `probe.context`, in the format HdrHistogram's ports
    /// read (put in place when the run ends).
    #[arg(long, value_name = "FILE")]
    pub hdr_log: Option<PathBuf>,
    /// Also count every timed call under its call site (the return address into the calling
    /// function), with a latency histogram per site and context, shown as function+offset.
    /// fentry and kprobe backends; costs a stack read and a hash-map update per call.
    #[arg(long)]
    pub callers: bool,
    /// Also count every call under the memcg it charges (read from the function's own
    /// argument, in every context; named by cgroup path), and tell the workload's calls the
    /// same way: those charging its memcg or one below it. Costs a few reads and a hash-map
    /// update per call.
    #[arg(long)]
    pub by_memcg: bool,
    /// With --callers: also sample each call site's short stack, this many frames with the
    /// site (2-4; the flag alone: 3), from the kernel's own unwinder: who called the caller.
    #[arg(long, value_name = "FRAMES", requires = "callers", num_args = 0..=1,
          default_missing_value = "3", value_parser = clap::value_parser!(u32).range(2..=4))]
    pub callers_depth: Option<u32>,
    /// With --callers-depth: unwind the stack of one entry in N on each CPU (unwinding costs
    /// far more than reading the call site; counts per site stay exact).
    #[arg(long, value_name = "N", default_value_t = 16, requires = "callers_depth",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub callers_sample: u32,
    /// Workload to run in a fresh memcg; tracing ends when it exits.
    #[arg(last = true)]
    pub command: Vec<String>,
}

impl Default for LiveArgs {
    fn default() -> Self {
        LiveArgs {
            sel: ProbeSel::default(),
            tick: Duration::from_secs(1),
            cgroup: None,
            workload: None,
            ebpf_log: false,
            bpf_stats: false,
            probe_read: false,
            strict: false,
            hdr_log: None,
            callers: false,
            by_memcg: false,
            callers_depth: None,
            callers_sample: 16,
            command: Vec::new(),
        }
    }
}

impl LiveArgs {
    /// What the programs are to do beyond timing calls, as the command line asks (the
    /// workload told by its memcg: as the session decides, `workload_memcg`).
    pub fn features(&self, workload_memcg: bool) -> Features {
        Features {
            callers: self.callers,
            stack_depth: self.callers_depth.unwrap_or(0),
            stack_sample: self.callers_sample,
            by_memcg: self.by_memcg,
            workload_memcg,
            probe_read: self.probe_read,
            ebpf_log: self.ebpf_log,
        }
    }

    /// The workload's command line: the command, or the named workload's.
    pub fn argv(&self) -> Result<Vec<String>> {
        match &self.workload {
            Some(w) => workload::named(w),
            None => Ok(self.command.clone()),
        }
    }
}

/// How chatty attaching is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verbosity {
    /// Nothing on stderr.
    Quiet,
    /// One line per probe, and the reasons a preferred backend was refused.
    Normal,
}

/// How a live trace ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The requested duration passed.
    Deadline,
    /// SIGINT, SIGTERM or SIGHUP (or Ctrl-C in the dashboard).
    Signal(i32),
    /// The workload exited with this status (128+N when killed by signal N).
    Exited(Option<i32>),
    /// The user left the dashboard.
    Quit,
}

/// What a session reports while it runs.
#[derive(Debug)]
pub enum Event {
    /// A new snapshot.
    Tick(Arc<Snapshot>),
    /// The workload exited with this status (128+N when killed by signal N).
    WorkloadExited(Option<i32>),
    /// A stop signal arrived.
    Signal(i32),
}

/// How a session starts.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// What attaching prints.
    pub verbosity: Verbosity,
    /// The dashboard owns the terminal: the workload's output is discarded and start-up notices
    /// are not printed (otherwise the workload inherits stdout and stderr).
    pub dashboard: bool,
    /// Drop the capabilities attaching needed once the session runs ([`drop_privileges`]).
    /// Off only where one process attaches again later (`bench`).
    pub least_privilege: bool,
}

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
    /// [`Session::start`] for the commands whose exit status tells a start-up stopped by a
    /// signal: then `Ok(Err(code))`, said on stderr.
    pub async fn start_or_exit_code(
        args: &LiveArgs,
        opts: Options,
        extra: impl FnOnce(&mut Tracer) -> Result<()>,
    ) -> Result<std::result::Result<Session, i32>> {
        match Session::start(args, opts, extra).await {
            Ok(s) => Ok(Ok(s)),
            Err(e) => match interrupted_exit_code(&e) {
                Some(code) => {
                    eprintln!("memcg-trace: {e:#}");
                    Ok(Err(code))
                }
                None => Err(e),
            },
        }
    }

    /// Starts a live trace: signal handlers first, then the workload's memcg, calibration and
    /// attach (`extra` may attach more programs before collection starts), the collector, and
    /// last the workload itself, so that its first call is already traced. A stop signal during
    /// start-up ends it with [`Interrupted`], leaving nothing behind.
    pub async fn start(
        args: &LiveArgs,
        opts: Options,
        extra: impl FnOnce(&mut Tracer) -> Result<()>,
    ) -> Result<Session> {
        let t0 = Instant::now();
        let mut signals = Signals::install()?;
        check_privileges()?;
        let priority = StartupPriority::raise();
        // Before anything is created: a path that cannot be written fails here.
        let mut hdr_log = args.hdr_log.as_deref().map(HdrLog::create).transpose()?;
        let argv = args.argv()?;
        let memcg = if argv.is_empty() {
            None
        } else {
            Some(workload::prepare(args.cgroup.as_deref(), opts.dashboard)?)
        };
        let mut phases = vec![Phase {
            name: "memcg".into(),
            ns: t0.elapsed().as_nanos() as u64,
            peak_rss_kib: peak_rss_kib(),
        }];
        let cgid = memcg.as_ref().map(|m| m.cgroup_id).unwrap_or(0);
        // The workload's calls are those charging its memcg (in every context) with
        // --by-memcg, for a memcg given with --cgroup (which others may charge too: a
        // database's), and where its tasks have no cgroup v2 id to be told by; else, for the
        // fresh memcg only its own tasks charge, the task-context calls its tasks make (the
        // cheaper test).
        let workload_memcg =
            memcg.is_some() && (args.by_memcg || args.cgroup.is_some() || cgid == 0);
        if let Some(s) = signals.pending().await {
            return Err(Interrupted(s).into());
        }
        let Attached {
            mut tracer,
            notes,
            floors,
            calibration,
            phases: attach_phases,
            preemption_model,
        } = attach(
            &args.sel,
            AttachOptions {
                verbosity: opts.verbosity,
                workload_cgroup: cgid,
                workload_owned: memcg.as_ref().is_some_and(|m| m.owned()),
                workload_level: memcg
                    .as_ref()
                    .map_or(Default::default(), |m| m.cgroup_level),
                bpf_stats: args.bpf_stats,
                strict: args.strict,
                floor: true,
                all_named: true,
                features: args.features(workload_memcg),
            },
        )?;
        if let Some(m) = memcg.as_ref().filter(|_| workload_memcg) {
            tracer.set_workload_memcg(&m.path)?;
        }
        phases.extend(attach_phases);
        let t_extra = Instant::now();
        extra(&mut tracer)?;
        tracer.done_attaching();
        // Back to its own priority before the workload starts.
        drop(priority);
        phases.push(Phase {
            name: "extra".into(),
            ns: t_extra.elapsed().as_nanos() as u64,
            peak_rss_kib: peak_rss_kib(),
        });
        if let Some(s) = signals.pending().await {
            return Err(Interrupted(s).into());
        }
        let failed = tracer.failed.clone();
        let masks = tracer.masks.clone();
        let off_cpu = tracer.off_cpu.clone();
        let reads = tracer.reads.clone();
        let loader_btf_parsed = tracer.loader_btf.clone();
        let startup = t0.elapsed();
        let cpu0 = cpu_time();
        // When the first probe was attached: the zero of every snapshot's elapsed time, so
        // that the recording's start + duration and the interval log's timestamps are right.
        let started = SystemTime::now()
            .checked_sub(tracer.elapsed())
            .unwrap_or_else(SystemTime::now);
        if let Some(l) = hdr_log.as_mut() {
            l.begin(
                started,
                &format!(
                    "memcg-trace {} on {}: interval histograms of the charging functions",
                    env!("CARGO_PKG_VERSION"),
                    kernel::release()
                ),
            );
        }
        // Watched from before the workload starts, and while privileged (debugfs is root's).
        let preemption_writes = preemption_model
            .contains("PREEMPT_DYNAMIC, running as")
            .then(kernel::ModelWrites::watch)
            .flatten();
        let collector = Collector::spawn(tracer, args.tick)?;
        let snapshots = collector.subscribe();
        let workload_cpu0 = memcg.as_ref().map(WorkloadCpu::start);
        let oom_kills0 = memcg.as_ref().and_then(Memcg::oom_kills);
        let child = match &memcg {
            Some(m) => {
                let mut cmd = m.command(&argv);
                if opts.dashboard {
                    cmd.stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null());
                }
                Some(
                    tokio::process::Command::from(cmd)
                        .spawn()
                        .map_err(|e| workload::cannot_run(&argv, e))?,
                )
            }
            None => None,
        };
        // Attached, and the workload started with the privileges it was given: from here on
        // only what polling, detaching and clean-up need.
        if opts.least_privilege {
            drop_privileges()?;
        }
        Ok(Session {
            inject_panic: std::env::var_os(INJECT_PANIC).is_some_and(|v| v == "1"),
            signals,
            collector: Some(collector),
            snapshots,
            memcg,
            workload_memcg,
            child,
            argv,
            exit_status: None,
            workload_cpu0,
            oom_kills0,
            oom_kills: None,
            workload_cpu: None,
            notes,
            failed,
            masks,
            off_cpu,
            reads,
            loader_btf_parsed,
            history: Default::default(),
            keep_history: true,
            floors,
            calibration,
            preemption_writes,
            preemption_written: Default::default(),
            preemption_model,
            preemption_changes: Vec::new(),
            started,
            startup,
            phases,
            cpu0,
            tick: args.tick,
            hdr_log,
        })
    }

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
