//! Debian 11's userland, unpacked from its packages: the glibc 2.31 the portable release binary
//! is linked against (`build_release`), and the guest userland of the 5.10 kernel's VM, where
//! that binary then runs with Debian 11's own libraries.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::{
    cache_dir,
    kernels::{self, Arch, Suite},
    run,
};

/// The packages: the C library (and its development files, to link against), the unwinder's
/// libgcc_s that Rust's standard library needs, and hackbench (rt-tests).
const PACKAGES: &[&str] = &["libc6", "libc6-dev", "libgcc-s1", "rt-tests"];

/// The newest GNU C library version the portable binary may need: Debian 11's.
pub const GLIBC_FLOOR: (u32, u32) = (2, 31);

/// Debian 11's userland, downloaded and unpacked into the cache on first use. Absolute symbolic
/// links (libc6-dev's `libm.so -> /lib/...`) are made relative, so that a link against it never
/// reaches into this machine's own libraries.
pub fn bullseye() -> Result<PathBuf> {
    unpack("userland-bullseye", Suite::Bullseye, Arch::X86_64, PACKAGES)
}

/// What the arm64 build links against: Debian 11's arm64 C library (the same glibc floor as
/// the x86_64 build).
pub fn arm64_sysroot() -> Result<PathBuf> {
    unpack(
        "userland-bullseye-arm64",
        Suite::Bullseye,
        Arch::Arm64,
        &["libc6", "libc6-dev", "libgcc-s1"],
    )
}

/// The arm64 guests' userland: Debian 12's arm64 C library, hackbench and busybox.
pub fn arm64_guest() -> Result<PathBuf> {
    unpack(
        "userland-bookworm-arm64",
        Suite::Host,
        Arch::Arm64,
        &["libc6", "libgcc-s1", "rt-tests", "busybox-static"],
    )
}

/// Debian packages of `suite` on `arch`, unpacked as they are (no dependencies added: name
/// them all), cached under a name made of the list.
pub fn packages(suite: Suite, arch: Arch, packages: &[&str]) -> Result<PathBuf> {
    // FNV-1a of the list: a short, stable name for the cache.
    let hash = packages
        .join(" ")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let suite_name = match suite {
        Suite::Bullseye => "bullseye",
        _ => "bookworm",
    };
    unpack(
        &format!("packages-{suite_name}-{}-{hash:016x}", arch.debian()),
        suite,
        arch,
        packages,
    )
}

/// Every library that an ELF file under `tree` names is somewhere under `root` (the guest's
/// whole tree, `tree` copied in): a package list that lacks one fails here, before a boot.
pub fn check_libraries(tree: &Path, root: &Path) -> Result<()> {
    // Libraries by file name, wherever they are (a package's private directory, found
    // through its RUNPATH, included); links name them too (libz.so.1 -> libz.so.1.2.13).
    let mut present = std::collections::BTreeSet::new();
    walk(root, &mut |p, _| {
        if let Some(n) = p.file_name() {
            present.insert(n.to_string_lossy().into_owned());
        }
    });
    for elf in elves(tree) {
        for lib in needed(&elf)? {
            if !present.contains(&lib) {
                bail!(
                    "{} needs {lib}, which none of the guest's packages has: add its package",
                    elf.display()
                );
            }
        }
    }
    Ok(())
}

/// The ELF files under `tree` (programs and libraries; not links).
pub fn elves(tree: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    walk(tree, &mut |p, link| {
        if !link && crate::vm::elf_machine(p).is_some() {
            files.push(p.to_path_buf());
        }
    });
    files
}

/// Calls `f` on every file and symbolic link under `dir` (true: a link), recursively.
fn walk(dir: &Path, f: &mut dyn FnMut(&Path, bool)) {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&e.path(), f),
            Ok(t) => f(&e.path(), t.is_symlink()),
            Err(_) => {}
        }
    }
}

