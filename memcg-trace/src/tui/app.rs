//! Dashboard state: what is selected, paused, shown; derived rows from the latest `Snapshot`s.
//! No terminal here, so every key and every figure is unit-tested.

use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

use crate::{
    figures::{self, rate},
    probes::Backend,
    snapshot::{HistData, Snapshot},
};

/// Interval (last tick) or cumulative (since start or the last reset) figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Figures of the last tick.
    Interval,
    /// Figures since start or reset.
    Cumulative,
}

/// What a key asks the event loop to do beyond changing state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing more.
    None,
    /// Leave the dashboard.
    Quit,
    /// Write a JSON snapshot.
    Save,
    /// The tick changed; tell the collector.
    Tick(Duration),
}

/// Keys the dashboard understands, independent of the terminal library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// Up arrow or k.
    Up,
    /// Down arrow or j.
    Down,
    /// Left arrow: a tick back in a recording's history.
    Left,
    /// Right arrow: a tick forward.
    Right,
    /// Tab.
    Tab,
    /// Any character.
    Char(char),
    /// Esc.
    Esc,
    /// Ctrl-C.
    CtrlC,
    /// The terminal changed size: draw again.
    Redraw,
}

/// Static facts shown in the header.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Header {
    /// `uname -r`.
    pub kernel: String,
    /// Preemption model.
    pub preemption: String,
    /// A recording being viewed (read-only), with its file name.
    pub recording: Option<String>,
    /// The instrumentation floor per latency backend in use.
    pub floors: Vec<crate::model::Floor>,
    /// What could not be calibrated (shown as a warning).
    pub calibration: Vec<String>,
}

/// One row of the main table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Probe name.
    pub probe: String,
    /// Context name, or "workload" for the workload's own task-context calls.
    pub context: &'static str,
    /// Backend.
    pub backend: Backend,
    /// Calls per second.
    pub rate: Option<f64>,
    /// Percentiles p50, p99, p99.9, ns (None for counts-only backends or no calls).
    pub p50: Option<u64>,
    /// p99.
    pub p99: Option<u64>,
    /// p99.9.
    pub p999: Option<u64>,
    /// Longest, ns.
    pub max: Option<u64>,
    /// Mean, ns.
    pub mean: Option<f64>,
    /// Share of one CPU spent inside the function.
    pub cpu: Option<f64>,
    /// `cpu` is an upper bound: some call's time off the CPU is unknown or only a lower bound
    /// (`CtxStats::on_cpu_unknown`; shown `<=`).
    pub cpu_at_most: bool,
    /// The same for its self time (the traced calls nested in it left out); None where the
    /// nesting was not followed (recordings from before, fentry on preemptible kernels).
    pub self_cpu: Option<f64>,
    /// `self_cpu` is an upper bound: some call's nesting is unknown and its whole time counted
    /// as its own (`Counters::self_unknown`; shown `<=`).
    pub self_at_most: bool,
    /// Calls that left the CPU were not timed in the row's window (`CtxStats::censored`): its
    /// p99, p99.9, maximum and mean are lower bounds (shown `>=`).
    pub censored: bool,
    /// The histogram behind the row.
    pub hist: HistData,
}

/// One call site in the callers pane (or one memcg in the memcgs pane).
#[derive(Debug, Clone, PartialEq)]
pub struct SiteRow {
    /// `function+0xoff` (a memcg: its cgroup path).
    pub name: String,
    /// Calls over the window.
    pub count: u64,
    /// Calls per second over the window.
    pub rate: Option<f64>,
    /// Median latency, ns.
    pub p50: Option<u64>,
    /// 99th percentile, ns.
    pub p99: Option<u64>,
    /// Summed latency over the window, ns.
    pub sum_ns: u64,
    /// Share of the context's time spent in calls from here.
    pub time_share: Option<f64>,
}

