//! `cargo xtask soak --minutes N`: `memcg-trace record` alongside a looping hackbench for N
//! minutes, its resident memory, open descriptors and CPU time sampled as it runs. Flat memory
//! and descriptors are the pass condition; at the end a SIGTERM must leave a valid recording
//! and no memcg. `cargo xtask test` runs a 1-minute soak.

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

/// One sample of the daemon.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Seconds since the start.
    pub at_s: f64,
    /// Resident set, KiB.
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: usize,
    /// User + system CPU time so far, seconds.
    pub cpu_s: f64,
}

fn sample(pid: u32, t0: Instant) -> Option<Sample> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())?;
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;

    // After "(comm)": state is field 3, utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;

    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(Sample {
        at_s: t0.elapsed().as_secs_f64(),
        rss_kib,
        fds,
        cpu_s: ticks as f64 / hz,
    })
}

/// What a soak found.
pub struct Soak {
    pub samples: Vec<Sample>,
    /// Whether memory and descriptors stayed flat, the run ended cleanly, and the recording is
    /// valid.
    pub ok: bool,
    /// One line per finding.
    pub verdict: String,
}

/// Runs the soak for `minutes` with `bin`; writes target/soak/{soak.json,samples.tsv}.
pub fn soak(bin: &Path, minutes: f64) -> Result<Soak> {
    let dir = crate::workspace_root().join("target/soak");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let json = dir.join("soak.json");
    let (mut child, errors) = start_record(bin, &json)?;
    let samples = match sample_for(&mut child, minutes) {
        Ok(samples) => samples,
        Err(Early::Ended(status)) => {
            let err = errors.join().unwrap_or_default();
            bail!("memcg-trace ended early ({status}): {}", err.trim());
        }
        Err(Early::Wait(e)) => bail!("waiting for memcg-trace: {e}"),
    };
    let status = child.wait()?;
    let err = errors.join().unwrap_or_default();
    write_samples(&dir.join("samples.tsv"), &samples)?;

    let mut problems = Vec::new();
    if status.code() != Some(128 + libc::SIGTERM) {
        problems.push(format!("SIGTERM ended it with {status} ({})", err.trim()));
    }

    problems.extend(recording_problems(bin, &json)?);
    let left = memcgs_left();
    if !left.is_empty() {
        problems.push(format!("memcgs left: {left:?}"));
    }

    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        bail!("no samples of the daemon");
    };
    let (max_rss, max_fds) = (
        samples.iter().map(|s| s.rss_kib).max().unwrap_or(0),
        samples.iter().map(|s| s.fds).max().unwrap_or(0),
    );
    problems.extend(growth(first, max_rss, max_fds));

    let span = (last.at_s - first.at_s).max(1.0);
    let verdict = format!(
        "soak {:.1} min: rss {} -> {} KiB (max {max_rss}), fds {} -> {} (max {max_fds}), daemon cpu {:.3}% of a core; {}",
        minutes,
        first.rss_kib,
        last.rss_kib,
        first.fds,
        last.fds,
        100.0 * (last.cpu_s - first.cpu_s) / span,
        if problems.is_empty() {
            "flat, clean end, valid recording".to_string()
        } else {
            problems.join("; ")
        }
    );
    Ok(Soak {
        ok: problems.is_empty(),
        samples,
        verdict,
    })
}

/// `memcg-trace record` into `json` over a looping hackbench, and a thread draining its
/// standard error as the run goes (so that a chatty run never blocks on a full pipe), which
/// returns what it read.
fn start_record(bin: &Path, json: &Path) -> Result<(Child, thread::JoinHandle<String>)> {
    let hb = crate::hackbench()?;
    let loop_cmd = format!(
        "while :; do {} -g 1 -l 100 >/dev/null 2>&1 || exit 1; done",
        hb.display()
    );
    let mut child = Command::new(bin)
        .args(["record", "-q", "--attach", "auto", "--tick", "1s", "-o"])
        .arg(json)
        .args(["--", "sh", "-c", &loop_cmd])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("start memcg-trace record")?;
    let mut stderr = child.stderr.take().expect("piped");
    let errors = thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    Ok((child, errors))
}

/// How a soak's run ended before its time: by itself (its status), or waiting for it failed
/// (it was then stopped).
enum Early {
    Ended(std::process::ExitStatus),
    Wait(std::io::Error),
}

