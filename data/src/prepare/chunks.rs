//! Reading the corpus in chunks of pieces and tokenizing each chunk in parallel (rayon),
//! in order. Chunk and piece sizes bound memory; they never change the output.

use rayon::prelude::*;

use crate::inputs::reader::{Piece, Reader};
use crate::{DataError, Tokenizer};

/// Minimum size of a piece when a document may be cut at line ends: small enough that a
/// single large document (Tiny Shakespeare: 1.1 MB) still spreads over the threads.
pub(crate) const PIECE_BYTES: usize = 64 << 10;

/// The tokens of one piece.
pub(crate) struct Encoded {
    /// Token ids of the piece's text (no EOS).
    pub ids: Vec<u32>,
    /// `None`: the document goes on in the next piece. `Some(p)`: the document ends here (an
    /// EOS follows) with `p` leading prompt tokens (0 for pretraining documents).
    pub end: Option<u32>,
}

/// Reads pieces until they hold at least `chunk_bytes` bytes of text, or the corpus ends.
/// An empty result means the corpus is exhausted.
pub(crate) fn next_chunk(reader: &mut Reader<'_>, chunk_bytes: usize) -> Result<Vec<Piece>, DataError> {
    let mut chunk = Vec::new();
    let mut bytes = 0;
    while bytes < chunk_bytes {
        match reader.next_piece()? {
            Some(p) => {
                bytes += p.len();
                chunk.push(p);
            }
            None => break,
        }
    }
    Ok(chunk)
}

/// Tokenizes a chunk on the current rayon pool; the result is in the chunk's order whatever
/// the number of threads.
///
/// Errors: the first tokenizer error in chunk order.
pub(crate) fn encode_chunk(tokenizer: &Tokenizer, chunk: &[Piece]) -> Result<Vec<Encoded>, DataError> {
    chunk
        .par_iter()
        .map(|piece| match piece {
            Piece::Text { text, last } => {
                Ok(Encoded { ids: tokenizer.encode(text)?, end: last.then_some(0) })
            }
            Piece::Sft { prompt, response } => {
                let (ids, n) = tokenizer.encode_prompt_response(prompt, response)?;
                let n = u32::try_from(n).map_err(|_| DataError::InvalidBatch {
                    reason: format!("an SFT prompt of {n} tokens does not fit prompts.bin's u32"),
                })?;
                Ok(Encoded { ids, end: Some(n) })
            }
        })
        .collect()
}

/// Number of Unicode scalar values (bits of the char set).
const CHAR_SPACE: usize = 0x11_0000;

/// The distinct chars of a chunk, as a bitset over code points (`CHAR_SPACE` bits), collected
/// in parallel.
pub(crate) fn chunk_chars(chunk: &[Piece]) -> Vec<u64> {
    let empty = || vec![0u64; CHAR_SPACE / 64];
    let mark = |mut bits: Vec<u64>, text: &str| {
        for c in text.chars() {
            let c = c as usize;
            bits[c / 64] |= 1 << (c % 64);
        }
        bits
    };
    chunk
        .par_iter()
        .fold(empty, |bits, piece| match piece {
            Piece::Text { text, .. } => mark(bits, text),
            Piece::Sft { prompt, response } => mark(mark(bits, prompt), response),
        })
        .reduce(empty, |mut a, b| {
            a.iter_mut().zip(b).for_each(|(x, y)| *x |= y);
            a
        })
}

/// The chars of a bitset, sorted.
pub(crate) fn chars_of(bits: &[u64]) -> Vec<char> {
    let mut chars = Vec::new();
    for (i, &word) in bits.iter().enumerate() {
        let mut w = word;
        while w != 0 {
            let b = w.trailing_zeros() as usize;
            // Only real chars were marked, so the code point is valid.
            chars.extend(char::from_u32((i * 64 + b) as u32));
            w &= w - 1;
        }
    }
    chars
}
