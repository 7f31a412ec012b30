//! The kernel side, seen from userspace: loads the eBPF object (one loader set-up for every
//! use), attaches one program pair per probe with the requested backend (falling back in `auto`
//! mode, with the reason), and reads what the programs counted into a `Snapshot`: the shared
//! arrays through a memory mapping, the deferred pairs from the ring buffer (confirmed against
//! the kernel's recursion counters), the programs' own statistics from /proc. Dropping the
//! `Tracer` detaches every program.
//!
//! Here: the `Tracer` and its loading. Its parts: `load` (the object, options and features,
//! programs loaded and unloaded), `attach` (probes attached and detached, the switch witness,
//! the workload's memcg), `read` (a tick's snapshot).

mod attach;
pub mod checks;
pub mod deferred;
pub mod kbtf;
pub mod kprobe;
mod load;
pub mod patch;
pub mod proginfo;
mod read;
pub mod shared;

use std::{
    collections::HashMap,
    error::Error,
    fs,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    time::Instant,
};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{
    maps::{MapData, RingBuf},
    programs::Program,
    Btf, Ebpf,
};
use aya_log::EbpfLogger;
use memcg_trace_common::{
    breakdown_shards, cell, front_entries, names, workload_cell, workload_contexts, CallerKey,
    CallerStat, Cell, Config, Deferred, FrontSlot, HeldSwitches, KernelLayout, MemcgKey, MemcgPath,
    StackKey, CTX_TASK, MAX_CALLERS, MAX_MEMCGS, MAX_STACKS, MAX_WORKLOAD_MEMCGS,
    MEMCG_IN_WORKLOAD, NUM_CTX, STACK_DEPTH, TP_CELLS,
};

use self::{
    deferred::{monotonic_ns, Mark, Verifier},
    kprobe::KprobeEvent,
    shared::Shared,
};
pub use crate::model::NotAttached;
use crate::{
    probes::{Backend, Plan, Request, Resolution},
    snapshot::{CtxStats, HistData, ProbeStats, ProgCost, Snapshot},
};

/// The eBPF object built by build.rs from memcg-trace-ebpf.
pub use self::load::*;
use self::read::*;

/// An error chain on one line.
pub fn chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let t = x.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        src = x.source();
    }

    let s = text.replace('\n', " ");
    let s = s.trim();

    // aya appends the verifier log, which is empty when the kernel refuses before verifying.
    s.strip_suffix("Verifier output:")
        .unwrap_or(s)
        .trim_end()
        .to_string()
}

/// Possible CPUs: the per-CPU regions of the shared arrays.
pub fn possible_cpus() -> usize {
    aya::util::nr_cpus().unwrap_or(1).max(1)
}

/// A probe that is attached.
#[derive(Debug, Clone)]
pub struct Attached {
    /// Slot in the eBPF maps.
    pub slot: u32,
    /// Display name.
    pub name: String,
    /// Function or tracepoint.
    pub target: String,
    /// Backend used.
    pub backend: Backend,
    /// Why earlier backends were not used, and other resolution notes.
    pub notes: Vec<String>,
    /// Names of the programs in the object, entry first.
    pub programs: Vec<&'static str>,
    /// The struct of the argument the charged memcg is read from, when it is read.
    pub memcg_arg: Option<String>,
    /// When its window opened: its calls are counted from then on.
    pub opened: Instant,
}

/// Whether two targets are one function: a compiler's clone (`f.part.0`, `f.isra.0`, `f.cold`)
/// is its function's.
fn same_function(a: &str, b: &str) -> bool {
    let base = |t: &str| t.split('.').next().unwrap_or(t).to_string();
    base(a) == base(b)
}

/// The switch witness (`HeldSwitches`), attached for the kprobe slots whose deferred pairs it
/// proves.
#[derive(Debug)]
struct Witness {
    /// Probe slots proven by it.
    slots: Vec<u32>,
}

