//! `memcg-trace serve` scraped by a real Prometheus (Debian's `prometheus` package) on this
//! machine's kernel: its rate of the calls agrees with memcg-trace's own, `promtool check
//! metrics` accepts a scrape, start-up and shutdown answer instead of hanging.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use memcg_trace_tests::*;

/// A GET over HTTP/1.1 with `Connection: close`: (status, body).
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;

    // Chunked bodies (Prometheus's API) are decoded; ours has a length.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((len, after)) = rest.split_once("\r\n") {
            let chunk_len = usize::from_str_radix(len.trim(), 16).ok()?;
            if chunk_len == 0 {
                break;
            }

            out.push_str(after.get(..chunk_len)?);
            rest = after.get(chunk_len + 2..)?;
        }
        out
    } else {
        body.to_string()
    };
    Some((status, body))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Percent-encoding of a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of the series `name{labels}` in a Prometheus text exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// One instant query: the first result's value.
fn query(port: u16, q: &str, at: f64) -> Option<f64> {
    let (_, body) = get(
        port,
        &format!("/api/v1/query?query={}&time={at:.3}", encode(q)),
    )?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// A child stopped (SIGTERM) and reaped when the test ends, however it ends.
struct Killed(Option<Child>);

impl Killed {
    /// SIGTERM now; its exit status.
    fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.0.take().expect("running");

        // SAFETY: kill(2) of our child, not yet reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait().expect("wait")
    }

    /// Stops the child (if still running) and returns its exit status and what it wrote to
    /// stderr: for the failure message, as nobody can rerun a failed CI run.
    fn stop_with_stderr(&mut self) -> String {
        let Some(c) = self.0.as_mut() else {
            return "(already stopped)".into();
        };
        let mut err = String::new();
        let mut pipe = c.stderr.take();
        let st = match c.try_wait() {
            Ok(Some(st)) => st,
            _ => self.stop(),
        };
        if let Some(p) = pipe.as_mut() {
            // What is there now: the workload may still hold the pipe open.
            use std::os::fd::AsRawFd as _;

            // SAFETY: fcntl(2) on a pipe we own.
            unsafe { libc::fcntl(p.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
            let mut raw = Vec::new();
            let _ = p.read_to_end(&mut raw);
            err = String::from_utf8_lossy(&raw).into_owned();
        }

        self.0 = None;
        format!("serve: {st}; its stderr:\n{err}")
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        if self.0.is_some() {
            let _ = self.stop();
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The series of stat's task-context calls, as Prometheus selects it.
const STAT_TASK_SELECTOR: &str = "memcg_trace_calls_total{probe=\"stat\",context=\"task\"}";

#[test]
fn serve_is_scraped_by_a_real_prometheus() {
    let name = "serve_is_scraped_by_a_real_prometheus";
    if !is_root() {
        skip(name, "needs root");
        return;
    }

    let (prometheus, promtool) = (
        Path::new("/usr/bin/prometheus"),
        Path::new("/usr/bin/promtool"),
    );
    if !prometheus.exists() || !promtool.exists() {
        skip(name, "prometheus missing (cargo xtask setup installs it)");
        return;
    }

    let Some(hb) = hackbench_or_skip(name) else {
        return;
    };
    let dir = scratch(name);
    let (port, mut serve) = start_serve(&hb);
    let listen = format!("127.0.0.1:{port}");
    let prom_port = free_port();
    assert_ne!(prom_port, port);
    let (text, starting) = scrape_through_start_up(port, &mut serve);
    check_http_thread_has_no_capability(&serve);
    assert_eq!(get(port, "/nothing").map(|r| r.0), Some(404));
    check_with_promtool(promtool, &text);
    let series = "memcg_trace_calls_total{probe=\"stat\",context=\"task\"";
    assert!(text.contains(series), "{text}");
    let _prom = scraped_by_prometheus(prometheus, &dir, &listen, prom_port);
    let sel = STAT_TASK_SELECTOR;

    // memcg-trace's own rate over a window, from two scrapes of ours, and Prometheus's over
    // the same window.
    let ours = |t: &str| sample(t, series).expect("the stat task series");
    let (ta, a) = (unix_now(), ours(&get(port, "/metrics").unwrap().1));
    thread::sleep(Duration::from_secs(12));
    let (tb, b) = (unix_now(), ours(&get(port, "/metrics").unwrap().1));
    let own = (b - a) / (tb - ta);

    // Let the scrape after tb land.
    thread::sleep(Duration::from_secs(2));
    let window = (tb - ta).round() as u64;
    let prom_rate =
        query(prom_port, &format!("rate({sel}[{window}s])"), tb).expect("prometheus's rate");
    assert!(own > 0.0, "no calls counted: {a} -> {b}");
    let diff = (prom_rate - own).abs() / own;
    summary(
        name,
        &format!("calls/s over {window} s: memcg-trace {own:.0}, Prometheus rate() {prom_rate:.0} ({:+.1}%); scrape {} bytes, {} series; {starting} scrapes answered during start-up (up 0)", (prom_rate - own) / own * 100.0, text.len(), text.lines().filter(|l| !l.starts_with('#')).count()),
    );
    assert!(
        diff <= 0.10,
        "Prometheus's rate {prom_rate:.1}/s vs memcg-trace's {own:.1}/s: {:.1}% apart",
        diff * 100.0
    );

    // Shutdown: SIGTERM ends serve cleanly (0), its memcg removed.
    let st = serve.stop();
    assert_eq!(st.code(), Some(0), "serve's exit");
    assert!(leftover_memcgs().is_empty(), "{:?}", leftover_memcgs());
    assert!(
        get(port, "/metrics").is_none(),
        "still listening after exit"
    );
}

/// `memcg-trace serve` beside a looping hackbench, start-up held for 3 s once it listens, on a
/// free port: its port and process once it answers.
fn start_serve(hb: &str) -> (u16, Killed) {
    let spawn = |port: u16| {
        let serve = Command::new(bin())
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--tick",
                "250ms",
                "--",
            ])
            .args([
                "sh",
                "-c",
                &format!("while :; do {hb} -g 1 -l 200 >/dev/null; done"),
            ])
            // Start-up held for 3 s once the listener is up: scrapes meanwhile must be answered.
            .env(memcg_trace::cmd::serve::SLOW_START, "3000")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start serve");
        Killed(Some(serve))
    };

    // A free port can be taken by another process before serve binds it: then serve ends
    // with "cannot listen there" and another port is tried.
    let mut tries = 0;
    loop {
        let port = free_port();
        let mut serve = spawn(port);
        let started = Instant::now();
        while get(port, "/metrics").is_none()
            && !serve
                .0
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
            && started.elapsed() < Duration::from_secs(30)
        {
            thread::sleep(Duration::from_millis(20));
        }

        if get(port, "/metrics").is_some() {
            break (port, serve);
        }

        let why = serve.stop_with_stderr();
        tries += 1;
        assert!(
            why.contains("cannot listen there") && tries < 3,
            "serve never listened (after {:?})\n{why}",
            started.elapsed()
        );
    }
}

/// Scrapes from start-up until `memcg_trace_up` is 1: every scrape answered at once, with up 0
/// and nothing else during start-up. Returns the first scrape with up 1, and how many were
/// answered during start-up (at least one).
fn scrape_through_start_up(port: u16, serve: &mut Killed) -> (String, u32) {
    // Start-up and then serving: every scrape is answered; up turns 1.
    let t0 = Instant::now();
    let mut starting = 0;

    // It answered above: from now on every scrape must be answered, and at once.
    let mut listening = true;
    let text = loop {
        let asked = Instant::now();
        let got = get(port, "/metrics");

        // Once the listener is up, every scrape is answered, and at once.
        if listening && (got.is_none() || asked.elapsed() >= Duration::from_secs(2)) {
            let why = serve.stop_with_stderr();
            panic!(
                "a scrape during start-up was not answered at once ({:?}: {})\n{why}",
                asked.elapsed(),
                if got.is_some() {
                    "answered late"
                } else {
                    "not answered"
                }
            );
        }
        listening |= got.is_some();
        if let Some((status, body)) = got {
            assert_eq!(status, 200, "{body}");
            let up = sample(&body, "memcg_trace_up ");
            if up == Some(1.0) {
                break body;
            }

            // Answered at once, with nothing but up 0.
            assert_eq!(up, Some(0.0), "{body}");
            assert!(!body.contains("memcg_trace_calls_total"), "{body}");
            starting += 1;
        }

        // Ended (it should not) or not up in time (start-up takes 3 s and a fraction here;
        // two minutes leave room for a loaded machine): show why.
        let ended = serve
            .0
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
        if ended || t0.elapsed() >= Duration::from_secs(120) {
            let why = serve.stop_with_stderr();
            panic!(
                "serve never came up ({} after {:?}, {starting} scrapes answered with up 0)\n{why}",
                if ended { "it ended" } else { "still starting" },
                t0.elapsed()
            );
        }

        thread::sleep(Duration::from_millis(100));
    };
    assert!(starting > 0, "no scrape was answered during start-up");
    (text, starting)
}

/// The thread that talks to the network holds no capability at all.
fn check_http_thread_has_no_capability(serve: &Killed) {
    let pid = serve.0.as_ref().unwrap().id();
    let http = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| t.ok())
        .find(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "memcg-trace-htt")
        })
        .expect("the HTTP thread");
    let status = std::fs::read_to_string(http.path().join("status")).unwrap();
    for set in ["CapEff:", "CapPrm:", "CapInh:", "CapAmb:"] {
        let v = status
            .lines()
            .find_map(|l| l.strip_prefix(set))
            .unwrap_or("?")
            .trim();
        assert_eq!(v, "0000000000000000", "{set} of the HTTP thread");
    }
}

