use super::*;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memcg-trace-export-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// Every counter the kernel keeps goes into the recorded row and comes back the same,
/// through the JSON too (but `workload_hits`, which the recording keeps as the workload
/// row's count).
#[test]
fn every_counter_is_recorded_and_read_back() {
    let k = crate::snapshot::counters_for_tests::distinct();
    let row = with_counters(ContextOut::default(), &k);
    let json = serde_json::to_string(&row).unwrap();
    let read: ContextOut = serde_json::from_str(&json).unwrap();
    let back = counters_of(&read);
    assert_eq!(
        Counters {
            workload_hits: k.workload_hits,
            ..back
        },
        k,
        "{json}"
    );
    assert_eq!(back.workload_hits, 0);
}

#[test]
fn cpu_share_is_time_on_the_cpu_and_the_wall_share_is_told_apart() {
    // Two calls of 1 s and 3 s over 10 s; the second slept 2 s of them.
    let mut h = HistData::of(&[1_000_000_000, 3_000_000_000]);
    h.off_ns = 2_000_000_000;
    let l = latency_out(&h, Duration::from_secs(10), None, false);
    assert_eq!((l.cpu_share, l.wall_share), (Some(0.2), Some(0.4)));
    // A call whose time off the CPU is unknown: no on-CPU share, the wall share stays.
    let l = latency_out(&h, Duration::from_secs(10), None, true);
    assert_eq!((l.cpu_share, l.wall_share), (None, Some(0.4)));
    // A recording made before `wall_share`: its `cpu_share` was the wall share.
    let old = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/6.12-fentry.json"),
    )
    .unwrap();
    let was: serde_json::Value = serde_json::from_str(&old).unwrap();
    let doc = parse(&old).unwrap();
    let l = doc.probes[0].contexts[0].latency.as_ref().unwrap();
    assert_eq!(l.cpu_share, None);
    assert_eq!(
        l.wall_share,
        was["probes"][0]["contexts"][0]["latency"]["cpu_share"].as_f64()
    );
}

/// The switch witness's count (kprobe before 6.7 on a preemptible kernel) goes into the
/// JSON, back into a snapshot from it, and the footnote says how the calls that left the
/// CPU were proven; a probe proven otherwise has neither.
#[test]
fn the_switch_witness_count_is_recorded_read_back_and_told() {
    let mut s = crate::tui::app::tests::snap(10, 1000, 500, 0);
    let out = |s: &Snapshot| probes_out(s, &HashMap::new(), &[], false, Some(1_000_000_000));
    let plain = out(&s);
    assert_eq!(plain[0].held_switches, None);
    assert!(!serde_json::to_string(&plain[0])
        .unwrap()
        .contains("held_switches"));
    assert!(!crate::table::probe_footnote(&plain[0]).contains("BPF section held"));
    s.probes[0].held_switches = Some(7);
    let witnessed = out(&s);
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
    let w = doc.probes[0].workload.clone().expect("a workload row");
    let l = w.latency.as_ref().expect("its latency");
    doc.meta.workload.as_mut().unwrap().operations = Some(Operations {
        count: 1000,
        unit: "opens".into(),
    });
    let t = crate::table::per_operation(&doc);
    let want = format!(
        "per operation (1000 opens): {} {:.3} calls {}",
        doc.probes[0].name,
        w.count as f64 / 1000.0,
        crate::units::fmt_ns(l.mean_ns.unwrap() * w.count as f64 / 1000.0)
    );
    assert!(t.starts_with(&want), "{want}\n{t}");
    assert!(crate::table::summary(&doc).contains(&want));
    let back: Document = serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
    assert_eq!(back.meta.workload.unwrap().operations.unwrap().count, 1000);
}

