use std::{
    env, fs,
    hash::{Hash as _, Hasher as _},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;
use aya_build::{Package, Toolchain};

/// Builds memcg-trace-ebpf for bpfel-unknown-none with the nightly toolchain and bpf-linker and
/// leaves the object in OUT_DIR (or copies the objects built before from the same inputs:
/// `Cache`). With AYA_BUILD_SKIP=1 (clippy, cargo check, machines without
/// bpf-linker) an empty object is written instead and the binary says so when it starts.
/// The object is built twice: with the feature `legacy` (kernels before 5.19, see the eBPF
/// crate) into `memcg-trace-legacy`, then without it into `memcg-trace`. aya-build names its
/// output after the binary, so the first is moved aside before the second is built.
fn main() -> anyhow::Result<()> {
    stamp_commit();
    println!("cargo:rerun-if-changed=../memcg-trace-common/src");
    let dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let cache = Cache::find(&dir);
    if let Some(c) = &cache {
        if c.take(&dir)? {
            // What aya-build says when it builds: the eBPF crate's files.
            println!("cargo:rerun-if-changed={ROOT}");
            println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
            return Ok(());
        }
    }
    build(&dir)?;
    if let Some(c) = &cache {
        c.keep(&dir);
    }
    Ok(())
}

/// The eBPF crate.
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../memcg-trace-ebpf");

/// The two objects, in the build's directory and in the cache.
const OBJECTS: [&str; 2] = ["memcg-trace", "memcg-trace-legacy"];

/// Builds both objects into `dir`.
fn build(dir: &Path) -> anyhow::Result<()> {
    let out = dir.join("memcg-trace");
    let legacy = dir.join("memcg-trace-legacy");
    // One bytecode for every architecture: aya-build names the eBPF target's architecture
    // after the binary's (`bpf_target_arch`, which picks aya's `pt_regs`); the programs read
    // registers at offsets chosen when they are loaded (`KernelLayout::arch`), so the
    // object is built as for x86_64 whatever the binary's target.
    env::set_var("CARGO_CFG_TARGET_ARCH", "x86_64");
    for (features, dest) in [(&["legacy"][..], &legacy), (&[][..], &out)] {
        let _ = fs::remove_file(&out);
        let ebpf = Package {
            name: "memcg-trace-ebpf",
            root_dir: ROOT,
            features,
            ..Default::default()
        };
        aya_build::build_ebpf([ebpf], Toolchain::Nightly)?;
        if !out.exists() {
            fs::write(&out, b"").context("write empty eBPF stub")?;
        }
        strip_dwarf(&out)?;
        if dest != &out {
            fs::rename(&out, dest).context("move the legacy eBPF object aside")?;
        }
    }
    Ok(())
}

/// The eBPF objects built before from the same inputs, shared by every build of the binary:
/// each profile and target has a build directory of its own, so clippy, the tests and the
/// x86_64 and arm64 releases would otherwise build the same bytecode four times (about a
/// minute each, and the eBPF crate's dependencies again on a fresh machine). Kept in the
/// target directory's `ebpf-cache/<key>`, the key a hash of what the build reads (`key`).
/// No cache where the toolchain's versions cannot be read, or with `AYA_BUILD_SKIP` (the stub
/// object is never kept).
struct Cache {
    /// `ebpf-cache` in the target directory.
    root: PathBuf,
    key: String,
}

impl Cache {
    /// The cache for the objects this build would make, if their inputs can be read.
    fn find(out_dir: &Path) -> Option<Cache> {
        if env::var_os("AYA_BUILD_SKIP").is_some() {
            return None;
        }
        // The target directory: the outermost above OUT_DIR that cargo tagged as its own
        // (it tags each target triple's directory inside it too).
        let target = out_dir
            .ancestors()
            .filter(|d| d.join("CACHEDIR.TAG").exists())
            .last()?;
        Some(Cache {
            root: target.join("ebpf-cache"),
            key: key()?,
        })
    }

    /// Copies the kept objects into `dir` (and marks them used, for the pruning); false when
    /// none are kept for this key, or they could not be copied (another build's pruning may
    /// remove them meanwhile): then they are built.
    fn take(&self, dir: &Path) -> anyhow::Result<bool> {
        let kept = self.root.join(&self.key);
        let copied = OBJECTS
            .iter()
            .all(|o| kept.join(o).is_file() && fs::copy(kept.join(o), dir.join(o)).is_ok());
        if !copied {
            return Ok(false);
        }
        let _ = fs::File::open(&kept).and_then(|d| d.set_modified(std::time::SystemTime::now()));
        println!(
            "cargo:warning=memcg-trace-ebpf unchanged: its objects from {}",
            kept.display()
        );
        Ok(true)
    }

    /// Keeps the objects just built in `dir` (written aside, then renamed into place: builds
    /// may run at once), unless the inputs changed while they were built; then the four keys
    /// used last only, and no copy left aside by a build that stopped. Best effort: a failure
    /// only means the next build builds them again.
    fn keep(&self, dir: &Path) {
        // An empty object is the stub of a build without bpf-linker: never kept. Objects built
        // while the sources changed (an edit, a checkout) may not be those of either key.
        let built = OBJECTS
            .iter()
            .all(|o| fs::metadata(dir.join(o)).is_ok_and(|m| m.len() > 0));
        if !built || key().as_ref() != Some(&self.key) {
            return;
        }
        let tmp = self
            .root
            .join(format!("{}.tmp-{}", self.key, std::process::id()));
        let copied = fs::create_dir_all(&tmp).is_ok()
            && OBJECTS
                .iter()
                .all(|o| fs::copy(dir.join(o), tmp.join(o)).is_ok());
        if !copied || fs::rename(&tmp, self.root.join(&self.key)).is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        let Ok(entries) = fs::read_dir(&self.root) else {
            return;
        };
        let now = std::time::SystemTime::now();
        let mut kept = Vec::new();
        for e in entries.flatten() {
            let Some(modified) = e.metadata().ok().and_then(|m| m.modified().ok()) else {
                continue;
            };
            if e.file_name().to_string_lossy().contains(".tmp-") {
                // Left by a build that stopped between its copy and its rename.
                let stale = now
                    .duration_since(modified)
                    .is_ok_and(|age| age.as_secs() > 3600);
                if stale {
                    let _ = fs::remove_dir_all(e.path());
                }
            } else {
                kept.push((modified, e.path()));
            }
        }
        kept.sort();
        for (_, old) in kept.iter().rev().skip(4) {
            let _ = fs::remove_dir_all(old);
        }
    }
}

/// The cache's key: a hash of every file of the eBPF and common crates, the workspace's
/// manifest, lockfile and cargo configuration (and cargo's own), this build script, the
/// environment the eBPF build inherits that could change it (the target's endianness, which
/// picks bpfel or bpfeb; a rustc wrapper; cargo's settings of the release profile, of the BPF
/// targets and of builds), and the nightly rustc's version and bpf-linker's (its version, and
/// the path, size and time of the binary: a rebuild against another LLVM keeps the version).
/// None where the toolchain cannot be asked.
fn key() -> Option<String> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for crate_dir in ["memcg-trace-ebpf", "memcg-trace-common"] {
        hash_tree(&workspace.join(crate_dir), &mut h).ok()?;
    }
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .unwrap_or_default();
    // This file too: it strips the objects it keeps.
    let files = ["Cargo.toml", "Cargo.lock", "memcg-trace/build.rs"]
        .map(|f| workspace.join(f))
        .into_iter()
        // Cargo's configuration in every directory above, and its home's.
        .chain(workspace.ancestors().map(|d| d.join(".cargo/config.toml")))
        .chain(workspace.ancestors().map(|d| d.join(".cargo/config")))
        .chain([cargo_home.join("config.toml"), cargo_home.join("config")]);
    for file in files {
        file.hash(&mut h);
        fs::read(&file).unwrap_or_default().hash(&mut h);
    }
    let mut vars: Vec<(String, String)> = env::vars()
        .filter(|(k, _)| {
            [
                "CARGO_CFG_TARGET_ENDIAN",
                "RUSTC_WRAPPER",
                "RUSTC_BOOTSTRAP",
            ]
            .contains(&k.as_str())
                || ["CARGO_PROFILE_RELEASE_", "CARGO_TARGET_BPF", "CARGO_BUILD_"]
                    .iter()
                    .any(|p| k.starts_with(p))
        })
        .collect();
    vars.sort();
    vars.hash(&mut h);
    for (tool, args) in [
        ("rustc", &["+nightly", "-vV"][..]),
        ("bpf-linker", &["--version"][..]),
    ] {
        let o = Command::new(tool)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        o.stdout.hash(&mut h);
    }
    let linker = env::split_paths(&env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("bpf-linker"))
        .find(|p| p.is_file())?;
    let meta = fs::metadata(&linker).ok()?;
    (linker, meta.len(), meta.modified().ok()).hash(&mut h);
    Some(format!("{:016x}", h.finish()))
}