/// Debian packages `packages` of `suite` on `arch`, downloaded and unpacked into the cache's
/// `name` on first use, absolute links made relative.
fn unpack(name: &str, suite: Suite, arch: Arch, packages: &[&str]) -> Result<PathBuf> {
    let dir = cache_dir().join(name);
    let root = dir.join("root");
    if dir.join("complete").exists() {
        return Ok(root);
    }

    // One unpacks while another waits, then finds it done, instead of both working in (and
    // removing) one directory.
    let _lock = crate::cache_lock(name)?;
    if dir.join("complete").exists() {
        return Ok(root);
    }

    eprintln!(
        "xtask: fetching {name} ({}, {})",
        packages.join(", "),
        arch.debian()
    );
    let work = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(work.join("debs"))?;

    // An empty dpkg status: this machine's newer installed versions must not stand in for
    // the candidates.
    let status = work.join("status");
    fs::write(&status, "")?;
    let mut opts = kernels::apt_for(suite, arch)?;
    opts.push(format!("-oDir::State::status={}", status.display()));
    let download = || {
        run(Command::new("apt-get")
            .current_dir(work.join("debs"))
            .args(&opts)
            .arg("download")
            .args(packages))
    };
    if download().is_err() {
        // The cached package lists may name versions the mirror has replaced since.
        eprintln!("xtask: apt-get download failed; updating the package lists once");
        run(Command::new("apt-get").args(&opts).args(["-q", "update"]))
            .context("apt-get update of the package lists")?;
        if download().is_err() {
            // A mirror may list a version it does not carry (seen: bullseye-security's
            // arm64 glibc): the first package's other versions, newest first, each taken by
            // every package that has it (libc6 and libc6-dev must match).
            download_any(&opts, &work.join("debs"), packages)
                .with_context(|| format!("apt-get download of {name}"))?;
        }
    }

    for deb in fs::read_dir(work.join("debs"))?.flatten() {
        run(Command::new("dpkg")
            .arg("-x")
            .arg(deb.path())
            .arg(work.join("root")))?;
    }

    relativize_links(&work.join("root"))?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&work, &dir)?;
    fs::write(dir.join("complete"), "")?;
    Ok(root)
}

/// The versions apt lists for `package`, newest first.
fn versions(opts: &[String], package: &str) -> Result<Vec<String>> {
    let policy = crate::output(
        Command::new("apt-cache")
            .args(opts)
            .args(["policy", package]),
    )?;

    // The version table's lines: "     2.31-13+deb11u11 500" (a leading "***" marks the
    // installed one).
    Ok(policy
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("Version table:"))
        .skip(1)
        .filter_map(|l| {
            let mut w = l.split_whitespace().filter(|w| *w != "***");
            let (v, prio) = (w.next()?, w.next()?);
            prio.parse::<i32>().ok().map(|_| v.to_string())
        })
        .collect())
}

/// Downloads `packages` into `dir` at one version of the first: each of its listed versions,
/// newest first, taken by every package that lists it (the others at their candidate), until
/// all download.
fn download_any(opts: &[String], dir: &Path, packages: &[&str]) -> Result<()> {
    let first = packages.first().copied().unwrap_or_default();
    let tried = versions(opts, first)?;
    for v in &tried {
        for e in fs::read_dir(dir)?.flatten() {
            let _ = fs::remove_file(e.path());
        }

        let mut args = Vec::new();
        for p in packages {
            if versions(opts, p)?.contains(v) {
                args.push(format!("{p}={v}"));
            } else {
                args.push(p.to_string());
            }
        }

        let ok = Command::new("apt-get")
            .current_dir(dir)
            .args(opts)
            .arg("download")
            .args(&args)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
    }

    bail!("no version of {first} could be downloaded with the others (tried {tried:?})")
}

/// Rewrites every absolute symbolic link under `root` as a relative one inside `root`.
fn relativize_links(root: &Path) -> Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)?.flatten() {
            let path = e.path();
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(path);
            } else if t.is_symlink() {
                let target = fs::read_link(&path)?;
                if let Ok(rest) = target.strip_prefix("/") {
                    let depth = path
                        .parent()
                        .and_then(|q| q.strip_prefix(root).ok())
                        .map(|q| q.components().count())
                        .unwrap_or(0);
                    let mut rel = PathBuf::new();
                    for _ in 0..depth {
                        rel.push("..");
                    }

                    rel.push(rest);
                    fs::remove_file(&path)?;
                    symlink(&rel, &path)?;
                }
            }
        }
    }
    Ok(())
}