/// The workload's memcg (`Config::workload_memcg`): its directory, the set of its subtree's
/// ids the programs read, and the ids put in that set so far (see `update_workload_memcgs`).
type WorkloadMemcgs = (
    std::path::PathBuf,
    aya::maps::HashMap<MapData, u64, u8>,
    std::collections::HashSet<u64>,
);

/// The loaded programs, their attachments and what they share with userspace.
pub struct Tracer {
    ebpf: Ebpf,
    /// What attaching needs of the kernel's BTF (`kbtf::attach_btf`), while probes are being
    /// attached; released afterwards.
    btf: Option<Btf>,
    /// Why the loader parsed the kernel's BTF in full (None: it did not).
    pub loader_btf: Option<String>,
    /// Attached probes, by slot.
    pub attached: Vec<Attached>,
    /// Probes that failed.
    pub failed: Vec<NotAttached>,
    /// The preempt_count masks the programs were loaded with.
    pub masks: Option<crate::kernel::ContextMasks>,
    /// The programs count every call in context 0 (no per-CPU offsets on this kernel).
    no_context_split: bool,
    /// How the programs tell the time a task call spent off the CPU (`kernel::off_cpu_source`).
    pub off_cpu: String,
    /// How the programs read the kernel (`kernel::reads_of`).
    pub reads: String,
    /// What the kernel leaves out of its task clock (`kernel::task_clock_excludes`): then a
    /// call's time off the CPU is a lower bound (`CtxStats::off_cpu_at_least`).
    pub task_clock_excludes: Option<&'static str>,
    /// Programs attached besides the probes (the bench floors).
    extra: Vec<&'static str>,
    /// What could not be set up as planned, one line each.
    pub calibration: Vec<String>,
    started: Instant,
    /// When the windows closed (`finish`): the end of every probe's window.
    ended: Option<Instant>,
    /// Whether task-context calls of a workload cgroup are counted apart.
    workload: bool,
    /// Cells per (cpu, probe) of the workload cells (`workload_contexts`).
    workload_contexts: u32,
    /// The workload's memcg, whose subtree's ids the programs tell the workload by
    /// (`Config::workload_memcg`), and that set, kept up to date each snapshot.
    workload_memcg: Option<WorkloadMemcgs>,
    /// How to reach the charged memcg, by (tracepoint?, target): (argument struct, path). Set
    /// before attaching with `--by-memcg` or when the workload is told by its memcg.
    pub memcg_paths: HashMap<(bool, String), (String, MemcgPath)>,
    /// Calls per charged memcg (`--by-memcg`): the map, read through the map syscalls, and its
    /// front slots.
    memcgs: Option<read::Breakdown<MemcgKey>>,
    /// Names (cgroup paths) of the memcgs seen.
    memcg_names: crate::memcgs::Names,
    /// Sampled short stacks (`--callers-depth`), read through the map syscalls.
    stacks: Option<aya::maps::HashMap<MapData, StackKey, u64>>,
    /// One entry in this many per CPU has its stack sampled.
    stack_sample: u32,
    /// Frames of a stack shown, the call site included.
    stack_shown: u32,
    cpus: usize,
    probes: u32,
    /// `offsetof(struct bpf_prog_stats, misses)` (0: unknown).
    misses_offset: u64,
    /// Why the programs cannot reach their per-CPU miss counters whatever their address
    /// (arm64 without `__per_cpu_start`), if so.
    misses_unreachable: Option<String>,
    cells: Shared<Cell>,
    workload_cells: Shared<Cell>,
    /// The switch witness's counts, per CPU (`HeldSwitches`).
    held_switches: Shared<HeldSwitches>,
    /// The CPUs' states (`CPU_STATE`): the entries counted there, the tracepoints' per-CPU
    /// hits, the calls pending at the end.
    states: Shared<memcg_trace_common::CpuState>,
    /// How the deferred pairs of kprobe slots are proven on a kernel that counts no kprobe
    /// program misses (`HeldSwitches`): None until a kprobe slot that defers is attached.
    witness: Option<Witness>,
    /// Whether the programs can read `bpf_prog_active` (`KernelLayout::prog_active`).
    prog_active_known: bool,
    /// The kernel preempts: kprobe task calls that left the CPU are deferred
    /// (`Config::kprobe_defers`).
    kprobe_defers: bool,
    /// The tracepoint programs count their hits in the CPUs' states (`Config::tp_percpu`),
    /// read word by word from their mapping once a snapshot (only on kernels without
    /// kprobes: see `Config::tp_percpu`).
    tp_percpu: bool,
    ring: RingBuf<MapData>,
    verifier: Verifier,
    /// Timed calls per call site (`--callers`): the map, read through the map syscalls (a hash
    /// map cannot be mapped), and its front slots: see `Tracer::sites`.
    callers: Option<read::Breakdown<CallerKey>>,
    /// Names of the call sites seen.
    names: crate::callers::Names,
    /// Duplicates of the attached programs' fds: they keep the kernel's run statistics readable
    /// after the programs are detached, so the final figures cover every run.
    prog_fds: HashMap<&'static str, OwnedFd>,
    /// tracefs kprobe events, by program name; dropping one removes it.
    kprobes: HashMap<&'static str, KprobeEvent>,
    /// The kernel's last counts of the kprobe events removed (kretprobe, hits, misses), by
    /// program name: the final figures are read after the detach.
    kprobes_closed: HashMap<&'static str, (bool, u64, u64)>,
    /// The programs' diagnostics, when `--ebpf-log` asked for them.
    logger: Option<EbpfLogger<StderrLog>>,
    /// Keeps kernel bpf stats on while it is open (BPF_ENABLE_STATS).
    stats: Option<OwnedFd>,
    /// Stats stay on for the whole run (`--bpf-stats`).
    stats_always: bool,
    /// Which build of the fentry/fexit programs fentry probes attach (`fentry_build`).
    fentry_build: FentryBuild,
}

