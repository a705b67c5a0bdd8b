//! # ember-data
//!
//! Tokenize a corpus once into a prepared directory, then read it as packed windows or SFT
//! rows, sampled by epoch so that training resumes exactly.
//!
//! ## Prepared directory, format 2
//!
//! | file | contents |
//! | --- | --- |
//! | `tokens-00000.bin`, `tokens-00001.bin`, … | ONE token stream of the whole corpus, in order, cut into shards of at most `shard_tokens` tokens; flat little-endian `u16` if `vocab_size ≤ 65536`, else `u32`; no header |
//! | `documents.bin` | `u64` LE per document: its cumulative END offset in the stream (tokens, exclusive), its EOS included |
//! | `prompts.bin` | SFT only: `u32` LE per example, its number of leading prompt tokens |
//! | `tokenizer.json` | the Hugging Face tokenizer, when the tokenizer is `hf` |
//! | `meta.json` | [`Meta`]: `format_version` 2, `kind` (`pretrain`/`sft`), `tokenizer` ([`TokenizerSpec`]), `vocab_size`, `eos_id`, `dtype`, `total_tokens`, `documents`, `shards` (`file`, `tokens`, `sha256`), `train_tokens`, `val_fraction`, checksums of the index files, `sources` (`path`, `bytes`, `sha256`), `lossy_replacements`, `empty_documents` |
//!
//! Every document is followed by the EOS id (#EOS = #documents; Σ tokens = Σ document
//! lengths + #documents). Splits are ranges of the stream: train = `[0, train_tokens)`, val =
//! `[train_tokens, total_tokens)`, with `train_tokens = floor(total · (1 − val_fraction))`,
//! rounded down to a document end for SFT (examples are never cut).
//! [`PreparedData::open`] verifies every file's size and SHA-256 and refuses format 1.
//!
//! ## Pieces
//!
//! * [`prepare()`] streams inputs ([`resolve_inputs`]: files, directories, globs; `.txt` and
//!   `.jsonl`; [`InputOptions`]), tokenizes chunks in parallel (rayon) and writes the
//!   directory; the output does not depend on the thread count. [`train_bpe`] trains a
//!   byte-level BPE `tokenizer.json`.
//! * [`Tokenizer`]: char, byte, gpt2 / cl100k / o200k (tiktoken-rs, offline), any Hugging Face
//!   `tokenizer.json`.
//! * [`TokenStream`]: a memory-mapped range of the stream, across shards.
//! * [`DataView`]: the rows of a split — packed windows of L+1 tokens (pretraining) or one
//!   masked SFT example per row — as [`Batch`]es, optionally with document-masking segments;
//!   it implements Burn's `Dataset`. [`shift_window`] is the only place where inputs and
//!   next-token targets are derived from a window.
//! * [`EpochSampler`] + [`SamplerState`]: per-epoch permutations from `(seed, epoch)`, disjoint
//!   per rank, resumable exactly. [`Prefetcher`] builds batches on a background thread.
//! * [`download_tinyshakespeare`] fetches the classic corpus, checksum-verified.
//!
//! ```
//! use ember_data::{shift_window, Tokenizer};
//!
//! let tok = Tokenizer::fit_char(["hello"]); // e=0 h=1 l=2 o=3, EOS=4
//! assert_eq!(tok.encode("hole").unwrap(), vec![1, 3, 2, 0]);
//! assert_eq!(shift_window(&[5, 6, 7, 8]), (vec![5, 6, 7], vec![6, 7, 8]));
//! ```
#![warn(missing_docs)]

mod atomic;
pub mod batch;
pub mod bpe;
mod dataset;
mod digest;
pub mod download;
pub mod error;
pub mod inputs;
pub mod meta;
pub mod prefetch;
pub mod prepare;
pub mod prepared;
pub mod sampler;
pub mod stream;
pub mod tokenizer;
pub mod view;

pub use atomic::write_atomic;
pub use batch::{shift_window, Batch, Row, IGNORE_INDEX};
pub use bpe::{train_bpe, BpeTrainOptions, BpeTrainSummary};
pub use digest::{sha256_file, sha256_hex};
pub use download::{download_tinyshakespeare, TINYSHAKESPEARE_SHA256, TINYSHAKESPEARE_URL};
pub use error::DataError;
pub use inputs::{resolve_inputs, InputFormat, InputOptions, SftFields};
pub use meta::{
    shard_file_name, DataKind, Meta, ShardInfo, SourceInfo, TokenDtype, DOCUMENTS_FILE, FORMAT_VERSION,
    META_FILE, PROMPTS_FILE,
};
pub use prefetch::{step_producer, BatchSource, Prefetcher, StepData};
pub use prepare::{
    check_output_dir, prepare, PrepareOptions, PrepareSummary, DEFAULT_CHUNK_BYTES, DEFAULT_SHARD_TOKENS,
};
pub use prepared::{PreparedData, Split};
pub use sampler::{splitmix64, Dropped, EpochSampler, SamplerState};
pub use stream::TokenStream;
pub use tokenizer::{
    Tokenizer, TokenizerKind, TokenizerSpec, EOS_TEXT, GPT2_EOS_ID, GPT2_VOCAB_SIZE, HF_EOS_CANDIDATES,
    HF_TOKENIZER_FILE,
};
pub use view::DataView;
