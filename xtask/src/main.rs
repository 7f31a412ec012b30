//! `cargo xtask`: setup, build, VM runs, the demo and the full test run.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};
use xtask::{
    build_release, build_release_for,
    kernels::{self, Arch},
    llvm_path, record_script, run, setup,
    vm::{self, Accel, VmSpec},
    workspace_root,
};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "memcg-trace developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what is missing: apt packages, rust-src, bpf-linker.
    Setup,
    /// Build the release binary with its eBPF programs.
    Build {
        /// The architecture to build for: x86_64 (this machine's) or arm64 (cross-compiled).
        #[arg(long, alias = "target", value_enum, default_value = "x86_64")]
        arch: Arch,
    },
    /// Boot stock kernels under qemu and run a guest script (default: record with fentry and
    /// kprobe alongside hackbench).
    Vm {
        /// 5.10, 6.1, 6.12, 6.18, 7.3, 6.1-rt, 6.12-rt (arm64: 6.12, 7.3), a comma list, all (the matrix)
        /// or every (all known).
        #[arg(long, default_value = "all")]
        kernel: String,
        /// Only this architecture's kernels (x86_64 or arm64; default: as named, `all` both).
        #[arg(long, value_enum)]
        arch: Option<Arch>,
        /// tcg (software emulation, works here) or kvm.
        #[arg(long, value_enum, default_value = "tcg")]
        accel: Accel,
        /// Guest script to run instead of the default.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Seconds before a boot is declared hung.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
        /// More host programs for the guest (with their libraries), e.g. /usr/bin/bpftrace.
        #[arg(long)]
        bin: Vec<PathBuf>,
        /// Guest memory, MiB.
        #[arg(long, default_value_t = 1024)]
        mem: u32,
        /// TCG: the guest clock counts instructions, 2^N ns each (`-icount shift=N`), so that
        /// guest times do not depend on the host's load (for experiments: QEMU 7.2 corrupted a
        /// guest's flags once in about ten such boots).
        #[arg(long, value_name = "N")]
        icount: Option<u32>,
        /// Virtual CPUs (under TCG they take turns on one host thread, and one waiting for
        /// its turn sees time pass).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
        cpus: u32,
        /// Debian packages of the kernel's release unpacked into the guest, e.g. bpftool.
        #[arg(long)]
        package: Vec<String>,
        #[command(flatten)]
        own: OwnKernel,
    },
    /// The main job: memcg-trace alongside hackbench on a stock kernel in a VM (or the host).
    Demo {
        /// Trace this machine's kernel instead (tracepoint backend where function tracing is
        /// refused).
        #[arg(long, conflicts_with = "kernel_image")]
        host: bool,
        /// Kernel for the VM demo.
        #[arg(long, default_value = "6.12")]
        kernel: String,
        /// The guest's architecture: x86_64 (the default) or arm64 (emulated). With
        /// --kernel-image, the image's (checked against this when given).
        #[arg(long, value_enum)]
        arch: Option<Arch>,
        /// tcg or kvm.
        #[arg(long, value_enum, default_value = "tcg")]
        accel: Accel,
        /// hackbench arguments.
        #[arg(long, default_value = "-g 2 -l 200")]
        hackbench: String,
        /// A/B instead: the kernel booted --runs times as it is and --runs times with
        /// cgroup.memory=nokmem (kmem accounting off), then `memcg-trace diff` of the two sides
        /// (table; markdown and JSON in target/demo/compare/).
        #[arg(long)]
        compare: bool,
        /// Runs per side of --compare.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// --compare one kernel against another instead: side A's kernel, a name as for
        /// --kernel or the path of an image you built (with --b; x86_64).
        #[arg(
            long,
            value_name = "KERNEL",
            requires = "compare",
            requires = "b",
            conflicts_with_all = ["kernel", "arch", "host", "kernel_image"]
        )]
        a: Option<String>,
        /// Side B's kernel (with --a).
        #[arg(long, value_name = "KERNEL", requires = "compare", requires = "a")]
        b: Option<String>,
        #[command(flatten)]
        own: OwnKernel,
    },
    /// What tracing costs: per-call cost against two floors, hackbench slowdown, daemon CPU,
    /// RSS, start-up and detach; host and VM; writes target/bench/report.{json,md} (the smoke run: target/bench-smoke).
    Bench {
        /// Kernel for the VM part.
        #[arg(long, default_value = "6.12")]
        kernel: String,
        /// tcg or kvm.
        #[arg(long, value_enum, default_value = "tcg")]
        accel: Accel,
        /// One pair and tiny workloads: proves the bench runs, measures nothing.
        #[arg(long)]
        smoke: bool,
        /// Parts to run (the others are read from their last run): host, vm, peer, loss.
        #[arg(long, value_enum, value_delimiter = ',')]
        parts: Vec<xtask::bench::Part>,
        #[command(flatten)]
        own: OwnKernel,
    },
    /// The release: for x86_64 and arm64, a tarball (binary, man pages, completions, the
    /// systemd unit, the Prometheus rules) and a Debian package, with SHA256SUMS, in
    /// target/dist/.
    Dist {
        /// Also install each package in VM guests (Debian 11's and 12's userlands on x86_64,
        /// Debian 12's on arm64) and run what it installed there, as `cargo xtask test` does.
        #[arg(long)]
        in_guests: bool,
        /// tcg or kvm, for the guests.
        #[arg(long, value_enum, default_value = "tcg")]
        accel: Accel,
    },
    /// `memcg-trace record` beside a looping hackbench for N minutes: memory, descriptors and
    /// CPU sampled; flat memory and descriptors and a clean end pass.
    Soak {
        #[arg(long, default_value_t = 30.0)]
        minutes: f64,
    },
    /// Fuzz the recording reader (report, diff, view) for N minutes, optimised with overflow
    /// checks; failing inputs go to target/fuzz-failures/.
    Fuzz {
        #[arg(long, default_value_t = 10.0)]
        minutes: f64,
    },
    /// Everything CI runs: setup, fmt, clippy, unit tests, host root tests, the VM matrix.
    Test {
        /// Kernels for the VM matrix.
        #[arg(long, default_value = "all")]
        kernel: String,
        /// The long mode: the signal matrix 20 times over, 10 minutes of fuzzing the reader,
        /// a 30-minute soak (about 50 minutes more).
        #[arg(long)]
        long: bool,
        /// tcg or kvm.
        #[arg(long, value_enum, default_value = "tcg")]
        accel: Accel,
    },
}

