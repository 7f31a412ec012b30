//! Boots a stock kernel under qemu with an initramfs of busybox, the binaries under test and a
//! guest script; streams the console to a log; brings files the script leaves in /out back over
//! a second serial port; returns the guest's verdict (`init: success|failure`).

use std::{
    collections::BTreeSet,
    fs,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use base64::Engine as _;

use crate::kernels::{Arch, Kernel, Suite};

/// The accelerator: TCG (software emulation, single-threaded) or KVM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// Single-threaded TCG. Multi-threaded TCG crashes guests when probes are patched in
    /// while another vCPU runs the patched code.
    Tcg,
    /// KVM, where /dev/kvm works.
    Kvm,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// Label for logs (`6.12-record`).
    pub name: String,
    /// Shell script run as root in the guest after the mounts; its exit status is the verdict.
    /// Files it writes to /out come back to the host.
    pub script: String,
    /// Host binaries installed in the guest's /bin with the libraries they need.
    pub bins: Vec<PathBuf>,
    /// Accelerator.
    pub accel: Accel,
    /// Give up after this long.
    pub timeout: Duration,
    /// Echo the console to stderr while it runs.
    pub echo: bool,
    /// Kernel modules loaded (in this order) before the script runs.
    pub modules: Vec<PathBuf>,
    /// Guest memory, MiB (0: 1024).
    pub mem_mb: u32,
    /// Virtual CPUs (0: 2). Under TCG they take turns on one host thread while the guest
    /// clock runs on: a vCPU waiting for its turn sees time pass.
    pub cpus: u32,
    /// TCG only: the guest's clock counts executed instructions, 2^shift ns each, instead of
    /// following the host's (`-icount shift=N`): guest times are then free of the host's load
    /// and of emulation speed (rounds of one boot repeat within a few percent), and measure
    /// instructions executed rather than memory stalls. For experiments: under QEMU 7.2 one
    /// boot in about ten oopsed with reserved RFLAGS bits set, an emulation fault.
    pub icount: Option<u32>,
    /// Debian packages of the guest's own release and architecture, unpacked into its root as
    /// they are (their libraries must be among them or the guest's: checked before booting),
    /// e.g. dpkg and man-db, to install and read a package in the guest.
    pub packages: Vec<String>,
    /// Files copied as they are into the guest's /files (e.g. a package to install there).
    pub files: Vec<PathBuf>,
    /// x86_64: an NMI this often while the guest runs (QMP `inject-nmi`, into the first vCPU,
    /// as a watchdog or the PMU would raise one; TCG has no PMU to raise them), so that the
    /// context split's NMI field is seen, not inferred. The guest reports each as an NMI of
    /// unknown reason and goes on.
    pub nmis: Option<Duration>,
}

impl VmSpec {
    /// A boot of `script` with `bins` under `accel`, otherwise as most boots are: 15 minutes at
    /// most, console not echoed, no modules or packages or files, 1 GiB and 2 vCPUs, the host's
    /// clock, no injected NMIs.
    pub fn plain(name: String, script: String, bins: Vec<PathBuf>, accel: Accel) -> Self {
        VmSpec {
            name,
            script,
            bins,
            accel,
            timeout: Duration::from_secs(900),
            echo: false,
            modules: Vec::new(),
            mem_mb: 0,
            cpus: 0,
            icount: None,
            packages: Vec::new(),
            files: Vec::new(),
            nmis: None,
        }
    }
}

/// The outcome of one boot.
#[derive(Debug)]
pub struct VmResult {
    /// The guest printed `init: success`.
    pub success: bool,
    /// Why not, if not.
    pub failure: Option<String>,
    /// The whole console output.
    pub console: String,
    /// Where the console log was written.
    pub log: PathBuf,
    /// Directory holding the files the guest left in /out.
    pub out_dir: PathBuf,
    /// Wall time of the boot.
    pub elapsed: Duration,
    /// Boots before this one that ended in an emulation fault (see [`run`]): the line showing
    /// it, each.
    pub emulation_faults: Vec<String>,
}