/// Samples the running `child` for `minutes` (twelve samples a minute on short runs, one a
/// minute on long ones; the first after start-up, the last at the end), then sends it SIGTERM.
fn sample_for(child: &mut Child, minutes: f64) -> Result<Vec<Sample>, Early> {
    let pid = child.id();
    let stop = || {
        // SAFETY: kill(2) of our child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    };
    let t0 = Instant::now();
    let total = Duration::from_secs_f64(minutes * 60.0);
    let every = Duration::from_secs(if minutes <= 5.0 { 5 } else { 60 });
    let mut samples = Vec::new();
    let mut next = Duration::from_secs(5);
    while t0.elapsed() < total {
        match child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => return Err(Early::Ended(status)),
            Err(e) => {
                stop();
                let _ = child.wait();
                return Err(Early::Wait(e));
            }
        }

        if t0.elapsed() >= next {
            if let Some(s) = sample(pid, t0) {
                eprintln!(
                    "soak: {:>6.0} s  rss {:>6} KiB  fds {:>3}  cpu {:>7.2} s",
                    s.at_s, s.rss_kib, s.fds, s.cpu_s
                );
                samples.push(s);
            }
            next += every;
        }

        thread::sleep(Duration::from_millis(200));
    }

    samples.extend(sample(pid, t0));
    stop();
    Ok(samples)
}

/// The samples as a table, a row each, at `path`.
fn write_samples(path: &Path, samples: &[Sample]) -> Result<()> {
    let mut tsv = String::from("at_s\trss_kib\tfds\tcpu_s\n");
    for s in samples {
        let _ = writeln!(
            tsv,
            "{:.1}\t{}\t{}\t{:.2}",
            s.at_s, s.rss_kib, s.fds, s.cpu_s
        );
    }
    Ok(fs::write(path, tsv)?)
}

/// What is wrong with the recording at `json`, read back by memcg-trace's own reader: it does
/// not read, or it counted no calls.
fn recording_problems(bin: &Path, json: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let report = Command::new(bin).arg("report").arg(json).output()?;
    if !report.status.success() {
        problems.push(format!(
            "the recording: {}",
            String::from_utf8_lossy(&report.stderr).trim()
        ));
    }

    let calls: u64 = fs::read_to_string(json)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| {
            v["probes"]
                .as_array()
                .map(|ps| ps.iter().filter_map(|p| p["count"].as_u64()).sum())
        })
        .unwrap_or(0);
    if calls == 0 {
        problems.push("the recording counted no calls".into());
    }
    Ok(problems)
}

/// The memcgs memcg-trace made that are still there, in either hierarchy.
fn memcgs_left() -> Vec<String> {
    [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/unified",
    ]
    .iter()
    .filter_map(|r| fs::read_dir(r).ok())
    .flat_map(|rd| rd.flatten())
    .filter(|e| e.file_name().to_string_lossy().starts_with("memcg-trace."))
    .map(|e| e.path().display().to_string())
    .collect()
}

/// Growth above the `first` sample after start-up: no sample may hold more than 1 MiB + 2% of
/// its resident memory, or two more descriptors (one open for a moment during a tick).
fn growth(first: &Sample, max_rss: u64, max_fds: usize) -> Vec<String> {
    let mut problems = Vec::new();
    let rss_limit = first.rss_kib + 1024 + first.rss_kib / 50;
    if max_rss > rss_limit {
        problems.push(format!(
            "resident memory grew from {} to {max_rss} KiB",
            first.rss_kib
        ));
    }

    if max_fds > first.fds + 2 {
        problems.push(format!(
            "open descriptors grew from {} to {max_fds}",
            first.fds
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_allows_a_mebibyte_and_two_percent_and_two_descriptors() {
        let first = Sample {
            at_s: 5.0,
            rss_kib: 25_000,
            fds: 20,
            cpu_s: 0.1,
        };

        // 25,000 KiB + 1,024 + 500 is the most resident memory allowed.
        assert!(growth(&first, 26_524, 22).is_empty());
        let over = growth(&first, 26_525, 23);
        assert_eq!(over.len(), 2, "{over:?}");
        assert!(over[0].contains("grew from 25000 to 26525 KiB"), "{over:?}");
        assert!(over[1].contains("grew from 20 to 23"), "{over:?}");
    }
}
