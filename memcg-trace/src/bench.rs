//! `memcg-trace bench` (hidden; driven by `cargo xtask bench`): what tracing costs, measured
//! side by side in one run on the running kernel.
//!
//! 1. Per-call cost: memcg-trace's program pair on one probe's function, next to (a) empty
//!    programs of the same type and (b) the floor of any latency tracer (clock at entry into a
//!    per-CPU slot, clock at exit added to a per-CPU sum), all attached to the same function at
//!    once during one workload run; costs from the kernel's bpf stats.
//! 2. Workload slowdown: the workload untraced and traced (default probes), interleaved.

use std::{path::PathBuf, process::Stdio, time::Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::{
    cli::ProbeSel,
    probes::{AttachMode, Backend, Plan},
    record::{attach_all, check_privileges, named_workload},
    snapshot::ratio,
    tracer::Tracer,
    workload::{self, Memcg},
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
    /// ours / floor (b).
    pub ratio_to_clock: Option<f64>,
    /// ours / floor (a).
    pub ratio_to_empty: Option<f64>,
    /// Workload slowdown with the default probes.
    pub slowdown: Slowdown,
}

fn pair_cost(tracer: &Tracer, progs: &[String]) -> PairCost {
    let costs: Vec<_> = progs.iter().map(|p| tracer.program_cost(p)).collect();
    let calls = costs.last().map(|c| c.run_cnt).unwrap_or(0);
    let ns = costs.iter().map(|c| c.ns_per_run()).sum::<Option<f64>>();
    PairCost {
        programs: progs.to_vec(),
        calls,
        ns_per_call: ns,
    }
}

/// Runs `cmd` to completion in a fresh memcg; returns the run time in seconds (hackbench's own
/// `Time:` line when it prints one, else wall time).
fn run_in_memcg(cmd: &[String]) -> Result<f64> {
    let mut m = Memcg::create(&workload::find_hierarchy()?)?;
    let t = Instant::now();
    let out = m
        .command(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| anyhow!("cannot run {:?}: {e}", cmd[0]))?;
    let wall = t.elapsed().as_secs_f64();
    m.remove()?;
    if !out.status.success() {
        bail!("{:?} failed: {}", cmd, out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("Time:").and_then(|v| v.trim().parse().ok()))
        .unwrap_or(wall))
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

/// `memcg-trace bench`.
pub fn bench(args: BenchArgs) -> Result<i32> {
    check_privileges()?;
    let cmd = if args.command.is_empty() {
        named_workload("hackbench")?
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
    // 1. Per-call cost, side by side on one function during one run.
    let (mut tracer, _) = attach_all(
        &ProbeSel {
            probe: vec![probe.clone()],
            ..sel.clone()
        },
        true,
        0,
    )?;
    let ours = tracer
        .attached
        .first()
        .cloned()
        .ok_or_else(|| anyhow!("probe {probe} could not be attached with {}", args.attach))?;
    let plan = Plan {
        backend: args.attach,
        target: ours.target.clone(),
    };
    let floors: (Vec<String>, Vec<String>) = match args.attach {
        Backend::Fentry => (
            vec!["floor_clock_fentry".into(), "floor_clock_fexit".into()],
            vec!["floor_empty_fentry".into(), "floor_empty_fexit".into()],
        ),
        Backend::Kprobe => (
            vec!["floor_clock_kprobe".into(), "floor_clock_kretprobe".into()],
            vec!["floor_empty_kprobe".into(), "floor_empty_kretprobe".into()],
        ),
        Backend::Tracepoint => (vec!["floor_clock_tp".into()], vec!["floor_empty_tp".into()]),
    };
    let all: Vec<&str> = floors
        .0
        .iter()
        .chain(&floors.1)
        .map(String::as_str)
        .collect();
    tracer
        .attach_extra(&all, &plan)
        .context("attach the floor programs")?;
    tracer.done_attaching();
    run_in_memcg(&cmd)?;
    tracer.finish()?;
    let ours_cost = pair_cost(&tracer, &ours.programs);
    let floor_clock = pair_cost(&tracer, &floors.0);
    let floor_empty = pair_cost(&tracer, &floors.1);
    drop(tracer);
    // 2. Slowdown, interleaved: untraced, traced, untraced, traced, ...
    let mut slow = Slowdown {
        untraced_s: Vec::new(),
        traced_s: Vec::new(),
        pair_ratios: Vec::new(),
        median_ratio: None,
        min_ratio: None,
    };
    for _ in 0..args.pairs {
        slow.untraced_s.push(run_in_memcg(&cmd)?);
        let (mut t, _) = attach_all(&sel, true, 0)?;
        t.done_attaching();
        slow.traced_s.push(run_in_memcg(&cmd)?);
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
    let out = BenchOut {
        kernel_release: crate::kernel::release(),
        backend: args.attach,
        probe,
        target: ours.target,
        workload: cmd,
        ratio_to_clock: ours_cost
            .ns_per_call
            .zip(floor_clock.ns_per_call)
            .and_then(|(a, b)| ratio(a, b)),
        ratio_to_empty: ours_cost
            .ns_per_call
            .zip(floor_empty.ns_per_call)
            .and_then(|(a, b)| ratio(a, b)),
        ours: ours_cost,
        floor_clock,
        floor_empty,
        slowdown: slow,
    };
    let json = serde_json::to_string_pretty(&out)?;
    match &args.output {
        Some(p) => std::fs::write(p, json).with_context(|| format!("write {}", p.display()))?,
        None => println!("{json}"),
    }
    Ok(0)
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
