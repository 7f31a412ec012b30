//! Debian stock kernels for the VM tests: fetched with `apt-get download`, unpacked with
//! `dpkg -x`, cached by release.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::{cache_dir, run};

/// Which apt configuration offers a kernel's packages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// The host's own apt sources (bookworm, bookworm-security).
    Host,
    /// A private apt configuration for trixie, trixie-backports and trixie-security, so the
    /// host's sources stay untouched.
    Trixie,
    /// The same for bullseye and bullseye-security (Debian 11: the 5.10 LTS kernels).
    Bullseye,
}

/// The guest's architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Arch {
    /// x86_64 (Debian's amd64), the host's own.
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    /// arm64 (aarch64), emulated by qemu-system-aarch64.
    #[value(name = "arm64", alias = "aarch64")]
    Arm64,
}

impl Arch {
    /// Debian's name of the architecture (`amd64`, `arm64`).
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }
    /// The ELF `e_machine` of its binaries.
    pub fn elf_machine(self) -> u16 {
        match self {
            Arch::X86_64 => 62,
            Arch::Arm64 => 183,
        }
    }
    /// The GNU triplet's first part, as in `lib/<it>-linux-gnu` (`x86_64`, `aarch64`).
    pub fn gnu(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }
}

/// A stock kernel of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    /// The name used on the command line (`6.1`; `arm64-6.12` for another architecture's).
    pub short: &'static str,
    /// The architecture it runs on.
    pub arch: Arch,
    /// `uname -r` of the kernel.
    pub release: &'static str,
    /// Packages holding vmlinuz and the config.
    pub packages: &'static [&'static str],
    /// Where apt finds them.
    pub suite: Suite,
    /// Extra kernel command line.
    pub cmdline: &'static str,
    /// apt-cache search pattern (names only) for the same series, used when the mirror no
    /// longer has the pinned package; the newest match stands in.
    pub series: &'static str,
}

/// Every kernel the VM tests know.
pub const KERNELS: &[KernelSpec] = &[
    KernelSpec {
        arch: Arch::X86_64,
        short: "5.10",
        release: "5.10.0-46-amd64",
        packages: &["linux-image-5.10.0-46-amd64"],
        series: r"^linux-image-5\.10\.0-[0-9]+-amd64$",
        suite: Suite::Bullseye,
        cmdline: "",
    },
    KernelSpec {
        arch: Arch::X86_64,
        short: "6.1",
        release: "6.1.0-57-amd64",
        packages: &["linux-image-6.1.0-57-amd64"],
        series: r"^linux-image-6\.1\.0-[0-9]+-amd64$",
        suite: Suite::Host,
        // Under emulation 6.1 marks the TSC unstable and falls back to HPET; a guest then hung
        // idle while probes were detached.
        cmdline: "tsc=reliable",
    },
    KernelSpec {
        arch: Arch::X86_64,
        short: "6.12",
        release: "6.12.117+deb12-amd64",
        packages: &["linux-image-6.12.117+deb12-amd64"],
        series: r"^linux-image-6\.12\.[0-9]+\+deb12-amd64$",
        suite: Suite::Host,
        cmdline: "",
    },
    KernelSpec {
        arch: Arch::X86_64,
        short: "6.18",
        release: "6.18.15+deb13-amd64",
        packages: &["linux-image-6.18.15+deb13-amd64"],
        series: r"^linux-image-6\.18\.[0-9]+\+deb13-amd64$",
        suite: Suite::Trixie,
        cmdline: "",
    },
    KernelSpec {
        arch: Arch::X86_64,
        short: "7.3",
        release: "7.3.4+deb13-amd64",
        // From 6.19 Debian splits the image: vmlinuz in linux-binary, the config in linux-base.
        packages: &[
            "linux-binary-7.3.4+deb13-amd64",
            "linux-base-7.3.4+deb13-amd64",
        ],
        series: r"^linux-binary-7\.3\.[0-9]+\+deb13-amd64$",
        suite: Suite::Trixie,
        cmdline: "",
    },
    // PREEMPT_RT builds (Debian's `-rt-amd64` flavour): softirqs run in tasks, interrupt
    // handlers in threads, the per-CPU stock's lock sleeps.
    KernelSpec {
        arch: Arch::X86_64,
        short: "6.1-rt",
        release: "6.1.0-57-rt-amd64",
        packages: &["linux-image-6.1.0-57-rt-amd64"],
        series: r"^linux-image-6\.1\.0-[0-9]+-rt-amd64$",
        suite: Suite::Host,
        // As 6.1. And on RT every interrupt handler runs in a thread: under emulation the
        // serial port that carries /out back raises its interrupt many times before its
        // thread runs, and the kernel's spurious-interrupt check took that for an unhandled
        // line and disabled it mid-transfer ("irq 3: nobody cared").
        cmdline: "tsc=reliable noirqdebug",
    },
    KernelSpec {
        arch: Arch::X86_64,
        short: "6.12-rt",
        release: "6.12.117+deb12-rt-amd64",
        packages: &["linux-image-6.12.117+deb12-rt-amd64"],
        series: r"^linux-image-6\.12\.[0-9]+\+deb12-rt-amd64$",
        suite: Suite::Host,
        // See 6.1-rt.
        cmdline: "noirqdebug",
    },
    KernelSpec {
        arch: Arch::Arm64,
        short: "arm64-6.12",
        release: "6.12.117+deb12-arm64",
        packages: &["linux-image-6.12.117+deb12-arm64"],
        series: r"^linux-image-6\.12\.[0-9]+\+deb12-arm64$",
        suite: Suite::Host,
        cmdline: "",
    },
    KernelSpec {
        arch: Arch::Arm64,
        short: "arm64-7.3",
        release: "7.3.4+deb13-arm64",
        packages: &[
            "linux-binary-7.3.4+deb13-arm64",
            "linux-base-7.3.4+deb13-arm64",
        ],
        series: r"^linux-binary-7\.3\.[0-9]+\+deb13-arm64$",
        suite: Suite::Trixie,
        cmdline: "",
    },
];

