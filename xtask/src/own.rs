//! A kernel the user built (`--kernel-image PATH`): its image and `.config`, checked before it
//! is booted, so that a missing option is one line saying what will not work rather than a
//! guest that hangs or a tracer that cannot load.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::kernels::{Arch, Kernel, KernelSpec, Suite};

/// What a kernel option is needed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The VM cannot boot, or memcg-trace cannot load at all: the kernel is not booted.
    Refuse,
    /// Part of memcg-trace will not work there (said; the kernel is booted).
    Warn,
}

/// One option the check looks for, and what is lost without it.
struct Wanted {
    /// The option, without `CONFIG_`.
    option: &'static str,
    /// Only on this architecture (None: on every one).
    arch: Option<Arch>,
    need: Need,
    /// What does not work without it.
    without: &'static str,
}

/// What the VM and memcg-trace need from a kernel's configuration. Built in (`=y`): the guest
/// loads no module of a kernel given by path.
const WANTED: &[Wanted] = &[
    Wanted {
        option: "BPF_SYSCALL",
        arch: None,
        need: Need::Refuse,
        without: "no bpf() system call: no program can be loaded",
    },
    Wanted {
        option: "DEBUG_INFO_BTF",
        arch: None,
        need: Need::Refuse,
        without: "no kernel BTF (/sys/kernel/btf/vmlinux): memcg-trace's programs cannot be loaded",
    },
    Wanted {
        option: "MEMCG",
        arch: None,
        need: Need::Refuse,
        without: "no memory cgroup controller: there is no charge path to trace",
    },
    Wanted {
        option: "BLK_DEV_INITRD",
        arch: None,
        need: Need::Refuse,
        without: "no initramfs support: the VM's userland cannot be started",
    },
    Wanted {
        option: "BINFMT_ELF",
        arch: None,
        need: Need::Refuse,
        without: "no ELF binaries: nothing in the VM can run",
    },
    Wanted {
        option: "BINFMT_SCRIPT",
        arch: None,
        need: Need::Refuse,
        without: "no #! scripts: the VM's init (a script) cannot start",
    },
    Wanted {
        option: "DEVTMPFS",
        arch: None,
        need: Need::Refuse,
        without: "no devtmpfs: the VM's init cannot mount /dev",
    },
    Wanted {
        option: "SERIAL_8250_CONSOLE",
        arch: Some(Arch::X86_64),
        need: Need::Refuse,
        without: "no 8250 serial console: the VM says nothing and sends no results back",
    },
    Wanted {
        option: "SERIAL_AMBA_PL011_CONSOLE",
        arch: Some(Arch::Arm64),
        need: Need::Refuse,
        without: "no PL011 serial console: the VM says nothing",
    },
    Wanted {
        option: "VIRTIO_CONSOLE",
        arch: Some(Arch::Arm64),
        need: Need::Refuse,
        without: "no virtio console: the VM cannot send its results back",
    },
    Wanted {
        option: "VIRTIO_PCI",
        arch: Some(Arch::Arm64),
        need: Need::Refuse,
        without: "no virtio PCI: the VM cannot send its results back",
    },
    Wanted {
        option: "PCI_HOST_GENERIC",
        arch: Some(Arch::Arm64),
        need: Need::Refuse,
        without: "no generic PCI host (qemu's virt board): the VM's virtio console is never found",
    },
    Wanted {
        option: "BPF_EVENTS",
        arch: None,
        need: Need::Warn,
        without: "no kprobe or tracepoint programs: the kprobe backend, the tracepoint counts and the calibration do not work",
    },
    Wanted {
        option: "KPROBES",
        arch: None,
        need: Need::Warn,
        without: "no kprobes: the kprobe backend does not work (auto takes fentry, where it can)",
    },
    Wanted {
        option: "KPROBE_EVENTS",
        arch: None,
        need: Need::Warn,
        without: "no kprobe events: the kprobe backend does not work",
    },
    Wanted {
        option: "BPF_JIT",
        arch: None,
        need: Need::Warn,
        without: "no BPF JIT: fentry/fexit (BPF trampolines) do not work",
    },
    Wanted {
        option: "DYNAMIC_FTRACE_WITH_DIRECT_CALLS",
        arch: None,
        need: Need::Warn,
        without: "no ftrace direct calls: fentry/fexit (BPF trampolines) do not attach; auto takes kprobe",
    },
    Wanted {
        option: "KALLSYMS",
        arch: None,
        need: Need::Warn,
        without: "no /proc/kallsyms: call sites (--callers) are not named and the probes' functions are found by BTF alone",
    },
    Wanted {
        option: "FUNCTION_GRAPH_TRACER",
        arch: None,
        need: Need::Warn,
        without: "no function_graph tracer: the oracle tests' independent durations cannot be taken",
    },
];

