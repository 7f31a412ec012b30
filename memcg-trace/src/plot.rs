//! `memcg-trace plot`: pictures of recordings, drawn with plotters. Per (probe, context) row, one
//! image with two panels: the percentile spectrum (latency against percentile, the percentile
//! axis log-scaled as HdrHistogram plots it: 90%, 99%, 99.9% equally spaced) and the latency
//! histogram (share of calls per bucket, latency log-scaled). Several recordings are overlaid,
//! one colour each, the legend naming file, kernel, backend and probe. From an interval log
//! (`--hdr-log`), calls/s over time per row. SVG by default, PNG with `--format png`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use anyhow::{anyhow, bail, Context as _, Result};
use memcg_trace_common::{bucket_bounds, bucket_index, NUM_BUCKETS};
use plotters::{
    coord::Shift,
    prelude::*,
    style::{register_font, FontStyle},
};

use crate::{
    export::{Document, Latency},
    figures,
    snapshot::HistData,
    units::{fmt_count, fmt_ns},
};

/// Output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    /// Scalable vector graphics.
    Svg,
    /// Portable network graphics.
    Png,
}

impl ImageFormat {
    fn ext(self) -> &'static str {
        match self {
            ImageFormat::Svg => "svg",
            ImageFormat::Png => "png",
        }
    }
}

/// Where fonts are looked for (Debian's fonts-dejavu-core first).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

/// Registers a sans-serif font for the labels, once (plotters lays out text with it, for SVG
/// too). `MEMCG_TRACE_FONT` names another TrueType file.
fn font() -> Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let candidates: Vec<PathBuf> = std::env::var_os("MEMCG_TRACE_FONT")
            .map(PathBuf::from)
            .into_iter()
            .chain(FONTS.iter().map(PathBuf::from))
            .collect();
        for p in &candidates {
            if let Ok(bytes) = std::fs::read(p) {
                // Registered for the life of the process, as plotters wants it.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(
            "plot needs a TrueType font for its labels: install fonts-dejavu-core, or name one with MEMCG_TRACE_FONT"
                .to_string(),
        )
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// One recording's row: its label, the recording's short name and the histogram.
struct Series {
    label: String,
    file: String,
    hist: HistData,
}

/// The histogram a recording holds for a row, from its buckets.
fn hist_of(count: u64, l: &Latency) -> HistData {
    let mut hist = HistData {
        count,
        sum_ns: l.sum_ns,
        min_ns: l.min_ns,
        max_ns: l.max_ns,
        ..Default::default()
    };
    for b in &l.buckets {
        let c = &mut hist.buckets[bucket_index(b.min_ns) & (NUM_BUCKETS - 1)];
        *c = c.saturating_add(b.count);
    }
    hist
}

/// A short name for a file in a legend.
fn stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// The rows of all recordings, by (probe, row), each with one series per recording that has it.
fn rows(docs: &[(PathBuf, Document)]) -> BTreeMap<(String, String), Vec<Series>> {
    let mut out: BTreeMap<(String, String), Vec<Series>> = BTreeMap::new();
    for (path, d) in docs {
        for p in &d.probes {
            let label = |row: &str| {
                format!(
                    "{}: {} {} via {} ({row})",
                    stem(path),
                    d.meta.kernel_release,
                    p.target,
                    p.backend
                )
            };
            for c in &p.contexts {
                if let (Some(l), true) = (&c.latency, c.count > 0) {
                    out.entry((p.name.clone(), c.context.clone()))
                        .or_default()
                        .push(Series {
                            label: label(&c.context),
                            file: stem(path),
                            hist: hist_of(c.count, l),
                        });
                }
            }

            if let Some(w) = &p.workload {
                if let (Some(l), true) = (&w.latency, w.count > 0) {
                    out.entry((p.name.clone(), "workload".into()))
                        .or_default()
                        .push(Series {
                            label: label("workload"),
                            file: stem(path),
                            hist: hist_of(w.count, l),
                        });
                }
            }
        }
    }
    out
}

/// Percentile axis: `1 / (1 - q)`, so that 90%, 99%, 99.9% are equally spaced.
const SPECTRUM_MAX: f64 = 1e6;

fn pct_label(x: f64) -> String {
    let q = 1.0 - 1.0 / x;
    let percent = q * 100.0;
    if percent <= 0.0 {
        "0%".into()
    } else {
        // As many decimals as the nines need: 90%, 99%, 99.9%, 99.99%.
        let digits = ((x.log10().round() as i32) - 2).max(0) as usize;
        format!("{percent:.digits$}%")
    }
}

/// The spectrum of one histogram: (1 / (1 - q), latency) on a grid of q up to the last call.
fn spectrum(h: &HistData) -> Vec<(f64, f64)> {
    let calls = h.timed();
    if calls == 0 {
        return Vec::new();
    }

    let hdr = figures::hdr(h);
    let (lo, hi) = (h.min_ns.max(1), h.max_ns.max(h.min_ns).max(1));

    // Up to the rank of the last call (q = 1 - 1/calls), 40 points per decade.
    let top = (calls as f64).min(SPECTRUM_MAX);
    let steps = (top.log10() * 40.0).ceil().max(1.0) as usize;
    (0..=steps)
        .map(|step| {
            let one_in = 10f64.powf(top.log10() * step as f64 / steps as f64);
            let quantile = 1.0 - 1.0 / one_in;
            let latency = hdr.value_at_quantile(quantile).clamp(lo, hi);
            (one_in, latency as f64)
        })
        .collect()
}

/// The histogram as (bucket midpoint, % of calls) points, empty buckets included between the
/// first and last non-empty one so that the line drops to 0 where there are no calls.
fn shares(h: &HistData) -> Vec<(f64, f64)> {
    let total: u64 = h.buckets.iter().sum();
    let (Some(first), Some(last)) = (
        h.buckets.iter().position(|&c| c > 0),
        h.buckets.iter().rposition(|&c| c > 0),
    ) else {
        return Vec::new();
    };
    (first..=last)
        .map(|i| {
            let (lo, hi) = bucket_bounds(i);
            let mid = (lo as f64 + hi as f64) / 2.0;
            (mid.max(1.0), h.buckets[i] as f64 * 100.0 / total as f64)
        })
        .collect()
}

const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
];

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing failed: {e:?}")
}

