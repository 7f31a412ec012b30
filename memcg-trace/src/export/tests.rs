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
    let counters = crate::snapshot::counters_for_tests::distinct();
    let row = with_counters(ContextOut::default(), &counters);
    let json = serde_json::to_string(&row).unwrap();
    let read: ContextOut = serde_json::from_str(&json).unwrap();
    let back = counters_of(&read);
    assert_eq!(
        Counters {
            workload_hits: counters.workload_hits,
            ..back
        },
        counters,
        "{json}"
    );
    assert_eq!(back.workload_hits, 0);
}

#[test]
fn cpu_share_is_time_on_the_cpu_and_the_wall_share_is_told_apart() {
    // Two calls of 1 s and 3 s over 10 s; the second slept 2 s of them.
    let mut h = HistData::of(&[1_000_000_000, 3_000_000_000]);
    h.off_ns = 2_000_000_000;
    let lat = latency_out(&h, Duration::from_secs(10), None, false);
    assert_eq!((lat.cpu_share, lat.wall_share), (Some(0.2), Some(0.4)));

    // A call whose time off the CPU is unknown: no on-CPU share, the wall share stays.
    let lat = latency_out(&h, Duration::from_secs(10), None, true);
    assert_eq!((lat.cpu_share, lat.wall_share), (None, Some(0.4)));

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
    let hist = HistData::of(&[480, 500, 1_000, 1_500, 2_000, 90_000]);
    let l = latency_out(&hist, Duration::from_secs(1), None, false);
    assert!(l.hdr_v2.starts_with("HISTF"), "{}", &l.hdr_v2[..8]);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&l.hdr_v2)
        .unwrap();
    // The compressed V2 cookie (base 0x1c849304, word-size bits 0x10).
    assert_eq!(&bytes[..4], &0x1c84_9314u32.to_be_bytes());
    let hdr: hdrhistogram::Histogram<u64> =
        Deserializer::new().deserialize(&mut &bytes[..]).unwrap();
    assert_eq!(hdr.sigfig(), figures::INTERCHANGE_DIGITS);
    assert_eq!(hdr.len(), 6);

    // The extremes in their own buckets, not at a bucket midpoint.
    assert!(
        hdr.equivalent(hdr.min(), hist.min_ns),
        "{} vs {}",
        hdr.min(),
        hist.min_ns
    );
    assert!(
        hdr.equivalent(hdr.max(), hist.max_ns),
        "{} vs {}",
        hdr.max(),
        hist.max_ns
    );
    assert!(hdr.equivalent(hdr.value_at_quantile(0.5), 1_000));
}

#[test]
fn a_symlink_planted_at_the_temporary_name_is_not_followed() {
    let tmp = dir("tmp-symlink");
    let victim = tmp.join("victim");
    fs::write(&victim, "precious").unwrap();
    let planted = tmp.join(".out.json.0123456789abcdef.tmp");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    assert!(create_new(&planted).is_err());
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    let _ = fs::remove_dir_all(&tmp);
}

#[test]
fn writing_over_a_symlink_replaces_the_link_not_its_target() {
    let tmp = dir("out-symlink");
    let victim = tmp.join("victim");
    fs::write(&victim, "precious").unwrap();
    let out = tmp.join("out.json");
    std::os::unix::fs::symlink(&victim, &out).unwrap();
    write_file_atomic(&out, b"{}\n").unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!fs::symlink_metadata(&out).unwrap().file_type().is_symlink());
    assert_eq!(fs::read_to_string(&out).unwrap(), "{}\n");

    // Nothing else is left in the directory: no temporary file.
    let mut names: Vec<String> = fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["out.json", "victim"]);
    let _ = fs::remove_dir_all(&tmp);
}

#[test]
fn temporary_names_are_not_guessable() {
    let parent = PathBuf::from("/x");
    let first = temp_name(&parent, std::ffi::OsStr::new("r.json"));
    let second = temp_name(&parent, std::ffi::OsStr::new("r.json"));
    assert_ne!(first, second);
    assert!(
        !first
            .to_string_lossy()
            .contains(&std::process::id().to_string())
            || first != second
    );
}

/// `-o /dev/null` or `-o /dev/stdout` as root: renaming a file over such a path would replace
/// the device node or the link for every process. A pipe (and a link to it, as /dev/stdout
/// is to a pipe's fd) stands in for them here: refused up front and at the write, one line,
/// the pipe left a pipe.
#[test]
fn a_device_pipe_or_socket_is_not_replaced_by_the_output() {
    use std::os::unix::fs::FileTypeExt as _;
    let tmp = dir("special");
    let fifo = tmp.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();

    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let link = tmp.join("stdout");
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
        fs::read_dir(&tmp).unwrap().count(),
        2,
        "no temporary file left"
    );
    let _ = fs::remove_dir_all(&tmp);
}

#[test]
fn a_failed_write_is_one_line_and_leaves_what_was_there() {
    let tmp = dir("fail");

    // The rename fails: the target is a directory with something in it.
    let out = tmp.join("out.json");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("inside"), "old").unwrap();
    let e = write_file_atomic(&out, b"new").unwrap_err();
    assert!(!format!("{e:#}").contains('\n'), "{e:#}");
    assert_eq!(fs::read_to_string(out.join("inside")).unwrap(), "old");

    // The temporary file is gone.
    assert_eq!(fs::read_dir(&tmp).unwrap().count(), 1);
    let _ = fs::remove_dir_all(&tmp);
}