/// Rate history kept per row: one value per tick, this many ticks (a recording's is kept
/// whole).
pub const HISTORY: usize = 600;

/// What the rows are sorted by (`o` cycles through them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sort {
    /// As the probes were given, contexts in kernel order.
    #[default]
    Probe,
    /// Calls per second, most first.
    Rate,
    /// Share of a CPU, most first.
    Cpu,
    /// p99, slowest first.
    P99,
    /// Longest call, slowest first.
    Max,
}

impl Sort {
    fn next(self) -> Sort {
        match self {
            Sort::Probe => Sort::Rate,
            Sort::Rate => Sort::Cpu,
            Sort::Cpu => Sort::P99,
            Sort::P99 => Sort::Max,
            Sort::Max => Sort::Probe,
        }
    }

    /// As the header names it.
    pub fn name(self) -> &'static str {
        match self {
            Sort::Probe => "probe",
            Sort::Rate => "calls/s",
            Sort::Cpu => "cpu%",
            Sort::P99 => "p99",
            Sort::Max => "max",
        }
    }
}

/// A second run shown beside the first (`view A.json B.json`): its rows, matched by probe and
/// row name, and what the header calls it.
#[derive(Clone, Debug)]
pub struct Compare {
    /// The file.
    pub name: String,
    /// Its rows (cumulative: the whole run).
    pub rows: Vec<Row>,
}

