//! Plots of bus bandwidth against message size: `oxccl bench --plot FILE` draws the run it
//! just measured, `oxccl plot A.json B.json -o FILE` compares the `--json` results of
//! several runs (backends, machines, versions).
//!
//! One line per operation (and per run when there are several), out of place, with the
//! memcpy reference of the first run that measured it (`--memcpy`; `--plot` measures it) as a
//! dashed black line. Both axes are logarithmic: sizes in powers of two, labelled in bytes
//! (`64 KiB`), bandwidth in GB/s. The format follows the file's extension, `.svg` or `.png`.
//!
//! Drawn with [plotters]; the text is set in DejaVu Sans, embedded in the program (the
//! `dejavu` crate), so plots look the same on machines without fonts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use oxccl::config::parse::format_size;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;

use super::json::Record;

/// Width and height of a plot, pixels.
pub const SIZE: (u32, u32) = (1024, 640);

/// One measurement as a plot reads it: the fields of a `--json` row it needs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Sample {
    /// Operation name.
    pub op: String,
    /// Size in bytes (nccl-tests' definition).
    pub size: usize,
    /// Whether it was measured in place.
    pub in_place: bool,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// The memcpy reference of the same bytes, GB/s, where measured.
    #[serde(default)]
    pub memcpy_gbps: Option<f64>,
}

impl From<&Record> for Sample {
    fn from(r: &Record) -> Self {
        Sample {
            op: r.op.to_string(),
            size: r.size,
            in_place: r.in_place,
            busbw_gbps: r.busbw_gbps,
            memcpy_gbps: r.memcpy_gbps,
        }
    }
}

/// One run's results: where they came from and what they hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// What the legend calls this run.
    pub label: String,
    /// The backend that measured it.
    pub backend: String,
    /// Its number of ranks.
    pub world_size: usize,
    /// Its measurements.
    pub samples: Vec<Sample>,
}

/// The part of a `--json` file a plot reads.
#[derive(Debug, Deserialize)]
struct ReportFile {
    backend: String,
    /// Where the buffers lived (absent in files of older versions: the host).
    #[serde(default)]
    device: Option<String>,
    world_size: usize,
    rows: Vec<Sample>,
}

/// Reads the `--json` results of `oxccl bench` from `path`; the label is the file's stem
/// until [`label_runs`] decides.
///
/// # Errors
/// A message naming the file when it cannot be read or is not `oxccl bench --json` output.
pub fn read_run(path: &Path) -> Result<Run, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("could not read {}: {e}", path.display()))?;
    let r: ReportFile = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not the JSON of `oxccl bench --json` ({e}); write one with `oxccl bench --json FILE`",
            path.display()
        )
    })?;
    let label = path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned());
    let backend = backend_label(&r.backend, r.device.as_deref().unwrap_or("cpu"));
    Ok(Run { label, backend, world_size: r.world_size, samples: r.rows })
}

/// A run's backend as legends name it: with the GPU its buffers lived on, where not the host
/// (`cpu on cuda:0`).
pub fn backend_label(backend: &str, device: &str) -> String {
    if device == "cpu" {
        backend.to_string()
    } else {
        format!("{backend} on {device}")
    }
}

/// Names runs in the legend: by backend and rank count where those tell them apart, by file
/// name otherwise (two runs of one backend).
pub fn label_runs(runs: &mut [Run]) {
    let tags: Vec<String> = runs.iter().map(|r| format!("{} x{}", r.backend, r.world_size)).collect();
    let distinct = tags.iter().enumerate().all(|(i, t)| !tags[..i].contains(t));
    if distinct {
        for (r, t) in runs.iter_mut().zip(tags) {
            r.label = t;
        }
    }
}

/// One line of a plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// Its legend entry.
    pub label: String,
    /// (bytes, GB/s), by size.
    pub points: Vec<(f64, f64)>,
    /// Whether it is the memcpy reference (drawn dashed, in black).
    pub reference: bool,
}

