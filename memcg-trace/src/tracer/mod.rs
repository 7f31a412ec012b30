//! The kernel side, seen from userspace: loads the eBPF object (one loader set-up for every
//! use), attaches one program pair per probe with the requested backend (falling back in `auto`
//! mode, with the reason), and reads what the programs counted into a `Snapshot`: the shared
//! arrays through a memory mapping, the deferred pairs from the ring buffer (confirmed against
//! the kernel's recursion counters), the programs' own statistics from /proc. Dropping the
//! `Tracer` detaches every program.

pub mod checks;
pub mod deferred;
pub mod kbtf;
pub mod kprobe;
pub mod patch;
pub mod proginfo;
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
    maps::{MapData, PerCpuArray, RingBuf},
    programs::Program,
    Btf, Ebpf,
};
use aya_log::EbpfLogger;
use memcg_trace_common::{
    cell, names, workload_cell, workload_contexts, CallerKey, CallerStat, Cell, Config, Deferred,
    HeldSwitches, KernelLayout, MemcgKey, MemcgPath, StackKey, CTX_TASK, MAX_CALLERS, MAX_MEMCGS,
    MAX_STACKS, MAX_WORKLOAD_MEMCGS, MEMCG_IN_WORKLOAD, NUM_CTX, STACK_DEPTH, TP_CELLS,
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
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memcg-trace"));
/// The same programs built for kernels before 5.19 (the eBPF crate's feature `legacy`).
static EBPF_LEGACY: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memcg-trace-legacy"));

/// The environment variable that overrides the choice of object (`full` or `legacy`).
pub const OBJECT_ENV: &str = "MEMCG_TRACE_BPF_OBJECT";

/// Which build of the eBPF programs is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object {
    /// Every feature: the migrated-call search (`bpf_loop`, 5.17; `bpf_map_lookup_percpu_elem`,
    /// 5.19) and atomic claims of task slots (compare-and-swap, 5.12).
    Full,
    /// For kernels before 5.19: no migrated-call search (such a call's exit is counted
    /// unmatched, its entry goes stale) and plain claims (sound only where programs cannot be
    /// preempted).
    Legacy,
}

impl Object {
    /// The object for a kernel of this (major, minor) version (unknown: the full one).
    pub fn for_kernel(version: Option<(u32, u32)>) -> Object {
        match version {
            Some(v) if v < (5, 19) => Object::Legacy,
            _ => Object::Full,
        }
    }

    /// The object for the running kernel, or the one `MEMCG_TRACE_BPF_OBJECT` names.
    pub fn chosen() -> Result<Object> {
        match std::env::var(OBJECT_ENV).ok().as_deref() {
            None | Some("") | Some("auto") => Ok(Object::for_kernel(crate::kernel::version(
                &crate::kernel::release(),
            ))),
            Some("full") => Ok(Object::Full),
            Some("legacy") => Ok(Object::Legacy),
            Some(x) => bail!("{OBJECT_ENV}={x}: expected auto, full or legacy"),
        }
    }

    pub fn bytes(self) -> &'static [u8] {
        match self {
            Object::Full => EBPF_OBJECT,
            Object::Legacy => EBPF_LEGACY,
        }
    }
}

/// Whether the kernel lacks `bpf_get_current_task_btf` (5.11), which the direct reads of the
/// task need: they are then made through `bpf_probe_read_kernel`, as with `--probe-read`.
pub fn needs_probe_read(version: Option<(u32, u32)>) -> bool {
    version.is_some_and(|v| v < (5, 11))
}

/// Bytes of the ring buffer of deferred pairs (24 bytes and a header each).
const DEFERRED_BYTES: u32 = 1 << 20;

/// An error chain on one line.
pub fn chain(e: &dyn Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let t = x.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = x.source();
    }
    let s = s.replace('\n', " ");
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

/// How the object is loaded.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// cgroup v2 id of the workload's cgroup (0: none).
    pub workload_cgroup: u64,
    /// memcg-trace created that cgroup and removes it only after detaching.
    pub workload_owned: bool,
    /// The depth of that cgroup below the v2 root (0: unknown).
    pub workload_level: u32,
    /// Probe slots to size the shared arrays for.
    pub probes: u32,
    /// The kernel can preempt fentry programs (and tasks holding a BPF recursion guard), or
    /// they interleave on a CPU for another reason (no context split).
    pub preemptible: bool,
    /// The kernel preempts (see `Config::kprobe_defers`).
    pub kernel_preemptible: bool,
    /// No kprobe program can be attached on this kernel: the tracepoint programs may count in
    /// a per-CPU map (see `Config::tp_percpu`).
    pub no_kprobes: bool,
    /// What the programs do beyond timing calls.
    pub features: Features,
}

/// What the programs do beyond timing calls, and how they read the kernel: chosen on the
/// command line, carried as one value through the session and the load into the programs'
/// read-only config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Count the timed calls per call site (`--callers`).
    pub callers: bool,
    /// Frames of the sampled short stacks, the call site included (0: none; with `callers`).
    pub stack_depth: u32,
    /// One entry in this many per CPU captures its stack.
    pub stack_sample: u32,
    /// Count the calls per charged memcg (`--by-memcg`).
    pub by_memcg: bool,
    /// Tell the workload's calls by the memcg they charge (see `Config::workload_memcg`).
    pub workload_memcg: bool,
    /// Read the preempt count and the task's switch counts with `bpf_probe_read_kernel`, as
    /// before direct reads (for the bench's before/after and as a way out should a kernel
    /// refuse them).
    pub probe_read: bool,
    /// Diagnostics from inside the programs.
    pub ebpf_log: bool,
}

impl Default for Features {
    /// Timing alone: no breakdown, direct reads, no diagnostics.
    fn default() -> Self {
        Features {
            callers: false,
            stack_depth: 0,
            stack_sample: 1,
            by_memcg: false,
            workload_memcg: false,
            probe_read: false,
            ebpf_log: false,
        }
    }
}

