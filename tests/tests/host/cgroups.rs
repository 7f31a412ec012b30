//! Workloads that make cgroups of their own: removed with them, and their calls still the
//! workload's.

use super::*;

#[test]
fn host_a_workload_that_made_its_own_cgroups_is_removed_with_them() {
    let name = "host_a_workload_that_made_its_own_cgroups_is_removed_with_them";
    let Some(_serial) = host_ready(name) else {
        return;
    };

    // The workload makes a cgroup inside its memcg and moves there (v1 or v2).
    let script = r#"cg=$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)
if [ -n "$cg" ]; then base=/sys/fs/cgroup/memory; else
  cg=$(awk -F: '$1=="0"{print $3}' /proc/self/cgroup); base=$(awk '$3=="cgroup2"{print $2; exit}' /proc/mounts); fi
mkdir "$base$cg/inner" && echo $$ > "$base$cg/inner/cgroup.procs" && exec sleep 7.77"#;
    let out = run(&[
        "record",
        "-q",
        "--attach",
        "tracepoint",
        "-d",
        "2s",
        "--",
        "sh",
        "-c",
        script,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("warning"), "{err}");
    assert_left_nothing(
        &format!("a workload in its own inner cgroup ({err})"),
        "7.77",
    );
}

/// A workload that moves into a cgroup v2 of its own below the one memcg-trace made for it (as
/// `systemd-run --scope` and container runtimes do) keeps its calls in the workload row, with
/// either object: the full one asks the kernel (`bpf_get_current_ancestor_cgroup_id`), the
/// legacy one, whose kernels (before 5.18) refuse that helper to tracing programs, reads the
/// cgroup's ancestors itself (here `cgroup.ancestors[]`; 5.10's `ancestor_ids[]` in
/// vm_matrix_5_10). And it keeps only its own: the same beside another charger two levels
/// down (`mt-other-charger/leaf`), whose ancestor at the workload's depth is read and
/// is not the workload's cgroup.
#[test]
fn host_a_workload_moved_below_its_cgroup_keeps_its_calls() {
    let name = "host_a_workload_moved_below_its_cgroup_keeps_its_calls";
    let Some(MovedWorkload {
        _serial,
        hb,
        v2,
        script,
    }) = MovedWorkload::ready(name)
    else {
        return;
    };
    let dir = scratch(name);
    let record = |object: &str, run: &str| {
        let json = dir.join(format!("{object}-{run}.json"));
        let (doc, stdout) = record_tracepoint_to(&json, Some(object), &["sh", "-c", &script]);
        let stat = probe(&doc, "stat");
        let own = stat.workload.as_ref().expect("workload figures").count;
        (own, ctx_count(stat, "task"), stdout)
    };
    let mut report = Vec::new();
    for object in ["full", "legacy"] {
        let (own, task, stdout) = record(object, "alone");

        // hackbench makes nearly all task calls; a workload row that did not follow it below
        // its cgroup holds only the shell's few calls before the move.
        assert!(
            own * 2 >= task && own <= task,
            "{object} object: a workload in a cgroup below its own: workload {own} of {task} task calls\n{stdout}"
        );
        let other = OtherCharger::start(Path::new(&v2).join("mt-other-charger"), &hb);
        let (own_beside, task_beside, stdout) = record(object, "beside");
        drop(other);

        // The same hackbench makes about as many calls beside the other; a test that took any
        // task deeper than the workload's cgroup for the workload's would add the other's
        // thousands to its row.
        assert!(
            own_beside * 4 <= own * 5 && task_beside >= own_beside + 1000,
            "{object} object: beside a charger two levels down: workload {own_beside} of {task_beside} task calls ({own} alone)\n{stdout}"
        );
        assert_left_nothing(
            &format!("{object} object: a workload moved below its cgroup"),
            "-",
        );
        report.push(format!(
            "{object} object: workload {own} of {task} task calls; beside another charger {own_beside} of {task_beside}"
        ));
    }

    summary(name, &report.join("; "));
}

/// The same inside a cgroup namespace (as in a container: Docker's default on cgroup v2), where
/// the cgroup v2 mount starts at the namespace's root, one level below the real root here:
/// paths undercount the workload cgroup's depth, which the eBPF programs compare at, and only
/// the kernel knows it (memcg-trace asks it through a test-run program). Both objects.
#[test]
fn host_a_workload_moved_below_its_cgroup_in_a_cgroup_namespace_keeps_its_calls() {
    let name = "host_a_workload_moved_below_its_cgroup_in_a_cgroup_namespace_keeps_its_calls";
    let Some(MovedWorkload {
        _serial,
        hb: _,
        v2,
        script,
    }) = MovedWorkload::ready(name)
    else {
        return;
    };
    let dir = scratch(name);

    // A fresh namespace root for every run: memcg-trace offers the memory controller to the
    // namespace root's children, after which (on a host whose cgroup v2 has it) no process
    // may join the root itself as the next run's wrapper does.
    let ns_root = Path::new(&v2).join("mt-cgns-test");
    let wrapper = namespace_wrapper(&dir);
    if !runs_in_a_namespace(name, &wrapper, &v2, &ns_root) {
        return;
    }

    let mut report = Vec::new();
    for object in ["full", "legacy"] {
        let ns = NamespaceRoot::make(ns_root.clone());
        let json = dir.join(format!("{object}.json"));
        let (doc, stdout) = record_tracepoint_in(
            &["sh", &wrapper, &v2],
            &json,
            Some(object),
            &["sh", "-c", &script],
        );
        let stat = probe(&doc, "stat");
        let own = stat.workload.as_ref().expect("workload figures").count;
        let task = ctx_count(stat, "task");

        // Without the kernel's level the row keeps only the shell's few calls before the move.
        assert!(
            own * 2 >= task && own <= task,
            "{object} object in a cgroup namespace: workload {own} of {task} task calls\n{stdout}"
        );
        assert!(
            !stdout.contains("moves below its cgroup is not followed"),
            "{object} object: {stdout}"
        );
        assert!(
            ns.ours_left().is_empty(),
            "{object} object: cgroups left in the namespace: {:?}",
            ns.ours_left()
        );
        drop(ns);
        report.push(format!(
            "{object} object: workload {own} of {task} task calls"
        ));
    }

    assert_left_nothing(
        "a workload moved below its cgroup in a cgroup namespace",
        "-",
    );
    summary(name, &report.join("; "));
}

/// A script that runs its arguments in a cgroup namespace: joins the namespace's root cgroup,
/// unshares the cgroup and mount namespaces, mounts cgroup v2 afresh (its root is the namespace's),
/// moves into a leaf (a cgroup with processes cannot offer the memory controller to its children)
/// and runs the rest.
fn namespace_wrapper(dir: &Path) -> String {
    let wrapper = dir.join("in-cgroup-namespace.sh");
    fs::write(
        &wrapper,
        r#"set -e
v2=$1; shift
echo $$ > "$v2/mt-cgns-test/cgroup.procs"
exec unshare --cgroup --mount sh -c '
set -e
v2=$1; shift
umount "$v2" 2>/dev/null || true
mount -t cgroup2 cgroup2 "$v2"
mkdir -p "$v2/daemon"
echo $$ > "$v2/daemon/cgroup.procs"
exec "$@"' sh "$v2" "$@"
"#,
    )
    .expect("write the wrapper");
    wrapper.display().to_string()
}

/// Whether the wrapper runs a command in a namespace whose cgroup v2 is mounted afresh
/// (said as a skip where it cannot).
fn runs_in_a_namespace(name: &str, wrapper: &str, v2: &str, ns_root: &Path) -> bool {
    let ns = NamespaceRoot::make(ns_root.to_path_buf());
    let tried = Command::new("sh")
        .args([wrapper, v2, "sh", "-c", "cat /proc/self/cgroup"])
        .output();
    drop(ns);
    match tried {
        Ok(o)
            if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("0::/daemon") =>
        {
            true
        }
        Ok(o) => {
            skip(
                name,
                &format!(
                    "cannot run in a cgroup namespace with cgroup v2 mounted afresh: {}{}",
                    String::from_utf8_lossy(&o.stdout).trim(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
            );
            false
        }
        Err(e) => {
            skip(name, &format!("cannot run sh: {e}"));
            false
        }
    }
}

/// What the moved-workload tests share: the host's serial lock, hackbench, the cgroup v2
/// mount, and the workload's script: it makes `in` below its own cgroup v2 (memcg-trace's, or
/// on a v1 memory hierarchy its v2 companion; inside a cgroup namespace /proc/self/cgroup and
/// a fresh mount both start at the namespace's root) and runs hackbench there.
struct MovedWorkload {
    _serial: std::sync::MutexGuard<'static, ()>,
    hb: String,
    v2: String,
    script: String,
}

impl MovedWorkload {
    /// None where the test is skipped (said why).
    fn ready(name: &str) -> Option<MovedWorkload> {
        let serial = host_ready(name)?;
        let hb = hackbench_or_skip(name)?;
        let Some(v2) = fs::read_to_string("/proc/mounts").ok().and_then(|m| {
            m.lines()
                .find(|l| l.split_whitespace().nth(2) == Some("cgroup2"))
                .and_then(|l| l.split_whitespace().nth(1).map(String::from))
        }) else {
            skip(name, "no cgroup v2 mount");
            return None;
        };
        let script = format!(
            r#"cg=$(awk -F: '$1=="0"{{print $3}}' /proc/self/cgroup)
mkdir "{v2}$cg/in" && echo $$ > "{v2}$cg/in/cgroup.procs" && exec {hb} -g 2 -l 100"#
        );
        Some(MovedWorkload {
            _serial: serial,
            hb,
            v2,
            script,
        })
    }
}

/// A cgroup v2 that serves as a cgroup namespace's root; removed (with its `daemon` leaf) when
/// dropped.
struct NamespaceRoot {
    dir: std::path::PathBuf,
}

impl NamespaceRoot {
    fn make(dir: std::path::PathBuf) -> NamespaceRoot {
        let _ = fs::create_dir(&dir);
        NamespaceRoot { dir }
    }

    /// memcg-trace's cgroups left in it.
    fn ours_left(&self) -> Vec<String> {
        fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str().map(String::from))
                    .filter(|n| n.starts_with("memcg-trace."))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for NamespaceRoot {
    fn drop(&mut self) {
        // The processes that were in them are gone with memcg-trace.
        for _ in 0..50 {
            let _ = fs::remove_dir(self.dir.join("daemon"));
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }

            std::thread::sleep(std::time::Duration::from_millis(100));
        }

        if !std::thread::panicking() {
            panic!("cannot remove {}", self.dir.display());
        }
    }
}

/// A hackbench pair running all along in `dir/leaf` (cgroup v2), killed and its cgroups removed
/// when dropped.
struct OtherCharger {
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl OtherCharger {
    fn start(dir: std::path::PathBuf, hb: &str) -> OtherCharger {
        let leaf = dir.join("leaf");
        fs::create_dir_all(&leaf).expect("make the other charger's cgroup");
        let mut charger = OtherCharger { dir, child: None };
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec {hb} -g 1 -f 1 -l 100000000",
                leaf.display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the other charger");
        charger.child = Some(child);
        thread::sleep(Duration::from_secs(1));
        charger
    }
}

impl Drop for OtherCharger {
    fn drop(&mut self) {
        let leaf = self.dir.join("leaf");
        for _ in 0..100 {
            let procs = fs::read_to_string(leaf.join("cgroup.procs")).unwrap_or_default();
            if procs.trim().is_empty() {
                break;
            }

            for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                // SAFETY: a plain kill(2) of a process of the other charger's cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }

            thread::sleep(Duration::from_millis(50));
        }

        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }

        let _ = fs::remove_dir(&leaf);
        let _ = fs::remove_dir(&self.dir);
    }
}
