//! `memcg-trace plot`: pictures of one or more recordings (overlaid), and of an interval log.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::{
    export,
    plot::{self, ImageFormat},
};

/// `plot` options.
#[derive(clap::Args, Debug)]
pub struct PlotArgs {
    /// Recordings written by `record` (several: overlaid, one colour each).
    pub files: Vec<PathBuf>,
    /// Directory the images go to (one per probe and row: `charge-task.svg`, ...).
    #[arg(long, short = 'o', default_value = "plots")]
    pub out: PathBuf,
    /// svg or png.
    #[arg(long, value_enum, default_value = "svg")]
    pub format: ImageFormat,
    /// Only this probe.
    #[arg(long, short = 'p')]
    pub probe: Option<String>,
    /// Also plot calls/s over time from this interval log (`record --hdr-log`): `rate.svg`.
    #[arg(long, value_name = "FILE")]
    pub hdr_log: Option<PathBuf>,
}

/// `memcg-trace plot`.
pub fn run(args: PlotArgs) -> Result<i32> {
    if args.files.is_empty() && args.hdr_log.is_none() {
        bail!("plot needs recordings (FILE.json ...) or --hdr-log FILE");
    }

    let mut written = Vec::new();
    if !args.files.is_empty() {
        let docs = args
            .files
            .iter()
            .map(|f| export::read(f).map(|d| (f.clone(), d)))
            .collect::<Result<Vec<_>>>()?;
        written.extend(plot::plot_recordings(
            &docs,
            &args.out,
            args.format,
            args.probe.as_deref(),
        )?);
    }

    if let Some(log) = &args.hdr_log {
        std::fs::create_dir_all(&args.out)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", args.out.display()))?;
        let path = args.out.join(format!(
            "rate.{}",
            if args.format == ImageFormat::Png {
                "png"
            } else {
                "svg"
            }
        ));
        plot::plot_rates(log, &path, args.format)?;
        written.push(path);
    }

    for p in &written {
        println!("{}", p.display());
    }
    Ok(0)
}
