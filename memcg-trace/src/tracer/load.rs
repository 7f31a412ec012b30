//! Loading the object: which one for this kernel, the options and features it is loaded with,
//! the globals and map sizes patched in, the programs attached and detached.

use super::*;

/// The eBPF object built by build.rs from memcg-trace-ebpf.
pub(super) static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memcg-trace"));

/// The same programs built for kernels before 5.19 (the eBPF crate's feature `legacy`).
pub(super) static EBPF_LEGACY: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memcg-trace-legacy"));

/// The environment variable that overrides the choice of object (`full` or `legacy`).
pub const OBJECT_ENV: &str = "MEMCG_TRACE_BPF_OBJECT";

/// Which build of the eBPF programs is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object {
    /// Every feature: the migrated-call search (`bpf_loop`, 5.17) and atomic claims of task
    /// slots (compare-and-swap, 5.12); from 5.19, where `bpf_map_lookup_percpu_elem` came,
    /// which the search used while the CPUs' states were a per-CPU map.
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
    /// the CPUs' states (see `Config::tp_percpu`).
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

/// How the slots in front of the breakdown maps are laid out (see `FrontSlot`): for the
/// probe slots and shards of the load, none with the legacy object (no compare-and-swap).
#[derive(Clone, Copy, Debug)]
pub(super) struct FrontSizes {
    pub probes: u32,
    pub shards: u32,
    pub object: Object,
}

impl FrontSizes {
    pub(super) fn new(probes: u32, cpus: u32, object: Object) -> Self {
        FrontSizes {
            probes: probes.max(1),
            shards: breakdown_shards(cpus),
            object,
        }
    }

    /// Entries of a breakdown's front array: 1 (none used) when the breakdown is off.
    pub(super) fn entries(self, wanted: bool) -> u32 {
        if wanted && self.object == Object::Full {
            front_entries(self.probes, self.shards)
        } else {
            1
        }
    }
}

/// The one way the object is loaded: kernel layout and settings patched into the programs'
/// read-only globals, the shared arrays sized for the CPUs and probes. With the log level 0
/// the verifier removes every log statement, so diagnostics cost nothing when off.
/// The loader is made without aya's parse of the kernel's BTF where it can be (`kbtf`); the
/// third value says why it could not; the fourth how the breakdowns' front slots were sized
/// (for the object chosen once, here).
pub(super) fn load_object(
    layout: &KernelLayout,
    o: &LoadOptions,
) -> Result<(Ebpf, KernelLayout, Option<String>, FrontSizes)> {
    let object = Object::chosen()?;
    let image = object.bytes();
    if image.is_empty() {
        bail!("this binary was built with AYA_BUILD_SKIP and carries no eBPF programs; rebuild it with `cargo xtask build`");
    }

    let cpus = possible_cpus() as u32;
    let probes = o.probes.max(1);
    let front = FrontSizes::new(probes, cpus, object);
    let config = config_of(o, cpus, probes);
    let level: u8 = if o.features.ebpf_log { 0xff } else { 0 };
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
        changed |= patch_direct_reads(bytes, &mut layout)?;
    }

    let object = changed.then_some(words);
    let bytes: &[u8] = match &object {
        // SAFETY: as above; the buffer outlives the load.
        Some(w) => unsafe { std::slice::from_raw_parts(w.as_ptr().cast(), image.len()) },
        None => image,
    };
    if !layout.masks_agree() {
        bail!(
            "internal error: the context masks' union {:#x} is not theirs (set them with KernelLayout::set_context_masks)",
            layout.interrupt_masks
        );
    }

    let (mut loader, loader_btf) = kbtf::loader(bytes);
    loader
        .override_global(names::GLOBAL_LAYOUT, &layout, true)
        .override_global(names::GLOBAL_CONFIG, &config, true)
        .override_global(aya_log::LEVEL, &level, true);
    for (map, entries) in map_sizes(o, &config, front) {
        loader.map_max_entries(map, entries);
    }
    loader
        .load(bytes)
        .map(|ebpf| (ebpf, layout, loader_btf, front))
        .map_err(|e| anyhow!("loading the eBPF object failed: {}", chain(&e)))
}

/// The programs' read-only settings for a load with `o` on `cpus` CPUs and `probes` slots.
fn config_of(o: &LoadOptions, cpus: u32, probes: u32) -> Config {
    Config {
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
        shard_mask: breakdown_shards(cpus) - 1,
        spare: 0,
    }
}