/// Makes the allocator serve every large allocation (128 KiB or more) from a mapping of its
/// own: freed, it goes back to the system at once, and a growing vector is moved by remapping
/// rather than copied. glibc would otherwise raise that threshold after the first large free
/// (start-up reads the kernel's BTF, megabytes, more than once) and place later large vectors
/// on the heap, where each doubling leaves the old copy resident: the daemon's peak is set
/// during start-up, by such vectors.
pub fn large_allocations_mapped() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt has no preconditions; called before any thread is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Gives the memory the allocator holds free back to the system (glibc keeps freed heap
/// memory for reuse, where a fragmented heap makes the next large allocation grow the process
/// anew). Start-up reads the kernel's BTF more than once (ours, the cut-down copies of
/// `kbtf`), megabytes each, and the daemon's peak resident memory is set there.
pub fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The one way the object is loaded: kernel layout and settings patched into the programs'
/// read-only globals, the shared arrays sized for the CPUs and probes. With the log level 0
/// the verifier removes every log statement, so diagnostics cost nothing when off.
/// The loader is made without aya's parse of the kernel's BTF where it can be (`kbtf`); the
/// third value says why it could not.
fn load_object(
    layout: &KernelLayout,
    o: &LoadOptions,
) -> Result<(Ebpf, KernelLayout, Option<String>)> {
    let image = Object::chosen()?.bytes();
    if image.is_empty() {
        bail!("this binary was built with AYA_BUILD_SKIP and carries no eBPF programs; rebuild it with `cargo xtask build`");
    }
    let cpus = possible_cpus() as u32;
    let probes = o.probes.max(1);
    let config = Config {
        workload_cgroup: o.workload_cgroup,
        probes,
        cpus,
        preemptible: o.preemptible as u32,
        kprobe_defers: o.kernel_preemptible as u32,
        workload_owned: o.workload_owned as u32,
        workload_level: o.workload_level,
        tp_percpu: o.no_kprobes as u32,
        callers: o.features.callers as u32,
        by_memcg: o.features.by_memcg as u32,
        workload_memcg: o.features.workload_memcg as u32,
        // The frames shown and two more, for the tracer's own frames left out.
        stack_depth: if o.features.callers && o.features.stack_depth > 0 {
            (o.features.stack_depth.min(memcg_trace_common::STACK_SHOWN) + 2)
                .min(STACK_DEPTH as u32)
        } else {
            0
        },
        stack_sample: o.features.stack_sample.max(1),
    };
    let level: u8 = if o.features.ebpf_log { 0xff } else { 0 };
    let cells = cpus * probes * NUM_CTX as u32;
    let mut layout = *layout;
    // A copy aligned like the original, for the ELF parser, patched below.
    let mut words = vec![0u64; image.len().div_ceil(8)];
    // SAFETY: a u64 buffer viewed as the bytes it holds.
    let bytes: &mut [u8] =
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), image.len()) };
    bytes.copy_from_slice(image);
    // Source lines are only for the verifier's messages: kept with --ebpf-log.
    let mut changed = !o.features.ebpf_log && patch::drop_line_info(bytes)?;
    // Direct reads (plain loads instead of bpf_probe_read_kernel calls) unless asked not to.
    if !o.features.probe_read
        && !needs_probe_read(crate::kernel::version(&crate::kernel::release()))
    {
        layout.direct_task = 1;
        if layout.preempt_var_id != 0 && patch::percpu_var(bytes, layout.preempt_var_id)? > 0 {
            layout.direct_preempt = 1;
            changed = true;
        } else if layout.cast_kfunc_id != 0 && patch::rdonly_cast(bytes, layout.cast_kfunc_id)? > 0
        {
            // The per-CPU variable cannot be named here (no data symbols in kallsyms): its
            // address, found by the programs, is read by a cast and a plain load instead.
            layout.direct_untrusted = 1;
            changed = true;
        }
    }
    let object = changed.then_some(words);
    let bytes: &[u8] = match &object {
        // SAFETY: as above; the buffer outlives the load.
        Some(w) => unsafe { std::slice::from_raw_parts(w.as_ptr().cast(), image.len()) },
        None => image,
    };
    let (mut loader, loader_btf) = kbtf::loader(bytes);
    loader
        .override_global(names::GLOBAL_LAYOUT, &layout, true)
        .override_global(names::GLOBAL_CONFIG, &config, true)
        .override_global(aya_log::LEVEL, &level, true)
        .map_max_entries(names::MAP_CELLS, cells)
        .map_max_entries(
            names::MAP_WORKLOAD_CELLS,
            cpus * probes * workload_contexts(o.features.workload_memcg),
        )
        .map_max_entries(names::MAP_DEFERRED, DEFERRED_BYTES)
        .map_max_entries(names::MAP_HELD_SWITCHES, cpus)
        .map_max_entries(
            names::MAP_CALLERS,
            if o.features.callers { MAX_CALLERS } else { 1 },
        )
        .map_max_entries(
            names::MAP_MEMCGS,
            if o.features.by_memcg { MAX_MEMCGS } else { 1 },
        )
        .map_max_entries(
            names::MAP_STACKS,
            if config.stack_depth > 0 {
                MAX_STACKS
            } else {
                1
            },
        )
        .map_max_entries(
            names::MAP_WORKLOAD_MEMCGS,
            if o.features.workload_memcg {
                MAX_WORKLOAD_MEMCGS
            } else {
                1
            },
        )
        .load(bytes)
        .map(|ebpf| (ebpf, layout, loader_btf))
        .map_err(|e| anyhow!("loading the eBPF object failed: {}", chain(&e)))
}

/// Loads the program `name` (`p`) for `target` (a function or tracepoint; kprobes take theirs
/// at attach) and attaches it there; kprobes through a tracefs kprobe event named after it.
fn load_and_attach(
    p: &mut Program,
    name: &str,
    target: &str,
    btf: &Btf,
) -> Result<Option<KprobeEvent>, String> {
    let refused = |s: String| {
        if s.contains("Operation not permitted") || s.contains("EPERM") {
            format!(
                "{s} (the kernel refused it: lockdown, a sandbox or missing CAP_BPF/CAP_PERFMON)"
            )
        } else {
            s
        }
    };
    let r = match p {
        Program::FEntry(p) => {
            // Already loaded when the miss counter was looked up.
            if p.fd().is_err() {
                p.load(target, btf).map_err(|e| refused(chain(&e)))?;
            }
            p.attach().map(drop)
        }
        Program::FExit(p) => p.load(target, btf).and_then(|_| p.attach().map(drop)),
        Program::BtfTracePoint(p) => p.load(target, btf).and_then(|_| p.attach().map(drop)),
        Program::KProbe(p) => {
            let ret = matches!(p.kind(), aya::programs::ProbeKind::Return);
            p.load().map_err(|e| refused(chain(&e)))?;
            let fd = p.fd().map_err(|e| chain(&e))?.as_fd().as_raw_fd();
            return KprobeEvent::attach(target, ret, name, fd)
                .map(Some)
                .map_err(|e| refused(format!("{e:#}")));
        }
        _ => return Err("unexpected program type".into()),
    };
    r.map(|_| None).map_err(|e| refused(chain(&e)))
}

/// Detaches and unloads a program of any of the types used here.
fn unload(p: &mut Program) {
    let _ = match p {
        Program::FEntry(p) => p.unload(),
        Program::FExit(p) => p.unload(),
        Program::KProbe(p) => p.unload(),
        Program::BtfTracePoint(p) => p.unload(),
        Program::RawTracePoint(p) => p.unload(),
        _ => Ok(()),
    };
}

/// A duplicate of a loaded program's fd.
fn dup_fd(p: &Program) -> Option<OwnedFd> {
    let fd = match p {
        Program::FEntry(p) => p.fd(),
        Program::FExit(p) => p.fd(),
        Program::KProbe(p) => p.fd(),
        Program::BtfTracePoint(p) => p.fd(),
        _ => return None,
    };
    fd.ok()?.as_fd().try_clone_to_owned().ok()
}

/// The programs of one probe slot for a backend, entry first; `lean`: the lean fentry/fexit
/// programs (`lean_programs`).
pub fn slot_programs(backend: Backend, slot: u32, lean: bool) -> Vec<&'static str> {
    let s = slot as usize;
    match backend {
        Backend::Fentry if lean => vec![names::FENTRY_LEAN[s], names::FEXIT_LEAN[s]],
        Backend::Fentry => vec![names::FENTRY[s], names::FEXIT[s]],
        Backend::Kprobe => vec![names::KPROBE[s], names::KRETPROBE[s]],
        Backend::Tracepoint => vec![names::TP[s]],
    }
}

/// Whether the lean fentry/fexit programs (`names::FENTRY_LEAN`) serve settings `o` on a kernel
/// whose layout, as loaded, is `loaded`: what they were built for is what holds, no call sites
/// (nor their stacks), no charged memcgs, and plain loads of the task and its cgroup.
pub fn lean_programs(o: &LoadOptions, loaded: &KernelLayout) -> bool {
    loaded.direct_task != 0
        && loaded.direct_cgroup != 0
        && !o.features.callers
        && !o.features.by_memcg
        && !o.features.workload_memcg
}

