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
    Ok(())
}
