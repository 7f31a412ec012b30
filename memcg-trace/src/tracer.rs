//! The kernel side, seen from userspace: loads the eBPF object (one loader set-up for every
//! use), attaches one program pair per probe with the requested backend (falling back in `auto`
//! mode, with the reason), and reads the per-CPU maps into a `Snapshot`. Dropping the `Tracer`
//! detaches every link.

use std::{
    collections::HashMap,
    error::Error,
    fs,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    time::Instant,
};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{
    maps::{MapData, PerCpuArray},
    programs::Program,
    Btf, Ebpf, EbpfLoader,
};
use aya_log::EbpfLogger;
use memcg_trace_common::{
    ctx_check_index, names, slot_index, Hist, KernelLayout, Slot, CTX_CHECK_COLS, CTX_CHECK_ROWS,
    CTX_NAMES, MAX_PROBES, NUM_CTX, NUM_SLOTS,
};

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

/// The one way the object is loaded: kernel layout, workload cgroup and log level patched into
/// the programs' read-only globals. With the log level 0 the verifier removes every log
/// statement, so diagnostics cost nothing when off.
fn load_object(layout: &KernelLayout, workload_cgroup: u64, ebpf_log: bool) -> Result<Ebpf> {
    if EBPF_OBJECT.is_empty() {
        bail!("this binary was built with AYA_BUILD_SKIP and carries no eBPF programs; rebuild it with `cargo xtask build`");
    }
    let level: u8 = if ebpf_log { 0xff } else { 0 };
    EbpfLoader::new()
        .override_global(names::GLOBAL_LAYOUT, layout, true)
        .override_global(names::GLOBAL_WORKLOAD_CGROUP, &workload_cgroup, true)
        .override_global(aya_log::LEVEL, &level, true)
        .load(EBPF_OBJECT)
        .map_err(|e| anyhow!("loading the eBPF object failed: {}", chain(&e)))
}

/// A per-CPU array of the object, by name.
fn per_cpu<'a, V: aya::Pod>(ebpf: &'a Ebpf, name: &str) -> Result<PerCpuArray<&'a MapData, V>> {
    let map = ebpf
        .map(name)
        .ok_or_else(|| anyhow!("map {name} missing from the object"))?;
    PerCpuArray::try_from(map).with_context(|| format!("map {name}"))
}

/// Sum over CPUs of one entry of a per-CPU counter array.
fn sum_u64(map: &PerCpuArray<&MapData, u64>, index: u32) -> Result<u64> {
    Ok(map.get(&index, 0)?.iter().sum())
}

/// Loads `prog` for `target` (a function or tracepoint; ignored by program types that take
/// their target at attach time) and attaches it there.
fn load_and_attach(p: &mut Program, target: &str, btf: &Btf) -> Result<(), String> {
    let r = match p {
        Program::FEntry(p) => p.load(target, btf).and_then(|_| p.attach().map(drop)),
        Program::FExit(p) => p.load(target, btf).and_then(|_| p.attach().map(drop)),
        Program::KProbe(p) => p.load().and_then(|_| p.attach(target, 0).map(drop)),
        Program::BtfTracePoint(p) => p.load(target, btf).and_then(|_| p.attach().map(drop)),
        _ => return Err("unexpected program type".into()),
    };
    r.map_err(|e| {
        let s = chain(&e);
        if s.contains("Operation not permitted") || s.contains("EPERM") {
            format!(
                "{s} (the kernel refused it: lockdown, a sandbox or missing CAP_BPF/CAP_PERFMON)"
            )
        } else {
            s
        }
    })
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

/// The programs of one probe slot for a backend, entry first.
pub fn slot_programs(backend: Backend, slot: u32) -> Vec<&'static str> {
    let s = slot as usize;
    match backend {
        Backend::Fentry => vec![names::FENTRY[s], names::FEXIT[s]],
        Backend::Kprobe => vec![names::KPROBE[s], names::KRETPROBE[s]],
        Backend::Tracepoint => vec![names::TP[s]],
    }
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
    /// Programs attached besides the probes (the bench floors).
    extra: Vec<&'static str>,
    started: Instant,
    /// Whether task-context calls of a workload cgroup are counted apart.
    workload: bool,
    /// Duplicates of the attached programs' fds: they keep the kernel's run statistics readable
    /// after the links are gone, so the final figures cover every run.
    prog_fds: HashMap<&'static str, OwnedFd>,
    /// The programs' diagnostics, when `--ebpf-log` asked for them.
    logger: Option<EbpfLogger<StderrLog>>,
    /// Keeps kernel bpf stats on while it is open (BPF_ENABLE_STATS).
    _stats: Option<OwnedFd>,
}

