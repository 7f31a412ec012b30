//! `cargo xtask setup`: installs what building and testing memcg-trace needs, and only what is
//! missing. Idempotent; each step says what it does and a failure names the step.

use std::process::Command;

use anyhow::{anyhow, bail, Context as _, Result};

use crate::{llvm_path, output, run};

/// Debian packages: LLVM 22 for bpf-linker, qemu and busybox for the VM tests, rt-tests for
/// hackbench, cpio for the initramfs, zstd and xz to unpack kernel images, tmux for the terminal tests, the archive keyring for the
/// trixie kernels.
pub const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "qemu-system-x86",
    // The arm64 guests, and the cross linker of the arm64 binary.
    "qemu-system-arm",
    "gcc-aarch64-linux-gnu",
    "busybox-static",
    "rt-tests",
    "cpio",
    // objdump: the glibc floor check and the guests' library check.
    "binutils",
    // Unpacking the cached kernels' images, for the call-site test's call graph.
    "zstd",
    "xz-utils",
    "tmux",
    "debian-archive-keyring",
    // The peers of `cargo xtask bench`: a typical bpftrace latency script (Debian 12: 0.17),
    // and the leanest C one, libbpf-tools' funclatency (Debian 12: 0.26).
    "bpftrace",
    "libbpf-tools",
    // The venv of the independent HdrHistogram reader (where python3 is Debian's).
    "python3-venv",
    // The font `memcg-trace plot` lays its labels out with.
    "fonts-dejavu-core",
    // The real scraper of `memcg-trace serve` in the tests, and promtool (Debian 12: 2.42).
    "prometheus",
    // The profiler the self and total shares are checked against in the VM (Debian 12: 6.1).
    "linux-perf",
    // The host test that the arrays the programs share are never read by a map syscall.
    "strace",
];

/// HdrHistogram_py, the independent reader the tests decode recordings' histograms with, and
/// what it needs; pinned.
pub const PY_PACKAGES: &[&str] = &["hdrhistogram==0.10.3", "pbr==6.1.1"];

/// The venv holding `PY_PACKAGES`.
pub fn pyenv() -> std::path::PathBuf {
    crate::workspace_root().join("target/pyenv")
}

/// bpf-linker version; 0.13 builds against LLVM 22, the LLVM of the preinstalled nightly.
pub const BPF_LINKER_VERSION: &str = "0.13.0";

/// The LLVM major version that bpf-linker and the eBPF rustc must share.
pub const LLVM_MAJOR: &str = "22";

fn step<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    f().with_context(|| format!("setup step \"{name}\" failed"))
}

fn missing_packages() -> Vec<&'static str> {
    APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| !String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(true)
        })
        .collect()
}

/// Runs every setup step: each checks first and installs only what is missing. Every command
/// that builds or boots runs it first, so that each works on a machine that has nothing yet.
pub fn setup() -> Result<()> {
    step("apt packages", apt_packages)?;
    step("rust-src for nightly", rust_src)?;
    step("the aarch64 Rust target", aarch64_target)?;
    step("nightly LLVM version", llvm_matches)?;
    step("bpf-linker", bpf_linker)?;
    step("HdrHistogram_py venv", hdrh_venv)?;
    eprintln!("setup: done");
    Ok(())
}

/// The apt packages the builds, tests and guests use (`APT_PACKAGES`), installed as root.
fn apt_packages() -> Result<()> {
    let missing = missing_packages();
    if missing.is_empty() {
        eprintln!("setup: apt packages present");
        return Ok(());
    }

    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "{} missing: run this as root once (it installs apt packages), e.g. with sudo",
            missing.join(" ")
        );
    }

    eprintln!("setup: apt-get install {}", missing.join(" "));
    run(Command::new("apt-get").args(["-q", "update"]))?;
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["-q", "-y", "install", "--no-install-recommends"])
        .args(&missing))
}

