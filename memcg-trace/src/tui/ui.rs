//! Drawing the dashboard from an `App`: header, table, the selected row's histogram and rate
//! sparkline, and the key line. Generic over the ratatui backend, so tests render into a
//! `TestBackend`.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    symbols,
    text::{Line, Span},
    widgets::{
        Axis, Bar, BarChart, BarGroup, Block, Cell, Chart, Clear, Dataset, GraphType, Paragraph,
        Row as TRow, Sparkline, Table, TableState, Wrap,
    },
    Frame,
};

use super::app::{App, Mode, Row, SiteRow, Sort};
use crate::units::{fmt_count, fmt_count_short, fmt_ns, fmt_ns_short, pct_change};

const KEYS: &str =
    "↑↓ row  Tab interval/total  o sort  e empty  h spectrum  ←→ step  ? more keys  q";

fn opt_ns(v: Option<u64>) -> String {
    v.map(|n| fmt_ns(n as f64)).unwrap_or_else(|| "-".into())
}

/// A tail figure of a row whose slow calls were not all timed: a lower bound, `>=`.
fn low(r: &Row, s: String) -> String {
    if r.censored && s != "-" {
        format!(">={s}")
    } else {
        s
    }
}

/// Draws the whole dashboard.
pub fn draw(f: &mut Frame, app: &App) {
    let area = f.area();
    if area.width < 20 || area.height < 4 {
        f.render_widget(Paragraph::new("memcg-trace: terminal too small"), area);
        return;
    }

    let rows = app.rows();
    let detail = area.height >= 18;

    // As many lines as the header wraps to on this width (its three lines, wrapped), up to
    // five and a quarter of the screen: a narrow terminal still shows the workload's line.
    let head = header(app, area.width);
    let head_lines = (head.line_count(area.width) as u16).clamp(3, (area.height / 4).clamp(3, 5));
    let [header_area, table, bottom, keys] = Layout::vertical([
        Constraint::Length(head_lines),
        Constraint::Min(3),
        Constraint::Length(if detail { 9 } else { 0 }),
        Constraint::Length(1),
    ])
    .areas(area);
    f.render_widget(head, header_area);
    draw_table(f, app, &rows, table);
    if detail {
        if let Some(r) = rows.get(app.selected) {
            let [hist, spark] =
                Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)])
                    .areas(bottom);
            // A/B: the two runs' distributions side by side.
            let compare = app.compare_row(r);
            let (ha, hb) = match compare {
                Some(_) => {
                    let [x, y] = Layout::horizontal([Constraint::Percentage(50); 2]).areas(hist);
                    (x, Some(y))
                }
                None => (hist, None),
            };
            let side = |s: &str| {
                if compare.is_some() {
                    s.to_string()
                } else {
                    String::new()
                }
            };
            draw_distribution(f, app, r, &side("A "), ha);
            if let (Some(b), Some(hb)) = (compare, hb) {
                draw_distribution(f, app, b, "B ", hb);
            }

            draw_sparkline(f, app, r, spark);
        }
    }

    let line = match &app.message {
        Some(m) => Line::from(vec![
            Span::styled(m.clone(), Style::new().fg(Color::Yellow)),
            Span::raw("   "),
            Span::raw(KEYS),
        ]),
        None => Line::from(KEYS),
    };
    f.render_widget(
        Paragraph::new(line).style(Style::new().fg(Color::DarkGray)),
        keys,
    );
    if app.help {
        draw_help(f, area);
    }
}

/// The header: kernel and mode, probes and costs, the workload (wrapped to `width`).
fn header(app: &App, width: u16) -> Paragraph<'static> {
    let header = &app.header;
    let elapsed = app
        .current
        .as_ref()
        .map(|s| s.elapsed.as_secs_f64())
        .unwrap_or(0.0);
    let mode = match app.mode {
        Mode::Interval => "interval",
        Mode::Cumulative => "cumulative",
    };
    let state = view_state(app);
    let source = match (&header.recording, &app.compare) {
        (Some(f), Some(b)) => format!("A {f} vs B {}", b.name),
        (Some(f), None) => format!("recording {f}"),
        (None, _) => format!("live, tick {}", fmt_ns(app.tick.as_nanos() as f64)),
    };
    let lines = vec![
        Line::from(vec![
            Span::styled("memcg-trace ", Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(format!(
                "{} ({}) | {source} | {elapsed:.0}s | {mode}{state}",
                header.kernel, header.preemption
            )),
        ]),
        Line::from(costs_line(app)),
        // The share first, each probe's only where there is room: the workload's own text
        // (its command and cgroup) can take the lines that are left.
        Line::from(match (&app.workload, app.workload_cpu_line(width >= 120)) {
            (Some(w), Some(cpu)) => format!("{cpu} | {w}"),
            (Some(w), None) => w.clone(),
            (None, _) => "workload: none (system-wide)".into(),
        }),
    ];
    Paragraph::new(lines).wrap(Wrap { trim: true })
}

/// How the view stands, after the mode in the header: paused or ended, the sort, hidden rows.
fn view_state(app: &App) -> String {
    let mut state = match (app.paused, app.ended) {
        (true, true) => " | the whole run, at its end",
        (true, false) => " PAUSED",
        _ => "",
    }
    .to_string();
    if app.sort != Sort::Probe {
        state.push_str(&format!(" | sorted by {}", app.sort.name()));
    }

    if app.hide_empty {
        state.push_str(" | empty rows hidden");
    }
    state
}