/// A missing option: `CONFIG_X`, whether the kernel is refused, what does not work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub option: String,
    pub need: Need,
    pub without: &'static str,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is not set: {}", self.option, self.without)
    }
}

/// The options of `arch` that `config` (a kernel `.config`) does not build in.
pub fn check_config(config: &str, arch: Arch) -> Vec<Missing> {
    let set = |o: &str| {
        config
            .lines()
            .any(|l| l.trim_end() == format!("CONFIG_{o}=y"))
    };
    WANTED
        .iter()
        .filter(|w| w.arch.is_none_or(|a| a == arch))
        .filter(|w| !set(w.option))
        .map(|w| Missing {
            option: format!("CONFIG_{}", w.option),
            need: w.need,
            without: w.without,
        })
        .collect()
}

/// The architecture an image is for, by its boot header: x86's `HdrS`, arm64's `ARM\x64` (an
/// Image). None: not told (a gzipped Image, an EFI zboot image, which other architectures
/// share).
pub fn image_arch(image: &[u8]) -> Option<Arch> {
    if image.get(0x202..0x206) == Some(b"HdrS") {
        Some(Arch::X86_64)
    } else if image.get(0x38..0x3c) == Some(b"ARM\x64") {
        Some(Arch::Arm64)
    } else {
        None
    }
}

/// The architecture a kernel config is for (`CONFIG_X86_64=y`, `CONFIG_ARM64=y`).
pub fn config_arch(config: &str) -> Option<Arch> {
    config.lines().find_map(|l| match l.trim_end() {
        "CONFIG_X86_64=y" => Some(Arch::X86_64),
        "CONFIG_ARM64=y" => Some(Arch::Arm64),
        _ => None,
    })
}

/// The release (`uname -r`) an image says it is: an x86 bzImage, the first word of the version
/// string its boot header points to (`kernel_version`, at 0x20e, relative to 0x200); an
/// uncompressed image (arm64's Image), the word after the kernel's own `Linux version `.
pub fn image_release(image: &[u8]) -> Option<String> {
    let word = |s: &[u8]| -> Option<String> {
        let end = s.iter().position(|b| *b == 0 || *b == b' ')?;
        let r = std::str::from_utf8(&s[..end]).ok()?;
        (!r.is_empty() && r.chars().next()?.is_ascii_digit()).then(|| r.to_string())
    };
    if image_arch(image) == Some(Arch::X86_64) {
        let at = u16::from_le_bytes(image.get(0x20e..0x210)?.try_into().ok()?) as usize;
        return (at != 0).then(|| word(image.get(at + 0x200..)?)).flatten();
    }

    let key = b"Linux version ";
    image
        .windows(key.len())
        .enumerate()
        .filter(|(_, w)| *w == key)
        .find_map(|(i, _)| word(&image[i + key.len()..]))
}

