//! `memcg-trace top` (the default command) and `memcg-trace view`: the dashboard, on a live
//! session or on a recording.

use std::path::PathBuf;

use anyhow::Result;

use crate::{
    export, kernel,
    session::{self, LiveArgs, Options, Session, Verbosity},
    tui::{
        self,
        app::{App, Compare, Header, Mode},
    },
};

/// `top` options.
#[derive(clap::Args, Debug, Default)]
pub struct TopArgs {
    #[command(flatten)]
    pub live: LiveArgs,
    /// Leave the dashboard when the workload exits (default: stay on its final figures).
    #[arg(long)]
    pub exit: bool,
}

/// `view` options.
#[derive(clap::Args, Debug)]
pub struct ViewArgs {
    /// A JSON file written by `record` or saved from the dashboard; with a second file (B), the
    /// rows of both and the change per figure, as `diff` computes it.
    #[arg(num_args = 1..=2, required = true)]
    pub files: Vec<PathBuf>,
}

/// `memcg-trace` / `memcg-trace top`: the live dashboard.
pub async fn top(args: TopArgs) -> Result<i32> {
    tui::require_tty()?;
    let opts = Options {
        verbosity: Verbosity::Quiet,
        dashboard: true,
        least_privilege: true,
    };
    let mut sess = match Session::start(&args.live, opts, |_| Ok(())).await {
        Ok(s) => s,
        Err(e) => {
            return match session::interrupted_exit_code(&e) {
                Some(code) => Ok(code),
                None => Err(e),
            }
        }
    };
    let release = kernel::release();
    let config = kernel::config(&release);
    let mut app = App::new(
        Header {
            preemption: kernel::preemption_model(config.as_ref()),
            kernel: release,
            recording: None,
            floors: sess.floors().to_vec(),
            calibration: sess.calibration().to_vec(),
        },
        args.live.tick,
    );
    let end = tui::live(&mut app, &mut sess, args.exit).await;

    // The session ends (programs detached, memcg removed) whatever the dashboard returned.
    let fin = sess
        .finish(end.as_ref().copied().unwrap_or(session::End::Quit))
        .await?;
    end?;
    fin.report_hdr_log()?;
    Ok(fin.exit_code)
}

/// `memcg-trace view FILE.json`: the dashboard on a recording, read-only.
pub async fn view(args: ViewArgs) -> Result<i32> {
    let doc = export::read(&args.files[0])?;
    let b = args.files.get(1).map(|f| export::read(f)).transpose()?;
    tui::require_tty()?;
    let mut app = recording_app(&doc, &args.files[0].display().to_string());
    if let (Some(b), Some(name)) = (b, args.files.get(1)) {
        compare_with(&mut app, &b, &name.display().to_string());
    }

    tui::view(&mut app).await?;
    Ok(0)
}

/// Makes `app` an A/B view with `b` as B.
pub fn compare_with(app: &mut App, b: &export::Document, name: &str) {
    let rows = recording_app(b, name).rows();
    app.compare = Some(Compare {
        name: name.to_string(),
        rows,
    });
}

/// The dashboard's state for a recording (`name`: what the header calls it).
pub fn recording_app(doc: &export::Document, name: &str) -> App {
    let mut app = App::new(
        Header {
            kernel: doc.meta.kernel_release.clone(),
            preemption: kernel::preemption_words(&doc.meta.preemption_model),
            recording: Some(name.to_string()),
            floors: doc.meta.floors.clone(),
            calibration: doc.meta.calibration.clone(),
        },
        std::time::Duration::from_nanos(doc.meta.tracer.tick_ns.max(1)),
    );
    app.mode = Mode::Cumulative;
    app.workload = doc.meta.workload.as_ref().map(|w| {
        let oom = crate::export::oom_kill_words(w.oom_kills)
            .map(|w| format!(" ({w})"))
            .unwrap_or_default();
        format!(
            "workload: {} exited {}{oom} in {}",
            w.argv.join(" "),
            w.exit_status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "?".into()),
            w.cgroup
        )
    });
    app.set_workload_cpu(doc.meta.workload.as_ref().and_then(|w| w.cpu_ns));

    // A recording made without the context split names its one context `all` here too.
    let snap = export::to_snapshot(doc);
    let split = !snap.no_context_split;
    app.on_snapshot(snap);
    if let Some(h) = &doc.history {
        // The run tick by tick: the rate and p99 panes, stepped through with the arrow keys.
        app.times_ms = h.t_ms.clone();
        for s in &h.rows {
            let context = match crate::kernel::ctx_index(&s.context) {
                Some(i) => crate::kernel::ctx_name(i, split),
                None if s.context == "workload" => "workload",
                None => continue,
            };
            let key = (s.probe.clone(), context);
            app.history.insert(
                key.clone(),
                (0..h.t_ms.len())
                    .map(|i| s.rate(h, i).unwrap_or(0.0).round() as u64)
                    .collect(),
            );
            app.p99_history
                .insert(key, s.p99_ns.iter().copied().collect());
        }
    }
    app
}