/// The legend of a chart's series, boxed, at `pos`.
fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(err)
}

/// Draws one row's image onto `root`: the percentile spectra on the left, the histograms on
/// the right.
fn draw_row<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    series: &[Series],
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(err)?;
    let (left, right) = root.split_horizontally(root.dim_in_pixel().0 / 2);
    draw_spectra(&left, series)?;
    draw_histograms(&right, series)?;
    root.present().map_err(err)?;
    Ok(())
}

/// The series' percentile spectra (latency by percentile, both log scales), one line each.
fn draw_spectra<DB: DrawingBackend>(
    left: &DrawingArea<DB, Shift>,
    series: &[Series],
) -> Result<()> {
    let spectra: Vec<Vec<(f64, f64)>> = series.iter().map(|s| spectrum(&s.hist)).collect();
    let ymin = spectra
        .iter()
        .flatten()
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let ymax = spectra
        .iter()
        .flatten()
        .map(|p| p.1)
        .fold(1.0, f64::max)
        .max(ymin * 2.0);
    let xmax = spectra.iter().flatten().map(|p| p.0).fold(10.0, f64::max);
    let mut chart = ChartBuilder::on(left)
        .caption("percentile spectrum", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(
            (1f64..xmax).log_scale(),
            (ymin / 1.2..ymax * 1.2).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency")
        .x_label_formatter(&|x| pct_label(*x))
        .y_label_formatter(&|y| fmt_ns(*y))
        .draw()
        .map_err(err)?;
    for (i, (s, pts)) in series.iter().zip(&spectra).enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }

    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    Ok(())
}

/// The series' histograms (share of calls per bucket by latency), one line each, labelled
/// with their file and calls.
fn draw_histograms<DB: DrawingBackend>(
    right: &DrawingArea<DB, Shift>,
    series: &[Series],
) -> Result<()> {
    let hists: Vec<Vec<(f64, f64)>> = series.iter().map(|s| shares(&s.hist)).collect();
    let xlo = hists
        .iter()
        .flatten()
        .map(|p| p.0)
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let xhi = hists
        .iter()
        .flatten()
        .map(|p| p.0)
        .fold(1.0, f64::max)
        .max(xlo * 2.0);
    let share_max = hists.iter().flatten().map(|p| p.1).fold(0.0, f64::max);
    let mut chart = ChartBuilder::on(right)
        .caption("histogram", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d((xlo / 1.1..xhi * 1.1).log_scale(), 0f64..share_max * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency")
        .y_desc("calls per bucket (1/32 octave)")
        .x_label_formatter(&|x| fmt_ns(*x))
        .y_label_formatter(&|y| format!("{y:.1}%"))
        .draw()
        .map_err(err)?;
    for (i, (s, pts)) in series.iter().zip(&hists).enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), colour.stroke_width(2)))
            .map_err(err)?
            .label(format!(
                "{}: {} calls",
                s.file,
                fmt_count(s.hist.timed() as f64)
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }

    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    Ok(())
}

/// Image size, pixels.
const SIZE: (u32, u32) = (1400, 560);

fn render(path: &Path, format: ImageFormat, title: &str, series: &[Series]) -> Result<()> {
    match format {
        ImageFormat::Svg => {
            let root = SVGBackend::new(path, SIZE).into_drawing_area();
            draw_row(&root, title, series)
        }
        ImageFormat::Png => {
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw_row(&root, title, series)
        }
    }
}

/// Writes one image per row of the recordings into `dir` (`<probe>-<row>.<ext>`), optionally
/// only `probe`'s; returns the files written.
pub fn plot_recordings(
    docs: &[(PathBuf, Document)],
    dir: &Path,
    format: ImageFormat,
    probe: Option<&str>,
) -> Result<Vec<PathBuf>> {
    font()?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = Vec::new();
    for ((name, row), series) in rows(docs) {
        if probe.is_some_and(|p| p != name) {
            continue;
        }

        let path = dir.join(format!("{name}-{row}.{}", format.ext()));
        let title = format!("{name} ({row}): latency per call");
        render(&path, format, &title, &series)?;
        written.push(path);
    }

    if written.is_empty() {
        bail!(
            "nothing to plot: no latency histograms{} in these recordings (the tracepoint backend counts calls only)",
            probe.map(|p| format!(" for probe {p}")).unwrap_or_default()
        );
    }
    Ok(written)
}

/// Calls/s over time per tag of an interval log (`--hdr-log`), one line per tag, into `path`.
pub fn plot_rates(log: &Path, path: &Path, format: ImageFormat) -> Result<()> {
    use hdrhistogram::serialization::{
        interval_log::{IntervalLogIterator, LogEntry},
        Deserializer,
    };
    font()?;
    let text = std::fs::read(log).map_err(|e| anyhow!("cannot read {}: {e}", log.display()))?;
    let mut per_tag: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut de = Deserializer::new();
    for item in IntervalLogIterator::new(&text) {
        let item = item.map_err(|e| {
            anyhow!(
                "{}: not an HdrHistogram interval log ({e:?})",
                log.display()
            )
        })?;
        if let LogEntry::Interval(i) = item {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(i.encoded_histogram())
                .map_err(|e| anyhow!("{}: bad histogram: {e}", log.display()))?;
            let hist: hdrhistogram::Histogram<u64> = de
                .deserialize(&mut &bytes[..])
                .map_err(|e| anyhow!("{}: bad histogram: {e:?}", log.display()))?;
            let secs = i.duration().as_secs_f64();
            if secs <= 0.0 {
                continue;
            }

            // A step: the interval's rate over the whole interval.
            let t0 = i.start_timestamp().as_secs_f64();
            let rate = hist.len() as f64 / secs;
            let tag = i.tag().map(|t| t.as_str().to_string()).unwrap_or_default();
            per_tag
                .entry(tag)
                .or_default()
                .extend([(t0, rate), (t0 + secs, rate)]);
        }
    }

    if per_tag.is_empty() {
        bail!("{}: no interval in this log", log.display());
    }

    let tmax = per_tag.values().flatten().map(|p| p.0).fold(1.0, f64::max);
    let ymax = per_tag.values().flatten().map(|p| p.1).fold(1.0, f64::max);
    let draw =
        |root: DrawingArea<_, Shift>| -> Result<()> { draw_rates(&root, &per_tag, tmax, ymax) };
    match format {
        ImageFormat::Svg => draw(SVGBackend::new(path, (1000, 500)).into_drawing_area()),
        ImageFormat::Png => {
            let root = BitMapBackend::new(path, (1000, 500)).into_drawing_area();
            draw_rates(&root, &per_tag, tmax, ymax)
        }
    }
}

fn draw_rates<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    per_tag: &BTreeMap<String, Vec<(f64, f64)>>,
    tmax: f64,
    ymax: f64,
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(root)
        .caption("calls per second", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..tmax, 0f64..ymax * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("time since the run started (s)")
        .y_desc("calls/s")
        .y_label_formatter(&|y| fmt_count(*y))
        .draw()
        .map_err(err)?;
    for (i, (tag, pts)) in per_tag.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(tag.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }

    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> (PathBuf, Document) {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/6.12-fentry.json");
        let d = crate::export::read(&p).unwrap();
        (p, d)
    }

    #[test]
    fn percentile_axis_labels() {
        assert_eq!(pct_label(1.0), "0%");
        assert_eq!(pct_label(10.0), "90%");
        assert_eq!(pct_label(100.0), "99%");
        assert_eq!(pct_label(1000.0), "99.9%");
        assert_eq!(pct_label(10_000.0), "99.99%");
    }

    #[test]
    fn the_spectrum_runs_from_the_fastest_call_to_the_slowest() {
        let hist = HistData::of(&[
            500, 600, 700, 800, 900, 1_000, 2_000, 4_000, 8_000, 1_000_000,
        ]);
        let points = spectrum(&hist);
        assert_eq!(points.first().unwrap().0, 1.0);
        assert!(
            points
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{points:?}"
        );
        assert!(points.first().unwrap().1 >= 500.0 && points.last().unwrap().1 <= 1_000_000.0);

        // Up to the rank of the last call: 1 / (1 - q) = n.
        assert!((points.last().unwrap().0 - 10.0).abs() < 1e-9);
        let shares = shares(&hist);
        assert!((shares.iter().map(|p| p.1).sum::<f64>() - 100.0).abs() < 1e-9);
    }

    /// One image under review: the SVG of the committed 6.12 recording's `charge` task row.
    /// A change to it shows in the snapshot's diff (`cargo insta review`).
    #[test]
    fn charge_task_svg_snapshot() {
        let dir = std::env::temp_dir().join(format!("memcg-trace-plot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let files = plot_recordings(&[fixture()], &dir, ImageFormat::Svg, Some("charge")).unwrap();
        let svg = std::fs::read_to_string(dir.join("charge-task.svg")).unwrap();
        assert!(files.contains(&dir.join("charge-task.svg")));
        let _ = std::fs::remove_dir_all(&dir);
        insta::assert_snapshot!(svg);
    }
}
