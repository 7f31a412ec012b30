//! Start-up: the steps of [`Session::start`], from the signal handlers to the workload's
//! first instruction (`Prepared::new`, `Prepared::attach`, `Session::begin`).

use super::*;

/// Spawns the workload `argv` inside memcg `m`; with the dashboard, without the terminal.
fn spawn_in(m: &Memcg, argv: &[String], dashboard: bool) -> Result<tokio::process::Child> {
    let mut cmd = m.command(argv);
    if dashboard {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    }
    tokio::process::Command::from(cmd)
        .spawn()
        .map_err(|e| workload::cannot_run(argv, e))
}

/// What start-up makes before any program is loaded: the first steps of [`Session::start`].
/// (Its fields are dropped in this order on a failed start: the workload's memcg removed
/// first, the signal handlers last, as when they were the start-up's locals.)
struct Prepared {
    phases: Vec<Phase>,
    workload_memcg: bool,
    memcg: Option<Memcg>,
    argv: Vec<String>,
    hdr_log: Option<HdrLog>,
    /// Raised for start-up; set back (dropped) once every program is attached.
    priority: Option<StartupPriority>,
    signals: Signals,
    t0: Instant,
}

impl Prepared {
    /// Signal handlers, the privileges checked, the start-up priority raised, the interval
    /// log's file and the workload's memcg created.
    fn new(args: &LiveArgs, opts: &Options) -> Result<Prepared> {
        let t0 = Instant::now();
        let signals = Signals::install()?;
        check_privileges()?;
        let priority = Some(StartupPriority::raise());

        // Before anything is created: a path that cannot be written fails here.
        let hdr_log = args.hdr_log.as_deref().map(HdrLog::create).transpose()?;
        let argv = args.argv()?;
        let memcg = if argv.is_empty() {
            None
        } else {
            Some(workload::prepare(args.cgroup.as_deref(), opts.dashboard)?)
        };
        let phases = vec![phase("memcg", t0)];
        let workload_memcg = workload_told_by_memcg(args, memcg.as_ref());
        Ok(Prepared {
            phases,
            workload_memcg,
            memcg,
            argv,
            hdr_log,
            priority,
            signals,
            t0,
        })
    }

    /// The programs loaded and attached (calibration and the floors with them), the
    /// workload's memcg given to them, `extra`'s programs attached; then start-up's priority
    /// set back.
    fn attach(
        &mut self,
        args: &LiveArgs,
        opts: &Options,
        extra: impl FnOnce(&mut Tracer) -> Result<()>,
    ) -> Result<Attached> {
        let memcg = self.memcg.as_ref();
        let mut attached = attach(
            &args.sel,
            attach_options(args, opts, memcg, self.workload_memcg),
        )?;
        if let Some(m) = memcg.filter(|_| self.workload_memcg) {
            attached.tracer.set_workload_memcg(&m.path)?;
        }

        self.phases.append(&mut attached.phases);
        let t_extra = Instant::now();
        extra(&mut attached.tracer)?;
        attached.tracer.done_attaching();

        // Back to its own priority before the workload starts.
        self.priority = None;
        self.phases.push(phase("extra", t_extra));
        Ok(attached)
    }
}

/// The workload's process, started in its memcg, and what it is measured from.
struct StartedWorkload {
    child: Option<tokio::process::Child>,
    /// Its memcg's CPU time before it started.
    cpu0: Option<WorkloadCpu>,
    /// Its memcg's OOM kills before it started.
    oom_kills0: Option<u64>,
}