/// The hash map `name` of the object, taken out of it where the feature that fills it is on
/// (`wanted`); `what` names it in errors.
fn take_hash<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &str,
    wanted: bool,
    what: &str,
) -> Result<Option<aya::maps::HashMap<MapData, K, V>>> {
    if !wanted {
        return Ok(None);
    }

    let m = ebpf
        .take_map(name)
        .ok_or_else(|| anyhow!("map {name} missing"))?;
    Ok(Some(
        aya::maps::HashMap::try_from(m).context(what.to_string())?,
    ))
}

/// The arrays the programs share with userspace, mapped: the cells, the workload's cells (of
/// `workload_contexts` per CPU and probe slot), the switch witness's counts and the CPUs'
/// states.
fn map_shared_arrays(
    ebpf: &Ebpf,
    cpus: usize,
    probes: usize,
    workload_contexts: usize,
) -> Result<SharedArrays> {
    let map = |name: &str| {
        ebpf.map(name)
            .ok_or_else(|| anyhow!("map {name} missing from the object"))
    };
    Ok(SharedArrays {
        cells: Shared::new(
            names::MAP_CELLS,
            map(names::MAP_CELLS)?,
            cpus * probes * NUM_CTX,
        )?,
        workload_cells: Shared::new(
            names::MAP_WORKLOAD_CELLS,
            map(names::MAP_WORKLOAD_CELLS)?,
            cpus * probes * workload_contexts,
        )?,
        held_switches: Shared::new(
            names::MAP_HELD_SWITCHES,
            map(names::MAP_HELD_SWITCHES)?,
            cpus,
        )?,
        states: Shared::new(names::MAP_CPU_STATE, map(names::MAP_CPU_STATE)?, cpus)?,
    })
}

/// What `map_shared_arrays` maps (see the `Tracer` fields of the same names).
struct SharedArrays {
    cells: Shared<Cell>,
    workload_cells: Shared<Cell>,
    held_switches: Shared<HeldSwitches>,
    states: Shared<memcg_trace_common::CpuState>,
}

