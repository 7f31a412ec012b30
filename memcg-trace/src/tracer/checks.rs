//! The programs' code checked on the running kernel: bucketing and pairing run through
//! BPF_PROG_TEST_RUN on given inputs, the context classification on tracepoints of known
//! context, and the instrumentation floor measured around a function that does almost nothing.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{
    maps::{Map, MapData, PerCpuArray, RingBuf},
    programs::{FExit, RawTracePoint, RawTracePointRunOptions, TestRun as _},
    Btf, Ebpf,
};
use memcg_trace_common::{
    cell, ctx_check_index, names, test_op, workload_cell, CallerKey, Cell, Counters, CtxUse,
    Deferred, KernelLayout, MemcgKey, CTX_CHECK_COLS, CTX_CHECK_ROWS, CTX_NAMES, CTX_SOURCES,
    CTX_TASK, MAX_PROBES, NUM_CTX,
};

use super::{
    chain, load_and_attach, load_object, possible_cpus, shared::Shared, unload, FrontSizes,
    LoadOptions, Tracer,
};
pub use crate::model::{Floor, FLOOR_FUNCTION};
use crate::{figures, probes::Backend, snapshot::HistData};

/// The object loaded for the self-test, with its test program.
struct TestRig {
    ebpf: Ebpf,
    cpus: usize,
    /// How the breakdowns' front slots were sized at load.
    front: FrontSizes,
}

impl TestRig {
    fn new(layout: &KernelLayout, preemptible: bool, kprobe_defers: bool) -> Result<TestRig> {
        let (mut ebpf, _, _, front) = load_object(
            layout,
            &LoadOptions {
                probes: MAX_PROBES as u32,
                preemptible,
                kernel_preemptible: kprobe_defers,
                // The sequences' calls go through the per-site and per-memcg counting too.
                features: super::Features {
                    callers: true,
                    by_memcg: true,
                    ..Default::default()
                },
                ..Default::default()
            },
        )?;
        let prog: &mut RawTracePoint = ebpf
            .program_mut(names::SELFTEST)
            .context("selftest program")?
            .try_into()?;
        prog.load()
            .map_err(|e| anyhow!("load selftest: {}", chain(&e)))?;
        Ok(TestRig {
            ebpf,
            cpus: possible_cpus(),
            front,
        })
    }

    /// Runs the test program once with `args` (op, probe, key, ctx, task, switch count, now,
    /// flags, misses, misses known, CPU clocks not comparable, off-CPU clock) on `cpu`.
    fn run(&self, cpu: Option<u32>, args: [u64; 12]) -> Result<i32> {
        let prog: &RawTracePoint = self
            .ebpf
            .program(names::SELFTEST)
            .context("selftest program")?
            .try_into()?;
        let mut opts = RawTracePointRunOptions::new();
        opts.args[..12].copy_from_slice(&args);
        opts.cpu = cpu;
        let r = prog
            .test_run(opts)
            .map_err(|e| anyhow!("BPF_PROG_TEST_RUN: {}", chain(&e)))?;
        Ok(r.return_value as i32)
    }

    fn shared<T: Copy>(&self, name: &str, entries: usize) -> Result<Shared<T>> {
        Shared::new(
            name,
            self.ebpf
                .map(name)
                .ok_or_else(|| anyhow!("map {name} missing"))?,
            entries,
        )
    }

    /// Counters and histogram of (probe, ctx), summed over CPUs, as the tracer reads them: the
    /// task context's include the workload's calls (timed, and their exits counted, in their
    /// workload cell only); the third is the workload's histogram.
    fn read(&self, probe: u32, ctx: u32) -> Result<(Counters, HistData, HistData)> {
        let cells: Shared<Cell> =
            self.shared(names::MAP_CELLS, self.cpus * MAX_PROBES * NUM_CTX)?;
        let workload: Shared<Cell> =
            self.shared(names::MAP_WORKLOAD_CELLS, self.cpus * MAX_PROBES)?;
        let (mut c, mut h, mut w) = (
            Counters::default(),
            HistData::default(),
            HistData::default(),
        );
        for cpu in 0..self.cpus as u32 {
            let mut add = |cl: Cell| {
                c.add(&cl.counters);
                h.add_cpu(&cl.hist);
            };
            add(cells.get(cell(cpu, MAX_PROBES as u32, probe, ctx) as usize));
            if ctx == CTX_TASK {
                let cl =
                    workload.get(workload_cell(cpu, MAX_PROBES as u32, probe, ctx, 1) as usize);
                w.add_cpu(&cl.hist);
                add(cl);
            }
        }
        Ok((c, h, w))
    }

    /// Empties every map the programs keep state in, as if the object had just been loaded:
    /// arrays zeroed, hash maps emptied, the ring drained. The read-only globals (the config
    /// the object was verified with) stay. Verifying the object again costs seconds of a
    /// guest under emulation a sequence; emptying it, milliseconds.
    fn reset(&mut self) -> Result<()> {
        self.deferred()?;
        for (name, map) in self.ebpf.maps() {
            let (data, per_cpu, hash): (&MapData, bool, bool) = match map {
                // Globals (`.rodata`, `.bss`, `.data`): the read-only config is frozen, and the
                // programs keep no state in writable globals.
                _ if name.starts_with('.') => continue,
                Map::Array(d) => (d, false, false),
                Map::PerCpuArray(d) => (d, true, false),
                Map::HashMap(d) | Map::LruHashMap(d) => (d, false, true),
                Map::PerCpuHashMap(d) | Map::PerCpuLruHashMap(d) => (d, true, true),
                // The ring is drained above; no other kind holds a sequence's state.
                _ => continue,
            };
            empty_map(data, per_cpu, hash, self.cpus)
                .with_context(|| format!("emptying map {name}"))?;
        }
        Ok(())
    }

