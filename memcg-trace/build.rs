use std::{env, fs, path::PathBuf};

use anyhow::Context as _;
use aya_build::{Package, Toolchain};

/// Builds memcg-trace-ebpf for bpfel-unknown-none with the nightly toolchain and bpf-linker and
/// leaves the object in OUT_DIR. With AYA_BUILD_SKIP=1 (clippy, cargo check, machines without
/// bpf-linker) an empty object is written instead and the binary says so when it starts.
/// The object is built twice: with the feature `legacy` (kernels before 5.19, see the eBPF
/// crate) into `memcg-trace-legacy`, then without it into `memcg-trace`. aya-build names its
/// output after the binary, so the first is moved aside before the second is built.
fn main() -> anyhow::Result<()> {
    const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../memcg-trace-ebpf");
    stamp_commit();
    println!("cargo:rerun-if-changed=../memcg-trace-common/src");
    let dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
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
