//! `memcg-trace serve`: attach like `record`, run until stopped, and answer Prometheus scrapes
//! of `/metrics` on the one runtime the daemon uses. The listener is bound before anything is
//! attached, so a scrape during start-up gets `memcg_trace_up 0`, never a refused connection
//! or a hang; each scrape is answered from the latest figures, made into a recording the way
//! `record` makes its JSON (one definition of every figure).

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{body::Incoming, header, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};

use crate::{
    export::{self, Document},
    metrics::{self, Format},
    session::{self, End, Event, LiveArgs, Options, Session, Verbosity},
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

/// The tests' way to hold start-up for this many milliseconds after the listener is up, to
/// prove scrapes meanwhile are answered (`memcg_trace_up 0`) rather than left hanging.
pub const SLOW_START: &str = "MEMCG_TRACE_TEST_SLOW_START_MS";

/// A scrape's request for the latest figures.
type Ask = oneshot::Sender<Option<Arc<Document>>>;

/// `memcg-trace serve`.
pub async fn run(args: ServeArgs) -> Result<i32> {
    if let Some(o) = &args.output {
        export::check_writable(o)?;
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen {}: cannot listen there", args.listen))?;
    let addr = listener.local_addr()?;
    let (ask_tx, mut ask_rx) = mpsc::channel::<Ask>(16);
    // Set while the loop below answers: before (start-up) and after, scrapes get up 0 at once.
    let serving = Arc::new(AtomicBool::new(false));
    let server = tokio::spawn(accept(listener, ask_tx, serving.clone()));
    if let Some(ms) = std::env::var(SLOW_START).ok().and_then(|v| v.parse().ok()) {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
    let opts = Options {
        verbosity: Verbosity::Normal,
        dashboard: false,
        least_privilege: true,
    };
    let mut s = match Session::start(&args.live, opts, |_| Ok(())).await {
        Ok(s) => s,
        Err(e) => {
            server.abort();
            return match session::interrupted_exit_code(&e) {
                Some(code) => {
                    eprintln!("memcg-trace: {e:#}");
                    Ok(code)
                }
                None => Err(e),
            };
        }
    };
    s.without_history();
    serving.store(true, Ordering::SeqCst);
    eprintln!("memcg-trace: serving http://{addr}/metrics");
    let end = loop {
        tokio::select! {
            ev = s.next() => match ev? {
                Event::Tick(_) => {}
                // The figures freeze; serving goes on until stopped.
                Event::WorkloadExited(code) => {
                    eprintln!("memcg-trace: the workload exited ({}); still serving", code.map_or("killed".into(), |c| c.to_string()));
                }
                Event::Signal(sig) => break End::Signal(sig),
            },
            Some(ask) = ask_rx.recv() => {
                let doc = export::document(&s.latest(), &s.meta_now());
                let _ = ask.send(Some(Arc::new(doc)));
            }
        }
    };
    // Scrapes from now on are told the figures are gone (up 0), never left hanging.
    serving.store(false, Ordering::SeqCst);
    server.abort();
    let fin = s.finish(end).await?;
    if let Some(o) = &args.output {
        export::write_atomic(o, &export::document(&fin.snapshot, &fin.meta))?;
        eprintln!("memcg-trace: wrote {}", o.display());
    }
    Ok(0)
}

/// Accepts connections and serves each on its own task.
async fn accept(
    listener: tokio::net::TcpListener,
    ask: mpsc::Sender<Ask>,
    serving: Arc<AtomicBool>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let ask = ask.clone();
        let serving = serving.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let ask = serving.load(Ordering::SeqCst).then(|| ask.clone());
                answer(req, ask)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
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
    // The figures from the session; during start-up (the session is not asking yet) or if
    // it is gone, none: up 0.
    let (tx, rx) = oneshot::channel();
    let doc = match ask.map(|a| a.try_send(tx)) {
        Some(Ok(())) => rx.await.ok().flatten(),
        _ => None,
    };
    Ok(reply(
        StatusCode::OK,
        format.content_type(),
        metrics::encode(doc.as_deref(), format),
    ))
}
