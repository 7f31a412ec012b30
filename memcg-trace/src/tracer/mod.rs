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
    maps::{MapData, PerCpuArray, RingBuf},
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
/// `workload_contexts` per CPU and probe slot) and the switch witness's counts.
fn map_shared_arrays(
    ebpf: &Ebpf,
    cpus: usize,
    probes: usize,
    workload_contexts: usize,
) -> Result<(Shared<Cell>, Shared<Cell>, Shared<HeldSwitches>)> {
    let map = |name: &str| {
        ebpf.map(name)
            .ok_or_else(|| anyhow!("map {name} missing from the object"))
    };
    Ok((
        Shared::new(
            names::MAP_CELLS,
            map(names::MAP_CELLS)?,
            cpus * probes * NUM_CTX,
        )?,
        Shared::new(
            names::MAP_WORKLOAD_CELLS,
            map(names::MAP_WORKLOAD_CELLS)?,
            cpus * probes * workload_contexts,
        )?,
        Shared::new(
            names::MAP_HELD_SWITCHES,
            map(names::MAP_HELD_SWITCHES)?,
            cpus,
        )?,
    ))
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
        let workload_contexts = workload_contexts(opts.features.workload_memcg);
        let (shared_cells, workload_cells, held_switches) =
            map_shared_arrays(&ebpf, cpus, probes as usize, workload_contexts as usize)?;
        let ring = RingBuf::try_from(
            ebpf.take_map(names::MAP_DEFERRED)
                .ok_or_else(|| anyhow!("map {} missing", names::MAP_DEFERRED))?,
        )
        .context("the ring buffer of deferred pairs")?;
        let tp_percpu = opts.no_kprobes;
        // The kernel's symbols are copied now, while they can be read.
        let mut calibration = Vec::new();
        let object = front.object;
        let names = if opts.features.callers {
            let (n, why) = crate::callers::Names::new();
            if let Some(why) = why {
                calibration.push(format!("--callers: call sites shown as addresses: {why}"));
            }
            n
        } else {
            Default::default()
        };
        let callers = read::Breakdown::take(
            &mut ebpf,
            names::MAP_CALLERS,
            names::MAP_CALLER_FRONT,
            opts.features.callers,
            front,
        )
        .context("the call sites")?;
        let memcgs = read::Breakdown::take(
            &mut ebpf,
            names::MAP_MEMCGS,
            names::MAP_MEMCG_FRONT,
            opts.features.by_memcg,
            front,
        )
        .context("the memcgs")?;
        let stacks = take_hash(
            &mut ebpf,
            names::MAP_STACKS,
            opts.features.callers && opts.features.stack_depth > 0,
            "the short stacks",
        )?;
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
            assert!(has(EBPF_LEGACY, b"fexit_patched_0"));
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
                names::FENTRY_PATCHED,
                names::FEXIT_PATCHED,
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

    /// Every probe slot's patched and lean pairs load each `LeanField` through its marker (the
    /// loader's `patch::lean_fields` then writes the kernel's offset into them), and the
    /// general pairs none: a build that lost its marked loads would read the fields through
    /// the layout instead, or the general programs would be refused where the loader does not
    /// patch. Counted per pair, in each program's own instructions.
    #[test]
    fn patched_pairs_load_every_lean_field_by_marker_and_general_ones_none() {
        use memcg_trace_common::LeanField;
        for (what, bytes) in [("full", EBPF_OBJECT), ("legacy", EBPF_LEGACY)] {
            if bytes.is_empty() {
                eprintln!("skipping patched_pairs_load_every_lean_field_by_marker_and_general_ones_none: built with AYA_BUILD_SKIP (no eBPF object)");
                return;
            }
            let obj = aya_obj::Object::parse(bytes).expect("the eBPF object");
            // Marked u64 loads (BPF_LDX | BPF_MEM | BPF_DW) per field in one program.
            let marked = |name: &str| -> Vec<usize> {
                let p = obj
                    .programs
                    .get(name)
                    .unwrap_or_else(|| panic!("{what}: program {name} missing"));
                let insns = &obj.functions[&p.function_key()].instructions;
                LeanField::ALL
                    .iter()
                    .map(|f| {
                        insns
                            .iter()
                            .filter(|i| i.code == 0x79 && i.off == f.marker())
                            .count()
                    })
                    .collect()
            };
            for s in 0..memcg_trace_common::MAX_PROBES {
                for (entry, exit) in [
                    (names::FENTRY_PATCHED[s], names::FEXIT_PATCHED[s]),
                    (names::FENTRY_LEAN[s], names::FEXIT_LEAN[s]),
                ] {
                    let (a, b) = (marked(entry), marked(exit));
                    for (i, f) in LeanField::ALL.iter().enumerate() {
                        assert!(
                            a[i] + b[i] > 0,
                            "{what}: {entry}/{exit} load {f:?} by no marker"
                        );
                    }
                }
                for general in [
                    names::FENTRY[s],
                    names::FEXIT[s],
                    names::KPROBE[s],
                    names::KRETPROBE[s],
                ] {
                    assert!(
                        marked(general).iter().all(|&n| n == 0),
                        "{what}: {general} has marked loads"
                    );
                }
            }
        }
    }

    #[test]
    fn fentry_builds_only_where_what_they_fold_away_holds() {
        use FentryBuild::*;
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
        assert_eq!(fentry_build(&usual, &direct), Lean);
        assert_eq!(
            slot_programs(Backend::Fentry, 3, Lean),
            ["fentry_lean_3", "fexit_lean_3"]
        );
        assert_eq!(
            slot_programs(Backend::Fentry, 3, Patched),
            ["fentry_patched_3", "fexit_patched_3"]
        );
        assert_eq!(
            slot_programs(Backend::Fentry, 3, General),
            ["fentry_3", "fexit_3"]
        );
        // kprobes and tracepoints have one build.
        for b in [General, Patched, Lean] {
            assert_eq!(
                slot_programs(Backend::Kprobe, 3, b),
                ["kprobe_3", "kretprobe_3"]
            );
            assert_eq!(slot_programs(Backend::Tracepoint, 3, b), ["tp_3"]);
        }
        // Any setting the lean programs fold away as off takes the patched ones.
        let opt_in = [
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
        ];
        for o in &opt_in {
            assert_eq!(fentry_build(o, &direct), Patched, "{o:?}");
        }
        // fentry runs that interleave (a preemptible kernel, or no context split) take the
        // general ones, whatever the settings.
        for o in opt_in.iter().chain([&usual]) {
            let o = LoadOptions {
                preemptible: true,
                ..*o
            };
            assert_eq!(fentry_build(&o, &direct), General, "{o:?}");
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
            // A task field beyond a load's 16-bit offset (patch::lean_fields).
            KernelLayout {
                task_migrations: 0x8000,
                ..direct
            },
        ] {
            assert_eq!(fentry_build(&usual, &l), General);
            assert_eq!(fentry_build(&opt_in[0], &l), General);
        }
    }
}
