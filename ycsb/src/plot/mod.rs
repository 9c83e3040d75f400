//! Plots a person would rather look at than read, as SVG and PNG:
//! - latency CDF per operation type, one line per system (the paper's
//!   Figure 5), at the first in-flight setting of the sweep;
//! - throughput against operations in flight per client, one line per
//!   system (the paper's Figure 7);
//! - for a timed run, throughput and latency over time with the faults
//!   marked (`availability`, the paper's Figure 11).
//!
//! Text is drawn with a bundled font (DejaVu Sans, `assets/`), registered
//! with plotters' `ab_glyph` renderer, so PNGs render on machines without
//! system fonts (a fresh CI machine has none).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use swarm_core::kv::System;

use crate::runner::{RunSpec, SystemRun};
use crate::workload::OpKind;

mod availability;

/// DejaVu Sans (license in `assets/DejaVuSans-LICENSE.txt`).
static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
/// The family every plot asks for.
const FAMILY: &str = "sans-serif";
const SIZE: (u32, u32) = (900, 560);

/// Registers the bundled font, once.
fn fonts() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        register_font(FAMILY, FontStyle::Normal, FONT).map_err(|_| "the bundled font is unreadable".to_string())
    })
    .clone()
}

/// Colours by a system's place in the registry, so that plots of
/// different runs agree; more systems than colours share them in turn.
const PALETTE: [RGBColor; 10] = [
    RGBColor(90, 90, 90),
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// A fixed colour per system.
fn color(system: System) -> RGBColor {
    let i = swarm_core::systems::ALL.iter().position(|s| *s == system).unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

/// Points of a step CDF: (latency µs, fraction of operations at most that).
pub fn cdf_points(h: &hdrhistogram::Histogram<u64>) -> Vec<(f64, f64)> {
    let total = h.len();
    if total == 0 {
        return Vec::new();
    }
    let mut pts = Vec::new();
    let mut seen = 0u64;
    for v in h.iter_recorded() {
        let x = v.value_iterated_to() as f64 / 1e3;
        pts.push((x, seen as f64 / total as f64));
        seen += v.count_at_value();
        pts.push((x, seen as f64 / total as f64));
    }
    pts
}

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("cannot draw a plot: {e}")
}

/// A white chart with a caption on `root`, its axes from 0 to `x_max` and
/// `y_max`, `y_labels` pixels left for the vertical axis's labels.
fn titled_chart<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    title: &str,
    y_labels: u32,
    x_max: f64,
    y_max: f64,
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>, String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    ChartBuilder::on(root)
        .caption(title, (FAMILY, 22))
        .margin(18)
        .x_label_area_size(48)
        .y_label_area_size(y_labels)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(err)
}

/// One CDF chart on `root`.
fn draw_cdf<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    unit: &str,
    series: &[(System, Vec<(f64, f64)>)],
    x_max: f64,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let mut chart = titled_chart(&root, title, 60, x_max, 1.0)?;
    chart
        .configure_mesh()
        .x_desc(format!("latency ({unit})"))
        .y_desc("fraction of operations")
        .label_style((FAMILY, 15))
        .draw()
        .map_err(err)?;
    for (system, pts) in series {
        let c = color(*system);
        chart
            .draw_series(LineSeries::new(pts.iter().copied().filter(|(x, _)| *x <= x_max), c.stroke_width(2)))
            .map_err(err)?
            .label(system.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3)));
    }
    legend(&mut chart, 16)?;
    root.present().map_err(err)
}

/// One throughput chart on `root`.
fn draw_throughput<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    series: &[(System, Vec<(f64, f64)>)],
    x_max: f64,
    y_max: f64,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let mut chart = titled_chart(&root, title, 70, x_max, y_max)?;
    chart
        .configure_mesh()
        .x_desc("operations in flight per client")
        .y_desc("throughput (thousand ops/s)")
        .x_labels(x_max as usize + 1)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style((FAMILY, 15))
        .draw()
        .map_err(err)?;
    for (system, pts) in series {
        let c = color(*system);
        chart.draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2))).map_err(err)?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(err)?
            .label(system.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3)));
    }
    legend(&mut chart, 16)?;
    root.present().map_err(err)
}

