//! `tessera bench --plot`: IOPS and latency bars per target, as the seed documents chart them.

use std::path::Path;

use plotters::coord::ranged1d::SegmentedCoord;
use plotters::coord::types::{RangedCoordf64, RangedCoordusize};
use plotters::coord::Shift;
use plotters::prelude::*;
use tessera_bench::report::{describe, Summary};

type Panel<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<SegmentedCoord<RangedCoordusize>, RangedCoordf64>>;

/// A chart with one slot per target along x (labelled with its name) and values up to `max`.
fn panel<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: &str,
    names: &'a [String],
    max: f64,
) -> Result<Panel<'a, 'b>, DrawingAreaErrorKind<std::io::Error>> {
    let mut c = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((0..names.len()).into_segmented(), 0.0..max)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    Ok(c)
}

/// Draws two panels into an SVG file: mean IOPS per target, and p50 / p99 latency per target.
pub fn svg(all: &[Summary], path: &Path) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", path.display());
    let n = all.len();
    let width = (320 + 160 * n as u32).max(640);
    let root = SVGBackend::new(path, (width, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let title = all.first().map(|s| describe(&s.workload)).unwrap_or_default();
    let root = root.titled(&title, ("sans-serif", 18)).map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(360);

    let names: Vec<String> = all.iter().map(|s| s.target.clone()).collect();
    let max_iops = all.iter().map(|s| s.iops_mean).fold(0.0, f64::max).max(1.0) * 1.15;
    let mut c = panel(&top, "IOPS (mean of runs)", &names, max_iops).map_err(|e| err(&e))?;
    c.draw_series(all.iter().enumerate().map(|(i, s)| {
        let mut bar = Rectangle::new(
            [(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), s.iops_mean)],
            BLUE.mix(0.6).filled(),
        );
        bar.set_margin(0, 0, 20, 20);
        bar
    }))
    .map_err(|e| err(&e))?;

    let lat = |s: &Summary, p99: bool| {
        s.runs
            .last()
            .and_then(|r| r.total.latency.as_ref())
            .map(|l| if p99 { l.p99_us } else { l.p50_us })
            .unwrap_or(0.0)
    };
    let max_lat = all.iter().map(|s| lat(s, true)).fold(0.0, f64::max).max(1.0) * 1.15;
    let caption = "latency, microseconds (p50 light, p99 dark; last run)";
    let mut c = panel(&bottom, caption, &names, max_lat).map_err(|e| err(&e))?;
    for (p99, style, (l, r)) in [(false, RED.mix(0.35), (15, 45)), (true, RED.mix(0.8), (45, 15))] {
        c.draw_series(all.iter().enumerate().map(|(i, s)| {
            let mut bar = Rectangle::new(
                [(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), lat(s, p99))],
                style.filled(),
            );
            // Side by side within the target's slot.
            bar.set_margin(0, 0, l, r);
            bar
        }))
        .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
