//! The comparison chart: an SVG with two panels over the matrix cells (connections ×
//! batch): throughput (events/s) and p99 latency (ms), one line per server, both on log
//! scales. Drawn with `plotters`' SVG backend only, so it needs no fonts: labels are SVG
//! `<text>` elements that the viewer renders.

use plotters::prelude::*;
use std::path::Path;

/// One line of a panel: a name and one value per category (`None` = missing).
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Values, one per category.
    pub values: Vec<Option<f64>>,
}

/// The data of a comparison chart.
#[derive(Debug, Clone)]
pub struct ChartData {
    /// Title above both panels.
    pub title: String,
    /// Category labels, e.g. `16 × 1`.
    pub categories: Vec<String>,
    /// Events/s per server.
    pub throughput: Vec<Series>,
    /// p99 latency (ms) per server.
    pub p99_ms: Vec<Series>,
}

const COLORS: [RGBColor; 4] = [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44), RGBColor(148, 103, 189)];

fn bounds(series: &[Series]) -> (f64, f64) {
    let vals: Vec<f64> = series.iter().flat_map(|s| s.values.iter().flatten().copied()).filter(|v| *v > 0.0).collect();
    if vals.is_empty() {
        return (0.1, 10.0);
    }
    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().copied().fold(0.0, f64::max);
    // Whole decades around the data.
    (10f64.powf(lo.log10().floor()), 10f64.powf((hi * 1.01).log10().ceil()))
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    categories: &[String],
    series: &[Series],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let (lo, hi) = bounds(series);
    let n = categories.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (lo..hi).log_scale())
        .map_err(|e| e.to_string())?;
    let cats = categories.to_vec();
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&move |x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < cats.len() {
                cats[i as usize].clone()
            } else {
                String::new()
            }
        })
        .x_desc("connections × batch")
        .y_desc(y_desc)
        .y_label_formatter(&|y| crate::report::thousands(*y))
        .draw()
        .map_err(|e| e.to_string())?;
    for (k, s) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let points: Vec<(f64, f64)> = s.values.iter().enumerate().filter_map(|(i, v)| v.filter(|v| *v > 0.0).map(|v| (i as f64, v))).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled()))).map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Renders `data` as an SVG document.
///
/// # Errors
/// plotters' drawing error, as text.
pub fn render_svg(data: &ChartData) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root.titled(&data.title, ("sans-serif", 20)).map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(550);
        panel(&left, "throughput", "events/s (log)", &data.categories, &data.throughput)?;
        panel(&right, "p99 latency", "ms (log)", &data.categories, &data.p99_ms)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// Renders `data` and writes it to `path`.
///
/// # Errors
/// Drawing or writing fails.
pub fn write_svg(data: &ChartData, path: &Path) -> Result<(), String> {
    let svg = render_svg(data)?;
    std::fs::write(path, svg).map_err(|e| format!("write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_an_svg_without_fonts() {
        let data = ChartData {
            title: "t".into(),
            categories: vec!["16 × 1".into(), "16 × 64".into(), "64 × 512".into()],
            throughput: vec![
                Series { name: "ours".into(), values: vec![Some(6000.0), Some(200_000.0), Some(900_000.0)] },
                Series { name: "reference".into(), values: vec![Some(5000.0), None, Some(700_000.0)] },
            ],
            p99_ms: vec![
                Series { name: "ours".into(), values: vec![Some(4.0), Some(8.0), Some(20.0)] },
                Series { name: "reference".into(), values: vec![Some(5.0), Some(9.0), Some(25.0)] },
            ],
        };
        let svg = render_svg(&data).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        assert!(svg.contains("16 × 64"));
        assert!(svg.contains("reference"));
        assert!(svg.contains("<polyline") || svg.contains("<path"));
    }
}
