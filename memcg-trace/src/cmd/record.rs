//! `memcg-trace record`: trace while a workload runs (or for a while, or until Ctrl-C), then
//! print the summary table and write the JSON recording.

use std::{path::PathBuf, time::Duration};

use anyhow::Result;

use crate::{
    export,
    session::{End, Event, LiveArgs, Options, Session, Verbosity},
    snapshot::Snapshot,
    table,
    units::{fmt_count, parse_duration},
};

/// `record` options.
#[derive(clap::Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub live: LiveArgs,
    /// Stop after this long (e.g. 10s, 500ms, 2m); default: until the workload exits or Ctrl-C.
    #[arg(long, short = 'd', value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Write the recording here (JSON, schema memcg-trace/2).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Print no progress lines.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// One progress line on stderr: elapsed time and calls so far per probe.
fn progress(snap: &Snapshot) {
    let per: Vec<String> = snap
        .probes
        .iter()
        .map(|p| format!("{} {}", p.name, fmt_count(p.calls() as f64)))
        .collect();
    eprintln!(
        "memcg-trace: {:.0}s: {}",
        snap.elapsed.as_secs_f64(),
        per.join(", ")
    );
}

/// `memcg-trace record`.
pub async fn run(args: RecordArgs) -> Result<i32> {
    if let Some(o) = &args.output {
        export::check_writable(o)?;
    }

    let opts = Options {
        verbosity: if args.quiet {
            Verbosity::Quiet
        } else {
            Verbosity::Normal
        },
        dashboard: false,
        least_privilege: true,
    };
    let mut session = match Session::start_or_exit_code(&args.live, opts, |_| Ok(())).await? {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let deadline = tokio::time::sleep(args.duration.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);
    let end = loop {
        let ev = tokio::select! {
            ev = session.next() => ev?,
            _ = &mut deadline, if args.duration.is_some() => break End::Deadline,
        };
        match ev {
            Event::Tick(snap) if !args.quiet => progress(&snap),
            Event::Tick(_) => {}
            Event::WorkloadExited(code) => break End::Exited(code),
            Event::Signal(sig) => break End::Signal(sig),
        }
    };
    let fin = session.finish(end).await?;
    let doc = export::document(&fin.snapshot, &fin.meta);
    print!("{}", table::summary(&doc));
    if let Some(o) = &args.output {
        export::write_atomic(o, &doc)?;
        eprintln!("memcg-trace: wrote {}", o.display());
    }

    fin.report_hdr_log()?;
    Ok(fin.exit_code)
}
