//! `ember plot RUN_DIR`: PNG charts of a run's `metrics.jsonl` (plotters).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use ember_train::observe::metrics::{read_records, Record, TrainRecord};
use ember_train::persist::files;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// Arguments of `ember plot`.
#[derive(Args)]
pub struct PlotArgs {
    /// The run directory.
    #[arg(value_name = "RUN_DIR")]
    run_dir: PathBuf,
    /// Where to write the PNG files (default: RUN_DIR/plots).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// A TrueType font for the labels (default: $EMBER_FONT, else DejaVu Sans or Liberation
    /// Sans from the usual system paths).
    #[arg(long, value_name = "FILE.ttf")]
    font: Option<PathBuf>,
}

const FONTS: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial Unicode.ttf",
];

/// Runs `ember plot`.
pub fn run(args: PlotArgs) -> anyhow::Result<()> {
    let metrics = args.run_dir.join(files::METRICS);
    let records = read_records(&metrics)?;
    let train: Vec<TrainRecord> = records
        .iter()
        .filter_map(|r| match r {
            Record::Train(t) => Some(t.clone()),
            Record::Eval(_) | Record::Event(_) => None,
        })
        .collect();
    if train.is_empty() {
        anyhow::bail!("{}: no training records to plot", metrics.display());
    }
    let val: Vec<(f64, f64)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Eval(e) => Some((e.step as f64, e.val_loss)),
            Record::Train(_) | Record::Event(_) => None,
        })
        .collect();
    load_font(args.font.as_deref())?;
    let out = args.out.unwrap_or_else(|| args.run_dir.join("plots"));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let series = |f: fn(&TrainRecord) -> f64| train.iter().map(|r| (r.step as f64, f(r))).collect::<Vec<_>>();
    let mut written = Vec::new();
    let mut chart = |name: &str, title: &str, y: &str, lines: Vec<Curve<'_>>| -> anyhow::Result<()> {
        let path = out.join(format!("{name}.png"));
        line_chart(&path, title, y, &lines).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    chart(
        "loss",
        "loss",
        "nats/token",
        vec![("train", series(|r| r.loss), BLUE), ("val", val.clone(), RED)],
    )?;
    chart("lr", "learning rate", "lr", vec![("lr", series(|r| r.lr), BLUE)])?;
    chart(
        "grad_norm",
        "gradient norm (before clipping)",
        "L2 norm",
        vec![("grad norm", series(|r| r.grad_norm), BLUE)],
    )?;
    chart("throughput", "throughput", "tokens/s", vec![("tokens/s", series(|r| r.tokens_per_sec), BLUE)])?;
    let path = out.join("time.png");
    time_chart(&path, &train).with_context(|| format!("cannot write {}", path.display()))?;
    written.push(path);
    for path in written {
        out!("wrote {}", path.display());
    }
    Ok(())
}

/// Registers the labels' font with plotters.
fn load_font(explicit: Option<&Path>) -> anyhow::Result<()> {
    let from_env = std::env::var_os("EMBER_FONT").map(PathBuf::from);
    let candidates: Vec<PathBuf> = explicit
        .map(Path::to_path_buf)
        .into_iter()
        .chain(from_env)
        .chain(FONTS.iter().map(PathBuf::from))
        .collect();
    let path = candidates.iter().find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!(
            "no TrueType font found for the chart labels (looked for {}): pass --font FILE.ttf",
            FONTS.join(", ")
        )
    })?;
    let bytes: &'static [u8] = Box::leak(
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?.into_boxed_slice(),
    );
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{}: not a TrueType font", path.display()))?;
    Ok(())
}

fn bounds(points: impl Iterator<Item = (f64, f64)>) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let pad = (y1 - y0) * 0.05;
    (x0..x1, (y0 - pad)..(y1 + pad))
}

/// A named curve and its colour.
type Curve<'a> = (&'a str, Vec<(f64, f64)>, RGBColor);
type Lines<'a> = [Curve<'a>];
/// A phase of the step, how to read its seconds, and its colour.
type Phase = (&'static str, fn(&TrainRecord) -> f64, RGBColor);

fn line_chart(path: &Path, title: &str, y_desc: &str, lines: &Lines<'_>) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let (xs, ys) = bounds(lines.iter().flat_map(|l| l.1.iter().copied()));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xs, ys)?;
    chart.configure_mesh().x_desc("step").y_desc(y_desc).draw()?;
    for (name, points, color) in lines {
        if points.is_empty() {
            continue;
        }
        let color = *color;
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        if points.len() < 50 {
            // Few points (evaluations): mark each one.
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
    }
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

/// The logged steps' time split, stacked: data wait, forward, backward, sync, optimizer (ms);
/// forward+backward as one phase for a run written before they were timed apart.
fn time_chart(path: &Path, train: &[TrainRecord]) -> anyhow::Result<()> {
    let data: Phase = ("data", |r| r.data_s, RGBColor(230, 180, 40));
    let sync: Phase = ("sync", |r| r.step_sync_s, RGBColor(170, 70, 170));
    let optimizer: Phase = ("optimizer", |r| r.optimizer_s, RGBColor(40, 150, 200));
    let phases: Vec<Phase> = if train.iter().any(|r| r.forward_s > 0.0 || r.backward_s > 0.0) {
        let forward: Phase = ("forward", |r| r.forward_s, RGBColor(60, 160, 80));
        let backward: Phase = ("backward", |r| r.backward_s, RGBColor(140, 200, 110));
        vec![data, forward, backward, sync, optimizer]
    } else {
        vec![data, ("forward+backward", |r| r.forward_backward_s, RGBColor(60, 160, 80)), sync, optimizer]
    };
    let cumulative = |upto: usize| -> Vec<(f64, f64)> {
        train.iter().map(|r| (r.step as f64, phases[..=upto].iter().map(|p| 1e3 * (p.1)(r)).sum())).collect()
    };
    let root = BitMapBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let (xs, ys) = bounds(cumulative(phases.len() - 1).into_iter().chain([(train[0].step as f64, 0.0)]));
    let mut chart = ChartBuilder::on(&root)
        .caption("time per logged step", ("sans-serif", 26))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xs, 0.0..ys.end)?;
    chart.configure_mesh().x_desc("step").y_desc("ms").draw()?;
    for i in (0..phases.len()).rev() {
        let (name, _, color) = phases[i];
        chart
            .draw_series(AreaSeries::new(cumulative(i), 0.0, color.mix(0.8)).border_style(color))?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