impl VmResult {
    /// The last `n` lines of the console, for failure messages.
    pub fn tail(&self, n: usize) -> String {
        let lines: Vec<&str> = self.console.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

const DATA_BEGIN: &str = "MEMCG-TRACE-DATA-BEGIN";
const DATA_END: &str = "MEMCG-TRACE-DATA-END";

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t debugfs debugfs /sys/kernel/debug
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
# Loopback up, as on any system (the sockets workload streams over it).
ifconfig lo 127.0.0.1 up
mkdir -p /out
for m in $(cat /lib/modules/order 2>/dev/null); do
  insmod /lib/modules/$m || echo "init: insmod $m failed"
done
echo "init: kernel $(uname -r), $(nproc) cpus"
cd /tmp
sh -e /guest.sh
rc=$?
stty -F @DATA@ raw -echo 2>/dev/null
{ echo MEMCG-TRACE-DATA-BEGIN; tar c -C /out . | base64; echo MEMCG-TRACE-DATA-END; } > @DATA@
sync
if [ "$rc" = 0 ]; then echo "init: success"; else echo "init: failure (guest script exit $rc)"; fi
reboot -f
"#;

/// The ELF `e_machine` of `path` (None: not an ELF file, e.g. a script).
pub(crate) fn elf_machine(path: &Path) -> Option<u16> {
    let mut h = [0u8; 20];
    std::io::Read::read_exact(&mut fs::File::open(path).ok()?, &mut h).ok()?;
    (h[..4] == *b"\x7fELF").then(|| u16::from_le_bytes([h[18], h[19]]))
}

/// Host libraries a binary needs, from ldd.
fn libraries(bin: &Path) -> Result<BTreeSet<PathBuf>> {
    let out = Command::new("ldd").arg(bin).output().context("run ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = BTreeSet::new();
    for line in text.lines() {
        for word in line.split_whitespace() {
            if word.starts_with('/') {
                libs.insert(PathBuf::from(word));
            }
        }
    }
    Ok(libs)
}

fn copy_into(root: &Path, src: &Path, dst_rel: &Path) -> Result<()> {
    let dst = root.join(dst_rel);
    fs::create_dir_all(dst.parent().expect("has parent"))?;
    fs::copy(src, &dst).with_context(|| format!("copy {} into the initramfs", src.display()))?;
    Ok(())
}

/// Writes the initramfs (newc cpio) for `spec` on `kernel` into `work`.
fn initramfs(kernel: &Kernel, spec: &VmSpec, work: &Path) -> Result<PathBuf> {
    let root = work.join("root");
    let _ = fs::remove_dir_all(&root);
    for d in [
        "bin", "sbin", "proc", "sys", "dev", "tmp", "boot", "out", "lib64", "etc",
    ] {
        fs::create_dir_all(root.join(d))?;
    }

    let arch = kernel.spec.arch;
    let userland = guest_userland(kernel)?;
    let busybox = match (arch, &userland) {
        (Arch::Arm64, Some(u)) => u.join("bin/busybox"),
        _ => PathBuf::from("/bin/busybox"),
    };
    if !busybox.exists() {
        bail!(
            "{} is missing: run `cargo xtask setup` (apt package busybox-static)",
            busybox.display()
        );
    }

    copy_into(&root, &busybox, Path::new("bin/busybox"))?;
    let mut libs = copy_programs(&root, spec, arch, userland.as_deref())?;
    let packages = package_tree(kernel, spec, userland.is_none(), &mut libs)?;
    copy_libraries(&root, arch, userland.as_deref(), libs)?;
    if let Some(tree) = &packages {
        // Over what is there: the packages' files replace this machine's copies.
        crate::run(
            Command::new("cp")
                .args(["-a", "--remove-destination"])
                .arg(tree.join("."))
                .arg(&root),
        )?;
        crate::userland::check_libraries(tree, &root)?;
    }

    copy_files_and_modules(&root, kernel, spec)?;
    let data_tty = match arch {
        Arch::X86_64 => "/dev/ttyS1",
        Arch::Arm64 => "/dev/hvc0",
    };
    fs::write(root.join("init"), INIT.replace("@DATA@", data_tty))?;
    fs::set_permissions(root.join("init"), fs::Permissions::from_mode(0o755))?;
    fs::write(root.join("guest.sh"), &spec.script)?;
    pack_cpio(&root, &work.join("initramfs.cpio"))
}

/// The userland a kernel boots with, where it is not this machine's: a kernel of an older
/// Debian release boots with that release's (its C library and hackbench, from its packages),
/// an arm64 kernel with Debian 12's arm64 userland; the binaries under test are copied as they
/// are and must run with its libraries. busybox (static, no libraries) is this machine's on
/// x86_64: Debian 11's lacks the base64 that carries /out back.
fn guest_userland(kernel: &Kernel) -> Result<Option<PathBuf>> {
    Ok(if kernel.spec.arch == Arch::Arm64 {
        Some(crate::userland::arm64_guest()?)
    } else if kernel.spec.suite == Suite::Bullseye {
        Some(crate::userland::bullseye()?)
    } else {
        None
    })
}

/// Copies the spec's programs into `root/bin` (the guest userland's own where it has one of
/// that name) and checks each can run there; returns the libraries of this machine's they
/// need (where the guest runs on this machine's libraries).
fn copy_programs(
    root: &Path,
    spec: &VmSpec,
    arch: Arch,
    userland: Option<&Path>,
) -> Result<BTreeSet<PathBuf>> {
    let gnu_lib = format!("lib/{}-linux-gnu", arch.gnu());
    let mut libs = BTreeSet::new();
    for bin in &spec.bins {
        let name = bin
            .file_name()
            .ok_or_else(|| anyhow!("{}: not a file", bin.display()))?;
        // The guest's own (its userland's) stands in for a host program of the same name;
        // anything else must be built for the guest's architecture.
        let own = userland
            .map(|u| u.join("usr/bin").join(name))
            .filter(|p| p.is_file());
        if own.is_none() {
            if let Some(m) = elf_machine(bin) {
                if m != arch.elf_machine() {
                    bail!(
                        "{} is not built for {} (ELF machine {m}): the guest could not run it",
                        bin.display(),
                        arch.debian()
                    );
                }
            }
        }

        copy_into(
            root,
            own.as_deref().unwrap_or(bin),
            &Path::new("bin").join(name),
        )?;
        match userland {
            None => libs.extend(libraries(bin)?),
            Some(u) if own.is_none() => {
                // A binary of this machine's (or built for the guest's architecture) must
                // find every library it needs in the guest's.
                for lib in crate::userland::needed(bin)? {
                    let there = [u.join(&gnu_lib), u.join("lib64"), u.join("lib")]
                        .iter()
                        .any(|d| d.join(&lib).exists());
                    if !there {
                        bail!(
                            "{} needs {lib}, which the guest userland of this kernel ({}) lacks",
                            bin.display(),
                            u.display()
                        );
                    }
                }
            }
            Some(_) => {}
        }
    }
    Ok(libs)
}

/// The spec's packages' tree, unpacked (None without packages); where the guest runs on this
/// machine's libraries (`own_libraries`), theirs are added to `libs` (this machine runs the
/// same release).
fn package_tree(
    kernel: &Kernel,
    spec: &VmSpec,
    own_libraries: bool,
    libs: &mut BTreeSet<PathBuf>,
) -> Result<Option<PathBuf>> {
    if spec.packages.is_empty() {
        return Ok(None);
    }

    let arch = kernel.spec.arch;
    let suite = if arch == Arch::X86_64 && kernel.spec.suite == Suite::Bullseye {
        Suite::Bullseye
    } else {
        Suite::Host
    };
    let names: Vec<&str> = spec.packages.iter().map(String::as_str).collect();
    let tree = crate::userland::packages(suite, arch, &names)?;
    if own_libraries {
        for elf in crate::userland::elves(&tree) {
            libs.extend(libraries(&elf)?);
        }
    }
    Ok(Some(tree))
}

/// The libraries into `root`: this machine's that the programs need (`libs`), or the guest
/// userland's whole set.
fn copy_libraries(
    root: &Path,
    arch: Arch,
    userland: Option<&Path>,
    libs: BTreeSet<PathBuf>,
) -> Result<()> {
    let Some(u) = userland else {
        for lib in libs {
            copy_into(root, &lib, lib.strip_prefix("/").expect("absolute"))?;
        }

        return Ok(());
    };
    for rel in crate::userland::libraries(u, arch)? {
        let (src, dst) = (u.join(&rel), root.join(&rel));
        fs::create_dir_all(dst.parent().expect("has parent"))?;
        match fs::read_link(&src) {
            Ok(t) => std::os::unix::fs::symlink(t, &dst)?,
            Err(_) => {
                fs::copy(&src, &dst)
                    .with_context(|| format!("copy {} into the initramfs", src.display()))?;
            }
        }
    }
    Ok(())
}

/// The spec's files (into `/files`), the kernel's config (into `/boot`) and the spec's modules
/// with their load order (into `/lib/modules`).
fn copy_files_and_modules(root: &Path, kernel: &Kernel, spec: &VmSpec) -> Result<()> {
    if !spec.files.is_empty() {
        fs::create_dir_all(root.join("files"))?;
        for f in &spec.files {
            let name = f
                .file_name()
                .ok_or_else(|| anyhow!("{}: not a file", f.display()))?;
            fs::copy(f, root.join("files").join(name))
                .with_context(|| format!("copy {} into the initramfs", f.display()))?;
        }
    }

    fs::copy(
        &kernel.config,
        root.join("boot").join(format!("config-{}", kernel.release)),
    )?;
    if !spec.modules.is_empty() {
        let dir = root.join("lib/modules");
        fs::create_dir_all(&dir)?;
        let mut order = String::new();
        for m in &spec.modules {
            let name = m
                .file_name()
                .ok_or_else(|| anyhow!("{}: not a file", m.display()))?;
            fs::copy(m, dir.join(name))?;
            order.push_str(&format!("{}\n", name.to_string_lossy()));
        }

        fs::write(dir.join("order"), order)?;
    }
    Ok(())
}

/// The tree at `root` as a newc cpio archive at `cpio`.
fn pack_cpio(root: &Path, cpio: &Path) -> Result<PathBuf> {
    let list = crate::output(Command::new("find").arg(".").current_dir(root))?;
    let mut child = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(fs::File::create(cpio)?)
        .spawn()
        .context("run cpio (apt package cpio; `cargo xtask setup` installs it)")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(list.as_bytes())?;
    if !child.wait()?.success() {
        bail!("cpio failed building the initramfs");
    }
    Ok(cpio.to_path_buf())
}

/// Decodes the /out archive the guest sent over the second serial port into `out`.
fn unpack_data(data: &Path, out: &Path) -> Result<()> {
    let text = fs::read_to_string(data).unwrap_or_default();
    let Some(start) = text.find(DATA_BEGIN) else {
        bail!("the guest sent no /out archive");
    };
    let body = &text[start + DATA_BEGIN.len()..];
    let end = body
        .find(DATA_END)
        .ok_or_else(|| anyhow!("the /out archive from the guest is truncated"))?;
    let b64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
    let tar = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| anyhow!("the /out archive from the guest is corrupt: {e}"))?;
    fs::create_dir_all(out)?;
    let mut child = Command::new("tar")
        .args(["x", "-C"])
        .arg(out)
        .stdin(Stdio::piped())
        .spawn()
        .context("run tar")?;
    child.stdin.take().expect("piped").write_all(&tar)?;
    if !child.wait()?.success() {
        bail!("tar could not unpack the /out archive from the guest");
    }
    Ok(())
}

/// Boots `kernel` with `spec` and waits for the verdict. A boot that ends in an emulation
/// fault (see [`emulation_fault`]) is booted once more, saying so: it is QEMU's, not the
/// tracer's, and proves nothing either way.
pub fn run(kernel: &Kernel, spec: &VmSpec) -> Result<VmResult> {
    let first = run_once(kernel, spec)?;
    match emulation_fault(&first.console) {
        Some(line) if !first.success => {
            eprintln!(
                "[{}] vm: QEMU emulation fault, not the guest's (reserved RFLAGS bits set: {}); booting again",
                spec.name,
                line.trim()
            );
            let mut again = run_once(kernel, spec)?;
            again.emulation_faults.push(line.trim().to_string());
            Ok(again)
        }
        _ => Ok(first),
    }
}

/// The console line showing an emulation fault, if any: a register dump whose EFLAGS has
/// reserved bits set (22-31, or 1 clear), which no x86 CPU can hold. QEMU 7.2's TCG does this
/// now and then right after a `cmpxchg16b` (the slab allocator's per-CPU fast path): the
/// flags come back holding the low half of RAX, and the guest oopses or double-faults.
pub fn emulation_fault(console: &str) -> Option<&str> {
    console.lines().find(|l| {
        l.split("EFLAGS: ").nth(1).is_some_and(|v| {
            let hex: String = v.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
            u64::from_str_radix(&hex, 16).is_ok_and(|f| f & !0x3f_ffff != 0 || f & 2 == 0)
        })
    })
}

/// The emulated arm64 CPU: every feature (`max`), with QEMU's own pointer-authentication
/// algorithm instead of QARMA5, which is slow to emulate (Debian's kernels sign return
/// addresses in every function).
const ARM64_CPU: &str = "max,pauth-impdef=on";

/// One boot of [`run`]: the QEMU command, the boot watched on its console, its verdict and
/// what it sent back.
fn run_once(kernel: &Kernel, spec: &VmSpec) -> Result<VmResult> {
    // Before anything of the last run is removed.
    let qemu = qemu_program(kernel.spec.arch)?;
    let work = crate::workspace_root().join("target/vm").join(&spec.name);
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let cpio = initramfs(kernel, spec, &work)?;
    let data = work.join("data.b64");
    let log = work.join("console.log");
    let out_dir = work.join("out");
    let qmp = work.join("qmp.sock");
    let mut cmd = qemu_command(qemu, kernel, spec, &cpio, &data, &qmp)?;

    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {qemu}"))?;
    let lines = output_lines(&mut child);

    // NMIs once the guest's init runs: one that comes while the kernel is still setting up
    // its interrupt table resets the machine.
    let up = Arc::new(AtomicBool::new(false));
    let gone = Arc::new(AtomicBool::new(false));
    let nmis = spec.nmis.map(|every| {
        let (up, gone) = (up.clone(), gone.clone());
        thread::spawn(move || inject_nmis(&qmp, every, &up, &gone))
    });
    let mut logf = fs::File::create(&log)?;
    let boot = watch_boot(spec, &lines, &mut child, &mut logf, &up, start)?;
    let _ = child.wait();
    let elapsed = start.elapsed();
    gone.store(true, Ordering::Relaxed);
    if let Some(n) = nmis.and_then(|h| h.join().ok()) {
        writeln!(logf, "vm: {n} NMIs injected")?;
    }

    let mut failure = boot.failure.or(match boot.verdict {
        Some(true) => None,
        Some(false) => Some("the guest script failed".into()),
        None => Some("the guest ended without a verdict".into()),
    });
    if let Err(e) = unpack_data(&data, &out_dir) {
        failure.get_or_insert_with(|| format!("{e:#}"));
    }
    Ok(VmResult {
        success: failure.is_none(),
        failure,
        console: boot.console,
        log,
        out_dir,
        elapsed,
        emulation_faults: Vec::new(),
    })
}

/// QEMU for guests of `arch`, found.
fn qemu_program(arch: Arch) -> Result<&'static str> {
    let (qemu, package) = match arch {
        Arch::X86_64 => ("qemu-system-x86_64", "qemu-system-x86"),
        Arch::Arm64 => ("qemu-system-aarch64", "qemu-system-arm"),
    };
    if Command::new(qemu).arg("--version").output().is_err() {
        bail!("{qemu} is missing: run `cargo xtask setup` (apt package {package})");
    }
    Ok(qemu)
}

/// The accelerator and CPU model of `cmd`, a `qemu` booting `spec` on `arch`: TCG (with the
/// instruction-counted clock where asked for), or KVM where it runs the guest's architecture.
fn accelerate(cmd: &mut Command, qemu: &str, spec: &VmSpec, arch: Arch) -> Result<()> {
    match (spec.accel, arch) {
        (Accel::Tcg, _) => {
            let cpu = match arch {
                Arch::X86_64 => "max",
                Arch::Arm64 => ARM64_CPU,
            };
            cmd.args(["-accel", "tcg,thread=single", "-cpu", cpu]);

            // Guest time counted in instructions (`-icount`), where asked for.
            if let Some(shift) = spec.icount {
                cmd.args(["-icount", &format!("shift={shift}")]);
            }
        }
        (Accel::Kvm, _) if spec.icount.is_some() => {
            bail!("-icount needs TCG: drop --icount or use --accel tcg");
        }
        (Accel::Kvm, Arch::X86_64) => {
            cmd.args(["-accel", "kvm", "-cpu", "host"]);
        }
        (Accel::Kvm, Arch::Arm64) => {
            // KVM runs only this machine's architecture: another's is emulated.
            eprintln!(
                "[{}] vm: {qemu} under TCG (KVM runs only x86_64 guests here)",
                spec.name
            );
            cmd.args(["-accel", "tcg,thread=single", "-cpu", ARM64_CPU]);
        }
    }
    Ok(())
}

/// The command running `qemu` to boot `kernel` with initramfs `cpio` as `spec` says: `/out`
/// comes back in `data`; with injected NMIs, QMP listens on `qmp`.
fn qemu_command(
    qemu: &str,
    kernel: &Kernel,
    spec: &VmSpec,
    cpio: &Path,
    data: &Path,
    qmp: &Path,
) -> Result<Command> {
    let arch = kernel.spec.arch;
    let mut cmd = Command::new(qemu);
    accelerate(&mut cmd, qemu, spec, arch)?;

    // arm64: QEMU's generic board; its one UART is the console, and /out comes back over a
    // virtio console (the board has no second UART).
    let console = match arch {
        Arch::X86_64 => "ttyS0",
        Arch::Arm64 => {
            cmd.args(["-machine", "virt"]);
            "ttyAMA0"
        }
    };
    let mem = if spec.mem_mb == 0 { 1024 } else { spec.mem_mb }.to_string();
    let cpus = if spec.cpus == 0 { 2 } else { spec.cpus }.to_string();
    cmd.args(["-m", &mem, "-smp", &cpus])
        .args(["-display", "none", "-no-reboot", "-nodefaults"])
        .args(["-serial", "stdio"]);
    match arch {
        Arch::X86_64 => {
            cmd.arg("-serial").arg(format!("file:{}", data.display()));
        }
        Arch::Arm64 => {
            cmd.args(["-device", "virtio-serial-pci", "-chardev"])
                .arg(format!("file,id=data,path={}", data.display()))
                .args(["-device", "virtconsole,chardev=data"]);
        }
    }

    if spec.nmis.is_some() {
        if arch != Arch::X86_64 {
            bail!("injected NMIs are for x86_64 guests");
        }

        let _ = fs::remove_file(qmp);
        cmd.arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()));
    }

    // More QEMU arguments, for experiments (xtask/jit-profile.py passes its trace options).
    if let Ok(extra) = std::env::var("MEMCG_TRACE_QEMU_EXTRA") {
        cmd.args(extra.split_whitespace());
    }

    cmd.arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(cpio)
        .arg("-append")
        .arg(format!(
            "console={console} rdinit=/init panic=-1 quiet {}{}",
            kernel.spec.cmdline,
            // More kernel parameters, for experiments (xtask/jit-profile.py's `nokaslr`).
            std::env::var("MEMCG_TRACE_KERNEL_APPEND")
                .map(|a| format!(" {a}"))
                .unwrap_or_default()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Ok(cmd)
}

/// The lines `child` writes, its standard output's as they are and its standard error's
/// marked `qemu: `, in one channel, each stream read by a thread of its own.
fn output_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel::<String>();
    let streams: [(Box<dyn std::io::Read + Send>, &'static str); 2] = [
        (Box::new(child.stdout.take().expect("piped")), ""),
        (Box::new(child.stderr.take().expect("piped")), "qemu: "),
    ];
    for (stream, mark) in streams {
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(format!("{mark}{line}")).is_err() {
                    break;
                }
            }
        });
    }
    rx
}

