//! The collector: one tokio task that owns the tracer, reads its maps once per tick into a
//! `Snapshot` and publishes the latest one. Every live output (the progress lines of `record`,
//! the dashboard, the Prometheus endpoint) reads from this one stream; none polls the maps.
//! Stopping it detaches every program and yields the final snapshot.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Result};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
    time::MissedTickBehavior,
};

use crate::{snapshot::Snapshot, tracer::Tracer};

/// What the collector returns when it stops.
#[derive(Debug)]
pub struct Final {
    /// The figures after every program was detached: nothing ran between the read of the maps
    /// and the read of the programs' run statistics.
    pub snapshot: Snapshot,
    /// How long detaching took.
    pub detach: Duration,
}

enum Control {
    Tick(Duration),
    /// Take a snapshot at once, publish it, and hand it back.
    Now(oneshot::Sender<Arc<Snapshot>>),
    Stop,
}

/// A running collector.
pub struct Collector {
    latest: watch::Receiver<Arc<Snapshot>>,
    control: mpsc::UnboundedSender<Control>,
    task: JoinHandle<Result<Final>>,
}

impl Collector {
    /// Starts collecting from `tracer` every `tick`; the first snapshot is taken at once.
    pub fn spawn(mut tracer: Tracer, tick: Duration) -> Result<Collector> {
        let first = tracer.snapshot()?;
        let (tx, latest) = watch::channel(Arc::new(first));
        let (control, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(tracer, tick, tx, rx));
        Ok(Collector {
            latest,
            control,
            task,
        })
    }

    /// A receiver that sees every new snapshot (the latest one when several came in between).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.latest.clone()
    }

    /// The latest snapshot.
    pub fn latest(&self) -> Arc<Snapshot> {
        self.latest.borrow().clone()
    }

    /// Changes the tick from now on.
    pub fn set_tick(&self, tick: Duration) {
        let _ = self.control.send(Control::Tick(tick));
    }

    /// Takes a snapshot now (besides the ticks), publishes it like a tick's and returns it: for
    /// figures that must include everything up to this moment (a workload that just exited).
    pub async fn now(&self) -> Result<Arc<Snapshot>> {
        let (tx, rx) = oneshot::channel();
        self.control
            .send(Control::Now(tx))
            .map_err(|_| anyhow!("the collector stopped"))?;
        rx.await.map_err(|_| anyhow!("the collector stopped"))
    }

    /// Stops collecting: detaches every program and returns the final figures.
    pub async fn finish(self) -> Result<Final> {
        let _ = self.control.send(Control::Stop);
        self.task
            .await
            .map_err(|e| anyhow!("the collector task failed: {e}"))?
    }
}

fn interval(tick: Duration) -> tokio::time::Interval {
    let mut i = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
    i.set_missed_tick_behavior(MissedTickBehavior::Delay);
    i
}

async fn run(
    mut tracer: Tracer,
    tick: Duration,
    tx: watch::Sender<Arc<Snapshot>>,
    mut control: mpsc::UnboundedReceiver<Control>,
) -> Result<Final> {
    let mut ticks = interval(tick);
    loop {
        tokio::select! {
            _ = ticks.tick() => {
                tracer.flush_log();

                // A reader that went away does not stop the collection.
                let _ = tx.send(Arc::new(tracer.snapshot()?));
            }
            c = control.recv() => match c {
                Some(Control::Tick(t)) => ticks = interval(t),
                Some(Control::Now(reply)) => {
                    tracer.flush_log();
                    let snap = Arc::new(tracer.snapshot()?);
                    let _ = tx.send(snap.clone());
                    let _ = reply.send(snap);
                }
                Some(Control::Stop) | None => break,
            },
        }
    }

    let t = Instant::now();
    let snapshot = tracer.finish()?;
    Ok(Final {
        snapshot,
        detach: t.elapsed(),
    })
}
