//! Attaching (start-up's middle step, see `start`): the kernel inspected, the programs loaded,
//! each probe attached, the floors measured.

use super::*;

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
    /// The depth of that cgroup in the kernel's v2 hierarchy.
    pub workload_level: crate::workload::CgroupLevel,
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
            workload_level: Default::default(),
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
        let def = probes::probe_def(n).ok_or_else(|| {
            anyhow!(
                "unknown probe {n:?}; valid probes: {}",
                probes::PROBES
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        if !out.contains(&Request::Probe(def)) {
            out.push(Request::Probe(def));
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

    // Only the kernel knows the level of a cgroup namespace's root.
    let workload_level = o
        .workload_level
        .resolve(|| crate::tracer::own_cgroup_level(&layout))
        .unwrap_or_else(|e| {
            calibration.push(format!(
                "a workload that moves below its cgroup is not followed: {e:#}"
            ));
            0
        });
    let mut tracer = Tracer::load(
        &layout,
        &LoadOptions {
            workload_cgroup: o.workload_cgroup,
            workload_owned: o.workload_owned,
            workload_level,
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
