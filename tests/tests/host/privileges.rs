//! What a running session keeps of root's privileges, and a service account's run.

use super::*;

/// A field of /proc/<pid>/task/<tid>/status (or /proc/<pid>/status), as hex or decimal.
fn status_field(status: &str, field: &str) -> u64 {
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"))
        .trim();
    if field.starts_with("Cap") {
        u64::from_str_radix(value, 16).unwrap()
    } else {
        value.parse().unwrap()
    }
}

/// CAP_DAC_OVERRIDE (1) and CAP_KILL (5): what a running session keeps.
const KEPT: u64 = (1 << 1) | (1 << 5);

#[test]
fn host_after_attach_only_dac_override_and_kill_are_kept() {
    let name = "host_after_attach_only_dac_override_and_kill_are_kept";
    let Some(_serial) = host_ready(name) else {
        return;
    };

    // The recording goes into a directory root does not own: writing it needs the kept
    // CAP_DAC_OVERRIDE.
    let dir = scratch(name).join("nobodys");
    fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let json = dir.join("r.json");
    let child = Command::new(bin())
        .args(["record", "-q", "--attach", "tracepoint", "-o"])
        .arg(&json)
        .args(["--", "sleep", "2.31"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_for_workload(Duration::from_secs(60));

    // The workload joins its memcg before exec, and the session drops its capabilities just
    // after starting it: wait for the drop (at most 10 s; the checks below fail if it did not
    // come).
    wait_for_capabilities(pid, KEPT);
    let threads = check_every_thread_keeps_only_kept(pid);

    // The workload keeps what it was started with.
    let w = wait_for_pid_of(&["sleep", "2.31"]);
    let wst = fs::read_to_string(format!("/proc/{w}/status")).unwrap();
    let mine = fs::read_to_string("/proc/self/status").unwrap();
    assert_eq!(
        status_field(&wst, "CapEff:"),
        status_field(&mine, "CapEff:")
    );
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = load_recording(&json);
    assert!(doc.probes.iter().any(|p| p.count > 0));
    assert!(leftover_memcgs().is_empty(), "{:?}", leftover_memcgs());
    summary(
        name,
        &format!("{threads} thread(s) at CapEff {KEPT:#x}, no_new_privs; workload untouched"),
    );
}

/// Waits until the effective capabilities of `pid` are `want` (at most 10 s).
fn wait_for_capabilities(pid: u32, want: u64) {
    let t = Instant::now();
    while fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|st| status_field(&st, "CapEff:") != want)
        .unwrap_or(false)
        && t.elapsed() < Duration::from_secs(10)
    {
        thread::sleep(Duration::from_millis(20));
    }
}

/// Checks that every thread of `pid` has only KEPT (effective, permitted, bounding), nothing
/// to inherit and no_new_privs; the number of threads.
fn check_every_thread_keeps_only_kept(pid: u32) -> usize {
    let mut threads = 0;
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let st = fs::read_to_string(t.path().join("status")).unwrap();
        threads += 1;
        for (field, want) in [
            ("CapEff:", KEPT),
            ("CapPrm:", KEPT),
            ("CapInh:", 0),
            ("CapAmb:", 0),
            ("CapBnd:", KEPT),
            ("NoNewPrivs:", 1),
        ] {
            assert_eq!(
                status_field(&st, field),
                want,
                "{field} of thread {:?}",
                t.file_name()
            );
        }
    }
    threads
}

/// The pid of the process running `argv` (waits for it at most 10 s).
fn wait_for_pid_of(argv: &[&str]) -> i32 {
    let t = Instant::now();
    loop {
        match pid_of(argv) {
            Some(w) => return w,
            None if t.elapsed() < Duration::from_secs(10) => {
                thread::sleep(Duration::from_millis(20))
            }
            None => panic!("the workload never ran"),
        }
    }
}

/// The service account `nobody` (uid and gid 65534), with a copy of the binary it can run and a
/// directory it can write: under /tmp, whatever the checkout's directories allow.
struct Nobody {
    exe: std::path::PathBuf,
    out_dir: std::path::PathBuf,
}

impl Nobody {
    fn new(name: &str) -> Nobody {
        let dir = std::env::temp_dir().join(format!("{name}.{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("memcg-trace");
        fs::copy(bin(), &exe).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        let out_dir = dir.join("out");
        fs::create_dir_all(&out_dir).unwrap();
        std::os::unix::fs::chown(&out_dir, Some(65534), Some(65534)).unwrap();
        Nobody { exe, out_dir }
    }

    /// Runs the binary as nobody with `caps` only (e.g. `+bpf,+perfmon`), inherited, ambient
    /// and bounding.
    fn run(&self, caps: &str, args: &[&str]) -> std::process::Output {
        let set = format!("-all,{caps}");
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(format!("--inh-caps={set}"))
            .arg(format!("--ambient-caps={set}"))
            .arg(format!("--bounding-set={set}"))
            .arg(&self.exe)
            .args(args)
            .output()
            .unwrap()
    }

    /// `record -q --attach tracepoint` with `args`, as [`Nobody::run`].
    fn record(&self, caps: &str, args: &[&str]) -> std::process::Output {
        let record = ["record", "-q", "--attach", "tracepoint"];
        self.run(caps, &[&record[..], args].concat())
    }
}

/// A service account with CAP_BPF and CAP_PERFMON traces system-wide; a workload's memcg
/// needs CAP_DAC_OVERRIDE besides, and bpf stats CAP_SYS_ADMIN, each said in one line.
#[test]
fn host_a_service_account_with_bpf_and_perfmon_traces() {
    let name = "host_a_service_account_with_bpf_and_perfmon_traces";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    if xtask_which("setpriv").is_none() {
        skip(name, "setpriv (util-linux) is missing");
        return;
    }

    let nobody = Nobody::new(name);
    let out_dir = &nobody.out_dir;

    // System-wide: CAP_BPF and CAP_PERFMON are all it takes.
    let sys = out_dir.join("system.json");
    let out = nobody.record("+bpf,+perfmon", &["-d", "1s", "-o", sys.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = load_recording(&sys);
    assert!(doc.probes.iter().any(|p| p.count > 0));

    // The loader was spared its parse of the kernel's BTF without any capability for it (a
    // seccomp filter of its own thread, see tracer::kbtf).
    assert_eq!(
        doc.meta.tracer.loader_btf_parsed, None,
        "as a service account"
    );

    // A workload's memcg is created in root's hierarchy: without CAP_DAC_OVERRIDE, one line
    // that says what is missing, and nothing left behind.
    let out = nobody.record("+bpf,+perfmon", &["--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("CAP_DAC_OVERRIDE") && err.lines().count() == 1,
        "{err}"
    );

    // With it, the workload's rows.
    let wl = out_dir.join("workload.json");
    let out = nobody.record(
        "+bpf,+perfmon,+dac_override",
        &[
            "-o",
            wl.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "ls -R /usr/share/doc >/dev/null",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = load_recording(&wl);
    assert!(doc.meta.workload.is_some());
    assert!(doc
        .probes
        .iter()
        .any(|p| p.workload.as_ref().is_some_and(|w| w.count > 0)));
    // bpf stats need CAP_SYS_ADMIN, and say so.
    let o = nobody.record("+bpf,+perfmon", &["-d", "1s", "--bpf-stats"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("CAP_SYS_ADMIN"),
        "{err}"
    );
    assert!(leftover_memcgs().is_empty(), "{:?}", leftover_memcgs());
}

fn xtask_which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}