/// The kernel's run count, run time and recursion misses of a program: from its
/// `bpf_prog_info`, else (kernels whose info lacks them) from its fdinfo.
fn program_cost(name: &str, fd: &OwnedFd) -> ProgCost {
    let (run_time_ns, run_cnt, recursion_misses) = proginfo::stats(fd.as_fd())
        .or_else(|| fdinfo_stats(fd))
        .unwrap_or_default();
    ProgCost {
        name: name.to_string(),
        run_time_ns,
        run_cnt,
        recursion_misses,
    }
}

/// `run_time_ns`, `run_cnt` and `recursion_misses` of a program from its fdinfo (what it
/// lacks reads 0).
fn fdinfo_stats(fd: &OwnedFd) -> Option<(u64, u64, u64)> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    let mut out = (0, 0, 0);
    for line in info.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v: u64 = v.trim().parse().unwrap_or(0);
        match k {
            "run_time_ns" => out.0 = v,
            "run_cnt" => out.1 = v,
            "recursion_misses" => out.2 = v,
            _ => {}
        }
    }
    Some(out)
}

/// A log sink for the programs' diagnostics: one line each on stderr.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        eprintln!("memcg-trace: ebpf {}: {}", record.level(), record.args());
    }

    fn flush(&self) {}
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
    /// Calls per charged memcg (`--by-memcg`), read through the map syscalls.
    memcgs: Option<aya::maps::HashMap<MapData, MemcgKey, CallerStat>>,
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
    /// How the deferred pairs of kprobe slots are proven on a kernel that counts no kprobe
    /// program misses (`HeldSwitches`): None until a kprobe slot that defers is attached.
    witness: Option<Witness>,
    /// Whether the programs can read `bpf_prog_active` (`KernelLayout::prog_active`).
    prog_active_known: bool,
    /// The kernel preempts: kprobe task calls that left the CPU are deferred
    /// (`Config::kprobe_defers`).
    kprobe_defers: bool,
    /// The tracepoint programs count their hits in the per-CPU state (`Config::tp_percpu`),
    /// read once a snapshot: about 25 KB a CPU through one map syscall (only on kernels without
    /// kprobes, whose programs such a read would make miss).
    tp_percpu: bool,
    ring: RingBuf<MapData>,
    verifier: Verifier,
    /// Timed calls per call site (`--callers`), read through the map syscalls (a hash map
    /// cannot be mapped): see `Tracer::sites`.
    callers: Option<aya::maps::HashMap<MapData, CallerKey, CallerStat>>,
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
    /// fentry/fexit probes attach the lean programs (`lean_programs`).
    lean: bool,
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
        let (mut ebpf, loaded, loader_btf) = load_object(layout, opts)?;
        let lean = lean_programs(opts, &loaded);
        let logger = if opts.features.ebpf_log {
            Some(
                EbpfLogger::init_with_logger(&mut ebpf, StderrLog)
                    .map_err(|e| anyhow!("eBPF log: {e}"))?,
            )
        } else {
            None
        };
        let cpus = possible_cpus();
        let probes = opts.probes.max(1);
        let cells = cpus * probes as usize * NUM_CTX;
        let map = |name: &str| {
            ebpf.map(name)
                .ok_or_else(|| anyhow!("map {name} missing from the object"))
        };
        let shared_cells = Shared::new(names::MAP_CELLS, map(names::MAP_CELLS)?, cells)?;
        let workload_contexts = workload_contexts(opts.features.workload_memcg);
        let workload_cells = Shared::new(
            names::MAP_WORKLOAD_CELLS,
            map(names::MAP_WORKLOAD_CELLS)?,
            cpus * probes as usize * workload_contexts as usize,
        )?;
        let held_switches = Shared::new(
            names::MAP_HELD_SWITCHES,
            map(names::MAP_HELD_SWITCHES)?,
            cpus,
        )?;
        let ring = RingBuf::try_from(
            ebpf.take_map(names::MAP_DEFERRED)
                .ok_or_else(|| anyhow!("map {} missing", names::MAP_DEFERRED))?,
        )
        .context("the ring buffer of deferred pairs")?;
        let tp_percpu = opts.no_kprobes;
        // The kernel's symbols are copied now, while they can be read.
        let mut calibration = Vec::new();
        let object = Object::chosen()?;
        let names = if opts.features.callers {
            let (n, why) = crate::callers::Names::new();
            if let Some(why) = why {
                calibration.push(format!("--callers: call sites shown as addresses: {why}"));
            }
            n
        } else {
            Default::default()
        };
        let callers = if opts.features.callers {
            let m = ebpf
                .take_map(names::MAP_CALLERS)
                .ok_or_else(|| anyhow!("map {} missing", names::MAP_CALLERS))?;
            Some(aya::maps::HashMap::try_from(m).context("the call sites")?)
        } else {
            None
        };
        let memcgs = if opts.features.by_memcg {
            let m = ebpf
                .take_map(names::MAP_MEMCGS)
                .ok_or_else(|| anyhow!("map {} missing", names::MAP_MEMCGS))?;
            Some(aya::maps::HashMap::try_from(m).context("the memcgs")?)
        } else {
            None
        };
        let stacks = if opts.features.callers && opts.features.stack_depth > 0 {
            let m = ebpf
                .take_map(names::MAP_STACKS)
                .ok_or_else(|| anyhow!("map {} missing", names::MAP_STACKS))?;
            Some(aya::maps::HashMap::try_from(m).context("the short stacks")?)
        } else {
            None
        };
        let memcg_names = if opts.features.by_memcg {
            crate::memcgs::Names::new()
        } else {
            Default::default()
        };
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
            reads: match object {
                Object::Full => crate::kernel::reads_of(&loaded, opts.no_kprobes),
                Object::Legacy => format!(
                    "{}; the eBPF object for kernels before 5.19 (no search of other CPUs: a task call that moved to another CPU is counted unmatched)",
                    crate::kernel::reads_of(&loaded, opts.no_kprobes)
                ),
            },
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
            stack_shown: opts.features.stack_depth.min(memcg_trace_common::STACK_SHOWN),
            cpus,
            probes,
            misses_offset: layout.stats_misses,
            misses_unreachable: (layout.arch == memcg_trace_common::ARCH_ARM64
                && layout.percpu_start == 0)
                .then(|| {
                    "arm64: __per_cpu_start is not in kallsyms (kptr_restrict hides addresses), so no per-CPU offset".to_string()
                }),
            cells: shared_cells,
            workload_cells,
            held_switches,
            witness: None,
            prog_active_known: layout.valid != 0
                && layout.no_context == 0
                && layout.prog_active != 0,
            kprobe_defers: opts.kernel_preemptible,
            tp_percpu,
            ring,
            verifier: {
                let mut v = Verifier::new(probes as usize);
                if opts.features.callers {
                    v.callers = Some(Default::default());
                }
                if opts.features.by_memcg {
                    v.memcgs = Some(Default::default());
                }
                v
            },
            callers,
            names,
            prog_fds: HashMap::new(),
            kprobes: HashMap::new(),
            kprobes_closed: HashMap::new(),
            logger,
            stats: None,
            stats_always: false,
            lean,
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

    /// Attaches `req` by the first plan that loads and attaches; records why others failed.
    pub fn attach(&mut self, req: &Request, res: &Resolution) -> bool {
        let slot = self.attached.len() as u32;
        let name = req.name();
        let mut reasons = res.notes.clone();
        if slot >= self.probes {
            reasons.push(format!("more than {} probes requested", self.probes));
            self.failed.push(NotAttached { name, reasons });
            return false;
        }
        for plan in &res.plans {
            // Two probes on one function (`--all` on 7.x, where `charge` resolves to the slab
            // hook that `slab_post_alloc` is) would count each call twice and nest each in the
            // other: not this plan.
            if let Some(a) = self
                .attached
                .iter()
                .find(|a| same_function(&a.target, &plan.target))
            {
                reasons.push(format!(
                    "{}: {} is already traced as {}: its calls are there",
                    plan.backend, plan.target, a.name
                ));
                continue;
            }
            let programs = slot_programs(plan.backend, slot, self.lean);
            // Before the programs run: a call never reads another target's path.
            let memcg_arg = self.set_memcg_path(slot, plan);
            // A kprobe whose deferred pairs the kernel's miss counts cannot prove: the switch
            // witness runs before its programs do.
            let witnessed = plan.backend == Backend::Kprobe
                && self.kprobe_defers
                && !crate::kernel::kprobe_misses_counted()
                && self.start_witness(&mut reasons);
            // The entry program is new: its misses are 0 until it is attached; the switch
            // witness's count is read before then too.
            let before = monotonic_ns();
            let held_before = if witnessed { self.held_total() } else { 0 };
            let read = monotonic_ns();
            match self.attach_programs(&programs, &plan.target, Some(slot)) {
                Ok(()) => {
                    self.set_window(slot, memcg_trace_common::WINDOW_OPEN);
                    self.verifier.mark(
                        slot as usize,
                        Mark {
                            before,
                            misses: held_before,
                            after: read,
                        },
                    );
                    // Deferred pairs of a kprobe can be confirmed where the kernel counts
                    // kprobe programs' recursion misses (6.7+), or by the switch witness;
                    // fentry's always can.
                    if witnessed {
                        if let Some(w) = self.witness.as_mut() {
                            w.slots.push(slot);
                        }
                    }
                    self.verifier.set_verifiable(
                        slot as usize,
                        plan.backend != Backend::Kprobe
                            || crate::kernel::kprobe_misses_counted()
                            || witnessed,
                    );
                    self.attached.push(Attached {
                        slot,
                        name,
                        target: plan.target.clone(),
                        backend: plan.backend,
                        notes: reasons,
                        programs,
                        memcg_arg,
                        opened: Instant::now(),
                    });
                    if self.attached.len() == 1 {
                        self.started = Instant::now();
                    }
                    self.mark(slot as usize);
                    return true;
                }
                Err(e) => reasons.push(format!("{}: {}: {e}", plan.backend, plan.target)),
            }
        }
        if res.plans.is_empty() && reasons.is_empty() {
            reasons.push("no backend can attach it".into());
        }
        self.failed.push(NotAttached { name, reasons });
        false
    }

    /// Attaches `programs` (entry first) to `target` in probe slot `slot`, exit first: an entry
    /// whose exit is not there yet would only leave stale pending calls. All or none.
    /// Attaches `programs` to `target`, exits first; `slot`: the probe slot they serve (None for
    /// the bench's floors, which have no pairing state).
    fn attach_programs(
        &mut self,
        programs: &[&'static str],
        target: &str,
        slot: Option<u32>,
    ) -> Result<(), String> {
        for (i, &name) in programs.iter().enumerate().rev() {
            let r = self.attach_program(name, target, slot);
            if let Err(e) = r {
                if let Some(p) = self.ebpf.program_mut(name) {
                    unload(p);
                }
                for &done in &programs[i + 1..] {
                    self.detach(done);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn attach_program(
        &mut self,
        name: &'static str,
        target: &str,
        slot: Option<u32>,
    ) -> Result<(), String> {
        // fentry: loaded first, so that its own miss counter goes to PROG_MISSES before it runs.
        let fentry = matches!(self.ebpf.program(name), Some(Program::FEntry(_)));
        if fentry {
            let btf = self
                .btf
                .as_ref()
                .ok_or("attaching is over (BTF released)")?;
            let Some(Program::FEntry(f)) = self.ebpf.program_mut(name) else {
                return Err(format!("program {name} missing from the object"));
            };
            f.load(target, btf).map_err(|e| chain(&e))?;
            if let Some(slot) = slot {
                self.point_prog_misses(name, slot);
            }
        }
        let btf = self
            .btf
            .as_ref()
            .ok_or("attaching is over (BTF released)")?;
        let p = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| format!("program {name} missing from the object"))?;
        let k = load_and_attach(p, name, target, btf)?;
        if let Some(fd) = dup_fd(p) {
            self.prog_fds.insert(name, fd);
        }
        if let Some(k) = k {
            self.kprobes.insert(name, k);
        }
        Ok(())
    }

    /// Points PROG_MISSES[slot] at the per-CPU recursion-miss counter of the loaded program
    /// `name` (found with the `bpf_prog` iterator); leaves it 0 when that cannot be done.
    fn point_prog_misses(&mut self, name: &str, slot: u32) {
        let addr = (|| -> Result<u64> {
            let id = match self.ebpf.program(name) {
                Some(Program::FEntry(p)) => p.info()?.id(),
                _ => bail!("not an fentry program"),
            };
            let stats = checks::prog_stats(&mut self.ebpf, self.btf.as_ref())?
                .remove(&id)
                .ok_or_else(|| anyhow!("program {id} not listed by the iterator"))?;
            Ok(stats + self.misses_offset)
        })();
        let addr = match addr {
            _ if self.misses_unreachable.is_some() => {
                let why = self.misses_unreachable.clone().unwrap_or_default();
                self.notes_once(why);
                0
            }
            Ok(a) if self.misses_offset != 0 => a,
            Ok(_) => {
                self.notes_once("struct bpf_prog_stats has no misses field in BTF".into());
                0
            }
            Err(e) => {
                self.notes_once(format!("{e:#}"));
                0
            }
        };
        if let Some(m) = self.ebpf.map_mut(names::MAP_PROG_MISSES) {
            if let Ok(mut a) = aya::maps::Array::<_, u64>::try_from(m) {
                let _ = a.set(slot, addr, 0);
            }
        }
    }

    /// Tells slot `slot`'s programs how to reach the charged memcg of `plan`'s target (from
    /// `memcg_paths`; none: the memcg is not read); returns the argument's struct when there
    /// is a path.
    fn set_memcg_path(&mut self, slot: u32, plan: &Plan) -> Option<String> {
        let key = (plan.backend == Backend::Tracepoint, plan.target.clone());
        let (arg, path) = match self.memcg_paths.get(&key) {
            Some((arg, path)) => (Some(arg.clone()), *path),
            None => (None, MemcgPath::default()),
        };
        let m = self.ebpf.map_mut(names::MAP_MEMCG_PATH)?;
        let mut a = aya::maps::Array::<_, MemcgPath>::try_from(m).ok()?;
        a.set(slot, path, 0).ok()?;
        arg
    }

    /// Tells the workload's calls by the memcg at `dir` (and those below it): fills the set
    /// the programs look the charged memcg up in. Kept up to date at each snapshot.
    pub fn set_workload_memcg(&mut self, dir: &std::path::Path) -> Result<()> {
        let m = self
            .ebpf
            .take_map(names::MAP_WORKLOAD_MEMCGS)
            .ok_or_else(|| anyhow!("map {} missing", names::MAP_WORKLOAD_MEMCGS))?;
        let set = aya::maps::HashMap::try_from(m).context("the workload's memcgs")?;
        // Where the programs' climbs stop, before the set is filled: a memcg made below it
        // meanwhile is found there.
        let root = crate::memcgs::id_of(dir)
            .ok_or_else(|| anyhow!("the workload's memcg {} is gone", dir.display()))?;
        let m = self
            .ebpf
            .map_mut(names::MAP_WORKLOAD_ROOT)
            .ok_or_else(|| anyhow!("map {} missing", names::MAP_WORKLOAD_ROOT))?;
        aya::maps::Array::<_, u64>::try_from(m)
            .and_then(|mut a| a.set(0, root, 0))
            .context("the workload's memcg id")?;
        self.workload_memcg = Some((dir.to_path_buf(), set, Default::default()));
        self.update_workload_memcgs();
        Ok(())
    }

    /// Adds the ids of cgroups created below the workload's memcg since the last call. Only
    /// those not put in yet, known without asking the map: a map system call holds its CPU's
    /// bpf_prog_active, and if the daemon is switched out meanwhile every kprobe program on
    /// that CPU is skipped and the switch witness rejects the deferred calls in flight (seen on
    /// 6.1-rt under reclaim, `--cgroup`: 69 of 230 rejected when a lookup ran every tick). A
    /// tick that finds no new cgroup makes no system call here.
    fn update_workload_memcgs(&mut self) {
        if let Some((dir, set, known)) = self.workload_memcg.as_mut() {
            for id in crate::memcgs::subtree_ids(dir) {
                if !known.contains(&id) && set.insert(id, MEMCG_IN_WORKLOAD, 0).is_ok() {
                    known.insert(id);
                }
            }
        }
    }

    /// Records, once, why fentry interrupt pairs are confirmed in userspace instead of in the
    /// kernel.
    fn notes_once(&mut self, why: String) {
        if self.calibration.is_empty() {
            self.calibration.push(format!(
                "fentry interrupt pairs confirmed per tick in userspace (coarser): the programs' own miss counters are not readable: {why}"
            ));
        }
    }

    /// Detaches one program.
    fn detach(&mut self, name: &'static str) {
        if let Some(k) = self.kprobes.remove(name) {
            let ret = k.ret;
            if let Some((hits, missed)) = k.close() {
                self.kprobes_closed.insert(name, (ret, hits, missed));
            }
        }
        if let Some(p) = self.ebpf.program_mut(name) {
            unload(p);
        }
    }

    /// Detaches the programs of a probe slot, entry first: calls already in flight still get
    /// their exit.
    pub fn detach_slot(&mut self, slot: u32) {
        let progs: Vec<&'static str> = self
            .attached
            .iter()
            .filter(|a| a.slot == slot)
            .flat_map(|a| a.programs.clone())
            .collect();
        for p in progs {
            self.detach(p);
        }
    }

    /// Attaches further programs of the object (the bench floors) to `plan`'s target, exit
    /// programs first; their costs are reported in [`Snapshot::extra`].
    pub fn attach_extra(&mut self, programs: &[&'static str], plan: &Plan) -> Result<()> {
        self.attach_programs(programs, &plan.target, None)
            .map_err(|e| anyhow!("{} on {}: {e}", programs.join("+"), plan.target))?;
        self.extra.extend_from_slice(programs);
        Ok(())
    }

    /// Frees the cut-down kernel BTF once every probe is attached; later attaches fail. With short
    /// stacks, the kernel's symbols are copied again (call while privileged): now they hold
    /// the BPF trampolines attaching made, which stacks pass through.
    pub fn done_attaching(&mut self) {
        self.btf = None;
        // A switch witness whose kprobe could not be attached after all costs every context
        // switch for nothing.
        if self.witness.as_ref().is_some_and(|w| w.slots.is_empty()) {
            self.detach(names::HELD_SWITCH);
            self.extra.retain(|p| *p != names::HELD_SWITCH);
            self.witness = None;
        }
        if self.stacks.is_some() {
            let (n, _) = crate::callers::Names::new();
            self.names = n;
        }
    }

    /// Opens or closes the tracing window of a slot (see `memcg_trace_common::Counters::outside`).
    fn set_window(&mut self, slot: u32, state: u64) {
        if let Some(m) = self.ebpf.map_mut(names::MAP_WINDOW) {
            if let Ok(mut a) = aya::maps::Array::<_, u64>::try_from(m) {
                let _ = a.set(slot, state, 0);
            }
        }
    }

    /// Detaches every program (also done on drop): every probe's entry program first, then the
    /// exits, so that calls in flight end paired.
    pub fn detach_all(&mut self) {
        for slot in 0..self.attached.len() as u32 {
            self.set_window(slot, 0);
        }
        let mut progs: Vec<&'static str> = self
            .attached
            .iter()
            .filter_map(|a| a.programs.first().copied())
            .collect();
        progs.extend(
            self.attached
                .iter()
                .flat_map(|a| a.programs.iter().skip(1).copied()),
        );
        progs.extend(self.extra.iter().copied());
        for p in progs {
            self.detach(p);
        }
    }

    /// Attaches the switch witness unless it is on already; false (and why, in `reasons`)
    /// where it cannot be: the deferred pairs are then all rejected, as unproven.
    fn start_witness(&mut self, reasons: &mut Vec<String>) -> bool {
        if self.witness.is_some() {
            return true;
        }
        if !self.prog_active_known {
            reasons.push(
                "kprobe: calls that left the CPU cannot be proven on this kernel (it counts no kprobe program misses before 6.7, and bpf_prog_active, which the switch witness reads, is not a known per-CPU variable): they are counted unproven".into(),
            );
            return false;
        }
        match self.attach_program(names::HELD_SWITCH, names::HELD_SWITCH_TARGET, None) {
            Ok(()) => {
                self.extra.push(names::HELD_SWITCH);
                self.witness = Some(Witness { slots: Vec::new() });
                true
            }
            Err(e) => {
                reasons.push(format!(
                    "kprobe: calls that left the CPU cannot be proven on this kernel (it counts no kprobe program misses before 6.7, and the switch witness could not be attached to {}: {e}): they are counted unproven",
                    names::HELD_SWITCH_TARGET
                ));
                false
            }
        }
    }

    /// Switches that found a BPF section held, on every CPU so far.
    fn held_total(&self) -> u64 {
        (0..self.cpus)
            .map(|cpu| self.held_switches.get(cpu).held)
            .sum()
    }

    /// A reading of a probe's entry program misses, for the verifier.
    fn mark(&mut self, slot: usize) {
        let Some(a) = self.attached.iter().find(|a| a.slot as usize == slot) else {
            return;
        };
        let Some(fd) = a.programs.first().and_then(|p| self.prog_fds.get(p)) else {
            return;
        };
        let witnessed = self
            .witness
            .as_ref()
            .is_some_and(|w| w.slots.contains(&(slot as u32)));
        let before = monotonic_ns();
        let mut misses = program_cost("", fd).recursion_misses;
        if witnessed {
            misses += self.held_total();
        }
        let after = monotonic_ns();
        self.verifier.mark(
            slot,
            Mark {
                before,
                misses,
                after,
            },
        );
    }

    /// Every call site's calls by probe slot, the kernel's and the confirmed ones, named, the
    /// costliest first. Read through the map syscalls, which keep kprobe programs on the
    /// reading CPU from running meanwhile (their misses are counted): only with `--callers`,
    /// once a tick, a few microseconds per site.
    fn sites(&mut self) -> HashMap<u32, Vec<crate::callers::Site>> {
        let Some(m) = &self.callers else {
            return HashMap::new();
        };
        let by = breakdown(
            m,
            |k| (k.probe, k.ctx, k.caller),
            self.verifier.callers.as_ref(),
            self.probes,
        );
        self.names.resolve(by.keys().map(|k| k.2));
        let mut out = by_probe(by, |a| self.names.name(a));
        for v in out.values_mut() {
            v.sort_by(|a, b| b.sum_ns.cmp(&a.sum_ns).then(a.addr.cmp(&b.addr)));
        }
        out
    }

    /// The sampled short stacks by probe slot, named, the most sampled first: the tracer's own
    /// frames left out (see `crate::callers::strip_tracer_frames`), `stack_shown` frames
    /// kept, stacks that became one merged.
    fn stack_rows(&mut self) -> HashMap<u32, Vec<crate::callers::Stack>> {
        use crate::callers::Stack;
        let mut by: HashMap<(u32, u32, Vec<u64>), Stack> = HashMap::new();
        let Some(m) = &self.stacks else {
            return HashMap::new();
        };
        let all: Vec<(StackKey, u64)> = m.iter().flatten().collect();
        self.names.resolve(all.iter().flat_map(|(k, _)| k.frames));
        for (k, count) in all {
            let raw: Vec<(u64, String)> = k
                .frames
                .iter()
                .copied()
                .take_while(|f| *f != 0)
                .map(|f| {
                    let n = if f == memcg_trace_common::STACK_UNWOUND {
                        "(not unwound)".to_string()
                    } else {
                        self.names.name(f)
                    };
                    (f, n)
                })
                .collect();
            let mut kept = crate::callers::strip_tracer_frames(raw);
            kept.truncate(self.stack_shown as usize);
            let (frames, names): (Vec<u64>, Vec<String>) = kept.into_iter().unzip();
            by.entry((k.probe, k.ctx, frames.clone()))
                .or_insert_with(|| Stack {
                    ctx: k.ctx,
                    frames,
                    names,
                    count: 0,
                })
                .count += count;
        }
        let mut out: HashMap<u32, Vec<Stack>> = HashMap::new();
        for ((probe, _, _), stack) in by {
            out.entry(probe).or_default().push(stack);
        }
        for v in out.values_mut() {
            v.sort_by(|a, b| b.count.cmp(&a.count).then(a.frames.cmp(&b.frames)));
        }
        out
    }

    /// Every charged memcg's calls by probe slot, the kernel's and the confirmed ones, named by
    /// cgroup path, the costliest (counts only: the most called) first. Read through the map
    /// syscalls, as the call sites are: only with `--by-memcg`, once a tick.
    fn memcg_rows(&mut self) -> HashMap<u32, Vec<crate::callers::Site>> {
        let Some(m) = &self.memcgs else {
            return HashMap::new();
        };
        let by = breakdown(
            m,
            |k| (k.probe, k.ctx, k.memcg),
            self.verifier.memcgs.as_ref(),
            self.probes,
        );
        self.memcg_names.resolve(by.keys().map(|k| k.2));
        let mut out = by_probe(by, |id| self.memcg_names.name(id));
        for v in out.values_mut() {
            v.sort_by(|a, b| {
                (b.sum_ns, b.count)
                    .cmp(&(a.sum_ns, a.count))
                    .then(a.addr.cmp(&b.addr))
                    .then(a.ctx.cmp(&b.ctx))
            });
        }
        out
    }

    /// Takes in the deferred pairs and confirms those that can be.
    fn settle_deferred(&mut self) {
        for slot in 0..self.attached.len() {
            self.mark(slot);
        }
        while let Some(item) = self.ring.next() {
            if item.len() >= std::mem::size_of::<Deferred>() {
                // SAFETY: the programs write whole Deferred records; read unaligned.
                let d = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<Deferred>()) };
                self.verifier.push(d);
            }
        }
        self.verifier.settle();
    }

    /// The kernel's statistics of one program of the object.
    fn cost(&self, prog: &str) -> ProgCost {
        match self.prog_fds.get(prog) {
            Some(fd) => program_cost(prog, fd),
            None => ProgCost {
                name: prog.to_string(),
                ..Default::default()
            },
        }
    }

    /// The code of one attached program of the object, as the kernel runs it.
    pub fn code(&self, prog: &str) -> Option<proginfo::ProgCode> {
        proginfo::code(self.prog_fds.get(prog)?.as_fd()).ok()
    }

    /// Forwards the programs' diagnostics, if they are on.
    pub fn flush_log(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }

    /// Time since the first probe was attached: the clock of every snapshot's `elapsed`.
    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Detaches every program, then takes the final snapshot: no run is left uncounted between
    /// the read of the maps and the read of the run statistics, and every deferred pair is
    /// decided.
    pub fn finish(&mut self) -> Result<Snapshot> {
        let elapsed = self.started.elapsed();
        self.ended = Some(Instant::now());
        self.detach_all();
        self.flush_log();
        let mut snap = self.snapshot()?;
        snap.elapsed = elapsed;
        snap.pending = self.pending_calls()?;
        Ok(snap)
    }

    /// Calls still pending in the programs' slots, per probe slot (after detaching: read with
    /// the map syscalls, no program runs any more).
    fn pending_calls(&self) -> Result<Vec<u64>> {
        let map = self
            .ebpf
            .map(names::MAP_CPU_STATE)
            .ok_or_else(|| anyhow!("map {} missing", names::MAP_CPU_STATE))?;
        let states: aya::maps::PerCpuArray<_, memcg_trace_common::CpuState> =
            aya::maps::PerCpuArray::try_from(map)?;
        let states = states
            .get(&0, 0)
            .context("reading the pending calls (CPU_STATE)")?;
        let mut out = vec![0; self.attached.len()];
        for (slot, n) in out.iter_mut().enumerate() {
            for st in states.iter() {
                *n += st.pending[slot].calls.iter().filter(|c| c.key != 0).count() as u64;
            }
        }
        Ok(out)
    }

    /// Reads what the programs counted, summed over CPUs, with the deferred pairs confirmed so
    /// far.
    pub fn snapshot(&mut self) -> Result<Snapshot> {
        self.settle_deferred();
        self.update_workload_memcgs();
        let mut sites = self.sites();
        let mut memcgs = self.memcg_rows();
        let mut stacks = self.stack_rows();
        let mut probes = Vec::with_capacity(self.attached.len());
        // The tracepoint programs' per-CPU hits, read once for every probe (one syscall; no
        // kprobe program exists to miss runs while it reads).
        let tp_states = if self.tp_percpu && self.attached.iter().any(|a| !a.backend.has_latency())
        {
            let map = self
                .ebpf
                .map(names::MAP_CPU_STATE)
                .ok_or_else(|| anyhow!("map {} missing", names::MAP_CPU_STATE))?;
            let states: PerCpuArray<_, memcg_trace_common::CpuState> = PerCpuArray::try_from(map)?;
            Some(
                states
                    .get(&0, 0)
                    .with_context(|| format!("read {}", names::MAP_CPU_STATE))?,
            )
        } else {
            None
        };
        for a in &self.attached {
            // The kernel's counts of the kprobe events: (kretprobe, hits, misses). Read before
            // the programs' counters, so that a hit counted here has run (or was skipped)
            // before they are read: hits less runs never exceeds the runs skipped (exact once
            // the probes are detached).
            let profiles: Vec<(bool, u64, u64)> = a
                .programs
                .iter()
                .filter_map(|p| match self.kprobes.get(p) {
                    Some(k) => k.profile().map(|(hits, missed)| (k.ret, hits, missed)),
                    None => self.kprobes_closed.get(p).copied(),
                })
                .collect();
            let mut contexts: [CtxStats; NUM_CTX] = Default::default();
            // The programs time a workload's call, and count its exit, in its workload cell
            // only (one record per call; its entry is counted in the context's cell); the
            // context's figures hold both. The task context only, unless the workload is told
            // by the memcg charged.
            let wc = self.workload_contexts;
            let workload_cells = |cpu: u32, ctx: u32| {
                (a.backend.has_latency() && (ctx == CTX_TASK || wc > 1))
                    .then(|| workload_cell(cpu, self.probes, a.slot, ctx, wc) as usize)
            };
            // The workload's row from the very reads that go into the contexts, so that it
            // never holds calls they do not (the maps change while read).
            let mut workload_read = HistData::default();
            for (ctx, stats) in contexts.iter_mut().enumerate() {
                for cpu in 0..self.cpus as u32 {
                    let i = cell(cpu, self.probes, a.slot, ctx as u32) as usize;
                    let c = self.cells.get(i);
                    stats.hist.add_cpu(&c.hist);
                    stats.counters.add(&c.counters);
                    if let Some(w) = workload_cells(cpu, ctx as u32) {
                        let c = self.workload_cells.get(w);
                        stats.hist.add_cpu(&c.hist);
                        stats.counters.add(&c.counters);
                        workload_read.add_cpu(&c.hist);
                    }
                }
                if let (Some(states), false) = (&tp_states, a.backend.has_latency()) {
                    let i = (a.slot as usize * NUM_CTX + ctx) & (TP_CELLS - 1);
                    for st in states.iter() {
                        let [hits, workload_hits] = st.tp_hits[i];
                        stats.counters.entries += hits;
                        stats.counters.workload_hits += workload_hits;
                    }
                }
                let out = &self.verifier.outcomes[a.slot as usize][ctx];
                stats.hist.merge(&out.hist);
                stats.confirmed = out.hist.count;
                stats.rejected = out.rejected;
                stats.unproven_nested_ns = out.unproven_nested_ns;
                // The snapshot's off-CPU figures cover every timed call: the kernel's and the
                // confirmed ones.
                let c = &mut stats.counters;
                c.off_cpu_ns += out.off_cpu_ns;
                c.off_cpu_max_ns = c.off_cpu_max_ns.max(out.off_cpu_max_ns);
                c.off_cpu_unknown += out.off_cpu_unknown;
                c.self_unknown += out.self_unknown;
                c.outermost_ns += out.outermost_ns;
                // Where the task clock leaves out interrupt and steal time, every call that
                // left the CPU (and whose time off it is not unknown anyway) has only a lower
                // bound of it.
                stats.off_cpu_at_least = if self.task_clock_excludes.is_some() {
                    stats
                        .counters
                        .switched
                        .saturating_sub(stats.counters.off_cpu_unknown)
                } else {
                    0
                };
            }
            let workload = self.workload.then(|| {
                let mut w = HistData::default();
                if a.backend.has_latency() {
                    w = workload_read.clone();
                    w.merge(&self.verifier.workload[a.slot as usize]);
                } else {
                    // Counts only, kept next to the hits (in every context where the workload
                    // is told by its memcg).
                    w.count = contexts.iter().map(|c| c.counters.workload_hits).sum();
                }
                w
            });
            // A kprobe and a kretprobe on one function are one aggregated kprobe to the
            // kernel: a hit it cannot handle (another kprobe running on that CPU) is a miss of
            // both events, for one call neither program sees. The kretprobe's own misses
            // beyond that (no free instance) are calls whose entry ran: already lost.
            let kprobe_missed = profiles.iter().filter(|p| !p.0).map(|p| p.2).sum();
            // Every run of an entry program counts one entry (or an entry whose context or
            // state could not be read), every run of an exit program one exit.
            let runs = |exit: bool| -> u64 {
                contexts
                    .iter()
                    .map(|c| {
                        let c = &c.counters;
                        if exit {
                            c.exits + c.no_context_exits
                        } else {
                            c.entries + c.no_context_entries
                        }
                    })
                    .sum()
            };
            // Runs skipped at entry and at exit, per side; a call counted nowhere had both
            // skipped (one skipped at one side only is an orphan exit or a stale entry, lost):
            // at most the fewer of the two.
            let skipped = |ret: bool| -> Option<u64> {
                profiles
                    .iter()
                    .filter(|p| p.0 == ret)
                    .map(|&(_, hits, _)| hits.saturating_sub(runs(ret)))
                    .reduce(|a, b| a + b)
            };
            let kprobe_skipped = match (skipped(false), skipped(true)) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(0),
            };
            probes.push(ProbeStats {
                workload,
                name: a.name.clone(),
                target: a.target.clone(),
                backend: a.backend,
                contexts,
                programs: a.programs.iter().map(|p| self.cost(p)).collect(),
                kprobe_missed,
                kprobe_skipped,
                held_switches: self
                    .witness
                    .as_ref()
                    .is_some_and(|w| w.slots.contains(&a.slot))
                    .then(|| self.held_total()),
                window: Some(
                    self.ended
                        .unwrap_or_else(Instant::now)
                        .saturating_duration_since(a.opened),
                ),
                callers: sites.remove(&a.slot).unwrap_or_default(),
                memcgs: memcgs.remove(&a.slot).unwrap_or_default(),
                stacks: stacks.remove(&a.slot).unwrap_or_default(),
                stack_sample: self.stack_sample,
            });
        }
        Ok(Snapshot {
            elapsed: self.started.elapsed(),
            probes,
            extra: self.extra.iter().map(|p| self.cost(p)).collect(),
            waiting: self.verifier.waiting() as u64,
            pending: Vec::new(),
            bpf_stats: self.stats.is_some(),
            no_context_split: self.no_context_split,
        })
    }
}

/// A breakdown of the calls (call sites, charged memcgs) by (probe slot, context, id): what the
/// kernel's map holds (`key` gives a key's triple), with the calls userspace confirmed added.
fn breakdown<K: aya::Pod>(
    map: &aya::maps::HashMap<MapData, K, CallerStat>,
    key: impl Fn(&K) -> (u32, u32, u64),
    confirmed: Option<&crate::callers::Confirmed>,
    probes: u32,
) -> HashMap<(u32, u32, u64), crate::callers::Site> {
    use crate::callers::Site;
    let mut by: HashMap<(u32, u32, u64), Site> = HashMap::new();
    for (k, v) in map.iter().flatten() {
        let (probe, ctx, id) = key(&k);
        let s = by
            .entry((probe, ctx, id))
            .or_insert_with(|| Site::new(ctx, id));
        s.count += v.count;
        s.sum_ns += v.sum_ns;
        for (a, b) in s.buckets.iter_mut().zip(v.buckets.iter()) {
            *a += b;
        }
    }
    if let Some(c) = confirmed {
        for slot in 0..probes {
            for site in c.of(slot) {
                by.entry((slot, site.ctx, site.addr))
                    .or_insert_with(|| Site::new(site.ctx, site.addr))
                    .merge(site);
            }
        }
    }
    by
}

/// A breakdown's rows by probe slot, each named by `name` of its id.
fn by_probe(
    by: HashMap<(u32, u32, u64), crate::callers::Site>,
    name: impl Fn(u64) -> String,
) -> HashMap<u32, Vec<crate::callers::Site>> {
    let mut out: HashMap<u32, Vec<crate::callers::Site>> = HashMap::new();
    for ((probe, _, _), mut site) in by {
        site.name = name(site.addr);
        out.entry(probe).or_default().push(site);
    }
    out
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.detach_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_is_its_function() {
        assert!(same_function(
            "__memcg_slab_post_alloc_hook",
            "__memcg_slab_post_alloc_hook"
        ));
        assert!(same_function(
            "__mod_memcg_state.part.0",
            "__mod_memcg_state"
        ));
        assert!(!same_function("mod_memcg_state", "__mod_memcg_state"));
        assert!(!same_function(
            "obj_cgroup_charge",
            "obj_cgroup_charge_account"
        ));
    }

    /// The legacy object below 5.19 (bpf_map_lookup_percpu_elem), direct task reads from 5.11
    /// (bpf_get_current_task_btf); an unknown version takes the full object.
    #[test]
    fn object_and_reads_by_kernel_version() {
        assert_eq!(Object::for_kernel(Some((5, 10))), Object::Legacy);
        assert_eq!(Object::for_kernel(Some((5, 18))), Object::Legacy);
        assert_eq!(Object::for_kernel(Some((5, 19))), Object::Full);
        assert_eq!(Object::for_kernel(Some((6, 1))), Object::Full);
        assert_eq!(Object::for_kernel(None), Object::Full);
        assert!(needs_probe_read(Some((5, 10))));
        assert!(!needs_probe_read(Some((5, 11))));
        assert!(!needs_probe_read(None));
        // The legacy object leaves the migrated-call search (a bpf_loop callback) out.
        let has = |o: &[u8], s: &[u8]| o.windows(s.len()).any(|w| w == s);
        if !EBPF_OBJECT.is_empty() {
            assert!(has(EBPF_OBJECT, b"search_cpu"));
            assert!(!has(EBPF_LEGACY, b"search_cpu"));
            assert!(has(EBPF_LEGACY, b"fexit_lean_0"));
        }
    }

    /// Every probe slot's programs are one code: linked with their subprograms (as the loader
    /// links them), slot k's instructions are slot 0's but for the one that loads the slot
    /// number. The floor is measured with a spare slot's programs and taken out of every
    /// traced slot's samples; while the compiler folded the slot in, the slots' programs
    /// differed in length (fentry_lean 999 instructions in slot 0, 1032 in the others; fentry
    /// 1750-1771 across the slots) and the floor's window was a few instructions off the
    /// traced one's (under an instruction-counted clock, fentry's own time per call of
    /// obj_cgroup_charge moved from 66.9 to 69.0 ns with a change elsewhere in the programs,
    /// while the function did not change).
    #[test]
    fn slot_programs_are_one_code() {
        for (what, bytes) in [("full", EBPF_OBJECT), ("legacy", EBPF_LEGACY)] {
            if bytes.is_empty() {
                eprintln!(
                    "skipping slot_programs_are_one_code: built with AYA_BUILD_SKIP (no eBPF object)"
                );
                return;
            }
            let mut obj = aya_obj::Object::parse(bytes).expect("the eBPF object");
            let text: std::collections::HashSet<usize> =
                obj.functions.keys().map(|(s, _)| *s).collect();
            // Each map (and global) as a file descriptor of its own, as the loader relocates
            // them: two slots that read different maps or globals differ here.
            let maps = obj.maps.clone();
            obj.relocate_maps(
                maps.iter()
                    .enumerate()
                    .map(|(i, (name, m))| (name.as_str(), 1000 + i as std::os::fd::RawFd, m)),
                &text,
            )
            .expect("the maps relocated");
            obj.relocate_calls(&text).expect("the calls linked");
            // (code, dst, src, off, imm) of each instruction of a program as linked.
            let insns = |name: &str| -> Vec<(u8, u8, u8, i16, i32)> {
                let p = obj
                    .programs
                    .get(name)
                    .unwrap_or_else(|| panic!("{what}: program {name} missing"));
                obj.functions[&p.function_key()]
                    .instructions
                    .iter()
                    .map(|i| (i.code, i.dst_reg(), i.src_reg(), i.off, i.imm))
                    .collect()
            };
            for family in [
                names::FENTRY,
                names::FEXIT,
                names::FENTRY_LEAN,
                names::FEXIT_LEAN,
                names::KPROBE,
                names::KRETPROBE,
                names::TP,
            ] {
                let first = insns(family[0]);
                for (k, name) in family.iter().enumerate().skip(1) {
                    let other = insns(name);
                    assert_eq!(
                        other.len(),
                        first.len(),
                        "{what}: {name} has {} instructions, {} {}",
                        other.len(),
                        family[0],
                        first.len()
                    );
                    let differ: Vec<usize> =
                        (0..first.len()).filter(|&i| first[i] != other[i]).collect();
                    // The one difference: a 64-bit move of an immediate into the same
                    // register (BPF_ALU64 | BPF_MOV | BPF_K), the slot number apart.
                    let [i] = differ[..] else {
                        panic!(
                            "{what}: {name} differs from {} in instructions {differ:?}",
                            family[0]
                        );
                    };
                    let (a, b) = (first[i], other[i]);
                    assert!(
                        a.0 == 0xb7 && b.0 == 0xb7 && a.1 == b.1 && b.4 - a.4 == k as i32,
                        "{what}: {name} differs from {} at instruction {i}: {a:?} against {b:?}",
                        family[0]
                    );
                }
            }
        }
    }

    #[test]
    fn lean_programs_only_where_what_they_fold_away_holds() {
        let direct = KernelLayout {
            direct_task: 1,
            direct_cgroup: 1,
            ..Default::default()
        };
        let usual = LoadOptions {
            workload_cgroup: 7,
            workload_owned: true,
            probes: 3,
            ..Default::default()
        };
        assert!(lean_programs(&usual, &direct));
        assert_eq!(
            slot_programs(Backend::Fentry, 3, true),
            ["fentry_lean_3", "fexit_lean_3"]
        );
        assert_eq!(
            slot_programs(Backend::Fentry, 3, false),
            ["fentry_3", "fexit_3"]
        );
        // kprobes and tracepoints have one build.
        assert_eq!(
            slot_programs(Backend::Kprobe, 3, true),
            ["kprobe_3", "kretprobe_3"]
        );
        assert_eq!(slot_programs(Backend::Tracepoint, 3, true), ["tp_3"]);
        // Any setting the lean programs fold away as off takes the general ones.
        for o in [
            LoadOptions {
                features: Features {
                    callers: true,
                    stack_depth: 4,
                    ..usual.features
                },
                ..usual
            },
            LoadOptions {
                features: Features {
                    by_memcg: true,
                    ..usual.features
                },
                ..usual
            },
            LoadOptions {
                features: Features {
                    workload_memcg: true,
                    ..usual.features
                },
                ..usual
            },
        ] {
            assert!(!lean_programs(&o, &direct), "{o:?}");
        }
        // So does a kernel where the task or its cgroup are not plain loads (or --probe-read,
        // which turns direct task reads off).
        for l in [
            KernelLayout {
                direct_task: 0,
                ..direct
            },
            KernelLayout {
                direct_cgroup: 0,
                ..direct
            },
        ] {
            assert!(!lean_programs(&usual, &l));
        }
    }
}