/// Patches the object's `bytes` for plain loads where the kernel allows them, and says so in
/// `layout`: the preempt count through its named per-CPU variable, else through casts
/// (`bpf_rdonly_cast`) of addresses the programs find; the memcg chase and the call sites'
/// words through casts wherever the kernel has them. Whether anything was patched.
fn patch_direct_reads(bytes: &mut [u8], layout: &mut KernelLayout) -> Result<bool> {
    let mut changed = false;
    layout.direct_task = 1;

    // The patched programs' task fields at their offsets (`fentry_build` takes them only where
    // every offset fits).
    if let Some(offsets) = patch::lean_offsets(layout) {
        changed |= patch::lean_fields(bytes, &offsets)? > 0;
    }

    if layout.preempt_var_id != 0 && patch::percpu_var(bytes, layout.preempt_var_id)? > 0 {
        layout.direct_preempt = 1;
        changed = true;
    } else if layout.cast_kfunc_id != 0 && patch::rdonly_cast(bytes, layout.cast_kfunc_id)? > 0 {
        // The per-CPU variable cannot be named here (no data symbols in kallsyms): its
        // address, found by the programs, is read by a cast and a plain load instead.
        layout.direct_untrusted = 1;
        changed = true;
    }

    // The memcg chase and the call sites' reads by plain loads through the cast wherever the
    // kernel has it (the casts patched above, or here: the other reads through casts stay off
    // where the per-CPU variable is named, as they hang on `direct_untrusted`).
    if layout.cast_kfunc_id != 0 && layout.cast_u64_type_id != 0 {
        if layout.direct_untrusted != 0 {
            layout.direct_reads = 1;
        } else if patch::rdonly_cast(bytes, layout.cast_kfunc_id)? > 0 {
            layout.direct_reads = 1;
            changed = true;
        }
    }
    Ok(changed)
}