/// A workload whose memcg saw OOM kills says so: in the JSON, read back, and in the
/// table's workload line; a workload that ended by itself with no OOM kill
/// says only its exit, and the count is read from either cgroup version's file.
#[test]
fn a_workload_killed_by_its_memcgs_oom_killer_is_told() {
    let mut w = Workload {
        argv: vec!["tail".into(), "/dev/zero".into()],
        exit_status: Some(137),
        cgroup: "/sys/fs/cgroup/small".into(),
        by_memcg: true,
        cpu_ns: None,
        cpu_source: None,
        oom_kills: Some(1),
        operations: None,
    };
    assert_eq!(w.ended(), "exit 137 (SIGKILL); 1 OOM kill in its memcg");
    let back: Workload = serde_json::from_str(&serde_json::to_string(&w).unwrap()).unwrap();
    assert_eq!(back.oom_kills, Some(1));
    let mut doc = crate::export::read(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/6.12-fentry.json"
    )))
    .unwrap();
    doc.meta.workload = Some(w.clone());
    let t = crate::table::summary(&doc);
    assert!(
        t.contains("workload: tail /dev/zero (exit 137 (SIGKILL); 1 OOM kill in its memcg) in /sys/fs/cgroup/small"),
        "{t}"
    );
    w.exit_status = Some(0);
    w.oom_kills = Some(3);
    assert_eq!(w.ended(), "exit 0; 3 OOM kills in its memcg");
    w.oom_kills = Some(0);
    assert_eq!(w.ended(), "exit 0");
    w.exit_status = None;
    assert_eq!(w.ended(), "not ended");
    w.oom_kills = Some(2);
    assert_eq!(w.ended(), "not ended; 2 OOM kills in its memcg");
    w.oom_kills = None;
    assert!(!serde_json::to_string(&w).unwrap().contains("oom_kills"));
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
    let mut s = crate::tui::app::tests::snap(10, 1000, 500, 0);
    s.bpf_stats = true;
    let run = RunMeta {
        preemption_model: Some("PREEMPT_RT".into()),
        ..bare_run()
    };
    let plain = document(&s, &run);
    assert!(plain.meta.tracer.other_programs.is_empty());
    assert!(!serde_json::to_string(&plain)
        .unwrap()
        .contains("other_programs"));
    assert!(!crate::table::summary(&plain).contains("also attached"));
    s.extra.push(crate::snapshot::ProgCost {
        name: "held_switch".into(),
        run_cnt: 2000,
        run_time_ns: 300_000,
        recursion_misses: 0,
    });
    let doc = document(&s, &run);
    let w = &doc.meta.tracer.other_programs;
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].run_cnt, w[0].ns_per_run), (2000, Some(150.0)));
    let back: Document = serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
    assert_eq!(
        back.meta.tracer.other_programs,
        doc.meta.tracer.other_programs
    );
    let t = crate::table::summary(&doc);
    assert!(
        t.contains("also attached: held_switch ran 2000 times, 150ns a run"),
        "{t}"
    );
    // Without the kernel's bpf stats the runs are not counted: no figure is given.
    s.bpf_stats = false;
    let off = document(&s, &run);
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
    let mut s = crate::tui::app::tests::snap(10, 1000, 500, 0);
    {
        let task = &mut s.probes[0].contexts[0];
        task.counters.switched = 3;
        task.counters.off_cpu_ns = 900;
        task.hist.off_ns = 900;
    }
    s.probes[0].workload = Some(s.probes[0].contexts[0].hist.clone());
    let out = |s: &Snapshot| probes_out(s, &HashMap::new(), &[], false, Some(1_000_000_000));
    let exact = out(&s);
    let c = &exact[0].contexts[0];
    assert_eq!(c.on_cpu_ns, Some(500_000 - 900));
    assert!(c.latency.as_ref().unwrap().cpu_share.is_some());
    assert!(!exact[0].workload.as_ref().unwrap().shares_at_most);
    s.probes[0].contexts[0].off_cpu_at_least = 3;
    let bounded = out(&s);
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
    app.on_snapshot(s);
    assert!(app.rows()[0].cpu_at_most);
}

