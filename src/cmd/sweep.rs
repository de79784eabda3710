//! `attnc bench --sweep NAME=v1,v2,…`: one benchmark per value, one table row
//! each, and an SVG plot of achieved GFLOP/s against the swept value for our
//! kernels and the library baselines.

use attnc_runtime::gpu::bench::BenchReport;
use plotters::prelude::*;
use std::fmt::Write;
use std::path::Path;

/// Achieved GFLOP/s of one sweep point.
pub struct Point {
    pub value: u64,
    pub attention: Option<f64>,
    pub cubek_attention: Option<f64>,
    pub gemm: Option<f64>,
    pub cubek_matmul: Option<f64>,
}

impl Point {
    pub fn of(value: u64, r: &BenchReport) -> Point {
        let (attention, cubek_attention) = match &r.baseline {
            Some(Ok(b)) => (Some(b.work.flops / b.ours / 1e9), Some(b.work.flops / b.cubek / 1e9)),
            _ => {
                let att = r.kernels.iter().filter(|k| k.kind == "attention");
                let (flops, time) = att.fold((0.0, 0.0), |(f, t), k| (f + k.work.flops, t + k.median));
                ((time > 0.0).then(|| flops / time / 1e9), None)
            }
        };
        // GEMMs together: all their FLOPs over all their time, ours and cubek's.
        let (mut flops, mut ours, mut theirs, mut all) = (0.0, 0.0, 0.0, true);
        for g in &r.gemms {
            flops += g.work.flops;
            ours += g.ours;
            match &g.cubek {
                Ok(t) => theirs += t,
                Err(_) => all = false,
            }
        }
        let gemm = (ours > 0.0).then(|| flops / ours / 1e9);
        let cubek_matmul = (all && theirs > 0.0).then(|| flops / theirs / 1e9);
        Point { value, attention, cubek_attention, gemm, cubek_matmul }
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or("-".into(), |g| format!("{g:.3}"))
}

fn ratio(ours: Option<f64>, theirs: Option<f64>) -> String {
    match (ours, theirs) {
        // Time ratio = their throughput over ours.
        (Some(o), Some(t)) => format!("{:.3}", t / o),
        _ => "-".into(),
    }
}

/// The table header.
pub fn header(name: &str) -> String {
    format!(
        "{name:>8} {:>14} {:>14} {:>10} {:>14} {:>14} {:>10}",
        "attn GFLOP/s", "cubek GFLOP/s", "attn R", "gemm GFLOP/s", "cubek GFLOP/s", "gemm R"
    )
}

/// One table row: GFLOP/s and time ratios (ours / theirs; lower is better).
pub fn row(p: &Point) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "{:>8} {:>14} {:>14} {:>10} {:>14} {:>14} {:>10}",
        p.value,
        cell(p.attention),
        cell(p.cubek_attention),
        ratio(p.attention, p.cubek_attention),
        cell(p.gemm),
        cell(p.cubek_matmul),
        ratio(p.gemm, p.cubek_matmul)
    );
    s
}

/// Draw GFLOP/s against the swept value as an SVG at `path`.
pub fn plot(path: &Path, name: &str, device: &str, points: &[Point]) -> Result<(), String> {
    let series: [(&str, fn(&Point) -> Option<f64>, RGBColor); 4] = [
        ("attnc attention", |p| p.attention, RGBColor(31, 119, 180)),
        ("cubek-attention", |p| p.cubek_attention, RGBColor(255, 127, 14)),
        ("attnc GEMM", |p| p.gemm, RGBColor(44, 160, 44)),
        ("cubek-matmul", |p| p.cubek_matmul, RGBColor(214, 39, 40)),
    ];
    let x0 = points.iter().map(|p| p.value).min().unwrap_or(0) as f64;
    let x1 = points.iter().map(|p| p.value).max().unwrap_or(1) as f64;
    let ymax =
        points.iter().flat_map(|p| series.iter().filter_map(move |(_, f, _)| f(p))).fold(0.0, f64::max).max(1e-9) * 1.1;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| format!("cannot draw `{}`: {e}", path.display());
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("achieved GFLOP/s on {device}"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1.max(x0 + 1.0), 0.0..ymax)
        .map_err(err)?;
    chart.configure_mesh().x_desc(name).y_desc("GFLOP/s").draw().map_err(err)?;
    for (label, f, color) in series {
        let xy: Vec<(f64, f64)> = points.iter().filter_map(|p| f(p).map(|g| (p.value as f64, g))).collect();
        if xy.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(xy.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(xy.into_iter().map(|(x, y)| Circle::new((x, y), 3, color.filled()))).map_err(err)?;
    }
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw().map_err(err)?;
    root.present().map_err(err)
}
