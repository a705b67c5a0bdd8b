//! Drawing the dashboard with ratatui.

use ratatui::layout::{Constraint, Direction, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Borders, Chart, Clear, Dataset, Gauge, GraphType, Paragraph, Wrap};
use ratatui::Frame;

use super::state::{Dashboard, View};

/// The colour of a phase of the time split.
fn phase_color(name: &str) -> Color {
    match name {
        "data" => Color::Yellow,
        "fwd" | "fwd+bwd" => Color::Green,
        "bwd" => Color::LightGreen,
        "sync" => Color::Magenta,
        "optim" => Color::Cyan,
        "eval" => Color::Blue,
        _ => Color::Red,
    }
}

/// Draws `d` over the whole frame.
pub fn draw(frame: &mut Frame<'_>, d: &Dashboard) {
    let memory = memory_lines(d);
    let lower_height = (memory.len() as u16 + 2).max(6);
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(3),
            Constraint::Length(1),
            Constraint::Min(10),
            Constraint::Length(lower_height),
            Constraint::Length(8),
        ])
        .split(frame.area());
    header(frame, rows[0], d);
    progress(frame, rows[1], d);
    let [chart_area, numbers_area] = columns(rows[2]);
    chart(frame, chart_area, d);
    numbers(frame, numbers_area, d);
    let [time_area, memory_area] = columns(rows[3]);
    time_split(frame, time_area, d);
    memory_and_ranks(frame, memory_area, memory);
    logs(frame, rows[4], d);
    if d.help {
        help(frame, frame.area(), d.controls_training);
    }
}

/// A wide left column and the 38-column panel on the right.
fn columns(area: Rect) -> [Rect; 2] {
    Layout::horizontal([Constraint::Min(40), Constraint::Length(38)]).areas(area)
}

fn block(title: &str) -> Block<'_> {
    Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(title, Style::default().add_modifier(Modifier::BOLD)))
}

fn header(frame: &mut Frame<'_>, area: Rect, d: &Dashboard) {
    let state = match (&d.finished, d.paused) {
        (Some(end), _) => end.clone(),
        (None, true) => "PAUSED (p resumes)".into(),
        (None, false) => "running".into(),
    };
    // The state first: the summary may be cut at the right edge of a narrow terminal.
    let text = vec![Line::from(vec![
        Span::styled(state, Style::default().fg(Color::Yellow)),
        Span::raw("  ·  "),
        Span::raw(d.summary.clone()),
    ])];
    let title = format!("ember · {}  (? help)", d.title);
    frame.render_widget(Paragraph::new(text).block(block(&title)), area);
}

fn progress(frame: &mut Frame<'_>, area: Rect, d: &Dashboard) {
    let step = d.last.as_ref().map_or(0, |r| r.step);
    let ratio = if d.max_steps == 0 { 0.0 } else { (step as f64 / d.max_steps as f64).clamp(0.0, 1.0) };
    let eta = d.eta_s().map_or("—".into(), duration);
    let label = format!("step {step}/{} ({:.1}%) · ETA {eta}", d.max_steps, 100.0 * ratio);
    frame.render_widget(
        Gauge::default().gauge_style(Style::default().fg(Color::Green)).ratio(ratio).label(label),
        area,
    );
}

