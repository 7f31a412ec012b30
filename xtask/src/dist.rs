//! `cargo xtask dist`: what a user installs without our toolchain. For x86_64 and arm64, a
//! tarball (`memcg-trace-<version>-<arch>-linux-gnu.tar.gz`: the portable binary, its man
//! pages and shell completions made from its own command line, the systemd unit and the
//! Prometheus rules, the README) and a Debian package (`memcg-trace_<version>_<arch>.deb`:
//! the same in Debian's places, the unit installed disabled, depending on libc6 >= 2.31 only,
//! the binary's C library floor), with their SHA256SUMS, in `target/dist/`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{build_release_for, kernels::Arch, run, workspace_root};

/// The version of the workspace (every crate shares it).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The oldest C library the binary runs with (it is linked against Debian 11's).
pub const GLIBC_FLOOR: &str = "2.31";

/// What `dist` made.
pub struct Dist {
    /// Tarballs, then packages.
    pub files: Vec<PathBuf>,
    /// The directory they are in, with SHA256SUMS.
    pub dir: PathBuf,
}

/// Debian's name of an architecture.
pub fn deb_arch(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "amd64",
        Arch::Arm64 => "arm64",
    }
}

/// The GNU triple's first part.
fn triple_arch(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "x86_64",
        Arch::Arm64 => "aarch64",
    }
}

/// The tarball of `arch`.
pub fn tarball_name(arch: Arch) -> String {
    format!(
        "memcg-trace-{VERSION}-{}-linux-gnu.tar.gz",
        triple_arch(arch)
    )
}

/// The package of `arch`.
pub fn deb_name(arch: Arch) -> String {
    format!("memcg-trace_{VERSION}_{}.deb", deb_arch(arch))
}

/// Builds both architectures and packages them into `target/dist/`.
pub fn dist() -> Result<Dist> {
    let root = workspace_root();
    let out = root.join("target/dist");
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;

    // Man pages and completions from this machine's binary: the command line is the same on
    // every architecture.
    let host = build_release_for(Arch::X86_64)?;
    let generated = out.join("generated");
    run(Command::new(&host).arg("generate").arg(&generated))
        .context("generate the man pages and completions")?;
    let mut files = Vec::new();
    for arch in [Arch::X86_64, Arch::Arm64] {
        let bin = build_release_for(arch)?;
        files.push(tarball(&out, arch, &bin, &generated)?);
        files.push(deb(&out, arch, &bin, &generated)?);
    }

    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let sums = Command::new("sha256sum")
        .current_dir(&out)
        .args(&names)
        .output()
        .context("sha256sum")?;
    if !sums.status.success() {
        bail!(
            "sha256sum failed: {}",
            String::from_utf8_lossy(&sums.stderr)
        );
    }

    fs::write(out.join("SHA256SUMS"), &sums.stdout)?;
    let _ = fs::remove_dir_all(&generated);
    Ok(Dist { files, dir: out })
}

/// The unit as a package installs it: the binary in /usr/bin.
fn packaged_unit() -> Result<String> {
    let unit = fs::read_to_string(workspace_root().join("contrib/memcg-trace.service"))?;
    Ok(unit.replace("/usr/local/bin/memcg-trace", "/usr/bin/memcg-trace"))
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    if let Some(d) = to.parent() {
        fs::create_dir_all(d)?;
    }

    fs::copy(from, to).with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    Ok(())
}

fn write(to: &Path, text: &str) -> Result<()> {
    if let Some(d) = to.parent() {
        fs::create_dir_all(d)?;
    }

    fs::write(to, text).with_context(|| format!("write {}", to.display()))
}

/// The completions made (`generate`'s names) and where each goes: in the tarball (under
/// `share/`) and in the package (under `usr/share/`, Debian's places).
const COMPLETIONS: [(&str, &str, &str); 3] = [
    (
        "memcg-trace.bash",
        "bash-completion/completions/memcg-trace",
        "bash-completion/completions/memcg-trace",
    ),
    (
        "_memcg-trace",
        "zsh/site-functions/_memcg-trace",
        "zsh/vendor-completions/_memcg-trace",
    ),
    (
        "memcg-trace.fish",
        "fish/vendor_completions.d/memcg-trace.fish",
        "fish/vendor_completions.d/memcg-trace.fish",
    ),
];

/// Every man page made, with its file name.
fn man_pages(generated: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut pages: Vec<(String, PathBuf)> = fs::read_dir(generated.join("man/man1"))?
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    pages.sort();
    if pages.is_empty() {
        bail!("no man page was generated");
    }
    Ok(pages)
}

