//! Training a byte-level BPE tokenizer on a corpus (Hugging Face tokenizers), saved as a
//! `tokenizer.json` that `prepare` uses with `--tokenizer hf`.

use std::path::PathBuf;
use std::sync::Mutex;

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, NormalizerWrapper, TokenizerBuilder};

use crate::atomic::write_atomic;
use crate::inputs::reader::{Piece, Reader};
use crate::inputs::{resolve_inputs, InputOptions};
use crate::prepare::PIECE_BYTES;
use crate::{DataError, SourceInfo, EOS_TEXT};

/// What to train.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BpeTrainOptions {
    /// Files, directories and globs, as for `prepare`.
    pub inputs: Vec<PathBuf>,
    /// How files become documents (SFT examples contribute prompt + response).
    pub input: InputOptions,
    /// Target vocabulary size: 256 byte tokens + `<|endoftext|>` + merges; at least 257.
    pub vocab_size: usize,
    /// A pair must occur at least this often to be merged (default 2).
    pub min_frequency: u64,
    /// The `tokenizer.json` to write (whole or not at all).
    pub out: PathBuf,
}

/// What [`train_bpe`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct BpeTrainSummary {
    /// The file written.
    pub out: PathBuf,
    /// Vocabulary size reached (≤ the target when the corpus has fewer frequent pairs).
    pub vocab_size: usize,
    /// Id of `<|endoftext|>` (0: special tokens come first).
    pub eos_id: u32,
    /// Input bytes read.
    pub input_bytes: u64,
    /// The input files.
    pub sources: Vec<SourceInfo>,
}

/// Trains a byte-level BPE (GPT-2 style: ByteLevel pre-tokenizer without a prefix space,
/// ByteLevel decoder, the 256 byte symbols as the initial alphabet, special token
/// `<|endoftext|>`) on the documents of `opts.inputs`, streamed, and writes `opts.out`.
///
/// Errors: [`DataError::InvalidOption`] (vocab_size < 257); input errors as for
/// [`crate::prepare()`]; [`DataError::EmptyCorpus`]; [`DataError::HfTokenizer`] if training
/// fails; [`DataError::Io`] writing the file.
pub fn train_bpe(opts: &BpeTrainOptions) -> Result<BpeTrainSummary, DataError> {
    if opts.vocab_size < 257 {
        return Err(DataError::option(
            "vocab_size",
            format!(
                "a byte-level BPE needs at least 257 ids (256 bytes + <|endoftext|>), got {}",
                opts.vocab_size
            ),
        ));
    }
    let files = resolve_inputs(&opts.inputs)?;
    let hf_err = |context: &str| {
        let context = context.to_string();
        move |e: tokenizers::Error| DataError::HfTokenizer { context, reason: e.to_string() }
    };
    let mut tokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None::<NormalizerWrapper>)
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
        .with_post_processor(Some(ByteLevel::default().trim_offsets(false)))
        .with_decoder(Some(ByteLevel::default()))
        .build()
        .map_err(hf_err("cannot be built"))?;
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(opts.vocab_size)
        .min_frequency(opts.min_frequency)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(EOS_TEXT, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();

    // Pieces cut at line ends give the same pre-tokenized words as whole documents (the
    // ByteLevel regex is GPT-2's), and bound memory.
    let mut reader = Reader::new(&files, &opts.input, Some(PIECE_BYTES));
    let failure: Mutex<Option<DataError>> = Mutex::new(None);
    let mut documents = 0u64;
    let texts = std::iter::from_fn(|| match reader.next_piece() {
        Ok(Some(Piece::Text { text, last })) => {
            documents += u64::from(last);
            Some(text)
        }
        Ok(Some(Piece::Sft { prompt, response })) => {
            documents += 1;
            Some(prompt + &response)
        }
        Ok(None) => None,
        Err(e) => {
            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            None
        }
    });
    tokenizer.train(&mut trainer, texts).map_err(hf_err("training failed"))?;
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    if documents == 0 {
        return Err(DataError::EmptyCorpus { inputs: files });
    }
    let json = tokenizer.to_string(true).map_err(hf_err("cannot be serialized"))?;
    // Check that it loads as Ember will load it, before writing.
    let loaded = crate::tokenizer::check_hf_json(json.as_bytes())?;
    write_atomic(&opts.out, json.as_bytes())?;
    Ok(BpeTrainSummary {
        out: opts.out.clone(),
        vocab_size: loaded.vocab_size(),
        eos_id: loaded.eos_id(),
        input_bytes: reader.stats.bytes,
        sources: reader.sources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tokenizer;

    #[test]
    fn trains_saves_and_loads() {
        let tmp = tempfile::tempdir().unwrap();
        let input = tmp.path().join("c.txt");
        std::fs::write(&input, "low lower lowest low low\nnewer newest new\n".repeat(20)).unwrap();
        let out = tmp.path().join("tokenizer.json");
        let opts = BpeTrainOptions {
            inputs: vec![input],
            input: InputOptions::default(),
            vocab_size: 300,
            min_frequency: 2,
            out: out.clone(),
        };
        let s = train_bpe(&opts).unwrap();
        assert_eq!(s.eos_id, 0, "the special token comes first");
        assert!(s.vocab_size > 257 && s.vocab_size <= 300, "{}", s.vocab_size);
        let tok = Tokenizer::from_hf_file(&out, None).unwrap();
        assert_eq!(tok.eos_id(), 0);
        let ids = tok.encode("lowest newer").unwrap();
        assert!(ids.len() < "lowest newer".len(), "merges apply: {ids:?}");
        assert_eq!(tok.decode(&ids).unwrap(), "lowest newer");
        // Special-token text in the corpus is ordinary text, never the EOS id.
        assert!(!tok.encode("a<|endoftext|>b").unwrap().contains(&0));
    }

    #[test]
    fn too_small_vocab_and_empty_corpus() {
        let tmp = tempfile::tempdir().unwrap();
        let input = tmp.path().join("c.txt");
        std::fs::write(&input, "").unwrap();
        let mut opts = BpeTrainOptions {
            inputs: vec![input],
            input: InputOptions::default(),
            vocab_size: 256,
            min_frequency: 2,
            out: tmp.path().join("t.json"),
        };
        assert!(train_bpe(&opts).unwrap_err().to_string().contains("at least 257"));
        opts.vocab_size = 300;
        assert!(matches!(train_bpe(&opts), Err(DataError::EmptyCorpus { .. })));
        assert!(!opts.out.exists());
    }
}