/// The optional breakdowns' maps, taken out of the object where their feature is on, and the
/// names they are shown by.
struct Breakdowns {
    callers: Option<read::Breakdown<CallerKey>>,
    names: crate::callers::Names,
    memcgs: Option<read::Breakdown<MemcgKey>>,
    memcg_names: crate::memcgs::Names,
    stacks: Option<aya::maps::HashMap<MapData, StackKey, u64>>,
}

impl Breakdowns {
    /// Takes them from `ebpf`; why call sites are shown as addresses goes to `calibration`.
    fn take(
        ebpf: &mut Ebpf,
        opts: &LoadOptions,
        front: FrontSizes,
        calibration: &mut Vec<String>,
    ) -> Result<Self> {
        let features = &opts.features;

        // The kernel's symbols are copied now, while they can be read.
        let names = if features.callers {
            let (n, why) = crate::callers::Names::new();
            if let Some(why) = why {
                calibration.push(format!("--callers: call sites shown as addresses: {why}"));
            }
            n
        } else {
            Default::default()
        };
        let callers = read::Breakdown::take(
            ebpf,
            names::MAP_CALLERS,
            names::MAP_CALLER_FRONT,
            features.callers,
            front,
        )
        .context("the call sites")?;
        let memcgs = read::Breakdown::take(
            ebpf,
            names::MAP_MEMCGS,
            names::MAP_MEMCG_FRONT,
            features.by_memcg,
            front,
        )
        .context("the memcgs")?;
        let stacks = take_hash(
            ebpf,
            names::MAP_STACKS,
            features.callers && features.stack_depth > 0,
            "the short stacks",
        )?;
        let memcg_names = if features.by_memcg {
            crate::memcgs::Names::new()
        } else {
            Default::default()
        };
        Ok(Breakdowns {
            callers,
            names,
            memcgs,
            memcg_names,
            stacks,
        })
    }
}

/// The eBPF log's reader (`--ebpf-log`), or none.
fn ebpf_logger(ebpf: &mut Ebpf, on: bool) -> Result<Option<EbpfLogger<StderrLog>>> {
    if !on {
        return Ok(None);
    }

    let logger =
        EbpfLogger::init_with_logger(ebpf, StderrLog).map_err(|e| anyhow!("eBPF log: {e}"))?;
    Ok(Some(logger))
}

/// The ring buffer the programs hand deferred pairs to userspace through.
fn deferred_ring(ebpf: &mut Ebpf) -> Result<RingBuf<MapData>> {
    let map = ebpf
        .take_map(names::MAP_DEFERRED)
        .ok_or_else(|| anyhow!("map {} missing", names::MAP_DEFERRED))?;
    RingBuf::try_from(map).context("the ring buffer of deferred pairs")
}

/// Why the programs' recursion-miss counters cannot be read here, or None.
fn misses_unreachable(layout: &KernelLayout) -> Option<String> {
    (layout.arch == memcg_trace_common::ARCH_ARM64 && layout.percpu_start == 0).then(|| {
        "arm64: __per_cpu_start is not in kallsyms (kptr_restrict hides addresses), so no per-CPU offset".to_string()
    })
}