/// Files in the same order, owned by root, dated to the commit: the same tree gives the same
/// archive.
fn tar_gz(out: &Path, name: &str, dir: &Path, top: &str) -> Result<PathBuf> {
    let path = out.join(name);
    run(Command::new("tar")
        .current_dir(dir)
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-czf",
        ])
        .arg(&path)
        .arg(top))?;
    Ok(path)
}

fn tarball(out: &Path, arch: Arch, bin: &Path, generated: &Path) -> Result<PathBuf> {
    let root = workspace_root();
    let top = format!("memcg-trace-{VERSION}-{}-linux-gnu", triple_arch(arch));
    let stage = out.join(format!("stage-{}", triple_arch(arch)));
    let top_dir = stage.join(&top);
    copy(bin, &top_dir.join("bin/memcg-trace"))?;
    for (name, page) in man_pages(generated)? {
        copy(&page, &top_dir.join("share/man/man1").join(name))?;
    }

    for (made, at, _) in COMPLETIONS {
        copy(
            &generated.join("completions").join(made),
            &top_dir.join("share").join(at),
        )?;
    }

    copy(
        &root.join("contrib/memcg-trace.service"),
        &top_dir.join("contrib/memcg-trace.service"),
    )?;
    for f in ["memcg-trace.rules.yml", "memcg-trace.rules.test.yml"] {
        copy(
            &root.join("contrib/prometheus").join(f),
            &top_dir.join("contrib/prometheus").join(f),
        )?;
    }

    copy(&root.join("README.md"), &top_dir.join("README.md"))?;
    copy(&root.join("CHANGELOG.md"), &top_dir.join("CHANGELOG.md"))?;
    for f in LICENSES {
        copy(&root.join(f), &top_dir.join(f))?;
    }

    let path = tar_gz(out, &tarball_name(arch), &stage, &top)?;
    fs::remove_dir_all(&stage)?;
    Ok(path)
}

/// The license files, at the top of the workspace: the tracer is MIT or Apache-2.0, its eBPF
/// programs (inside the binary) MIT or GPL-2.0, the license they declare to the kernel.
const LICENSES: &[&str] = &["LICENSE-MIT", "LICENSE-APACHE", "LICENSE-GPL-2.0"];

/// The package's `copyright`, in Debian's machine-readable format: the MIT text in full, the
/// Apache and GPL texts by their place on every Debian system.
fn copyright() -> Result<String> {
    let mit = fs::read_to_string(workspace_root().join("LICENSE-MIT"))?;
    let indented: String = mit
        .lines()
        .map(|l| {
            if l.is_empty() {
                " .\n".to_string()
            } else {
                format!(" {l}\n")
            }
        })
        .collect();
    Ok(format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: memcg-trace\n\
         \n\
         Files: *\n\
         Copyright: 2026 the memcg-trace developers\n\
         License: MIT or Apache-2.0\n\
         Comment: the eBPF programs inside the binary are MIT or GPL-2.0 (they declare\n \
         \"Dual MIT/GPL\" to the kernel).\n\
         \n\
         License: MIT\n{indented}\
         \n\
         License: Apache-2.0\n \
         On Debian systems the full text of the Apache License, Version 2.0, is in\n \
         /usr/share/common-licenses/Apache-2.0.\n\
         \n\
         License: GPL-2.0\n \
         On Debian systems the full text of the GNU General Public License, version 2,\n \
         is in /usr/share/common-licenses/GPL-2.\n"
    ))
}

/// gzip -9n: Debian compresses man pages and changelogs, without a time stamp.
fn gzip_to(from: &Path, to: &Path) -> Result<()> {
    if let Some(d) = to.parent() {
        fs::create_dir_all(d)?;
    }

    let gz = Command::new("gzip")
        .args(["-9n", "-c"])
        .arg(from)
        .output()
        .context("gzip")?;
    if !gz.status.success() {
        bail!(
            "gzip {}: {}",
            from.display(),
            String::from_utf8_lossy(&gz.stderr)
        );
    }

    fs::write(to, gz.stdout)?;
    Ok(())
}

