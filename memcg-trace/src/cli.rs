//! The command line: `Cli`, `Command` and dispatch to the commands, one tokio runtime for all,
//! and one-line errors with a non-zero exit. Imports the commands; nothing imports it.

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::cmd::{bench, plot, probes, programs, record, report, selftest, serve, top};

/// Live eBPF tracer of the memcg charging hot paths: how long obj_cgroup_charge,
/// mod_memcg_state and the rstat update take, how often, and in which context.
#[derive(Parser, Debug)]
#[command(name = "memcg-trace", version = version(), about, long_about = None)]
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
    Top(top::TopArgs),
    /// The dashboard on a recording, read-only.
    ///
    /// Example: memcg-trace view run.json
    View(top::ViewArgs),
    /// Trace the whole system (and a workload, if given), print a summary table, write JSON.
    ///
    /// Example: memcg-trace record -o run.json -- hackbench -g 2 -l 100
    Record(record::RecordArgs),
    /// Trace like `record` until stopped, and serve the figures to Prometheus on /metrics.
    ///
    /// Example: memcg-trace serve --listen 127.0.0.1:9464
    Serve(serve::ServeArgs),
    /// Show what each probe resolves to on this kernel and which backend attaches it, and why.
    ///
    /// Example: memcg-trace probes --attach kprobe
    Probes(crate::session::ProbeSel),
    /// Every BPF program loaded on this machine (by any tool): runs, time per run, size and
    /// helper calls, to compare tracers on one kernel.
    ///
    /// Example: sysctl kernel.bpf_stats_enabled=1; memcg-trace programs
    Programs(programs::ProgramsArgs),
    /// Print the summary table of a recording.
    ///
    /// Example: memcg-trace report run.json
    Report(report::ReportArgs),
    /// Compare recordings (A/B), per probe and context: calls/s, p50, p99, mean, change; with
    /// several runs per side, each figure's spread and whether the change is beyond the noise.
    ///
    /// Examples: memcg-trace diff base.json patched.json;
    /// memcg-trace diff --format markdown a1.json a2.json a3.json -- b1.json b2.json b3.json
    Diff(report::DiffArgs),
    /// Draw recordings: per probe and row, the percentile spectrum and the histogram, several
    /// recordings overlaid; calls/s over time from an interval log.
    ///
    /// Examples: memcg-trace plot run.json -o plots;
    /// memcg-trace plot base.json patched.json --probe charge; memcg-trace plot --hdr-log run.hlog
    Plot(plot::PlotArgs),
    /// Run a built-in workload (what `--workload NAME[:N]` runs): open-loop (open of a
    /// nonexistent path, N times: a struct file charged and uncharged each), kmalloc (pipe2
    /// and two closes, N times: kmalloc(GFP_KERNEL_ACCOUNT) and accounted slab objects) or
    /// sockets (N messages of 64 KiB over loopback TCP to 4 clients, each in a memcg of its
    /// own: socket memory charged in softirq).
    ///
    /// Examples: memcg-trace record -p charge,slab_free --workload open-loop:100000;
    /// memcg-trace record -p try_charge,stat --by-memcg --workload sockets:20000
    Workload {
        /// open-loop, kmalloc or sockets.
        name: String,
        /// How many operations (default: 100000 opens, 20000 pipes, 100000 messages).
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
    /// Run the in-kernel histogram and context code on fixed inputs (BPF_PROG_TEST_RUN) and
    /// compare with the userspace bucket layout.
    #[command(hide = true)]
    Selftest,
    /// What tracing costs on this kernel, side by side (driven by `cargo xtask bench`).
    #[command(hide = true)]
    Bench(bench::BenchArgs),
    /// Write the man pages (DIR/man/man1/) and the shell completions for bash, zsh and fish
    /// (DIR/completions/) made from this command line (driven by `cargo xtask dist`).
    #[command(hide = true)]
    Generate {
        /// Where to write them.
        dir: std::path::PathBuf,
    },
}