/// What a boot's console said: every line, the guest script's verdict (`init: success` or
/// `init: failure`, if it came), and the failure seen on the way (a panic, an oops, the
/// timeout).
struct Boot {
    console: String,
    verdict: Option<bool>,
    failure: Option<String>,
}

/// Reads the guest's console from `lines` into `logf` (and stderr with `spec.echo`) until QEMU
/// ends, `spec.timeout` after `start` (then kills it), or 5 s after an oops; `up` is set once
/// the guest's init speaks.
fn watch_boot(
    spec: &VmSpec,
    lines: &mpsc::Receiver<String>,
    child: &mut Child,
    logf: &mut fs::File,
    up: &AtomicBool,
    start: Instant,
) -> Result<Boot> {
    let mut boot = Boot {
        console: String::new(),
        verdict: None,
        failure: None,
    };
    let mut oops_at: Option<Instant> = None;
    loop {
        if oops_at.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) {
            let _ = child.kill();
            break;
        }

        let Some(left) = spec.timeout.checked_sub(start.elapsed()) else {
            boot.failure = Some(format!("timed out after {:?}", spec.timeout));
            let _ = child.kill();
            break;
        };
        let line = match lines.recv_timeout(left.min(Duration::from_secs(1))) {
            Ok(line) => line.trim_end_matches('\r').to_string(),
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        if spec.echo {
            eprintln!("[{}] {line}", spec.name);
        }

        writeln!(logf, "{line}")?;
        if line.starts_with("init: ") {
            up.store(true, Ordering::Relaxed);
        }

        if line.contains("init: success") {
            boot.verdict = Some(true);
        } else if line.contains("init: failure") {
            boot.verdict = Some(false);
        }

        if line.contains("Kernel panic") {
            boot.failure
                .get_or_insert_with(|| "kernel panic".to_string());
        }

        // An oops is a failure whatever follows: the guest may hang instead of panicking.
        // Its report is let through for a few seconds, then the guest is stopped instead of
        // waiting for the timeout.
        if oops_at.is_none() && line.contains("Oops: ") {
            boot.failure
                .get_or_insert_with(|| "kernel oops".to_string());
            oops_at = Some(Instant::now());
        }

        boot.console.push_str(&line);
        boot.console.push('\n');
    }
    Ok(boot)
}

