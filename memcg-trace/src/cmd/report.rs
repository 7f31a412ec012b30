//! `memcg-trace report` and `memcg-trace diff`: the tables of recordings.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::{compare, export, table};

/// `report` options.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// A JSON file written by `record`.
    pub file: PathBuf,
}

/// `diff` options.
#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The recordings of side A (the baseline). Without `--`: exactly two files, A then B.
    #[arg(required = true, num_args = 1..)]
    pub a: Vec<PathBuf>,
    /// After `--`: the recordings of side B. Several runs per side give each figure's mean,
    /// spread and whether the change is beyond the noise (Welch's t-test).
    #[arg(last = true)]
    pub b: Vec<PathBuf>,
    /// Output: a table, a markdown table (for a mail), or JSON.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Significance level under which a change is called beyond the noise.
    #[arg(long, default_value_t = compare::ALPHA)]
    pub alpha: f64,
}

/// How `diff` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Text table.
    Table,
    /// Markdown table.
    Markdown,
    /// JSON.
    Json,
}

/// `memcg-trace report FILE`.
pub fn report(args: ReportArgs) -> Result<i32> {
    let doc = export::read(&args.file)?;
    print!("{}", table::summary(&doc));
    Ok(0)
}

/// `memcg-trace diff A B`, or `diff A1 A2 ... -- B1 B2 ...`.
pub fn diff(args: DiffArgs) -> Result<i32> {
    if !(args.alpha > 0.0 && args.alpha < 1.0) {
        bail!("--alpha {} is not a level between 0 and 1", args.alpha);
    }

    let (a, b) = if args.b.is_empty() {
        if args.a.len() != 2 {
            bail!(
                "diff compares two sides: `diff A.json B.json`, or several runs each: `diff A1.json A2.json ... -- B1.json B2.json ...` ({} files given, no --)",
                args.a.len()
            );
        }

        if args.format == Format::Table {
            let a = export::read(&args.a[0])?;
            let b = export::read(&args.a[1])?;
            print!("{}", table::diff(&a, &b));
            return Ok(0);
        }
        (vec![args.a[0].clone()], vec![args.a[1].clone()])
    } else {
        (args.a.clone(), args.b.clone())
    };
    let read = |files: &[PathBuf]| {
        files
            .iter()
            .map(|f| export::read(f))
            .collect::<Result<Vec<_>>>()
    };
    let (da, db) = (read(&a)?, read(&b)?);
    let names = |files: &[PathBuf]| files.iter().map(|f| f.display().to_string()).collect();
    let c = compare::compare(&da, &db, names(&a), names(&b), args.alpha);
    match args.format {
        Format::Table => print!("{}", compare::table(&c)),
        Format::Markdown => print!("{}", compare::markdown(&c)),
        Format::Json => println!("{}", serde_json::to_string_pretty(&c)?),
    }
    Ok(0)
}
