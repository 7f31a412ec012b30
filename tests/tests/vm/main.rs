//! The VM kernel matrix: the real binary inside Debian's stock kernels under qemu, recording
//! the default probes with fentry and with kprobe while hackbench runs in a fresh memcg.
//! Each test boots one kernel; `MEMCG_TRACE_KERNELS` (default: the whole matrix) picks which run
//! and the others print a skip.
//!
//! Here: picking and booting a kernel. The tests, by area: [`matrix`] (every kernel once),
//! [`workloads`] (built-in workloads, a kernel the user built, `serve`, OOM, reclaim),
//! [`oracle`] (the kernel's own durations and counts), [`compare`] (A/B of runs and kernels),
//! [`attribution`] (call sites, memcgs, NMIs), [`profile`] (memcg-trace's cost, by perf).

use std::{collections::BTreeSet, fmt::Write as _, fs, path::Path, time::Duration};

use memcg_trace_tests::callgraph::Link;

use memcg_trace_tests::*;
use xtask::{
    kernels,
    vm::{self, Accel, VmSpec},
};

mod attribution;
mod compare;
mod matrix;
mod oracle;
mod profile;
mod quirks;
mod workloads;

use quirks::{quirks, Quirks};

const DEFAULT_PROBES: [&str; 3] = ["charge", "stat", "rstat"];

/// New keys of the map-update workload (vm_matrix on 6.1 and 6.12): each is a charge made
/// where no kprobe program may run.
const UPDATES: u64 = 2000;

/// Whether `names` are exactly one program of each family in `want` (entry first), in
/// whatever probe slot: `fentry_3` is of `fentry_`, `fentry_patched_3` is not.
fn programs_are(names: &[&str], want: [&str; 2]) -> bool {
    names.len() == 2
        && names.iter().zip(want).all(|(n, w)| {
            n.strip_prefix(w)
                .is_some_and(|slot| !slot.is_empty() && slot.bytes().all(|b| b.is_ascii_digit()))
        })
}

fn accel() -> Accel {
    match std::env::var("MEMCG_TRACE_ACCEL").as_deref() {
        Ok("kvm") => Accel::Kvm,
        _ => Accel::Tcg,
    }
}

/// The kernel `short` for a test that boots one kernel, fetched; None (with the skip recorded)
/// when it is not selected or this is not root.
fn one_kernel(name: &str, short: &str) -> Option<kernels::Kernel> {
    let wanted =
        std::env::var("MEMCG_TRACE_KERNELS").unwrap_or_else(|_| kernels::test_matrix().join(","));
    if !wanted.split(',').any(|k| k.trim() == short) {
        skip(
            name,
            &format!("kernel {short} not in MEMCG_TRACE_KERNELS={wanted}"),
        );
        return None;
    }

    if !is_root() {
        skip(name, "needs root (apt-get download of the kernel)");
        return None;
    }

    let spec = kernels::select(short).expect("known kernel")[0];
    Some(kernels::fetch(spec).unwrap_or_else(|e| panic!("fetch kernel {short}: {e:#}")))
}

/// Boots `kernel` with `script`, memcg-trace and hackbench in the initramfs (and `modules`),
/// and fails with the tail of the guest console unless the script succeeded.
fn boot(
    kernel: &kernels::Kernel,
    name: String,
    script: String,
    modules: Vec<std::path::PathBuf>,
) -> vm::VmResult {
    boot_on(kernel, name, script, modules, Vec::new(), 0, None)
}

/// `boot` with more host programs (and their libraries) in the initramfs, on `cpus` vCPUs (0:
/// the default) and, under TCG, with `icount`: the guest clock counts instructions
/// (`-icount shift=N`).
fn boot_on(
    kernel: &kernels::Kernel,
    name: String,
    script: String,
    modules: Vec<std::path::PathBuf>,
    extra_bins: Vec<std::path::PathBuf>,
    cpus: u32,
    icount: Option<u32>,
) -> vm::VmResult {
    boot_with_nmis(
        kernel, name, script, modules, extra_bins, cpus, icount, None,
    )
}

/// [`boot_on`], with an NMI injected every `nmis` (x86_64).
#[allow(clippy::too_many_arguments)]
fn boot_with_nmis(
    kernel: &kernels::Kernel,
    name: String,
    script: String,
    modules: Vec<std::path::PathBuf>,
    extra_bins: Vec<std::path::PathBuf>,
    cpus: u32,
    icount: Option<u32>,
    nmis: Option<Duration>,
) -> vm::VmResult {
    let result = vm::run(
        kernel,
        &VmSpec {
            name,
            script,
            bins: [
                bin(),
                memcg_trace::workload::hackbench().expect("hackbench (rt-tests)"),
            ]
            .into_iter()
            .chain(extra_bins)
            .collect(),
            accel: accel(),
            timeout: Duration::from_secs(900),
            echo: false,
            modules,
            mem_mb: 0,
            cpus,
            icount: icount.filter(|_| accel() == Accel::Tcg),
            packages: Vec::new(),
            files: Vec::new(),
            nmis,
        },
    )
    .expect("start the VM");
    assert!(
        result.success,
        "{}: {}\n--- last console lines ({}) ---\n{}",
        kernel.release,
        result.failure.as_deref().unwrap_or(""),
        result.log.display(),
        result.tail(60)
    );
    result
}