fn deb(out: &Path, arch: Arch, bin: &Path, generated: &Path) -> Result<PathBuf> {
    let root = workspace_root();
    let stage = out.join(format!("deb-{}", deb_arch(arch)));
    copy(bin, &stage.join("usr/bin/memcg-trace"))?;
    for (name, page) in man_pages(generated)? {
        gzip_to(
            &page,
            &stage.join("usr/share/man/man1").join(format!("{name}.gz")),
        )?;
    }

    for (made, _, at) in COMPLETIONS {
        copy(
            &generated.join("completions").join(made),
            &stage.join("usr/share").join(at),
        )?;
    }

    // Installed, not enabled: serving figures is the administrator's choice.
    write(
        &stage.join("lib/systemd/system/memcg-trace.service"),
        &packaged_unit()?,
    )?;
    let doc = stage.join("usr/share/doc/memcg-trace");
    write(&doc.join("copyright"), &copyright()?)?;
    copy(&root.join("README.md"), &doc.join("README.md"))?;
    gzip_to(&root.join("CHANGELOG.md"), &doc.join("changelog.gz"))?;
    for f in ["memcg-trace.rules.yml", "memcg-trace.rules.test.yml"] {
        copy(
            &root.join("contrib/prometheus").join(f),
            &doc.join("prometheus").join(f),
        )?;
    }

    let size_kib = du_kib(&stage)?;
    write(
        &stage.join("DEBIAN/control"),
        &format!(
            "Package: memcg-trace\n\
             Version: {VERSION}\n\
             Architecture: {}\n\
             Maintainer: memcg-trace developers <memcg-trace@localhost>\n\
             Installed-Size: {size_kib}\n\
             Depends: libc6 (>= {GLIBC_FLOOR})\n\
             Section: devel\n\
             Priority: optional\n\
             Description: live eBPF tracer of the memory-cgroup charging hot paths\n \
             Shows, while a benchmark runs, how long each memcg charging function\n \
             (obj_cgroup_charge, mod_memcg_state, the rstat update) takes, how often it\n \
             runs and in which context, with A/B verdicts, plots and a Prometheus endpoint.\n",
            deb_arch(arch)
        ),
    )?;
    let path = out.join(deb_name(arch));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&stage)
        .arg(&path))?;
    fs::remove_dir_all(&stage)?;
    Ok(path)
}

/// The size of a tree in KiB, as Installed-Size counts it.
fn du_kib(dir: &Path) -> Result<u64> {
    let o = Command::new("du")
        .args(["-sk", "--apparent-size"])
        .arg(dir)
        .output()
        .context("du")?;
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("du's output")
}

/// What a guest needs to install and read a package: dpkg (with GNU tar, which dpkg-deb runs,
/// and ldconfig and start-stop-daemon, which dpkg wants in PATH as root), man-db with groff,
/// and the libraries of them all; and the whole C library package, as every Debian system has
/// it (a guest otherwise carries only the libraries its programs load: the portable binary
/// needs glibc 2.31's libdl.so.2, which 2.34 and later keep as a stub). The same names in
/// Debian 11 and 12.
const GUEST_PACKAGES: &[&str] = &[
    "libc6",
    "dpkg",
    "tar",
    "libc-bin",
    "libbz2-1.0",
    "liblzma5",
    "libmd0",
    "libselinux1",
    "libpcre2-8-0",
    "libzstd1",
    "zlib1g",
    "libacl1",
    "man-db",
    "groff-base",
    "bsdextrautils",
    "libsmartcols1",
    "libtinfo6",
    "libgdbm6",
    "libpipeline1",
    "libseccomp2",
    "libuchardet0",
    "libstdc++6",
    "libgcc-s1",
];