/// The kernels of the default matrix: 5.10 LTS (Debian 11, the kmem-accounting debates' era,
/// with the legacy eBPF object and Debian 11's userland), 6.1, 6.12 and 6.18, and 7.3, where
/// the slab charge path changed again.
pub const MATRIX: &[&str] = &["5.10", "6.1", "6.12", "6.18", "7.3"];

/// The PREEMPT_RT kernels of the matrix (x86_64): Debian 12's 6.1 and 6.12 RT builds.
pub const RT_MATRIX: &[&str] = &["6.1-rt", "6.12-rt"];

/// The arm64 kernels of the matrix (`cargo xtask test` runs both matrices).
pub const ARM64_MATRIX: &[&str] = &["arm64-6.12", "arm64-7.3"];

/// Every kernel `cargo xtask test` boots: the x86_64 matrix, its RT builds and the arm64
/// matrix.
pub fn test_matrix() -> Vec<&'static str> {
    MATRIX
        .iter()
        .chain(RT_MATRIX)
        .chain(ARM64_MATRIX)
        .copied()
        .collect()
}

/// The name of kernel `short` on `arch` (`6.12` on arm64: `arm64-6.12`).
pub fn arch_name(short: &str, arch: Arch) -> String {
    match arch {
        Arch::X86_64 => short.to_string(),
        Arch::Arm64 if short.starts_with("arm64-") => short.to_string(),
        Arch::Arm64 => format!("arm64-{short}"),
    }
}

/// Parses `--kernel`: a short name, a comma list, `all` (both matrices) or `every` (all
/// known).
pub fn select(arg: &str) -> Result<Vec<&'static KernelSpec>> {
    select_for(arg, None)
}