/// The lines of a plot of `runs`: one per run and operation (out-of-place bus bandwidth;
/// points of size or bandwidth 0, which a log axis cannot show, left out), then the memcpy
/// reference of the first run that has it.
///
/// # Errors
/// When nothing is left to draw.
pub fn curves(runs: &[Run]) -> Result<Vec<Curve>, String> {
    let mut ops: Vec<&str> = Vec::new();
    for s in runs.iter().flat_map(|r| &r.samples) {
        if !ops.contains(&s.op.as_str()) {
            ops.push(&s.op);
        }
    }
    let mut out = Vec::new();
    for run in runs {
        for op in &ops {
            let mut points: Vec<(f64, f64)> = run
                .samples
                .iter()
                .filter(|s| s.op == *op && !s.in_place && s.size > 0 && s.busbw_gbps > 0.0)
                .map(|s| (s.size as f64, s.busbw_gbps))
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let label = match (runs.len() > 1, ops.len() > 1) {
                (true, true) => format!("{} {op}", run.label),
                (true, false) => run.label.clone(),
                (false, _) => op.to_string(),
            };
            out.push(Curve { label, points, reference: false });
        }
    }
    if out.is_empty() {
        return Err("nothing to plot: no out-of-place measurement of more than 0 bytes".into());
    }
    let reference = runs.iter().find_map(|run| {
        let mut by_size = BTreeMap::new();
        for s in run.samples.iter().filter(|s| s.size > 0) {
            if let Some(g) = s.memcpy_gbps.filter(|g| *g > 0.0) {
                by_size.entry(s.size).or_insert(g);
            }
        }
        (!by_size.is_empty()).then(|| Curve {
            label: if runs.len() > 1 { format!("memcpy ({})", run.label) } else { "memcpy".to_string() },
            points: by_size.into_iter().map(|(s, g)| (s as f64, g)).collect(),
            reference: true,
        })
    });
    out.extend(reference);
    Ok(out)
}

/// The title of a plot of `runs`.
pub fn title(runs: &[Run]) -> String {
    match runs {
        [one] => format!("oxccl bench: bus bandwidth, {} backend, {} ranks", one.backend, one.world_size),
        _ => format!(
            "oxccl bench: bus bandwidth, {}",
            runs.iter().map(|r| r.label.as_str()).collect::<Vec<_>>().join(" vs ")
        ),
    }
}

/// The image formats a plot can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics.
    Svg,
    /// A bitmap.
    Png,
}

/// The format `path` asks for by its extension.
///
/// # Errors
/// When it is neither `.svg` nor `.png`.
pub fn format_of(path: &Path) -> Result<Format, String> {
    match path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).as_deref() {
        Some("svg") => Ok(Format::Svg),
        Some("png") => Ok(Format::Png),
        _ => Err(format!("cannot tell the image format of {}: name it FILE.svg or FILE.png", path.display())),
    }
}

/// Draws `curves` under `title` into `path` (SVG or PNG by its extension).
///
/// # Errors
/// A bad extension, or the file cannot be written (the message names it).
pub fn draw(curves: &[Curve], title: &str, path: &Path) -> Result<(), String> {
    let format = format_of(path)?;
    register_font()?;
    let written = match format {
        Format::Svg => render(SVGBackend::new(path, SIZE).into_drawing_area(), curves, title),
        Format::Png => draw_png(curves, title, path),
    };
    written.map_err(|e| format!("could not draw the plot into {}: {e}", path.display()))
}

/// Draws into an RGB buffer and encodes it with the `png` crate (plotters' own encoder
/// would bring the whole `image` crate, JPEG decoder included, for this one file format).
fn draw_png(curves: &[Curve], title: &str, path: &Path) -> Result<(), String> {
    let (w, h) = SIZE;
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    render(BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area(), curves, title)?;
    let file = std::fs::File::create(path).map_err(|e| e.to_string())?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(&rgb).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())
}

/// Makes DejaVu Sans the font plotters' `sans-serif` means, once per process.
fn register_font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "the embedded DejaVu Sans font did not load".to_string())
    })
    .clone()
}

/// Colors of the lines, in order (the reference is black).
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// The bounds of a log axis holding `values`, with some room on both sides.
fn log_bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi <= lo {
        (lo / 2.0, lo * 2.0)
    } else {
        (lo / 1.5, hi * 1.5)
    }
}

/// A bandwidth in GB/s as an axis label.
fn format_gbps(g: f64) -> String {
    if g >= 10.0 {
        format!("{g:.0}")
    } else if g >= 1.0 {
        format!("{g:.1}")
    } else {
        format!("{}", (g * 1e4).round() / 1e4)
    }
}

fn render<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, curves: &[Curve], title: &str) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let all = curves.iter().flat_map(|c| &c.points);
    let (x0, x1) = log_bounds(all.clone().map(|p| p.0));
    let (y0, y1) = log_bounds(all.map(|p| p.1));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((x0..x1).log_scale().base(2.0), (y0..y1).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("size per rank (bytes; log scale)")
        .y_desc("bus bandwidth, GB/s (log scale)")
        .x_label_formatter(&|x| format_size(x.round() as usize))
        .y_label_formatter(&|y| format_gbps(*y))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    let mut color = COLORS.iter().cycle();
    for c in curves {
        if c.reference {
            chart
                .draw_series(DashedLineSeries::new(c.points.iter().copied(), 8, 5, BLACK.stroke_width(2)))
                .map_err(err)?
                .label(c.label.as_str())
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        } else {
            let col = *color.next().unwrap_or(&BLACK);
            chart
                .draw_series(LineSeries::new(c.points.iter().copied(), col.stroke_width(2)))
                .map_err(err)?
                .label(c.label.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], col.stroke_width(2)));
            chart.draw_series(c.points.iter().map(|&p| Circle::new(p, 3, col.filled()))).map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests;