fn chart(frame: &mut Frame<'_>, area: Rect, d: &Dashboard) {
    let x_name = if d.by_tokens { "tokens" } else { "step" };
    type Points = Vec<(f64, f64)>;
    let (main, extra): (Points, Option<Points>) = match d.view {
        View::Loss => (d.loss.xy(d.by_tokens), Some(d.val_loss.xy(d.by_tokens))),
        View::LearningRate => (d.lr.xy(d.by_tokens), None),
        View::GradNorm => (d.grad_norm.xy(d.by_tokens), None),
        View::Throughput => (d.throughput.xy(d.by_tokens), None),
    };
    let all = main.iter().chain(extra.iter().flatten());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if (y1 - y0).abs() < 1e-12 {
        y1 = y0 + 1.0;
    }
    // A legend (train/val) only where there are two curves.
    let mut train = Dataset::default()
        .marker(Marker::Braille)
        .graph_type(GraphType::Line)
        .style(Style::default().fg(Color::Cyan))
        .data(&main);
    if extra.is_some() {
        train = train.name("train");
    }
    let mut datasets = vec![train];
    if let Some(val) = &extra {
        datasets.push(
            Dataset::default()
                .name("val")
                .marker(Marker::Dot)
                .graph_type(GraphType::Scatter)
                .style(Style::default().fg(Color::Yellow))
                .data(val),
        );
    }
    let label = |v: f64| {
        Span::raw(if v.abs() >= 1e4 || (v != 0.0 && v.abs() < 1e-2) {
            format!("{v:.2e}")
        } else {
            format!("{v:.3}")
        })
    };
    let title = format!("{} vs {x_name}  (tab: next view, t: step/tokens)", d.view.title());
    let chart = Chart::new(datasets)
        .block(block(&title))
        .x_axis(Axis::default().title(x_name).bounds([x0, x1]).labels(vec![label(x0), label(x1)]))
        .y_axis(Axis::default().bounds([y0, y1]).labels(vec![label(y0), label((y0 + y1) / 2.0), label(y1)]));
    frame.render_widget(chart, area);
}

fn numbers(frame: &mut Frame<'_>, area: Rect, d: &Dashboard) {
    let mut lines = Vec::new();
    let mut row = |k: &str, v: String| {
        lines.push(Line::from(vec![
            Span::styled(format!("{k:<12}"), Style::default().fg(Color::Gray)),
            Span::raw(v),
        ]))
    };
    match &d.last {
        Some(r) => {
            row("loss", format!("{:.4} (ppl {:.2})", r.loss, r.perplexity));
            if let Some(e) = &d.last_eval {
                row("val loss", format!("{:.4} @ step {}", e.val_loss, e.step));
            }
            row("lr", format!("{:.3e}", r.lr));
            row("grad norm", format!("{:.4}", r.grad_norm));
            let last_event = d
                .last_event
                .as_ref()
                .map_or(String::new(), |e| format!(" (last: {} at step {})", e.event, e.step));
            row("sentinel", format!("{} skipped, {} spikes{last_event}", r.skipped_steps, r.spikes));
            if let Some(scale) = r.loss_scale {
                row("loss scale", format!("{scale} ({} overflows)", r.overflow_steps));
            }
            row("tokens/s", format!("{:.0}", r.tokens_per_sec));
            row("steps/s", d.steps_per_s().map_or("—".into(), |s| format!("{s:.2}")));
            row("MFU", r.mfu.map_or("— (peak unknown)".into(), |m| format!("{:.1}%", 100.0 * m)));
            row("tokens", format!("{}", r.tokens));
            row("elapsed", duration(r.elapsed_s));
        }
        None => row("waiting", "for the first logged step…".into()),
    }
    frame.render_widget(Paragraph::new(lines).block(block("throughput")), area);
}

fn time_split(frame: &mut Frame<'_>, area: Rect, d: &Dashboard) {
    let phases = d.phases();
    let total: f64 = phases.iter().map(|p| p.1).sum();
    let width = area.width.saturating_sub(2) as usize;
    let mut bar = Vec::new();
    let mut legend = Vec::new();
    for (name, s) in &phases {
        let style = Style::default().fg(phase_color(name));
        let cells = if total > 0.0 { ((s / total) * width as f64).floor() as usize } else { 0 };
        bar.push(Span::styled("█".repeat(cells), style));
        legend.push(Span::styled(format!("■ {name} {:.1} ms ", 1e3 * s), style));
    }
    let bound = d.bound().map_or("—".into(), |b| format!("{b}-bound"));
    let title = format!("time per step (logged step, device-synchronized): {:.1} ms · {bound}", 1e3 * total);
    let text = vec![Line::from(bar), Line::from(legend)];
    frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: true }).block(block(&title)), area);
}

