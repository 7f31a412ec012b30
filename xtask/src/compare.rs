//! The A/B runs of `cargo xtask demo --compare` and their VM tests: two sides booted
//! alternately, `runs` times each, so that drift spreads over both; each boot records
//! `memcg-trace record --attach auto` while hackbench runs in a fresh memcg. The sides are one
//! stock kernel with its usual command line (A: kmem accounting on) and with
//! `cgroup.memory=nokmem` (B: off, the switch the seeds' debate was about), or two kernels
//! (`--a`, `--b`: what changed between them).

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Result};

use crate::{
    kernels::Kernel,
    vm::{self, Accel, VmSpec},
};

/// The kernel command-line switch side B adds.
pub const NOKMEM: &str = "cgroup.memory=nokmem";

/// The recordings of each side.
pub struct KmemRuns {
    /// Side A: `<label A>-N.json`.
    pub a: Vec<PathBuf>,
    /// Side B.
    pub b: Vec<PathBuf>,
}

/// Boots `kernel` 2 x `runs` times as above (A: kmem accounting on, `kmem-N.json`; B:
/// `cgroup.memory=nokmem`, `nokmem-N.json`); recordings go to `out`. A boot that fails is an
/// error with the tail of its console.
pub fn kmem_runs(
    kernel: &Kernel,
    bins: &[PathBuf],
    runs: usize,
    hackbench: &str,
    accel: Accel,
    out: &Path,
) -> Result<KmemRuns> {
    let mut nokmem = kernel.clone();

    // One process, a handful of boots: the leaked string lives as long as it must.
    nokmem.spec.cmdline = Box::leak(
        format!("{} {NOKMEM}", kernel.spec.cmdline)
            .trim()
            .to_string()
            .into_boxed_str(),
    );
    ab_runs(
        [("kmem", kernel), ("nokmem", &nokmem)],
        bins,
        runs,
        hackbench,
        accel,
        out,
    )
}

/// Boots the two sides alternately, `runs` times each, each boot recording `memcg-trace
/// record --attach auto` while hackbench runs in a fresh memcg; the recordings go to `out` as
/// `<label>-N.json`. Each boot is checked to be the side's kernel (its release, where known)
/// with the side's command line. The boots work in `target/vm/<out's name>-<label>`, so that
/// comparisons with different `out`s can run at once. A boot that fails is an error with the
/// tail of its console.
pub fn ab_runs(
    sides: [(&str, &Kernel); 2],
    bins: &[PathBuf],
    runs: usize,
    hackbench: &str,
    accel: Accel,
    out: &Path,
) -> Result<KmemRuns> {
    fs::create_dir_all(out)?;
    let script = format!(
        "cat /proc/cmdline >/out/cmdline\n\
         uname -r >/out/release\n\
         memcg-trace record --attach auto -q -o /out/run.json -- hackbench {hackbench} >/out/run.txt 2>/out/run.err \
         || {{ cat /out/run.err; exit 1; }}\n"
    );
    let mut runs_out = KmemRuns {
        a: Vec::new(),
        b: Vec::new(),
    };
    for i in 1..=runs {
        for (n, (side, k)) in sides.iter().enumerate() {
            eprintln!(
                "compare: {side} run {i}/{runs}: {} ({})",
                k.release, k.spec.cmdline
            );
            let result = vm::run(
                k,
                &VmSpec::plain(
                    format!(
                        "{}-{side}",
                        out.file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_else(|| "compare".into())
                    ),
                    script.clone(),
                    bins.to_vec(),
                    accel,
                ),
            )?;
            if !result.success {
                bail!(
                    "{side} run {i}: {}\n--- last console lines ({}) ---\n{}",
                    result.failure.clone().unwrap_or_default(),
                    result.log.display(),
                    result.tail(40)
                );
            }

            check_booted(&result.out_dir, &sides, k, side, i)?;
            let dst = out.join(format!("{side}-{i}.json"));
            fs::copy(result.out_dir.join("run.json"), &dst)?;
            if n == 0 {
                runs_out.a.push(dst);
            } else {
                runs_out.b.push(dst);
            }
        }
    }
    Ok(runs_out)
}

/// That boot `i` of `side` (kernel `k`, one of `sides`), whose guest wrote its command line
/// and release to `out_dir`, booted `k` with its command line: every word of it, and none of
/// the other side's own words.
fn check_booted(
    out_dir: &Path,
    sides: &[(&str, &Kernel); 2],
    k: &Kernel,
    side: &str,
    i: usize,
) -> Result<()> {
    let cmdline = fs::read_to_string(out_dir.join("cmdline"))?;
    let others: Vec<&str> = sides
        .iter()
        .flat_map(|(_, o)| o.spec.cmdline.split_whitespace())
        .filter(|w| !k.spec.cmdline.split_whitespace().any(|x| x == *w))
        .collect();
    let words: Vec<&str> = cmdline.split_whitespace().collect();
    if !k
        .spec
        .cmdline
        .split_whitespace()
        .all(|w| words.contains(&w))
        || others.iter().any(|w| words.contains(w))
    {
        bail!("{side} run {i} booted with the wrong command line: {cmdline}");
    }

    let release = fs::read_to_string(out_dir.join("release"))?;

    // An image whose release could not be read is named `own`.
    if k.release != "own" && release.trim() != k.release {
        bail!(
            "{side} run {i} booted {} instead of {}",
            release.trim(),
            k.release
        );
    }
    Ok(())
}
