//! `cargo xtask bench`: what tracing costs, on the host (tracepoint backend) and in a VM (fentry
//! and kprobe), written to target/bench/report.json and report.md with each figure next to its
//! target. Absolute VM figures are inflated by emulation; the ratios are what to read.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use crate::{
    kernels,
    vm::{self, Accel, VmSpec},
    workspace_root,
};

/// How big a bench run is.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    /// Interleaved untraced/traced pairs.
    pub pairs: usize,
    /// hackbench arguments on the host.
    pub host_hackbench: &'static str,
    /// hackbench arguments in the VM (emulation is 10-100x slower).
    pub vm_hackbench: &'static str,
}

/// The full bench.
pub const FULL: Size = Size {
    pairs: 5,
    host_hackbench: "-g 4 -l 1000",
    vm_hackbench: "-g 2 -l 50",
};

/// The smoke run of the test suite: one pair, tiny workloads; proves the bench runs.
pub const SMOKE: Size = Size {
    pairs: 1,
    host_hackbench: "-g 1 -l 50",
    vm_hackbench: "-g 1 -l 10",
};

fn host_run(bin: &Path, out: &Path, size: Size) -> Result<()> {
    let hb = crate::hackbench()?;
    let status = Command::new(bin)
        .args([
            "bench",
            "--attach",
            "tracepoint",
            "--pairs",
            &size.pairs.to_string(),
            "-o",
        ])
        .arg(out.join("bench-tracepoint.json"))
        .arg("--")
        .arg(&hb)
        .args(size.host_hackbench.split_whitespace())
        .status()?;
    if !status.success() {
        bail!("memcg-trace bench on the host failed: {status}");
    }
    for tick in ["1s", "100ms"] {
        let status = Command::new(bin)
            .args(["record", "-q", "--tick", tick, "-o"])
            .arg(out.join(format!("daemon-{tick}.json")))
            .arg("--")
            .arg(&hb)
            .args(size.host_hackbench.split_whitespace())
            .stdout(std::process::Stdio::null())
            .status()?;
        if !status.success() {
            bail!("memcg-trace record --tick {tick} on the host failed: {status}");
        }
    }
    Ok(())
}

fn vm_run(bin: &Path, out: &Path, size: Size, kernel: &str, accel: Accel) -> Result<()> {
    let spec = kernels::select(kernel)?[0];
    let k = kernels::fetch(spec)?;
    let script = format!(
        "BACKENDS='fentry kprobe'\nPAIRS={}\nHACKBENCH='{}'\nDAEMON_HACKBENCH='{}'\n{}",
        size.pairs,
        size.vm_hackbench,
        size.vm_hackbench,
        include_str!("../guest/bench.sh")
    );
    let r = vm::run(
        &k,
        &VmSpec {
            name: format!("{}-bench", spec.short),
            script,
            bins: vec![bin.to_path_buf(), crate::hackbench()?],
            accel,
            timeout: Duration::from_secs(1800),
            echo: true,
            modules: Vec::new(),
            mem_mb: 0,
        },
    )?;
    if !r.success {
        bail!(
            "the bench VM failed: {}\n{}",
            r.failure.clone().unwrap_or_default(),
            r.tail(40)
        );
    }
    for e in fs::read_dir(&r.out_dir)?.flatten() {
        fs::copy(e.path(), out.join(e.file_name()))?;
    }
    Ok(())
}

fn read(path: &Path) -> Result<serde_json::Value> {
    let text = fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn f(v: &serde_json::Value, ptr: &str) -> Option<f64> {
    v.pointer(ptr).and_then(|x| x.as_f64())
}

/// One line of the report: figure, where, value, target, verdict.
struct Row(String, String, String, String, &'static str);

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "reported",
    }
}

