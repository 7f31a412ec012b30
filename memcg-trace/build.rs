use std::{env, fs, path::PathBuf};

use anyhow::Context as _;
use aya_build::{Package, Toolchain};

/// Builds memcg-trace-ebpf for bpfel-unknown-none with the nightly toolchain and bpf-linker and
/// leaves the object in OUT_DIR. With AYA_BUILD_SKIP=1 (clippy, cargo check, machines without
/// bpf-linker) an empty object is written instead and the binary says so when it starts.
fn main() -> anyhow::Result<()> {
    let ebpf = Package {
        name: "memcg-trace-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../memcg-trace-ebpf"),
        ..Default::default()
    };
    println!("cargo:rerun-if-changed=../memcg-trace-common/src");
    aya_build::build_ebpf([ebpf], Toolchain::Nightly)?;
    let out = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?).join("memcg-trace");
    if !out.exists() {
        fs::write(&out, b"").context("write empty eBPF stub")?;
    }
    strip_dwarf(&out)?;
    Ok(())
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
