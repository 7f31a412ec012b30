//! Command-line interface: argument parsing and one-line errors with a non-zero exit.

use std::{path::PathBuf, time::Duration};

use anyhow::{anyhow, bail, Result};
use clap::{Args, Parser, Subcommand};

use crate::probes::AttachMode;

/// Live eBPF tracer of the memcg charging hot paths: how long obj_cgroup_charge,
/// mod_memcg_state and the rstat update take, how often, and in which context.
#[derive(Parser, Debug)]
#[command(name = "memcg-trace", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The live dashboard (the default): charging functions per context, their latency
    /// histogram and rate, while a workload runs or system-wide.
    ///
    /// Example: memcg-trace top -- hackbench -g 2 -l 1000
    Top(crate::tui::TopArgs),
    /// The dashboard on a recording, read-only.
    ///
    /// Example: memcg-trace view run.json
    View {
        /// A JSON file written by `record` or saved from the dashboard.
        file: PathBuf,
    },
    /// Trace the whole system (and a workload, if given), print a summary table, write JSON.
    ///
    /// Example: memcg-trace record -o run.json -- hackbench -g 2 -l 100
    Record(RecordArgs),
    /// Show what each probe resolves to on this kernel and which backend attaches it, and why.
    ///
    /// Example: memcg-trace probes --attach kprobe
    Probes(ProbeSel),
    /// Print the summary table of a recording.
    ///
    /// Example: memcg-trace report run.json
    Report {
        /// A JSON file written by `record`.
        file: PathBuf,
    },
    /// Compare two recordings (A/B), per probe and context: calls/s, p50, p99, mean, change.
    ///
    /// Example: memcg-trace diff base.json patched.json
    Diff {
        /// The baseline recording.
        a: PathBuf,
        /// The recording to compare with it.
        b: PathBuf,
    },
    /// Run the in-kernel histogram and context code on fixed inputs (BPF_PROG_TEST_RUN) and
    /// compare with the userspace bucket layout.
    #[command(hide = true)]
    Selftest,
    /// What tracing costs on this kernel, side by side (driven by `cargo xtask bench`).
    #[command(hide = true)]
    Bench(crate::bench::BenchArgs),
}

/// Which probes and how to attach them.
#[derive(Args, Debug, Clone, Default)]
pub struct ProbeSel {
    /// Logical probes to trace (comma-separated or repeated); `memcg-trace probes --all` lists them.
    #[arg(long, short = 'p', value_delimiter = ',')]
    pub probe: Vec<String>,
    /// Any other traceable kernel function, traced the same way (repeatable).
    #[arg(long = "func", short = 'f')]
    pub func: Vec<String>,
    /// How to attach: auto tries fentry, then kprobe, then tracepoint, per probe.
    #[arg(long, value_enum, default_value = "auto")]
    pub attach: AttachMode,
    /// Include the optional probes (probes command: list every probe).
    #[arg(long)]
    pub all: bool,
}

/// `record` options.
#[derive(Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub sel: ProbeSel,
    /// Stop after this long (e.g. 10s, 500ms, 2m); default: until the workload exits or Ctrl-C.
    #[arg(long, short = 'd', value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Write the recording here (JSON, schema memcg-trace/1).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Poll interval for progress (e.g. 1s).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub tick: Duration,
    /// Run the workload in this existing memcg instead of a fresh one.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// Print no progress lines.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// A named workload instead of a command: `hackbench` or `hackbench:ARGS`
    /// (default ARGS: "-g 2 -l 200").
    #[arg(long, conflicts_with = "command")]
    pub workload: Option<String>,
    /// Workload to run in a fresh memcg; tracing ends when it exits.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Parses `10s`, `500ms`, `2m`, `1h` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        anyhow!("invalid duration {s:?}: expected a number with a unit, like 10s or 500ms")
    })?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1e3,
        "us" => n / 1e6,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => bail!("invalid duration {s:?}: unknown unit {unit:?} (use ms, s, m or h)"),
    };
    if !secs.is_finite() || secs <= 0.0 {
        bail!("invalid duration {s:?}: must be positive");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    // No subcommand: the dashboard with its own defaults.
    let command = match cli.command {
        Some(c) => c,
        None => match Cli::parse_from(["memcg-trace", "top"]).command {
            Some(c) => c,
            None => unreachable!("top parses"),
        },
    };
    let r = match command {
        Command::Top(a) => crate::tui::top(a),
        Command::View { file } => crate::tui::view(&file),
        Command::Record(a) => crate::record::record(a),
        Command::Probes(s) => crate::record::probes(s).map(|_| 0),
        Command::Selftest => crate::record::selftest(),
        Command::Diff { a, b } => crate::export::read(&a).and_then(|a| {
            let b = crate::export::read(&b)?;
            print!("{}", crate::report::diff(&a, &b));
            Ok(0)
        }),
        Command::Bench(a) => crate::bench::bench(a),
        Command::Report { file } => crate::export::read(&file).map(|d| {
            print!("{}", crate::report::summary(&d));
            0
        }),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!(
                "memcg-trace: error: {}",
                format!("{e:#}").replace('\n', " ")
            );
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        for bad in ["", "abc", "10x", "-1s", "0s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