/// The header's second line: the probes and their backends, the floors, the cost per traced
/// call, what was lost and missed; first, in red, what could not be calibrated.
fn costs_line(app: &App) -> Vec<Span<'static>> {
    let header = &app.header;
    let backends: Vec<String> = app
        .current
        .as_ref()
        .map(|s| {
            s.probes
                .iter()
                .map(|p| format!("{}:{}", p.name, p.backend))
                .collect()
        })
        .unwrap_or_default();
    let (cost, dropped, misses) = app.self_cost();

    // Per traced call: the programs' run time when bpf stats are on, else what a call costs
    // in all as measured at start-up.
    let per_call = cost.per_call_ns.or_else(|| {
        header
            .floors
            .iter()
            .filter_map(|f| f.per_call_ns)
            .reduce(f64::max)
    });
    let floors: Vec<String> = header
        .floors
        .iter()
        .map(|f| format!("{} {}", fmt_ns(f.p50_ns as f64), f.backend))
        .collect();
    let mut line = vec![Span::raw(format!(
        "probes {} | floor {} | {} per traced call | lost {dropped} (<= {}) | missed {misses}",
        backends.join(" "),
        if floors.is_empty() {
            "-".to_string()
        } else {
            floors.join(", ")
        },
        per_call.map(fmt_ns).unwrap_or_else(|| "-".into()),
        app.worst_loss()
            .map(|s| format!("{:.2}%", s * 100.0))
            .unwrap_or_else(|| "-".into()),
    ))];
    if !header.calibration.is_empty() {
        line.insert(
            0,
            Span::styled(
                format!("NOT CALIBRATED: {} | ", header.calibration.join("; ")),
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
            ),
        );
    }
    line
}

fn draw_table(f: &mut Frame, app: &App, rows: &[Row], area: Rect) {
    if app.compare.is_some() {
        return draw_ab_table(f, app, rows, area);
    }

    let wide = area.width >= 100;
    let mut head = vec!["probe", "context", "calls/s", "p50", "p99"];
    if wide {
        head.extend(["p99.9", "max", "mean"]);
    }

    head.push("cpu%");
    if wide {
        head.push("self%");
    }

    let body: Vec<TRow> = rows.iter().map(|r| table_row(r, wide)).collect();
    let widths = table_widths(wide);
    let title = if rows.is_empty() {
        " waiting for the first tick "
    } else {
        " charging path "
    };
    let table = Table::new(body, widths)
        .header(TRow::new(head).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(Block::bordered().title(title))
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default().with_selected((!rows.is_empty()).then_some(app.selected));
    f.render_stateful_widget(table, area, &mut state);
}

/// A row of the table (`wide`: with p99.9, max, mean and self%), the workload's in cyan.
fn table_row(r: &Row, wide: bool) -> TRow<'static> {
    let mut cells = vec![
        Cell::from(r.probe.clone()),
        Cell::from(r.context),
        Cell::from(r.rate.map(fmt_count).unwrap_or_else(|| "-".into())),
        Cell::from(opt_ns(r.p50)),
        Cell::from(low(r, opt_ns(r.p99))),
    ];
    if wide {
        cells.push(Cell::from(low(r, opt_ns(r.p999))));
        cells.push(Cell::from(low(r, opt_ns(r.max))));
        cells.push(Cell::from(low(
            r,
            r.mean.map(fmt_ns).unwrap_or_else(|| "-".into()),
        )));
    }

    cells.push(Cell::from(
        r.cpu
            .map(|c| {
                let at = if r.cpu_at_most { "<=" } else { "" };
                format!("{at}{:.2}", c * 100.0)
            })
            .unwrap_or_else(|| "-".into()),
    ));
    if wide {
        cells.push(Cell::from(
            r.self_cpu
                .map(|c| {
                    let at = if r.self_at_most { "<=" } else { "" };
                    format!("{at}{:.2}", c * 100.0)
                })
                .unwrap_or_else(|| "-".into()),
        ));
    }

    let style = if r.context == "workload" {
        Style::new().fg(Color::Cyan)
    } else {
        Style::new()
    };
    TRow::new(cells).style(style)
}

/// The widths of the table's columns (`wide`: as [`table_row`]).
fn table_widths(wide: bool) -> Vec<Constraint> {
    let mut widths = vec![
        Constraint::Length(16),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
    ];
    if wide {
        widths.extend([
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(9),
        ]);
    }

    widths.push(Constraint::Length(7));
    if wide {
        widths.push(Constraint::Length(7));
    }
    widths
}

/// A/B: per row, each figure in A and in B and the change (as `diff` prints it).
fn draw_ab_table(f: &mut Frame, app: &App, rows: &[Row], area: Rect) {
    let wide = area.width >= 110;
    let mut head = vec!["probe", "context", "calls/s A", "B", "change"];
    if wide {
        head.extend(["p50 A", "B", "change"]);
    }

    head.extend(["p99 A", "B", "change"]);

    // A's rows with B's beside them, then rows only B has (A's cells empty; not selectable).
    let only_b: Vec<&Row> = app
        .compare
        .as_ref()
        .map(|c| {
            c.rows
                .iter()
                .filter(|b| {
                    !rows
                        .iter()
                        .any(|a| a.probe == b.probe && a.context == b.context)
                })
                .collect()
        })
        .unwrap_or_default();
    let body: Vec<TRow> = rows
        .iter()
        .map(|a| ab_row(a, app.compare_row(a), wide))
        .chain(only_b.iter().map(|b| only_b_row(b, wide)))
        .collect();
    let mut widths = vec![
        Constraint::Length(16),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(8),
    ];
    for _ in 0..if wide { 2 } else { 1 } {
        widths.extend([
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(8),
        ]);
    }

    let table = Table::new(body, widths)
        .header(TRow::new(head).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(Block::bordered().title(" charging path, A vs B (whole runs) "))
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default().with_selected((!rows.is_empty()).then_some(app.selected));
    f.render_stateful_widget(table, area, &mut state);
}

/// A row of the A/B table: A's figures, B's (`b`: its row, if B has it) and the change.
fn ab_row(a: &Row, b: Option<&Row>, wide: bool) -> TRow<'static> {
    let ns = |v: Option<u64>| v.map(|n| n as f64);
    let mut cells = vec![
        Cell::from(a.probe.clone()),
        Cell::from(a.context),
        Cell::from(a.rate.map(fmt_count).unwrap_or_else(|| "-".into())),
        Cell::from(
            b.and_then(|b| b.rate)
                .map(fmt_count)
                .unwrap_or_else(|| "-".into()),
        ),
        Cell::from(pct_change(a.rate, b.and_then(|b| b.rate))),
    ];
    let mut fig = |get: fn(&Row) -> Option<u64>| {
        cells.push(Cell::from(opt_ns(get(a))));
        cells.push(Cell::from(opt_ns(b.and_then(get))));
        cells.push(Cell::from(pct_change(ns(get(a)), ns(b.and_then(get)))));
    };
    if wide {
        fig(|r| r.p50);
    }

    fig(|r| r.p99);
    TRow::new(cells)
}

