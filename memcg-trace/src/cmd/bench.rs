//! `memcg-trace bench` (hidden; driven by `cargo xtask bench`): what tracing costs, measured
//! side by side in one run on the running kernel.
//!
//! 1. Per-call cost: memcg-trace's program pair on one probe's function, next to (a) empty
//!    programs of the same type and (b) the floor of any latency tracer (clock at entry into a
//!    per-CPU slot, clock at exit added to a per-CPU sum), all attached to the same function at
//!    once during one workload run; costs from the kernel's bpf stats.
//! 2. Workload slowdown: the workload untraced and traced (default probes), interleaved.

use std::path::PathBuf;

use anyhow::{anyhow, Context as _, Result};
use memcg_trace_common::names;
use serde::{Deserialize, Serialize};

use crate::{
    figures::ratio,
    probes::{AttachMode, Backend, Plan},
    session::{self, check_privileges, Event, LiveArgs, Options, ProbeSel, Session, Verbosity},
    snapshot::ProgCost,
    tracer::proginfo::ProgCode,
    workload,
};

/// `bench` options.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Backend to measure.
    #[arg(long, value_enum)]
    pub attach: Backend,
    /// Interleaved untraced/traced workload pairs.
    #[arg(long, default_value_t = 5)]
    pub pairs: usize,
    /// Runs of the per-call comparison (each: memcg-trace's pair with direct reads, then with
    /// bpf_probe_read_kernel reads, floors attached beside both); the median run is reported.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// Probe whose function carries the per-call comparison (default: charge; stat for tracepoint).
    #[arg(long)]
    pub probe: Option<String>,
    /// Write the results here (JSON); stdout otherwise.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Workload (default: hackbench -g 2 -l 200).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Mean cost per call of a program pair (entry + exit; tracepoints: the one program).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PairCost {
    /// Programs.
    pub programs: Vec<String>,
    /// Calls (runs of the last program).
    pub calls: u64,
    /// Sum of the programs' mean run times, ns.
    pub ns_per_call: Option<f64>,
}

/// Workload runs, seconds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Slowdown {
    /// Untraced run times, in run order.
    pub untraced_s: Vec<f64>,
    /// Traced run times, in run order (each right after its untraced partner).
    pub traced_s: Vec<f64>,
    /// traced / untraced per pair.
    pub pair_ratios: Vec<f64>,
    /// Median of the pair ratios.
    pub median_ratio: Option<f64>,
    /// Smallest pair ratio.
    pub min_ratio: Option<f64>,
}

/// The results of one `bench` run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BenchOut {
    /// `uname -r`.
    pub kernel_release: String,
    /// Backend measured.
    pub backend: Backend,
    /// Probe and function of the per-call comparison.
    pub probe: String,
    /// Function or tracepoint.
    pub target: String,
    /// The workload.
    pub workload: Vec<String>,
    /// memcg-trace's pair.
    pub ours: PairCost,
    /// Floor (b): clock at entry and exit, one per-CPU sum.
    pub floor_clock: PairCost,
    /// Floor (a): empty programs.
    pub floor_empty: PairCost,
    /// memcg-trace's pair with the preempt count and switch counts read through
    /// bpf_probe_read_kernel (`--probe-read`), measured the same way in a second run.
    pub ours_probe_read: PairCost,
    /// What the kernel runs for each program of the comparison: memcg-trace's (direct reads),
    /// memcg-trace's with `--probe-read`, and the floors'.
    pub code: Vec<NamedCode>,
    /// ours / floor (b) of each run, in run order.
    pub ratio_runs: Vec<f64>,
    /// ours / floor (b), the median run.
    pub ratio_to_clock: Option<f64>,
    /// ours / floor (a).
    pub ratio_to_empty: Option<f64>,
    /// memcg-trace's pair with `--callers` (function-tracing backends), measured the same way
    /// in a third run of each repeat: the median run by its ratio to floor (b).
    #[serde(default)]
    pub ours_callers: Option<PairCost>,
    /// That pair / floor (b) of the same run, each repeat.
    #[serde(default)]
    pub ratio_runs_callers: Vec<f64>,
    /// The median of those: compare with `ratio_to_clock` (each normalised by the floor
    /// measured beside it).
    #[serde(default)]
    pub ratio_to_clock_callers: Option<f64>,
    /// memcg-trace's pair with `--by-memcg` (every backend), measured the same way in a
    /// fourth run of each repeat (the workload in its memcg, so the workload's calls are told by
    /// the memcg too): the median run by its ratio to floor (b).
    #[serde(default)]
    pub ours_by_memcg: Option<PairCost>,
    /// That pair / floor (b) of the same run, each repeat.
    #[serde(default)]
    pub ratio_runs_by_memcg: Vec<f64>,
    /// The median of those.
    #[serde(default)]
    pub ratio_to_clock_by_memcg: Option<f64>,
    /// Workload slowdown with the default probes.
    pub slowdown: Slowdown,
}