impl Tracer {
    /// Loads the object with the kernel layout, the workload's cgroup v2 id (0: none) and the
    /// diagnostics switch.
    pub fn load(layout: &KernelLayout, workload_cgroup: u64, ebpf_log: bool) -> Result<Self> {
        // EbpfLoader parses the kernel's BTF for itself; ours is parsed after the loader is gone
        // so that the two (tens of MiB each) are never alive together.
        let mut ebpf = load_object(layout, workload_cgroup, ebpf_log)?;
        let logger = if ebpf_log {
            Some(
                EbpfLogger::init_with_logger(&mut ebpf, StderrLog)
                    .map_err(|e| anyhow!("eBPF log: {e}"))?,
            )
        } else {
            None
        };
        let btf = Btf::from_sys_fs().context("load kernel BTF")?;
        // bpf stats on while we trace; the kernel turns them back off when this fd closes.
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        Ok(Tracer {
            ebpf,
            btf: Some(btf),
            attached: Vec::new(),
            failed: Vec::new(),
            masks: None,
            extra: Vec::new(),
            started: Instant::now(),
            workload: workload_cgroup != 0,
            prog_fds: HashMap::new(),
            logger,
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
            let programs = slot_programs(plan.backend, slot);
            match self.attach_programs(&programs, &plan.target) {
                Ok(()) => {
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

    /// Attaches `programs` (entry first) to `target`, exit first: an entry without its exit
    /// would only leave stale start slots. All or none.
    fn attach_programs(&mut self, programs: &[&'static str], target: &str) -> Result<(), String> {
        let btf = self
            .btf
            .as_ref()
            .ok_or("attaching is over (BTF released)")?;
        for (i, &name) in programs.iter().enumerate().rev() {
            let p = self
                .ebpf
                .program_mut(name)
                .ok_or_else(|| format!("program {name} missing from the object"))?;
            if let Err(e) = load_and_attach(p, target, btf) {
                unload(p);
                for &done in &programs[i + 1..] {
                    if let Some(p) = self.ebpf.program_mut(done) {
                        unload(p);
                    }
                    self.prog_fds.remove(done);
                }
                return Err(e);
            }
            if let Some(fd) = dup_fd(p) {
                self.prog_fds.insert(name, fd);
            }
        }
        Ok(())
    }

    /// Attaches further programs of the object (the bench floors) to `plan`'s target, exit
    /// programs first; their costs are reported in [`Snapshot::extra`].
    pub fn attach_extra(&mut self, programs: &[&'static str], plan: &Plan) -> Result<()> {
        self.attach_programs(programs, &plan.target)
            .map_err(|e| anyhow!("{} on {}: {e}", programs.join("+"), plan.target))?;
        self.extra.extend_from_slice(programs);
        Ok(())
    }

    /// Frees the kernel BTF once every probe is attached; later attaches fail.
    pub fn done_attaching(&mut self) {
        self.btf = None;
    }

    /// Detaches and unloads every program (also done on drop).
    pub fn detach_all(&mut self) {
        let progs: Vec<&'static str> = self.prog_fds.keys().copied().collect();
        for name in progs {
            if let Some(p) = self.ebpf.program_mut(name) {
                unload(p);
            }
        }
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

    /// Forwards the programs' diagnostics, if they are on.
    pub fn flush_log(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }

    /// Detaches every program, then takes the final snapshot: no run is left uncounted between
    /// the read of the maps and the read of the run statistics.
    pub fn finish(&mut self) -> Result<Snapshot> {
        let elapsed = self.started.elapsed();
        self.detach_all();
        self.flush_log();
        let mut snap = self.snapshot()?;
        snap.elapsed = elapsed;
        Ok(snap)
    }

    /// Reads every attached probe's per-CPU histograms and counters, summed over CPUs.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let hist: PerCpuArray<_, Hist> = per_cpu(&self.ebpf, names::MAP_HIST)?;
        let slots: PerCpuArray<_, Slot> = per_cpu(&self.ebpf, names::MAP_SLOTS)?;
        let workload: PerCpuArray<_, Hist> = per_cpu(&self.ebpf, names::MAP_WORKLOAD_HIST)?;
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
            extra: self.extra.iter().map(|p| self.cost(p)).collect(),
        })
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.detach_all();
    }
}

/// Runs the eBPF `selftest` program through BPF_PROG_TEST_RUN once per value, each in its own
/// slot: the kernel-side bucketing and context code on fixed inputs. Returns, per value, the
/// bucket the kernel counted it in (None if none) and the context the program saw (-1: unknown).
pub fn selftest(layout: &KernelLayout, values: &[u64]) -> Result<Vec<(u64, Option<usize>, i32)>> {
    use aya::programs::{RawTracePoint, RawTracePointRunOptions, TestRun as _};
    if values.len() > NUM_SLOTS as usize {
        bail!("at most {NUM_SLOTS} selftest values");
    }
    let mut ebpf = load_object(layout, 0, false)?;
    let hist: PerCpuArray<_, Hist> =
        PerCpuArray::try_from(ebpf.take_map(names::MAP_HIST).context("HIST map")?)?;
    let prog: &mut RawTracePoint = ebpf
        .program_mut(names::SELFTEST)
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
            .find_map(|h| h.buckets.iter().position(|n| *n > 0));
        out.push((v, bucket, r.return_value as i32));
    }
    Ok(out)
}

/// How the shared context classification saw a tracepoint of known context.
#[derive(Clone, Debug)]
pub struct ContextCheck {
    /// The context the tracepoint runs in: task, softirq or hardirq.
    pub expected: &'static str,
    /// The tracepoint used.
    pub tracepoint: String,
    /// Hits by classified context: task, softirq, hardirq, nmi, unknown.
    pub counts: [u64; CTX_CHECK_COLS as usize],
    /// preempt_count bits set in any hit.
    pub bits_any: u64,
    /// preempt_count bits set in every hit.
    pub bits_all: u64,
}

/// Attaches the context-check programs to tracepoints of known context (sched_switch: task;
/// softirq_entry: softirq; local_timer_entry or irq_handler_entry: hardirq) for `window` and
/// returns how each was classified. With `early`, returns as soon as softirq and hardirq have
/// 3 hits each.
pub fn context_check(
    layout: &KernelLayout,
    window: std::time::Duration,
    early: bool,
) -> Result<Vec<ContextCheck>> {
    let mut ebpf = load_object(layout, 0, false)?;
    let btf = Btf::from_sys_fs().context("load kernel BTF")?;
    let tracepoints: [&[&str]; CTX_CHECK_ROWS as usize] = [
        &["sched_switch"],
        &["softirq_entry"],
        &["local_timer_entry", "irq_handler_entry"],
    ];
    let mut used = Vec::new();
    for (row, tps) in tracepoints.iter().enumerate() {
        let prog = names::CTX_CHECK[row];
        let p = ebpf
            .program_mut(prog)
            .ok_or_else(|| anyhow!("program {prog} missing from the object"))?;
        let mut last = String::new();
        let mut ok = None;
        for tp in *tps {
            match load_and_attach(p, tp, &btf) {
                Ok(()) => {
                    ok = Some(tp.to_string());
                    break;
                }
                Err(e) => {
                    last = format!("{tp}: {e}");
                    unload(p);
                }
            }
        }
        let tp = ok.ok_or_else(|| {
            anyhow!(
                "cannot attach the {} context check ({last})",
                CTX_NAMES[row]
            )
        })?;
        used.push(tp);
    }
    let hits = |ebpf: &Ebpf, row: u32| -> Result<u64> {
        let counts: PerCpuArray<_, u64> = per_cpu(ebpf, names::MAP_CTX_CHECK)?;
        let mut n = 0;
        for got in 0..CTX_CHECK_COLS {
            n += sum_u64(&counts, ctx_check_index(row, got))?;
        }
        Ok(n)
    };
    let start = Instant::now();
    while start.elapsed() < window {
        std::thread::sleep(std::time::Duration::from_millis(20));
        if early && hits(&ebpf, 1)? >= 3 && hits(&ebpf, 2)? >= 3 {
            break;
        }
    }
    for prog in names::CTX_CHECK {
        if let Some(p) = ebpf.program_mut(prog) {
            unload(p);
        }
    }
    let counts: PerCpuArray<_, u64> = per_cpu(&ebpf, names::MAP_CTX_CHECK)?;
    let bits: PerCpuArray<_, u64> = per_cpu(&ebpf, names::MAP_CTX_BITS)?;
    let mut out = Vec::new();
    for (row, tracepoint) in used.into_iter().enumerate() {
        let row32 = row as u32;
        let mut c = [0u64; CTX_CHECK_COLS as usize];
        for (got, slot) in c.iter_mut().enumerate() {
            *slot = sum_u64(&counts, ctx_check_index(row32, got as u32))?;
        }
        let any = bits.get(&(row32 * 2), 0)?.iter().fold(0, |a, b| a | b);
        let all = bits
            .get(&(row32 * 2 + 1), 0)?
            .iter()
            .filter(|v| **v != 0)
            .fold(u64::MAX, |a, b| a & b);
        out.push(ContextCheck {
            expected: CTX_NAMES[row],
            tracepoint,
            counts: c,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The object holds exactly the programs `memcg_trace_common::names` lists, so the two sides
    /// cannot drift apart.
    #[test]
    fn object_holds_the_programs_the_contract_names() {
        if EBPF_OBJECT.is_empty() {
            eprintln!(
                "skipping object_holds_the_programs_the_contract_names: built with AYA_BUILD_SKIP"
            );
            return;
        }
        let obj = aya_obj::Object::parse(EBPF_OBJECT).expect("parse the eBPF object");
        let mut have: Vec<&str> = obj.programs.keys().map(String::as_str).collect();
        let mut want: Vec<&str> = names::all_programs().collect();
        have.sort_unstable();
        want.sort_unstable();
        assert_eq!(have, want);
    }
}
