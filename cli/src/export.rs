//! `ember export`.

use std::path::PathBuf;

use clap::Args;
use ember_train::tools::export::{export_run, ExportFormat};

/// Arguments of `ember export`.
#[derive(Args)]
pub struct ExportArgs {
    /// The run directory.
    #[arg(long = "run", value_name = "RUN_DIR")]
    run: PathBuf,
    /// hf-gpt2 (GPT2LMHeadModel) or hf-llama (LlamaForCausalLM).
    #[arg(long)]
    format: ExportFormat,
    /// Output directory: writes DIR/model.safetensors and DIR/config.json, the Hugging Face
    /// layout `from_pretrained(DIR)` loads (a FILE.safetensors writes that file with
    /// config.json beside it).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Overwrite model.safetensors and config.json if they exist.
    #[arg(long)]
    force: bool,
}

/// Runs `ember export`.
pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    for path in export_run(&args.run, args.format, &args.out, args.force)? {
        out!("wrote {}", path.display());
    }
    Ok(())
}