/// rustc flags that link against the userland's C library instead of this machine's: its
/// start files, libraries and linker scripts (`gcc --sysroot`, with its directories searched
/// first: Debian's gcc otherwise puts its own multiarch directory ahead of the sysroot's).
/// As `CARGO_ENCODED_RUSTFLAGS` (separated by 0x1f: paths may hold spaces), after the
/// caller's own `RUSTFLAGS`.
pub fn link_flags(root: &Path, arch: Arch) -> String {
    let sysroot = root.display();
    let gnu_arch = arch.gnu();
    let mut flags: Vec<String> = std::env::var("RUSTFLAGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    for a in [
        format!("--sysroot={sysroot}"),
        format!("-B{sysroot}/usr/lib/{gnu_arch}-linux-gnu/"),
        format!("-L{sysroot}/usr/lib/{gnu_arch}-linux-gnu"),
        format!("-L{sysroot}/lib/{gnu_arch}-linux-gnu"),
    ] {
        flags.push(format!("-Clink-arg={a}"));
    }

    flags.join("\x1f")
}

/// The newest `GLIBC_x.y` symbol version a binary needs (from `objdump -T`).
pub fn glibc_needed(bin: &Path) -> Result<(u32, u32)> {
    let out = crate::output(Command::new("objdump").arg("-T").arg(bin))
        .context("objdump (binutils) reading the binary's dynamic symbols")?;
    out.split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut it = v.split('.');
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .max()
        .ok_or_else(|| anyhow!("{}: no GLIBC symbol versions", bin.display()))
}

/// Fails unless `bin` runs on the floor's C library.
pub fn check_floor(bin: &Path) -> Result<()> {
    let need = glibc_needed(bin)?;
    if need > GLIBC_FLOOR {
        bail!(
            "{} needs glibc {}.{}, newer than the floor {}.{} (Debian 11)",
            bin.display(),
            need.0,
            need.1,
            GLIBC_FLOOR.0,
            GLIBC_FLOOR.1
        );
    }
    Ok(())
}

/// The userland's libraries (the dynamic loader and `lib/<arch>-linux-gnu`), as paths relative
/// to its root, for the guest.
pub fn libraries(root: &Path, arch: Arch) -> Result<Vec<PathBuf>> {
    let mut libs = vec![PathBuf::from(loader(arch))];
    let lib = format!("lib/{}-linux-gnu", arch.gnu());
    let dir = root.join(&lib);
    for e in fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
        let name = e?.file_name();
        if name.to_string_lossy().contains(".so") {
            libs.push(Path::new(&lib).join(name));
        }
    }
    Ok(libs)
}

/// The dynamic loader's path on `arch`.
pub fn loader(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "lib64/ld-linux-x86-64.so.2",
        Arch::Arm64 => "lib/ld-linux-aarch64.so.1",
    }
}

/// The shared libraries an ELF binary of any architecture names (`objdump -p`'s NEEDED).
pub fn needed(bin: &Path) -> Result<Vec<String>> {
    let out = crate::output(Command::new("objdump").arg("-p").arg(bin))
        .with_context(|| format!("objdump -p {}", bin.display()))?;
    Ok(out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("NEEDED"))
        .map(|n| n.trim().to_string())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check tells a binary of this machine (Debian 12, glibc 2.36) from the floor.
    #[test]
    fn a_binary_of_this_machine_is_above_the_floor() {
        let ls = Path::new("/bin/ls");
        let need = glibc_needed(ls).expect("objdump reads /bin/ls");
        assert!(need >= (2, 34), "/bin/ls needs glibc {need:?}");
        assert!(check_floor(ls).is_err());
    }

    #[test]
    fn absolute_links_become_relative_inside_the_root() {
        let root = std::env::temp_dir().join(format!("mt-userland-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        fs::create_dir_all(root.join("lib/x86_64-linux-gnu")).unwrap();
        fs::write(root.join("lib/x86_64-linux-gnu/libm.so.6"), "x").unwrap();
        symlink(
            "/lib/x86_64-linux-gnu/libm.so.6",
            root.join("usr/lib/x86_64-linux-gnu/libm.so"),
        )
        .unwrap();
        relativize_links(&root).unwrap();
        let l = root.join("usr/lib/x86_64-linux-gnu/libm.so");
        assert_eq!(
            fs::read_link(&l).unwrap(),
            Path::new("../../../lib/x86_64-linux-gnu/libm.so.6")
        );
        assert_eq!(fs::read_to_string(&l).unwrap(), "x");
        let _ = fs::remove_dir_all(&root);
    }
}