    /// Deferred pairs in the ring buffer.
    fn deferred(&mut self) -> Result<Vec<Deferred>> {
        let map = self
            .ebpf
            .map_mut(names::MAP_DEFERRED)
            .ok_or_else(|| anyhow!("map {} missing", names::MAP_DEFERRED))?;
        let mut ring = RingBuf::try_from(map)?;
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            // SAFETY: the programs write whole Deferred records.
            out.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<Deferred>()) });
        }
        Ok(out)
    }
}

/// `bpf(cmd, attr)` for the map element commands: (map fd, key, value or next key, flags).
fn map_elem(cmd: libc::c_long, fd: i32, key: *const u8, value: *mut u8) -> std::io::Result<()> {
    #[repr(C)]
    struct Attr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }

    let mut attr = Attr {
        map_fd: fd as u32,
        _pad: 0,
        key: key as u64,
        value: value as u64,
        flags: 0,
    };

    // SAFETY: the attribute and the buffers it points to outlive the call; their sizes are the
    // map's key and value sizes, as the caller allocated them.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            &mut attr as *mut Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Zeroes every element of an array map, or deletes every key of a hash map.
fn empty_map(data: &MapData, per_cpu: bool, hash: bool, cpus: usize) -> Result<()> {
    const UPDATE: libc::c_long = 2;
    const DELETE: libc::c_long = 3;
    const NEXT_KEY: libc::c_long = 4;
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let info = data.info()?;
    let fd = data.fd().as_fd().as_raw_fd();
    let mut key = vec![0u8; info.key_size() as usize];
    if hash {
        // Always the first key: each is deleted before the next is asked for; ENOENT: empty.
        loop {
            match map_elem(NEXT_KEY, fd, std::ptr::null(), key.as_mut_ptr()) {
                Ok(()) => map_elem(DELETE, fd, key.as_ptr(), std::ptr::null_mut())?,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    // A per-CPU value is one 8-byte aligned slot per possible CPU.
    let value_size = info.value_size() as usize;
    let size = if per_cpu {
        value_size.next_multiple_of(8) * cpus
    } else {
        value_size
    };
    let mut zero = vec![0u8; size];

    // A mappable array (the cells, the breakdowns' front slots: thousands of elements of
    // kilobytes) is read through a mapping and only its elements that hold something are
    // written: a system call each costs tens of microseconds in an emulated guest.
    const BPF_F_MMAPABLE: u32 = 1 << 10;
    let held = (!per_cpu && info.map_flags() & BPF_F_MMAPABLE != 0)
        .then(|| elements_held(fd, size, info.max_entries() as usize))
        .flatten();
    for i in 0..info.max_entries() {
        if held.as_ref().is_some_and(|h| !h[i as usize]) {
            continue;
        }

        key.copy_from_slice(&i.to_ne_bytes());
        map_elem(UPDATE, fd, key.as_ptr(), zero.as_mut_ptr())?;
    }
    Ok(())
}

/// Which of the `entries` elements of `value_size` bytes of the mappable array map `fd` hold
/// anything but zeroes (None: it could not be mapped).
fn elements_held(fd: i32, value_size: usize, entries: usize) -> Option<Vec<bool>> {
    let (p, len, stride) = super::shared::map_array(fd, value_size, entries).ok()?;

    // SAFETY: the mapping holds `len` readable bytes until unmapped below (no program runs
    // between the sequences, so nothing writes them meanwhile).
    let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };

    // A word at a time (elements are 8-aligned), the value's last bytes as they are.
    let held = (0..entries)
        .map(|i| {
            let value = &bytes[i * stride..i * stride + value_size];
            let words = value.chunks_exact(8);
            let rest = words.remainder();
            words
                .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
                .any(|w| w != 0)
                || rest.iter().any(|b| *b != 0)
        })
        .collect();
    // SAFETY: unmapping what was mapped above.
    unsafe { libc::munmap(p.as_ptr().cast(), len) };
    Some(held)
}

/// Test objects already verified, one per kind of kernel the sequences are run for; each
/// handed out empty.
/// A step of a pairing sequence the test program refused (it returned non-zero): that
/// sequence fails, the others still run.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

#[derive(Default)]
pub struct Rigs(Vec<((bool, bool), TestRig)>);

impl Rigs {
    fn get(
        &mut self,
        layout: &KernelLayout,
        preemptible: bool,
        kprobe_defers: bool,
    ) -> Result<&mut TestRig> {
        let kind = (preemptible, kprobe_defers);
        let pos = match self.0.iter().position(|(k, _)| *k == kind) {
            Some(i) => i,
            None => {
                self.0
                    .push((kind, TestRig::new(layout, preemptible, kprobe_defers)?));
                self.0.len() - 1
            }
        };
        let rig = &mut self.0[pos].1;
        rig.reset()?;
        Ok(rig)
    }
}

/// Runs the real bucketing in the kernel on each value (each in its own probe slot of a test
/// object) and returns, per value, the bucket the kernel counted it in.
pub fn bucketing(
    rigs: &mut Rigs,
    layout: &KernelLayout,
    values: &[u64],
) -> Result<Vec<(u64, Option<usize>)>> {
    let mut out = Vec::new();
    for chunk in values.chunks(MAX_PROBES) {
        let rig = rigs.get(layout, true, true)?;
        for (probe, &v) in chunk.iter().enumerate() {
            rig.run(
                None,
                [test_op::BUCKET, probe as u64, v, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            )?;
        }

        for (probe, &v) in chunk.iter().enumerate() {
            let (_, h, _) = rig.read(probe as u32, CTX_TASK)?;
            out.push((v, h.buckets.iter().position(|n| *n > 0)));
        }
    }
    Ok(out)
}

/// The context a program run from a syscall sees (the caller runs in task context), or None.
pub fn syscall_context(rigs: &mut Rigs, layout: &KernelLayout) -> Result<Option<u32>> {
    let rig = rigs.get(layout, true, true)?;
    let r = rig.run(None, [test_op::CONTEXT, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])?;
    Ok(u32::try_from(r).ok())
}

/// One event of a pairing sequence.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    /// An entry run as the kprobe program makes it (and the fentry program where its miss
    /// counter is unknown); the task's off-CPU clock reads the same as its switch count.
    Entry {
        key: u64,
        ctx: u32,
        task: u64,
        switches: u64,
        now: u64,
        workload: bool,
        cpu: u32,
    },
    /// An interrupt-context entry run of the fentry program, its recursion misses on this CPU
    /// known.
    EntryFentry {
        key: u64,
        ctx: u32,
        misses: u64,
        now: u64,
        cpu: u32,
    },
    /// An exit run of the fexit program, with the entry program's misses on this CPU if
    /// known; task calls keep their off-CPU clock of 5.
    ExitFentry {
        key: u64,
        ctx: u32,
        task: u64,
        misses: Option<u64>,
        now: u64,
        cpu: u32,
    },
    /// An exit run of the kretprobe program; the off-CPU clock reads the same as the switch
    /// count (entries too).
    ExitKprobe {
        key: u64,
        ctx: u32,
        task: u64,
        switches: u64,
        now: u64,
        cpu: u32,
    },
    /// An exit run of the kretprobe program with an off-CPU clock of its own.
    ExitKprobeClock {
        key: u64,
        ctx: u32,
        task: u64,
        switches: u64,
        clock: u64,
        now: u64,
        cpu: u32,
    },
    /// A task-context entry run whose program knows the runs it missed on this CPU (its
    /// recursion misses, or the switch witness's count).
    EntryMisses {
        key: u64,
        task: u64,
        switches: u64,
        misses: u64,
        now: u64,
        fentry: bool,
        cpu: u32,
    },
    /// A task-context exit run reading the entry program's missed runs on this CPU; the
    /// off-CPU clock reads the same as the switch count.
    ExitMisses {
        key: u64,
        task: u64,
        switches: u64,
        misses: u64,
        now: u64,
        fentry: bool,
        cpu: u32,
    },
    /// No program runs: `task` ran on `cpu` meanwhile. The sequence keeps each task's
    /// migration count (`se.nr_migrations`) from the CPUs its steps run on: a step of a task
    /// on another CPU than its last one is a migration. An interrupt step that names no task
    /// (0) interrupts the task that ran last on its CPU (its last task step or `Ran`).
    Ran { task: u64, cpu: u32 },
    /// No program runs: another CPU's exit freed a call of `cpu`'s and cleared the slots'
    /// used marks, and has not yet looked whether a slot was taken again (`vacate`'s window).
    UsedCleared { cpu: u32 },
    /// The steps after it are calls of this probe slot (the sequence starts with slot 0).
    Probe(u32),
}

/// The kind of kernel a pairing sequence is run for.
#[derive(Clone, Copy, Debug)]
pub struct RigKind {
    /// Preemptible: task calls that left the CPU are deferred to userspace.
    pub preemptible: bool,
    /// The CPUs' task clocks are comparable: a migrated call's time off the CPU is known.
    pub cross_cpu_clock: bool,
    /// Runs of the programs interleave on one CPU (fentry on a preemptible kernel): an exit
    /// reads its call from a copy made before freeing the slot, and self time is not followed.
    pub interleaving: bool,
    /// kprobe task calls that left the CPU are deferred too (`Config::kprobe_defers`): the
    /// kernel preempts (not where `preemptible` stands for fentry programs interleaving
    /// without the context split).
    pub kprobe_defers: bool,
}

/// What the real pairing code made of a sequence, per context.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Counters by context.
    pub counters: [Counters; NUM_CTX],
    /// Histograms of the paired calls by context.
    pub hist: [HistData; NUM_CTX],
    /// Deferred pairs sent to userspace.
    pub deferred: Vec<Deferred>,
    /// Calls still pending afterwards.
    pub pending: u64,
    /// Probe slot 1's counters and histograms by context (sequences with `Step::Probe(1)`).
    pub probe1: [(Counters, HistData); NUM_CTX],
    /// The workload histogram.
    pub workload: HistData,
    /// The per-site counts (`CALLERS`): (context, call site, calls, summed ns).
    pub sites: Vec<(u32, u64, u64, u64)>,
    /// The per-memcg counts (`MEMCGS`): (context, memcg, calls, summed ns).
    pub memcgs: Vec<(u32, u64, u64, u64)>,
    /// Of the calls in `sites` and `memcgs`, those counted in the front slots (`FrontSlot`) and
    /// those in the maps behind them.
    pub in_front: u64,
    /// See `in_front`.
    pub in_maps: u64,
}

/// Runs a sequence of entries and exits through the real pairing code of the programs
/// (BPF_PROG_TEST_RUN of the test program, which takes the inputs a real program reads from the
/// kernel as arguments), in a fresh object, on the given CPUs. `rig`: the kind of kernel the
/// programs are loaded for.
pub fn pairing(
    rigs: &mut Rigs,
    layout: &KernelLayout,
    steps: &[Step],
    kind: RigKind,
) -> Result<Outcome> {
    let rig = rigs.get(layout, kind.preemptible, kind.kprobe_defers)?;
    let mut probe = 0u64;
    let mut tasks = Whereabouts::default();
    for s in steps {
        let inputs = match *s {
            Step::Ran { task, cpu } => {
                tasks.ran(task, cpu);
                continue;
            }
            Step::Probe(p) => {
                probe = u64::from(p);
                continue;
            }
            Step::UsedCleared { cpu } => {
                let mut args = [0; 12];
                args[0] = test_op::CLEAR_USED;
                args[1] = probe;
                if rig.run(Some(cpu), args)? != 0 {
                    return Err(Refused(format!("the test program refused step {s:?}")).into());
                }
                continue;
            }
            _ => TestInputs::of(s),
        };
        let TestInputs {
            op,
            key,
            ctx,
            task,
            switches,
            clock,
            now,
            flags,
            misses,
            cpu,
        } = inputs;
        let flags = if task != 0 && ctx == CTX_TASK {
            tasks.ran(task, cpu) << 8 | flags
        } else {
            flags
        };
        let task = match task {
            0 if ctx != CTX_TASK => tasks.running_on(cpu),
            t => t,
        };
        if cpu as usize >= rig.cpus {
            bail!(
                "the sequence needs CPU {cpu}; this machine has {}",
                rig.cpus
            );
        }

        let ret = rig.run(
            Some(cpu),
            [
                op,
                probe,
                key,
                ctx as u64,
                task,
                switches,
                now,
                flags | if kind.interleaving { 4 } else { 0 },
                misses.unwrap_or(0),
                misses.is_some() as u64,
                !kind.cross_cpu_clock as u64,
                clock,
            ],
        )?;
        if ret != 0 {
            return Err(Refused(format!("the test program refused step {s:?} ({ret})")).into());
        }
    }

    outcome(rig)
}

/// Where the tasks of a sequence are: per task the CPU of its last step and its migrations so
/// far; per CPU the task running there (its last task step or `Ran`), which the interrupt
/// steps that name no task interrupt.
#[derive(Default)]
struct Whereabouts {
    moves: std::collections::HashMap<u64, (u32, u64)>,
    running: std::collections::HashMap<u32, u64>,
}

impl Whereabouts {
    /// `task` runs on `cpu` now: its migrations so far.
    fn ran(&mut self, task: u64, cpu: u32) -> u64 {
        let m = self.moves.entry(task).or_insert((cpu, 0));
        if m.0 != cpu {
            *m = (cpu, m.1 + 1);
        }

        self.running.insert(cpu, task);
        m.1
    }

    /// The task running on `cpu` (0: none yet).
    fn running_on(&self, cpu: u32) -> u64 {
        self.running.get(&cpu).copied().unwrap_or(0)
    }
}

/// What the test program takes of one step (see `selftest.rs` in the eBPF crate).
struct TestInputs {
    op: u64,
    key: u64,
    ctx: u32,
    /// 0: the task running on the CPU (interrupt steps that name none).
    task: u64,
    switches: u64,
    /// The task's off-CPU clock.
    clock: u64,
    now: u64,
    /// Bit 0 the workload's, bit 1 an fentry entry (bit 2, runs interleave, and bits 8 and
    /// up, the task's migrations, are added by `pairing`).
    flags: u64,
    /// The entry program's missed runs on the CPU, where the step gives them.
    misses: Option<u64>,
    cpu: u32,
}

impl TestInputs {
    /// The inputs of an entry or exit step (not of `Ran` or `Probe`, which feed none).
    fn of(step: &Step) -> Self {
        let task_step = |op, key, task, switches, now, flags, misses, cpu| TestInputs {
            op,
            key,
            ctx: CTX_TASK,
            task,
            switches,
            clock: switches,
            now,
            flags,
            misses,
            cpu,
        };
        match *step {
            Step::Entry {
                key,
                ctx,
                task,
                switches,
                now,
                workload,
                cpu,
            } => TestInputs {
                ctx,
                ..task_step(
                    test_op::ENTRY,
                    key,
                    task,
                    switches,
                    now,
                    workload as u64,
                    None,
                    cpu,
                )
            },
            Step::EntryFentry {
                key,
                ctx,
                misses,
                now,
                cpu,
            } => TestInputs {
                ctx,
                ..task_step(test_op::ENTRY, key, 0, 0, now, 2, Some(misses), cpu)
            },
            Step::ExitFentry {
                key,
                ctx,
                task,
                misses,
                now,
                cpu,
            } => TestInputs {
                ctx,
                ..task_step(test_op::EXIT_FENTRY, key, task, 5, now, 0, misses, cpu)
            },
            Step::ExitKprobe {
                key,
                ctx,
                task,
                switches,
                now,
                cpu,
            } => TestInputs {
                ctx,
                ..task_step(test_op::EXIT_KPROBE, key, task, switches, now, 0, None, cpu)
            },
            Step::ExitKprobeClock {
                key,
                ctx,
                task,
                switches,
                clock,
                now,
                cpu,
            } => TestInputs {
                ctx,
                clock,
                ..task_step(test_op::EXIT_KPROBE, key, task, switches, now, 0, None, cpu)
            },
            Step::EntryMisses {
                key,
                task,
                switches,
                misses,
                now,
                fentry,
                cpu,
            } => {
                let flags = if fentry { 2 } else { 0 };
                task_step(
                    test_op::ENTRY,
                    key,
                    task,
                    switches,
                    now,
                    flags,
                    Some(misses),
                    cpu,
                )
            }
            Step::ExitMisses {
                key,
                task,
                switches,
                misses,
                now,
                fentry,
                cpu,
            } => {
                let op = if fentry {
                    test_op::EXIT_FENTRY
                } else {
                    test_op::EXIT_KPROBE
                };
                task_step(op, key, task, switches, now, 0, Some(misses), cpu)
            }
            Step::Ran { .. } | Step::Probe(_) | Step::UsedCleared { .. } => {
                unreachable!("they feed the program no call")
            }
        }
    }
}

/// What the programs made of the sequence: probe slot 0's (and 1's) counters and histograms
/// per context, the deferred pairs, the breakdown rows, the calls still pending.
fn outcome(rig: &mut TestRig) -> Result<Outcome> {
    let probe = 0u64;
    let mut out = Outcome::default();
    for ctx in 0..NUM_CTX {
        let (c, h, _) = rig.read(1, ctx as u32)?;
        out.probe1[ctx] = (c, h);
        let (c, h, w) = rig.read(probe as u32, ctx as u32)?;
        out.counters[ctx] = c;
        out.hist[ctx] = h;
        out.workload.merge(&w);
    }

    out.deferred = rig.deferred()?;
    let mut counted = (0, 0);
    out.sites = breakdown_of(
        rig,
        (names::MAP_CALLERS, names::MAP_CALLER_FRONT),
        probe,
        |k: &CallerKey| (k.probe, u32::from(k.ctx), k.caller),
        &mut counted,
    )?;
    out.memcgs = breakdown_of(
        rig,
        (names::MAP_MEMCGS, names::MAP_MEMCG_FRONT),
        probe,
        |k: &MemcgKey| (k.probe, u32::from(k.ctx), k.memcg),
        &mut counted,
    )?;
    (out.in_front, out.in_maps) = counted;
    let states: Shared<memcg_trace_common::CpuState> =
        rig.shared(names::MAP_CPU_STATE, rig.cpus)?;
    let states: Vec<_> = (0..rig.cpus).map(|cpu| states.get(cpu)).collect();
    out.pending = states
        .iter()
        .map(|s| {
            s.pending[probe as usize]
                .calls
                .iter()
                .filter(|c| c.key != 0)
                .count() as u64
        })
        .sum();

    // The entries, counted in the pending sets (`PendingSet::entries`), as the tracer adds them.
    for st in states.iter() {
        for ctx in 0..NUM_CTX {
            out.counters[ctx].entries += st.pending[probe as usize].entries[ctx];
            out.probe1[ctx].0.entries += st.pending[1].entries[ctx];
        }
    }
    Ok(out)
}

/// The rows of `probe` in a breakdown (call sites, memcgs): its map and front slots `names`
/// (`key` gives a map key's probe, context and id), as the tracer adds them up: (context, id,
/// calls, summed ns), sorted. `counted` gains the calls found in the front slots and in the map.
fn breakdown_of<K: aya::Pod>(
    rig: &TestRig,
    (name, front): (&str, &str),
    probe: u64,
    key: impl Fn(&K) -> (u32, u32, u64),
    counted: &mut (u64, u64),
) -> Result<Vec<(u32, u64, u64, u64)>> {
    let map: aya::maps::HashMap<_, K, memcg_trace_common::CallerStat> =
        aya::maps::HashMap::try_from(
            rig.ebpf
                .map(name)
                .ok_or_else(|| anyhow!("map {name} missing"))?,
        )?;
    // The slots and shards of a key added up.
    let mut rows: std::collections::BTreeMap<(u32, u64), (u64, u64)> = Default::default();
    let sizes = rig.front;
    let entries = sizes.entries(true) as usize;
    if entries > 1 {
        let slots: Shared<memcg_trace_common::FrontSlot> = rig.shared(front, entries)?;
        for i in 0..entries {
            let slot = slots.get(i);
            let (p, ctx) = memcg_trace_common::front_region(i as u32, sizes.shards);
            if slot.tag != 0 && p == probe as u32 {
                let row = rows.entry((ctx, slot.tag - 1)).or_default();
                row.0 += slot.stat.count;
                row.1 += slot.stat.sum_ns;
                counted.0 += slot.stat.count;
            }
        }
    }

    for r in map.iter() {
        let (k, v) = r?;
        let (p, ctx, id) = key(&k);
        if p == probe as u32 {
            let row = rows.entry((ctx, id)).or_default();
            row.0 += v.count;
            row.1 += v.sum_ns;
            counted.1 += v.count;
        }
    }
    Ok(rows
        .into_iter()
        .map(|((ctx, id), (count, sum_ns))| (ctx, id, count, sum_ns))
        .collect())
}

/// How the shared context classification saw a tracepoint of known context.
#[derive(Clone, Debug)]
pub struct ContextCheck {
    /// Row of `memcg_trace_common::CTX_SOURCES`.
    pub row: usize,
    /// The context the tracepoint runs in.
    pub expected: &'static str,
    /// What the row is for.
    pub usage: CtxUse,
    /// The tracepoint used (None: none of the row's tracepoints could be attached).
    pub tracepoint: Option<String>,
    /// Hits by classified context: task, softirq, hardirq, nmi, unknown.
    pub counts: [u64; CTX_CHECK_COLS as usize],
    /// preempt_count bits set in any hit.
    pub bits_any: u64,
    /// preempt_count bits set in every hit.
    pub bits_all: u64,
}

impl ContextCheck {
    /// Hits in all.
    pub fn hits(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Hits classified as the expected context.
    pub fn right(&self) -> u64 {
        CTX_NAMES
            .iter()
            .position(|n| *n == self.expected)
            .map(|i| self.counts[i])
            .unwrap_or(0)
    }
}

/// Attaches the context-check programs to the tracepoints of `CTX_SOURCES` (rows whose usage
/// is in `rows`) for `window` and returns how each was classified. With `early`, returns as
/// soon as every calibration row but NMI has 3 hits. `during` runs once the programs are
/// attached (to make NMIs, say).
pub fn context_check(
    layout: &KernelLayout,
    rows: &[CtxUse],
    window: Duration,
    early: bool,
    during: impl FnOnce(),
) -> Result<Vec<ContextCheck>> {
    let (mut ebpf, _, _, _) = load_object(
        layout,
        &LoadOptions {
            probes: 1,
            ..Default::default()
        },
    )?;
    let used = attach_ctx_checks(&mut ebpf, rows)?;
    during();
    let start = Instant::now();
    while start.elapsed() < window {
        std::thread::sleep(Duration::from_millis(20));
        if early && calibration_rows_hit(&ebpf, &used)? {
            break;
        }
    }

    for prog in names::CTX_CHECK {
        if let Some(p) = ebpf.program_mut(prog) {
            unload(p);
        }
    }

    read_ctx_checks(&ebpf, rows, &used)
}

/// Attaches each context-check program whose row's usage is in `rows` to the first of its
/// tracepoints that takes it; the tracepoint each row is on (None: not attached).
fn attach_ctx_checks(ebpf: &mut Ebpf, rows: &[CtxUse]) -> Result<Vec<Option<String>>> {
    let btf = super::kbtf::attach_btf(
        CTX_SOURCES
            .iter()
            .filter(|(_, usage, _)| rows.contains(usage))
            .flat_map(|(_, _, tps)| tps.iter().copied()),
    )?;
    let mut used: Vec<Option<String>> = vec![None; CTX_CHECK_ROWS as usize];
    for (row, (_, usage, tps)) in CTX_SOURCES.iter().enumerate() {
        if !rows.contains(usage) {
            continue;
        }

        let prog = names::CTX_CHECK[row];
        let program = ebpf
            .program_mut(prog)
            .ok_or_else(|| anyhow!("program {prog} missing from the object"))?;
        for tp in *tps {
            if load_and_attach(program, prog, tp, &btf).is_ok() {
                used[row] = Some(tp.to_string());
                break;
            }

            unload(program);
        }
    }
    Ok(used)
}

/// The per-CPU map of a context check's counts or bits, by name.
fn ctx_check_map<'a>(ebpf: &'a Ebpf, name: &str) -> Result<PerCpuArray<&'a MapData, u64>> {
    let map = ebpf
        .map(name)
        .ok_or_else(|| anyhow!("map {name} missing"))?;
    Ok(PerCpuArray::try_from(map)?)
}