fn rows_for(
    dir: &Path,
    place: &str,
    backends: &[&str],
    host: bool,
    rows: &mut Vec<Row>,
) -> Result<serde_json::Value> {
    let mut json = serde_json::Map::new();
    for b in backends {
        let v = read(&dir.join(format!("bench-{b}.json")))?;
        let rc = f(&v, "/ratio_to_clock");
        let re = f(&v, "/ratio_to_empty");
        let ours = f(&v, "/ours/ns_per_call").unwrap_or(0.0);
        let floor = f(&v, "/floor_clock/ns_per_call").unwrap_or(0.0);
        let target = v.pointer("/target").and_then(|t| t.as_str()).unwrap_or("?");
        rows.push(Row(
            format!("per-call cost / floor (b), {b} on {target}"),
            place.into(),
            format!(
                "{:.2}x ({ours:.0} ns vs {floor:.0} ns)",
                rc.unwrap_or(f64::NAN)
            ),
            "<= 1.5x".into(),
            verdict(rc.map(|r| r <= 1.5)),
        ));
        rows.push(Row(
            format!("per-call cost / floor (a), {b}"),
            place.into(),
            format!("{:.2}x", re.unwrap_or(f64::NAN)),
            "report".into(),
            "reported",
        ));
        let med = f(&v, "/slowdown/median_ratio");
        let min = f(&v, "/slowdown/min_ratio");
        let pct = |r: Option<f64>| {
            r.map(|r| format!("{:+.1}%", (r - 1.0) * 100.0))
                .unwrap_or("-".into())
        };
        rows.push(Row(
            format!("hackbench slowdown, default probes, {b} (median; min)"),
            place.into(),
            format!("{}; {}", pct(med), pct(min)),
            if host && *b == "tracepoint" {
                "<= 5%".into()
            } else {
                "report".into()
            },
            if host && *b == "tracepoint" {
                verdict(med.map(|m| m <= 1.05))
            } else {
                "reported"
            },
        ));
        json.insert(format!("bench_{b}"), v);
    }
    for tick in ["1s", "100ms"] {
        let v = read(&dir.join(format!("daemon-{tick}.json")))?;
        let share = f(&v, "/meta/tracer/cpu_share").unwrap_or(0.0);
        rows.push(Row(
            format!("daemon CPU at a {tick} tick"),
            place.into(),
            format!("{:.3}% of a core", share * 100.0),
            if tick == "1s" {
                "<= 1%".into()
            } else {
                "report".into()
            },
            if tick == "1s" && host {
                verdict(Some(share <= 0.01))
            } else {
                "reported"
            },
        ));
        if tick == "1s" {
            let rss = f(&v, "/meta/tracer/peak_rss_kib").unwrap_or(0.0) / 1024.0;
            let up = f(&v, "/meta/tracer/startup_ns").unwrap_or(0.0) / 1e9;
            let down = f(&v, "/meta/tracer/detach_ns").unwrap_or(0.0) / 1e9;
            rows.push(Row(
                "daemon peak RSS".into(),
                place.into(),
                format!("{rss:.1} MiB"),
                "<= 32 MiB".into(),
                if host {
                    verdict(Some(rss <= 32.0))
                } else {
                    "reported"
                },
            ));
            rows.push(Row(
                "start-up to all probes attached".into(),
                place.into(),
                format!("{up:.3} s"),
                "<= 1 s".into(),
                if host {
                    verdict(Some(up <= 1.0))
                } else {
                    "reported"
                },
            ));
            rows.push(Row(
                "detach on exit".into(),
                place.into(),
                format!("{down:.3} s"),
                "<= 0.2 s".into(),
                if host {
                    verdict(Some(down <= 0.2))
                } else {
                    "reported"
                },
            ));
        }
        json.insert(format!("daemon_{tick}"), v);
    }
    Ok(serde_json::Value::Object(json))
}

/// Runs the bench on the host and in a VM on `kernel`; returns the report's path.
pub fn bench(bin: &Path, size: Size, kernel: &str, accel: Accel) -> Result<PathBuf> {
    let root = workspace_root().join("target/bench");
    let host_dir = root.join("host");
    let vm_dir = root.join(format!("vm-{kernel}"));
    for d in [&host_dir, &vm_dir] {
        let _ = fs::remove_dir_all(d);
        fs::create_dir_all(d)?;
    }
    eprintln!(
        "bench: host, tracepoint backend ({} pairs of hackbench {})",
        size.pairs, size.host_hackbench
    );
    host_run(bin, &host_dir, size)?;
    eprintln!(
        "bench: VM {kernel}, fentry and kprobe ({} pairs of hackbench {})",
        size.pairs, size.vm_hackbench
    );
    vm_run(bin, &vm_dir, size, kernel, accel)?;
    let mut rows = Vec::new();
    let host = rows_for(&host_dir, "host", &["tracepoint"], true, &mut rows)?;
    let vm = rows_for(
        &vm_dir,
        &format!("VM {kernel} (TCG)"),
        &["fentry", "kprobe"],
        false,
        &mut rows,
    )?;
    let report = serde_json::json!({
        "host": host,
        "vm": { "kernel": kernel, "results": vm },
        "rows": rows.iter().map(|r| serde_json::json!({"figure": r.0, "where": r.1, "value": r.2, "target": r.3, "verdict": r.4})).collect::<Vec<_>>(),
    });
    fs::write(
        root.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let mut md = String::from("# memcg-trace bench\n\nHost: this machine's kernel (tracepoint backend). VM: Debian stock kernel under single-threaded TCG, where absolute costs are inflated 10-100x; read the ratios.\n\n| figure | where | value | target | verdict |\n|---|---|---|---|---|\n");
    let mut summary = String::new();
    for r in &rows {
        let _ = writeln!(md, "| {} | {} | {} | {} | {} |", r.0, r.1, r.2, r.3, r.4);
        let _ = writeln!(
            summary,
            "{:<60} {:<16} {:<28} {:<10} {}",
            r.0, r.1, r.2, r.3, r.4
        );
    }
    fs::write(root.join("report.md"), md)?;
    println!("{summary}");
    Ok(root.join("report.md"))
}
