//! HdrHistogram interval logs (`--hdr-log FILE`): one interval histogram per tick for each
//! (probe, context) and each probe's workload rows, tagged `probe.context` (`charge.task`,
//! `rstat.hardirq`, `charge.workload`), in the log format of HdrHistogram's ports (Java's
//! `HistogramLogWriter`; read by HdrHistogram_py's `HistogramLogReader`, the Java
//! `HistogramLogProcessor`, the Rust crate's `IntervalLogIterator`).
//!
//! Each interval is the difference of two snapshots' cumulative histograms, so the intervals of
//! one tag add up exactly to the recording's histogram of that row. Values are ns. Timestamps
//! are seconds since the run started (`#[BaseTime]`, also `#[StartTime]`). The file is written
//! as the run goes to an unguessable temporary name next to FILE (created O_EXCL|O_NOFOLLOW)
//! and renamed to FILE when the run ends, so FILE is never seen half-written.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufWriter, Write as _},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use anyhow::{anyhow, Result};
use hdrhistogram::serialization::{
    interval_log::{IntervalLogWriterBuilder, Tag},
    V2DeflateSerializer,
};

use crate::{
    export::{create_new, parent_dir, refuse_special, temp_name},
    figures,
    snapshot::{HistData, Snapshot},
};

/// An interval log being written.
pub struct HdrLog {
    dest: PathBuf,
    tmp: PathBuf,
    file: Option<BufWriter<fs::File>>,
    ser: V2DeflateSerializer,
    /// Cumulative histograms at the end of the last interval written, by tag.
    last: BTreeMap<String, HistData>,
    /// When the last interval ended (time since the run started).
    last_end: Duration,
    /// The first write error; the log is abandoned after it.
    error: Option<String>,
}

/// The rows of a snapshot that have latency histograms, by tag, in a stable order.
fn rows(snap: &Snapshot) -> Vec<(String, &HistData)> {
    let mut out = Vec::new();
    for p in snap.probes.iter().filter(|p| p.backend.has_latency()) {
        for (i, c) in p.contexts.iter().enumerate() {
            out.push((format!("{}.{}", p.name, snap.ctx_name(i)), &c.hist));
        }

        if let Some(w) = &p.workload {
            out.push((format!("{}.workload", p.name), w));
        }
    }
    out
}

impl HdrLog {
    /// Reserves the log's temporary file next to `dest` (so that a path that cannot be written
    /// fails before anything is traced). Nothing is written until [`HdrLog::begin`].
    pub fn create(dest: &Path) -> Result<HdrLog> {
        let name = dest
            .file_name()
            .ok_or_else(|| anyhow!("{}: not a file path", dest.display()))?;
        if dest.is_dir() {
            return Err(anyhow!("{}: is a directory", dest.display()));
        }

        refuse_special(dest)?;
        let tmp = temp_name(&parent_dir(dest), name);
        let f = create_new(&tmp).map_err(|e| anyhow!("cannot write {}: {e}", dest.display()))?;
        Ok(HdrLog {
            dest: dest.to_path_buf(),
            tmp,
            file: Some(BufWriter::new(f)),
            ser: V2DeflateSerializer::new(),
            last: BTreeMap::new(),
            last_end: Duration::ZERO,
            error: None,
        })
    }

    /// Where the log goes.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Writes the header for a run that started at `start` (the snapshots' elapsed time counts
    /// from there): format version, `about`, StartTime and BaseTime, the legend.
    pub fn begin(&mut self, start: SystemTime, about: &str) {
        let result = (|| -> std::io::Result<()> {
            let Some(f) = self.file.as_mut() else {
                return Ok(());
            };
            IntervalLogWriterBuilder::new()
                .add_comment("[Histogram log format version 1.3]")
                .add_comment(about)
                .add_comment(
                    "Values in ns; tags name probe.context (task, softirq, hardirq, nmi) or probe.workload",
                )
                .with_start_time(start)
                .with_base_time(start)
                .begin_log_with(f, &mut self.ser)?;
            writeln!(
                f,
                "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\""
            )?;
            f.flush()
        })();
        if let Err(e) = result {
            self.error = Some(format!("cannot write {}: {e}", self.dest.display()));
        }
    }