/// Starts the workload `argv` in `memcg` (none without one), its CPU time and OOM kills
/// read first.
fn start_workload(
    memcg: Option<&Memcg>,
    argv: &[String],
    dashboard: bool,
) -> Result<StartedWorkload> {
    let cpu0 = memcg.map(WorkloadCpu::start);
    let oom_kills0 = memcg.and_then(Memcg::oom_kills);
    let child = memcg.map(|m| spawn_in(m, argv, dashboard)).transpose()?;
    Ok(StartedWorkload {
        child,
        cpu0,
        oom_kills0,
    })
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
        let mut prepared = Prepared::new(args, &opts)?;
        not_stopped(&mut prepared.signals).await?;

        let attached = prepared.attach(args, &opts, extra)?;
        not_stopped(&mut prepared.signals).await?;

        Session::begin(args, &opts, prepared, attached)
    }

    /// The last step of [`Session::start`]: the collector, then the workload, then the
    /// privileges dropped.
    fn begin(
        args: &LiveArgs,
        opts: &Options,
        prepared: Prepared,
        attached: Attached,
    ) -> Result<Session> {
        let Prepared {
            t0,
            signals,
            mut hdr_log,
            argv,
            memcg,
            workload_memcg,
            phases,
            ..
        } = prepared;
        let Attached {
            tracer,
            notes,
            floors,
            calibration,
            preemption_model,
            // Already in `prepared.phases` (`Prepared::attach` moved them there).
            phases: _,
        } = attached;
        let said = TracerSaid::of(&tracer);
        let startup = t0.elapsed();
        let cpu0 = cpu_time();

        // When the first probe was attached: the zero of every snapshot's elapsed time, so
        // that the recording's start + duration and the interval log's timestamps are right.
        let started = SystemTime::now()
            .checked_sub(tracer.elapsed())
            .unwrap_or_else(SystemTime::now);
        if let Some(l) = hdr_log.as_mut() {
            begin_interval_log(l, started);
        }

        // Watched from before the workload starts, and while privileged (debugfs is root's).
        let preemption_writes = kernel::ModelWrites::watch_where_dynamic(&preemption_model);

        let collector = Collector::spawn(tracer, args.tick)?;
        let snapshots = collector.subscribe();
        let started_workload = start_workload(memcg.as_ref(), &argv, opts.dashboard)?;

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
            child: started_workload.child,
            argv,
            exit_status: None,
            workload_cpu0: started_workload.cpu0,
            oom_kills0: started_workload.oom_kills0,
            oom_kills: None,
            workload_cpu: None,
            notes,
            failed: said.failed,
            masks: said.masks,
            off_cpu: said.off_cpu,
            reads: said.reads,
            loader_btf_parsed: said.loader_btf_parsed,
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
}

/// Whether the workload's calls are told by the memcg they charge (in every context): with
/// --by-memcg, for a memcg given with --cgroup (which others may charge too: a database's),
/// and where its tasks have no cgroup v2 id to be told by; else, for the fresh memcg only its
/// own tasks charge, they are the task-context calls its tasks make (the cheaper test). False
/// without a workload.
fn workload_told_by_memcg(args: &LiveArgs, memcg: Option<&Memcg>) -> bool {
    let cgid = memcg.map(|m| m.cgroup_id).unwrap_or(0);
    memcg.is_some() && (args.by_memcg || args.cgroup.is_some() || cgid == 0)
}

/// How a live trace attaches: the workload's cgroup (id, whether memcg-trace made it, its
/// depth), the command line's features, a floor measured, every probe named.
fn attach_options(
    args: &LiveArgs,
    opts: &Options,
    memcg: Option<&Memcg>,
    workload_memcg: bool,
) -> AttachOptions {
    AttachOptions {
        verbosity: opts.verbosity,
        workload_cgroup: memcg.map(|m| m.cgroup_id).unwrap_or(0),
        workload_owned: memcg.is_some_and(|m| m.owned()),
        workload_level: memcg.map(|m| m.cgroup_level).unwrap_or_default(),
        bpf_stats: args.bpf_stats,
        strict: args.strict,
        floor: true,
        all_named: true,
        features: args.features(workload_memcg),
    }
}

/// The interval log's header: its start (when the first probe was attached) and what it holds.
fn begin_interval_log(l: &mut HdrLog, started: SystemTime) {
    l.begin(
        started,
        &format!(
            "memcg-trace {} on {}: interval histograms of the charging functions",
            env!("CARGO_PKG_VERSION"),
            kernel::release()
        ),
    );
}

/// A step of start-up that began at `since` and ends now.
fn phase(name: &str, since: Instant) -> Phase {
    Phase {
        name: name.into(),
        ns: since.elapsed().as_nanos() as u64,
        peak_rss_kib: peak_rss_kib(),
    }
}

/// Ends start-up with [`Interrupted`] if a stop signal came (between its steps).
async fn not_stopped(signals: &mut Signals) -> Result<()> {
    match signals.pending().await {
        Some(s) => Err(Interrupted(s).into()),
        None => Ok(()),
    }
}

/// What the tracer says of itself at start-up that the session keeps after the tracer went to
/// the collector.
struct TracerSaid {
    failed: Vec<NotAttached>,
    masks: Option<kernel::ContextMasks>,
    off_cpu: String,
    reads: String,
    loader_btf_parsed: Option<String>,
}

impl TracerSaid {
    fn of(tracer: &Tracer) -> Self {
        TracerSaid {
            failed: tracer.failed.clone(),
            masks: tracer.masks.clone(),
            off_cpu: tracer.off_cpu.clone(),
            reads: tracer.reads.clone(),
            loader_btf_parsed: tracer.loader_btf.clone(),
        }
    }
}
