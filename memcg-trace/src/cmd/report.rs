//! `memcg-trace report` and `memcg-trace diff`: the tables of recordings.

use std::path::PathBuf;

use anyhow::Result;

use crate::{export, table};

/// `report` options.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// A JSON file written by `record`.
    pub file: PathBuf,
}

/// `diff` options.
#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The baseline recording.
    pub a: PathBuf,
    /// The recording to compare with it.
    pub b: PathBuf,
}

/// `memcg-trace report FILE`.
pub fn report(args: ReportArgs) -> Result<i32> {
    let doc = export::read(&args.file)?;
    print!("{}", table::summary(&doc));
    Ok(0)
}

/// `memcg-trace diff A B`.
pub fn diff(args: DiffArgs) -> Result<i32> {
    let a = export::read(&args.a)?;
    let b = export::read(&args.b)?;
    print!("{}", table::diff(&a, &b));
    Ok(0)
}
