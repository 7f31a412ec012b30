//! memcg-trace's build, setup and VM tooling, as a library so that the integration tests in
//! `tests/` can boot stock kernels the same way `cargo xtask vm` does.

pub mod bench;
pub mod compare;
pub mod dist;
pub mod kernels;
pub mod own;
pub mod setup;
pub mod soak;
pub mod userland;
pub mod vm;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

/// The workspace root (this crate lives in `<root>/xtask`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent")
        .to_path_buf()
}

/// Where downloaded kernels and apt state are cached across clones
/// (`$MEMCG_TRACE_CACHE`, else `~/.cache/memcg-trace`).
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MEMCG_TRACE_CACHE") {
        return d.into();
    }

    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/memcg-trace")
}

/// Holds the cache's lock `name` (a file `<name>.lock` in the cache) until the returned file
/// is dropped: guests boot two at a time (the VM tests, the bench smoke run's parts), and what
/// one fetches into the cache the other must not fetch into the same place at once. Says so
/// when it has to wait.
pub fn cache_lock(name: &str) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    std::fs::create_dir_all(cache_dir())?;
    let path = cache_dir().join(format!("{name}.lock"));
    let lock = std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?;
    let flock = |how| {
        // SAFETY: flock(2) of a file held open here; released when it is closed.
        unsafe { libc::flock(lock.as_raw_fd(), how) == 0 }
    };
    if !flock(libc::LOCK_EX | libc::LOCK_NB) {
        eprintln!(
            "xtask: waiting for {} (another run is fetching it)",
            path.display()
        );
        if !flock(libc::LOCK_EX) {
            bail!(
                "lock {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(lock)
}

/// Runs a command, failing with its name and exit status.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{:?} failed: {status}", cmd);
    }
    Ok(())
}

/// Runs a command and returns its stdout.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed: {}: {}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// PATH with LLVM 22 first, as bpf-linker and the eBPF build need.
pub fn llvm_path() -> String {
    format!(
        "/usr/lib/llvm-22/bin:{}",
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The target the release binary is built for, named so that cargo keeps it apart from the
/// host build (`target/<triple>/release`) and applies the link flags to it alone, not to
/// build scripts.
pub const RELEASE_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The Rust target of the release binary for `arch`.
pub fn release_target(arch: kernels::Arch) -> &'static str {
    match arch {
        kernels::Arch::X86_64 => RELEASE_TARGET,
        kernels::Arch::Arm64 => "aarch64-unknown-linux-gnu",
    }
}

/// Where [`build_release`] leaves the binary.
pub fn release_bin() -> PathBuf {
    release_bin_for(kernels::Arch::X86_64)
}

/// Where [`build_release_for`] leaves the binary of `arch`.
pub fn release_bin_for(arch: kernels::Arch) -> PathBuf {
    workspace_root().join(format!(
        "target/{}/release/memcg-trace",
        release_target(arch)
    ))
}

/// Builds the release `memcg-trace` binary (with its eBPF objects) and returns its path: linked
/// against Debian 11's glibc 2.31 (unpacked into the cache, `userland::bullseye`), so that it
/// runs on any x86_64 distribution with glibc 2.31 or newer; checked so.
pub fn build_release() -> Result<PathBuf> {
    build_release_for(kernels::Arch::X86_64)
}

/// Whether rustup has the standard library of `target` for the default toolchain.
pub fn target_installed(target: &str) -> bool {
    output(Command::new("rustup").args(["target", "list", "--installed"]))
        .is_ok_and(|l| l.lines().any(|t| t.trim() == target))
}

/// The C cross compiler that links the arm64 binary (Debian's gcc-aarch64-linux-gnu).
pub const ARM64_LINKER: &str = "aarch64-linux-gnu-gcc";

/// [`build_release`] for `arch`: arm64 is cross-compiled here, with the Rust target
/// `aarch64-unknown-linux-gnu` and Debian's cross gcc linking against Debian 11's arm64 glibc
/// (`userland::arm64_sysroot`). The eBPF objects inside are the same bytecode on both: what
/// differs per architecture is chosen when they are loaded.
pub fn build_release_for(arch: kernels::Arch) -> Result<PathBuf> {
    let root = workspace_root();
    let sysroot = match arch {
        kernels::Arch::X86_64 => userland::bullseye()?,
        kernels::Arch::Arm64 => {
            if Command::new(ARM64_LINKER)
                .arg("--version")
                .output()
                .is_err()
            {
                bail!("{ARM64_LINKER} is missing: run `cargo xtask setup` (apt package gcc-aarch64-linux-gnu)");
            }

            userland::arm64_sysroot()?
        }
    };
    let target = release_target(arch);
    let mut cmd = Command::new("cargo");

    // Without rustup's prebuilt standard library for the target (a machine whose rustup cannot
    // fetch it), the nightly toolchain builds it from its rust-src, as it does for the eBPF
    // crate.
    let prebuilt = arch == kernels::Arch::X86_64 || target_installed(target);
    if !prebuilt {
        eprintln!("xtask: the Rust target {target} is not installed: building its standard library with nightly (-Z build-std)");
        cmd.arg("+nightly");
    }

    cmd.current_dir(&root)
        .env("PATH", llvm_path())
        .env_remove("RUSTFLAGS")
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            userland::link_flags(&sysroot, arch),
        )
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "memcg-trace",
            "--target",
            target,
        ]);
    if arch == kernels::Arch::Arm64 {
        cmd.env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            ARM64_LINKER,
        );
    }

    if !prebuilt {
        cmd.args(["-Z", "build-std=std,panic_abort"]);
    }

    run(&mut cmd).with_context(|| {
        format!("building memcg-trace for {target} (run `cargo xtask setup` if bpf-linker, rust-src or the {target} Rust target is missing)")
    })?;
    let bin = release_bin_for(arch);
    userland::check_floor(&bin)?;
    Ok(bin)
}

