//! `memcg-trace programs`: every BPF program loaded on this machine, by any tool, with the
//! kernel's run statistics and the code it runs: how memcg-trace's programs compare with a
//! bpftrace script's or another tracer's on the same kernel.

use anyhow::{Context as _, Result};

use crate::{session::check_privileges, tracer::proginfo};

/// `programs` options.
#[derive(clap::Args, Debug)]
pub struct ProgramsArgs {
    /// Only programs whose name contains this.
    #[arg(long)]
    pub name: Option<String>,
    /// JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `memcg-trace programs`.
pub fn run(args: ProgramsArgs) -> Result<i32> {
    check_privileges()?;
    let mut progs = proginfo::loaded().context("list the loaded BPF programs")?;
    if let Some(n) = &args.name {
        progs.retain(|p| p.name.contains(n.as_str()));
    }

    if args.json {
        println!("{}", serde_json::to_string_pretty(&progs)?);
        return Ok(0);
    }

    let stats = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .map(|s| s.trim() == "1")
        .unwrap_or(false);
    println!(
        "{:>6} {:>4} {:<16} {:>12} {:>9} {:>7} {:>7} {:>7}",
        "id", "type", "name", "runs", "ns/run", "insns", "jited", "helpers"
    );
    for p in &progs {
        let per_run = if p.run_cnt > 0 {
            format!("{:.0}", p.run_time_ns as f64 / p.run_cnt as f64)
        } else {
            "-".into()
        };
        println!(
            "{:>6} {:>4} {:<16} {:>12} {:>9} {:>7} {:>7} {:>7}",
            p.id,
            p.prog_type,
            p.name,
            p.run_cnt,
            per_run,
            p.code.xlated_insns,
            p.code.jited_bytes,
            p.code.helper_calls
        );
    }

    if !stats {
        println!("(run counts and times are only kept while bpf stats are on: sysctl kernel.bpf_stats_enabled=1)");
    }
    Ok(0)
}