/// promtool accepts a scrape.
fn check_with_promtool(promtool: &Path, text: &str) {
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A real Prometheus scraping `listen` every second, once it has scraped it 4 times (stopped when
/// the returned value is dropped).
fn scraped_by_prometheus(prometheus: &Path, dir: &Path, listen: &str, prom_port: u16) -> Killed {
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: memcg-trace\n    static_configs:\n      - targets: ['{listen}']\n"
        ),
    )
    .unwrap();
    let prom = Command::new(prometheus)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start prometheus");
    let prom = Killed(Some(prom));
    let sel = STAT_TASK_SELECTOR;
    let t0 = Instant::now();
    loop {
        let count = query(
            prom_port,
            &format!("count_over_time({sel}[1m])"),
            unix_now(),
        );
        if count.is_some_and(|n| n >= 4.0) {
            break;
        }

        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "prometheus did not scrape serve 4 times (last count {count:?})"
        );
        thread::sleep(Duration::from_millis(500));
    }
    prom
}

#[test]
fn the_fleet_rules_check_and_evaluate() {
    let name = "the_fleet_rules_check_and_evaluate";
    let promtool = Path::new("/usr/bin/promtool");
    if !promtool.exists() {
        skip(
            name,
            "promtool missing (cargo xtask setup installs prometheus)",
        );
        return;
    }

    let dir = xtask::workspace_root().join("contrib/prometheus");
    for args in [
        ["check", "rules", "memcg-trace.rules.yml"],
        ["test", "rules", "memcg-trace.rules.test.yml"],
    ] {
        let out = Command::new(promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_systemd_unit_verifies() {
    let name = "the_systemd_unit_verifies";
    let analyze = Path::new("/usr/bin/systemd-analyze");
    if !analyze.exists() {
        skip(name, "systemd-analyze missing (Debian's systemd package)");
        return;
    }

    let unit = std::fs::read_to_string(xtask::workspace_root().join("contrib/memcg-trace.service"))
        .unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/memcg-trace serve"),
        "{unit}"
    );
    assert!(unit.contains("DynamicUser=yes"), "not root: {unit}");

    // The unit as installed, with this build as its binary.
    let dir = scratch(name);
    let path = dir.join("memcg-trace.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/memcg-trace", bin().to_str().unwrap()),
    )
    .unwrap();

    // Its Documentation= names the man pages a package installs: made by this build, and
    // found by systemd-analyze (it runs man for each) on MANPATH.
    let made = Command::new(bin())
        .arg("generate")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "generate: {made:?}");
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .env("MANPATH", dir.join("man"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}