/// [`select`] for `--arch`: `all` and `every` are that architecture's kernels, and short names
/// are taken as its (`--arch arm64 --kernel 6.12`: `arm64-6.12`).
pub fn select_for(arg: &str, arch: Option<Arch>) -> Result<Vec<&'static KernelSpec>> {
    let of_arch =
        |n: &&str| arch.is_none_or(|a| KERNELS.iter().any(|k| k.short == *n && k.arch == a));
    let names: Vec<String> = match arg {
        "all" => test_matrix()
            .into_iter()
            .filter(of_arch)
            .map(str::to_string)
            .collect(),
        "every" => KERNELS
            .iter()
            .map(|k| k.short)
            .filter(of_arch)
            .map(str::to_string)
            .collect(),
        s => s
            .split(',')
            .map(str::trim)
            .map(|n| match arch {
                Some(a) => arch_name(n, a),
                None => n.to_string(),
            })
            .collect(),
    };
    names
        .into_iter()
        .map(|n| {
            KERNELS.iter().find(|k| k.short == n).ok_or_else(|| {
                anyhow!(
                    "unknown kernel {n:?}; known: {}, all, every",
                    KERNELS
                        .iter()
                        .map(|k| k.short)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
        })
        .collect()
}

/// A kernel ready to boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// Its spec.
    pub spec: KernelSpec,
    /// Its `uname -r`: the spec's, or that of the newest package of the series when the mirror
    /// dropped the pinned one.
    pub release: String,
    /// Compressed kernel image.
    pub vmlinuz: PathBuf,
    /// Build configuration.
    pub config: PathBuf,
}

/// A private apt configuration for Debian `suite` (its main, security and, where `backports`,
/// backports archives) on `arch` in `dir`, updated on first use.
pub(crate) fn private_apt(
    dir: &Path,
    suite: &str,
    backports: bool,
    arch: Arch,
) -> Result<Vec<String>> {
    let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
    if !Path::new(keyring).exists() {
        bail!("{keyring} is missing: apt-get install debian-archive-keyring");
    }

    fs::create_dir_all(dir.join("lists/partial"))?;
    fs::create_dir_all(dir.join("cache/archives/partial"))?;
    let list = dir.join("sources.list");
    let mirror = "http://deb.debian.org";
    let mut sources = format!(
        "deb [signed-by={keyring}] {mirror}/debian {suite} main\n\
         deb [signed-by={keyring}] {mirror}/debian-security {suite}-security main\n"
    );
    if backports {
        sources.push_str(&format!(
            "deb [signed-by={keyring}] {mirror}/debian {suite}-backports main\n"
        ));
    }

    fs::write(&list, sources)?;
    let opts = vec![
        format!("-oAPT::Architecture={}", arch.debian()),
        format!("-oAPT::Architectures={}", arch.debian()),
        format!("-oDir::Etc::SourceList={}", list.display()),
        "-oDir::Etc::SourceParts=/nonexistent".into(),
        format!("-oDir::State::Lists={}", dir.join("lists").display()),
        format!("-oDir::Cache={}", dir.join("cache").display()),
        "-oAPT::Sandbox::User=root".into(),
    ];
    let has_lists = fs::read_dir(dir.join("lists"))?
        .flatten()
        .any(|e| e.file_name().to_string_lossy().ends_with("Packages"));
    if !has_lists {
        eprintln!(
            "xtask: apt-get update (private {suite} configuration in {})",
            dir.display()
        );
        run(Command::new("apt-get").args(&opts).args(["-q", "update"])).with_context(|| {
            format!(
                "apt-get update for the {suite} kernels failed (is the Debian mirror reachable?)"
            )
        })?;
    }
    Ok(opts)
}

/// `boot/<prefix>-<release>` up to 6.18; from 6.19 `usr/lib/modules/<release>/<prefix>`.
fn find_file(root: &Path, prefix: &str) -> Option<PathBuf> {
    let in_boot = fs::read_dir(root.join("boot")).ok().and_then(|rd| {
        rd.flatten().map(|e| e.path()).find(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().starts_with(&format!("{prefix}-")))
                .unwrap_or(false)
        })
    });
    in_boot.or_else(|| {
        fs::read_dir(root.join("usr/lib/modules"))
            .ok()?
            .flatten()
            .map(|e| e.path().join(prefix))
            .find(|p| p.is_file())
    })
}

fn apt_opts(spec: &KernelSpec) -> Result<Vec<String>> {
    apt_for(spec.suite, spec.arch)
}

/// The apt options for `suite`'s packages of `arch`: the host's own configuration for its
/// own release and architecture, else a private one (another architecture's packages are
/// listed there, so this machine's dpkg never learns of them).
pub(crate) fn apt_for(suite: Suite, arch: Arch) -> Result<Vec<String>> {
    let dir = |name: &str| match arch {
        Arch::X86_64 => cache_dir().join(format!("apt-{name}")),
        Arch::Arm64 => cache_dir().join(format!("apt-{name}-arm64")),
    };
    Ok(match (suite, arch) {
        (Suite::Host, Arch::X86_64) => vec!["-oAPT::Sandbox::User=root".to_string()],
        (Suite::Host, _) => private_apt(&dir("bookworm"), "bookworm", false, arch)?,
        (Suite::Trixie, _) => private_apt(&dir("trixie"), "trixie", true, arch)?,
        (Suite::Bullseye, _) => private_apt(&dir("bullseye"), "bullseye", false, arch)?,
    })
}

