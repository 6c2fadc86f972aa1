//! `sinter train --plot FILE.svg|FILE.png`: the run's loss curve (every loss read back) and,
//! with `--eval`, the held-out loss at each evaluation, drawn with plotters. Text is set in
//! DejaVu Sans, carried in the binary, so a plot needs no system font.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::CliError;

/// Pixels of a plot.
const SIZE: (u32, u32) = (960, 540);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

/// The format `path` asks for by its extension: an error naming the two it may have.
pub fn format_of(path: &Path) -> Result<Format, CliError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("svg") => Ok(Format::Svg),
        Some("png") => Ok(Format::Png),
        _ => Err(CliError::Arg(format!(
            "--plot {}: the file must end in .svg or .png",
            path.display()
        ))),
    }
}

/// What a run read back: `(step, loss)` of the training loss and of the held-out loss.
#[derive(Clone, Debug, Default)]
pub struct Curve {
    pub train: Vec<(u64, f64)>,
    pub held_out: Vec<(u64, f64)>,
}

/// Draws `curve` to `path` in `format`, titled `title`.
pub fn draw(path: &Path, format: Format, title: &str, curve: &Curve) -> Result<(), CliError> {
    register_font();
    let failed = |message: String| CliError::WriteFile {
        path: path.to_path_buf(),
        source: std::io::Error::other(message),
    };
    match format {
        Format::Svg => {
            let root = SVGBackend::new(path, SIZE).into_drawing_area();
            draw_on(&root, title, curve).map_err(failed)?;
            root.present().map_err(|e| failed(e.to_string()))
        }
        Format::Png => {
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw_on(&root, title, curve).map_err(failed)?;
            root.present().map_err(|e| failed(e.to_string()))
        }
    }
}

/// The family every text of a plot uses.
const FAMILY: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // DejaVu Sans is a valid TrueType font: registering it cannot fail.
        let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, dejavu::sans::regular());
    });
}

fn draw_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    curve: &Curve,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let text = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(text)?;
    let points = curve.train.iter().chain(&curve.held_out);
    let last = points.clone().map(|&(s, _)| s).max().unwrap_or(1).max(1);
    let finite = points.map(|&(_, l)| l).filter(|l| l.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), l| {
        (lo.min(l), hi.max(l))
    });
    let (lo, hi) = if lo <= hi { (lo, hi) } else { (0.0, 1.0) };
    let pad = ((hi - lo) * 0.05).max(hi.abs() * 1e-3).max(1e-6);
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FAMILY, 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0u64..last, (lo - pad)..(hi + pad))
        .map_err(text)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .label_style((FAMILY, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(text)?;
    let blue = RGBColor(31, 119, 180);
    let orange = RGBColor(255, 127, 14);
    let finite = |points: &[(u64, f64)]| -> Vec<(u64, f64)> {
        points
            .iter()
            .copied()
            .filter(|(_, l)| l.is_finite())
            .collect()
    };
    chart
        .draw_series(LineSeries::new(finite(&curve.train), blue.stroke_width(2)))
        .map_err(text)?
        .label("training loss")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    if !curve.held_out.is_empty() {
        let held_out = finite(&curve.held_out);
        chart
            .draw_series(LineSeries::new(held_out.clone(), orange.stroke_width(2)))
            .map_err(text)?
            .label("held-out loss")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], orange.stroke_width(2))
            });
        chart
            .draw_series(
                held_out
                    .into_iter()
                    .map(|p| Circle::new(p, 4, orange.filled())),
            )
            .map_err(text)?;
    }
    chart
        .configure_series_labels()
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(text)?;
    Ok(())
}