/// The configuration that goes with `image`: `config` if given, else a `.config` or `config`
/// beside it, `config-<release>` beside it (the /boot layout), or the `.config` of the kernel
/// tree it was built in (`arch/*/boot/<image>`).
pub fn find_config(image: &Path, release: Option<&str>) -> Result<PathBuf> {
    let dir = image.parent().unwrap_or(Path::new("."));
    let mut candidates = vec![dir.join(".config"), dir.join("config")];
    if let Some(r) = release {
        candidates.push(dir.join(format!("config-{r}")));
    }

    // A kernel tree's arch/<arch>/boot/<image>.
    let arch_dir = dir
        .parent()
        .filter(|_| dir.file_name() == Some("boot".as_ref()));
    if let Some(tree) = arch_dir
        .filter(|a| a.parent().and_then(Path::file_name) == Some("arch".as_ref()))
        .and_then(Path::parent)
        .and_then(Path::parent)
    {
        candidates.push(tree.join(".config"));
    }
    candidates
        .iter()
        .find(|c| c.is_file())
        .cloned()
        .ok_or_else(|| {
            anyhow!(
                "no kernel config beside {} (looked for {}): give it with --kernel-config",
                image.display(),
                candidates
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// The architecture of kernel image `image` (its bytes `bytes`, its config at `config` with text
/// `text`): its header's and its config's, which must agree with each other and with `arch`,
/// the one asked for (`--arch`), which decides where neither says.
fn image_architecture(
    image: &Path,
    bytes: &[u8],
    config: &Path,
    text: &str,
    arch: Option<Arch>,
) -> Result<Arch> {
    let found = match (image_arch(bytes), config_arch(text)) {
        (Some(a), Some(c)) if a != c => bail!(
            "--kernel-image {} is an {} image, its config {} is for {}",
            image.display(),
            a.gnu(),
            config.display(),
            c.gnu()
        ),
        (a, c) => a.or(c),
    };
    Ok(match (found, arch) {
        (Some(a), Some(b)) if a != b => bail!(
            "--kernel-image {} is an {} image, not {}",
            image.display(),
            a.gnu(),
            b.gnu()
        ),
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => bail!(
            "cannot tell the architecture of {} (neither its header nor its config says): give --arch",
            image.display()
        ),
    })
}

/// A kernel the user built, ready to boot: `image` (bzImage or vmlinuz; an arm64 Image), its
/// `config` (found beside it if not given) and its architecture (from the image, else from the
/// config; `arch`, where given, must agree). Refused, before anything boots, when its
/// configuration lacks what the VM or memcg-trace cannot do without; what else it lacks is in
/// the returned warnings.
pub fn own_kernel(
    image: &Path,
    config: Option<&Path>,
    arch: Option<Arch>,
) -> Result<(Kernel, Vec<Missing>)> {
    let bytes = fs::read(image).with_context(|| format!("--kernel-image {}", image.display()))?;
    let release = image_release(&bytes);
    let config = match config {
        Some(c) => c.to_path_buf(),
        None => find_config(image, release.as_deref())?,
    };
    let text = fs::read_to_string(&config)
        .with_context(|| format!("kernel config {}", config.display()))?;
    if !text.lines().any(|l| l.starts_with("CONFIG_")) {
        bail!(
            "{} is not a kernel config (no CONFIG_ line)",
            config.display()
        );
    }

    let arch = image_architecture(image, &bytes, &config, &text, arch)?;
    let missing = check_config(&text, arch);
    let refused: Vec<String> = missing
        .iter()
        .filter(|m| m.need == Need::Refuse)
        .map(ToString::to_string)
        .collect();
    if !refused.is_empty() {
        bail!(
            "not booting {}: {} ({})",
            image.display(),
            refused.join("; "),
            config.display()
        );
    }

    let release = release.unwrap_or_else(|| "own".to_string());

    // Leaked once per run: a spec's names live as long as the program.
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let spec = KernelSpec {
        short: "own",
        arch,
        release: leak(release.clone()),
        packages: &[],
        suite: Suite::Host,
        cmdline: "",
        series: "",
    };
    Ok((
        Kernel {
            spec,
            release,
            vmlinuz: image.to_path_buf(),
            config,
        },
        missing
            .into_iter()
            .filter(|m| m.need == Need::Warn)
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = "CONFIG_X86_64=y\nCONFIG_BPF_SYSCALL=y\nCONFIG_DEBUG_INFO_BTF=y\nCONFIG_MEMCG=y\nCONFIG_BLK_DEV_INITRD=y\nCONFIG_BINFMT_ELF=y\nCONFIG_BINFMT_SCRIPT=y\nCONFIG_DEVTMPFS=y\nCONFIG_SERIAL_8250_CONSOLE=y\nCONFIG_BPF_EVENTS=y\nCONFIG_KPROBES=y\nCONFIG_KPROBE_EVENTS=y\nCONFIG_BPF_JIT=y\nCONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS=y\nCONFIG_KALLSYMS=y\nCONFIG_FUNCTION_GRAPH_TRACER=y\n";

    #[test]
    fn a_config_with_everything_lacks_nothing_and_each_gap_is_one_line() {
        assert_eq!(check_config(FULL, Arch::X86_64), Vec::new());
        let no_btf = FULL.replace(
            "CONFIG_DEBUG_INFO_BTF=y",
            "# CONFIG_DEBUG_INFO_BTF is not set",
        );
        let missing = check_config(&no_btf, Arch::X86_64);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert_eq!(missing[0].need, Need::Refuse);
        assert!(missing[0]
            .to_string()
            .starts_with("CONFIG_DEBUG_INFO_BTF is not set: "));
        // A module is not built in: the guest loads none.
        let kprobes_m = FULL.replace("CONFIG_KPROBES=y", "CONFIG_KPROBES=m");
        let m = check_config(&kprobes_m, Arch::X86_64);
        assert_eq!((m.len(), m[0].need), (1, Need::Warn), "{m:?}");

        // arm64 needs its own console options, not x86's.
        let m = check_config(FULL, Arch::Arm64);
        let names: Vec<&str> = m.iter().map(|m| m.option.as_str()).collect();
        assert_eq!(
            names,
            [
                "CONFIG_SERIAL_AMBA_PL011_CONSOLE",
                "CONFIG_VIRTIO_CONSOLE",
                "CONFIG_VIRTIO_PCI",
                "CONFIG_PCI_HOST_GENERIC"
            ]
        );
    }

    #[test]
    fn an_image_tells_its_architecture_and_release() {
        let mut bz = vec![0u8; 0x400];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        bz[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
        let v = b"6.12.117+deb12-amd64 (debian-kernel@lists.debian.org) #1 SMP\0";
        bz[0x300..0x300 + v.len()].copy_from_slice(v);
        assert_eq!(image_arch(&bz), Some(Arch::X86_64));
        assert_eq!(image_release(&bz).as_deref(), Some("6.12.117+deb12-amd64"));
        let mut image = vec![0u8; 0x100];
        image[0x38..0x3c].copy_from_slice(b"ARM\x64");
        assert_eq!(image_arch(&image), Some(Arch::Arm64));
        image
            .extend_from_slice(b"%s Linux version %s\0Linux version 6.12.117+deb12-arm64 (x) #1\0");
        assert_eq!(
            image_release(&image).as_deref(),
            Some("6.12.117+deb12-arm64")
        );
        assert_eq!(image_arch(&[0x1f, 0x8b, 8, 0]), None);
        assert_eq!(config_arch(FULL), Some(Arch::X86_64));
        assert_eq!(config_arch("CONFIG_ARM64=y\n"), Some(Arch::Arm64));
        assert_eq!(config_arch("# CONFIG_ARM64 is not set\n"), None);
        assert_eq!(image_release(&[0u8; 16]), None);
    }

    #[test]
    fn a_config_without_btf_is_refused_before_booting_and_a_missing_config_is_asked_for() {
        let dir = std::env::temp_dir().join(format!("memcg-trace-own-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let image = dir.join("bzImage");
        let mut bz = vec![0u8; 0x400];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        fs::write(&image, &bz).unwrap();
        let err = own_kernel(&image, None, None).unwrap_err().to_string();
        assert!(
            err.contains("--kernel-config") && !err.contains('\n'),
            "{err}"
        );
        fs::write(
            dir.join(".config"),
            FULL.replace("CONFIG_DEBUG_INFO_BTF=y\n", ""),
        )
        .unwrap();
        let err = own_kernel(&image, None, None).unwrap_err().to_string();
        assert!(
            err.starts_with("not booting ") && err.contains("CONFIG_DEBUG_INFO_BTF is not set"),
            "{err}"
        );
        let e = own_kernel(&image, None, Some(Arch::Arm64))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is an x86_64 image, not aarch64"), "{e}");
        fs::write(dir.join(".config"), FULL.replace("CONFIG_KALLSYMS=y\n", "")).unwrap();
        let (k, warn) = own_kernel(&image, None, None).unwrap();
        assert_eq!((k.spec.arch, k.release.as_str()), (Arch::X86_64, "own"));
        assert_eq!(k.config, dir.join(".config"));
        assert_eq!(warn.len(), 1);
        assert!(warn[0].option == "CONFIG_KALLSYMS", "{warn:?}");
        let _ = fs::remove_dir_all(&dir);
    }
}