fn main() {
    let cli = Cli::parse();

    // Every command builds, boots or tests: the set-up first, for all of them in this one
    // place, so that each works on a machine that has nothing yet (it checks before it
    // installs, and is quick when everything is there).
    if let Err(e) = setup::setup().and_then(|_| run_cmd(cli.cmd)) {
        eprintln!("xtask: error: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}

/// Runs one command, set up.
fn run_cmd(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Setup => Ok(()),
        Cmd::Build { arch } => {
            build_release_for(arch).map(|p| eprintln!("xtask: built {}", p.display()))
        }
        Cmd::Vm {
            kernel,
            arch,
            accel,
            script,
            timeout,
            bin,
            mem,
            icount,
            cpus,
            package,
            own,
        } => own
            .kernels(&kernel, arch)
            .and_then(|ks| vm_cmd(ks, accel, script, timeout, bin, mem, icount, cpus, package)),
        Cmd::Demo {
            host,
            kernel,
            arch,
            accel,
            hackbench,
            compare,
            runs,
            a,
            b,
            own,
        } => {
            let kernels = DemoKernels {
                host,
                kernel,
                arch,
                a,
                b,
                own,
            };
            demo_cmd(kernels, accel, &hackbench, compare.then_some(runs))
        }
        Cmd::Test {
            kernel,
            accel,
            long,
        } => test(&kernel, accel, long),
        Cmd::Dist { in_guests, accel } => dist_cmd(in_guests, accel),
        Cmd::Soak { minutes } => soak_cmd(minutes),
        Cmd::Fuzz { minutes } => fuzz_cmd(minutes),
        Cmd::Bench {
            kernel,
            accel,
            smoke,
            parts,
            own,
        } => bench_cmd(&kernel, accel, smoke, parts, &own),
    }
}

/// The kernels `cargo xtask demo` is asked to boot: the host's own (`--host`), kernels by name
/// (`--kernel`, `--arch`) or image (`own`), or two sides (`--a`, `--b`).
struct DemoKernels {
    host: bool,
    kernel: String,
    arch: Option<Arch>,
    a: Option<String>,
    b: Option<String>,
    own: OwnKernel,
}

/// `cargo xtask demo`: one run on the kernels asked for, or (`compare_runs`: runs per side)
/// the A/B comparison of a kernel with kmem accounting on and off, or of two kernels.
fn demo_cmd(
    k: DemoKernels,
    accel: Accel,
    hackbench: &str,
    compare_runs: Option<usize>,
) -> Result<()> {
    match (compare_runs, &k.a, &k.b) {
        (Some(runs), Some(a), Some(b)) => demo_compare_kernels(a, b, accel, hackbench, runs),
        (Some(_), _, _) if k.own.kernel_image.is_some() => Err(anyhow::anyhow!(
            "--compare with --kernel-image: give your kernel as a side, `--compare --a PATH --b KERNEL`"
        )),
        (Some(runs), _, _) => demo_compare(
            &arch_kernel(&k.kernel, k.arch.unwrap_or(Arch::X86_64)),
            accel,
            hackbench,
            runs,
        ),
        (None, _, _) if k.host => demo(true, Vec::new(), accel, hackbench),
        (None, _, _) => {
            // Debian's kernels: x86_64 unless said; an image: its own, checked against --arch.
            let arch = k
                .arch
                .or(k.own.kernel_image.is_none().then_some(Arch::X86_64));
            k.own
                .kernels(&k.kernel, arch)
                .and_then(|ks| demo(false, ks, accel, hackbench))
        }
    }
}

/// `cargo xtask dist`: the release files listed, checked, and (`in_guests`) installed and run
/// in guests.
fn dist_cmd(in_guests: bool, accel: Accel) -> Result<()> {
    let dist = xtask::dist::dist()?;
    for f in &dist.files {
        println!("{}", f.display());
    }

    println!("{}", dist.dir.join("SHA256SUMS").display());
    check_dist(&dist)?;
    if in_guests {
        xtask::dist::check_in_guests(&dist, accel)?;
    }
    Ok(())
}

/// `cargo xtask soak`: its verdict, and a failure when it did not pass.
fn soak_cmd(minutes: f64) -> Result<()> {
    let bin = build_release()?;
    let s = xtask::soak::soak(&bin, minutes)?;
    println!("{}", s.verdict);
    if !s.ok {
        bail!("soak failed");
    }
    Ok(())
}

/// `cargo xtask fuzz`: the recording reader's fuzz test, optimised with overflow checks, for
/// `minutes`.
fn fuzz_cmd(minutes: f64) -> Result<()> {
    let secs = (minutes * 60.0).round().max(1.0) as u64;
    let st = Command::new("cargo")
        .current_dir(workspace_root())
        .env("PATH", llvm_path())
        .args([
            "test",
            "--locked",
            "--profile",
            "fuzz",
            "-p",
            "memcg-trace-tests",
        ])
        .args(["--test", "read_fuzz", "--", "--nocapture"])
        .env("MEMCG_TRACE_FUZZ_SECS", secs.to_string())
        .status()?;
    if !st.success() {
        bail!("fuzzing found a failure (see above and target/fuzz-failures/)");
    }
    Ok(())
}

/// `cargo xtask bench`: the parts asked for (all by default) at the full size, or the smoke
/// run's.
fn bench_cmd(
    kernel: &str,
    accel: Accel,
    smoke: bool,
    parts: Vec<xtask::bench::Part>,
    own: &OwnKernel,
) -> Result<()> {
    // The VM parts' kernel: an image given resolves (and is checked) before any part runs.
    let own_kernel = match &own.kernel_image {
        // The bench boots x86_64 only.
        Some(_) => own.kernels(kernel, Some(Arch::X86_64))?.pop(),
        None => None,
    };
    let bin = build_release()?;
    let size = if smoke {
        xtask::bench::SMOKE
    } else {
        xtask::bench::FULL
    };
    let parts = if parts.is_empty() {
        xtask::bench::ALL_PARTS.to_vec()
    } else {
        parts
    };
    let report = xtask::bench::bench(&bin, size, kernel, own_kernel.as_ref(), accel, &parts)?;
    eprintln!("bench: report in {}", report.display());
    Ok(())
}

/// `--kernel` as `--arch` names it (`6.12` on arm64: `arm64-6.12`).
fn arch_kernel(kernel: &str, arch: Arch) -> String {
    kernel
        .split(',')
        .map(|k| kernels::arch_name(k.trim(), arch))
        .collect::<Vec<_>>()
        .join(",")
}

/// A kernel the user built, instead of Debian's (`vm`, `demo`).
#[derive(clap::Args, Debug)]
struct OwnKernel {
    /// Boot this kernel image instead (a bzImage or vmlinuz you built; arm64: an Image), with
    /// the same initramfs and tools. Its configuration is checked first: what the VM or
    /// memcg-trace cannot do without refuses it, anything else missing is said, one line an
    /// option. Modules are not loaded.
    #[arg(long, value_name = "PATH", conflicts_with = "kernel")]
    kernel_image: Option<PathBuf>,
    /// Its .config (default: a `.config`, `config` or `config-<release>` beside the image, or
    /// the `.config` of the tree it was built in).
    #[arg(long, value_name = "PATH", requires = "kernel_image")]
    kernel_config: Option<PathBuf>,
}

impl OwnKernel {
    /// The kernels to boot: the image given, or Debian's named by `--kernel` (fetched).
    fn kernels(&self, kernel: &str, arch: Option<Arch>) -> Result<Vec<kernels::Kernel>> {
        let Some(image) = &self.kernel_image else {
            return kernels::select_for(kernel, arch)?
                .into_iter()
                .map(kernels::fetch)
                .collect();
        };
        let (k, missing) = xtask::own::own_kernel(image, self.kernel_config.as_deref(), arch)?;
        eprintln!(
            "xtask: booting your kernel {} ({}, {}; config {})",
            image.display(),
            k.release,
            k.spec.arch.gnu(),
            k.config.display()
        );
        for m in &missing {
            eprintln!("xtask: warning: {m}");
        }
        Ok(vec![k])
    }
}

#[allow(clippy::too_many_arguments)]
fn vm_cmd(
    kernels: Vec<kernels::Kernel>,
    accel: Accel,
    script: Option<PathBuf>,
    timeout: u64,
    extra_bins: Vec<PathBuf>,
    mem: u32,
    icount: Option<u32>,
    cpus: u32,
    packages: Vec<String>,
) -> Result<()> {
    let script = match script {
        Some(p) => fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?,
        None => record_script("auto fentry kprobe", "-g 2 -l 100", true),
    };
    let hackbench = xtask::hackbench()?;
    let (mut passed, mut failed) = (0, 0);
    let mut built = std::collections::HashMap::new();
    for k in kernels {
        let spec = k.spec;
        let bin = match built.get(&spec.arch) {
            Some(b) => PathBuf::clone(b),
            None => {
                let b = build_release_for(spec.arch)?;
                built.insert(spec.arch, b.clone());
                b
            }
        };
        let result = vm::run(
            &k,
            &VmSpec {
                name: format!("{}-vm", spec.short),
                script: script.clone(),
                bins: [bin.clone(), hackbench.clone()]
                    .into_iter()
                    .chain(extra_bins.iter().cloned())
                    .collect(),
                accel,
                timeout: Duration::from_secs(timeout),
                echo: true,
                modules: Vec::new(),
                mem_mb: mem,
                cpus,
                icount,
                packages: packages.clone(),
                files: Vec::new(),
                nmis: None,
            },
        )?;
        if result.success {
            passed += 1;
            eprintln!(
                "xtask: {} ok in {:.1}s; guest files in {}",
                spec.short,
                result.elapsed.as_secs_f64(),
                result.out_dir.display()
            );
        } else {
            failed += 1;
            eprintln!(
                "xtask: {} FAILED: {}\n--- last console lines ({}) ---\n{}",
                spec.short,
                result.failure.clone().unwrap_or_default(),
                result.log.display(),
                result.tail(40)
            );
        }
    }

    println!("vm: {passed} passed, {failed} failed");
    if failed > 0 {
        bail!("{failed} VM run(s) failed");
    }
    Ok(())
}

fn demo(host: bool, kernels: Vec<kernels::Kernel>, accel: Accel, hackbench: &str) -> Result<()> {
    let bin = build_release()?;
    let out = workspace_root().join("target/demo");
    fs::create_dir_all(&out)?;
    if host {
        return demo_host(&bin, &out, hackbench);
    }

    for k in kernels {
        let recordings = demo_vm(&k, &bin, &out, accel, hackbench)?;
        demo_plots(&bin, &out, k.spec.short, &recordings)?;
    }
    Ok(())
}

/// The demo on this machine: one recording of the charge path around hackbench.
fn demo_host(bin: &Path, out: &Path, hackbench: &str) -> Result<()> {
    let json = out.join("host.json");
    let hb = xtask::hackbench()?;
    let status = Command::new(bin)
        .args(["record", "-o"])
        .arg(&json)
        .arg("--")
        .arg(hb)
        .args(hackbench.split_whitespace())
        .status()?;
    if !status.success() {
        bail!("memcg-trace record failed: {status}");
    }

    println!("demo: the recording is at {}", json.display());
    Ok(())
}

/// The demo in a VM booting kernel `k`: the charge path recorded with fentry, then kprobe,
/// each printed, its recording and interval log copied to `out`; the recordings' paths.
fn demo_vm(
    k: &kernels::Kernel,
    bin: &Path,
    out: &Path,
    accel: Accel,
    hackbench: &str,
) -> Result<Vec<PathBuf>> {
    let spec = k.spec;

    // The guest's binary: this machine's, or the one built for the guest's architecture;
    // the plots are drawn here by this machine's.
    let guest_bin = match spec.arch {
        Arch::X86_64 => bin.to_path_buf(),
        a => build_release_for(a)?,
    };
    let whose = if spec.short == "own" {
        "your"
    } else {
        "Debian's"
    };
    eprintln!("demo: booting {whose} {} kernel under qemu ({accel:?}); memcg-trace records the charge path with fentry, then kprobe, while hackbench {hackbench} runs in a fresh memcg", k.release);
    let result = vm::run(
        k,
        &VmSpec::plain(
            format!("{}-demo", spec.short),
            record_script("fentry kprobe", hackbench, false),
            vec![guest_bin, xtask::hackbench()?],
            accel,
        ),
    )?;
    if !result.success {
        bail!(
            "the demo VM failed: {}\n{}",
            result.failure.clone().unwrap_or_default(),
            result.tail(40)
        );
    }

    let mut recordings = Vec::new();
    for b in ["fentry", "kprobe"] {
        let txt = fs::read_to_string(result.out_dir.join(format!("{b}.txt")))?;
        println!("== {} ({}), --attach {b} ==\n{txt}", spec.short, k.release);
        let dst = out.join(format!("{}-{b}.json", spec.short));
        fs::copy(result.out_dir.join(format!("{b}.json")), &dst)?;
        fs::copy(
            result.out_dir.join(format!("{b}.hlog")),
            out.join(format!("{}-{b}.hlog", spec.short)),
        )?;
        println!("demo: the recording is at {}", dst.display());
        recordings.push(dst);
    }
    Ok(recordings)
}

/// Pictures next to a kernel's recordings: fentry and kprobe overlaid, and calls/s over time.
fn demo_plots(bin: &Path, out: &Path, short: &str, recordings: &[PathBuf]) -> Result<()> {
    let plots = out.join(format!("{short}-plots"));
    let _ = fs::remove_dir_all(&plots);
    let status = Command::new(bin)
        .arg("plot")
        .args(recordings)
        .arg("--hdr-log")
        .arg(out.join(format!("{short}-fentry.hlog")))
        .arg("-o")
        .arg(&plots)
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("memcg-trace plot failed: {status}");
    }

    println!("demo: plots are in {}", plots.display());
    Ok(())
}

/// `cargo xtask demo --compare`: kmem accounting on against off, `runs` boots each, and the
/// verdict of `memcg-trace diff` (table on stdout; markdown and JSON next to the recordings).
fn demo_compare(kernel: &str, accel: Accel, hackbench: &str, runs: usize) -> Result<()> {
    if runs == 0 {
        bail!("--runs must be at least 1");
    }

    let bin = build_release()?;
    let spec = kernels::select(kernel)?[0];
    if spec.arch != Arch::X86_64 {
        bail!("--compare boots x86_64 kernels only (it has not been run on arm64)");
    }

    let boot_kernel = kernels::fetch(spec)?;
    let out = workspace_root().join("target/demo/compare");
    let _ = fs::remove_dir_all(&out);
    let recordings = xtask::compare::kmem_runs(
        &boot_kernel,
        &[bin.clone(), xtask::hackbench()?],
        runs,
        hackbench,
        accel,
        &out,
    )?;
    verdict(
        &bin,
        &recordings,
        &out,
        &format!(
            "{} ({}): A = kmem accounting on, B = {}",
            spec.short,
            boot_kernel.release,
            xtask::compare::NOKMEM
        ),
    )
}

/// Prints the verdict of `memcg-trace diff` on the two sides' recordings under `title` (the
/// table), and writes it as markdown and JSON beside them.
fn verdict(bin: &Path, r: &xtask::compare::KmemRuns, out: &Path, title: &str) -> Result<()> {
    let diff = |format: &str| -> Result<String> {
        let output = Command::new(bin)
            .args(["diff", "--format", format])
            .args(&r.a)
            .arg("--")
            .args(&r.b)
            .output()?;
        if !output.status.success() {
            bail!(
                "memcg-trace diff failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    println!("== {title} ==");
    print!("{}", diff("table")?);
    fs::write(out.join("verdict.md"), diff("markdown")?)?;
    fs::write(out.join("verdict.json"), diff("json")?)?;
    println!(
        "demo: recordings, verdict.md and verdict.json are in {}",
        out.display()
    );
    Ok(())
}

/// A side of `demo --compare --a/--b`: a kernel's name, or the path of an image (a `/` in it,
/// or a file by that name).
fn side_kernel(arg: &str) -> Result<kernels::Kernel> {
    if arg.contains('/') || Path::new(arg).is_file() {
        // --compare boots x86_64 only.
        let (k, missing) = xtask::own::own_kernel(Path::new(arg), None, Some(Arch::X86_64))?;
        for m in &missing {
            eprintln!("xtask: warning: {arg}: {m}");
        }

        return Ok(k);
    }

    let spec = kernels::select(arg)?;
    match spec.as_slice() {
        [one] => kernels::fetch(one),
        _ => bail!("--a/--b take one kernel each, not {arg:?}"),
    }
}

/// `cargo xtask demo --compare --a A --b B`: one kernel against another, `runs` boots each,
/// alternately, and the verdict of `memcg-trace diff` per probe (charge, stat, rstat, ...),
/// saying where the function behind a probe changed between them; calls per hackbench message
/// are the figure that survives such a change.
fn demo_compare_kernels(
    a: &str,
    b: &str,
    accel: Accel,
    hackbench: &str,
    runs: usize,
) -> Result<()> {
    if runs == 0 {
        bail!("--runs must be at least 1");
    }

    let (ka, kb) = (side_kernel(a)?, side_kernel(b)?);
    if ka.spec.arch != Arch::X86_64 || kb.spec.arch != Arch::X86_64 {
        bail!("--compare boots x86_64 kernels only (it has not been run on arm64)");
    }

    let bin = build_release_for(ka.spec.arch)?;
    let out = workspace_root().join("target/demo/compare-kernels");
    let _ = fs::remove_dir_all(&out);
    let recordings = xtask::compare::ab_runs(
        [("a", &ka), ("b", &kb)],
        &[bin, xtask::hackbench()?],
        runs,
        hackbench,
        accel,
        &out,
    )?;
    verdict(
        &build_release()?,
        &recordings,
        &out,
        &format!("A = {a} ({}), B = {b} ({})", ka.release, kb.release),
    )
}

/// Runs `cmd`, echoing its output (each test's result line with the time since the start, so
/// that a slow test shows), and returns the (passed, failed) totals of cargo test's `test
/// result:` lines.
fn cargo_test(cmd: &mut Command) -> Result<(u64, u64, bool)> {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .context("run cargo test")?;
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(child.stdout.take().expect("piped"))
        .lines()
        .map_while(Result::ok)
    {
        if line.starts_with("test ") && line.contains(" ... ") {
            println!("[{:>5.0}s] {line}", start.elapsed().as_secs_f64());
        } else {
            println!("{line}");
        }

        if let Some(rest) = line.strip_prefix("test result: ") {
            let num = |key: &str| -> u64 {
                rest.split(';')
                    .find_map(|p| {
                        p.trim().strip_suffix(key).map(|n| {
                            n.trim()
                                .trim_start_matches("ok.")
                                .trim_start_matches("FAILED.")
                                .trim()
                                .parse()
                                .unwrap_or(0)
                        })
                    })
                    .unwrap_or(0)
            };
            passed += num(" passed");
            failed += num(" failed");
        }
    }

    let ok = child.wait()?.success();
    Ok((passed, failed, ok))
}

/// What a step of the test run counted: tests passed and failed, and whether the step itself
/// ran to its end.
#[derive(Clone, Copy, Debug)]
struct Tally {
    passed: u64,
    failed: u64,
    ok: bool,
}

impl Tally {
    /// A step that is one test: passed or failed.
    fn one(ok: bool) -> Tally {
        Tally {
            passed: ok as u64,
            failed: !ok as u64,
            ok,
        }
    }

    /// Says the step's line (`NAME: N passed, N failed`) and returns it.
    fn said(self, name: &str) -> Tally {
        println!("{name}: {} passed, {} failed", self.passed, self.failed);
        self
    }
}

/// `cargo xtask test`: each step in turn, the time since the start before each, then the
/// totals; a step that fails does not keep the later ones from running.
fn test(kernel: &str, accel: Accel, long: bool) -> Result<()> {
    let start = Instant::now();
    let root = workspace_root();

    // Each step with the time since the start: where a run's minutes go.
    let step = |what: &str| eprintln!("test: [{:>5.0}s] {what}", start.elapsed().as_secs_f64());
    static_checks(&root, &step)?;
    let bin = build_release()?;

    // Tests that skip record it here: cargo counts them as passed, we count them as skipped.
    let skip_file = root.join("target/test-skips.tsv");
    let _ = fs::remove_file(&skip_file);
    let selected = kernels::select(kernel)?;

    // The arm64 guests run the cross-compiled binary.
    let bin_arm64 = if selected.iter().any(|k| k.arch == Arch::Arm64) {
        Some(build_release_for(Arch::Arm64)?)
    } else {
        None
    };
    let tests = TestEnv {
        root: &root,
        bin: &bin,
        bin_arm64: bin_arm64.as_deref(),
        skip_file: &skip_file,
    };
    step("unit and host tests");
    let unit = tests.unit_and_host(long)?;
    let kernels_env = selected
        .iter()
        .map(|k| k.short)
        .collect::<Vec<_>>()
        .join(",");
    step(&format!("VM matrix ({kernels_env}, {accel:?})"));

    // Every kernel's default run leaves the long mode's own VM tests out; a kernel named is run
    // whole.
    let vm = tests.vm(&kernels_env, accel, !long && kernel == "all")?;
    let skips = Skips::read(&skip_file);

    // The bench is separate from the tests; its smoke run (one pair) keeps it from rotting.
    step("bench smoke run");
    let bench = Tally::one(bench_smoke(&bin, &selected, accel)).said("bench-smoke");

    // The release: made, and what a user installs checked.
    step("dist");
    let dist = Tally::one(
        xtask::dist::dist()
            .and_then(|d| check_dist(&d).and_then(|_| xtask::dist::check_in_guests(&d, accel)))
            .map_err(|e| eprintln!("test: dist failed: {e:#}"))
            .is_ok(),
    )
    .said("dist");

    // The README's main command, short, so that it does not rot: on the host, and in the long
    // mode in a VM too (CI runs the whole `cargo xtask demo` after the tests: `.ci/run`).
    step(if long {
        "demo (short), in a VM and on the host"
    } else {
        "demo (short), on the host"
    });
    let demo = Tally::one(demo_short(long, accel)).said("demo");

    // Long runs, short: a minute of record beside a looping workload (30 in the long mode).
    let soak_minutes = if long { 30.0 } else { 1.0 };
    step(&format!("soak ({soak_minutes} minutes)"));
    let soak = Tally::one(soak_short(&bin, soak_minutes)).said("soak");
    println!("test: finished in {:.0}s", start.elapsed().as_secs_f64());
    totals(
        &skips,
        unit,
        vm,
        &[bench, dist, demo, soak],
        kernel == "all",
    )
}

/// fmt and clippy (warnings are errors).
fn static_checks(root: &Path, step: &dyn Fn(&str)) -> Result<()> {
    step("cargo fmt --check");
    run(&mut cargo_in(root, &["fmt", "--all", "--", "--check"]))
        .context("formatting differs: run `cargo fmt --all`")?;
    step("cargo clippy -D warnings");
    run(&mut cargo_in(
        root,
        &[
            "clippy",
            "--locked",
            "--workspace",
            "--exclude",
            "memcg-trace-ebpf",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    ))
}

/// `cargo ARGS` in the workspace, with the LLVM tools on the path.
fn cargo_in(root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(root).env("PATH", llvm_path()).args(args);
    c
}

/// What the test binaries are run with: the release binaries under test and where skips go.
struct TestEnv<'a> {
    root: &'a Path,
    bin: &'a Path,
    bin_arm64: Option<&'a Path>,
    skip_file: &'a Path,
}

impl TestEnv<'_> {
    /// `cargo ARGS` with the binaries and the skip file in its environment.
    fn cargo(&self, args: &[&str]) -> Command {
        let mut cmd = cargo_in(self.root, args);
        cmd.env("MEMCG_TRACE_BIN", self.bin)
            .env(
                "MEMCG_TRACE_BIN_ARM64",
                self.bin_arm64.unwrap_or(Path::new("")),
            )
            .env("MEMCG_TRACE_SKIP_FILE", self.skip_file);
        cmd
    }

    /// The workspace's unit tests and the host tests as root (every test but the VM ones).
    fn unit_and_host(&self, long: bool) -> Result<Tally> {
        let (passed, failed, ok) = cargo_test(
            self.cargo(&[
                "test",
                "--locked",
                "--workspace",
                "--exclude",
                "memcg-trace-ebpf",
                // A failing unit test must not keep the host tests from running.
                "--no-fail-fast",
                "--",
                // Every VM test runs in the VM step below (once).
                "--skip",
                "vm_",
            ])
            .env("MEMCG_TRACE_MATRIX_RUNS", if long { "20" } else { "1" })
            .env("MEMCG_TRACE_FUZZ_SECS", if long { "600" } else { "8" }),
        )?;
        Ok(Tally { passed, failed, ok })
    }

    /// The VM tests on the kernels `kernels` (comma-separated), two guests at a time; without
    /// those of [`LONG_ONLY_VM`] where `short`.
    fn vm(&self, kernels: &str, accel: Accel, short: bool) -> Result<Tally> {
        let mut args = vec![
            "test",
            "--locked",
            "-p",
            "memcg-trace-tests",
            "--test",
            "vm",
            "--",
            "--test-threads=2",
        ];
        if short {
            for (test, covered) in LONG_ONLY_VM {
                println!("not run (cargo xtask test --long runs it): {test}: {covered}");
                args.extend(["--skip", test]);
            }
        }

        let (passed, failed, ok) = cargo_test(
            self.cargo(&args)
                .env("MEMCG_TRACE_KERNELS", kernels)
                .env("MEMCG_TRACE_ACCEL", format!("{accel:?}").to_lowercase()),
        )?;
        Ok(Tally { passed, failed, ok })
    }
}

/// VM tests that only the long mode runs, each with the test of the default run that covers
/// the same ground on another kernel (the default run must fit CI's time on a fresh machine).
const LONG_ONLY_VM: &[(&str, &str)] = &[
    (
        "matrix::vm_matrix_arm64_7_3",
        "arm64 runs in the default mode on 6.12 (vm_matrix_arm64_6_12), 7.3 on x86_64 (vm_matrix_7_3)",
    ),
    (
        "profile::vm_profile_7_3",
        "the shares against perf are checked in the default mode on 6.12 (vm_profile_6_12, both backends, not preemptible); kprobe's deferred pairs on a preemptible 7.3 in vm_oracle_7_3 and vm_matrix_7_3",
    ),
];

/// The bench's smoke run on 6.12 (its loss part only when 6.12 is selected): whether it ran.
fn bench_smoke(bin: &Path, selected: &[&kernels::KernelSpec], accel: Accel) -> bool {
    use xtask::bench::{Part, ALL_PARTS, SMOKE};
    let parts: Vec<Part> = ALL_PARTS
        .into_iter()
        .filter(|p| *p != Part::Loss || selected.iter().any(|k| k.short == "6.12"))
        .collect();
    xtask::bench::bench(bin, SMOKE, "6.12", None, accel, &parts)
        .map_err(|e| eprintln!("test: bench smoke run failed: {e:#}"))
        .is_ok()
}

/// The main command, short: on the host, and in the long mode in a VM on 6.12 first.
fn demo_short(long: bool, accel: Accel) -> bool {
    (if long {
        kernels::select("6.12")
            .and_then(|s| kernels::fetch(s[0]))
            .and_then(|k| demo(false, vec![k], accel, "-g 1 -l 20"))
    } else {
        Ok(())
    })
    .and_then(|_| demo(true, Vec::new(), accel, "-g 1 -l 20"))
    .map_err(|e| eprintln!("test: demo failed: {e:#}"))
    .is_ok()
}

/// `record` beside a looping workload for `minutes`: whether memory and descriptors stayed
/// flat and it ended cleanly.
fn soak_short(bin: &Path, minutes: f64) -> bool {
    match xtask::soak::soak(bin, minutes) {
        Ok(s) => {
            println!("{}", s.verdict);
            s.ok
        }
        Err(e) => {
            eprintln!("test: soak failed: {e:#}");
            false
        }
    }
}

/// The run's totals and what the tests said or skipped; an error if anything failed, or, in CI
/// with every kernel selected (`all_kernels`), if anything was skipped.
fn totals(
    skips: &Skips,
    unit: Tally,
    vm: Tally,
    one_test_steps: &[Tally],
    all_kernels: bool,
) -> Result<()> {
    for (name, line) in &skips.summaries {
        println!("{name}: {line}");
    }

    for (name, why) in &skips.tests {
        println!("skipped: {name}: {why}");
    }

    for (name, why) in &skips.cases {
        println!("skipped part: {name}: {why}");
    }

    let skipped = skips.tests.len() as u64;
    let vm_skipped = skips
        .tests
        .iter()
        .filter(|(n, _)| n.starts_with("vm_"))
        .count() as u64;
    println!(
        "vm: {} passed, {} failed, {vm_skipped} skipped",
        vm.passed.saturating_sub(vm_skipped),
        vm.failed
    );
    let every = [unit, vm].into_iter().chain(one_test_steps.iter().copied());
    let (passed, failed) = every
        .clone()
        .fold((0, 0), |(p, f), t| (p + t.passed, f + t.failed));
    println!(
        "all: {} passed, {failed} failed, {skipped} skipped",
        passed.saturating_sub(skipped)
    );
    if every.clone().any(|t| !t.ok) || failed > 0 {
        bail!("tests failed");
    }

    // In CI (root, every kernel selected) nothing may be skipped: a skip there is a test that
    // silently stopped running.
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if ci && all_kernels && skipped > 0 {
        bail!("{skipped} tests skipped in CI, where all must run");
    }
    Ok(())
}

/// What a user of the release gets, checked: each archive holds the binary, its man pages and
/// completions; the x86_64 package says what it needs (libc6 >= 2.31 and nothing else), and
/// its binary, unpacked, runs here: `--version` names the version and the commit, `probes`
/// resolves on this kernel; the man page renders with `man -l`; SHA256SUMS checks.
fn check_dist(d: &xtask::dist::Dist) -> Result<()> {
    output(
        Command::new("sha256sum")
            .current_dir(&d.dir)
            .args(["-c", "SHA256SUMS"]),
    )?;
    for arch in [Arch::X86_64, Arch::Arm64] {
        check_packed(d, arch)?;
    }

    check_installed(d)?;
    eprintln!("dist: {} checked", d.dir.display());
    Ok(())
}

/// The standard output of `cmd`, which must succeed (its standard error in the error).
fn output(cmd: &mut Command) -> Result<String> {
    let o = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !o.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The tarball and the Debian package of `arch` hold the files they must, and the package
/// depends on the C library it was built against at least.
fn check_packed(d: &xtask::dist::Dist, arch: Arch) -> Result<()> {
    use xtask::dist::{deb_name, tarball_name, GLIBC_FLOOR};
    let list = output(
        Command::new("tar")
            .arg("-tzf")
            .arg(d.dir.join(tarball_name(arch))),
    )?;
    for want in [
        "/bin/memcg-trace",
        "/share/man/man1/memcg-trace.1",
        "/share/man/man1/memcg-trace-record.1",
        "/share/bash-completion/completions/memcg-trace",
        "/share/zsh/site-functions/_memcg-trace",
        "/share/fish/vendor_completions.d/memcg-trace.fish",
        "/contrib/memcg-trace.service",
        "/LICENSE-MIT",
        "/LICENSE-APACHE",
        "/LICENSE-GPL-2.0",
        "/contrib/prometheus/memcg-trace.rules.yml",
    ] {
        if !list.lines().any(|l| l.ends_with(want)) {
            bail!("{} lacks {want}:\n{list}", tarball_name(arch));
        }
    }

    let deb = d.dir.join(deb_name(arch));
    let contents = output(Command::new("dpkg-deb").arg("--contents").arg(&deb))?;
    for want in [
        "./usr/bin/memcg-trace",
        "./usr/share/man/man1/memcg-trace.1.gz",
        "./usr/share/bash-completion/completions/memcg-trace",
        "./lib/systemd/system/memcg-trace.service",
        "./usr/share/doc/memcg-trace/copyright",
    ] {
        if !contents.lines().any(|l| l.ends_with(want)) {
            bail!("{} lacks {want}:\n{contents}", deb_name(arch));
        }
    }

    let depends = output(
        Command::new("dpkg-deb")
            .args(["--field"])
            .arg(&deb)
            .arg("Depends"),
    )?;
    if depends.trim() != format!("libc6 (>= {GLIBC_FLOOR})") {
        bail!("{}: Depends: {depends}", deb_name(arch));
    }
    Ok(())
}

/// The x86_64 package's files, unpacked as an installation would place them: the binary runs
/// and says its version, the unit starts the server, the manual page reads.
fn check_installed(d: &xtask::dist::Dist) -> Result<()> {
    use xtask::dist::{deb_name, VERSION};
    let root = d.dir.join("unpacked");
    let _ = fs::remove_dir_all(&root);
    output(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(d.dir.join(deb_name(Arch::X86_64)))
            .arg(&root),
    )?;
    let bin = root.join("usr/bin/memcg-trace");
    let version = output(Command::new(&bin).arg("--version"))?;
    if !version.contains(VERSION) || !version.contains("commit ") || !version.contains("legacy") {
        bail!("--version says {version:?}");
    }

    output(Command::new(&bin).arg("probes"))?;
    let unit = fs::read_to_string(root.join("lib/systemd/system/memcg-trace.service"))?;
    if !unit.contains("ExecStart=/usr/bin/memcg-trace serve") {
        bail!("the packaged unit: {unit}");
    }

    let page = output(
        Command::new("man")
            .args(["-l", "-P", "cat"])
            .arg(root.join("usr/share/man/man1/memcg-trace-record.1.gz"))
            .env("MANWIDTH", "80"),
    )?;
    if !page.contains("record") || !page.contains("--duration") {
        bail!("man -l memcg-trace-record.1: {page}");
    }

    fs::remove_dir_all(&root)?;
    Ok(())
}

/// Skips recorded by the tests (`memcg_trace_tests::skip` and `skip_case`).
#[derive(Default)]
struct Skips {
    /// Whole tests: (name, reason).
    tests: Vec<(String, String)>,
    /// Parts of tests that went on with the rest.
    cases: Vec<(String, String)>,
    /// What tests said they ran (not skips).
    summaries: Vec<(String, String)>,
}

impl Skips {
    fn read(path: &Path) -> Skips {
        let mut skips = Skips::default();
        for line in fs::read_to_string(path).unwrap_or_default().lines() {
            let mut f = line.splitn(3, '\t');
            let (Some(kind), Some(name), Some(why)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let entry = (name.to_string(), why.to_string());
            match kind {
                "case" => skips.cases.push(entry),
                "summary" => skips.summaries.push(entry),
                _ => skips.tests.push(entry),
            }
        }
        skips
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::{CommandFactory as _, Parser as _};

    /// Every argument a constraint names exists where it is used (clap checks this only in
    /// debug builds, at start-up), and flags that would be ignored together are refused.
    #[test]
    fn the_command_line_refuses_what_it_would_ignore() {
        Cli::command().debug_assert();
        let refused: [&[&str]; 6] = [
            &[
                "xtask",
                "demo",
                "--compare",
                "--a",
                "6.1",
                "--b",
                "6.12",
                "--kernel",
                "7.3",
            ],
            &[
                "xtask",
                "demo",
                "--compare",
                "--a",
                "6.1",
                "--b",
                "6.12",
                "--arch",
                "arm64",
            ],
            &["xtask", "demo", "--host", "--kernel-image", "/x/bzImage"],
            &[
                "xtask",
                "vm",
                "--kernel",
                "6.1",
                "--kernel-image",
                "/x/bzImage",
            ],
            &["xtask", "demo", "--a", "6.1", "--b", "6.12"],
            &["xtask", "demo", "--compare", "--a", "6.1"],
        ];
        for args in refused {
            assert!(Cli::try_parse_from(args).is_err(), "accepted: {args:?}");
        }

        let taken: [&[&str]; 4] = [
            &["xtask", "demo", "--compare", "--a", "6.1", "--b", "6.12"],
            &[
                "xtask",
                "demo",
                "--kernel-image",
                "/x/bzImage",
                "--kernel-config",
                "/x/.config",
            ],
            &["xtask", "bench", "--kernel-image", "/x/bzImage"],
            &[
                "xtask",
                "vm",
                "--kernel-image",
                "/x/bzImage",
                "--arch",
                "x86_64",
            ],
        ];
        for args in taken {
            assert!(Cli::try_parse_from(args).is_ok(), "refused: {args:?}");
        }
    }
}