/// One program's code.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NamedCode {
    /// Program name, with ` (probe-read)` for the second run's.
    pub program: String,
    /// Its code as the kernel runs it.
    #[serde(flatten)]
    pub code: ProgCode,
}

fn pair_cost(costs: &[ProgCost], progs: &[&str]) -> PairCost {
    let costs: Vec<&ProgCost> = progs
        .iter()
        .filter_map(|p| costs.iter().find(|c| c.name == *p))
        .collect();
    let calls = costs.last().map(|c| c.run_cnt).unwrap_or(0);
    let ns = costs
        .iter()
        .map(|c| ratio(c.run_time_ns as f64, c.run_cnt as f64))
        .sum::<Option<f64>>();
    PairCost {
        programs: progs.iter().map(|p| p.to_string()).collect(),
        calls,
        ns_per_call: ns,
    }
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn mode(b: Backend) -> AttachMode {
    match b {
        Backend::Fentry => AttachMode::Fentry,
        Backend::Kprobe => AttachMode::Kprobe,
        Backend::Tracepoint => AttachMode::Tracepoint,
    }
}

/// The floor programs of a backend: (clock floor (b), empty floor (a)).
fn floors(b: Backend) -> (&'static [&'static str], &'static [&'static str]) {
    match b {
        Backend::Fentry => (&names::FLOOR_CLOCK_FENTRY, &names::FLOOR_EMPTY_FENTRY),
        Backend::Kprobe => (&names::FLOOR_CLOCK_KPROBE, &names::FLOOR_EMPTY_KPROBE),
        Backend::Tracepoint => (&names::FLOOR_CLOCK_TP, &names::FLOOR_EMPTY_TP),
    }
}

/// Which of memcg-trace's pairs a per-call run measures.
#[derive(Clone, Copy)]
struct Variant {
    /// Reads through bpf_probe_read_kernel (`--probe-read`).
    probe_read: bool,
    /// `--callers`.
    callers: bool,
    /// `--by-memcg`.
    by_memcg: bool,
}

/// What one per-call run measured.
struct PerCall {
    /// The traced function or tracepoint.
    target: String,
    /// memcg-trace's programs on it.
    ours: Vec<&'static str>,
    /// Every program's run statistics.
    costs: Vec<ProgCost>,
    /// The code of memcg-trace's programs and of the floors.
    code: Vec<NamedCode>,
}

/// The live run of [`per_call`]: `probe` alone, `cmd` its workload, bpf stats on.
fn per_call_args(probe: &str, cmd: &[String], sel: &ProbeSel, variant: Variant) -> LiveArgs {
    LiveArgs {
        sel: ProbeSel {
            probe: vec![probe.to_string()],
            ..sel.clone()
        },
        command: cmd.to_vec(),
        // The per-call figures are the kernel's run-time stats: on for this run only (the
        // slowdown runs below have them off, like a default recording).
        bpf_stats: true,
        probe_read: variant.probe_read,
        callers: variant.callers,
        by_memcg: variant.by_memcg,
        ..LiveArgs::default()
    }
}