/// A row of the A/B table that only B has: A's cells and the changes empty, greyed.
fn only_b_row(b: &Row, wide: bool) -> TRow<'static> {
    let mut cells = vec![
        Cell::from(b.probe.clone()),
        Cell::from(b.context),
        Cell::from("-"),
        Cell::from(b.rate.map(fmt_count).unwrap_or_else(|| "-".into())),
        Cell::from("-"),
    ];
    let mut fig = |get: fn(&Row) -> Option<u64>| {
        cells.extend([Cell::from("-"), Cell::from(opt_ns(get(b))), Cell::from("-")]);
    };
    if wide {
        fig(|r| r.p50);
    }

    fig(|r| r.p99);
    TRow::new(cells).style(Style::new().fg(Color::DarkGray))
}

/// Buckets regrouped by power of two for display: (lower bound ns, calls).
pub fn octaves(r: &Row) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (i, &n) in r.hist.buckets.iter().enumerate() {
        if n == 0 {
            continue;
        }

        let lo = memcg_trace_common::bucket_bounds(i).0.max(1);
        let oct = 1u64 << (63 - lo.leading_zeros());
        match out.last_mut() {
            Some((o, c)) if *o == oct => *c += n,
            _ => out.push((oct, n)),
        }
    }
    out
}

/// The octaves as at most `max_bars` bars that hide nothing: when there are more octaves than
/// bars, neighbours are merged (each bar then spans the same number of octaves). Each bar:
/// (lower bound ns, calls).
pub fn bars(bins: &[(u64, u64)], max_bars: usize) -> Vec<(u64, u64)> {
    let max_bars = max_bars.max(1);
    if bins.len() <= max_bars {
        return bins.to_vec();
    }

    let per = bins.len().div_ceil(max_bars);
    bins.chunks(per)
        .map(|c| (c[0].0, c.iter().map(|b| b.1).sum()))
        .collect()
}

/// The bar holding the call of rank `q` (0..1) of `bars`.
fn bar_of(bars: &[(u64, u64)], q: f64) -> Option<usize> {
    let total: u64 = bars.iter().map(|b| b.1).sum();
    if total == 0 {
        return None;
    }

    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    bars.iter().position(|b| {
        seen += b.1;
        seen >= rank
    })
}

fn draw_distribution(f: &mut Frame, app: &App, r: &Row, side: &str, area: Rect) {
    if app.callers {
        draw_parts(f, r, side, area, Parts::Callers(app.sites_of(r)), app.mode);
    } else if app.memcgs {
        draw_parts(f, r, side, area, Parts::Memcgs(app.memcgs_of(r)), app.mode);
    } else if app.spectrum {
        draw_spectrum(f, r, side, area);
    } else {
        draw_histogram(f, r, side, area);
    }
}

/// A breakdown of the selected row's calls.
enum Parts {
    /// Its call sites (`--callers`).
    Callers(Vec<SiteRow>),
    /// The memcgs its calls charge (`--by-memcg`).
    Memcgs(Vec<SiteRow>),
}