    /// Writes the interval from the last one written to `snap`: one histogram per row that has
    /// had a call so far. A write error is kept (see `finish`); the log stops there.
    pub fn interval(&mut self, snap: &Snapshot) {
        if self.error.is_some() || snap.elapsed <= self.last_end {
            return;
        }

        let start = self.last_end;
        let length = snap.elapsed - start;
        let result = (|| -> Result<()> {
            let file = self.file.as_mut().ok_or_else(|| anyhow!("closed"))?;
            let mut writer = IntervalLogWriterBuilder::new().begin_log_with(file, &mut self.ser)?;
            for (tag, h) in rows(snap) {
                let before = self.last.get(&tag);
                if h.count == 0 && before.is_none() {
                    continue;
                }

                let delta = match before {
                    Some(b) => h.since(b),
                    None => h.clone(),
                };
                let hdr_tag =
                    Tag::new(&tag).ok_or_else(|| anyhow!("tag {tag:?} has a comma or space"))?;
                writer
                    .write_histogram(
                        &figures::hdr_with(&delta, figures::INTERCHANGE_DIGITS),
                        start,
                        length,
                        Some(hdr_tag),
                    )
                    .map_err(|e| anyhow!("{e}"))?;
                self.last.insert(tag, h.clone());
            }

            drop(writer);
            if let Some(f) = self.file.as_mut() {
                f.flush()?;
            }
            Ok(())
        })();
        self.last_end = snap.elapsed;
        if let Err(e) = result {
            self.error = Some(format!("cannot write {}: {e:#}", self.dest.display()));
        }
    }

    /// Writes the last interval (to the final snapshot) and puts the log in place: flushed,
    /// synced, renamed to its name, the directory synced. Errors name the file.
    pub fn finish(mut self, last: &Snapshot) -> Result<()> {
        self.interval(last);
        if let Some(e) = self.error.take() {
            return Err(anyhow!(e));
        }

        let f = self.file.take().ok_or_else(|| anyhow!("closed"))?;
        let commit = || -> std::io::Result<()> {
            let f = f.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            fs::rename(&self.tmp, &self.dest)?;
            fs::File::open(parent_dir(&self.dest))?.sync_all()
        };
        commit().map_err(|e| {
            let _ = fs::remove_file(&self.tmp);
            anyhow!("cannot write {}: {e}", self.dest.display())
        })
    }
}

impl Drop for HdrLog {
    /// A log that was not finished (start-up failed, a panic) leaves no temporary file behind.
    fn drop(&mut self) {
        if self.file.is_some() || self.error.is_some() {
            self.file = None;
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{for_tests::one_probe, CtxStats};
    use hdrhistogram::serialization::{interval_log::IntervalLogIterator, Deserializer};

    fn snap(elapsed_ms: u64, task: &[u64], soft: &[u64]) -> Snapshot {
        let mut contexts: [CtxStats; memcg_trace_common::NUM_CTX] = Default::default();
        contexts[0].hist = HistData::of(task);
        contexts[1].hist = HistData::of(soft);
        one_probe(Duration::from_millis(elapsed_ms), contexts)
    }

    #[test]
    fn intervals_add_up_to_the_run_and_the_log_reads_back() {
        let dir = std::env::temp_dir().join(format!("memcg-trace-hdrlog-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.hlog");
        let mut log = HdrLog::create(&path).unwrap();
        log.begin(SystemTime::now(), "test");
        assert!(!path.exists(), "in place only when finished");
        log.interval(&snap(1000, &[500, 600], &[]));
        log.interval(&snap(2000, &[500, 600, 700, 90_000], &[]));
        log.finish(&snap(2500, &[500, 600, 700, 90_000, 800], &[1200]))
            .unwrap();
        let text = fs::read(&path).unwrap();
        assert!(text.starts_with(b"#[Histogram log format version 1.3]"));
        let mut per_tag: BTreeMap<String, (u64, Vec<f64>)> = BTreeMap::new();
        for item in IntervalLogIterator::new(&text) {
            if let hdrhistogram::serialization::interval_log::LogEntry::Interval(i) = item.unwrap()
            {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(i.encoded_histogram())
                    .unwrap();
                let h: hdrhistogram::Histogram<u64> =
                    Deserializer::new().deserialize(&mut &bytes[..]).unwrap();
                let e = per_tag.entry(i.tag().unwrap().to_string()).or_default();
                e.0 += h.len();
                e.1.push(i.start_timestamp().as_secs_f64());
            }
        }

        assert_eq!(per_tag["charge.task"], (5, vec![0.0, 1.0, 2.0]));

        // A row appears from its first call on.
        assert_eq!(per_tag["charge.softirq"], (1, vec![2.0]));
        assert!(!per_tag.contains_key("charge.hardirq"));
        let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unfinished_log_leaves_nothing() {
        let dir =
            std::env::temp_dir().join(format!("memcg-trace-hdrlog-drop-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let log = HdrLog::create(&dir.join("x.hlog")).unwrap();
        drop(log);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
        let _ = fs::remove_dir_all(&dir);
        assert!(HdrLog::create(Path::new("/nonexistent-dir/x.hlog")).is_err());
    }
}