/// `--version`: the version, the commit built from, and the eBPF objects carried.
fn version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        use crate::tracer::Object;
        let objects = if Object::Full.bytes().is_empty() {
            "none (built with AYA_BUILD_SKIP)".to_string()
        } else {
            "full (kernels from 5.19) and legacy (before 5.19)".to_string()
        };
        format!(
            "{} (commit {}; eBPF objects: {objects})",
            env!("CARGO_PKG_VERSION"),
            env!("MEMCG_TRACE_COMMIT")
        )
    })
}

/// Writes the man pages and completions of `generate`.
fn generate(dir: &std::path::Path) -> Result<i32> {
    use anyhow::Context as _;
    use clap::CommandFactory as _;
    let man = dir.join("man/man1");
    let completions = dir.join("completions");
    for d in [&man, &completions] {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }

    let cmd = Cli::command();

    // One page for the command and one per visible subcommand (`memcg-trace-record.1`).
    let mut pages = vec![(String::from("memcg-trace"), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        // clap keeps names as &'static str; this command runs once and exits.
        let name: &'static str =
            Box::leak(format!("memcg-trace-{}", sub.get_name()).into_boxed_str());
        pages.push((name.to_string(), sub.clone().name(name)));
    }

    for (name, c) in pages {
        let mut out = Vec::new();
        clap_mangen::Man::new(c)
            .render(&mut out)
            .with_context(|| format!("render the man page of {name}"))?;
        crate::export::write_file_atomic(&man.join(format!("{name}.1")), &out)?;
    }

    for (shell, file) in [
        (clap_complete::Shell::Bash, "memcg-trace.bash"),
        (clap_complete::Shell::Zsh, "_memcg-trace"),
        (clap_complete::Shell::Fish, "memcg-trace.fish"),
    ] {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "memcg-trace", &mut out);
        crate::export::write_file_atomic(&completions.join(file), &out)?;
    }

    println!(
        "memcg-trace: man pages in {}, completions in {}",
        man.display(),
        completions.display()
    );
    Ok(0)
}

async fn dispatch(command: Command) -> Result<i32> {
    match command {
        Command::Top(a) => top::top(a).await,
        Command::View(a) => top::view(a).await,
        Command::Record(a) => record::run(a).await,
        Command::Serve(a) => serve::run(a).await,
        Command::Probes(s) => probes::run(s),
        Command::Programs(a) => programs::run(a),
        Command::Report(a) => report::report(a),
        Command::Diff(a) => report::diff(a),
        Command::Plot(a) => plot::run(a),
        Command::Selftest => selftest::run(),
        Command::Bench(a) => bench::run(a).await,
        Command::Generate { dir } => generate(&dir),
        Command::Workload { name, count } => {
            // (Not a live command: main has unblocked the stop signals for it.)
            let times = match count {
                Some(n) => n,
                None => crate::workload::BUILTIN
                    .iter()
                    .find(|b| b.0 == name)
                    .map(|b| b.2)
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "unknown built-in workload {name:?}; known: {}",
                            crate::workload::builtin_names()
                        )
                    })?,
            };
            crate::workload::run_builtin(&name, times).map(|_| 0)
        }
    }
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    // First of all: a stop signal from here until a session listens waits in the kernel.
    crate::session::block_stop_signals(true);
    crate::tracer::large_allocations_mapped();

    // A bug's panic: one line saying so, then the unwinding drops what the session holds
    // (workload and memcg, programs and links; the dashboard's terminal is restored first by
    // ratatui's own hook, which calls this one). The process exits 101.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "memcg-trace: internal error (a bug, please report it): {}{at}; cleaning up",
            msg.replace('\n', " ")
        );
    }));
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };

    // A bad override of the eBPF object is refused before anything is loaded.
    if let Err(e) = crate::tracer::Object::chosen() {
        eprintln!("memcg-trace: error: {e}");
        return 2;
    }

    // No subcommand: the dashboard with its own defaults.
    let command = cli
        .command
        .unwrap_or_else(|| Command::Top(top::TopArgs::default()));
    // Only the live commands listen to the stop signals (their session unblocks them); the
    // others keep the default actions.
    if !matches!(
        command,
        Command::Top(_) | Command::Record(_) | Command::Serve(_) | Command::Bench(_)
    ) {
        crate::session::block_stop_signals(false);
    }

    let r = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(dispatch(command)));
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