/// The selected row's call sites or charged memcgs, costliest first: calls/s, p50, p99 and
/// share of the context's time, over the row's window.
fn draw_parts(f: &mut Frame, r: &Row, side: &str, area: Rect, parts: Parts, mode: Mode) {
    let window = match mode {
        Mode::Interval => "last tick",
        Mode::Cumulative => "total",
    };
    let (what, col, empty, sites) = match parts {
        Parts::Callers(s) => (
            "call sites",
            "site",
            "no call sites: run with --callers (fentry or kprobe)",
            s,
        ),
        Parts::Memcgs(s) => ("memcgs", "memcg", "no memcgs: run with --by-memcg", s),
    };
    let block = Block::bordered().title(format!(
        " {side}{} {} {what} ({window}) ",
        r.probe,
        if r.context == "workload" {
            "task (all tasks)"
        } else {
            r.context
        }
    ));
    if sites.is_empty() {
        f.render_widget(
            Paragraph::new(empty).block(block).wrap(Wrap { trim: true }),
            area,
        );
        return;
    }

    let body: Vec<TRow> = sites
        .iter()
        .map(|s| {
            TRow::new(vec![
                Cell::from(s.name.clone()),
                Cell::from(s.rate.map(fmt_count).unwrap_or_else(|| "-".into())),
                Cell::from(opt_ns(s.p50)),
                Cell::from(opt_ns(s.p99)),
                Cell::from(
                    s.time_share
                        .map(|x| format!("{:.1}", x * 100.0))
                        .unwrap_or_else(|| "-".into()),
                ),
            ])
        })
        .collect();
    let table = Table::new(
        body,
        [
            Constraint::Min(12),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(6),
        ],
    )
    .header(
        TRow::new(vec![col, "calls/s", "p50", "p99", "time%"])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(block);
    f.render_widget(table, area);
}

/// The percentile spectrum as HdrHistogram plots it: latency against the percentile, on a
/// log scale of 1 / (1 - percentile) (0%, 90%, 99%, 99.9%, 99.99%).
fn draw_spectrum(f: &mut Frame, r: &Row, side: &str, area: Rect) {
    let block = Block::bordered().title(format!(
        " {side}{} {} percentile spectrum ",
        r.probe, r.context
    ));
    if r.hist.timed() == 0 || !r.backend.has_latency() {
        f.render_widget(Paragraph::new("no calls timed").block(block), area);
        return;
    }

    let xs: Vec<f64> = (0..=80).map(|i| i as f64 * 0.05).collect();
    let qs: Vec<f64> = xs.iter().map(|x| 1.0 - 10f64.powf(-x)).collect();
    let Some(l) = crate::figures::latency(&r.hist, std::time::Duration::ZERO, &qs) else {
        f.render_widget(Paragraph::new("no calls timed").block(block), area);
        return;
    };

    // Latency on a log scale too: the tail spans decades.
    let points: Vec<(f64, f64)> = xs
        .iter()
        .zip(&qs)
        .filter_map(|(x, q)| Some((*x, (l.at(*q)?.max(1) as f64).log10())))
        .collect();
    let top = points.iter().map(|p| p.1).fold(f64::MIN, f64::max).ceil();
    let bottom = points.iter().map(|p| p.1).fold(f64::MAX, f64::min).floor();
    let (bottom, top) = (bottom.min(top - 1.0), top);
    let data = [Dataset::default()
        .marker(symbols::Marker::Braille)
        .graph_type(GraphType::Line)
        .style(Style::new().fg(Color::Yellow))
        .data(&points)];
    let chart = Chart::new(data.to_vec())
        .block(block)
        .x_axis(
            Axis::default()
                .bounds([0.0, 4.0])
                .labels(["0%", "90%", "99%", "99.9%", "99.99%"]),
        )
        .y_axis(Axis::default().bounds([bottom, top]).labels([
            fmt_ns_short(10f64.powf(bottom)),
            fmt_ns_short(10f64.powf((bottom + top) / 2.0)),
            fmt_ns_short(10f64.powf(top)),
        ]));
    f.render_widget(chart, area);
}

fn draw_histogram(f: &mut Frame, r: &Row, side: &str, area: Rect) {
    // The bars holding p50, p99 and p99.9 are drawn in the colours of their names here.
    let block = Block::bordered()
        .title(Line::from(vec![
            Span::raw(format!(" {side}{} {} latency: ", r.probe, r.context)),
            Span::styled("p50 ", Style::new().fg(Color::Green)),
            Span::styled("p99 ", Style::new().fg(Color::Yellow)),
            Span::styled("p99.9 ", Style::new().fg(Color::Red)),
        ]))
        .title_bottom(" log-scaled counts ");
    let bins = octaves(r);
    if bins.is_empty() || !r.backend.has_latency() {
        let why = if r.backend.has_latency() {
            "no calls timed"
        } else {
            "counts only: no latency with tracepoints"
        };
        f.render_widget(Paragraph::new(why).block(block), area);
        return;
    }

    let max_bars = ((area.width.saturating_sub(2)) / 7).max(1) as usize;

    // Every call is in some bar: octaves that do not fit are merged, never dropped.
    let merged = bars(&bins, max_bars);
    let marks = [
        (bar_of(&merged, 0.999), Color::Red),
        (bar_of(&merged, 0.99), Color::Yellow),
        (bar_of(&merged, 0.5), Color::Green),
    ];
    let bars: Vec<Bar> = merged
        .iter()
        .enumerate()
        .map(|(i, (lo, n))| {
            // The lowest of the marks that fall in this bar shows (p50 over p99 over p99.9).
            let colour = marks
                .iter()
                .rev()
                .find(|(b, _)| *b == Some(i))
                .map(|(_, c)| *c);
            let bar = Bar::default()
                .value(((*n as f64).ln_1p() * 100.0) as u64)
                .text_value(fmt_count_short(*n as f64))
                .label(Line::from(fmt_ns_short(*lo as f64)));
            match colour {
                Some(c) => bar.style(Style::new().fg(c)),
                None => bar,
            }
        })
        .collect();
    let chart = BarChart::default()
        .block(block)
        .bar_width(6)
        .bar_gap(1)
        .data(BarGroup::default().bars(&bars));
    f.render_widget(chart, area);
}

/// The selected row's rate and interval p99 over time; in a recording with history, up to the
/// tick the arrow keys point at.
fn draw_sparkline(f: &mut Frame, app: &App, r: &Row, area: Rect) {
    if app.header.recording.is_some() && app.times_ms.is_empty() {
        let text =
            "no history: this recording was made before memcg-trace kept the run tick by tick";
        f.render_widget(
            Paragraph::new(text)
                .wrap(Wrap { trim: true })
                .block(Block::bordered().title(" over time ")),
            area,
        );
        return;
    }

    let [top, bottom] = Layout::vertical([Constraint::Percentage(50); 2]).areas(area);
    let key = (r.probe.clone(), r.context);
    let width = area.width.saturating_sub(2) as usize;

    // The window ends at the step (or the latest tick).
    let window = |h: Option<&std::collections::VecDeque<u64>>| -> (Vec<u64>, Option<u64>) {
        let Some(h) = h else {
            return (Vec::new(), None);
        };
        let end = app.step.map_or(h.len(), |s| (s + 1).min(h.len()));
        let data: Vec<u64> = h
            .iter()
            .take(end)
            .skip(end.saturating_sub(width))
            .copied()
            .collect();
        let at = data.last().copied();
        (data, at)
    };
    let when = match app.step.and_then(|s| app.times_ms.get(s)) {
        Some(ms) => format!(" at {:.1}s", *ms as f64 / 1e3),
        None => String::new(),
    };

    // One pane per series: its title gives the value at the step and the largest shown.
    let mut pane = |area: Rect,
                    series: Option<&std::collections::VecDeque<u64>>,
                    (name, stepped, most): (&str, &str, &str),
                    fmt: fn(f64) -> String,
                    colour: Color| {
        let (data, at) = window(series);
        let top = fmt(data.iter().max().copied().unwrap_or(0) as f64);
        let title = match at {
            Some(v) if !when.is_empty() => {
                format!(" {stepped}{when}: {}, {most} {top} ", fmt(v as f64))
            }
            _ => format!(" {name}, {most} {top} "),
        };
        f.render_widget(
            Sparkline::default()
                .block(Block::bordered().title(title))
                .data(&data)
                .style(Style::new().fg(colour)),
            area,
        );
    };
    pane(
        top,
        app.history.get(&key),
        ("calls/s", "calls/s", "peak"),
        fmt_count,
        Color::Green,
    );
    pane(
        bottom,
        app.p99_history.get(&key),
        ("p99 per tick", "p99", "worst"),
        fmt_ns,
        Color::Yellow,
    );
}

fn draw_help(f: &mut Frame, area: Rect) {
    let text = vec![
        Line::from("up/down, j/k   select a row"),
        Line::from("Tab            interval (last tick) / cumulative"),
        Line::from("p              pause / resume"),
        Line::from("r              reset cumulative figures"),
        Line::from("s              save a JSON snapshot"),
        Line::from("+ / -          slower / faster tick"),
        Line::from("o              sort by calls/s, cpu%, p99, max, probe"),
        Line::from("e              hide / show rows without calls"),
        Line::from("h              histogram / percentile spectrum"),
        Line::from("c              histogram / call sites (with --callers)"),
        Line::from("m              histogram / charged memcgs (with --by-memcg)"),
        Line::from("left / right   step through a recording's ticks"),
        Line::from("?              this help"),
        Line::from("q, Esc, Ctrl-C quit"),
        Line::from("interval: the last tick; total: since start or reset"),
        Line::from(""),
        Line::from("rows: calls of each charging function per context"),
        Line::from("(task, softirq, hardirq, nmi: the kernel's in_task() split);"),
        Line::from("workload rows: task-context calls by the workload's tasks"),
    ];
    let w = area.width.min(64);
    let h = area.height.min(text.len() as u16 + 2);
    let popup = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    f.render_widget(Clear, popup);
    f.render_widget(
        Paragraph::new(text).block(Block::bordered().title(" keys ")),
        popup,
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ratatui::{backend::TestBackend, Terminal};

    use super::*;
    use crate::snapshot::for_tests::snap;
    use crate::tui::app::{App, Header, Key};

    fn render(app: &App, w: u16, h: u16) -> String {
        let mut t = Terminal::new(TestBackend::new(w, h)).expect("test terminal");
        t.draw(|f| draw(f, app)).expect("draw");
        let buf = t.backend().buffer().clone();
        let mut screen = String::new();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                screen.push_str(buf[(x, y)].symbol());
            }

            screen.push('\n');
        }
        screen
    }

    fn app_with_data() -> App {
        let mut app = App::new(
            Header {
                kernel: "6.12.117+deb12-amd64".into(),
                preemption: "PREEMPT_DYNAMIC, booted as voluntary".into(),
                recording: None,
                ..Default::default()
            },
            Duration::from_secs(1),
        );
        app.workload = Some("workload: hackbench -g 2 -l 100, running".into());
        for i in 1..=4 {
            app.on_snapshot(snap(i, i * 45_000, 700, i * 30));
        }
        app
    }

    /// With the workload's CPU time known, its status line says how much of it the traced
    /// functions took, at both sizes the snapshots use.
    #[test]
    fn the_workload_line_shows_its_cpu_share() {
        let mut app = app_with_data();
        let mut snapshot = snap(5, 5 * 45_000, 700, 150);
        snapshot.probes[0].workload = Some(crate::snapshot::HistData {
            count: 1000,
            sum_ns: 900_000,
            self_ns: 900_000,
            ..Default::default()
        });
        app.on_snapshot(snapshot);
        app.set_workload_cpu(Some(20_000_000));

        // As the live dashboard words it.
        app.workload = Some(
            "workload: hackbench -g 2 -l 100 in /sys/fs/cgroup/memcg-trace.147, running".into(),
        );
        for (w, h, said) in [
            (120, 36, "traced 4.5% of its CPU (self charge 4.5%)"),
            (80, 24, "traced 4.5% of its CPU"),
        ] {
            let screen = render(&app, w, h);
            assert!(screen.contains(said), "{w}x{h}:\n{screen}");
        }
    }

    #[test]
    fn empty_dashboard() {
        let app = App::new(Header::default(), Duration::from_secs(1));
        insta::assert_snapshot!(render(&app, 80, 24));
    }

    #[test]
    fn one_probe_80x24() {
        insta::assert_snapshot!(render(&app_with_data(), 80, 24));
    }

    #[test]
    fn wide_with_help() {
        let mut app = app_with_data();
        app.on_key(Key::Char('?'));
        insta::assert_snapshot!(render(&app, 120, 30));
    }

    #[test]
    fn huge_numbers() {
        let mut app = App::new(Header::default(), Duration::from_secs(1));
        app.on_snapshot(snap(1, 0, 1, 0));
        app.on_snapshot(snap(2, 4_000_000_000, 2_000_000_000, 3_000_000_000));
        insta::assert_snapshot!(render(&app, 120, 30));
    }

    #[test]
    fn the_callers_pane_lists_the_sites_of_the_selected_row() {
        let mut app = App::new(Header::default(), Duration::from_secs(1));
        let with_sites = |n: u64, count: u64| {
            let mut snapshot = snap(n, 0, 0, 0);
            let probe = &mut snapshot.probes[0];
            let mut first = crate::callers::Site::new(0, 0xffff_ffff_8100_1000);
            first.name = "__memcg_slab_post_alloc_hook+0xd8".into();
            let mut second = crate::callers::Site::new(0, 0xffff_ffff_8100_2000);
            second.name = "pcpu_alloc_noprof+0xd9".into();
            for _ in 0..count {
                first.add(1000);
            }

            for _ in 0..count / 10 {
                second.add(4000);
            }

            probe.callers = vec![first, second];
            snapshot
        };
        app.on_snapshot(with_sites(1, 100));
        app.on_snapshot(with_sites(2, 300));
        let rows = app.rows();
        let r = rows.iter().find(|r| r.context == "task").expect("task row");
        let sites = app.sites_of(r);
        assert_eq!(sites.len(), 2);

        // The last tick: 200 calls at 1 us from the first site, 20 at 4 us from the second.
        assert_eq!(sites[0].name, "__memcg_slab_post_alloc_hook+0xd8");
        let share = sites[0].time_share.unwrap();
        assert!((share - 200_000.0 / 280_000.0).abs() < 1e-9, "{share}");
        app.on_key(Key::Char('c'));
        let screen = render(&app, 120, 30);
        assert!(screen.contains("call sites (last tick)"), "{screen}");
        assert!(
            screen.contains("__memcg_slab_post_alloc_hook+0xd8"),
            "{screen}"
        );
        assert!(screen.contains("71.4"), "{screen}");

        // Without sites the pane says how to get them.
        let mut plain = app_with_data();
        plain.on_key(Key::Char('c'));
        assert!(render(&plain, 120, 30).contains("run with --callers"));
    }

    #[test]
    fn the_memcgs_pane_lists_the_memcgs_the_selected_row_charges() {
        let mut app = App::new(Header::default(), Duration::from_secs(1));
        let with_memcgs = |n: u64, count: u64| {
            let mut snapshot = snap(n, 0, 0, 0);
            let probe = &mut snapshot.probes[0];
            let mut first = crate::callers::Site::new(0, 7001);
            first.name = "/system.slice/postgresql.service".into();
            let mut second = crate::callers::Site::new(0, 7002);
            second.name = "/user.slice".into();
            for _ in 0..count {
                first.add(1000);
            }

            for _ in 0..count / 4 {
                second.add(1000);
            }

            probe.memcgs = vec![second, first];
            snapshot
        };
        app.on_snapshot(with_memcgs(1, 100));
        app.on_snapshot(with_memcgs(2, 500));
        let rows = app.rows();
        let r = rows.iter().find(|r| r.context == "task").expect("task row");
        let memcgs = app.memcgs_of(r);
        assert_eq!(memcgs.len(), 2);

        // The last tick: 400 calls charging the first, 100 the second, costliest first.
        assert_eq!(memcgs[0].name, "/system.slice/postgresql.service");
        assert_eq!((memcgs[0].count, memcgs[1].count), (400, 100));
        app.on_key(Key::Char('m'));
        let screen = render(&app, 120, 30);
        assert!(screen.contains("memcgs (last tick)"), "{screen}");
        assert!(
            screen.contains("/system.slice/postgresql.service"),
            "{screen}"
        );
        assert!(screen.contains("80.0"), "{screen}");

        // 'c' switches to the call sites, which this run has none of.
        app.on_key(Key::Char('c'));
        assert!(render(&app, 120, 30).contains("run with --callers"));
        let mut plain = app_with_data();
        plain.on_key(Key::Char('m'));
        assert!(render(&plain, 120, 30).contains("run with --by-memcg"));
    }

    #[test]
    fn tiny_terminals_do_not_panic() {
        let app = app_with_data();
        for (w, h) in [(40, 10), (20, 5), (10, 3), (1, 1), (80, 17)] {
            let s = render(&app, w, h);
            assert_eq!(s.lines().count(), h as usize);
        }

        insta::assert_snapshot!(render(&app, 40, 10));
    }

    #[test]
    fn a_histogram_with_more_octaves_than_bars_hides_no_call() {
        // 100 ns .. 17 s: 28 octaves.
        let bins: Vec<(u64, u64)> = (6..34).map(|k| (1u64 << k, k as u64 * 1000)).collect();
        let total: u64 = bins.iter().map(|b| b.1).sum();
        for max in [1, 3, 5, 9, 27, 28, 40] {
            let b = bars(&bins, max);
            assert!(b.len() <= max.max(1), "{max}: {} bars", b.len());
            assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), total, "{max} bars");
            assert_eq!(b[0].0, 64, "the fastest calls are still drawn ({max} bars)");
        }

        // p50 lies in the bar that holds the middle call.
        let b = bars(&[(512, 10), (1024, 80), (2048, 10)], 3);
        assert_eq!(bar_of(&b, 0.5), Some(1));
        assert_eq!(bar_of(&b, 0.999), Some(2));
    }

    #[test]
    fn bar_labels_fit_their_bars_with_their_units() {
        for k in 0..40 {
            let ns = (1u64 << k) as f64;
            let l = crate::units::fmt_ns_short(ns);
            assert!(l.chars().count() <= 5, "{l}");
            assert!(
                l.ends_with("ns") || l.ends_with("us") || l.ends_with("ms") || l.ends_with('s'),
                "{l}"
            );
        }

        for n in [
            0.0, 950.0, 9_999.0, 10_000.0, 314_700.0, 999_499.0, 1.2e6, 47e6, 1.3e9, 2e13,
        ] {
            let c = crate::units::fmt_count_short(n);
            assert!(c.chars().count() <= 5, "{n}: {c}");
        }

        assert_eq!(crate::units::fmt_count_short(314_700.0), "315k");
        assert_eq!(crate::units::fmt_ns_short(131_072.0), "131us");
    }

    fn fixture() -> crate::export::Document {
        crate::export::read(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/6.12-fentry.json"
        )))
        .expect("the committed recording")
    }

    fn fixture_app() -> App {
        crate::cmd::top::recording_app(&fixture(), "6.12-fentry.json")
    }

    #[test]
    fn the_committed_recording_80x24() {
        insta::assert_snapshot!(render(&fixture_app(), 80, 24));
    }

    #[test]
    fn the_committed_recording_120x36() {
        insta::assert_snapshot!(render(&fixture_app(), 120, 36));
    }

    #[test]
    fn the_committed_recording_as_a_spectrum_120x36() {
        let mut app = fixture_app();
        app.on_key(Key::Char('h'));
        insta::assert_snapshot!(render(&app, 120, 36));
    }

    #[test]
    fn every_call_of_the_recording_is_in_a_drawn_bar_with_p50_in_one() {
        let app = fixture_app();
        for width in [80u16, 120] {
            // The histogram pane is 60% of the width, its bars 7 columns each.
            let pane = width * 60 / 100;
            let max_bars = (pane.saturating_sub(2) / 7).max(1) as usize;
            for r in app.rows().iter().filter(|r| r.backend.has_latency()) {
                let drawn = bars(&octaves(r), max_bars);
                if r.hist.timed() == 0 {
                    continue;
                }

                assert!(drawn.len() <= max_bars);
                assert_eq!(
                    drawn.iter().map(|x| x.1).sum::<u64>(),
                    r.hist.buckets.iter().sum::<u64>(),
                    "{} {}: bars hold every call",
                    r.probe,
                    r.context
                );
                let p50 = bar_of(&drawn, 0.5).expect("p50 in a bar");
                let (lo, _) = drawn[p50];
                let hi = drawn.get(p50 + 1).map_or(u64::MAX, |x| x.0);
                let p = r.p50.expect("p50");
                assert!(
                    lo <= p && p < hi.max(lo * 2),
                    "{} {}: p50 {p} outside bar {lo}..{hi}",
                    r.probe,
                    r.context
                );
            }
        }

        // The charge task row, the one the issue was about, starts below 1 us.
        let charge = app
            .rows()
            .into_iter()
            .find(|r| r.probe == "charge" && r.context == "task")
            .expect("charge task row");
        assert!(octaves(&charge)[0].0 < 1024, "{:?}", octaves(&charge));
        let screen = render(&app, 120, 36);
        assert!(screen.contains("charge task latency"), "{screen}");
    }

    #[test]
    fn sorting_keeps_the_selected_row_selected() {
        let mut app = fixture_app();
        let rows = app.rows();

        // Select the last row, then sort every way: the same row stays selected.
        for _ in 0..rows.len() {
            app.on_key(Key::Down);
        }

        let want = {
            let r = &app.rows()[app.selected];
            (r.probe.clone(), r.context)
        };
        for _ in 0..5 {
            app.on_key(Key::Char('o'));
            let r = &app.rows()[app.selected];
            assert_eq!((r.probe.clone(), r.context), want, "sort {:?}", app.sort);
            if app.sort == super::Sort::P99 {
                let p99s: Vec<u64> = app.rows().iter().map(|r| r.p99.unwrap_or(0)).collect();
                let mut sorted = p99s.clone();
                sorted.sort_by(|a, b| b.cmp(a));
                assert_eq!(p99s, sorted, "sorted by p99, slowest first");
            }
        }

        assert_eq!(app.sort, super::Sort::Probe, "o cycles back");

        // Empty rows hidden: every row left has calls.
        app.on_key(Key::Char('e'));
        assert!(app.rows().iter().all(|r| r.hist.count > 0));
    }

    #[test]
    fn ab_view_shows_both_runs_and_the_change() {
        let doc_a = fixture();
        let mut doc_b = fixture();

        // B ran twice as long with the same calls: half the rate.
        doc_b.meta.duration_ns *= 2;
        let mut app = crate::cmd::top::recording_app(&doc_a, "a.json");
        crate::cmd::top::compare_with(&mut app, &doc_b, "b.json");
        let screen = render(&app, 120, 36);
        assert!(screen.contains("A a.json vs B b.json"), "{screen}");
        assert!(screen.contains("change"), "{screen}");
        assert!(screen.contains("-50.0%"), "half the rate: {screen}");
        assert!(
            screen.contains("A charge task latency") && screen.contains("B charge task latency"),
            "{screen}"
        );
        insta::assert_snapshot!(screen);

        // Narrow: still the change of calls/s and p99.
        let narrow = render(&app, 80, 24);
        assert!(narrow.contains("-50.0%"), "{narrow}");
    }

    #[test]
    fn spectrum_and_ab_views_fit_any_terminal() {
        let doc_a = fixture();
        let mut doc_b = fixture();

        // A row only B has.
        doc_b.probes[0].contexts.retain(|c| c.context == "task");
        let mut extra = doc_b.probes[0].clone();
        extra.name = "only-in-b".into();
        doc_b.probes.push(extra);
        let mut app = crate::cmd::top::recording_app(&doc_a, "a.json");
        crate::cmd::top::compare_with(&mut app, &doc_b, "b.json");
        let wide = render(&app, 120, 36);
        assert!(wide.contains("only-in-b"), "{wide}");
        for spectrum in [false, true] {
            app.spectrum = spectrum;
            for (w, h) in [
                (120, 36),
                (80, 24),
                (40, 10),
                (20, 5),
                (10, 3),
                (1, 1),
                (80, 17),
                (60, 18),
            ] {
                let s = render(&app, w, h);
                assert_eq!(s.lines().count(), h as usize);
            }
        }
    }

    #[test]
    fn a_recording_with_history_shows_rate_and_p99_and_steps() {
        let mut rec = crate::history::Recorder::default();
        for i in 1..=5 {
            // The rate grows tick by tick: 45k, 90k, ... calls per second.
            rec.push(&snap(i, 45_000 * i * (i + 1) / 2, 700, i * 30));
        }

        let mut doc = fixture();
        doc.history = Some(rec.history().clone());
        doc.probes.retain(|p| p.name == "charge");
        let mut app = crate::cmd::top::recording_app(&doc, "h.json");
        let screen = render(&app, 120, 36);
        assert!(screen.contains("calls/s, peak 225.0k"), "{screen}");
        assert!(screen.contains("p99 per tick, worst"), "{screen}");
        app.on_key(Key::Left);
        app.on_key(Key::Left);
        let screen = render(&app, 120, 36);
        assert!(screen.contains("calls/s at 3.0s: 135.0k"), "{screen}");
        for _ in 0..10 {
            app.on_key(Key::Right);
        }

        assert_eq!(app.step, Some(4), "stops at the last tick");
    }

    /// A kernel without the context split (no per-CPU offsets): every call is in context 0,
    /// named `all` in the JSON, the table, the live dashboard and the dashboard of the
    /// recording read back, with no interrupt rows; the same snapshot with the split says
    /// `task`. The fact travels in the snapshot and the recording, not in the process.
    #[test]
    fn a_snapshot_without_the_context_split_is_all_everywhere() {
        use crate::export::{self, RunMeta};
        let masks = |no_context_split: Option<String>| {
            crate::calibrate::masks(crate::kernel::Layout {
                offsets: Default::default(),
                no_context_split,
            })
            .1
        };
        let run = |split: bool| RunMeta {
            start: std::time::UNIX_EPOCH,
            masks: Some(if split {
                crate::kernel::ContextMasks::classic("calibrated")
            } else {
                masks(Some("no per-CPU offsets in BTF or kallsyms".into()))
            }),
            off_cpu: None,
            reads: None,
            daemon: Default::default(),
            workload: None,
            notes: Default::default(),
            not_attached: Vec::new(),
            floors: Vec::new(),
            calibration: Vec::new(),
            history: None,
            preemption_model: Some("PREEMPT_DYNAMIC".into()),
        };
        let row_names = |doc: &export::Document| -> Vec<String> {
            doc.probes[0]
                .contexts
                .iter()
                .map(|c| c.context.clone())
                .collect()
        };
        for split in [false, true] {
            let mut snapshot = snap(4, 180_000, 700, 0);
            snapshot.no_context_split = !split;
            let name = if split { "task" } else { "all" };

            // The JSON: one row without the split (none claiming no interrupt call was seen),
            // every context's with it; read back as such.
            let rows: &[&str] = if split {
                &["task", "softirq", "hardirq", "nmi"]
            } else {
                &["all"]
            };
            let doc = export::document(&snapshot, &run(split));
            assert_eq!(row_names(&doc), rows, "split {split}");
            let json = serde_json::to_string(&doc).expect("json");
            let back = export::parse(&json).expect("read back");
            assert_eq!(row_names(&back), rows);
            let again = export::to_snapshot(&back);
            assert_eq!(again.no_context_split, !split);
            assert_eq!(again.ctx_name(0), name);

            // The table.
            let table = crate::table::summary(&back);
            let rows: Vec<&str> = table
                .lines()
                .filter(|l| l.starts_with("charge ") && !l.contains(" via "))
                .collect();
            assert!(
                !rows.is_empty()
                    && rows
                        .iter()
                        .all(|l| l.split_whitespace().nth(1) == Some(name)),
                "split {split}:\n{table}"
            );

            // The live dashboard and the recording's.
            let mut live = App::new(Header::default(), Duration::from_secs(1));
            live.on_snapshot(snapshot.clone());
            let read = crate::cmd::top::recording_app(&back, "r.json");
            for (what, app) in [("live", &live), ("recording", &read)] {
                let screen = render(app, 120, 36);
                let names: Vec<&str> = app.rows().iter().map(|r| r.context).collect();
                assert_eq!(names, [name], "{what}, split {split}:\n{screen}");
                assert!(
                    screen
                        .lines()
                        .any(|l| l.contains(" charge ") && l.contains(&format!(" {name} "))),
                    "{what}, split {split}:\n{screen}"
                );
            }
        }
    }

    #[test]
    fn octaves_group_buckets_by_power_of_two() {
        let app = app_with_data();
        let r = &app.rows()[0];
        let o = octaves(r);
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].0, 512, "700 ns lies in the 512..1024 octave");
    }
}
