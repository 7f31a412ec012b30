//! Tests of what the outputs say together: the JSON (`export`), read back, the table and
//! the dashboard, given one snapshot or recording. Above the outputs, so that none of them
//! imports another for its tests.

use std::{collections::HashMap, time::Duration, time::UNIX_EPOCH};

use crate::export::*;
use crate::snapshot::{for_tests::snap, Snapshot};

/// The switch witness's count (kprobe before 6.7 on a preemptible kernel) goes into the
/// JSON, back into a snapshot from it, and the footnote says how the calls that left the
/// CPU were proven; a probe proven otherwise has neither.
#[test]
fn the_switch_witness_count_is_recorded_read_back_and_told() {
    let mut snapshot = snap(10, 1000, 500, 0);
    let out = |s: &Snapshot| probes_out(s, &HashMap::new(), &[], false, Some(1_000_000_000));
    let plain = out(&snapshot);
    assert_eq!(plain[0].held_switches, None);
    assert!(!serde_json::to_string(&plain[0])
        .unwrap()
        .contains("held_switches"));
    assert!(!crate::table::probe_footnote(&plain[0]).contains("BPF section held"));
    snapshot.probes[0].held_switches = Some(7);
    let witnessed = out(&snapshot);
    let foot = crate::table::probe_footnote(&witnessed[0]);
    assert!(
        foot.ends_with(
            "calls that left the CPU checked by the switch witness: 7 switches found a BPF section held (the calls in flight then rejected)"
        ),
        "{foot}"
    );
    let json = serde_json::to_string(&witnessed[0]).unwrap();
    let back: ProbeOut = serde_json::from_str(&json).unwrap();
    assert_eq!(back.held_switches, Some(7));
}

/// Where the workload reports its operations, the table gives each probe's calls and time
/// per operation, from the workload rows; elsewhere nothing.
#[test]
fn calls_and_time_per_operation_of_the_workload_are_told() {
    let mut doc = crate::export::read(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/6.12-fentry.json"
    )))
    .unwrap();
    assert_eq!(crate::table::per_operation(&doc), "");
    let row = doc.probes[0].workload.clone().expect("a workload row");
    let lat = row.latency.as_ref().expect("its latency");
    doc.meta.workload.as_mut().unwrap().operations = Some(Operations {
        count: 1000,
        unit: "opens".into(),
    });
    let text = crate::table::per_operation(&doc);
    let want = format!(
        "per operation (1000 opens): {} {:.3} calls {}",
        doc.probes[0].name,
        row.count as f64 / 1000.0,
        crate::units::fmt_ns(lat.mean_ns.unwrap() * row.count as f64 / 1000.0)
    );
    assert!(text.starts_with(&want), "{want}\n{text}");
    assert!(crate::table::summary(&doc).contains(&want));
    let back: Document = serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
    assert_eq!(back.meta.workload.unwrap().operations.unwrap().count, 1000);
}

/// A workload whose memcg saw OOM kills says so: in the JSON, read back, and in the
/// table's workload line; a workload that ended by itself with no OOM kill
/// says only its exit, and the count is read from either cgroup version's file.
#[test]
fn a_workload_killed_by_its_memcgs_oom_killer_is_told() {
    let mut workload = Workload {
        argv: vec!["tail".into(), "/dev/zero".into()],
        exit_status: Some(137),
        cgroup: "/sys/fs/cgroup/small".into(),
        by_memcg: true,
        cpu_ns: None,
        cpu_source: None,
        oom_kills: Some(1),
        operations: None,
    };
    assert_eq!(
        workload.ended(),
        "exit 137 (SIGKILL); 1 OOM kill in its memcg"
    );
    let back: Workload = serde_json::from_str(&serde_json::to_string(&workload).unwrap()).unwrap();
    assert_eq!(back.oom_kills, Some(1));
    let mut doc = crate::export::read(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/6.12-fentry.json"
    )))
    .unwrap();
    doc.meta.workload = Some(workload.clone());
    let t = crate::table::summary(&doc);
    assert!(
        t.contains("workload: tail /dev/zero (exit 137 (SIGKILL); 1 OOM kill in its memcg) in /sys/fs/cgroup/small"),
        "{t}"
    );
    workload.exit_status = Some(0);
    workload.oom_kills = Some(3);
    assert_eq!(workload.ended(), "exit 0; 3 OOM kills in its memcg");
    workload.oom_kills = Some(0);
    assert_eq!(workload.ended(), "exit 0");
    workload.exit_status = None;
    assert_eq!(workload.ended(), "not ended");
    workload.oom_kills = Some(2);
    assert_eq!(workload.ended(), "not ended; 2 OOM kills in its memcg");
    workload.oom_kills = None;
    assert!(!serde_json::to_string(&workload)
        .unwrap()
        .contains("oom_kills"));
    let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n";
    let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n";
    assert_eq!(crate::workload::oom_kill_of(v2), Some(2));
    assert_eq!(crate::workload::oom_kill_of(v1), Some(5));
    assert_eq!(crate::workload::oom_kill_of("oom 1\n"), None);
}