/// The guest script of the reclaim test: swap on zram, a memcg of `memory_max` filled for
/// `seconds` by a process that keeps allocating, traced with the `try_charge` and `charge`
/// probes. Leaves `reclaim.json`, `reclaim.txt`, `memory.events` and `memory.stat` in /out. The
/// guest needs the `zram` module.
pub fn reclaim_script(memory_max: &str, seconds: u32) -> String {
    format!(
        "MEMORY_MAX='{memory_max}'\nSECONDS_='{seconds}'\n{}",
        include_str!("../guest/reclaim.sh")
    )
}

/// The guest script of the serve test (`xtask/guest/serve.sh`).
pub fn serve_script() -> String {
    include_str!("../guest/serve.sh").to_string()
}

/// The guest script of the profiler comparison (`xtask/guest/profile.sh`): each of `backends`
/// with `probes` (record's probe flags), hackbench `hackbench`, perf at each rate of `freqs`
/// (Hz) in turn; then `rounds` rounds of the backends in turn without perf.
pub fn profile_script(
    backends: &str,
    probes: &str,
    hackbench: &str,
    freqs: &[u32],
    rounds: u32,
) -> String {
    let freqs: Vec<String> = freqs.iter().map(u32::to_string).collect();
    format!(
        "BACKENDS='{backends}'\nPROBES='{probes}'\nHB='{hackbench}'\nFREQS='{}'\nALONE_ROUNDS='{rounds}'\n{}",
        freqs.join(" "),
        include_str!("../guest/profile.sh")
    )
}

/// The guest script of the oracle test (`xtask/guest/oracle.sh`): function_graph beside
/// `record --attach attach` for each of `runs` ("NAME PROBE FUNCTION WORKLOAD", one a line;
/// WORKLOAD `reclaim` or a hackbench command line).
pub fn oracle_script(attach: &str, runs: &[&str]) -> String {
    format!(
        "ATTACH='{attach}'\nRUNS='{}'\n{}",
        runs.join("\n"),
        include_str!("../guest/oracle.sh")
    )
}

/// The guest script of the by-memcg test (`xtask/guest/bymemcg.sh`).
pub fn bymemcg_script() -> String {
    include_str!("../guest/bymemcg.sh").to_string()
}

/// The guest script of the call-site test (`xtask/guest/callers.sh`).
pub fn callers_script() -> String {
    include_str!("../guest/callers.sh").to_string()
}

/// A program on PATH (or in /usr/bin, /usr/sbin), with the apt package to install when missing.
pub fn which(name: &str) -> Result<PathBuf> {
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/bin", "/usr/sbin"])
    {
        let p = PathBuf::from(dir).join(name);
        if p.is_file() {
            return Ok(p);
        }
    }

    bail!(
        "{name} not found: run `cargo xtask setup` ({name} comes with apt package {})",
        match name {
            "hackbench" => "rt-tests",
            "funclatency" => "libbpf-tools",
            "perf" => "linux-perf",
            _ => name,
        }
    )
}

/// hackbench (Debian package rt-tests), the workload of the demo, the VM tests and the bench.
pub fn hackbench() -> Result<PathBuf> {
    which("hackbench")
}

/// The guest script of the VM tests and the demo: `memcg-trace record` with each backend in
/// `backends` while `hackbench <args>` runs in a fresh memcg; runs of a forced backend get
/// `--bpf-stats` when `stats` (the kernel then counts every program run, for the tests'
/// accounting check). Leaves `<backend>.json`, `<backend>.hlog` (the HdrHistogram interval
/// log), `<backend>.txt` (the summary), `<backend>.err` and `leftover-memcgs` in /out.
pub fn record_script(backends: &str, hackbench: &str, stats: bool) -> String {
    format!(
        "BACKENDS='{backends}'\nHACKBENCH='{hackbench}'\nSTATS='{}'\n{}",
        if stats { "--bpf-stats" } else { "" },
        include_str!("../guest/record.sh")
    )
}
