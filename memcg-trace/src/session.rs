//! One live trace, from the first moment to the last: signal handlers, privileges, the
//! workload's memcg, calibration, probe resolution and attach (with the reason for every probe
//! that could not be attached), the collector, the workload's process; and on the way out the
//! final figures, detach, memcg removal and the exit status. `record`, `top`, `bench` (and every
//! live command to come) are thin consumers of a `Session`; none reaches into another command.

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

/// Checks the capabilities tracing needs, naming the missing ones.
pub fn check_privileges() -> Result<()> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let has = |c: u32| cap_eff & (1 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .iter()
        .filter(|(c, _)| !has(*c))
        .map(|(_, n)| *n)
        .collect();
    bail!(
        "memcg-trace needs root, or CAP_BPF and CAP_PERFMON (missing: {}); run it with sudo",
        missing.join(", ")
    )
}

/// What a session keeps once its programs are attached and its workload started:
/// CAP_DAC_OVERRIDE, to write the recording where root could (a user's directory) and remove its
/// memcg and kprobe events; CAP_KILL, to stop a workload tree that changed its user. Polling the
/// maps, reading the programs' counts and detaching need no capability, except on kernels
/// before 5.19 with unprivileged BPF off, where CAP_BPF (or CAP_SYS_ADMIN) is kept too
/// ([`bpf_needs_caps`]).
pub const KEPT_CAPS: [caps::Capability; 2] = [
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_KILL,
];