/// A call whose nesting is unknown (a migrated call, a charge on PREEMPT_RT that returned
/// while a later one on its CPU was open) counts its whole time as its own: its row's self
/// time, the workload's self shares and the dashboard's self% are then upper bounds, marked
/// so beside the figure; exact (unmarked) where every call's nesting is known.
#[test]
fn self_times_are_bounds_where_a_call_s_nesting_is_unknown() {
    let mut s = crate::tui::app::tests::snap(10, 1000, 500, 0);
    s.probes[0].workload = Some(s.probes[0].contexts[0].hist.clone());
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
    let exact = out(&s);
    assert!(!exact[0].workload.as_ref().unwrap().shares_at_most);
    let cells = self_cells(&s);
    assert!(
        !cells.is_empty() && cells.iter().all(|c| !c.starts_with("<=")),
        "{cells:?}"
    );
    assert!(app_of(s.clone()).rows().iter().all(|r| !r.self_at_most));
    s.probes[0].contexts[0].counters.self_unknown = 2;
    let bounded = out(&s);
    assert_eq!(bounded[0].contexts[0].self_unknown, 2);
    assert!(bounded[0].workload.as_ref().unwrap().shares_at_most);
    let cells = self_cells(&s);
    assert!(
        cells.len() >= 2 && cells.iter().all(|c| c.starts_with("<=")),
        "the task row and the workload row: {cells:?}"
    );
    let app = app_of(s);
    assert!(
        app.rows()[0].self_at_most
            && app
                .rows()
                .iter()
                .any(|r| r.context == "workload" && r.self_at_most)
    );
}

/// A call longer than the buckets' range (2^36 ns, 68.7 s: a charge stuck in reclaim):
/// the last bucket holds it, and its bound in the JSON lies past it, so that min and max
/// lie in their buckets as every reader expects (review finding 13).
#[test]
fn a_call_beyond_the_last_bucket_lies_inside_it() {
    let long = 100_000_000_000;
    let h = HistData::of(&[1_000, long]);
    let l = latency_out(&h, Duration::from_secs(200), None, false);
    let last = l.buckets.last().unwrap();
    assert_eq!(last.min_ns, bucket_bounds(NUM_BUCKETS - 1).0);
    assert!((last.min_ns..last.max_ns).contains(&l.max_ns), "{last:?}");
    assert_eq!(l.max_ns, long);
    // Read back as a snapshot's histogram, an interval of it keeps the long call's max.
    let since = HistData::of(&[long]).since(&HistData::default());
    assert_eq!((since.min_ns, since.max_ns), (long, long));
    let earlier = HistData::of(&[1_000]);
    let both = HistData::of(&[1_000, long]).since(&earlier);
    assert_eq!(both.max_ns, long);
}

#[test]
fn each_probe_rates_over_its_own_window() {
    // The committed recording: every probe's calls over the run's duration. Say the second
    // probe was attached 4 s into a 10 s run: its rate is over its 6 s.
    let old = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/6.12-fentry.json"),
    )
    .unwrap();
    let mut snap = to_snapshot(&parse(&old).unwrap());
    snap.elapsed = Duration::from_secs(10);
    snap.probes[0].window = None;
    snap.probes[1].window = Some(Duration::from_secs(6));
    let out = probes_out(&snap, &HashMap::new(), &[], false, None);
    let rate = |i: usize| out[i].contexts[0].rate_per_s.unwrap();
    let calls = |i: usize| out[i].contexts[0].count as f64;
    assert!((rate(0) - calls(0) / 10.0).abs() < 1e-6, "{}", rate(0));
    assert!((rate(1) - calls(1) / 6.0).abs() < 1e-6, "{}", rate(1));
    assert_eq!(out[1].window_ns, Some(6_000_000_000));
    // It travels: read back, the probe keeps its window.
    let back = to_snapshot(&Document {
        probes: out,
        ..parse(&old).unwrap()
    });
    assert_eq!(back.probes[1].window, Some(Duration::from_secs(6)));
}

