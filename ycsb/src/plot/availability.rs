//! The availability plot (SWARM Figure 11): throughput over time, one line
//! per system, and below it the p50 and p99 latency of the operations
//! completed in each bucket (log scale), with each fault's span shaded and
//! its start and end marked. Drawn from the first in-flight setting's
//! timelines of a timed run.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use swarm_core::kv::System;

use super::{FAMILY, both, color, err, legend};
use crate::fault::{FaultKind, NodeFault};
use crate::runner::{RunSpec, SystemRun};
use crate::timeline::Point;

/// Size of the figure: two panels, one above the other.
const SIZE: (u32, u32) = (900, 860);

/// What the figure shows.
struct Figure<'a> {
    title: String,
    /// Time axis in words.
    x_desc: &'static str,
    run_s: f64,
    bucket_s: f64,
    faults: &'a [NodeFault],
    series: Vec<(System, Vec<Point>)>,
}

/// Writes `<prefix>-availability.svg` and `.png` into `dir` if the run was
/// timed; returns the files written.
pub(super) fn write(
    dir: &Path,
    prefix: &str,
    spec: &RunSpec,
    runs: &[SystemRun],
    virtual_time: bool,
) -> Result<Vec<PathBuf>, String> {
    let Some(timed) = &spec.timed else { return Ok(Vec::new()) };
    let series: Vec<(System, Vec<Point>)> = runs
        .iter()
        .filter_map(|r| r.result.runs.first().and_then(|p| p.timeline.as_ref()).map(|t| (r.system, t.points())))
        .collect();
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let what = match timed.faults.len() {
        0 => "no faults".to_string(),
        _ => timed.faults.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
    };
    let k0 = spec.inflight.first().copied().unwrap_or(1);
    let fig = Figure {
        title: format!("{prefix}: over time, {what} ({} client(s), {k0} in flight)", spec.clients),
        x_desc: if virtual_time {
            "virtual time since the measured phase began (s)"
        } else {
            "time since the measured phase began (s)"
        },
        run_s: timed.run_ns as f64 / 1e9,
        bucket_s: timed.bucket_ns as f64 / 1e9,
        faults: &timed.faults,
        series,
    };
    both(dir, &format!("{prefix}-availability"), SIZE, |a| draw(a, &fig), |a| draw(a, &fig))
}

/// A bucket's value as a step: a level line over its span (the last one
/// may be cut by the run's end).
fn step(p: &Point, f: &Figure<'_>, y: f64) -> [(f64, f64); 2] {
    [(p.t_s, y), ((p.t_s + f.bucket_s).min(f.run_s), y)]
}

/// Runs of consecutive points that completed operations: a latency line
/// breaks where a bucket has none.
fn segments(points: &[Point]) -> impl Iterator<Item = &[Point]> {
    points.split(|p| p.ops == 0).filter(|s| !s.is_empty())
}

/// Shades each fault's span over `chart`'s whole height, and marks its
/// start and end.
fn mark_faults<DB: DrawingBackend, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>,
    f: &Figure<'_>,
    y: (f64, f64),
    label: bool,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    for fault in f.faults {
        let start = fault.start_ns as f64 / 1e9;
        let end = fault.end_ns((f.run_s * 1e9) as u64) as f64 / 1e9;
        let (shade, edge) = match fault.kind {
            FaultKind::Fail => (RGBColor(214, 39, 40), RGBColor(150, 20, 20)),
            FaultKind::Stall => (RGBColor(255, 160, 40), RGBColor(170, 90, 0)),
        };
        chart
            .draw_series(std::iter::once(Rectangle::new([(start, y.0), (end, y.1)], shade.mix(0.12).filled())))
            .map_err(err)?;
        let mut edges = vec![start];
        if end < f.run_s {
            edges.push(end);
        }
        for x in edges {
            chart.draw_series(DashedLineSeries::new([(x, y.0), (x, y.1)], 6, 4, edge.stroke_width(1))).map_err(err)?;
        }
        if label {
            let state = match fault.kind {
                FaultKind::Fail => "failed",
                FaultKind::Stall => "stalled",
            };
            let text = format!("node {} {state}", fault.node);
            chart
                .draw_series(std::iter::once(Text::new(text, (start, y.1), (FAMILY, 15).into_font().color(&edge))))
                .map_err(err)?;
        }
    }
    Ok(())
}

/// Both panels on `root`.
fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, f: &Figure<'_>) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(&f.title, (FAMILY, 20)).map_err(err)?;
    let (top, bottom) = root.split_vertically(SIZE.1 as f64 * 0.47);
    throughput_panel(top, f)?;
    latency_panel(bottom, f)?;
    root.present().map_err(err)
}

fn throughput_panel<DB: DrawingBackend>(area: DrawingArea<DB, Shift>, f: &Figure<'_>) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let y_max =
        f.series.iter().flat_map(|(_, p)| p.iter().map(|p| p.throughput_ops / 1e3)).fold(0.0, f64::max).max(0.001)
            * 1.15;
    let mut chart = ChartBuilder::on(&area)
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..f.run_s, 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(f.x_desc)
        .y_desc("throughput (thousand ops/s)")
        .label_style((FAMILY, 14))
        .draw()
        .map_err(err)?;
    mark_faults(&mut chart, f, (0.0, y_max), true)?;
    for (system, points) in &f.series {
        let c = color(*system);
        chart
            .draw_series(LineSeries::new(
                points.iter().flat_map(|p| step(p, f, p.throughput_ops / 1e3)),
                c.stroke_width(2),
            ))
            .map_err(err)?
            .label(system.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3)));
    }
    legend(&mut chart, 15)
}

fn latency_panel<DB: DrawingBackend>(area: DrawingArea<DB, Shift>, f: &Figure<'_>) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let seen = || f.series.iter().flat_map(|(_, p)| p.iter().filter(|p| p.ops > 0));
    let lo = seen().map(|p| p.p50_us).fold(f64::INFINITY, f64::min);
    let hi = seen().map(|p| p.p99_us).fold(0.0, f64::max);
    // Whole decades: the log scale's labels fall on round numbers.
    let decade = |x: f64, round: fn(f64) -> f64| 10f64.powf(round(x.log10()));
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (decade(lo.max(0.001), f64::floor), decade(hi * 1.01, f64::ceil))
    } else {
        (0.1, 10.0)
    };
    let mut chart = ChartBuilder::on(&area)
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..f.run_s, (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(f.x_desc)
        .y_desc("latency, µs (log): p99 solid, p50 dashed")
        .label_style((FAMILY, 14))
        .draw()
        .map_err(err)?;
    mark_faults(&mut chart, f, (lo, hi), false)?;
    for (system, points) in &f.series {
        let c = color(*system);
        for seg in segments(points) {
            let p99 = seg.iter().flat_map(|p| step(p, f, p.p99_us));
            chart.draw_series(LineSeries::new(p99, c.stroke_width(2))).map_err(err)?;
            let p50 = seg.iter().flat_map(|p| step(p, f, p.p50_us));
            chart.draw_series(DashedLineSeries::new(p50, 5, 4, c.stroke_width(1))).map_err(err)?;
        }
    }
    Ok(())
}
