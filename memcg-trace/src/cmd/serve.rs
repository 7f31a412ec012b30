//! `memcg-trace serve`: attach like `record`, run until stopped, and answer Prometheus scrapes
//! of `/metrics`. Each scrape is answered from the latest figures, made into a recording the
//! way `record` makes its JSON (one definition of every figure), by the session's loop.
//!
//! The HTTP side runs on a thread of its own (a current-thread runtime) that holds no
//! capability at all: the listener is bound before anything is attached, and the session's
//! start-up (BTF, the verifier, calibration) is synchronous, so only another thread can answer
//! meanwhile. Scrapes during start-up and shutdown get `memcg_trace_up 0` at once, never a
//! refused connection or a hang.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{anyhow, Context as _, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{body::Incoming, header, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::{
    export::{self, Document},
    metrics::{self, Format, Listed},
    session::{End, Event, LiveArgs, Options, Session, Verbosity},
};

/// `serve` options.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub live: LiveArgs,
    /// Address to serve `/metrics` on. Loopback by default; any other address exposes the
    /// figures to whoever can reach it.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub listen: SocketAddr,
    /// Also write the recording (JSON, as `record -o`) of the whole run when stopped.
    #[arg(long, short = 'o')]
    pub output: Option<std::path::PathBuf>,
}

/// The tests' way to hold the (synchronous) start-up this many milliseconds after the listener
/// is up, to prove scrapes meanwhile are answered rather than left hanging.
pub const SLOW_START: &str = "MEMCG_TRACE_TEST_SLOW_START_MS";

/// Connections served at once; more wait in the kernel's accept queue.
const MAX_CONNECTIONS: usize = 64;

/// A scrape's request for the latest figures, with the breakdowns' series chosen so far.
type Ask = oneshot::Sender<Option<Arc<(Document, Listed)>>>;

/// `memcg-trace serve`.
pub async fn run(args: ServeArgs) -> Result<i32> {
    if let Some(o) = &args.output {
        export::check_writable(o)?;
    }

    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("--listen {}: cannot listen there", args.listen))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let (ask_tx, mut ask_rx) = mpsc::channel::<Ask>(MAX_CONNECTIONS);

    // Set while the loop below answers: before (start-up) and after, scrapes get up 0 at once.
    let serving = Arc::new(AtomicBool::new(false));
    {
        let serving = serving.clone();
        std::thread::Builder::new()
            .name("memcg-trace-http".into())
            .spawn(move || http_thread(listener, ask_tx, serving))
            .context("start the HTTP thread")?;
    }

    if let Some(ms) = std::env::var(SLOW_START).ok().and_then(|v| v.parse().ok()) {
        // Synchronous, like the start-up it stands for.
        std::thread::sleep(Duration::from_millis(ms));
    }

    let opts = Options {
        verbosity: Verbosity::Normal,
        dashboard: false,
        least_privilege: true,
    };
    let mut session = match Session::start_or_exit_code(&args.live, opts, |_| Ok(())).await? {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    session.without_history();

    // Kept across scrapes: a breakdown's row that became a series stays one.
    let mut listed = Listed::default();
    serving.store(true, Ordering::SeqCst);
    eprintln!("memcg-trace: serving http://{addr}/metrics");
    let end = loop {
        tokio::select! {
            ev = session.next() => match ev? {
                Event::Tick(_) => {}
                // The workload's rows are final now: take them at once rather than at the
                // next tick, so a scrape from here on has all of them. Serving goes on until
                // stopped (the system-wide rows keep counting).
                Event::WorkloadExited(code) => {
                    session.refresh().await?;
                    eprintln!(
                        "memcg-trace: the workload exited ({}); still serving",
                        code.map_or("killed".into(), |c| c.to_string())
                    );
                }
                Event::Signal(sig) => break End::Signal(sig),
            },
            Some(ask) = ask_rx.recv() => {
                let doc = export::document(&session.latest(), &session.meta_now());
                listed.update(&doc);
                let _ = ask.send(Some(Arc::new((doc, listed.clone()))));
            }
        }
    };

    // From now on scrapes get up 0 at once; those already waiting here are answered so too.
    serving.store(false, Ordering::SeqCst);
    ask_rx.close();
    while let Ok(ask) = ask_rx.try_recv() {
        let _ = ask.send(None);
    }

    let fin = session.finish(end).await?;
    if let Some(o) = &args.output {
        export::write_atomic(o, &export::document(&fin.snapshot, &fin.meta))?;
        eprintln!("memcg-trace: wrote {}", o.display());
    }

    fin.report_hdr_log()?;
    Ok(0)
}

/// Drops every capability of the calling thread (the HTTP thread needs none) and forbids it
/// to gain any.
fn drop_all_caps() -> Result<()> {
    use caps::CapSet;
    let _ = caps::clear(None, CapSet::Ambient);
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::clear(None, set).map_err(|e| anyhow!("drop capabilities: {e}"))?;
    }

    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(anyhow!(
            "set no_new_privs: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn http_thread(listener: std::net::TcpListener, ask: mpsc::Sender<Ask>, serving: Arc<AtomicBool>) {
    if let Err(e) = drop_all_caps() {
        eprintln!("memcg-trace: warning: HTTP thread: {e:#}");
    }

    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("memcg-trace: error: HTTP thread: {e}");
            return;
        }
    };
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("memcg-trace: error: HTTP listener: {e}");
                return;
            }
        };
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // Out of descriptors, say: not a busy loop.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (ask, serving) = (ask.clone(), serving.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let ask = serving.load(Ordering::SeqCst).then(|| ask.clone());
                    answer(req, ask)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                drop(permit);
            });
        }
    });
}

async fn answer(
    req: Request<Incoming>,
    ask: Option<mpsc::Sender<Ask>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, ctype: &str, body: String| {
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, ctype)
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response")
    };
    if req.uri().path() != "/metrics" {
        return Ok(reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "memcg-trace serves /metrics\n".into(),
        ));
    }

    let format = Format::from_accept(
        req.headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );

    // Not serving (start-up, shutdown): up 0 at once. Serving: the session's loop answers;
    // if it cannot within a few seconds, 503 (a busy daemon is not a down one).
    let doc = match ask {
        None => None,
        Some(ask) => {
            let (tx, rx) = oneshot::channel();
            let asked = async {
                ask.send(tx).await.ok()?;
                rx.await.ok()
            };
            match tokio::time::timeout(Duration::from_secs(5), asked).await {
                Ok(Some(doc)) => doc,
                Ok(None) => None,
                Err(_) => {
                    return Ok(reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain; charset=utf-8",
                        "memcg-trace is busy: try again\n".into(),
                    ))
                }
            }
        }
    };
    let body = match doc.as_deref() {
        Some((doc, listed)) => metrics::encode_listed(Some(doc), listed, format),
        None => metrics::encode(None, format),
    };
    Ok(reply(StatusCode::OK, format.content_type(), body))
}
