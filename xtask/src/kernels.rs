//! Debian stock kernels for the VM tests: fetched with `apt-get download`, unpacked with
//! `dpkg -x`, cached by release.

use std::{
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
}

/// A stock kernel of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    /// The name used on the command line (`6.1`).
    pub short: &'static str,
    /// `uname -r` of the kernel.
    pub release: &'static str,
    /// Packages holding vmlinuz and the config.
    pub packages: &'static [&'static str],
    /// Where apt finds them.
    pub suite: Suite,
    /// Extra kernel command line.
    pub cmdline: &'static str,
}

/// Every kernel the VM tests know.
pub const KERNELS: &[KernelSpec] = &[
    KernelSpec {
        short: "6.1",
        release: "6.1.0-57-amd64",
        packages: &["linux-image-6.1.0-57-amd64"],
        suite: Suite::Host,
        // Under emulation 6.1 marks the TSC unstable and falls back to HPET; a guest then hung
        // idle while probes were detached.
        cmdline: "tsc=reliable",
    },
    KernelSpec {
        short: "6.12",
        release: "6.12.117+deb12-amd64",
        packages: &["linux-image-6.12.117+deb12-amd64"],
        suite: Suite::Host,
        cmdline: "",
    },
    KernelSpec {
        short: "6.18",
        release: "6.18.15+deb13-amd64",
        packages: &["linux-image-6.18.15+deb13-amd64"],
        suite: Suite::Trixie,
        cmdline: "",
    },
    KernelSpec {
        short: "7.3",
        release: "7.3.4+deb13-amd64",
        // From 6.19 Debian splits the image: vmlinuz in linux-binary, the config in linux-base.
        packages: &[
            "linux-binary-7.3.4+deb13-amd64",
            "linux-base-7.3.4+deb13-amd64",
        ],
        suite: Suite::Trixie,
        cmdline: "",
    },
];

/// The kernels of the default matrix: the 6.1, 6.12 and 6.18, and 7.3, where the slab
/// charge path changed again.
pub const MATRIX: &[&str] = &["6.1", "6.12", "6.18", "7.3"];

/// Parses `--kernel`: a short name, a comma list, `all` (the matrix) or `every` (all known).
pub fn select(arg: &str) -> Result<Vec<&'static KernelSpec>> {
    let names: Vec<&str> = match arg {
        "all" => MATRIX.to_vec(),
        "every" => KERNELS.iter().map(|k| k.short).collect(),
        s => s.split(',').map(str::trim).collect(),
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
    /// Compressed kernel image.
    pub vmlinuz: PathBuf,
    /// Build configuration.
    pub config: PathBuf,
}

fn trixie_apt(dir: &Path) -> Result<Vec<String>> {
    let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
    if !Path::new(keyring).exists() {
        bail!("{keyring} is missing: apt-get install debian-archive-keyring");
    }
    fs::create_dir_all(dir.join("lists/partial"))?;
    fs::create_dir_all(dir.join("cache/archives/partial"))?;
    let list = dir.join("sources.list");
    let mirror = "http://deb.debian.org";
    fs::write(
        &list,
        format!(
            "deb [signed-by={keyring}] {mirror}/debian trixie main\n\
             deb [signed-by={keyring}] {mirror}/debian trixie-backports main\n\
             deb [signed-by={keyring}] {mirror}/debian-security trixie-security main\n"
        ),
    )?;
    let opts = vec![
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
            "xtask: apt-get update (private trixie configuration in {})",
            dir.display()
        );
        run(Command::new("apt-get").args(&opts).args(["-q", "update"])).context(
            "apt-get update for the trixie kernels failed (is the Debian mirror reachable?)",
        )?;
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

/// Returns the kernel, downloading and unpacking it into the cache on first use.
pub fn fetch(spec: &KernelSpec) -> Result<Kernel> {
    let dir = cache_dir().join("kernels").join(spec.release);
    let vmlinuz = dir.join("vmlinuz");
    let config = dir.join("config");
    if vmlinuz.exists() && config.exists() {
        return Ok(Kernel {
            spec: *spec,
            vmlinuz,
            config,
        });
    }
    eprintln!(
        "xtask: fetching kernel {} ({})",
        spec.short,
        spec.packages.join(", ")
    );
    let work = dir.with_file_name(format!("{}.partial", spec.release));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(work.join("debs"))?;
    let opts = match spec.suite {
        Suite::Host => vec!["-oAPT::Sandbox::User=root".to_string()],
        Suite::Trixie => trixie_apt(&cache_dir().join("apt-trixie"))?,
    };
    run(Command::new("apt-get")
        .current_dir(work.join("debs"))
        .args(&opts)
        .arg("download")
        .args(spec.packages))
    .with_context(|| format!("apt-get download {} failed: the kernel is not cached and cannot be fetched (run `apt-get update`, check the mirror)", spec.packages.join(" ")))?;
    for deb in fs::read_dir(work.join("debs"))?.flatten() {
        run(Command::new("dpkg")
            .arg("-x")
            .arg(deb.path())
            .arg(work.join("root")))?;
    }
    let root = work.join("root");
    let z = find_file(&root, "vmlinuz")
        .ok_or_else(|| anyhow!("no vmlinuz in {}", spec.packages.join(" ")))?;
    let c = find_file(&root, "config")
        .ok_or_else(|| anyhow!("no kernel config in {}", spec.packages.join(" ")))?;
    fs::create_dir_all(&dir)?;
    fs::copy(&c, &config)?;
    fs::copy(&z, dir.join("vmlinuz.tmp"))?;
    fs::rename(dir.join("vmlinuz.tmp"), &vmlinuz)?;
    let _ = fs::remove_dir_all(&work);
    Ok(Kernel {
        spec: *spec,
        vmlinuz,
        config,
    })
}
