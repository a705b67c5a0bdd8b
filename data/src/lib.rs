//! # ember-data
//!
//! Tokenize a corpus once into flat token files, then sample deterministic windows of
//! `L + 1` tokens from them.
//!
//! * [`prepare()`] reads UTF-8 text files, tokenizes them ([`Tokenizer`]: fitted chars or GPT-2
//!   BPE), appends EOS after every document and writes `train.bin`, `val.bin` (flat
//!   little-endian u16/u32) and `meta.json` ([`Meta`]) to a directory.
//! * [`PreparedData::open`] memory-maps them ([`TokenStream`]) after checking sizes against meta.
//! * [`WindowSampler`] draws a [`Batch`] whose window offsets are a pure function of
//!   `(seed, split, step, micro_step, rank)`; [`shift_window`] is the only place where inputs and
//!   next-token targets are derived from a window.
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
pub mod download;
pub mod error;
pub mod meta;
pub mod prepare;
pub mod prepared;
pub mod sampler;
pub mod stream;
pub mod tokenizer;

pub use batch::{shift_window, Batch, IGNORE_INDEX};
pub use download::{download_tinyshakespeare, TINYSHAKESPEARE_SHA256, TINYSHAKESPEARE_URL};
pub use error::DataError;
pub use meta::{Meta, SourceInfo, TokenDtype, FORMAT_VERSION, META_FILE, TRAIN_FILE, VAL_FILE};
pub use prepare::{prepare, PrepareOptions, PrepareSummary};
pub use prepared::{PreparedData, Split};
pub use sampler::{splitmix64, WindowSampler};
pub use stream::TokenStream;
pub use tokenizer::{Tokenizer, TokenizerKind, TokenizerSpec, EOS_TEXT, GPT2_EOS_ID, GPT2_VOCAB_SIZE};
