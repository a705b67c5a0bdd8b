//! The terminal dashboard (ratatui): `ember train` in a terminal and `ember watch RUN_DIR`.
//! It reads the run's `metrics.jsonl` as it grows, so a live run and a finished one look the
//! same; rendering runs at most 10 frames/s on the UI thread, apart from training.

pub mod hangup;
pub mod state;
pub mod view;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_train::observe::metrics::Record;
use ember_train::observe::words::count;
use ember_train::persist::files;
use ember_train::Controls;
use ember_train::RunConfig;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::DefaultTerminal;

pub use state::{Action, Dashboard};

/// Frames per second at most.
const FPS: u64 = 10;

/// Reads the records appended to a `metrics.jsonl` since the last call.
pub struct MetricsTail {
    path: PathBuf,
    offset: u64,
    partial: String,
}

impl MetricsTail {
    /// Follows `RUN_DIR/metrics.jsonl` from its start (it may not exist yet).
    pub fn new(run_dir: &Path) -> Self {
        Self { path: run_dir.join(files::METRICS), offset: 0, partial: String::new() }
    }

    /// The complete records appended since the last call (a line still being written waits
    /// for the next call; a truncated file — a resume — is read again from its start).
    pub fn poll(&mut self) -> Vec<Record> {
        let Ok(mut file) = File::open(&self.path) else { return Vec::new() };
        let len = file.metadata().map_or(0, |m| m.len());
        if len < self.offset {
            self.offset = 0;
            self.partial.clear();
        }
        let mut text = String::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err() || file.read_to_string(&mut text).is_err() {
            return Vec::new();
        }
        self.offset += text.len() as u64;
        self.partial.push_str(&text);
        let mut records = Vec::new();
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            if let Ok(record) = serde_json::from_str(line.trim()) {
                records.push(record);
            }
        }
        records
    }
}

/// A dashboard for the run in `run_dir`, titled from its `config.toml` (when readable).
pub fn for_run(run_dir: &Path, config: Option<&RunConfig>) -> Dashboard {
    let loaded;
    let config = match config {
        Some(c) => Some(c),
        None => {
            loaded = RunConfig::load(&run_dir.join(files::CONFIG), &[]).ok();
            loaded.as_ref()
        }
    };
    let title = run_dir.display().to_string();
    let Some(c) = config else {
        return Dashboard::new(title, "no config.toml yet".into(), 0, 1, None);
    };
    let world = c.world_size();
    let mut c = c.clone();
    // The prepared data's vocabulary when it can be read; the dashboard shows what it can.
    if let Ok(vocab) = c.data_vocab() {
        let _ = c.resolve_vocab(vocab);
    }
    let estimate = (c.model.vocab_size() > 0)
        .then(|| ember_train::observe::accounting::estimate_run(&c, c.peak_flops, 0.4));
    let params = estimate.as_ref().map_or(String::new(), |e| format!(" · {} params", e.params));
    let summary = format!(
        "{} · {}{params} · {}/step ({} × {} × {} × {}) · lr {:.1e}",
        ember_train::observe::device::describe_device_short(c.backend, c.device),
        c.model.arch(),
        count(c.tokens_per_step(world), "token"),
        c.micro_batch_size,
        c.accumulation_steps,
        count(world, "rank"),
        c.model.block_size(),
        c.optimizer.lr,
    );
    Dashboard::new(title, summary, c.max_steps, world, estimate)
}

/// What the UI loop is attached to.
pub struct Attached<'a> {
    /// The run's metrics.
    pub tail: MetricsTail,
    /// Log lines of a run in this process.
    pub logs: Option<Receiver<String>>,
    /// The run's controls (training in this process), else the dashboard only watches.
    pub controls: Option<Arc<Controls>>,
    /// Returns how the run ended, once it has (checked every frame, with what the dashboard
    /// has read so far).
    pub finished: &'a dyn Fn(&Dashboard) -> Option<String>,
    /// Whether to leave at once, without waiting for a key (a resumed run that was already
    /// finished: nothing was shown worth a key).
    pub leave: &'a dyn Fn() -> bool,
}