/// The dashboard's state.
#[derive(Debug)]
pub struct App {
    /// Header facts.
    pub header: Header,
    /// The latest snapshot received.
    pub current: Option<Snapshot>,
    /// The one before it (interval figures are the difference).
    pub previous: Option<Snapshot>,
    /// Cumulative figures start here (set by reset).
    pub base: Option<Snapshot>,
    /// Selected row.
    pub selected: usize,
    /// Interval or cumulative.
    pub mode: Mode,
    /// Paused: snapshots are not taken in.
    pub paused: bool,
    /// The workload ended: the whole run is shown, frozen at its end (until `p`).
    pub ended: bool,
    /// Help overlay shown.
    pub help: bool,
    /// Poll interval.
    pub tick: Duration,
    /// A one-line message (saved file, read-only, ...).
    pub message: Option<String>,
    /// Workload status line, when one runs.
    pub workload: Option<String>,
    /// The workload's CPU time since the start, ns (its cgroup's, or its process tree's once
    /// it has exited), where known: the base of `workload_cpu_line` (set with
    /// `set_workload_cpu`).
    workload_cpu_ns: Option<u64>,
    /// `workload_cpu_line`'s text, short and long, made once per snapshot or CPU reading.
    workload_cpu_text: Option<(String, String)>,
    /// Rates per row key over the last ticks.
    pub history: HashMap<(String, &'static str), VecDeque<u64>>,
    /// Interval p99 per row key over the last ticks, ns (0: none timed).
    pub p99_history: HashMap<(String, &'static str), VecDeque<u64>>,
    /// A recording's tick ends, ms since start (empty live).
    pub times_ms: Vec<u64>,
    /// The tick the history panes point at (a recording's, moved with the arrow keys).
    pub step: Option<usize>,
    /// Row order.
    pub sort: Sort,
    /// Rows without calls hidden.
    pub hide_empty: bool,
    /// The percentile spectrum instead of the histogram.
    pub spectrum: bool,
    /// The selected row's call sites instead of its histogram (`--callers`).
    pub callers: bool,
    /// The selected row's charged memcgs instead of its histogram (`--by-memcg`).
    pub memcgs: bool,
    /// The B side of an A/B view.
    pub compare: Option<Compare>,
    /// The selected row's key, kept across ticks and sorts.
    pub selected_key: Option<(String, &'static str)>,
    /// Something changed since the last draw.
    pub dirty: bool,
}

fn key_of(r: &Row) -> (String, &'static str) {
    (r.probe.clone(), r.context)
}

impl App {
    /// A dashboard with nothing received yet.
    pub fn new(header: Header, tick: Duration) -> Self {
        App {
            header,
            current: None,
            previous: None,
            base: None,
            selected: 0,
            mode: Mode::Interval,
            paused: false,
            ended: false,
            help: false,
            tick,
            message: None,
            workload: None,
            workload_cpu_ns: None,
            workload_cpu_text: None,
            history: HashMap::new(),
            p99_history: HashMap::new(),
            times_ms: Vec::new(),
            step: None,
            sort: Sort::default(),
            hide_empty: false,
            spectrum: false,
            callers: false,
            memcgs: false,
            compare: None,
            selected_key: None,
            dirty: true,
        }
    }

    /// Takes in a snapshot from the collector (ignored while paused).
    pub fn on_snapshot(&mut self, snap: Snapshot) {
        if self.paused {
            return;
        }

        self.previous = self.current.take();
        self.current = Some(snap);
        if self.previous.is_some() {
            for r in self.rows_in(Mode::Interval, true) {
                for (hist, v) in [
                    (&mut self.history, r.rate.unwrap_or(0.0).round() as u64),
                    (&mut self.p99_history, r.p99.unwrap_or(0)),
                ] {
                    let h = hist.entry(key_of(&r)).or_default();
                    h.push_back(v);
                    while h.len() > HISTORY {
                        h.pop_front();
                    }
                }
            }
        }

        self.workload_cpu_text = self.make_workload_cpu_text();
        self.follow_selection();
        self.dirty = true;
    }

    /// Applies a key.
    pub fn on_key(&mut self, key: Key) -> Action {
        self.dirty = true;
        let row_count = self.rows().len();
        match key {
            Key::Char('q') | Key::Esc | Key::CtrlC => return Action::Quit,
            Key::Up | Key::Char('k') => {
                self.selected = self.selected.saturating_sub(1);
                self.remember_selection();
            }
            Key::Down | Key::Char('j') => {
                if self.selected + 1 < row_count {
                    self.selected += 1;
                }

                self.remember_selection();
            }
            Key::Left | Key::Right => {
                let ticks = self.times_ms.len();
                if ticks == 0 {
                    self.message =
                        Some("no history to step through (live, or an old recording)".into());
                } else {
                    let at = self.step.unwrap_or(ticks - 1);
                    self.step = Some(if key == Key::Left {
                        at.saturating_sub(1)
                    } else {
                        (at + 1).min(ticks - 1)
                    });
                }
            }
            Key::Char('o') => {
                self.sort = self.sort.next();
                self.follow_selection();
            }
            Key::Char('e') => {
                self.hide_empty = !self.hide_empty;
                self.follow_selection();
            }
            Key::Char('h') => self.spectrum = !self.spectrum,
            Key::Char('c') => {
                self.callers = !self.callers;
                self.memcgs = false;
            }
            Key::Char('m') => {
                self.memcgs = !self.memcgs;
                self.callers = false;
            }
            Key::Tab => {
                self.mode = match self.mode {
                    Mode::Interval => Mode::Cumulative,
                    Mode::Cumulative => Mode::Interval,
                }
            }
            Key::Char('p') => {
                self.paused = !self.paused;
                self.ended = false;
            }
            Key::Char('r') => {
                self.base = self.current.clone();
                self.history.clear();
                self.p99_history.clear();
                self.message = Some("cumulative figures reset".into());
            }
            Key::Char('s') => {
                if self.header.recording.is_some() {
                    self.message = Some("read-only: this is a recording".into());
                } else {
                    return Action::Save;
                }
            }
            Key::Char('+') => return self.set_tick(self.tick * 2),
            Key::Char('-') => return self.set_tick(self.tick / 2),
            Key::Char('?') => self.help = !self.help,
            Key::Redraw => {}
            _ => self.dirty = false,
        }
        Action::None
    }

    fn set_tick(&mut self, t: Duration) -> Action {
        if self.header.recording.is_some() {
            return Action::None;
        }

        self.tick = t.clamp(Duration::from_millis(100), Duration::from_secs(60));
        Action::Tick(self.tick)
    }

    /// Rows in the current mode, sorted and filtered as asked.
    /// The call sites of a row's probe and context (a workload row: the task context's, of
    /// every task), costliest first, with calls/s, p50 and p99 over the row's window: the last
    /// tick (interval) or since the start or reset (total).
    pub fn sites_of(&self, r: &Row) -> Vec<SiteRow> {
        self.parts_of(r, |p| &p.callers)
    }

    /// The charged memcgs of a row's probe and context (`--by-memcg`), as [`App::sites_of`]
    /// (counts only: the most called first).
    pub fn memcgs_of(&self, r: &Row) -> Vec<SiteRow> {
        self.parts_of(r, |p| &p.memcgs)
    }

    /// A breakdown of a row's calls (`part`: the probe's call sites or memcgs), as
    /// [`App::sites_of`].
    fn parts_of(
        &self,
        r: &Row,
        part: fn(&crate::snapshot::ProbeStats) -> &Vec<crate::callers::Site>,
    ) -> Vec<SiteRow> {
        let Some(cur) = self.current.as_ref() else {
            return Vec::new();
        };
        let ctx = crate::kernel::ctx_index(r.context).unwrap_or(0) as u32;
        let find = |s: &Snapshot| {
            s.probes
                .iter()
                .find(|p| p.name == r.probe)
                .map(|p| part(p).clone())
                .unwrap_or_default()
        };
        let since = match self.mode {
            Mode::Interval => self.previous.as_ref(),
            Mode::Cumulative => self.base.as_ref(),
        };
        let before = since.map(find).unwrap_or_default();
        let secs = cur
            .elapsed
            .saturating_sub(since.map_or(Duration::ZERO, |s| s.elapsed))
            .as_secs_f64();
        let total_ns: u64 = find(cur)
            .iter()
            .filter(|s| s.ctx == ctx)
            .map(|s| s.sum_ns)
            .sum::<u64>()
            .saturating_sub(
                before
                    .iter()
                    .filter(|s| s.ctx == ctx)
                    .map(|s| s.sum_ns)
                    .sum(),
            );
        let mut out: Vec<SiteRow> = find(cur)
            .into_iter()
            .filter(|s| s.ctx == ctx)
            .map(|mut s| {
                if let Some(b) = before.iter().find(|b| b.ctx == s.ctx && b.addr == s.addr) {
                    s.count = s.count.saturating_sub(b.count);
                    s.sum_ns = s.sum_ns.saturating_sub(b.sum_ns);
                    for (x, y) in s.buckets.iter_mut().zip(&b.buckets) {
                        *x = x.saturating_sub(*y);
                    }
                }
                SiteRow {
                    count: s.count,
                    rate: (secs > 0.0).then(|| s.count as f64 / secs),
                    p50: s.quantile(0.5),
                    p99: s.quantile(0.99),
                    time_share: (total_ns > 0).then(|| s.sum_ns as f64 / total_ns as f64),
                    name: s.name,
                    sum_ns: s.sum_ns,
                }
            })
            .filter(|s| s.sum_ns > 0 || s.count > 0)
            .collect();
        out.sort_by_key(|s| std::cmp::Reverse((s.sum_ns, s.count)));
        out
    }

    pub fn rows(&self) -> Vec<Row> {
        let mut rows = self.rows_in(self.mode, true);
        if self.hide_empty {
            rows.retain(|r| r.hist.count > 0);
        }

        // Largest first, rows without the figure last; ties keep the probe order (stable).
        let by = |f: fn(&Row) -> Option<f64>| {
            move |a: &Row, b: &Row| f(b).partial_cmp(&f(a)).unwrap_or(std::cmp::Ordering::Equal)
        };
        match self.sort {
            Sort::Probe => {}
            Sort::Rate => rows.sort_by(by(|r| r.rate)),
            Sort::Cpu => rows.sort_by(by(|r| r.cpu)),
            Sort::P99 => rows.sort_by(by(|r| r.p99.map(|v| v as f64))),
            Sort::Max => rows.sort_by(by(|r| r.max.map(|v| v as f64))),
        }
        rows
    }

    /// B's row matching `r` (A/B view).
    pub fn compare_row(&self, r: &Row) -> Option<&Row> {
        self.compare
            .as_ref()?
            .rows
            .iter()
            .find(|b| b.probe == r.probe && b.context == r.context)
    }

    fn remember_selection(&mut self) {
        self.selected_key = self.rows().get(self.selected).map(key_of);
    }

    /// Puts the selection back on the row it was on (rows move when sorted, appear, vanish).
    fn follow_selection(&mut self) {
        let rows = self.rows();
        if let Some(k) = &self.selected_key {
            if let Some(i) = rows.iter().position(|r| &key_of(r) == k) {
                self.selected = i;
                return;
            }
        }

        if !rows.is_empty() && self.selected >= rows.len() {
            self.selected = rows.len() - 1;
        }

        self.selected_key = rows.get(self.selected).map(key_of);
    }

    fn rows_in(&self, mode: Mode, latency: bool) -> Vec<Row> {
        let Some(cur) = &self.current else {
            return Vec::new();
        };
        let earlier = match mode {
            Mode::Interval => self.previous.as_ref(),
            Mode::Cumulative => self.base.as_ref(),
        };
        let elapsed = cur
            .elapsed
            .saturating_sub(earlier.map(|e| e.elapsed).unwrap_or_default());
        let mut out = Vec::new();
        for p in &cur.probes {
            let before = earlier.and_then(|e| e.probes.iter().find(|q| q.name == p.name));
            for (i, c) in p.contexts.iter().enumerate() {
                let mut hist = match before {
                    Some(b) => c.hist.since(&b.contexts[i].hist),
                    None => c.hist.clone(),
                };

                // The counts-only backend counts hits, not timed calls.
                hist.count = p
                    .ctx_calls(i)
                    .saturating_sub(before.map(|b| b.ctx_calls(i)).unwrap_or(0));
                if p.ctx_calls(i) == 0 && i != 0 {
                    continue;
                }

                let known = self_known(c);
                let censored =
                    c.censored(i) > before.map(|b| b.contexts[i].censored(i)).unwrap_or(0);
                let mut ctx_row = row(
                    &p.name,
                    cur.ctx_name(i),
                    p.backend,
                    hist,
                    elapsed,
                    latency,
                    known,
                );
                ctx_row.censored = censored;
                ctx_row.cpu_at_most = c.on_cpu_unknown();
                ctx_row.self_at_most = c.counters.self_unknown > 0;
                out.push(ctx_row);
            }

            if let Some(w) = &p.workload {
                let workload_hist = match before.and_then(|b| b.workload.as_ref()) {
                    Some(b) => w.since(b),
                    None => w.clone(),
                };
                let known = self_known(&p.contexts[0]);
                let mut workload_row = row(
                    &p.name,
                    "workload",
                    p.backend,
                    workload_hist,
                    elapsed,
                    latency,
                    known,
                );
                // Its calls are task calls: those of the task row's window left out.
                workload_row.censored = p.contexts[0].censored(0)
                    > before.map(|b| b.contexts[0].censored(0)).unwrap_or(0);
                workload_row.cpu_at_most = p.contexts[0].on_cpu_unknown();

                // Its calls are task calls (the dashboard's self% of it reads the task row's
                // nesting too).
                workload_row.self_at_most = p.contexts[0].counters.self_unknown > 0;
                out.push(workload_row);
            }
        }
        out
    }

    /// Tracer self-cost over the whole run, and the calls lost and missed.
    pub fn self_cost(&self) -> (figures::TracerCost, u64, u64) {
        match &self.current {
            Some(cur) => {
                let (lost, misses) = figures::losses(cur);
                (figures::tracer_cost(cur), lost, misses)
            }
            None => Default::default(),
        }
    }

    /// The workload's CPU time since the start, read with the snapshot it goes with: ignored
    /// while paused, as the snapshots are.
    pub fn set_workload_cpu(&mut self, ns: Option<u64>) {
        if self.paused {
            return;
        }

        self.workload_cpu_ns = ns;
        self.workload_cpu_text = self.make_workload_cpu_text();
        self.dirty = true;
    }

    /// How much of the workload's CPU time the traced functions took since the start, for
    /// its status line: the self times of its calls (off-CPU time left out) as a share of its
    /// CPU time, all probes and the same net of the instrumentation, and (`long`) each probe's
    /// (the figures of the table and the JSON). None without a workload, its CPU time, or a
    /// latency backend.
    pub fn workload_cpu_line(&self, long: bool) -> Option<&str> {
        self.workload_cpu_text
            .as_ref()
            .map(|(short, full)| if long { full.as_str() } else { short.as_str() })
    }

    fn make_workload_cpu_text(&self) -> Option<(String, String)> {
        let snap = self.current.as_ref()?;
        let cpu = self.workload_cpu_ns.filter(|c| *c > 0)?;
        let probes =
            crate::export::probes_out(snap, &HashMap::new(), &self.header.floors, false, Some(cpu));
        let shares = crate::export::workload_shares(&probes)?;
        let (total, net) = (shares.self_share, shares.net_self_share);
        let each: Vec<String> = shares
            .rows
            .iter()
            .filter_map(|(p, w)| {
                Some(format!(
                    "{} {:.1}%",
                    p.name,
                    w.self_share_of_workload_cpu? * 100.0
                ))
            })
            .collect();
        // Some call's time off the CPU unknown (counted as CPU), or its nesting (its whole time
        // counted as its own): at most.
        let at = if shares.at_most { "<=" } else { "" };
        let short = format!(
            "traced {at}{:.1}% of its CPU{}",
            total * 100.0,
            net.map(|n| format!(" (net {:.1}%)", n * 100.0))
                .unwrap_or_default(),
        );
        let long = format!(
            "traced {at}{:.1}% of its CPU ({}self {})",
            total * 100.0,
            net.map(|n| format!("net of instrumentation {:.1}%; ", n * 100.0))
                .unwrap_or_default(),
            each.join(", ")
        );
        Some((short, long))
    }

    /// The largest share of a probe's calls lost in any way (an upper bound), over the whole
    /// run.
    pub fn worst_loss(&self) -> Option<f64> {
        self.current
            .as_ref()?
            .probes
            .iter()
            .filter_map(|p| p.loss_share())
            .reduce(f64::max)
    }
}

/// Whether a context's self times were followed at all (not every call's nesting unknown).
fn self_known(c: &crate::snapshot::CtxStats) -> bool {
    c.hist.count == 0 || c.counters.self_unknown < c.hist.count
}

fn row(
    probe: &str,
    context: &'static str,
    backend: Backend,
    h: HistData,
    elapsed: Duration,
    latency: bool,
    self_known: bool,
) -> Row {
    let lat = (latency && backend.has_latency())
        .then(|| figures::latency(&h, elapsed, &[0.5, 0.99, 0.999]))
        .flatten();
    Row {
        probe: probe.to_string(),
        context,
        backend,
        rate: rate(h.count, elapsed),
        p50: lat.as_ref().and_then(|l| l.at(0.5)),
        p99: lat.as_ref().and_then(|l| l.at(0.99)),
        p999: lat.as_ref().and_then(|l| l.at(0.999)),
        max: lat.as_ref().map(|l| l.max_ns),
        mean: lat.as_ref().map(|l| l.mean_ns),
        cpu: lat.as_ref().and_then(|l| l.cpu_share),
        cpu_at_most: false,
        self_at_most: false,
        self_cpu: lat
            .as_ref()
            .filter(|_| self_known && !elapsed.is_zero())
            .map(|_| h.self_ns as f64 / elapsed.as_nanos() as f64),
        censored: false,
        hist: h,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::for_tests::snap;

    /// The status line's share of the workload's CPU: self times (less time off the CPU) of
    /// the workload's calls over its CPU time, each probe and all; net of the instrumentation
    /// where a floor is known; nothing without the workload's CPU time.
    #[test]
    fn the_workload_line_gives_the_traced_share_of_its_cpu() {
        let mut snapshot = snap(10, 1000, 500, 0);
        let mut stat = snapshot.probes[0].clone();
        stat.name = "stat".into();

        // charge: 1000 calls, 400 us self (100 us of it off the CPU); stat: 200 us self.
        let mut workload = HistData {
            count: 1000,
            sum_ns: 600_000,
            self_ns: 400_000,
            off_ns: 100_000,
            ..Default::default()
        };
        snapshot.probes[0].workload = Some(workload.clone());
        workload.self_ns = 200_000;
        workload.off_ns = 0;
        stat.workload = Some(workload);
        snapshot.probes.push(stat);
        let mut app = App::new(Header::default(), Duration::from_secs(1));
        app.on_snapshot(snapshot.clone());
        assert_eq!(app.workload_cpu_line(true), None, "no CPU time, no share");
        app.set_workload_cpu(Some(10_000_000));
        assert_eq!(
            app.workload_cpu_line(true),
            Some("traced 5.0% of its CPU (self charge 3.0%, stat 2.0%)")
        );
        assert_eq!(app.workload_cpu_line(false), Some("traced 5.0% of its CPU"));

        // Paused, the figures stay those of the snapshot shown.
        app.on_key(Key::Char('p'));
        assert!(app.paused);
        app.set_workload_cpu(Some(20_000_000));
        assert_eq!(app.workload_cpu_line(false), Some("traced 5.0% of its CPU"));

        // A floor of 100 ns a call inside each self time: 2 x 100 us of instrumentation, out
        // of the 500 us and of the workload's CPU.
        let mut app = App::new(
            Header {
                floors: vec![crate::model::Floor {
                    backend: Backend::Fentry,
                    calls: 1000,
                    p50_ns: 100,
                    p90_ns: 100,
                    min_ns: 100,
                    programs_ns: None,
                    per_call_ns: Some(100.0),
                }],
                ..Default::default()
            },
            Duration::from_secs(1),
        );
        app.set_workload_cpu(Some(10_000_000));
        app.on_snapshot(snapshot);
        let line = app.workload_cpu_line(true).expect("a line").to_string();

        // (300 - 100 + 200 - 100) us over 10 ms less 200 us of instrumentation.
        assert!(
            line.contains(&format!(
                "net of instrumentation {:.1}%",
                300_000.0 / 9_800_000.0 * 100.0
            )),
            "{line}"
        );
    }

    #[test]
    fn interval_and_cumulative_rates() {
        let mut app = App::new(Header::default(), Duration::from_secs(1));
        app.on_snapshot(snap(1, 100, 500, 0));
        app.on_snapshot(snap(2, 400, 500, 10));
        let rows = app.rows();
        assert_eq!(rows.len(), 2, "task and the softirq row that saw calls");
        assert_eq!(
            rows[0].rate,
            Some(300.0),
            "interval: 300 calls in the last second"
        );
        assert_eq!(app.on_key(Key::Tab), Action::None);
        assert_eq!(
            app.rows()[0].rate,
            Some(200.0),
            "cumulative: 400 calls in 2 s"
        );
        assert!(rows[0].p50.unwrap().abs_diff(500) <= 8);
    }

    #[test]
    fn selection_stays_in_range() {
        let mut app = App::new(Header::default(), Duration::from_secs(1));
        app.on_snapshot(snap(1, 10, 500, 5));
        app.on_key(Key::Up);
        assert_eq!(app.selected, 0);
        app.on_key(Key::Down);
        app.on_key(Key::Char('j'));
        assert_eq!(app.selected, 1, "two rows: task, softirq");
        app.on_key(Key::Char('k'));
        assert_eq!(app.selected, 0);
    }

    #[test]
    fn pause_ignores_snapshots_and_reset_rebases_cumulative() {
        let mut app = App::new(Header::default(), Duration::from_secs(1));
        app.on_snapshot(snap(1, 100, 500, 0));
        app.on_key(Key::Char('p'));
        app.on_snapshot(snap(2, 300, 500, 0));
        assert_eq!(
            app.current.as_ref().unwrap().elapsed,
            Duration::from_secs(1)
        );
        app.on_key(Key::Char('p'));
        app.on_snapshot(snap(2, 300, 500, 0));
        app.on_key(Key::Char('r'));
        app.on_snapshot(snap(4, 500, 500, 0));
        app.on_key(Key::Tab);
        assert_eq!(
            app.rows()[0].rate,
            Some(100.0),
            "200 calls in the 2 s since reset"
        );
    }

    #[test]
    fn interval_rows_have_their_own_max_and_reset_forgets_the_past() {
        let mut app = App::new(Header::default(), Duration::from_secs(1));

        // A slow call in the first second, fast calls after.
        app.on_snapshot(snap(1, 10, 1_000_000, 0));
        let mut s2 = snap(2, 10, 1_000_000, 0);
        s2.probes[0].contexts[0]
            .hist
            .merge(&HistData::of(&[500; 40]));
        app.on_snapshot(s2.clone());
        let max = app.rows()[0].max.unwrap();
        assert!(
            max < 520,
            "interval max {max}: the last second's calls were ~500 ns"
        );
        app.on_key(Key::Tab);
        assert_eq!(
            app.rows()[0].max,
            Some(1_000_000),
            "cumulative max is the run's"
        );
        app.on_key(Key::Char('r'));
        let mut s3 = s2.clone();
        s3.elapsed = Duration::from_secs(3);
        s3.probes[0].contexts[0]
            .hist
            .merge(&HistData::of(&[700; 10]));
        app.on_snapshot(s3);
        let max = app.rows()[0].max.unwrap();
        assert!(
            max < 730,
            "after reset the max is {max}, not the 1 ms from before"
        );
    }

    #[test]
    fn keys_that_leave_save_or_retick() {
        let mut app = App::new(Header::default(), Duration::from_secs(1));
        assert_eq!(app.on_key(Key::Char('q')), Action::Quit);
        assert_eq!(app.on_key(Key::Esc), Action::Quit);
        assert_eq!(app.on_key(Key::CtrlC), Action::Quit);
        assert_eq!(app.on_key(Key::Char('s')), Action::Save);
        assert_eq!(
            app.on_key(Key::Char('-')),
            Action::Tick(Duration::from_millis(500))
        );
        for _ in 0..10 {
            app.on_key(Key::Char('-'));
        }

        assert_eq!(app.tick, Duration::from_millis(100), "tick floor");
        app.header.recording = Some("x.json".into());
        assert_eq!(app.on_key(Key::Char('s')), Action::None);
        assert!(app.message.as_deref().unwrap().contains("read-only"));
    }

    #[test]
    fn history_records_interval_rates() {
        let mut app = App::new(Header::default(), Duration::from_secs(1));
        for i in 1..=5 {
            app.on_snapshot(snap(i, i * 100, 500, 0));
        }

        let h = &app.history[&("charge".to_string(), "task")];
        assert_eq!(
            h.iter().copied().collect::<Vec<_>>(),
            vec![100, 100, 100, 100]
        );
    }
}
