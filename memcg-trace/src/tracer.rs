//! Loads the eBPF object, attaches one program pair per probe with the requested backend
//! (falling back in `auto` mode, with the reason), and reads the per-CPU maps into a `Snapshot`.
//! Dropping the `Tracer` detaches every link.

use std::{
    collections::HashMap,
    error::Error,
    fs,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    time::Instant,
};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{maps::PerCpuArray, programs::Program, Btf, Ebpf, EbpfLoader};
use memcg_trace_common::{slot_index, Hist, KernelLayout, Slot, MAX_PROBES, NUM_CTX};

use crate::{
    probes::{Backend, Plan, Request, Resolution},
    snapshot::{CtxStats, HistData, ProbeStats, ProgCost, Snapshot},
};

/// The eBPF object built by build.rs from memcg-trace-ebpf.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memcg-trace"));

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
    /// Names of the programs in the object.
    pub programs: Vec<String>,
}

/// A probe that could not be attached, and why.
#[derive(Debug, Clone)]
pub struct NotAttached {
    /// Display name.
    pub name: String,
    /// One line per candidate or backend tried.
    pub reasons: Vec<String>,
}

/// The loaded programs and their links.
pub struct Tracer {
    ebpf: Ebpf,
    /// Kernel BTF while probes are being attached; released afterwards (it is large).
    btf: Option<Btf>,
    /// Attached probes, by slot.
    pub attached: Vec<Attached>,
    /// Probes that failed.
    pub failed: Vec<NotAttached>,
    /// The preempt_count masks the programs were loaded with.
    pub masks: Option<crate::kernel::ContextMasks>,
    started: Instant,
    /// Whether task-context calls of a workload cgroup are counted apart.
    workload: bool,
    /// Duplicates of the attached programs' fds: they keep the kernel's run statistics readable
    /// after the links are gone, so the final figures cover every run.
    prog_fds: HashMap<String, OwnedFd>,
    /// Keeps kernel bpf stats on while it is open (BPF_ENABLE_STATS).
    _stats: Option<OwnedFd>,
}

impl Tracer {
    /// Parses the object and creates the maps, with the kernel layout and the workload's cgroup
    /// v2 id (0: none) patched in.
    pub fn load(layout: &KernelLayout, workload_cgroup: u64) -> Result<Self> {
        if EBPF_OBJECT.is_empty() {
            bail!("this binary was built with AYA_BUILD_SKIP and carries no eBPF programs; rebuild it with `cargo xtask build`");
        }
        // EbpfLoader::new() parses the kernel's BTF for itself; ours is parsed after the loader
        // is gone so that the two (tens of MiB each) are never alive together.
        let ebpf = EbpfLoader::new()
            .override_global("LAYOUT", layout, true)
            .override_global("WORKLOAD_CGROUP", &workload_cgroup, true)
            .load(EBPF_OBJECT)
            .map_err(|e| anyhow!("loading the eBPF object failed: {}", chain(&e)))?;
        let btf = Btf::from_sys_fs().context("load kernel BTF")?;
        // bpf stats on while we trace; the kernel turns them back off when this fd closes.
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        Ok(Tracer {
            ebpf,
            btf: Some(btf),
            attached: Vec::new(),
            failed: Vec::new(),
            masks: None,
            started: Instant::now(),
            workload: workload_cgroup != 0,
            prog_fds: HashMap::new(),
            _stats: stats,
        })
    }