/// The newest package of the spec's series the mirror offers (with its companion packages,
/// for the split 6.19+ layout), when the pinned one is gone.
fn newest_of_series(spec: &KernelSpec, opts: &[String]) -> Result<Vec<String>> {
    let found = crate::output(Command::new("apt-cache").args(opts).args([
        "search",
        "--names-only",
        spec.series,
    ]))?;
    let mut names: Vec<String> = found
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    // Names differ only in the version's digits: compare them numerically.
    let key = |n: &str| -> Vec<u64> {
        n.split(|c: char| !c.is_ascii_digit())
            .filter_map(|x| x.parse().ok())
            .collect()
    };
    names.sort_by_key(|n| key(n));
    let newest = names
        .pop()
        .ok_or_else(|| anyhow!("no package matches {} on the mirror", spec.series))?;
    let mut pkgs = vec![newest.clone()];
    if let Some(rest) = newest.strip_prefix("linux-binary-") {
        pkgs.push(format!("linux-base-{rest}"));
    }
    Ok(pkgs)
}

/// The work directory of a download into `dir`: `<dir>.partial`, the whole name kept
/// (`with_extension` would cut a release at its last dot: 6.12's three kernels shared one).
fn partial_of(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    dir.with_file_name(name)
}

/// Downloads and unpacks `pkgs` into `dir` (vmlinuz, config, release).
fn unpack_into(dir: &Path, pkgs: &[String], opts: &[String]) -> Result<String> {
    let work = partial_of(dir);
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(work.join("debs"))?;
    run(Command::new("apt-get")
        .current_dir(work.join("debs"))
        .args(opts)
        .arg("download")
        .args(pkgs))?;
    for deb in fs::read_dir(work.join("debs"))?.flatten() {
        run(Command::new("dpkg")
            .arg("-x")
            .arg(deb.path())
            .arg(work.join("root")))?;
    }

    let root = work.join("root");
    let vmlinuz =
        find_file(&root, "vmlinuz").ok_or_else(|| anyhow!("no vmlinuz in {}", pkgs.join(" ")))?;
    let config = find_file(&root, "config")
        .ok_or_else(|| anyhow!("no kernel config in {}", pkgs.join(" ")))?;
    // boot/vmlinuz-<release> or usr/lib/modules/<release>/vmlinuz.
    let release = match vmlinuz.file_name().and_then(|n| n.to_str()) {
        Some(n) if n.starts_with("vmlinuz-") => n["vmlinuz-".len()..].to_string(),
        _ => vmlinuz
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| anyhow!("cannot tell the release of {}", vmlinuz.display()))?,
    };
    fs::create_dir_all(dir)?;
    fs::copy(&config, dir.join("config"))?;
    fs::write(dir.join("release"), &release)?;
    fs::copy(&vmlinuz, dir.join("vmlinuz.tmp"))?;
    fs::rename(dir.join("vmlinuz.tmp"), dir.join("vmlinuz"))?;
    let _ = fs::remove_dir_all(&work);
    Ok(release)
}

/// The kernel `spec` as one of `dirs` of the cache holds it, if one does.
fn cached(spec: &KernelSpec, dirs: &[&Path]) -> Option<Kernel> {
    dirs.iter().find_map(|dir| {
        let (vmlinuz, config) = (dir.join("vmlinuz"), dir.join("config"));
        (vmlinuz.exists() && config.exists()).then(|| Kernel {
            spec: *spec,
            release: fs::read_to_string(dir.join("release"))
                .map(|r| r.trim().to_string())
                .unwrap_or_else(|_| spec.release.to_string()),
            vmlinuz,
            config,
        })
    })
}