/// The guest's side of [`check_in_guests`]: register the C library the guest has as the
/// package it came from (read from the library itself), install the package with dpkg (which
/// checks its dependency on it), then use what it installed as a user would, and run the
/// tarball's binary.
///
/// dpkg and man by their paths: the guest's shell (busybox) runs its own applets of those
/// names before anything in PATH.
const GUEST_SCRIPT: &str = r#"export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mkdir -p /var/lib/dpkg/info /var/lib/dpkg/updates /var/lib/dpkg/triggers /var/log
: > /var/lib/dpkg/available
libc=$(ls /lib/*-linux-gnu/libc.so.6 | head -n 1)
v=$("$libc" | sed -n '1s/.*(Debian GLIBC \([^)]*\)).*/\1/p')
[ -n "$v" ] || { echo "guest: no Debian version in $libc's banner"; exit 1; }
printf 'Package: libc6\nStatus: install ok installed\nPriority: optional\nSection: libs\nMaintainer: the guest\nArchitecture: @ARCH@\nMulti-Arch: same\nVersion: %s\nDescription: the C library the guest has\n\n' "$v" > /var/lib/dpkg/status
echo "$libc" > /var/lib/dpkg/info/libc6:@ARCH@.list
echo "guest: libc6 $v"
/usr/bin/dpkg -i /files/@DEB@ 2>&1 | tee /out/dpkg.txt
/usr/bin/dpkg -s memcg-trace | tee -a /out/dpkg.txt | grep -q '^Status: install ok installed'
command -v memcg-trace
memcg-trace --version | tee /out/version.txt
MANWIDTH=80 MAN_DISABLE_SECCOMP=1 /usr/bin/man -l -P cat /usr/share/man/man1/memcg-trace-record.1.gz > /out/man.txt
grep -q -- '--duration' /out/man.txt
memcg-trace record -p stat -o /out/record.json -- hackbench -g 1 -l 10 > /out/record.txt
mkdir /tmp/tarball
/bin/tar -xzf /files/@TARBALL@ -C /tmp/tarball
/tmp/tarball/*/bin/memcg-trace --version | tee /out/tarball-version.txt
"#;

/// The guests a user's machines stand for, each with its own userland: Debian 11's (the 5.10
/// kernel) and Debian 12's on x86_64, Debian 12's on arm64.
pub const GUESTS: &[(&str, Arch)] = &[
    ("5.10", Arch::X86_64),
    ("6.12", Arch::X86_64),
    ("6.12", Arch::Arm64),
];

/// Installs each architecture's package in VM guests with that architecture's Debian userlands
/// ([`GUESTS`]) and checks there what the package installed: `--version`, `man -l` of a page,
/// a short `record`, and the tarball's binary (the VM matrix checks `probes`). Each guest's files come back
/// in its out directory; a failure shows the end of the guest's console.
pub fn check_in_guests(d: &Dist, accel: crate::vm::Accel) -> Result<()> {
    let hackbench = crate::hackbench()?;

    // Two guests at a time (each boot is one host thread under TCG), the longest (arm64, the
    // last) first.
    let queue = std::sync::Mutex::new(GUESTS.to_vec());
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    while let Some((short, arch)) = queue.lock().expect("queue").pop() {
                        out.push(check_in_guest(d, accel, &hackbench, short, arch));
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a guest check panicked"))
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(())
}

/// [`check_in_guests`] for one guest: the `short` kernel of `arch`.
fn check_in_guest(
    d: &Dist,
    accel: crate::vm::Accel,
    hackbench: &Path,
    short: &str,
    arch: Arch,
) -> Result<()> {
    let spec = crate::kernels::select_for(short, Some(arch))?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no {short} kernel for {}", arch.debian()))?;
    let kernel = crate::kernels::fetch(spec)?;
    let script = GUEST_SCRIPT
        .replace("@ARCH@", deb_arch(arch))
        .replace("@DEB@", &deb_name(arch))
        .replace("@TARBALL@", &tarball_name(arch));
    let guest = crate::vm::run(
        &kernel,
        &crate::vm::VmSpec {
            name: format!("{}-dist", spec.short),
            script,
            // The guest userland's own stands in for this machine's where it has one.
            bins: vec![hackbench.to_path_buf()],
            accel,
            timeout: std::time::Duration::from_secs(600),
            echo: false,
            modules: Vec::new(),
            mem_mb: 0,
            cpus: 0,
            icount: None,
            packages: GUEST_PACKAGES.iter().map(|s| s.to_string()).collect(),
            files: vec![d.dir.join(deb_name(arch)), d.dir.join(tarball_name(arch))],
            nmis: None,
        },
    )?;
    if !guest.success {
        bail!(
            "installing {} in the {} guest failed: {}\n--- last console lines ({}) ---\n{}",
            deb_name(arch),
            spec.short,
            guest.failure.clone().unwrap_or_default(),
            guest.log.display(),
            guest.tail(40)
        );
    }

    let version = fs::read_to_string(guest.out_dir.join("version.txt")).unwrap_or_default();
    let tarball = fs::read_to_string(guest.out_dir.join("tarball-version.txt")).unwrap_or_default();
    if !version.contains(VERSION) || version != tarball {
        bail!(
            "the {} guest: the package's binary says {version:?}, the tarball's {tarball:?}",
            spec.short
        );
    }

    let rec = fs::read_to_string(guest.out_dir.join("record.json")).unwrap_or_default();
    if !rec.contains("\"probes\"") {
        bail!("the {} guest's recording: {rec:.200}", spec.short);
    }

    eprintln!(
        "dist: {} installed and run in the {} {} guest ({:.0} s; files in {})",
        deb_name(arch),
        spec.short,
        arch.debian(),
        guest.elapsed.as_secs_f64(),
        guest.out_dir.display()
    );
    Ok(())
}
