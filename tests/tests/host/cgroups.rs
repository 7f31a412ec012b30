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
/// vm_matrix_5_10).
#[test]
fn host_a_workload_moved_below_its_cgroup_keeps_its_calls() {
    let name = "host_a_workload_moved_below_its_cgroup_keeps_its_calls";
    let Some(_serial) = host_ready(name) else {
        return;
    };
    let Some(hb) = hackbench_or_skip(name) else {
        return;
    };
    // The task's cgroup v2 (memcg-trace's, or on a v1 memory hierarchy its v2 companion).
    let script = format!(
        r#"cg=$(awk -F: '$1=="0"{{print $3}}' /proc/self/cgroup); base=$(awk '$3=="cgroup2"{{print $2; exit}}' /proc/mounts)
mkdir "$base$cg/in" && echo $$ > "$base$cg/in/cgroup.procs" && exec {hb} -g 2 -l 100"#
    );
    let mut report = Vec::new();
    for object in ["full", "legacy"] {
        let json = scratch(name).join(format!("{object}.json"));
        let out = Command::new(bin())
            .env("MEMCG_TRACE_BPF_OBJECT", object)
            .args(["record", "--attach", "tracepoint", "--bpf-stats", "-o"])
            .arg(&json)
            .args(["--", "sh", "-c", &script])
            .output()
            .expect("run memcg-trace");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{object} object: record failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let doc = load_recording(&json);
        check_invariants(&doc, &stdout);
        let stat = probe(&doc, "stat");
        let own = stat.workload.as_ref().expect("workload figures").count;
        let task = ctx_count(stat, "task");
        // hackbench makes nearly all task calls; a workload row that did not follow it below
        // its cgroup holds only the shell's few calls before the move.
        assert!(
            own * 2 >= task && own <= task,
            "{object} object: a workload in a cgroup below its own: workload {own} of {task} task calls\n{stdout}"
        );
        assert_left_nothing(
            &format!("{object} object: a workload moved below its cgroup"),
            "-",
        );
        report.push(format!(
            "{object} object: workload {own} of {task} task calls"
        ));
    }
    summary(name, &report.join("; "));
}