/// Injects an NMI (into the first vCPU) through QEMU's QMP socket `qmp` every `every`, from
/// when `up` until QEMU is gone (`gone`, or the socket closed); the number injected.
fn inject_nmis(qmp: &Path, every: Duration, up: &AtomicBool, gone: &AtomicBool) -> u64 {
    use Ordering::Relaxed;
    while !up.load(Relaxed) {
        if gone.load(Relaxed) {
            return 0;
        }

        thread::sleep(Duration::from_millis(10));
    }

    let started = Instant::now();
    let stream = loop {
        match std::os::unix::net::UnixStream::connect(qmp) {
            Ok(s) => break s,
            Err(_) if started.elapsed() < Duration::from_secs(60) => {
                thread::sleep(Duration::from_millis(100))
            }
            Err(_) => return 0,
        }
    };
    let Ok(writer) = stream.try_clone() else {
        return 0;
    };
    let (mut reader, mut writer) = (BufReader::new(stream), writer);

    // The greeting, then each command's answer, a line each.
    let mut greeting = String::new();
    if !reader.read_line(&mut greeting).is_ok_and(|n| n > 0) {
        return 0;
    }

    let mut ask = |command: &str| -> bool {
        let mut line = String::new();
        writeln!(writer, "{{\"execute\": \"{command}\"}}").is_ok()
            && reader.read_line(&mut line).is_ok_and(|n| n > 0)
    };
    if !ask("qmp_capabilities") {
        return 0;
    }

    let mut injected = 0;
    while ask("inject-nmi") {
        injected += 1;
        thread::sleep(every);
    }
    injected
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emulation_faults_are_told_from_real_oopses() {
        // Seen under QEMU 7.2: RFLAGS holding RAX's low half after cmpxchg16b.
        let faulty = "[   30.1] RSP: 0018:ff7f7686c06a7870 EFLAGS: 6132ae42\n";
        assert!(emulation_fault(faulty).is_some());
        let faulty =
            "[   63.4] RSP: 002b:00007fffb77dda48 EFLAGS: a5d80202 ORIG_RAX: 0000000000000001";
        assert!(emulation_fault(faulty).is_some());

        // A real oops: flags a CPU can hold (IF, ZF, PF, AC, the always-one bit).
        let real = "RSP: 0018:ffffc90000abbd08 EFLAGS: 00010246\nRSP: 002b:00007ffd827d59a8 EFLAGS: 00040202 ORIG_RAX: 0000000000000001";
        assert_eq!(emulation_fault(real), None);
        assert_eq!(
            emulation_fault("EFLAGS: 00000000"),
            Some("EFLAGS: 00000000")
        );
        assert_eq!(emulation_fault("no registers here"), None);
    }
}