/// The legend of every chart: the systems' names in a box, lower right,
/// in `font` points.
fn legend<'a, DB, CT>(chart: &mut ChartContext<'a, DB, CT>, font: u32) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .label_font((FAMILY, font))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)
}

/// Draws one chart of `size` pixels as `stem.svg` and `stem.png` in `dir`.
fn both(
    dir: &Path,
    stem: &str,
    size: (u32, u32),
    draw_svg: impl Fn(DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>,
    draw_png: impl Fn(DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), String>,
) -> Result<Vec<PathBuf>, String> {
    let svg = dir.join(format!("{stem}.svg"));
    let png = dir.join(format!("{stem}.png"));
    draw_svg(SVGBackend::new(&svg, size).into_drawing_area())?;
    draw_png(BitMapBackend::new(&png, size).into_drawing_area())?;
    Ok(vec![svg, png])
}

/// Writes every plot of `runs` into `dir` (created if missing); returns the
/// files written.
pub fn write_plots(dir: &Path, spec: &RunSpec, runs: &[SystemRun], virtual_time: bool) -> Result<Vec<PathBuf>, String> {
    fonts()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let prefix = spec.workload.to_string();
    let unit = if virtual_time { "virtual µs" } else { "µs" };
    let mut files = Vec::new();
    let k0 = spec.inflight.first().copied().unwrap_or(1);
    for kind in OpKind::ALL {
        let series: Vec<(System, Vec<(f64, f64)>)> = runs
            .iter()
            .filter_map(|r| r.result.runs.first().map(|p| (r.system, p.op(kind))))
            .filter(|(_, h)| h.count() > 0)
            .map(|(s, h)| (s, cdf_points(h.latency())))
            .collect();
        if series.is_empty() {
            continue;
        }
        // Up to the slowest system's 99.9th percentile: the tail, without
        // one outlier squeezing every line against the axis.
        let x_max = runs
            .iter()
            .filter_map(|r| r.result.runs.first())
            .map(|p| p.op(kind).latency().value_at_quantile(0.999) as f64 / 1e3)
            .fold(0.0, f64::max)
            * 1.1;
        let title = format!("{prefix}: {} latency CDF ({k0} in flight per client)", kind.name());
        let stem = format!("{prefix}-{}-cdf", kind.name());
        let x_max = x_max.max(0.01);
        files.extend(both(
            dir,
            &stem,
            SIZE,
            |a| draw_cdf(a, &title, unit, &series, x_max),
            |a| draw_cdf(a, &title, unit, &series, x_max),
        )?);
    }
    let series: Vec<(System, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            let pts = spec
                .inflight
                .iter()
                .zip(&r.result.runs)
                .map(|(&k, p)| {
                    let w = p.window_ns();
                    let t = if w == 0 { 0.0 } else { p.count() as f64 * 1e9 / w as f64 };
                    (k as f64, t / 1e3)
                })
                .collect();
            (r.system, pts)
        })
        .collect();
    let x_max = spec.max_inflight() as f64 + 1.0;
    let y_max = series.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y)).fold(0.0, f64::max).max(0.001) * 1.15;
    let title = format!("{prefix}: throughput by operations in flight ({} client(s))", spec.clients);
    let stem = format!("{prefix}-throughput-inflight");
    files.extend(both(
        dir,
        &stem,
        SIZE,
        |a| draw_throughput(a, &title, &series, x_max, y_max),
        |a| draw_throughput(a, &title, &series, x_max, y_max),
    )?);
    files.extend(availability::write(dir, &prefix, spec, runs, virtual_time)?);
    Ok(files)
}