    /// Attaches `req` by the first plan that loads and attaches; records why others failed.
    pub fn attach(&mut self, req: &Request, res: &Resolution) -> bool {
        let slot = self.attached.len() as u32;
        let name = req.name();
        let mut reasons = res.notes.clone();
        if slot as usize >= MAX_PROBES {
            reasons.push(format!("more than {MAX_PROBES} probes requested"));
            self.failed.push(NotAttached { name, reasons });
            return false;
        }
        for plan in &res.plans {
            match self.attach_plan(slot, plan) {
                Ok(programs) => {
                    for p in &programs {
                        if let Some(fd) = self.dup_fd(p) {
                            self.prog_fds.insert(p.clone(), fd);
                        }
                    }
                    self.attached.push(Attached {
                        slot,
                        name,
                        target: plan.target.clone(),
                        backend: plan.backend,
                        notes: reasons,
                        programs,
                    });
                    if self.attached.len() == 1 {
                        self.started = Instant::now();
                    }
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

    fn attach_plan(&mut self, slot: u32, plan: &Plan) -> std::result::Result<Vec<String>, String> {
        let names: Vec<String> = match plan.backend {
            Backend::Fentry => vec![format!("fentry_{slot}"), format!("fexit_{slot}")],
            Backend::Kprobe => vec![format!("kprobe_{slot}"), format!("kretprobe_{slot}")],
            Backend::Tracepoint => vec![format!("tp_{slot}")],
        };
        // Exit first: an entry without its exit would only leave stale start slots.
        for (i, prog) in names.iter().enumerate().rev() {
            if let Err(e) = self.attach_one(prog, plan) {
                for done in &names[i + 1..] {
                    self.unload(done);
                }
                self.unload(prog);
                return Err(e);
            }
        }
        Ok(names)
    }

    /// Frees the kernel BTF once every probe is attached; later attaches fail.
    pub fn done_attaching(&mut self) {
        self.btf = None;
    }

    fn attach_one(&mut self, prog: &str, plan: &Plan) -> std::result::Result<(), String> {
        let btf = self
            .btf
            .as_ref()
            .ok_or("attaching is over (BTF released)")?;
        let p = self
            .ebpf
            .program_mut(prog)
            .ok_or_else(|| format!("program {prog} missing from the object"))?;
        let r = match p {
            Program::FEntry(p) => p.load(&plan.target, btf).and_then(|_| p.attach().map(drop)),
            Program::FExit(p) => p.load(&plan.target, btf).and_then(|_| p.attach().map(drop)),
            Program::KProbe(p) => p.load().and_then(|_| p.attach(&plan.target, 0).map(drop)),
            Program::BtfTracePoint(p) => {
                p.load(&plan.target, btf).and_then(|_| p.attach().map(drop))
            }
            _ => return Err(format!("{prog} has an unexpected program type")),
        };
        r.map_err(|e| {
            let s = chain(&e);
            if s.contains("Operation not permitted") || s.contains("EPERM") {
                format!("{s} (the kernel refused it: lockdown, a sandbox or missing CAP_BPF/CAP_PERFMON)")
            } else {
                s
            }
        })
    }

    fn unload(&mut self, prog: &str) {
        if let Some(p) = self.ebpf.program_mut(prog) {
            let _ = match p {
                Program::FEntry(p) => p.unload(),
                Program::FExit(p) => p.unload(),
                Program::KProbe(p) => p.unload(),
                Program::BtfTracePoint(p) => p.unload(),
                _ => Ok(()),
            };
        }
    }

    /// Detaches and unloads every program (also done on drop).
    pub fn detach_all(&mut self) {
        let mut progs: Vec<String> = self.prog_fds.keys().cloned().collect();
        progs.extend(self.attached.iter().flat_map(|a| a.programs.clone()));
        for p in progs {
            self.unload(&p);
        }
    }

    /// Attaches extra programs of the object (the bench floors) to `plan`'s target, exit
    /// programs first; their costs are then available from [`Tracer::program_cost`].
    pub fn attach_extra(&mut self, progs: &[&str], plan: &Plan) -> Result<()> {
        for prog in progs.iter().rev() {
            self.attach_one(prog, plan)
                .map_err(|e| anyhow!("{prog} on {}: {e}", plan.target))?;
            if let Some(fd) = self.dup_fd(prog) {
                self.prog_fds.insert(prog.to_string(), fd);
            }
        }
        Ok(())
    }

    /// The kernel's run statistics of one program of the object.
    pub fn program_cost(&self, prog: &str) -> ProgCost {
        self.cost(prog)
    }

    fn dup_fd(&self, prog: &str) -> Option<OwnedFd> {
        let fd = match self.ebpf.program(prog)? {
            Program::FEntry(p) => p.fd(),
            Program::FExit(p) => p.fd(),
            Program::KProbe(p) => p.fd(),
            Program::BtfTracePoint(p) => p.fd(),
            _ => return None,
        };
        fd.ok()?.as_fd().try_clone_to_owned().ok()
    }

    /// The kernel's run count, run time and recursion misses for one program.
    fn cost(&self, prog: &str) -> ProgCost {
        let mut c = ProgCost {
            name: prog.to_string(),
            ..Default::default()
        };
        let Some(fd) = self.prog_fds.get(prog) else {
            return c;
        };
        if let Ok(info) = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())) {
            for line in info.lines() {
                let Some((k, v)) = line.split_once(':') else {
                    continue;
                };
                let v: u64 = v.trim().parse().unwrap_or(0);
                match k {
                    "run_time_ns" => c.run_time_ns = v,
                    "run_cnt" => c.run_cnt = v,
                    "recursion_misses" => c.recursion_misses = v,
                    _ => {}
                }
            }
        }
        c
    }

    /// Detaches every program, then takes the final snapshot: no run is left uncounted between
    /// the read of the maps and the read of the run statistics.
    pub fn finish(&mut self) -> Result<Snapshot> {
        let elapsed = self.started.elapsed();
        self.detach_all();
        let mut snap = self.snapshot()?;
        snap.elapsed = elapsed;
        Ok(snap)
    }

    /// Reads every attached probe's per-CPU histograms and counters, summed over CPUs.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let hist: PerCpuArray<_, Hist> =
            PerCpuArray::try_from(self.ebpf.map("HIST").context("HIST map")?)?;
        let slots: PerCpuArray<_, Slot> =
            PerCpuArray::try_from(self.ebpf.map("SLOTS").context("SLOTS map")?)?;
        let workload: PerCpuArray<_, Hist> = PerCpuArray::try_from(
            self.ebpf
                .map("WORKLOAD_HIST")
                .context("WORKLOAD_HIST map")?,
        )?;
        let mut probes = Vec::with_capacity(self.attached.len());
        for a in &self.attached {
            let mut contexts: [CtxStats; NUM_CTX] = Default::default();
            for (ctx, stats) in contexts.iter_mut().enumerate() {
                let idx = slot_index(a.slot, ctx as u32);
                for h in hist.get(&idx, 0).context("read HIST")?.iter() {
                    stats.hist.add_cpu(h);
                }
                for c in slots
                    .get(&idx, 0)
                    .context("read SLOTS")?
                    .iter()
                    .map(|s| &s.counters)
                {
                    let s = &mut stats.counters;
                    s.entries += c.entries;
                    s.exits += c.exits;
                    s.unmatched += c.unmatched;
                    s.switched += c.switched;
                    s.no_context += c.no_context;
                }
                if a.backend == Backend::Tracepoint {
                    // The tracepoint program keeps only the count (one map update per hit);
                    // every hit is an entry and an exit.
                    let s = &mut stats.counters;
                    s.entries = stats.hist.count;
                    s.exits = stats.hist.count + s.no_context;
                }
            }
            let workload = if self.workload {
                let mut w = HistData::default();
                for h in workload
                    .get(&a.slot, 0)
                    .context("read WORKLOAD_HIST")?
                    .iter()
                {
                    w.add_cpu(h);
                }
                Some(w)
            } else {
                None
            };
            probes.push(ProbeStats {
                workload,
                name: a.name.clone(),
                target: a.target.clone(),
                backend: a.backend,
                contexts,
                programs: a.programs.iter().map(|p| self.cost(p)).collect(),
            });
        }
        Ok(Snapshot {
            elapsed: self.started.elapsed(),
            probes,
        })
    }
}

/// Runs the eBPF `selftest` program through BPF_PROG_TEST_RUN once per value, each in its own
/// slot: the kernel-side bucketing and context code on fixed inputs. Returns, per value, the
/// bucket the kernel counted it in (None if none) and the context the program saw (-1: unknown).
pub fn selftest(layout: &KernelLayout, values: &[u64]) -> Result<Vec<(u64, Option<usize>, i32)>> {
    use aya::programs::{RawTracePoint, RawTracePointRunOptions, TestRun as _};
    if EBPF_OBJECT.is_empty() {
        bail!("this binary carries no eBPF programs (built with AYA_BUILD_SKIP)");
    }
    if values.len() > memcg_trace_common::NUM_SLOTS as usize {
        bail!("at most {} selftest values", memcg_trace_common::NUM_SLOTS);
    }
    let mut ebpf = EbpfLoader::new()
        .override_global("LAYOUT", layout, true)
        .load(EBPF_OBJECT)
        .map_err(|e| anyhow!("loading the eBPF object failed: {}", chain(&e)))?;
    let hist: PerCpuArray<_, Hist> =
        PerCpuArray::try_from(ebpf.take_map("HIST").context("HIST map")?)?;
    let prog: &mut RawTracePoint = ebpf
        .program_mut("selftest")
        .context("selftest program")?
        .try_into()?;
    prog.load()
        .map_err(|e| anyhow!("load selftest: {}", chain(&e)))?;
    let mut out = Vec::new();
    for (slot, &v) in values.iter().enumerate() {
        let mut opts = RawTracePointRunOptions::new();
        opts.args[0] = slot as u64;
        opts.args[1] = v;
        let r = prog
            .test_run(opts)
            .map_err(|e| anyhow!("BPF_PROG_TEST_RUN: {}", chain(&e)))?;
        let bucket = hist
            .get(&(slot as u32), 0)?
            .iter()
            .flat_map(|h| {
                h.buckets
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(|(b, _)| b)
                    .collect::<Vec<_>>()
            })
            .next();
        out.push((v, bucket, r.return_value as i32));
    }
    Ok(out)
}

/// How the shared context classification saw tracepoints of known context:
/// `(expected, tracepoint, counts by classified context [task, softirq, hardirq, nmi, unknown])`.
/// and the raw preempt_count bits seen (OR over the hits, AND over the hits).
pub type ContextCheck = Vec<(&'static str, String, [u64; 5], (u64, u64))>;

/// Attaches the context-check programs to tracepoints of known context (sched_switch: task;
/// softirq_entry: softirq; local_timer_entry or irq_handler_entry: hardirq) for `window` and
/// returns how each was classified.
/// With `early`, returns as soon as softirq and hardirq have 3 hits each.
pub fn context_check(
    layout: &KernelLayout,
    window: std::time::Duration,
    early: bool,
) -> Result<ContextCheck> {
    use aya::programs::BtfTracePoint;
    let mut ebpf = EbpfLoader::new()
        .override_global("LAYOUT", layout, true)
        .load(EBPF_OBJECT)
        .map_err(|e| anyhow!("loading the eBPF object failed: {}", chain(&e)))?;
    let btf = Btf::from_sys_fs().context("load kernel BTF")?;
    let plan: [(&str, &str, &[&str]); 3] = [
        ("task", "ctx_check_task", &["sched_switch"]),
        ("softirq", "ctx_check_softirq", &["softirq_entry"]),
        (
            "hardirq",
            "ctx_check_hardirq",
            &["local_timer_entry", "irq_handler_entry"],
        ),
    ];
    let mut used = Vec::new();
    for (expected, prog, tps) in plan {
        let p: &mut BtfTracePoint = ebpf
            .program_mut(prog)
            .context("context-check program")?
            .try_into()?;
        let mut last = String::new();
        let mut ok = None;
        for tp in tps {
            match p.load(tp, &btf).and_then(|_| p.attach().map(drop)) {
                Ok(()) => {
                    ok = Some(tp.to_string());
                    break;
                }
                Err(e) => {
                    last = format!("{tp}: {}", chain(&e));
                    let _ = p.unload();
                }
            }
        }
        let tp =
            ok.ok_or_else(|| anyhow!("cannot attach the {expected} context check ({last})"))?;
        used.push((expected, tp));
    }
    let start = std::time::Instant::now();
    while start.elapsed() < window {
        std::thread::sleep(std::time::Duration::from_millis(20));
        if early {
            let counts: PerCpuArray<_, u64> =
                PerCpuArray::try_from(ebpf.map("CTX_CHECK").context("CTX_CHECK map")?)?;
            let hits = |row: u32| -> Result<u64> {
                let mut n = 0;
                for got in 0..5 {
                    n += counts.get(&(row * 5 + got), 0)?.iter().sum::<u64>();
                }
                Ok(n)
            };
            if hits(1)? >= 3 && hits(2)? >= 3 {
                break;
            }
        }
    }
    for (_, prog, _) in plan {
        let p: &mut BtfTracePoint = ebpf
            .program_mut(prog)
            .context("context-check program")?
            .try_into()?;
        let _ = p.unload();
    }
    let counts: PerCpuArray<_, u64> =
        PerCpuArray::try_from(ebpf.map("CTX_CHECK").context("CTX_CHECK map")?)?;
    let bits: PerCpuArray<_, u64> =
        PerCpuArray::try_from(ebpf.map("CTX_BITS").context("CTX_BITS map")?)?;
    let mut out = Vec::new();
    // `used` is in context order (task, softirq, hardirq), as the programs index their counts.
    for (i, (expected, tp)) in used.into_iter().enumerate() {
        let mut row = [0u64; 5];
        for (got, slot) in row.iter_mut().enumerate() {
            *slot = counts.get(&((i * 5 + got) as u32), 0)?.iter().sum();
        }
        let or = bits.get(&((i * 2) as u32), 0)?.iter().fold(0, |a, b| a | b);
        let and = bits
            .get(&((i * 2 + 1) as u32), 0)?
            .iter()
            .filter(|v| **v != 0)
            .fold(u64::MAX, |a, b| a & b);
        let and = if and == u64::MAX {
            0
        } else {
            and & 0xffff_ffff
        };
        out.push((expected, tp, row, (or, and)));
    }
    Ok(out)
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.detach_all();
    }
}