#[test]
fn hdr_strings_are_the_compressed_interchange_form_at_the_stated_resolution() {
    use base64::Engine as _;
    use hdrhistogram::serialization::Deserializer;
    let h = HistData::of(&[480, 500, 1_000, 1_500, 2_000, 90_000]);
    let l = latency_out(&h, Duration::from_secs(1), None, false);
    assert!(l.hdr_v2.starts_with("HISTF"), "{}", &l.hdr_v2[..8]);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&l.hdr_v2)
        .unwrap();
    // The compressed V2 cookie (base 0x1c849304, word-size bits 0x10).
    assert_eq!(&bytes[..4], &0x1c84_9314u32.to_be_bytes());
    let d: hdrhistogram::Histogram<u64> = Deserializer::new().deserialize(&mut &bytes[..]).unwrap();
    assert_eq!(d.sigfig(), figures::INTERCHANGE_DIGITS);
    assert_eq!(d.len(), 6);
    // The extremes in their own buckets, not at a bucket midpoint.
    assert!(
        d.equivalent(d.min(), h.min_ns),
        "{} vs {}",
        d.min(),
        h.min_ns
    );
    assert!(
        d.equivalent(d.max(), h.max_ns),
        "{} vs {}",
        d.max(),
        h.max_ns
    );
    assert!(d.equivalent(d.value_at_quantile(0.5), 1_000));
}

#[test]
fn a_symlink_planted_at_the_temporary_name_is_not_followed() {
    let d = dir("tmp-symlink");
    let victim = d.join("victim");
    fs::write(&victim, "precious").unwrap();
    let planted = d.join(".out.json.0123456789abcdef.tmp");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    assert!(create_new(&planted).is_err());
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn writing_over_a_symlink_replaces_the_link_not_its_target() {
    let d = dir("out-symlink");
    let victim = d.join("victim");
    fs::write(&victim, "precious").unwrap();
    let out = d.join("out.json");
    std::os::unix::fs::symlink(&victim, &out).unwrap();
    write_file_atomic(&out, b"{}\n").unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!fs::symlink_metadata(&out).unwrap().file_type().is_symlink());
    assert_eq!(fs::read_to_string(&out).unwrap(), "{}\n");
    // Nothing else is left in the directory: no temporary file.
    let mut names: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["out.json", "victim"]);
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn temporary_names_are_not_guessable() {
    let d = PathBuf::from("/x");
    let a = temp_name(&d, std::ffi::OsStr::new("r.json"));
    let b = temp_name(&d, std::ffi::OsStr::new("r.json"));
    assert_ne!(a, b);
    assert!(
        !a.to_string_lossy()
            .contains(&std::process::id().to_string())
            || a != b
    );
}

/// `-o /dev/null` or `-o /dev/stdout` as root: renaming a file over such a path would replace
/// the device node or the link for every process. A pipe (and a link to it, as /dev/stdout
/// is to a pipe's fd) stands in for them here: refused up front and at the write, one line,
/// the pipe left a pipe.
#[test]
fn a_device_pipe_or_socket_is_not_replaced_by_the_output() {
    use std::os::unix::fs::FileTypeExt as _;
    let d = dir("special");
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let link = d.join("stdout");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    for p in [&fifo, &link] {
        for e in [
            check_writable(p).unwrap_err(),
            write_file_atomic(p, b"{}").unwrap_err(),
        ] {
            let e = format!("{e:#}");
            assert!(e.contains("not a regular file") && !e.contains('\n'), "{e}");
        }
    }
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::read_dir(&d).unwrap().count(),
        2,
        "no temporary file left"
    );
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn a_failed_write_is_one_line_and_leaves_what_was_there() {
    let d = dir("fail");
    // The rename fails: the target is a directory with something in it.
    let out = d.join("out.json");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("inside"), "old").unwrap();
    let e = write_file_atomic(&out, b"new").unwrap_err();
    assert!(!format!("{e:#}").contains('\n'), "{e:#}");
    assert_eq!(fs::read_to_string(out.join("inside")).unwrap(), "old");
    // The temporary file is gone.
    assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
    let _ = fs::remove_dir_all(&d);
}