/// Returns the kernel, downloading and unpacking it into the cache on first use. When the
/// mirror no longer has the pinned package, the newest of the same series stands in (and says
/// so); it is cached under the series name.
pub fn fetch(spec: &KernelSpec) -> Result<Kernel> {
    let kernels = cache_dir().join("kernels");
    let pinned = kernels.join(spec.release);
    let series = kernels.join(format!("series-{}", spec.short));
    if let Some(k) = cached(spec, &[&pinned, &series]) {
        return Ok(k);
    }

    // One fetch at a time (they share the apt state, and a release's work directory): one
    // that waited finds the kernel there.
    let _lock = crate::cache_lock("kernels")?;
    if let Some(k) = cached(spec, &[&pinned, &series]) {
        return Ok(k);
    }

    eprintln!(
        "xtask: fetching kernel {} ({})",
        spec.short,
        spec.packages.join(", ")
    );
    let opts = apt_opts(spec)?;
    let pkgs: Vec<String> = spec.packages.iter().map(|p| p.to_string()).collect();
    let (dir, release) = match unpack_into(&pinned, &pkgs, &opts) {
        Ok(r) => (pinned, r),
        Err(e) => {
            let newer = newest_of_series(spec, &opts).with_context(|| {
                format!(
                    "apt-get download {} failed ({e:#}) and no newer package of the series was found: the kernel is not cached and cannot be fetched (run `apt-get update`, check the mirror)",
                    spec.packages.join(" ")
                )
            })?;
            eprintln!(
                "xtask: {} is gone from the mirror; using {} instead",
                spec.packages.join(" "),
                newer.join(" ")
            );
            let r = unpack_into(&series, &newer, &opts)?;
            (series, r)
        }
    };
    Ok(Kernel {
        spec: *spec,
        release,
        vmlinuz: dir.join("vmlinuz"),
        config: dir.join("config"),
    })
}

/// The `depends=` list of a kernel module (its `.modinfo` section).
fn module_depends(ko: &[u8]) -> Vec<String> {
    let key = b"depends=";
    ko.windows(key.len())
        .position(|w| w == key)
        .map(|i| {
            let rest = &ko[i + key.len()..];
            let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end])
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Modules of `kernel` (by name, e.g. `zram`) and those they depend on, decompressed, in load
/// order. Taken from the kernel's package on first use and cached next to it; a module that is
/// built in needs nothing and is left out.
pub fn modules(kernel: &Kernel, names: &[&str]) -> Result<Vec<PathBuf>> {
    let dir = kernel
        .vmlinuz
        .parent()
        .expect("cached kernel dir")
        .join("modules");
    let order = dir.join(format!("order-{}", names.join("+")));
    let cached = || -> Option<Vec<PathBuf>> {
        let list = fs::read_to_string(&order).ok()?;
        let files: Vec<PathBuf> = list.lines().map(|l| dir.join(l)).collect();
        files.iter().all(|f| f.exists()).then_some(files)
    };
    if let Some(files) = cached() {
        return Ok(files);
    }

    // As kernels are fetched: one at a time.
    let _lock = crate::cache_lock("kernels")?;
    if let Some(files) = cached() {
        return Ok(files);
    }

    eprintln!(
        "xtask: fetching modules {} of kernel {}",
        names.join(", "),
        kernel.release
    );
    let work = dir.with_extension("partial");
    let found = unpack_module_packages(kernel, &work)?;
    fs::create_dir_all(&dir)?;
    let mut loaded: Vec<String> = Vec::new();
    for n in names {
        if !found.contains_key(&n.replace('-', "_")) {
            bail!("kernel {} has no module {n}", kernel.release);
        }

        copy_with_depends(n, &found, &dir, &mut loaded)?;
    }

    fs::write(&order, loaded.join("\n"))?;
    let _ = fs::remove_dir_all(&work);
    Ok(loaded.iter().map(|l| dir.join(l)).collect())
}

/// Downloads `kernel`'s packages into `work` and unpacks them there; every module file in them
/// by name (`-` read as `_`, as the kernel does).
fn unpack_module_packages(kernel: &Kernel, work: &Path) -> Result<HashMap<String, PathBuf>> {
    let opts = apt_opts(&kernel.spec)?;
    let _ = fs::remove_dir_all(work);
    fs::create_dir_all(work.join("debs"))?;
    let mut pkgs: Vec<String> = kernel.spec.packages.iter().map(|p| p.to_string()).collect();

    // From 6.19 on the image's package holds no module: they are in linux-modules-<release>.
    if pkgs.iter().any(|p| p.starts_with("linux-binary-")) {
        pkgs.push(format!("linux-modules-{}", kernel.release));
    }

    run(Command::new("apt-get")
        .current_dir(work.join("debs"))
        .args(&opts)
        .arg("download")
        .args(&pkgs))?;
    for deb in fs::read_dir(work.join("debs"))?.flatten() {
        run(Command::new("dpkg")
            .arg("-x")
            .arg(deb.path())
            .arg(work.join("root")))?;
    }

    let mut found = HashMap::new();
    let mut stack = vec![work.join("root")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(n) = p.file_name().and_then(|n| n.to_str()) {
                if let Some(base) = n.strip_suffix(".ko.xz").or_else(|| n.strip_suffix(".ko")) {
                    found.insert(base.replace('-', "_"), p.clone());
                }
            }
        }
    }
    Ok(found)
}