/// Whether every attached calibration row but NMI (`used`: each row's tracepoint) has seen 3
/// hits, however classified.
fn calibration_rows_hit(ebpf: &Ebpf, used: &[Option<String>]) -> Result<bool> {
    let counts = ctx_check_map(ebpf, names::MAP_CTX_CHECK)?;
    for (row, (ctx, usage, _)) in CTX_SOURCES.iter().enumerate() {
        if *usage != CtxUse::Calibration || *ctx == memcg_trace_common::CTX_NMI {
            continue;
        }

        if used[row].is_none() {
            continue;
        }

        let mut hits = 0;
        for got in 0..CTX_CHECK_COLS {
            hits += counts
                .get(&ctx_check_index(row as u32, got), 0)?
                .iter()
                .sum::<u64>();
        }

        if hits < 3 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// How each row whose usage is in `rows` was classified (`used`: the tracepoint it was on),
/// and the context bits it saw on any CPU and on all.
fn read_ctx_checks(
    ebpf: &Ebpf,
    rows: &[CtxUse],
    used: &[Option<String>],
) -> Result<Vec<ContextCheck>> {
    let counts = ctx_check_map(ebpf, names::MAP_CTX_CHECK)?;
    let bits = ctx_check_map(ebpf, names::MAP_CTX_BITS)?;
    let mut out = Vec::new();
    for (row, (ctx, usage, _)) in CTX_SOURCES.iter().enumerate() {
        if !rows.contains(usage) {
            continue;
        }

        let row_index = row as u32;
        let mut row_counts = [0u64; CTX_CHECK_COLS as usize];
        for (got, slot) in row_counts.iter_mut().enumerate() {
            *slot = counts
                .get(&ctx_check_index(row_index, got as u32), 0)?
                .iter()
                .sum();
        }

        let any = bits.get(&(row_index * 2), 0)?.iter().fold(0, |a, b| a | b);
        let all = bits
            .get(&(row_index * 2 + 1), 0)?
            .iter()
            .filter(|v| **v != 0)
            .fold(u64::MAX, |a, b| a & b);
        out.push(ContextCheck {
            row,
            expected: CTX_NAMES[*ctx as usize],
            usage: *usage,
            tracepoint: used[row].clone(),
            counts: row_counts,
            bits_any: any,
            bits_all: if all == u64::MAX {
                0
            } else {
                all & 0xffff_ffff
            },
        });
    }
    Ok(out)
}

/// Asks the PMU for NMIs on every CPU for a moment (a cycles counter with a short period); false
/// when perf cannot count cycles here (most VMs).
pub fn raise_nmis(window: Duration) -> bool {
    let mut fds = Vec::new();
    for cpu in 0..possible_cpus() as i32 {
        // struct perf_event_attr: type HARDWARE (0), config CPU_CYCLES (0), sample_period.
        let mut attr = [0u8; 128];
        attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
        attr[16..24].copy_from_slice(&100_000u64.to_ne_bytes());

        // SAFETY: perf_event_open with a zeroed, sized attr.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr.as_ptr(),
                -1i32,
                cpu,
                -1i32,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd >= 0 {
            fds.push(fd as i32);
        }
    }

    let any = !fds.is_empty();
    if any {
        // Keep a CPU busy so the counter overflows.
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < window {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }

        std::hint::black_box(x);
    }

    for fd in fds {
        // SAFETY: closing fds we opened.
        unsafe { libc::close(fd) };
    }
    any
}

/// Runs the `bpf_prog` iterator of `ebpf` and returns, per program id, the address of its
/// per-CPU stats (`prog->stats`). The iterator program is loaded on first use.
pub fn prog_stats(ebpf: &mut Ebpf, btf: Option<&Btf>) -> Result<HashMap<u32, u64>> {
    use std::io::Read as _;
    let it: &mut aya::programs::Iter = ebpf
        .program_mut(names::PROG_ITER)
        .context("iterator program")?
        .try_into()?;
    if it.fd().is_err() {
        let btf = btf.ok_or_else(|| anyhow!("no BTF to load the iterator"))?;
        it.load(PROG_ITER_KIND, btf)
            .map_err(|e| anyhow!("load the bpf_prog iterator: {}", chain(&e)))?;
    }

    let link = it
        .attach()
        .map_err(|e| anyhow!("attach the bpf_prog iterator: {}", chain(&e)))?;
    let link = it.take_link(link)?;
    let mut f = link.into_file()?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(buf
        .chunks_exact(16)
        .map(|c| {
            let id = u64::from_ne_bytes(c[..8].try_into().expect("8 bytes"));
            let stats = u64::from_ne_bytes(c[8..].try_into().expect("8 bytes"));
            (id as u32, stats)
        })
        .collect())
}

/// The kind of iterator that lists the programs, and the function the kernel names it by.
const PROG_ITER_KIND: &str = "bpf_prog";
pub const PROG_ITER_FUNC: &str = "bpf_iter_bpf_prog";

impl Tracer {
    /// Measures the floor of `backend` with the programs of probe slot `slot` (a spare one)
    /// attached to [`FLOOR_FUNCTION`], triggered `calls` times through BPF_PROG_TEST_RUN of a
    /// tracing program. Detaches them again.
    pub fn measure_floor(&mut self, backend: Backend, slot: u32, calls: u32) -> Result<Floor> {
        if !backend.has_latency() {
            bail!("{backend} measures no latency");
        }

        if slot >= self.probes {
            bail!("no spare probe slot for the floor");
        }

        self.load_floor_trigger()?;
        let programs = super::slot_programs(backend, slot, self.fentry_build);
        let result = self.time_floor(backend, slot, calls, &programs);

        // Entry first, as always: a call in flight still gets its exit.
        for p in &programs {
            self.detach(p);
        }

        if let Some(p) = self.ebpf.program_mut(FLOOR_TRIGGER) {
            unload(p);
        }
        result
    }

    /// Loads (does not attach) the tracing program whose BPF_PROG_TEST_RUN calls
    /// [`FLOOR_FUNCTION`].
    fn load_floor_trigger(&mut self) -> Result<()> {
        let btf = self
            .btf
            .as_ref()
            .ok_or_else(|| anyhow!("attaching is over"))?;
        let p: &mut FExit = self
            .ebpf
            .program_mut(FLOOR_TRIGGER)
            .context("trigger program")?
            .try_into()?;
        p.load(FLOOR_FUNCTION, btf).map_err(|e| {
            anyhow!(
                "cannot load a tracing program to call {FLOOR_FUNCTION}: {}",
                chain(&e)
            )
        })
    }

    /// How long `n` calls of [`FLOOR_FUNCTION`] take, one BPF_PROG_TEST_RUN each.
    fn run_floor_trigger(&self, n: u32) -> Result<Duration> {
        let trigger: &FExit = self
            .ebpf
            .program(FLOOR_TRIGGER)
            .context("trigger program")?
            .try_into()?;
        let start = Instant::now();
        for _ in 0..n {
            trigger
                .test_run(())
                .map_err(|e| anyhow!("BPF_PROG_TEST_RUN: {}", chain(&e)))?;
        }
        Ok(start.elapsed())
    }

    /// The floor of `backend`'s `programs` (slot `slot`'s), `calls` calls a batch: batches
    /// without the pair, then with it (the difference is what a traced call costs; the faster
    /// of two batches each, the one least disturbed by the rest of the machine), their
    /// latencies as the programs timed them, and one more batch with bpf stats on for the
    /// programs' own time (stats add two clock reads to every run, so not before).
    fn time_floor(
        &mut self,
        backend: Backend,
        slot: u32,
        calls: u32,
        programs: &[&'static str],
    ) -> Result<Floor> {
        let bare = self
            .run_floor_trigger(calls)?
            .min(self.run_floor_trigger(calls)?);
        self.attach_programs(programs, FLOOR_FUNCTION, Some(slot))
            .map_err(|e| anyhow!("attach to {FLOOR_FUNCTION}: {e}"))?;
        let traced = self
            .run_floor_trigger(calls)?
            .min(self.run_floor_trigger(calls)?);
        let hist = self.floor_hist(slot);

        // Stats off again whether the batch ran or not.
        self.start_stats()?;
        let batch = self.stats_batch(programs, calls);
        self.stop_stats();
        let (time, runs) = batch?;
        let per_pair_runs = runs as f64 / programs.len() as f64;

        let lat = figures::latency(&hist, Duration::from_secs(1), &[0.5, 0.9])
            .ok_or_else(|| anyhow!("the floor pair on {FLOOR_FUNCTION} timed no call"))?;
        Ok(Floor {
            backend,
            calls: hist.count,
            p50_ns: lat.at(0.5).unwrap_or(0),
            p90_ns: lat.at(0.9).unwrap_or(0),
            min_ns: hist.min_ns,
            programs_ns: figures::ratio(time as f64, per_pair_runs),
            // Not resolved when the traced batches were not slower than the bare ones (a
            // disturbed machine, emulation): unknown, never a negative cost.
            per_call_ns: (traced > bare)
                .then(|| {
                    figures::ratio(
                        traced.as_nanos() as f64 - bare.as_nanos() as f64,
                        calls as f64,
                    )
                })
                .flatten(),
        })
    }

    /// The run time and runs of `programs` over one batch of `calls` calls, bpf stats on.
    fn stats_batch(&self, programs: &[&'static str], calls: u32) -> Result<(u64, u64)> {
        let before: Vec<_> = programs.iter().map(|p| self.cost(p)).collect();
        self.run_floor_trigger(calls)?;
        let after: Vec<_> = programs.iter().map(|p| self.cost(p)).collect();
        Ok(before
            .iter()
            .zip(&after)
            .map(|(b, a)| (a.run_time_ns - b.run_time_ns, a.run_cnt - b.run_cnt))
            .fold((0, 0), |(t, r), (dt, dr)| (t + dt, r + dr)))
    }

    /// The task-context histogram of slot `slot` on every CPU: its context's cell, and its
    /// workload cell should the daemon run inside the cgroup it traces (`--cgroup` of its
    /// own).
    fn floor_hist(&self, slot: u32) -> HistData {
        let mut hist = HistData::default();
        for cpu in 0..self.cpus as u32 {
            hist.add_cpu(
                &self
                    .cells
                    .get(cell(cpu, self.probes, slot, CTX_TASK) as usize)
                    .hist,
            );
            if self.workload {
                let w = workload_cell(cpu, self.probes, slot, CTX_TASK, self.workload_contexts);
                hist.add_cpu(&self.workload_cells.get(w as usize).hist);
            }
        }
        hist
    }
}

/// The tracing program whose BPF_PROG_TEST_RUN calls [`FLOOR_FUNCTION`] once (any fentry or
/// fexit program's does): loaded, not attached.
const FLOOR_TRIGGER: &str = names::FLOOR_EMPTY_FENTRY[1];

/// perf_event_open flag: close the fd on exec.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd as _;

    use super::*;

    /// The programs' run counts, run times and recursion misses are read per tick through
    /// BPF_OBJ_GET_INFO_BY_FD at fixed offsets of the UAPI struct: they must be what the
    /// kernel's fdinfo says of the same program.
    #[test]
    fn program_stats_from_the_info_are_the_fdinfo_s() {
        let name = "program_stats_from_the_info_are_the_fdinfo_s";

        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping {name}: needs root");
            return;
        }

        let btf = crate::kernel::open_btf().expect("kernel BTF");
        let layout = crate::kernel::layout(&btf).expect("layout").offsets;
        drop(btf);
        let rig = TestRig::new(&layout, false, false).expect("the self-test program");
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("bpf stats");
        for _ in 0..7 {
            rig.run(None, [test_op::CONTEXT, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
                .expect("test run");
        }

        drop(stats);
        let prog: &RawTracePoint = rig
            .ebpf
            .program(names::SELFTEST)
            .expect("selftest program")
            .try_into()
            .expect("raw tracepoint");
        let fd = prog
            .fd()
            .expect("loaded")
            .as_fd()
            .try_clone_to_owned()
            .expect("fd");
        let info = super::super::proginfo::stats(fd.as_fd()).expect("bpf_prog_info stats");
        let fdinfo = super::super::fdinfo_stats(&fd).expect("fdinfo");
        assert_eq!(info, fdinfo, "(run time, runs, recursion misses)");
        assert_eq!(info.1, 7, "runs counted while stats were on");
        assert!(info.0 > 0, "run time");
    }
}