/// A run's facts with nothing in them: no workload, notes, floors or calibration.
fn bare_run() -> RunMeta {
    RunMeta {
        start: UNIX_EPOCH,
        masks: None,
        off_cpu: None,
        reads: None,
        daemon: DaemonCost::default(),
        workload: None,
        notes: HashMap::new(),
        not_attached: Vec::new(),
        floors: Vec::new(),
        calibration: Vec::new(),
        history: None,
        preemption_model: None,
    }
}

/// What the programs attached besides the probes' cost (the switch witness: one run per
/// context switch) is in the recording, read back, and said by the table; a run with none
/// has no such field.
#[test]
fn the_other_programs_runs_and_run_time_are_recorded_and_told() {
    let mut snapshot = snap(10, 1000, 500, 0);
    snapshot.bpf_stats = true;
    let run = RunMeta {
        preemption_model: Some("PREEMPT_RT".into()),
        ..bare_run()
    };
    let plain = document(&snapshot, &run);
    assert!(plain.meta.tracer.other_programs.is_empty());
    assert!(!serde_json::to_string(&plain)
        .unwrap()
        .contains("other_programs"));
    assert!(!crate::table::summary(&plain).contains("also attached"));
    snapshot.extra.push(crate::snapshot::ProgCost {
        name: "held_switch".into(),
        run_cnt: 2000,
        run_time_ns: 300_000,
        recursion_misses: 0,
    });
    let doc = document(&snapshot, &run);
    let w = &doc.meta.tracer.other_programs;
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].run_cnt, w[0].ns_per_run), (2000, Some(150.0)));
    let back: Document = serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
    assert_eq!(
        back.meta.tracer.other_programs,
        doc.meta.tracer.other_programs
    );
    let summary = crate::table::summary(&doc);
    assert!(
        summary.contains("also attached: held_switch ran 2000 times, 150ns a run"),
        "{summary}"
    );

    // Without the kernel's bpf stats the runs are not counted: no figure is given.
    snapshot.bpf_stats = false;
    let off = document(&snapshot, &run);
    assert_eq!(off.meta.tracer.other_programs[0].ns_per_run, None);
    let t = crate::table::summary(&off);
    assert!(
        t.contains("also attached: held_switch (its runs are counted with --bpf-stats)")
            && !t.contains("2000"),
        "{t}"
    );
}

