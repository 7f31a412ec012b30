//! What a session is started with: the probes and how to attach them, the live commands'
//! options, how chatty it is; and what it reports and how it ended.

use super::*;

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
    /// fentry and kprobe backends; costs a stack read and a counter update per call.
    #[arg(long)]
    pub callers: bool,
    /// Also count every call under the memcg it charges (read from the function's own
    /// argument, in every context; named by cgroup path), and tell the workload's calls the
    /// same way: those charging its memcg or one below it. Costs a few reads and a counter
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