/// The entries of each map sized at load: the shared arrays for the CPUs and probe slots, the
/// optional maps at their size where their feature is on, else 1.
fn map_sizes(o: &LoadOptions, config: &Config, front: FrontSizes) -> [(&'static str, u32); 11] {
    let (cpus, probes) = (config.cpus, config.probes);
    let shards = breakdown_shards(cpus);
    let when = |on: bool, entries: u32| if on { entries } else { 1 };
    let features = &o.features;
    [
        (names::MAP_CELLS, cpus * probes * NUM_CTX as u32),
        (
            names::MAP_WORKLOAD_CELLS,
            cpus * probes * workload_contexts(features.workload_memcg),
        ),
        (names::MAP_DEFERRED, DEFERRED_BYTES),
        (names::MAP_HELD_SWITCHES, cpus),
        (names::MAP_CPU_STATE, cpus),
        (
            names::MAP_CALLERS,
            when(features.callers, MAX_CALLERS * shards),
        ),
        (
            names::MAP_MEMCGS,
            when(features.by_memcg, MAX_MEMCGS * shards),
        ),
        (names::MAP_CALLER_FRONT, front.entries(features.callers)),
        (names::MAP_MEMCG_FRONT, front.entries(features.by_memcg)),
        (names::MAP_STACKS, when(config.stack_depth > 0, MAX_STACKS)),
        (
            names::MAP_WORKLOAD_MEMCGS,
            when(features.workload_memcg, MAX_WORKLOAD_MEMCGS),
        ),
    ]
}

/// The level (`cgroup->level`) of this process's cgroup v2, as the kernel has it: the object
/// loaded once more, its maps at their smallest, for its test-run entry that reads it. Asked
/// only inside a cgroup namespace, where paths do not tell it.
pub fn own_cgroup_level(layout: &KernelLayout) -> Result<u32> {
    use aya::programs::{RawTracePoint, RawTracePointRunOptions, TestRun as _};
    let image = Object::chosen()?.bytes();
    if image.is_empty() {
        bail!("this binary carries no eBPF programs");
    }

    let (mut loader, _) = kbtf::loader(image);
    let mut ebpf = loader
        .override_global(names::GLOBAL_LAYOUT, layout, true)
        .override_global(names::GLOBAL_CONFIG, &Config::default(), true)
        .override_global(aya_log::LEVEL, &0u8, true)
        // The smallest ring buffer: one page.
        .map_max_entries(names::MAP_DEFERRED, 4096)
        .load(image)
        .map_err(|e| {
            anyhow!(
                "loading the eBPF object to read the cgroup level: {}",
                chain(&e)
            )
        })?;
    let prog: &mut RawTracePoint = ebpf
        .program_mut(names::OWN_CGROUP_LEVEL)
        .context("the cgroup level program")?
        .try_into()?;
    prog.load()
        .map_err(|e| anyhow!("loading the cgroup level program: {}", chain(&e)))?;
    let run = prog.test_run(RawTracePointRunOptions::new()).map_err(|e| {
        anyhow!(
            "BPF_PROG_TEST_RUN of the cgroup level program: {}",
            chain(&e)
        )
    })?;
    drop(ebpf);

    // What this load took goes back before the tracer's own.
    release_freed_memory();
    match run.return_value {
        0 => bail!("the kernel's layout of the task's cgroup is not known"),
        n => Ok(n - 1),
    }
}

/// Loads the program `name` (`p`) for `target` (a function or tracepoint; kprobes take theirs
/// at attach) and attaches it there; kprobes through a tracefs kprobe event named after it.
pub(super) fn load_and_attach(
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
    let attached = match p {
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
    attached.map(|_| None).map_err(|e| refused(chain(&e)))
}

/// Detaches and unloads a program of any of the types used here.
pub(super) fn unload(p: &mut Program) {
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
pub(super) fn dup_fd(p: &Program) -> Option<OwnedFd> {
    let fd = match p {
        Program::FEntry(p) => p.fd(),
        Program::FExit(p) => p.fd(),
        Program::KProbe(p) => p.fd(),
        Program::BtfTracePoint(p) => p.fd(),
        _ => return None,
    };
    fd.ok()?.as_fd().try_clone_to_owned().ok()
}

/// The build of the fentry/fexit programs a run takes: each folds away, at compile time, what
/// it was built for, so the loader takes the narrowest one whose conditions hold
/// ([`fentry_build`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FentryBuild {
    /// `names::FENTRY`: any kernel, any settings.
    General,
    /// `names::FENTRY_PATCHED`: runs that do not interleave on a CPU (counters by plain adds,
    /// the nesting always kept) and the task's fields and its cgroup by plain loads at offsets
    /// written into the loads (`patch::lean_fields`); any settings.
    Patched,
    /// `names::FENTRY_LEAN`: patched, and the plain settings: no call sites (nor their
    /// stacks), no charged memcgs.
    Lean,
}

/// The programs of one probe slot for a backend, entry first; `build`: which fentry/fexit
/// programs ([`fentry_build`]).
pub fn slot_programs(backend: Backend, slot: u32, build: FentryBuild) -> Vec<&'static str> {
    let index = slot as usize;
    match (backend, build) {
        (Backend::Fentry, FentryBuild::General) => vec![names::FENTRY[index], names::FEXIT[index]],
        (Backend::Fentry, FentryBuild::Patched) => {
            vec![names::FENTRY_PATCHED[index], names::FEXIT_PATCHED[index]]
        }
        (Backend::Fentry, FentryBuild::Lean) => {
            vec![names::FENTRY_LEAN[index], names::FEXIT_LEAN[index]]
        }
        (Backend::Kprobe, _) => vec![names::KPROBE[index], names::KRETPROBE[index]],
        (Backend::Tracepoint, _) => vec![names::TP[index]],
    }
}

/// The fentry/fexit build ([`FentryBuild`]) that serves settings `o` on a kernel whose layout,
/// as loaded, is `loaded`: the narrowest whose conditions hold.
pub fn fentry_build(o: &LoadOptions, loaded: &KernelLayout) -> FentryBuild {
    let patched = !o.preemptible
        && loaded.direct_task != 0
        && loaded.direct_cgroup != 0
        && patch::lean_offsets(loaded).is_some();
    let plain = !o.features.callers && !o.features.by_memcg && !o.features.workload_memcg;
    match (patched, plain) {
        (true, true) => FentryBuild::Lean,
        (true, false) => FentryBuild::Patched,
        (false, _) => FentryBuild::General,
    }
}

/// A log sink for the programs' diagnostics: one line each on stderr.
pub(super) struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        eprintln!("memcg-trace: ebpf {}: {}", record.level(), record.args());
    }

    fn flush(&self) {}
}
