//! The kmem-accounting A/B of `cargo xtask demo --compare` and its VM test: one stock kernel
//! booted `runs` times with its usual command line (A: kmem accounting on) and `runs` times with
//! `cgroup.memory=nokmem` (B: off, the switch the seeds' debate was about), alternating so that
//! drift spreads over both sides; each boot records `memcg-trace record --attach auto` while
//! hackbench runs in a fresh memcg.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Result};

use crate::{
    kernels::Kernel,
    vm::{self, Accel, VmSpec},
};

/// The kernel command-line switch side B adds.
pub const NOKMEM: &str = "cgroup.memory=nokmem";

/// The recordings of each side, and their directory.
pub struct KmemRuns {
    /// Side A (kmem accounting on): `kmem-N.json`.
    pub a: Vec<PathBuf>,
    /// Side B (`cgroup.memory=nokmem`): `nokmem-N.json`.
    pub b: Vec<PathBuf>,
}

/// Boots `kernel` 2 x `runs` times as above; recordings go to `out`. A boot that fails is an
/// error with the tail of its console.
pub fn kmem_runs(
    kernel: &Kernel,
    bins: &[PathBuf],
    runs: usize,
    hackbench: &str,
    accel: Accel,
    out: &Path,
) -> Result<KmemRuns> {
    fs::create_dir_all(out)?;
    let mut nokmem = kernel.clone();
    // One process, a handful of boots: the leaked string lives as long as it must.
    nokmem.spec.cmdline = Box::leak(
        format!("{} {NOKMEM}", kernel.spec.cmdline)
            .trim()
            .to_string()
            .into_boxed_str(),
    );
    let script = format!(
        "cat /proc/cmdline >/out/cmdline\n\
         memcg-trace record --attach auto -q -o /out/run.json -- hackbench {hackbench} >/out/run.txt 2>/out/run.err \
         || {{ cat /out/run.err; exit 1; }}\n"
    );
    let mut runs_out = KmemRuns {
        a: Vec::new(),
        b: Vec::new(),
    };
    for i in 1..=runs {
        for (side, k) in [("kmem", kernel), ("nokmem", &nokmem)] {
            eprintln!(
                "compare: {side} run {i}/{runs}: {} ({})",
                k.release, k.spec.cmdline
            );
            let r = vm::run(
                k,
                &VmSpec {
                    name: format!("{}-compare", kernel.spec.short),
                    script: script.clone(),
                    bins: bins.to_vec(),
                    accel,
                    timeout: Duration::from_secs(900),
                    echo: false,
                    modules: Vec::new(),
                    mem_mb: 0,
                    cpus: 0,
                    icount: None,
                    packages: Vec::new(),
                    files: Vec::new(),
                    nmis: None,
                },
            )?;
            if !r.success {
                bail!(
                    "{side} run {i}: {}\n--- last console lines ({}) ---\n{}",
                    r.failure.clone().unwrap_or_default(),
                    r.log.display(),
                    r.tail(40)
                );
            }
            let cmdline = fs::read_to_string(r.out_dir.join("cmdline"))?;
            if cmdline.contains(NOKMEM) != (side == "nokmem") {
                bail!("{side} run {i} booted with the wrong command line: {cmdline}");
            }
            let dst = out.join(format!("{side}-{i}.json"));
            fs::copy(r.out_dir.join("run.json"), &dst)?;
            if side == "kmem" {
                runs_out.a.push(dst);
            } else {
                runs_out.b.push(dst);
            }
        }
    }
    Ok(runs_out)
}
