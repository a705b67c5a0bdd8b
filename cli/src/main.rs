//! `ember`: prepare data, train, evaluate and sample GPT models on Burn.
//!
//! The binary parses arguments and prints; the work lives in `ember-data` and `ember-train`.

mod prepare;
mod train;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ember_train::sample::SampleOptions;
use ember_train::BackendKind;

#[derive(Parser)]
#[command(
    name = "ember",
    version,
    about = "Train GPT models from the terminal on Burn"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tokenize text once into DIR/train.bin, DIR/val.bin and DIR/meta.json.
    Prepare(prepare::PrepareArgs),
    /// Train a model from a TOML config, or resume a run.
    Train(train::TrainArgs),
    /// Evaluate a run's latest checkpoint on its train and validation splits.
    Eval {
        /// The run directory.
        #[arg(long = "run", value_name = "RUN_DIR")]
        run: PathBuf,
        /// Batches per split (default: the run's eval_batches).
        #[arg(long)]
        batches: Option<usize>,
        /// Override the run's backend.
        #[arg(long, value_parser = parse_backend)]
        backend: Option<BackendKind>,
    },
    /// Generate text from a run's latest checkpoint.
    Sample {
        /// The run directory.
        #[arg(long = "run", value_name = "RUN_DIR")]
        run: PathBuf,
        /// Text to continue (empty: start from the end-of-text token).
        #[arg(long, default_value = "")]
        prompt: String,
        /// Tokens to generate.
        #[arg(long, default_value_t = 500)]
        max_new_tokens: usize,
        /// Softmax temperature (0 = greedy).
        #[arg(long, default_value_t = 0.8)]
        temperature: f64,
        /// Sample among the K most likely tokens only (0 = all).
        #[arg(long, default_value_t = 200)]
        top_k: usize,
        /// Seed of the sampler.
        #[arg(long, default_value_t = 1337)]
        seed: u64,
        /// Override the run's backend.
        #[arg(long, value_parser = parse_backend)]
        backend: Option<BackendKind>,
    },
}

fn parse_backend(s: &str) -> Result<BackendKind, String> {
    match s {
        "flex" => Ok(BackendKind::Flex),
        "cuda" => Ok(BackendKind::Cuda),
        other => Err(format!("expected flex or cuda, got {other:?}")),
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Prepare(args) => prepare::run(args),
        Command::Train(args) => train::run(args),
        Command::Eval {
            run,
            batches,
            backend,
        } => {
            let report = ember_train::commands::eval_run(&run, batches, backend)?;
            println!(
                "step {}: train loss {:.4} (ppl {:.2}), val loss {:.4} (ppl {:.2}) over {} batches each",
                report.step,
                report.train_loss,
                report.train_loss.exp(),
                report.val_loss,
                report.val_loss.exp(),
                report.batches
            );
            Ok(())
        }
        Command::Sample {
            run,
            prompt,
            max_new_tokens,
            temperature,
            top_k,
            seed,
            backend,
        } => {
            let options = SampleOptions {
                prompt,
                max_new_tokens,
                temperature,
                top_k: (top_k > 0).then_some(top_k),
                seed,
            };
            println!(
                "{}",
                ember_train::commands::sample_run(&run, &options, backend)?
            );
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