/// Writes module `name` (from `found`), decompressed, into `dir` after the modules it depends
/// on, each once, noting each in `loaded` in load order; a module not in `found` is built in.
fn copy_with_depends(
    name: &str,
    found: &HashMap<String, PathBuf>,
    dir: &Path,
    loaded: &mut Vec<String>,
) -> Result<()> {
    let key = name.replace('-', "_");
    if loaded.iter().any(|l| l == &format!("{key}.ko")) {
        return Ok(());
    }

    let Some(src) = found.get(&key) else {
        return Ok(());
    };
    let bytes = if src.extension().is_some_and(|e| e == "xz") {
        let out = Command::new("xz")
            .args(["-dc"])
            .arg(src)
            .output()
            .context("run xz")?;
        if !out.status.success() {
            bail!("xz could not decompress {}", src.display());
        }

        out.stdout
    } else {
        fs::read(src)?
    };
    for dep in module_depends(&bytes) {
        copy_with_depends(&dep, found, dir, loaded)?;
    }

    fs::write(dir.join(format!("{key}.ko")), &bytes)?;
    loaded.push(format!("{key}.ko"));
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn each_release_downloads_into_a_work_directory_of_its_own() {
        let kernels = std::path::Path::new("/cache/kernels");
        let names: Vec<_> = [
            "6.12.117+deb12-amd64",
            "6.12.117+deb12-rt-amd64",
            "6.12.117+deb12-arm64",
        ]
        .iter()
        .map(|r| super::partial_of(&kernels.join(r)))
        .collect();
        assert_eq!(
            names[0],
            kernels.join("6.12.117+deb12-amd64.partial"),
            "{names:?}"
        );
        assert!(names[0] != names[1] && names[1] != names[2] && names[0] != names[2]);
    }
    use super::*;

    #[test]
    fn selection_names_the_known_kernels() {
        assert_eq!(
            select("all").unwrap().len(),
            MATRIX.len() + RT_MATRIX.len() + ARM64_MATRIX.len()
        );
        assert_eq!(
            select_for("all", Some(Arch::X86_64)).unwrap().len(),
            MATRIX.len() + RT_MATRIX.len()
        );
        let rt = select("6.1-rt,6.12-rt").unwrap();
        assert!(rt.iter().all(|k| k.release.contains("-rt-")), "{rt:?}");
        let arm = select_for("6.12,7.3", Some(Arch::Arm64)).unwrap();
        assert!(arm.iter().all(|k| k.arch == Arch::Arm64), "{arm:?}");
        assert_eq!(arm[0].short, "arm64-6.12");
        assert_eq!(select("6.1,7.3").unwrap()[1].short, "7.3");
        let e = select("5.4").unwrap_err().to_string();
        assert!(
            e.contains("unknown kernel \"5.4\"") && e.contains("6.12"),
            "{e}"
        );
    }

    /// The mirror drops old kernel packages: a pinned package that is gone makes the newest of
    /// its series stand in, with its own release.
    #[test]
    fn a_vanished_pinned_kernel_falls_back_to_its_series() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), b"skipping a_vanished_pinned_kernel_falls_back_to_its_series: needs root (apt-get download)\n");
            return;
        }

        let cache = crate::workspace_root().join("target/test-scratch/kernel-fallback");
        let _ = fs::remove_dir_all(&cache);
        std::env::set_var("MEMCG_TRACE_CACHE", &cache);
        let spec = KernelSpec {
            arch: Arch::X86_64,
            short: "6.1",
            release: "6.1.0-1-amd64",
            packages: &["linux-image-6.1.0-1-amd64"],
            series: select("6.1").expect("6.1 is known")[0].series,
            suite: Suite::Host,
            cmdline: "",
        };
        let kernel = fetch(&spec).expect("fallback to the newest 6.1 package");
        std::env::remove_var("MEMCG_TRACE_CACHE");
        assert!(
            kernel.release.starts_with("6.1.0-") && kernel.release != "6.1.0-1-amd64",
            "{}",
            kernel.release
        );
        assert!(kernel.vmlinuz.exists() && kernel.config.exists());
        assert!(kernel.vmlinuz.starts_with(cache.join("kernels/series-6.1")));
        let _ = fs::remove_dir_all(&cache);
    }
}
