//! `record` and `probes`: resolve, attach, run the workload, poll, and hand the final
//! `Snapshot` to the outputs.

use std::{
    collections::HashMap,
    fs,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{anyhow, bail, Context as _, Result};
use memcg_trace_common::{KernelLayout, MAX_PROBES};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    cli::{ProbeSel, RecordArgs},
    export::{self, Document, Meta, NotAttachedOut, TracerCost, Workload},
    kernel::{self, Symbols},
    probes::{self, probe_def, resolve, Request, PROBES},
    report,
    tracer::Tracer,
    workload::{self, Memcg},
};

/// The preempt_count masks of this kernel, read from preempt_count in contexts known from
/// tracepoints (timer interrupt, softirq entry); the classic layout if that saw too little.
/// Kernels disagree: Debian 7.3 counts hardirqs from bit 24, earlier ones from bit 16.
pub(crate) fn calibrate(mut layout: KernelLayout) -> (KernelLayout, kernel::ContextMasks) {
    let masks = match crate::tracer::context_check(&layout, Duration::from_secs(1), true) {
        Ok(check) => {
            let all = |ctx: &str| {
                check
                    .iter()
                    .find(|c| c.0 == ctx)
                    .map(|c| c.3 .1 as u32)
                    .unwrap_or(0)
            };
            kernel::derive_masks(all("softirq"), all("hardirq")).unwrap_or_else(|| {
                kernel::ContextMasks::classic(
                    "default (calibration saw no softirq or timer interrupt)",
                )
            })
        }
        Err(e) => kernel::ContextMasks::classic(&format!("default (calibration failed: {e:#})")),
    };
    layout.nmi_mask = masks.nmi_mask;
    layout.hardirq_mask = masks.hardirq_mask;
    layout.softirq_offset = masks.softirq_offset;
    (layout, masks)
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

/// Every kernel name resolution may ask about: all probes' candidates, their layout markers and
/// tracepoints, and the `--func` names.
fn interest(sel: &ProbeSel) -> std::collections::HashSet<String> {
    let mut out: std::collections::HashSet<String> = sel.func.iter().cloned().collect();
    for p in PROBES {
        for c in p.candidates {
            out.insert(c.symbol.to_string());
            out.extend(c.requires.map(str::to_string));
        }
        out.extend(p.tracepoint.map(str::to_string));
    }
    out
}

/// Turns `--probe`/`--func` into requests, with one clear error for unknown names.
pub fn requests(sel: &ProbeSel, syms: &Symbols) -> Result<Vec<Request>> {
    let mut out = Vec::new();
    let names: Vec<String> = if sel.probe.is_empty() && sel.func.is_empty() {
        if sel.all {
            PROBES.iter().map(|p| p.name.to_string()).collect()
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
        let p = probe_def(n).ok_or_else(|| {
            anyhow!(
                "unknown probe {n:?}; valid probes: {}",
                PROBES.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
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

/// Resolves and attaches every request; fails only if nothing could be attached, or an
/// explicitly requested function could not be.
pub(crate) fn attach_all(
    sel: &ProbeSel,
    quiet: bool,
    workload_cgroup: u64,
) -> Result<(Tracer, HashMap<String, Vec<String>>)> {
    check_privileges()?;
    let btf = kernel::open_btf()?;
    let layout = kernel::layout(&btf).context("reading kernel layout from BTF")?;
    let (layout, masks) = calibrate(layout);
    let syms = Symbols::load(&btf, &interest(sel))?;
    let reqs = requests(sel, &syms)?;
    // The aya loader parses BTF again; the two parses need not be alive at once.
    drop(btf);
    let mut tracer = Tracer::load(&layout, workload_cgroup)?;
    tracer.masks = Some(masks);
    let mut notes = HashMap::new();
    for req in &reqs {
        let res = resolve(req, sel.attach.order(), &syms);
        if tracer.attach(req, &res) {
            let a = tracer.attached.last().expect("just attached");
            if !quiet {
                eprintln!("memcg-trace: {} -> {} via {}", a.name, a.target, a.backend);
                for n in a.notes.iter().filter(|n| {
                    n.starts_with(&format!("{}:", probes::Backend::Fentry))
                        || n.contains(": Operation")
                }) {
                    eprintln!("memcg-trace:   ({n})");
                }
            }
            notes.insert(a.name.clone(), a.notes.clone());
        } else {
            let f = tracer.failed.last().expect("just failed");
            if matches!(req, Request::Func(_)) {
                bail!("cannot trace {}: {}", f.name, f.reasons.join("; "));
            }
            if !quiet {
                eprintln!(
                    "memcg-trace: {} not attached: {}",
                    f.name,
                    f.reasons.join("; ")
                );
            }
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
    Ok((tracer, notes))
}

/// `memcg-trace probes`.
pub fn probes(sel: ProbeSel) -> Result<()> {
    let sel = ProbeSel {
        all: sel.all || (sel.probe.is_empty() && sel.func.is_empty()),
        ..sel
    };
    let (tracer, _) = attach_all(&sel, true, 0)?;
    println!("kernel {}", kernel::release());
    for a in &tracer.attached {
        println!(
            "{:<16} {:<28} {:<10} attached",
            a.name,
            a.target,
            a.backend.to_string()
        );
        for n in &a.notes {
            println!("{:<16}   {n}", "");
        }
    }
    for f in &tracer.failed {
        println!("{:<16} {:<28} {:<10} not attached", f.name, "-", "-");
        for n in &f.reasons {
            println!("{:<16}   {n}", "");
        }
    }
    Ok(())
}

/// What a recording knows besides the snapshot.
pub(crate) struct Run {
    pub masks: Option<kernel::ContextMasks>,
    pub start: SystemTime,
    pub end: SystemTime,
    pub tracer: TracerCost,
    pub workload: Option<Workload>,
}

/// The JSON document for a snapshot: the one place a recording is assembled (`record`, and the
/// dashboard's save key).
pub(crate) fn make_document(
    snap: &crate::snapshot::Snapshot,
    run: Run,
    notes: &HashMap<String, Vec<String>>,
    failed: &[crate::tracer::NotAttached],
) -> Document {
    let release = kernel::release();
    let config = kernel::config(&release);
    let (cpu_model, cpus) = kernel::cpu_info();
    Document {
        schema: export::SCHEMA.into(),
        meta: Meta {
            tool_version: env!("CARGO_PKG_VERSION").into(),
            preemption_model: kernel::preemption_model(config.as_ref()),
            kernel_release: release,
            kernel_config: config.unwrap_or_default(),
            cpu_model,
            cpus,
            start_unix_ns: unix_ns(run.start),
            end_unix_ns: unix_ns(run.end),
            duration_ns: snap.elapsed.as_nanos() as u64,
            bpf_stats: snap
                .probes
                .iter()
                .any(|p| p.programs.iter().any(|c| c.run_cnt > 0)),
            tracer: run.tracer,
            context_masks: run.masks,
            workload: run.workload,
        },
        probes: export::probes_out(snap, &|n| notes.get(n).cloned().unwrap_or_default()),
        not_attached: failed
            .iter()
            .map(|f| NotAttachedOut {
                name: f.name.clone(),
                reasons: f.reasons.clone(),
            })
            .collect(),
    }
}

fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn rusage() -> libc::rusage {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    }
}

/// User + system CPU time of this process so far (the workload, a child, is not included).
pub(crate) fn cpu_time() -> Duration {
    let u = rusage();
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Peak resident set size of this process, KiB.
pub(crate) fn peak_rss_kib() -> u64 {
    rusage().ru_maxrss as u64
}

/// How the recording ended.
enum End {
    Deadline,
    Signal(i32),
    Exited(Option<i32>),
}

/// The command line of a named workload (`--workload hackbench[:ARGS]`).
pub fn named_workload(spec: &str) -> Result<Vec<String>> {
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    match name {
        "hackbench" => {
            let found = std::env::var("PATH")
                .unwrap_or_default()
                .split(':')
                .chain(["/usr/bin", "/usr/local/bin"])
                .map(|d| std::path::Path::new(d).join("hackbench"))
                .find(|p| p.is_file())
                .ok_or_else(|| anyhow!("hackbench not found: install it with `apt-get install rt-tests` (cargo xtask setup does)"))?;
            let args = if rest.trim().is_empty() {
                "-g 2 -l 200"
            } else {
                rest
            };
            Ok(std::iter::once(found.display().to_string())
                .chain(args.split_whitespace().map(str::to_string))
                .collect())
        }
        other => bail!("unknown workload {other:?}; known: hackbench[:ARGS]"),
    }
}

/// `memcg-trace record`.
pub fn record(mut args: RecordArgs) -> Result<i32> {
    let t0 = std::time::Instant::now();
    if let Some(w) = &args.workload {
        args.command = named_workload(w)?;
    }
    if let Some(o) = &args.output {
        export::check_writable(o)?;
    }
    let mut memcg = None;
    if !args.command.is_empty() {
        check_privileges()?;
        let m = workload::prepare(args.cgroup.as_deref(), false)?;
        memcg = Some(m);
    }
    let cgid = memcg.as_ref().map(|m| m.cgroup_id).unwrap_or(0);
    if memcg.is_some() && cgid == 0 && !args.quiet {
        eprintln!("memcg-trace: the workload's calls cannot be told apart (no cgroup v2 id); only system-wide figures");
    }
    let (mut tracer, notes) = attach_all(&args.sel, args.quiet, cgid)?;
    tracer.done_attaching();
    let startup = t0.elapsed();
    let cpu0 = cpu_time();
    let start = SystemTime::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (end, argv) = rt.block_on(run(&args, memcg.as_ref(), &tracer))?;
    let cpu = cpu_time().saturating_sub(cpu0);
    let failed = tracer.failed.clone();
    let masks = tracer.masks.clone();
    let t_detach = std::time::Instant::now();
    let snap = tracer.finish()?;
    let detach = t_detach.elapsed();
    let end_t = SystemTime::now();
    let cgroup_path = memcg.as_ref().map(|m| m.path.display().to_string());
    if let Some(mut m) = memcg.take() {
        if let Err(e) = m.remove() {
            eprintln!("memcg-trace: warning: {e:#}");
        }
    }
    let exit_status = match end {
        End::Exited(s) => s,
        _ => None,
    };
    let doc = make_document(
        &snap,
        Run {
            masks,
            start,
            end: end_t,
            tracer: TracerCost {
                startup_ns: startup.as_nanos() as u64,
                detach_ns: detach.as_nanos() as u64,
                cpu_ns: cpu.as_nanos() as u64,
                cpu_share: crate::snapshot::ratio(cpu.as_secs_f64(), snap.elapsed.as_secs_f64()),
                peak_rss_kib: peak_rss_kib(),
                tick_ns: args.tick.as_nanos() as u64,
            },
            workload: cgroup_path.map(|cgroup| Workload {
                argv,
                exit_status,
                cgroup,
            }),
        },
        &notes,
        &failed,
    );
    print!("{}", report::summary(&doc));
    if let Some(o) = &args.output {
        export::write_atomic(o, &doc)?;
        eprintln!("memcg-trace: wrote {}", o.display());
    }
    Ok(match end {
        End::Exited(Some(s)) => s,
        End::Exited(None) => 1,
        // A workload cut short by a signal is reported like a shell would; a system-wide
        // recording ended by Ctrl-C is a normal end.
        End::Signal(sig) if !args.command.is_empty() => 128 + sig,
        End::Signal(_) | End::Deadline => 0,
    })
}

/// Waits for the workload, the deadline or a signal, whichever comes first.
async fn run(
    args: &RecordArgs,
    memcg: Option<&Memcg>,
    tracer: &Tracer,
) -> Result<(End, Vec<String>)> {
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut child = match memcg {
        Some(m) => {
            let mut cmd = tokio::process::Command::from(m.command(&args.command));
            Some(
                cmd.spawn()
                    .map_err(|e| anyhow!("cannot run {:?}: {e}", args.command[0]))?,
            )
        }
        None => None,
    };
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let sleep = tokio::time::sleep_until(
        deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86400 * 365)),
    );
    tokio::pin!(sleep);
    let mut tick = tokio::time::interval(args.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let end = loop {
        tokio::select! {
            _ = tick.tick(), if !args.quiet => progress(tracer),
            _ = sigint.recv() => break End::Signal(libc::SIGINT),
            _ = sigterm.recv() => break End::Signal(libc::SIGTERM),
            _ = sighup.recv() => break End::Signal(libc::SIGHUP),
            _ = &mut sleep, if deadline.is_some() => break End::Deadline,
            st = async { child.as_mut().expect("guarded").wait().await }, if child.is_some() => {
                use std::os::unix::process::ExitStatusExt as _;
                let st = st?;
                break End::Exited(st.code().or_else(|| st.signal().map(|s| 128 + s)));
            }
        }
    };
    if let (Some(c), End::Signal(_) | End::Deadline) = (child.as_mut(), &end) {
        // The memcg removal kills what is left; give the child a chance to end cleanly first.
        if let Some(pid) = c.id() {
            // SAFETY: plain kill(2) of our own child.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), c.wait()).await;
    }
    Ok((end, args.command.clone()))
}

/// One progress line on stderr: elapsed time and calls so far per probe.
fn progress(tracer: &Tracer) {
    if let Ok(snap) = tracer.snapshot() {
        let per: Vec<String> = snap
            .probes
            .iter()
            .map(|p| format!("{} {}", p.name, report::fmt_count(p.calls() as f64)))
            .collect();
        eprintln!(
            "memcg-trace: {:.0}s: {}",
            snap.elapsed.as_secs_f64(),
            per.join(", ")
        );
    }
}

/// `memcg-trace selftest`: the kernel-side bucketing must agree with [`bucket_index`] for every
/// value, and a program run from a syscall must see task context.
pub fn selftest() -> Result<i32> {
    use memcg_trace_common::{bucket_index, CTX_NAMES};
    check_privileges()?;
    let btf = kernel::open_btf()?;
    let (layout, masks) = calibrate(kernel::layout(&btf)?);
    drop(btf);
    println!(
        "selftest: masks nmi {:#x} hardirq {:#x} softirq {:#x} ({})",
        masks.nmi_mask, masks.hardirq_mask, masks.softirq_offset, masks.source
    );
    let values = [
        0u64,
        1,
        31,
        32,
        33,
        63,
        64,
        100,
        1000,
        1500,
        4095,
        4096,
        123_456,
        10_000_000,
        1 << 35,
        (1 << 36) + 5,
        u64::MAX >> 1,
    ];
    let results = crate::tracer::selftest(&layout, &values)?;
    let mut bad = 0;
    for (v, got, ctx) in &results {
        let want = bucket_index(*v);
        let ctx_name = usize::try_from(*ctx)
            .ok()
            .and_then(|c| CTX_NAMES.get(c))
            .copied()
            .unwrap_or("unknown");
        let ok = *got == Some(want) && ctx_name == "task";
        if !ok {
            bad += 1;
        }
        println!(
            "selftest: ns={v} bucket kernel={got:?} userspace={want} context={ctx_name} {}",
            if ok { "ok" } else { "MISMATCH" }
        );
    }
    println!("selftest: {} values, {bad} mismatches", results.len());
    // Live: tracepoints of known context, classified by the same code the probes use.
    let check = crate::tracer::context_check(&layout, Duration::from_secs(1), false)?;
    for (expected, tp, counts, (or, and)) in &check {
        let right = counts[CTX_NAMES.iter().position(|c| c == expected).unwrap_or(4)];
        let total: u64 = counts.iter().sum();
        let wrong = total - right;
        if right == 0 || wrong > 0 {
            bad += 1;
        }
        println!(
            "selftest: {tp} ({expected}): {total} hits, {right} classified {expected}, {wrong} otherwise {:?}, preempt_count bits any {or:#x} all {and:#x} {}",
            counts,
            if right > 0 && wrong == 0 { "ok" } else { "MISMATCH" }
        );
    }
    println!("selftest: {bad} failures");
    Ok(if bad == 0 { 0 } else { 1 })
}