/// Opens the terminal for the dashboard: raw mode, the alternate screen, and a panic hook that
/// restores them ([`close_terminal`] at the end). Unlike `ratatui::init`, nothing here or in
/// the hook prints with `eprintln!`, which panics when stderr is a terminal that hung up (a
/// panic in the panic hook aborts the process before the run's checkpoint).
///
/// Errors: no terminal to draw on (output redirected, no controlling tty), as a message that
/// says so; ratatui's own `init` panics there.
pub fn open_terminal() -> anyhow::Result<ratatui::DefaultTerminal> {
    use ratatui::crossterm::{execute, terminal};
    let open = || -> std::io::Result<ratatui::DefaultTerminal> {
        terminal::enable_raw_mode()?;
        execute!(std::io::stdout(), terminal::EnterAlternateScreen)?;
        ratatui::Terminal::new(ratatui::prelude::CrosstermBackend::new(std::io::stdout()))
    };
    let opened = open().map_err(|e| {
        // Raw mode may be on already; the alternate screen was not entered (or failed).
        let _ = terminal::disable_raw_mode();
        anyhow::anyhow!("the dashboard needs a terminal, and this one cannot be opened ({e}); run without --tui or use `ember watch` from a terminal")
    })?;
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = ratatui::try_restore();
            previous(info);
        }));
    });
    Ok(opened)
}

/// Gives the terminal back (cursor shown, raw mode off, the normal screen), ignoring a terminal
/// that is gone: ratatui's `restore` and its `Terminal`'s drop report failures with
/// `eprintln!`, which panics on a hung-up stderr, so a terminal that cannot show its cursor
/// again is not dropped (forgotten, at the process's end).
pub fn close_terminal(mut terminal: ratatui::DefaultTerminal) {
    let shown = terminal.show_cursor().is_ok();
    let _ = ratatui::try_restore();
    if !shown {
        std::mem::forget(terminal);
    }
}