/// The nightly toolchain's rust-src (the eBPF crate's build compiles its core library from it).
fn rust_src() -> Result<()> {
    let installed = output(Command::new("rustup").args(["component", "list", "--toolchain", "nightly", "--installed"]))
        .context("rustup cannot list the nightly toolchain's components (is the nightly toolchain installed?)")?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("setup: rust-src present");
        return Ok(());
    }

    eprintln!("setup: rustup component add rust-src --toolchain nightly");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

/// The aarch64 Rust target, for the arm64 build (not fatal: without it the build compiles the
/// standard library from nightly's rust-src).
fn aarch64_target() -> Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("rustup cannot list the installed targets")?;
    if installed
        .lines()
        .any(|l| l.trim() == "aarch64-unknown-linux-gnu")
    {
        eprintln!("setup: Rust target aarch64-unknown-linux-gnu present");
        return Ok(());
    }

    eprintln!("setup: rustup target add aarch64-unknown-linux-gnu (the arm64 build)");

    // Not fatal: without it the arm64 build compiles the standard library with nightly.
    if let Err(e) = run(Command::new("rustup").args(["target", "add", "aarch64-unknown-linux-gnu"]))
    {
        eprintln!("setup: {e:#}: the arm64 build will build its standard library from nightly's rust-src instead");
    }
    Ok(())
}

/// That nightly rustc's LLVM is the one bpf-linker is built against.
fn llvm_matches() -> Result<()> {
    let v = output(Command::new("rustup").args(["run", "nightly", "rustc", "-vV"]))?;
    let llvm = v
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .ok_or_else(|| anyhow!("nightly rustc does not report its LLVM version"))?;
    if !llvm.starts_with(&format!("{LLVM_MAJOR}.")) {
        bail!("nightly rustc uses LLVM {llvm}, bpf-linker is built against LLVM {LLVM_MAJOR}: they must match");
    }

    eprintln!("setup: nightly rustc uses LLVM {llvm}");
    Ok(())
}

/// bpf-linker at `BPF_LINKER_VERSION`, built against the system's LLVM.
fn bpf_linker() -> Result<()> {
    let have = Command::new("bpf-linker")
        .env("PATH", llvm_path_with_cargo())
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if have.contains(BPF_LINKER_VERSION) {
        eprintln!("setup: bpf-linker {BPF_LINKER_VERSION} present");
        return Ok(());
    }

    eprintln!(
        "setup: cargo install bpf-linker {BPF_LINKER_VERSION} (LLVM {LLVM_MAJOR}, about a minute)"
    );
    run(Command::new("cargo")
        .env("PATH", llvm_path())
        .env("LLVM_PREFIX", format!("/usr/lib/llvm-{LLVM_MAJOR}"))
        .args([
            "install",
            "--locked",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
        ])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{LLVM_MAJOR}"),
        ]))
}

/// HdrHistogram_py in its own virtual environment (`pyenv`): the independent reader the tests
/// decode recordings' histograms with.
fn hdrh_venv() -> Result<()> {
    let env = pyenv();
    let py = env.join("bin/python3");
    let check = || {
        Command::new(&py)
            .args([
                "-c",
                "import hdrh.histogram, hdrh.log, importlib.metadata as m; assert m.version('hdrhistogram') == '0.10.3'",
            ])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if check() {
        eprintln!("setup: HdrHistogram_py present in {}", env.display());
        return Ok(());
    }

    eprintln!(
        "setup: python3 -m venv {} and pip install {}",
        env.display(),
        PY_PACKAGES.join(" ")
    );
    let _ = std::fs::remove_dir_all(&env);
    run(Command::new("python3").arg("-m").arg("venv").arg(&env))?;
    run(Command::new(env.join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check"])
        .args(PY_PACKAGES))?;
    if !check() {
        bail!("HdrHistogram_py does not import from {}", env.display());
    }
    Ok(())
}

fn llvm_path_with_cargo() -> String {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    format!("{home}/.cargo/bin:{}", llvm_path())
}
