use which::which;

/// Rebuild the eBPF object when bpf-linker changes: it is an implicit input of the build.
fn main() {
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