/// Drops every capability but [`KEPT_CAPS`] for good: from the bounding set (where this process
/// may), the ambient, inheritable, effective and permitted sets; and sets no_new_privs, so no
/// later execve can give any back (not even to uid 0). Capabilities are per thread: this runs on
/// the session's only thread, and threads started later inherit the reduced sets.
pub fn drop_privileges() -> Result<()> {
    use caps::{CapSet, CapsHashSet};
    let permitted =
        caps::read(None, CapSet::Permitted).map_err(|e| anyhow!("read capabilities: {e}"))?;
    let unprivileged_bpf_off = fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled")
        .map(|v| v.trim() != "0")
        .unwrap_or(true);
    let bpf_needed = bpf_needs_caps(
        crate::kernel::version(&crate::kernel::release()),
        unprivileged_bpf_off,
    );
    let keep: CapsHashSet = KEPT_CAPS
        .iter()
        .copied()
        .chain(
            bpf_needed
                .then_some([caps::Capability::CAP_BPF, caps::Capability::CAP_SYS_ADMIN])
                .into_iter()
                .flatten(),
        )
        .filter(|c| permitted.contains(c))
        .collect();
    // Needs CAP_SETPCAP, which a service account may not have: then the bounding set stays
    // (it only limits what an execve could gain, and no_new_privs rules that out).
    if permitted.contains(&caps::Capability::CAP_SETPCAP) {
        for c in caps::all() {
            if !keep.contains(&c) {
                let _ = caps::drop(None, CapSet::Bounding, c);
            }
        }
    }
    let _ = caps::clear(None, CapSet::Ambient);
    caps::clear(None, CapSet::Inheritable).map_err(|e| anyhow!("drop capabilities: {e}"))?;
    caps::set(None, CapSet::Effective, &keep).map_err(|e| anyhow!("drop capabilities: {e}"))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(|e| anyhow!("drop capabilities: {e}"))?;
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        bail!("set no_new_privs: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether every bpf() command, map reads included, needs CAP_BPF or CAP_SYS_ADMIN on a
/// kernel of `version` where unprivileged BPF is off (Debian's default): before 5.19 the
/// syscall refused any command then (`kernel.unprivileged_bpf_disabled`), from 5.19 only the
/// creation of maps and programs. Seen on 5.10: the final read of the per-CPU state failed
/// with EPERM after the session dropped its capabilities. Unknown versions keep them.
pub fn bpf_needs_caps(version: Option<(u32, u32)>, unprivileged_bpf_off: bool) -> bool {
    unprivileged_bpf_off && version.is_none_or(|v| v < (5, 19))
}

/// How chatty attaching is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verbosity {
    /// Nothing on stderr.
    Quiet,
    /// One line per probe, and the reasons a preferred backend was refused.
    Normal,
}

/// A tracer with its probes attached, and what attaching found out.
pub struct Attached {
    /// The tracer, programs attached.
    pub tracer: Tracer,
    /// Resolution notes per attached probe, by name.
    pub notes: HashMap<String, Vec<String>>,
    /// The instrumentation floor of each latency backend in use.
    pub floors: Vec<Floor>,
    /// What could not be calibrated, one line each (shown, and refused by `--strict`).
    pub calibration: Vec<String>,
    /// How long each step took.
    pub phases: Vec<Phase>,
    /// The preemption model the programs were set for (`kernel::preemption_model`).
    pub preemption_model: String,
}

/// Times the steps of a start-up.
#[derive(Debug)]
struct Phases {
    last: Instant,
    done: Vec<Phase>,
}

impl Phases {
    fn new() -> Self {
        Phases {
            last: Instant::now(),
            done: Vec::new(),
        }
    }

    /// Ends the step `name`, begun when the previous one ended.
    fn end(&mut self, name: &str) {
        let now = Instant::now();
        self.done.push(Phase {
            name: name.into(),
            ns: (now - self.last).as_nanos() as u64,
            peak_rss_kib: peak_rss_kib(),
        });
        self.last = now;
    }
}

/// How to attach.
#[derive(Clone, Copy, Debug)]
pub struct AttachOptions {
    /// What attaching prints.
    pub verbosity: Verbosity,
    /// cgroup v2 id of the workload's cgroup (0: none).
    pub workload_cgroup: u64,
    /// memcg-trace created that cgroup and removes it only after detaching.
    pub workload_owned: bool,
    /// The depth of that cgroup below the v2 root (0: unknown).
    pub workload_level: u32,
    /// bpf stats on for the whole run.
    pub bpf_stats: bool,
    /// Fail when something could not be calibrated.
    pub strict: bool,
    /// What the programs do beyond timing calls (with `workload_memcg`, the caller then hands
    /// the tracer the workload's memcg, `Tracer::set_workload_memcg`).
    pub features: Features,
    /// Measure the instrumentation floor of each latency backend in use.
    pub floor: bool,
    /// Fail unless every probe named with `--probe` attaches (the default set is best
    /// effort: what this kernel has). `probes`, which reports, leaves this off.
    pub all_named: bool,
}

impl AttachOptions {
    /// Attach without a word, a workload, diagnostics, stats or floor.
    pub fn quiet() -> Self {
        AttachOptions {
            verbosity: Verbosity::Quiet,
            workload_cgroup: 0,
            workload_owned: false,
            workload_level: 0,
            bpf_stats: false,
            strict: false,
            floor: false,
            all_named: false,
            features: Features::default(),
        }
    }
}

/// Calls of the floor function per measurement batch.
const FLOOR_CALLS: u32 = 250;

/// Every kernel name resolution may ask about: all probes' candidates, their layout markers and
/// tracepoints, and the `--func` names.
fn interest(sel: &ProbeSel) -> HashSet<String> {
    let mut out: HashSet<String> = sel.func.iter().cloned().collect();
    for p in probes::PROBES {
        for c in p.candidates {
            out.insert(c.symbol.to_string());
            out.extend(c.requires.map(str::to_string));
        }
        out.extend(p.tracepoint.map(str::to_string));
        out.extend(p.caveat.as_ref().map(|c| c.unless.to_string()));
    }
    out
}

/// Turns `--probe`/`--func` into requests, with one clear error for unknown names.
pub fn requests(sel: &ProbeSel, syms: &Symbols) -> Result<Vec<Request>> {
    let mut out = Vec::new();
    let names: Vec<String> = if sel.probe.is_empty() && sel.func.is_empty() {
        if sel.all {
            probes::PROBES.iter().map(|p| p.name.to_string()).collect()
        } else {
            probes::default_probes()
                .iter()
                .map(|s| s.to_string())
                .collect()
        }
    } else {
        sel.probe.clone()
    };
    for n in names.iter().filter(|n| !n.is_empty()) {
        let p = probes::probe_def(n).ok_or_else(|| {
            anyhow!(
                "unknown probe {n:?}; valid probes: {}",
                probes::PROBES
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        if !out.contains(&Request::Probe(p)) {
            out.push(Request::Probe(p));
        }
    }
    for f in &sel.func {
        if !syms.btf_funcs.contains(f) && !syms.kallsyms.contains(f) {
            let hint = syms
                .clones
                .get(f)
                .map(|c| {
                    format!(
                        " (only compiler clones exist: {}; it is inlined)",
                        c.join(", ")
                    )
                })
                .unwrap_or_default();
            bail!("unknown function {f:?}: not in this kernel's BTF or kallsyms{hint}");
        }
        out.push(Request::Func(f.clone()));
    }
    if out.len() > MAX_PROBES {
        bail!(
            "{} probes requested; at most {MAX_PROBES} can be traced at once",
            out.len()
        );
    }
    Ok(out)
}

/// How each possible target of `reqs` (functions, by every backend; tracepoints) leads to the
/// memcg its calls charge, by (tracepoint?, target): from its first argument's struct, with this
/// kernel's offsets. Compiler clones (`foo.constprop.0`) are left out: their arguments may not
/// be the function's.
fn memcg_paths(
    btf: &btf_rs::Btf,
    reqs: &[Request],
    syms: &Symbols,
) -> HashMap<(bool, String), (String, memcg_trace_common::MemcgPath)> {
    let all = [Backend::Fentry, Backend::Kprobe, Backend::Tracepoint];
    let mut out = HashMap::new();
    for req in reqs {
        for plan in probes::resolve(req, &all, syms).plans {
            let tp = plan.backend == Backend::Tracepoint;
            let key = (tp, plan.target.clone());
            if out.contains_key(&key) || plan.target.contains('.') {
                continue;
            }
            let Some(arg) = kernel::first_arg_struct(btf, &plan.target, tp) else {
                continue;
            };
            if let Ok(path) = kernel::memcg_path(btf, &arg) {
                out.insert(key, (arg, path));
            }
        }
    }
    out
}

/// Resolves and attaches every request of `sel`: calibrates the context masks, loads the
/// programs, attaches each probe with the first backend that works, and measures the
/// instrumentation floor of each latency backend in use. Fails when nothing could be attached,
/// an explicitly requested function could not be, or (`strict`) calibration fell short.
pub fn attach(sel: &ProbeSel, o: AttachOptions) -> Result<Attached> {
    check_privileges()?;
    let mut phases = Phases::new();
    let stale = crate::tracer::kprobe::remove_stale();
    if stale > 0 && o.verbosity == Verbosity::Normal {
        eprintln!("memcg-trace: removed {stale} kprobe events of an earlier run");
    }

    let kernel = inspect_kernel(sel, &o.features, &mut phases)?;
    let (mut tracer, preemption, mut calibration) = load(&kernel, &o, &mut phases)?;
    if o.bpf_stats {
        // Before the first program is attached, so that the kernel counts every run.
        tracer.stats_for_the_whole_run()?;
    }

    let notes = attach_each(&mut tracer, sel, &kernel, &preemption, &o)?;
    if preemption.interleave
        && crate::tracer::Object::chosen()? == crate::tracer::Object::Legacy
        && tracer.attached.iter().any(|a| a.backend == Backend::Fentry)
    {
        calibration.push(
            "fentry with the eBPF object for kernels before 5.19, which claims its slots without atomics, where fentry programs can interleave on a CPU (a preemptible kernel, or no context split): a call may be paired with another's exit; --attach kprobe avoids it".into(),
        );
    }
    calibration.append(&mut tracer.calibration);
    phases.end("attach");

    let floors = if o.floor {
        let floors = measure_floors(&mut tracer, kernel.requests.len(), &mut calibration)?;
        phases.end("floor");
        floors
    } else {
        Vec::new()
    };

    for c in &calibration {
        if o.strict {
            bail!("calibration fell short (--strict): {c}");
        }
        if o.verbosity == Verbosity::Normal {
            eprintln!("memcg-trace: warning: {c}");
        }
    }
    Ok(Attached {
        tracer,
        notes,
        floors,
        calibration,
        phases: phases.done,
        preemption_model: preemption.model,
    })
}

/// What start-up reads of the kernel before loading anything: the offsets, the functions and
/// tracepoints there are, the probes requested as this kernel can have them.
struct KernelView {
    layout: kernel::Layout,
    /// Every name resolution may ask about (`interest`).
    interest: HashSet<String>,
    symbols: Symbols,
    requests: Vec<Request>,
    /// How to reach the charged memcg from each target's argument (with a memcg feature).
    memcg_paths: HashMap<(bool, String), (String, memcg_trace_common::MemcgPath)>,
    /// What this kernel's task clock leaves out (`kernel::task_clock_excludes`).
    task_clock_excludes: Option<&'static str>,
}

/// Reads the kernel's BTF and symbols (phases "btf" and "symbols"); the BTF is released
/// before returning.
fn inspect_kernel(sel: &ProbeSel, features: &Features, phases: &mut Phases) -> Result<KernelView> {
    let btf = kernel::open_btf()?;
    let layout = kernel::layout(&btf).context("reading kernel layout from BTF")?;
    phases.end("btf");

    stop_point("symbols")?;
    let interest = interest(sel);
    let symbols = Symbols::load(&btf, &interest)?;
    let requests = requests(sel, &symbols)?;
    let memcg_paths = if features.by_memcg || features.workload_memcg {
        memcg_paths(&btf, &requests, &symbols)
    } else {
        HashMap::new()
    };
    let task_clock_excludes = kernel::task_clock_excludes(&btf);
    phases.end("symbols");
    Ok(KernelView {
        layout,
        interest,
        symbols,
        requests,
        memcg_paths,
        task_clock_excludes,
    })
}

/// How this kernel preempts, and what that means for the programs.
struct Preemption {
    /// The preemption model (`kernel::preemption_model`).
    model: String,
    /// The kernel preempts tasks in kernel code.
    preemptible: bool,
    /// No context split on this kernel (no per-CPU offsets).
    no_split: bool,
    /// fentry programs can interleave on a CPU: a preemptible kernel, or, without the context
    /// split, interrupt calls sharing the task slots (kprobe programs never do). They are
    /// loaded and ordered as there.
    interleave: bool,
}

/// Calibrates the context masks (phase "masks") and loads the programs (phase "load"); says
/// what could not be calibrated.
fn load(
    kernel: &KernelView,
    o: &AttachOptions,
    phases: &mut Phases,
) -> Result<(Tracer, Preemption, Vec<String>)> {
    stop_point("masks")?;
    // The BTF (and, on kernels that cannot mmap it, its copy in memory) is gone before the
    // object is loaded.
    crate::tracer::release_freed_memory();
    let (layout, masks) = calibrate::masks(kernel.layout.clone());
    // What the calibration's load freed goes back to the system first, so that the tracer's
    // load does not stack on a heap left fragmented.
    crate::tracer::release_freed_memory();
    phases.end("masks");

    stop_point("load")?;
    let mut calibration = Vec::new();
    if masks.source != "calibrated" {
        calibration.push(format!("context masks: {}", masks.source));
    }
    let release = kernel::release();
    let model = kernel::preemption_model(kernel::config(&release).as_ref());
    let preemptible = kernel::preemptible(&model);
    let no_split = layout.no_context != 0;
    let preemption = Preemption {
        model,
        preemptible,
        no_split,
        interleave: preemptible || no_split,
    };
    let mut tracer = Tracer::load(
        &layout,
        &LoadOptions {
            workload_cgroup: o.workload_cgroup,
            workload_owned: o.workload_owned,
            workload_level: o.workload_level,
            // One more slot than requested: the floor is measured in it.
            probes: kernel.requests.len() as u32 + 1,
            preemptible: preemption.interleave,
            kernel_preemptible: preemptible,
            no_kprobes: !kernel.symbols.kprobes,
            features: o.features,
        },
        kernel.interest.iter().map(String::as_str),
    )?;
    tracer.masks = Some(masks);
    tracer.memcg_paths = kernel.memcg_paths.clone();
    tracer.task_clock_excludes = kernel.task_clock_excludes;
    if let Some(what) = kernel.task_clock_excludes {
        tracer.off_cpu.push_str(&format!(
            "; this kernel's task clock leaves out {what}: the {what} on a CPU while a task is away from it is not in its time off the CPU, which is then a lower bound (its time on the CPU, and the shares of CPU, upper bounds)"
        ));
    }
    phases.end("load");
    Ok((tracer, preemption, calibration))
}

/// Attaches each requested probe (stop points "attach-N"), saying which backend took it;
/// the resolution notes per probe attached. Fails where a probe named on the command line (or
/// any `--func`) cannot be traced, or where nothing could be.
fn attach_each(
    tracer: &mut Tracer,
    sel: &ProbeSel,
    kernel: &KernelView,
    preemption: &Preemption,
    o: &AttachOptions,
) -> Result<HashMap<String, Vec<String>>> {
    let mut notes = HashMap::new();
    for (i, req) in kernel.requests.iter().enumerate() {
        stop_point(&format!("attach-{i}"))?;
        let mut resolution = probes::resolve(
            req,
            sel.attach.order(preemption.interleave),
            &kernel.symbols,
        );
        if sel.attach == AttachMode::Auto {
            if preemption.preemptible {
                resolution.notes.push(probes::PREEMPTIBLE_NOTE.into());
            } else if preemption.no_split {
                resolution.notes.push(probes::NO_SPLIT_NOTE.into());
            }
        }

        if tracer.attach(req, &resolution) {
            let attached = tracer.attached.last().expect("just attached");
            if o.verbosity == Verbosity::Normal {
                eprintln!(
                    "memcg-trace: {} -> {} via {}",
                    attached.name, attached.target, attached.backend
                );
                for note in attached.notes.iter().filter(|n| {
                    n.starts_with(&format!("{}:", Backend::Fentry)) || n.contains(": Operation")
                }) {
                    eprintln!("memcg-trace:   ({note})");
                }
            }
            let mut said = attached.notes.clone();
            said.extend(feature_notes(attached, &o.features));
            notes.insert(attached.name.clone(), said);
            continue;
        }

        let failed = tracer.failed.last().expect("just failed");
        if matches!(req, Request::Func(_)) || (o.all_named && !sel.probe.is_empty()) {
            bail!(
                "cannot trace {}: {}",
                failed.name,
                failed.reasons.join("; ")
            );
        }
        if o.verbosity == Verbosity::Normal {
            eprintln!(
                "memcg-trace: {} not attached: {}",
                failed.name,
                failed.reasons.join("; ")
            );
        }
    }

    if tracer.attached.is_empty() {
        let why: Vec<String> = tracer
            .failed
            .iter()
            .map(|f| format!("{}: {}", f.name, f.reasons.join("; ")))
            .collect();
        bail!("no probe could be attached ({})", why.join(" | "));
    }
    Ok(notes)
}

/// What an attached probe's notes say of the features asked for: no call sites on a
/// counts-only backend, and where the charged memcg is read from (or why it is not).
fn feature_notes(attached: &crate::tracer::Attached, features: &Features) -> Vec<String> {
    let mut notes = Vec::new();
    if features.callers && !attached.backend.has_latency() {
        notes.push(format!(
            "--callers: no call sites with {} (a tracepoint has no caller of its own to read); use --attach fentry or kprobe",
            attached.backend
        ));
    }
    if !(features.by_memcg || features.workload_memcg) {
        return notes;
    }
    if let Some(arg) = attached.memcg_arg.as_ref() {
        notes.push(format!(
            "the charged memcg is read from its struct {arg} argument"
        ));
        return notes;
    }
    let mut why = vec![];
    if features.by_memcg {
        why.push("its calls are under memcg \"unknown\"");
    }
    if features.workload_memcg {
        why.push("the workload's calls are those its tasks make (by their cgroup v2 id: none in a v1 memcg)");
    }
    let because = if attached.target.contains('.') {
        format!(
            "{} is a compiler clone, whose arguments are not known",
            attached.target
        )
    } else {
        format!(
            "{} takes no mem_cgroup, obj_cgroup, lruvec, css or cgroup first",
            attached.target
        )
    };
    notes.push(format!(
        "the charged memcg is not read ({because}): {}",
        why.join("; ")
    ));
    notes
}

/// Measures the instrumentation floor of each latency backend attached, in the spare probe
/// slot after the `requested` ones (stop points "floor-BACKEND"); a floor that cannot be
/// measured is said in `calibration`.
fn measure_floors(
    tracer: &mut Tracer,
    requested: usize,
    calibration: &mut Vec<String>,
) -> Result<Vec<Floor>> {
    let mut backends: Vec<Backend> = tracer.attached.iter().map(|a| a.backend).collect();
    backends.sort();
    backends.dedup();
    let mut floors = Vec::new();
    for backend in backends.into_iter().filter(|b| b.has_latency()) {
        stop_point(&format!("floor-{backend}"))?;
        match tracer.measure_floor(backend, requested as u32, FLOOR_CALLS) {
            Ok(floor) => floors.push(floor),
            Err(e) => calibration.push(format!("{backend} floor: {e:#}")),
        }
    }
    Ok(floors)
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

/// The stop signals: SIGINT, SIGTERM and SIGHUP.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The stop signals this process was started with ignored, as a bit per signal number: `nohup`
/// ignores SIGHUP, and a shell without job control SIGINT for a command run with `&`. Those
/// stay ignored (a handler would undo what the user asked for, and one sent before it was in
/// place would be dropped by the kernel anyway). Read once, before any handler exists
/// ([`block_stop_signals`] with `true`): a process-wide fact, as dispositions are.
static IGNORED_AT_START: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether `sig` is one of the stop signals this process was started with ignored.
pub fn ignored_at_start(sig: libc::c_int) -> bool {
    IGNORED_AT_START.load(std::sync::atomic::Ordering::Relaxed) & (1 << sig) != 0
}

/// The stop signal that arrived (0: none yet), set by an action of its own beside the
/// runtime's ([`Signals::install`]). Start-up's long steps (attach, the floors) run without
/// await points, where the runtime cannot see a signal: they look here between their parts
/// ([`stop_point`]). A process-wide fact, as a signal's arrival is; never cleared: a process
/// that was asked to stop starts no further session (`bench`'s rounds end on a signal).
static STOPPED_BY: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The stop signal that arrived since the handlers were installed, if one did.
pub fn stop_requested() -> Option<i32> {
    match STOPPED_BY.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        s => Some(s),
    }
}

/// A point between two parts of start-up: held there by a test ([`HOLD_START`]), and ended
/// there with [`Interrupted`] if a stop signal came.
fn stop_point(point: &str) -> Result<()> {
    hold_start(point);
    match stop_requested() {
        Some(s) => Err(Interrupted(s).into()),
        None => Ok(()),
    }
}

/// Registers, once per process, the actions that note a stop signal in [`STOPPED_BY`], for the
/// stop signals not ignored at start (an action would install a handler, undoing the ignore).
fn note_stop_signals() -> Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        for sig in STOP_SIGNALS.into_iter().filter(|s| !ignored_at_start(*s)) {
            // SAFETY: the action only stores to an atomic, which is async-signal-safe.
            unsafe {
                signal_hook_registry::register(sig, move || {
                    STOPPED_BY.store(sig, std::sync::atomic::Ordering::Relaxed)
                })
            }
            .map_err(|e| format!("a handler for signal {sig}: {e}"))?;
        }
        Ok(())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// The nice value of the daemon's thread during start-up (`StartupPriority`).
pub const STARTUP_NICE: i32 = -10;

/// The daemon's priority raised to [`STARTUP_NICE`] while it starts (loading, calibration,
/// attach and the floors: about half a second on hardware, many CPU-bound steps), and put back
/// when dropped, before the workload is started (which would inherit it). Beside a benchmark
/// that already keeps every CPU busy, start-up at its usual priority gets the share of one
/// runnable task among them all: under emulation, beside a 10-task hackbench loop on 2 CPUs,
/// attaching took 62-67 s at nice 0 and 12 s at nice -10 (7 s alone). Only the thread that starts (the runtime's only one); nothing
/// is changed where the priority is at least as high already or cannot be raised.
struct StartupPriority {
    was: Option<i32>,
}

impl StartupPriority {
    fn raise() -> Self {
        // SAFETY: getpriority and setpriority of the calling thread (`who` 0) take and return
        // plain integers; errno is this thread's.
        let was = unsafe {
            *libc::__errno_location() = 0;
            let was = libc::getpriority(libc::PRIO_PROCESS, 0);
            // (-1 is a nice value too: an error only where errno says so.)
            let failed = was == -1 && *libc::__errno_location() != 0;
            if failed || was <= STARTUP_NICE {
                None
            } else if libc::setpriority(libc::PRIO_PROCESS, 0, STARTUP_NICE) == 0 {
                Some(was)
            } else {
                None
            }
        };
        StartupPriority { was }
    }
}

impl Drop for StartupPriority {
    fn drop(&mut self) {
        if let Some(was) = self.was.take() {
            // SAFETY: as in `raise`.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, was) };
        }
    }
}

/// Records which stop signals are ignored now (before any handler of ours exists).
fn note_ignored() {
    let mut bits = 0u64;
    for sig in STOP_SIGNALS {
        // SAFETY: a query (no new action): sigaction writes the current one to `old`.
        let ignored = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
        };
        if ignored {
            bits |= 1 << sig;
        }
    }
    IGNORED_AT_START.store(bits, std::sync::atomic::Ordering::Relaxed);
}

/// Blocks (`true`) or unblocks the stop signals in the calling thread. `cli::main` blocks them
/// first of all, before any thread exists (threads inherit the mask; children get an empty one
/// from std's spawn), and a session unblocks them once its handlers and their actions are in
/// place: a stop signal that comes meanwhile waits in the kernel and is delivered then, never
/// dropped. (Installing a handler is not atomic: signal-hook-registry, under tokio, sets the
/// OS handler before it registers the action, and a signal in between reached no action: a
/// SIGINT at start-up was lost and the whole workload traced.) The commands that have no
/// session unblock them at once.
pub fn block_stop_signals(block: bool) {
    if block {
        note_ignored();
    }
    // SAFETY: sigset_t is a plain bit set that sigemptyset initialises; pthread_sigmask only
    // reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in STOP_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        // Fails only for an invalid `how`.
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Test-only switch: a directory; start-up stops at each point named by a file `<point>.hold`
/// there (file `<point>.held` written) until `<point>.go` exists or a stop signal has been
/// noted ([`stop_requested`]; 60 s at most), so that a
/// test sends its signal inside the window every time. Points: `before-handlers` (signals
/// blocked, no handler yet), `before-unblock` (handlers and actions in place, signals still
/// blocked), and the [`stop_point`]s of attaching: `symbols`, `masks`, `load`, `attach-N`
/// (before the Nth probe), `floor-BACKEND`.
pub const HOLD_START: &str = "MEMCG_TRACE_TEST_HOLD_START";

/// Holds start-up at `point` where [`HOLD_START`] asks for it.
fn hold_start(point: &str) {
    let Some(dir) = std::env::var_os(HOLD_START).map(PathBuf::from) else {
        return;
    };
    if !dir.join(format!("{point}.hold")).exists() {
        return;
    }
    let _ = fs::write(dir.join(format!("{point}.held")), b"");
    let go = dir.join(format!("{point}.go"));
    let t0 = Instant::now();
    // A stop signal noted ends the hold too: a test waits for that, not for a moment.
    while !go.exists() && stop_requested().is_none() && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A stream of the stop signal `sig`, or none where the process was started with it ignored
/// ([`ignored_at_start`]).
pub fn listen(sig: libc::c_int, kind: SignalKind) -> Result<Option<Signal>> {
    Ok(if ignored_at_start(sig) {
        None
    } else {
        Some(signal(kind)?)
    })
}

/// The next signal of `s`; never, for a signal not listened to.
pub async fn next_of(s: &mut Option<Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// SIGINT, SIGTERM and SIGHUP, listened to from the first moment of a session; none for a
/// signal the process was started with ignored ([`ignored_at_start`]).
struct Signals(Option<Signal>, Option<Signal>, Option<Signal>);

impl Signals {
    /// Installs the handlers, then unblocks the signals (blocked since `cli::main` began):
    /// one that arrived before is delivered now, to a handler with its action.
    fn install() -> Result<Signals> {
        hold_start("before-handlers");
        let s = Signals(
            listen(libc::SIGINT, SignalKind::interrupt())?,
            listen(libc::SIGTERM, SignalKind::terminate())?,
            listen(libc::SIGHUP, SignalKind::hangup())?,
        );
        note_stop_signals()?;
        hold_start("before-unblock");
        block_stop_signals(false);
        Ok(s)
    }

    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = next_of(&mut self.0) => libc::SIGINT,
            _ = next_of(&mut self.1) => libc::SIGTERM,
            _ = next_of(&mut self.2) => libc::SIGHUP,
        }
    }

    /// A signal that already arrived, without waiting. Start-up runs without await points, so
    /// the runtime's signal driver has not read the signals that came meanwhile: a yield lets
    /// it (tokio wakes a yielded task only after polling its drivers).
    async fn pending(&mut self) -> Option<i32> {
        tokio::task::yield_now().await;
        self.recv().now_or_never()
    }
}

/// Test-only switch: a session with this variable set panics at its first tick.
pub const INJECT_PANIC: &str = "MEMCG_TRACE_INJECT_PANIC";

/// The error a session start ends with when a stop signal arrives before tracing began.
#[derive(Debug)]
pub struct Interrupted(pub i32);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped by signal {} before tracing began", self.0)
    }
}

impl std::error::Error for Interrupted {}

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
                workload_level: memcg.as_ref().map_or(0, |m| m.cgroup_level),
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

/// The exit status a command returns when start-up was interrupted by a signal, if that was
/// the error.
pub fn interrupted_exit_code(e: &anyhow::Error) -> Option<i32> {
    e.downcast_ref::<Interrupted>().map(|i| 128 + i.0)
}

fn rusage() -> libc::rusage {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    }
}

/// The CPU clocks a workload's CPU time is read from, at its start.
#[derive(Debug)]
struct WorkloadCpu {
    /// Its memcg, where that is a cgroup v2 one, and the cgroup's usage then, ns.
    cgroup: Option<(PathBuf, u64)>,
    /// The CPU time of this process's reaped children then (`RUSAGE_CHILDREN`), where the
    /// workload is the only one and alone in its memcg.
    children: Option<Duration>,
}

impl WorkloadCpu {
    fn start(m: &workload::Memcg) -> Self {
        WorkloadCpu {
            cgroup: (m.cgroup_id != 0)
                .then(|| cgroup_usage_ns(&m.path).map(|u| (m.path.clone(), u)))
                .flatten(),
            // In a v1 memcg given with --cgroup, other tasks charge it too: their CPU time is
            // not ours to read.
            children: m.owned().then(children_cpu_time),
        }
    }

    /// CPU time used since the start, and its source. `reaped`: the workload has been
    /// waited for (its tree's rusage is in this process's children's).
    fn used(&self, reaped: bool) -> Option<(u64, String)> {
        if let Some((dir, u0)) = &self.cgroup {
            if let Some(u) = cgroup_usage_ns(dir) {
                return Some((
                    u.saturating_sub(*u0),
                    "its cgroup's cpu.stat usage_usec".into(),
                ));
            }
        }
        let c0 = self.children.filter(|_| reaped)?;
        Some((
            children_cpu_time().saturating_sub(c0).as_nanos() as u64,
            "the rusage of its process tree".into(),
        ))
    }
}

/// A cgroup v2 directory's CPU usage (`cpu.stat` usage_usec, kept for every cgroup), ns.
fn cgroup_usage_ns(dir: &std::path::Path) -> Option<u64> {
    let s = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|us| us.saturating_mul(1000))
}

/// User + system CPU time of this process's children that were waited for.
fn children_cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// User + system CPU time of this process so far (the workload, a child, is not included).
pub fn cpu_time() -> Duration {
    let u = rusage();
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Peak resident set size of this process, KiB.
pub fn peak_rss_kib() -> u64 {
    rusage().ru_maxrss as u64
}

#[cfg(test)]
mod caps_tests {
    use super::bpf_needs_caps;

    #[test]
    fn map_reads_need_capabilities_only_before_5_19_with_unprivileged_bpf_off() {
        assert!(bpf_needs_caps(Some((5, 10)), true));
        assert!(bpf_needs_caps(Some((5, 18)), true));
        assert!(!bpf_needs_caps(Some((5, 19)), true));
        assert!(!bpf_needs_caps(Some((6, 1)), true));
        assert!(!bpf_needs_caps(Some((5, 10)), false));
        // A release that cannot be read keeps them.
        assert!(bpf_needs_caps(None, true));
    }
}