/// Runs the dashboard in `terminal` until the user quits (watching) or the run ends and the
/// user presses a key (training). Returns the dashboard's final state.
///
/// It also leaves, without waiting for a key:
/// - when a stop of the training was requested by anything but its own `q` (Ctrl-C, SIGTERM,
///   SIGHUP: the run checkpoints and ends without anyone at the keyboard);
/// - when the terminal is gone (hung up, end of input, an error writing or reading it: an SSH
///   disconnect, `tmux kill-session`), after asking the training to stop with a checkpoint.
///   Each frame checks for it, so no wait spins on a terminal that can never answer.
///
/// Errors: none from the terminal itself (a terminal that fails is a terminal gone).
pub fn run(
    terminal: &mut DefaultTerminal,
    mut d: Dashboard,
    mut a: Attached<'_>,
) -> std::io::Result<Dashboard> {
    d.controls_training = a.controls.is_some();
    let frame = Duration::from_millis(1000 / FPS);
    // Whether this dashboard's own `q` asked the training to stop (a stop from elsewhere
    // leaves at once).
    let mut asked_to_stop = false;
    let keyboard = hangup::KeyboardTerminal::open();
    let gone = |d: Dashboard, a: &Attached<'_>| {
        if let Some(c) = &a.controls {
            c.stop.store(true, Ordering::SeqCst);
        }
        Ok(d)
    };
    loop {
        let started = Instant::now();
        if let Some(c) = &a.controls {
            if c.stop_requested() && !asked_to_stop {
                return Ok(d);
            }
        }
        if keyboard.hung_up() {
            return gone(d, &a);
        }
        if (a.leave)() {
            return Ok(d);
        }
        for record in a.tail.poll() {
            if a.logs.is_none() {
                // Watching files: the log panel shows the records.
                d.log(&match &record {
                    Record::Train(r) => r.to_string(),
                    Record::Eval(e) => e.to_string(),
                    Record::Event(e) => e.to_string(),
                });
            }
            d.push(record);
        }
        if let Some(logs) = &a.logs {
            for line in logs.try_iter() {
                d.log(&line);
            }
        }
        if d.finished.is_none() {
            d.finished = (a.finished)(&d);
        }
        let drawing = Instant::now();
        if terminal.draw(|f| view::draw(f, &d)).is_err() {
            return gone(d, &a); // EIO: the terminal hung up
        }
        d.frames = (d.frames.0 + 1, d.frames.1 + drawing.elapsed().as_secs_f64());
        while let Some(remaining) = frame.checked_sub(started.elapsed()) {
            // Waits on the terminal itself: crossterm 0.29's poll spins forever, ignoring its
            // timeout, once the terminal has hung up (its reads return 0 bytes or EIO).
            match keyboard.wait(remaining) {
                hangup::Input::None => break,
                hangup::Input::HungUp => return gone(d, &a),
                hangup::Input::Ready => {}
            }
            match event::poll(Duration::ZERO) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(_) => return gone(d, &a),
            }
            let Ok(event) = event::read() else { return gone(d, &a) };
            let Event::Key(key) = event else { continue };
            if key.kind != KeyEventKind::Press {
                continue;
            }
            let name = match key.code {
                KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => "q".to_string(),
                KeyCode::Char(c) => c.to_string(),
                KeyCode::Tab => "tab".into(),
                KeyCode::Left => "left".into(),
                KeyCode::Right => "right".into(),
                KeyCode::Esc => "esc".into(),
                _ => String::new(),
            };
            if d.finished.is_some() {
                return Ok(d); // any key leaves a finished run
            }
            let action = d.key(&name);
            match (action, &a.controls) {
                (Action::Quit, None) => return Ok(d),
                (Action::Quit, Some(c)) => {
                    if c.stop.swap(true, Ordering::SeqCst) {
                        return Ok(d); // a second q: leave the dashboard; training stops after its step
                    }
                    asked_to_stop = true;
                    d.log("stopping after this step with a checkpoint (q again to leave the dashboard)");
                }
                (Action::Checkpoint, Some(c)) => {
                    c.checkpoint.store(true, Ordering::SeqCst);
                    d.log("checkpoint requested: written after this step");
                }
                (Action::TogglePause, Some(c)) => c.pause.store(d.paused, Ordering::SeqCst),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::state::{Action, Dashboard, View, MAX_POINTS};
    use ember_train::observe::metrics::{EvalRecord, Record, TrainRecord};
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn record(step: u64) -> TrainRecord {
        TrainRecord {
            step,
            loss: 2.5 - step as f64 * 1e-3,
            perplexity: (2.5f64 - step as f64 * 1e-3).exp(),
            lr: 6e-4,
            grad_norm: 0.75,
            tokens_per_sec: 8615.0,
            data_wait_frac: 0.0,
            sync_s: 0.0027,
            allreduce_bytes: 3_216_980,
            allreduce: "tree".into(),
            allreduce_calls: step,
            forward_backward_s: 0.1472,
            forward_s: 0.0491,
            backward_s: 0.0981,
            optimizer_s: 0.0026,
            data_s: 0.0001,
            step_sync_s: 0.0024,
            eval_s: 0.0,
            checkpoint_s: 0.0,
            mfu: Some(0.123),
            rss_bytes: Some(82_100_000),
            device_in_use_bytes: Some(1_234_500_000),
            device_reserved_bytes: Some(2_000_000_000),
            optimizer_state_bytes: 1_000_000,
            replicas_agree: Some(true),
            param_hash: Some("76ad5c07ece646ee".into()),
            skipped_steps: 0,
            spikes: 0,
            loss_scale: None,
            overflow_steps: 0,
            tokens: step * 1536,
            elapsed_s: step as f64 * 0.18,
        }
    }

    /// The screen as text, one line per row.
    fn screen(d: &Dashboard) -> String {
        let mut terminal = Terminal::new(TestBackend::new(140, 45)).unwrap();
        terminal.draw(|f| super::view::draw(f, d)).unwrap();
        let buffer = terminal.backend().buffer().clone();
        let width = buffer.area.width as usize;
        buffer
            .content
            .chunks(width)
            .map(|row| row.iter().map(|c| c.symbol()).collect::<String>())
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn board() -> Dashboard {
        let mut d = Dashboard::new("runs/x".into(), "gpt2 · 804224 params".into(), 300, 2, None);
        for step in (10..=60).step_by(10) {
            d.push(Record::Train(record(step)));
        }
        d.push(Record::Eval(EvalRecord::new(50, 2.4144, 9.0)));
        d.log("step     60 | loss 2.4400");
        d
    }

    #[test]
    fn every_panel_and_its_numbers_are_drawn() {
        let text = screen(&board());
        for needle in [
            "ember · runs/x",
            "step 60/300 (20.0%)",
            "loss (nats/token): train, val vs step",
            "2.4400 (ppl 11.47)",
            "val loss    2.4144 @ step 50",
            "tokens/s    8615",
            "steps/s     5.61",
            "MFU         12.3%",
            "fwd 49.1 ms",
            "bwd 98.1 ms",
            "sync 2.4 ms",
            "optim 2.6 ms",
            "compute-bound",
            "RSS now    82.1 MB",
            "AdamW      1.0 MB on rank 0",
            "device     1234.5 MB (2000.0 rsv)",
            "2 @ step 60",
            "parameters agree",
            "76ad5c07ece646ee",
            "step     60 | loss 2.4400",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        // ETA: 240 steps at 8615/1536 = 5.61 steps/s = 42.8 s.
        assert!(text.contains("ETA 42.8s"), "{text}");
    }

    /// fp16-mixed records carry the loss scale; other precisions show no such row.
    #[test]
    fn the_loss_scale_is_shown_for_fp16_mixed_only() {
        let mut d = board();
        assert!(!screen(&d).contains("loss scale"));
        let mut r = record(70);
        (r.loss_scale, r.overflow_steps) = (Some(16384.0), 2);
        d.push(Record::Train(r));
        let text = screen(&d);
        assert!(text.contains("loss scale  16384 (2 overflows)"), "{text}");
    }

    #[test]
    fn the_time_split_shows_forward_and_backward_apart_and_reads_older_records_whole() {
        let mut d = board();
        let phases = d.phases();
        let names: Vec<&str> = phases.iter().map(|p| p.0).collect();
        assert_eq!(names, ["data", "fwd", "bwd", "sync", "optim", "eval", "ckpt"]);
        // Compute is forward and backward together: 60 ms of data wait is less than
        // 49.1 + 98.1 ms, though more than either.
        let mut r = record(70);
        r.data_s = 0.06;
        d.push(Record::Train(r.clone()));
        assert_eq!(d.bound(), Some("compute"));
        r.data_s = 0.15;
        d.push(Record::Train(r.clone()));
        assert_eq!(d.bound(), Some("data"));
        // A record written before the split: one fwd+bwd phase.
        (r.data_s, r.forward_s, r.backward_s) = (0.0001, 0.0, 0.0);
        d.push(Record::Train(r));
        let text = screen(&d);
        assert!(text.contains("fwd+bwd 147.2 ms") && !text.contains("■ fwd 0.0 ms"), "{text}");
        assert_eq!(d.bound(), Some("compute"));
    }

    #[test]
    fn keys_switch_views_toggle_pause_and_help_and_ask_for_actions() {
        let mut d = board();
        d.controls_training = true;
        assert_eq!(d.key("tab"), Action::None);
        assert_eq!(d.view, View::LearningRate);
        assert!(screen(&d).contains("learning rate vs step"));
        d.key("right");
        d.key("left");
        assert_eq!(d.view, View::LearningRate);
        d.key("t");
        assert!(screen(&d).contains("learning rate vs tokens"));
        assert_eq!(d.key("p"), Action::TogglePause);
        assert!(d.paused && screen(&d).contains("PAUSED"));
        assert_eq!(d.key("?"), Action::None);
        assert!(screen(&d).contains("write a checkpoint now"));
        d.key("esc");
        assert!(!screen(&d).contains("write a checkpoint now"));
        assert_eq!(d.key("s"), Action::Checkpoint);
        assert_eq!(d.key("q"), Action::Quit);
        // Watching (no training attached): p does nothing.
        let mut w = board();
        assert_eq!(w.key("p"), Action::None);
        assert!(!w.paused);
        w.key("?");
        let help = screen(&w);
        assert!(
            help.contains("leave (the run is not affected)") && !help.contains("write a checkpoint now"),
            "{help}"
        );
        // The train/val legend belongs to the loss chart only.
        assert!(screen(&board()).contains("│val  │"));
        w.key("esc");
        w.key("tab");
        assert!(!screen(&w).contains("│val  │"));
    }

    #[test]
    fn histories_stay_bounded_and_keep_the_ends() {
        let mut d = Dashboard::new("r".into(), String::new(), 100_000, 1, None);
        for step in 1..=10_000 {
            d.push(Record::Train(record(step)));
        }
        assert!(d.loss.points.len() <= MAX_POINTS, "{}", d.loss.points.len());
        assert!(d.loss.points.len() >= MAX_POINTS / 2);
        assert_eq!(d.loss.points[0].0, 1.0);
        assert!(d.loss.points.last().unwrap().0 > 9_900.0);
    }

    #[test]
    fn the_metrics_tail_reads_complete_lines_only_and_follows_a_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let line = |step| serde_json::to_string(&Record::Train(record(step))).unwrap();
        std::fs::write(&path, format!("{}\n{}", line(1), &line(2)[..20])).unwrap();
        let mut tail = super::MetricsTail::new(dir.path());
        assert_eq!(tail.poll().len(), 1, "the half-written line waits");
        std::fs::write(&path, format!("{}\n{}\n{}\n", line(1), line(2), line(3))).unwrap();
        let steps: Vec<u64> = tail.poll().iter().map(Record::step).collect();
        assert_eq!(steps, [2, 3]);
        std::fs::write(&path, format!("{}\n", line(1))).unwrap(); // truncated by a resume
        assert_eq!(tail.poll().iter().map(Record::step).collect::<Vec<_>>(), [1]);
    }
}