fn memory_and_ranks(frame: &mut Frame<'_>, area: Rect, lines: Vec<Line<'static>>) {
    frame.render_widget(Paragraph::new(lines).block(block("memory · ranks")), area);
}

/// The memory and ranks panel's lines: estimate, RSS, the device pool on CUDA (in use, and
/// reserved in parentheses), ranks and their parameter agreement.
fn memory_lines(d: &Dashboard) -> Vec<Line<'static>> {
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    let mut lines = Vec::new();
    if let Some(e) = &d.estimate {
        lines.push(Line::raw(format!("estimate   {}", mb(e.peak))));
        let copy = match e.per_param.low_precision_copy {
            0 => String::new(),
            b => format!(" + {b} B/matmul weight (16-bit copy)"),
        };
        let state = match e.mode.optimizer_shards {
            1 => format!("{}", e.per_param.total()),
            w => format!("{:.2} (AdamW over {w} ranks)", e.persistent_per_param()),
        };
        lines.push(Line::raw(format!("state      {state} B/param{copy}")));
    }
    if let Some(bytes) = d.last.as_ref().map(|r| r.optimizer_state_bytes).filter(|&b| b > 0) {
        lines.push(Line::raw(format!("AdamW      {} on rank 0", mb(bytes))));
    }
    if let Some(rss) = d.last.as_ref().and_then(|r| r.rss_bytes) {
        lines.push(Line::raw(format!("RSS now    {}", mb(rss))));
    }
    if let Some(r) = d.last.as_ref() {
        if let (Some(in_use), Some(reserved)) = (r.device_in_use_bytes, r.device_reserved_bytes) {
            let reserved = format!("{:.1}", reserved as f64 / 1e6);
            lines.push(Line::raw(format!("device     {} ({reserved} rsv)", mb(in_use))));
        }
    }
    let (step, agree, hash) =
        d.last.as_ref().map_or((0, None, None), |r| (r.step, r.replicas_agree, r.param_hash.clone()));
    let status = match agree {
        Some(true) => "parameters agree",
        Some(false) => "PARAMETERS DIFFER",
        None if d.world_size == 1 => "single rank",
        None => "not compared",
    };
    lines.push(Line::raw(format!("ranks      {} @ step {step}", d.world_size)));
    lines.push(Line::raw(format!("replicas   {status}")));
    if let Some(hash) = hash {
        lines.push(Line::raw(format!("hash       {hash}")));
    }
    lines
}

fn logs(frame: &mut Frame<'_>, area: Rect, d: &Dashboard) {
    let keep = area.height.saturating_sub(2) as usize;
    let lines: Vec<Line<'_>> = d.logs.iter().rev().take(keep).rev().map(|l| Line::raw(l.as_str())).collect();
    frame.render_widget(Paragraph::new(lines).block(block("log")), area);
}

fn help(frame: &mut Frame<'_>, area: Rect, training: bool) {
    let w = 52.min(area.width);
    let h = 11.min(area.height);
    let popup =
        Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    let mut text = if training {
        vec![
            Line::raw("q        stop after a checkpoint"),
            Line::raw("s        write a checkpoint now"),
            Line::raw("p        pause / resume training"),
        ]
    } else {
        vec![Line::raw("q        leave (the run is not affected)")]
    };
    text.extend([
        Line::raw("tab, →   next chart; ← previous"),
        Line::raw("t        x axis: steps / tokens"),
        Line::raw("?, esc   close this help"),
    ]);
    if training {
        text.extend([Line::raw(""), Line::raw("Ctrl-C also stops after a checkpoint.")]);
    }
    frame.render_widget(Clear, popup);
    frame.render_widget(Paragraph::new(text).block(block("keys")), popup);
}

/// `1h02m`, `4m05s`, `12.3s`.
pub fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s >= 3600.0 {
        format!("{}h{:02}m", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64)
    } else if s >= 60.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!("{s:.1}s")
    }
}