/// On a kernel whose task clock leaves out interrupt and steal time (review finding 3d), a
/// call's time off the CPU is only a lower bound: the time on the CPU is not given as
/// exact, the shares of CPU are marked upper bounds, in the JSON, read back from it, in the
/// table's footnote and on the dashboard.
#[test]
fn on_cpu_figures_are_bounds_where_the_task_clock_leaves_out_interrupts() {
    let mut snapshot = snap(10, 1000, 500, 0);
    {
        let task = &mut snapshot.probes[0].contexts[0];
        task.counters.switched = 3;
        task.counters.off_cpu_ns = 900;
        task.hist.off_ns = 900;
    }

    snapshot.probes[0].workload = Some(snapshot.probes[0].contexts[0].hist.clone());
    let out = |s: &Snapshot| probes_out(s, &HashMap::new(), &[], false, Some(1_000_000_000));
    let exact = out(&snapshot);
    let row = &exact[0].contexts[0];
    assert_eq!(row.on_cpu_ns, Some(500_000 - 900));
    assert!(row.latency.as_ref().unwrap().cpu_share.is_some());
    assert!(!exact[0].workload.as_ref().unwrap().shares_at_most);
    snapshot.probes[0].contexts[0].off_cpu_at_least = 3;
    let bounded = out(&snapshot);
    let c = &bounded[0].contexts[0];
    assert_eq!((c.off_cpu_at_least, c.on_cpu_ns), (3, None));
    assert_eq!(c.latency.as_ref().unwrap().cpu_share, None);
    assert!(bounded[0].workload.as_ref().unwrap().shares_at_most);
    assert!(
        crate::table::probe_footnote(&bounded[0]).contains("3 at least"),
        "{}",
        crate::table::probe_footnote(&bounded[0])
    );

    // Through the JSON and back.
    let json = serde_json::to_string(&bounded[0]).unwrap();
    let back: ProbeOut = serde_json::from_str(&json).unwrap();
    assert_eq!(back.contexts[0].off_cpu_at_least, 3);

    // The dashboard's row.
    let mut app =
        crate::tui::app::App::new(crate::tui::app::Header::default(), Duration::from_secs(1));
    app.on_snapshot(snapshot);
    assert!(app.rows()[0].cpu_at_most);
}

/// A call whose nesting is unknown (a migrated call, a charge on PREEMPT_RT that returned
/// while a later one on its CPU was open) counts its whole time as its own: its row's self
/// time, the workload's self shares and the dashboard's self% are then upper bounds, marked
/// so beside the figure; exact (unmarked) where every call's nesting is known.
#[test]
fn self_times_are_bounds_where_a_call_s_nesting_is_unknown() {
    let mut snapshot = snap(10, 1000, 500, 0);
    snapshot.probes[0].workload = Some(snapshot.probes[0].contexts[0].hist.clone());
    let out = |s: &Snapshot| probes_out(s, &HashMap::new(), &[], false, Some(1_000_000_000));
    let run = bare_run();

    // The table's self column (the 14th) of the probe's rows, the workload's among them.
    let self_cells = |s: &Snapshot| -> Vec<String> {
        let d = document(s, &run);
        crate::table::summary(&d)
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|w| {
                w.first() == Some(&d.probes[0].name.as_str())
                    && w.get(1)
                        .is_some_and(|c| crate::kernel::ctx_index(c).is_some())
            })
            .filter_map(|w| w.get(13).map(|c| c.to_string()))
            .collect()
    };
    let app_of = |s: Snapshot| {
        let mut app =
            crate::tui::app::App::new(crate::tui::app::Header::default(), Duration::from_secs(1));
        app.on_snapshot(s);
        app
    };
    let exact = out(&snapshot);
    assert!(!exact[0].workload.as_ref().unwrap().shares_at_most);
    let cells = self_cells(&snapshot);
    assert!(
        !cells.is_empty() && cells.iter().all(|c| !c.starts_with("<=")),
        "{cells:?}"
    );
    assert!(app_of(snapshot.clone())
        .rows()
        .iter()
        .all(|r| !r.self_at_most));
    snapshot.probes[0].contexts[0].counters.self_unknown = 2;
    let bounded = out(&snapshot);
    assert_eq!(bounded[0].contexts[0].self_unknown, 2);
    assert!(bounded[0].workload.as_ref().unwrap().shares_at_most);
    let cells = self_cells(&snapshot);
    assert!(
        cells.len() >= 2 && cells.iter().all(|c| c.starts_with("<=")),
        "the task row and the workload row: {cells:?}"
    );
    let app = app_of(snapshot);
    assert!(
        app.rows()[0].self_at_most
            && app
                .rows()
                .iter()
                .any(|r| r.context == "workload" && r.self_at_most)
    );
}
