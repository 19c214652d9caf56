//! The SVG plots: a figure's rows as bars, a fields table's columns as grouped bars; both with
//! the line at 1.

use std::path::Path;

use anyhow::Context;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::fields::Plot;
use super::figure::{Figure, Kept};

const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// A chart of the plots: bars over `0..n` rows, ratios up the y axis.
type Chart<'a> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A legend entry's colour box at `(x, y)`.
fn legend_box(x: i32, y: i32, colour: RGBColor) -> Rectangle<(i32, i32)> {
    Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled())
}

/// The line at 1 across the `n` rows, then the legend at `position`.
fn unity_and_legend(chart: &mut Chart<'_>, n: usize, position: SeriesLabelPosition) -> anyhow::Result<()> {
    chart.draw_series(LineSeries::new([(0.0, 1.0), (n as f64, 1.0)], BLACK.stroke_width(1)))?;
    chart.configure_series_labels().position(position).border_style(BLACK).background_style(WHITE.mix(0.9)).draw()?;
    Ok(())
}

/// The figure's plot: every row's median ratio as a bar, the line at 1; one colour per group
/// (dtype and op) where there are at most ten groups, else one per dtype, named in the legend.
pub fn figure(fig: &Figure, rows: &[Kept], path: &Path) -> anyhow::Result<()> {
    // headroom above the tallest bar for the legend
    let top = rows.iter().map(|r| r.2).fold(1.2f64, f64::max) * 1.45;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&fig.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..rows.len() as f64, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_desc("rows (shapes), in the table's order, one colour per legend entry")
        .y_desc(if fig.field.is_some() { "ratio (see the table)" } else { "PyTorch time / gemmbridge time" })
        .draw()?;
    let mut groups: Vec<&(String, String)> = rows.iter().map(|r| &r.0).collect();
    groups.dedup();
    let by_group = groups.len() <= PALETTE.len();
    let name = |r: &Kept| if by_group { format!("{} {}", r.0 .0, r.0 .1) } else { r.0 .0.clone() };
    let mut names: Vec<String> = rows.iter().map(name).collect();
    names.dedup();
    for (c, entry) in names.iter().enumerate() {
        let colour = PALETTE[c % PALETTE.len()];
        let bars = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| name(r) == *entry)
            .map(move |(i, r)| Rectangle::new([(i as f64 + 0.1, 0.0), (i as f64 + 0.9, r.2)], colour.filled()));
        chart.draw_series(bars)?.label(entry.as_str()).legend(move |(x, y)| legend_box(x, y, colour));
    }
    unity_and_legend(&mut chart, rows.len(), SeriesLabelPosition::UpperLeft)?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A fields table's plot: per row (named under the axis: the key's first word on one line,
/// the rest on the next) one bar per plotted column, one colour per column; the line at 1.
pub fn grouped(plot: &Plot, rows: &[(String, Vec<Option<f64>>)], path: &Path) -> anyhow::Result<()> {
    let tallest = rows.iter().flat_map(|r| r.1.iter().flatten()).fold(1.2f64, |a, &b| a.max(b));
    let top = tallest * 1.35;
    let root = SVGBackend::new(path, (1100, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&plot.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..rows.len() as f64, 0f64..top)?;
    chart.configure_mesh().disable_x_mesh().x_labels(0).y_desc(plot.y.as_str()).draw()?;
    let width = 0.8 / plot.columns.len() as f64;
    for (c, header) in plot.columns.iter().enumerate() {
        let colour = PALETTE[c % PALETTE.len()];
        let bars = rows.iter().enumerate().filter_map(move |(i, (_, v))| {
            let x = i as f64 + 0.1 + c as f64 * width;
            v[c].map(|y| Rectangle::new([(x, 0.0), (x + width, y)], colour.filled()))
        });
        chart.draw_series(bars)?.label(header.as_str()).legend(move |(x, y)| legend_box(x, y, colour));
    }
    unity_and_legend(&mut chart, rows.len(), SeriesLabelPosition::UpperRight)?;
    let style = ("sans-serif", 10).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, (name, _)) in rows.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        let (first, rest) = name.split_once(' ').unwrap_or((name.as_str(), ""));
        root.draw(&Text::new(first.to_string(), (x, y + 6), style.clone()))?;
        root.draw(&Text::new(rest.to_string(), (x, y + 20), style.clone()))?;
    }
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