/// Runs the workload once with memcg-trace's pair on `probe` and the `extra` floor programs
/// next to it on the same function, bpf stats on.
async fn per_call(
    args: &BenchArgs,
    probe: &str,
    cmd: &[String],
    sel: &ProbeSel,
    variant: Variant,
    clock: &[&'static str],
    empty: &[&'static str],
) -> Result<PerCall> {
    let live = per_call_args(probe, cmd, sel, variant);
    let opts = Options {
        verbosity: Verbosity::Quiet,
        dashboard: true,
        least_privilege: false,
    };
    let mut target = None;
    let mut code = Vec::new();
    let mut sess = Session::start(&live, opts, |tracer| {
        let ours =
            tracer.attached.first().cloned().ok_or_else(|| {
                anyhow!("probe {probe} could not be attached with {}", args.attach)
            })?;
        let plan = Plan {
            backend: args.attach,
            target: ours.target.clone(),
        };
        target = Some((ours.target.clone(), ours.programs.clone()));
        let extra: Vec<&'static str> = clock.iter().chain(empty).copied().collect();
        if !extra.is_empty() {
            tracer
                .attach_extra(&extra, &plan)
                .context("attach the floor programs")?;
        }

        for p in ours.programs.iter().copied().chain(extra) {
            if let Some(c) = tracer.code(p) {
                code.push(NamedCode {
                    program: p.to_string(),
                    code: c,
                });
            }
        }
        Ok(())
    })
    .await?;
    let end = loop {
        match sess.next().await? {
            Event::Tick(_) => {}
            Event::WorkloadExited(code) => break session::End::Exited(code),
            Event::Signal(sig) => break session::End::Signal(sig),
        }
    };
    let fin = sess.finish(end).await?;
    if fin.exit_code != 0 {
        anyhow::bail!("{:?} failed under the bench (exit {})", cmd, fin.exit_code);
    }

    let (target, ours) = target.expect("set when attached");
    let costs = fin
        .snapshot
        .probes
        .iter()
        .flat_map(|p| p.programs.iter().cloned())
        .chain(fin.snapshot.extra.iter().cloned())
        .collect();
    Ok(PerCall {
        target,
        ours,
        costs,
        code,
    })
}

/// `memcg-trace bench`.
pub async fn run(args: BenchArgs) -> Result<i32> {
    check_privileges()?;
    let cmd = if args.command.is_empty() {
        workload::named("hackbench")?
    } else {
        args.command.clone()
    };
    let probe = args.probe.clone().unwrap_or_else(|| {
        if args.attach == Backend::Tracepoint {
            "stat"
        } else {
            "charge"
        }
        .to_string()
    });
    let sel = ProbeSel {
        probe: Vec::new(),
        func: Vec::new(),
        attach: mode(args.attach),
        all: false,
    };

    // 1. Per-call cost, side by side on one function during one run of the workload; then
    //    memcg-trace's pair alone again with bpf_probe_read_kernel reads, for the before/after.
    let (clock, empty) = floors(args.attach);
    let Repeats {
        mut runs,
        with_callers,
        with_by_memcg,
    } = per_call_repeats(&args, &probe, &cmd, &sel, clock, empty).await?;
    let (ratio_runs_callers, ratio_to_clock_callers, ours_callers) = median_run(with_callers);
    let (ratio_runs_by_memcg, ratio_to_clock_by_memcg, ours_by_memcg) = median_run(with_by_memcg);
    let ratio_runs: Vec<f64> = runs.iter().map(|r| r.0).collect();

    // The median run (by ours / floor (b)) is the one reported.
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (_, direct, plain) = runs.swap_remove(runs.len() / 2);
    let ours_cost = pair_cost(&direct.costs, &direct.ours);
    let ours_probe_read = pair_cost(&plain.costs, &plain.ours);
    let floor_clock = pair_cost(&direct.costs, clock);
    let floor_empty = pair_cost(&direct.costs, empty);
    let target = direct.target;
    let code = programs_code(direct.code, plain.code);

    // 2. Slowdown, interleaved: untraced, traced, untraced, traced, ...
    let slowdown = slowdown(&args, &cmd, &sel)?;
    let out = BenchOut {
        kernel_release: crate::kernel::release(),
        backend: args.attach,
        probe,
        target,
        workload: cmd,
        ratio_runs,
        ratio_to_clock: ours_cost
            .ns_per_call
            .zip(floor_clock.ns_per_call)
            .and_then(|(a, b)| ratio(a, b)),
        ratio_to_empty: ours_cost
            .ns_per_call
            .zip(floor_empty.ns_per_call)
            .and_then(|(a, b)| ratio(a, b)),
        ours: ours_cost,
        ours_probe_read,
        ours_callers,
        ratio_runs_callers,
        ratio_to_clock_callers,
        ours_by_memcg,
        ratio_runs_by_memcg,
        ratio_to_clock_by_memcg,
        code,
        floor_clock,
        floor_empty,
        slowdown,
    };
    let json = serde_json::to_string_pretty(&out)?;
    match &args.output {
        Some(p) => crate::export::write_file_atomic(p, json.as_bytes())?,
        None => println!("{json}"),
    }
    Ok(0)
}

/// The per-call measurements of every repeat: (memcg-trace's pair / floor (b), the run with
/// direct reads, the run with probe reads), and with `--callers` (not on the tracepoint) and
/// `--by-memcg`: (that ratio, memcg-trace's pair cost).
struct Repeats {
    runs: Vec<(f64, PerCall, PerCall)>,
    with_callers: Vec<(f64, PairCost)>,
    with_by_memcg: Vec<(f64, PairCost)>,
}

/// Runs the per-call comparison `--repeats` times, each variant once a repeat.
async fn per_call_repeats(
    args: &BenchArgs,
    probe: &str,
    cmd: &[String],
    sel: &ProbeSel,
    clock: &[&'static str],
    empty: &[&'static str],
) -> Result<Repeats> {
    let mut repeats = Repeats {
        runs: Vec::new(),
        with_callers: Vec::new(),
        with_by_memcg: Vec::new(),
    };
    let ratio_of = |r: &PerCall| {
        pair_cost(&r.costs, &r.ours)
            .ns_per_call
            .zip(pair_cost(&r.costs, clock).ns_per_call)
            .and_then(|(a, b)| ratio(a, b))
            .unwrap_or(f64::NAN)
    };
    for _ in 0..args.repeats.max(1) {
        let variant = |probe_read, callers, by_memcg| Variant {
            probe_read,
            callers,
            by_memcg,
        };
        let measure = |v| per_call(args, probe, cmd, sel, v, clock, empty);
        let direct = measure(variant(false, false, false)).await?;
        let plain = measure(variant(true, false, false)).await?;
        if args.attach != Backend::Tracepoint {
            let c = measure(variant(false, true, false)).await?;
            repeats
                .with_callers
                .push((ratio_of(&c), pair_cost(&c.costs, &c.ours)));
        }

        let m = measure(variant(false, false, true)).await?;
        repeats
            .with_by_memcg
            .push((ratio_of(&m), pair_cost(&m.costs, &m.ours)));
        repeats.runs.push((ratio_of(&direct), direct, plain));
    }
    Ok(repeats)
}

/// A variant's runs: their ratios in order, and the median run's ratio (where finite) and
/// pair cost.
fn median_run(mut runs: Vec<(f64, PairCost)>) -> (Vec<f64>, Option<f64>, Option<PairCost>) {
    let order: Vec<f64> = runs.iter().map(|r| r.0).collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mid = runs.len() / 2;
    match runs.into_iter().nth(mid) {
        Some((r, c)) => (order, r.is_finite().then_some(r), Some(c)),
        None => (order, None, None),
    }
}

/// The programs' code of the reported run, and of its probe-read twin (floors left out:
/// they are the same programs), marked "(probe-read)".
fn programs_code(mut code: Vec<NamedCode>, probe_read: Vec<NamedCode>) -> Vec<NamedCode> {
    code.extend(
        probe_read
            .into_iter()
            .filter(|c| !c.program.starts_with("floor_"))
            .map(|mut c| {
                c.program.push_str(" (probe-read)");
                c
            }),
    );
    code
}

/// The workload untraced and traced (the default probes), `--pairs` times interleaved.
fn slowdown(args: &BenchArgs, cmd: &[String], sel: &ProbeSel) -> Result<Slowdown> {
    let mut slow = Slowdown {
        untraced_s: Vec::new(),
        traced_s: Vec::new(),
        pair_ratios: Vec::new(),
        median_ratio: None,
        min_ratio: None,
    };
    for _ in 0..args.pairs {
        slow.untraced_s.push(workload::timed_run(cmd)?);
        let mut t = session::attach(sel, session::AttachOptions::quiet())?.tracer;
        t.done_attaching();
        slow.traced_s.push(workload::timed_run(cmd)?);
        t.finish()?;
    }

    slow.pair_ratios = slow
        .untraced_s
        .iter()
        .zip(&slow.traced_s)
        .filter_map(|(u, t)| ratio(*t, *u))
        .collect();
    slow.median_ratio = median(&slow.pair_ratios);
    slow.min_ratio = slow.pair_ratios.iter().copied().reduce(f64::min);
    Ok(slow)
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
