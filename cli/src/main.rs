//! `ember`: prepare data, train, evaluate and sample GPT models on Burn.
//!
//! The binary parses arguments and prints; the work lives in `ember-data` and `ember-train`.

/// `println!` that does not panic when stdout is closed: it ends the program quietly
/// (`ember sample | head`), or stops a training run with a checkpoint (see `output`).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::print_line(format_args!($($arg)*))
    };
}

/// `eprintln!` that drops the line when stderr is closed instead of panicking.
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::output::print_err(format_args!($($arg)*))
    };
}

mod bench;
mod dashboard;
mod estimate;
mod export;
mod output;
mod plot;
mod prepare;
mod tokenizer;
mod train;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ember_train::observe::words::count;
use ember_train::tools::sample::SampleOptions;
use ember_train::tools::trained::Source;
use ember_train::BackendKind;
pub(crate) use output::print_line;

#[derive(Parser)]
#[command(name = "ember", version, about = "Train GPT models from the terminal on Burn")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tokenize a corpus once into token shards, a document index and meta.json in DIR.
    Prepare(prepare::PrepareArgs),
    /// Train a tokenizer on a corpus (`ember tokenizer train`).
    Tokenizer(tokenizer::TokenizerArgs),
    /// Train a model from a TOML config, or resume a run.
    Train(train::TrainArgs),
    /// Evaluate a run's latest checkpoint (or a config's init_from weights) on the train and validation splits.
    Eval {
        #[command(flatten)]
        source: SourceArgs,
        /// Batches per split (default: the run's eval_batches).
        #[arg(long, allow_negative_numbers = true)]
        batches: Option<usize>,
        /// Override the run's backend.
        #[arg(long, value_parser = parse_backend)]
        backend: Option<BackendKind>,
    },
    /// Replay one optimizer step of a run from the checkpoint before it, deterministically, and
    /// show its loss and gradient norm per micro-batch with the rows' text (bad data or bad
    /// numerics?).
    Replay {
        /// The run directory.
        #[arg(long = "run", value_name = "RUN_DIR")]
        run: PathBuf,
        /// The optimizer step to replay (e.g. an event's step in metrics.jsonl).
        #[arg(long, value_name = "S")]
        step: u64,
        /// Override the run's backend.
        #[arg(long, value_parser = parse_backend)]
        backend: Option<BackendKind>,
    },
    /// Generate text from a run's latest checkpoint (or a config's init_from weights).
    Sample {
        #[command(flatten)]
        source: SourceArgs,
        /// Text to continue (empty: start from the end-of-text token).
        #[arg(long, default_value = "")]
        prompt: String,
        /// Tokens to generate.
        #[arg(long, default_value_t = 500, allow_negative_numbers = true)]
        max_new_tokens: usize,
        /// Softmax temperature, ≥ 0 (0 = greedy).
        #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
        temperature: f64,
        /// Sample among the K most likely tokens only (0 = all).
        #[arg(long, default_value_t = 200, allow_negative_numbers = true)]
        top_k: usize,
        /// Seed of the sampler.
        #[arg(long, default_value_t = 1337, allow_negative_numbers = true)]
        seed: u64,
        /// Recompute the whole context for every token instead of using the KV cache.
        #[arg(long)]
        no_cache: bool,
        /// Override the run's backend.
        #[arg(long, value_parser = parse_backend)]
        backend: Option<BackendKind>,
    },
    /// Write a run's latest weights as Hugging Face safetensors + config.json in DIR.
    Export(export::ExportArgs),
    /// The dashboard of a run in progress or finished (plain lines when not in a terminal).
    Watch(watch::WatchArgs),
    /// PNG charts of a run: loss, learning rate, gradient norm, throughput, time per step.
    Plot(plot::PlotArgs),
    /// Memory and FLOP accounting of a config: parameters, bytes, activations, FLOPs, time per step.
    Estimate(estimate::EstimateArgs),
    /// Optimizer steps on random tokens: tokens/s, time per phase, MFU, peak memory.
    Bench(bench::BenchArgs),
    /// Run burn-collective's global orchestrators for `ember train --nodes M` (when node 0
    /// does not start them itself: `parallel.start_coordinator = false`).
    Coordinator {
        /// Listen on PORT and PORT + 1. burn-collective 0.21 always listens on all
        /// interfaces (0.0.0.0), without authentication: use a private network.
        #[arg(long, value_name = "[HOST:]PORT", default_value = "29500")]
        bind: String,
        /// Exit when the parent process does (how `ember train` runs it for node 0).
        #[arg(long, hide = true)]
        exit_with_parent: bool,
    },
    /// Check numerical parity with a PyTorch fixture (init weights, batch, expected numbers).
    Verify {
        /// Directory with init.safetensors, batch.json and expected.json (and optionally
        /// init_grads.safetensors: PyTorch's gradient of every parameter, compared tensor by
        /// tensor).
        #[arg(long, value_name = "DIR")]
        fixture: PathBuf,
        /// The backend to run on: flex (CPU), cuda or wgpu (a build with `--features ember/cuda` or
        /// `--features ember/wgpu`).
        #[arg(long, value_parser = parse_backend, default_value = "flex")]
        backend: BackendKind,
        /// What Ember computes in: fp32, or bf16-mixed (bfloat16 matmuls; looser tolerances).
        #[arg(long, value_parser = ["fp32", "bf16-mixed"], default_value = "fp32")]
        precision: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Where `eval` and `sample` take the weights from.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct SourceArgs {
    /// A run directory (its latest checkpoint).
    #[arg(long = "run", value_name = "RUN_DIR")]
    run: Option<PathBuf>,
    /// A run config whose `init_from` names Hugging Face weights.
    #[arg(long = "config", value_name = "FILE.toml")]
    config: Option<PathBuf>,
}

impl SourceArgs {
    fn source(self) -> Source {
        match (self.run, self.config) {
            (Some(run), _) => Source::Run(run),
            (None, Some(config)) => Source::Config(config),
            (None, None) => unreachable!("clap requires --run or --config"),
        }
    }
}

pub(crate) fn parse_backend(s: &str) -> Result<BackendKind, String> {
    match s {
        "flex" => Ok(BackendKind::Flex),
        "cuda" => Ok(BackendKind::Cuda),
        "wgpu" => Ok(BackendKind::Wgpu),
        other => Err(format!("expected flex, cuda or wgpu, got {other:?}")),
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Prepare(args) => prepare::run(args),
        Command::Tokenizer(args) => tokenizer::run(args),
        Command::Train(args) => train::run(args),
        Command::Eval { source, batches, backend } => {
            if batches == Some(0) {
                anyhow::bail!("--batches 0: expected at least 1 batch per split");
            }
            let report = ember_train::tools::commands::eval_run(source.source(), batches, backend)?;
            let batches = |n: usize| count(n, "batch");
            let over = if report.train_batches == report.val_batches {
                format!("{} each", batches(report.val_batches))
            } else {
                format!("{} train and {} val batches", report.train_batches, report.val_batches)
            };
            for (split, used) in [("train", report.train_batches), ("val", report.val_batches)] {
                if used < report.batches {
                    err!(
                        "note: the {split} split has {}, fewer than the {} asked for: all of them were evaluated, each once",
                        batches(used),
                        report.batches
                    );
                }
            }
            out!(
                "step {}: train loss {:.4} (ppl {:.2}), val loss {:.4} (ppl {:.2}) over {over}, {}",
                report.step,
                report.train_loss,
                report.train_loss.exp(),
                report.val_loss,
                report.val_loss.exp(),
                report.precision.name()
            );
            Ok(())
        }
        Command::Replay { run, step, backend } => {
            let report =
                ember_train::tools::replay::replay_run(&run, step, backend, &mut |line| err!("{line}"))?;
            out!("{}", report.to_string().trim_end());
            Ok(())
        }
        Command::Sample { source, prompt, max_new_tokens, temperature, top_k, seed, no_cache, backend } => {
            if !(temperature.is_finite() && temperature >= 0.0) {
                anyhow::bail!("--temperature {temperature}: expected a number ≥ 0 (0 = greedy), e.g. 0.8");
            }
            let options = SampleOptions {
                prompt,
                max_new_tokens,
                temperature,
                top_k: (top_k > 0).then_some(top_k),
                seed,
                use_cache: !no_cache,
            };
            out!("{}", ember_train::tools::commands::sample_run(source.source(), &options, backend)?);
            Ok(())
        }
        Command::Export(args) => export::run(args),
        Command::Watch(args) => watch::run(args),
        Command::Plot(args) => plot::run(args),
        Command::Estimate(args) => estimate::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Coordinator { bind, exit_with_parent } => {
            #[cfg(unix)]
            if exit_with_parent {
                let parent = std::os::unix::process::parent_id();
                std::thread::spawn(move || loop {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    if std::os::unix::process::parent_id() != parent {
                        std::process::exit(0);
                    }
                });
            }
            // burn-collective listens on all interfaces whatever the host: only the port counts.
            let address = if bind.contains(':') { bind.clone() } else { format!("0.0.0.0:{bind}") };
            let port = address
                .parse::<ember_train::config::HostPort>()
                .map_err(|_| anyhow::anyhow!("--bind {bind:?}: expected [HOST:]PORT (PORT from 1 to 65533)"))?
                .port;
            out!(
                "coordinator: burn-collective orchestrators on 0.0.0.0:{port} and 0.0.0.0:{} (all interfaces, no authentication: private networks only); Ctrl-C stops",
                port + 1
            );
            let server = ember_train::parallel::serve_coordinator(port)?;
            let _ = server.join();
            Ok(())
        }
        Command::Verify { fixture, backend, precision, json } => {
            let precision = if precision == "bf16-mixed" {
                ember_train::PrecisionKind::Bf16Mixed
            } else {
                ember_train::PrecisionKind::Fp32
            };
            let report = ember_train::tools::verify::verify_on(backend, &fixture, precision)?;
            if json {
                out!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                out!("device: {}", ember_train::observe::device::describe_device(backend, 0));
                out!("{report}");
            }
            if !report.ok {
                let failed = report.checks.iter().filter(|c| !c.ok).count();
                anyhow::bail!("{failed} of {} checks beyond tolerance", report.checks.len());
            }
            Ok(())
        }
    }
}

/// glibc serves blocks above its mmap threshold (128 KiB, adapting up to 32 MiB) with fresh
/// mappings and unmaps them when freed, so every training step's large activations and
/// gradients land on fresh pages: a page fault and the kernel zeroing each 4 KiB (~10% of a
/// 50k-vocab model's step, whose logits alone are 200 MB). Serving every block from the heap
/// (`M_MMAP_MAX = 0`) and never trimming it keeps freed buffers for the next step, as PyTorch's
/// CPU caching allocator does. The heap then stays at the step's peak until exit, which is the
/// same peak the step needs anyway. One arena (`M_ARENA_MAX = 1`): blocks freed on rayon's
/// worker threads otherwise empty those threads' own 64 MiB arenas, which glibc unmaps and
/// maps again on the next step (11,000 page faults per step on the 6/6/384 benchmark config,
/// 200 with one arena). Not glibc: nothing to do.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn main() -> ExitCode {
    // Over the file-size limit (`ulimit -f`), a write then fails with EFBIG ("File too large")
    // and is reported with its path, instead of SIGXFSZ killing the process silently in the
    // middle of a checkpoint.
    #[cfg(unix)]
    // SAFETY: sets one signal's disposition to "ignore", before any other thread exists.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    keep_freed_memory();
    // A single-rank training loop runs on a rayon worker thread: give those the main thread's
    // stack size.
    ember_train::step::worker::build_pool();
    // burn-collective logs every connection at INFO level once a subscriber is installed (it
    // installs one itself unless one exists): warnings and errors only, on stderr.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    quiet_collective_panics();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            err!("error: {}", message(&e));
            ExitCode::FAILURE
        }
    }
}

/// burn-collective 0.21 panics on its own threads when a peer disconnects; Ember turns that
/// into an error naming the rank, so those panics are not printed (any other panic is).
fn quiet_collective_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let file = info.location().map(|l| l.file()).unwrap_or_default();
        if !(file.contains("burn-collective-") || file.contains("burn-communication-")) {
            default(info);
        }
    }));
}

/// The error and its causes, each cause once: Ember's errors already name their cause in
/// their message, which a plain `{:#}` would print twice.
fn message(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}