/// Hashes the paths and contents of the files below `dir`, in a fixed order (a `target`
/// directory left out).
fn hash_tree(dir: &Path, h: &mut impl std::hash::Hasher) -> std::io::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let name = e.file_name();
        name.hash(h);
        if e.file_type()?.is_dir() {
            if name != "target" {
                hash_tree(&path, h)?;
            }
        } else {
            fs::read(&path)?.hash(h);
        }
    }
    Ok(())
}

/// The commit the binary is built from, for `--version` (`MEMCG_TRACE_COMMIT`): `git describe`
/// of the tree, `+dirty` with changes, `unknown` outside git.
fn stamp_commit() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(c) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            format!("{c}{}", if dirty { "+dirty" } else { "" })
        }
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=MEMCG_TRACE_COMMIT={commit}");
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/index");
    }
}

/// Removes the DWARF sections (and their relocations) from the eBPF object: nine tenths of its
/// size, which the binary would carry and the loader copy, while aya reads only the BTF.
fn strip_dwarf(path: &std::path::Path) -> anyhow::Result<()> {
    let data = fs::read(path).context("read the eBPF object")?;
    if data.is_empty() {
        return Ok(());
    }
    let mut b = object::build::elf::Builder::read(&*data).context("parse the eBPF object")?;
    for s in b.sections.iter_mut() {
        let name = String::from_utf8_lossy(s.name.as_slice());
        if name.starts_with(".debug") || name.starts_with(".rel.debug") {
            s.delete = true;
        }
    }
    b.delete_orphans();
    // LLVM names sections from .strtab; the writer wants a section-name table of its own.
    if !b
        .sections
        .iter()
        .any(|s| matches!(s.data, object::build::elf::SectionData::SectionString))
    {
        let s = b.sections.add();
        s.name = b".shstrtab"[..].into();
        s.sh_type = object::elf::SHT_STRTAB;
        s.sh_addralign = 1;
        s.data = object::build::elf::SectionData::SectionString;
    }
    let mut out = Vec::new();
    b.write(&mut out)
        .context("write the stripped eBPF object")?;
    fs::write(path, out).context("write the stripped eBPF object")?;
    Ok(())
}