impl Tracer {
    /// Loads the object and maps its shared arrays. `targets` are the functions and
    /// tracepoints that may be attached to (the kernel's BTF ids of those are kept until
    /// attaching is done).
    pub fn load<'a>(
        layout: &KernelLayout,
        opts: &LoadOptions,
        targets: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self> {
        let (mut ebpf, loaded, loader_btf, front) = load_object(layout, opts)?;
        let fentry_build = fentry_build(opts, &loaded);
        let logger = ebpf_logger(&mut ebpf, opts.features.ebpf_log)?;
        let cpus = possible_cpus();
        let probes = opts.probes.max(1);
        let workload_contexts = workload_contexts(opts.features.workload_memcg);
        let SharedArrays {
            cells,
            workload_cells,
            held_switches,
            states,
        } = map_shared_arrays(&ebpf, cpus, probes as usize, workload_contexts as usize)?;
        let ring = deferred_ring(&mut ebpf)?;
        let tp_percpu = opts.no_kprobes;
        let mut calibration = Vec::new();
        let object = front.object;
        let Breakdowns {
            callers,
            names,
            memcgs,
            memcg_names,
            stacks,
        } = Breakdowns::take(&mut ebpf, opts, front, &mut calibration)?;

        // Whatever the loading freed goes back first.
        release_freed_memory();

        // The floor's function and the iterator that finds the programs' stats are attached
        // to as well.
        let btf = kbtf::attach_btf(targets.into_iter().chain([
            checks::FLOOR_FUNCTION,
            checks::PROG_ITER_FUNC,
            names::HELD_SWITCH_TARGET,
        ]))?;
        Ok(Tracer {
            ebpf,
            btf: Some(btf),
            loader_btf,
            attached: Vec::new(),
            failed: Vec::new(),
            masks: None,
            no_context_split: layout.no_context != 0,
            off_cpu: crate::kernel::off_cpu_source(layout),
            task_clock_excludes: None,
            reads: reads_of(&loaded, opts, object),
            extra: Vec::new(),
            calibration,
            started: Instant::now(),
            ended: None,
            workload: opts.workload_cgroup != 0 || opts.features.workload_memcg,
            workload_contexts,
            workload_memcg: None,
            memcg_paths: HashMap::new(),
            memcgs,
            memcg_names,
            stacks,
            stack_sample: opts.features.stack_sample.max(1),
            stack_shown: opts
                .features
                .stack_depth
                .min(memcg_trace_common::STACK_SHOWN),
            cpus,
            probes,
            misses_offset: layout.stats_misses,
            misses_unreachable: misses_unreachable(layout),
            cells,
            workload_cells,
            held_switches,
            states,
            witness: None,
            prog_active_known: layout.valid != 0
                && layout.no_context == 0
                && layout.prog_active != 0,
            kprobe_defers: opts.kernel_preemptible,
            tp_percpu,
            ring,
            verifier: Verifier::new(probes as usize)
                .with_breakdowns(opts.features.callers, opts.features.by_memcg),
            callers,
            names,
            prog_fds: HashMap::new(),
            kprobes: HashMap::new(),
            kprobes_closed: HashMap::new(),
            logger,
            stats: None,
            stats_always: false,
            fentry_build,
        })
    }

    /// Turns the kernel's bpf stats (run count and run time per program) on until `stop_stats`
    /// or the end; they add two clock reads around every program run.
    pub fn start_stats(&mut self) -> Result<()> {
        if self.stats.is_none() {
            self.stats = Some(
                aya::sys::enable_stats(aya::sys::Stats::RunTime)
                    .map_err(|e| anyhow!("cannot enable bpf stats (needs CAP_SYS_ADMIN): {e}"))?,
            );
        }
        Ok(())
    }

    /// Turns the bpf stats this tracer enabled off again, unless they are on for the whole run.
    pub fn stop_stats(&mut self) {
        if !self.stats_always {
            self.stats = None;
        }
    }

    /// Keeps bpf stats on from now until the end, every program run counted.
    pub fn stats_for_the_whole_run(&mut self) -> Result<()> {
        self.start_stats()?;
        self.stats_always = true;
        Ok(())
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.detach_all();
    }
}

/// How the loaded programs read the kernel (`kernel::reads_of`), and which object they are.
fn reads_of(loaded: &KernelLayout, opts: &LoadOptions, object: Object) -> String {
    let chased = crate::kernel::Chased {
        memcg: opts.features.by_memcg || opts.features.workload_memcg,
        call_sites: opts.features.callers,
    };
    let reads = crate::kernel::reads_of(loaded, opts.no_kprobes, chased);
    match object {
        Object::Full => reads,
        Object::Legacy => format!(
            "{reads}; the eBPF object for kernels before 5.19 (no search of other CPUs: a task call that moved to another CPU is counted unmatched)"
        ),
    }
}

#[cfg(test)]
mod tests;
