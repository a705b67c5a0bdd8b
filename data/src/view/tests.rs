use std::path::{Path, PathBuf};

use super::*;
use crate::{prepare, PrepareOptions, SftFields, TokenizerKind};

/// Prepares `files` (name, contents) in `tmp` and opens the result.
fn open(tmp: &Path, files: &[(&str, &str)], o: impl FnOnce(&mut PrepareOptions)) -> Arc<PreparedData> {
    let inputs: Vec<PathBuf> = files
        .iter()
        .map(|(name, text)| {
            let p = tmp.join(name);
            std::fs::write(&p, text).unwrap();
            p
        })
        .collect();
    let out = tmp.join("out");
    let mut opts = PrepareOptions::new(TokenizerKind::Char, inputs, out.clone());
    opts.val_fraction = 0.0;
    opts.progress = false;
    o(&mut opts);
    prepare(&opts).unwrap();
    Arc::new(PreparedData::open(&out).unwrap())
}

#[test]
fn windows_concatenate_back_to_the_stream_across_shard_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let text = "the quick brown fox jumps over the lazy dog";
    let data = open(tmp.path(), &[("a.txt", text), ("b.txt", "pack my box")], |o| o.shard_tokens = 5);
    let n = data.train.len(); // 43 + 1 + 11 + 1 = 56
    assert_eq!(n, 56);
    let stream = data.train.slice(0, n).unwrap();
    for l in [1, 3, 5, 7, 55] {
        let view = DataView::new(data.clone(), Split::Train, l, false).unwrap();
        assert_eq!(view.len(), (n - 1) / l);
        assert_eq!(view.remainder_tokens() as usize, (n - 1) % l);
        let covered = view.len() * l;
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        for k in 0..view.len() {
            let row = view.row(k).unwrap();
            assert_eq!(row.segments, None);
            inputs.extend(row.inputs);
            targets.extend(row.targets.iter().map(|&t| t as u32));
        }
        assert_eq!(inputs, stream[..covered], "L={l}: inputs are the stream");
        assert_eq!(targets, stream[1..covered + 1], "L={l}: targets are the stream shifted by one");
    }
}

#[test]
fn segments_restart_after_each_eos() {
    let tmp = tempfile::tempdir().unwrap();
    // a=0 b=1 c=2 d=3 e=4, EOS=5; stream: a b EOS c EOS d e EOS = 0 1 5 2 5 3 4 5.
    let data = open(tmp.path(), &[("1.txt", "ab"), ("2.txt", "c"), ("3.txt", "de")], |_| {});
    let view = DataView::new(data, Split::Train, 2, true).unwrap();
    assert_eq!((view.len(), view.remainder_tokens()), (3, 1)); // (8 - 1) / 2, (8 - 1) % 2
    let b = view.batch(&[2, 0, 1]).unwrap();
    assert_eq!(b.inputs, vec![5, 3, 0, 1, 5, 2]);
    // Targets are unchanged by masking: the token after an EOS stays scored.
    assert_eq!(b.targets, vec![3, 4, 1, 5, 2, 5]);
    // Window 2 = positions 4, 5: the EOS of "c" (doc 1), then "d" (doc 2) -> 0, 1.
    // Window 0 = a, b -> 0, 0. Window 1 = positions 2, 3: EOS of "ab", then "c" -> 0, 1.
    assert_eq!(b.segments, Some(vec![0, 1, 0, 0, 0, 1]));
    assert_eq!(b.scored_tokens(), 6);
}

/// One SFT example "abcde" → "fgh": chars a..h = ids 0..7, EOS = 8.
fn sft_example(tmp: &Path) -> Arc<PreparedData> {
    open(tmp, &[("sft.jsonl", r#"{"prompt":"abcde","response":"fgh"}"#)], |o| {
        o.input.sft = Some(SftFields::default())
    })
}

#[test]
fn sft_row_scores_the_response_and_its_eos_only() {
    let tmp = tempfile::tempdir().unwrap();
    let view = DataView::new(sft_example(tmp.path()), Split::Train, 10, true).unwrap();
    assert_eq!((view.len(), view.truncated_examples()), (1, 0));
    let b = view.batch(&[0]).unwrap();
    // P1..P5 R1 R2 R3 EOS, then two pads (EOS id 8).
    assert_eq!(b.inputs, vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 8]);
    let x = IGNORE_INDEX;
    assert_eq!(b.targets, vec![x, x, x, x, 5, 6, 7, 8, x, x]);
    assert_eq!(b.scored_tokens(), 4);
    // The position holding P5 (4, 'e') predicts R1 (5, 'f').
    assert_eq!((b.inputs[4], b.targets[4]), (4, 5));
    // The real EOS is scored although the pad id is the EOS id: the mask comes from lengths.
    assert_eq!((b.inputs[7], b.targets[7]), (7, 8));
    assert_eq!(b.segments, Some(vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
}

#[test]
fn sft_rows_are_truncated_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let view = DataView::new(sft_example(tmp.path()), Split::Train, 6, false).unwrap();
    assert_eq!(view.truncated_examples(), 1);
    let b = view.batch(&[0]).unwrap();
    // 9 tokens cut to L + 1 = 7: a..g; targets b..g, scored from position 4 ('f', 'g').
    assert_eq!(b.inputs, vec![0, 1, 2, 3, 4, 5]);
    let x = IGNORE_INDEX;
    assert_eq!(b.targets, vec![x, x, x, x, 5, 6]);
    // A context shorter than the prompt leaves nothing scored in the row.
    let view = DataView::new(view.data().clone(), Split::Train, 3, false).unwrap();
    assert_eq!(view.batch(&[0]).unwrap().scored_tokens(), 0);
}

#[test]
fn sft_mask_with_a_bpe_merge_across_the_boundary() {
    let tmp = tempfile::tempdir().unwrap();
    // A corpus whose only pair is ("b", "c"): with 256 bytes + <|endoftext|> + 1 merge, the
    // trained BPE has exactly one merged token, "bc".
    std::fs::write(tmp.path().join("bc.txt"), "bc\n".repeat(50)).unwrap();
    let tok_file = tmp.path().join("tokenizer.json");
    crate::train_bpe(&crate::BpeTrainOptions {
        inputs: vec![tmp.path().join("bc.txt")],
        input: Default::default(),
        vocab_size: 258,
        min_frequency: 2,
        out: tok_file.clone(),
    })
    .unwrap();
    let data = open(tmp.path(), &[("sft.jsonl", r#"{"prompt":"ab","response":"cd"}"#)], |o| {
        o.tokenizer = TokenizerKind::Hf;
        o.tokenizer_file = Some(tok_file.clone());
        o.input.sft = Some(SftFields::default());
    });
    let tok = data.tokenizer().unwrap();
    let ids = tok.encode("abcd").unwrap();
    assert_eq!(ids.len(), 3, "a | bc | d");
    assert_eq!(tok.decode(&ids[1..2]).unwrap(), "bc");
    // "bc" straddles "ab" | "cd": only "a" is prompt.
    assert_eq!(data.prompt_tokens(0), Some(1));
    let view = DataView::new(data.clone(), Split::Train, 4, false).unwrap();
    let b = view.batch(&[0]).unwrap();
    assert_eq!(b.inputs, vec![ids[0], ids[1], ids[2], 0]);
    // bc, d and the EOS (id 0) are scored; the last position is padding.
    assert_eq!(b.targets, vec![ids[1] as i32, ids[2] as i32, 0, IGNORE_INDEX]);
}

#[test]
fn view_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let data = open(tmp.path(), &[("a.txt", "abc")], |_| {}); // 4 tokens
    assert!(matches!(
        DataView::new(data.clone(), Split::Train, 0, false),
        Err(DataError::InvalidBatch { .. })
    ));
    let err = DataView::new(data.clone(), Split::Train, 4, false).unwrap_err();
    assert!(
        err.to_string().contains("train split holds 4 tokens, but one window needs seq_len + 1 = 5"),
        "{err}"
    );
    assert!(matches!(
        DataView::new(data.clone(), Split::Val, 1, false),
        Err(DataError::StreamTooShort { .. })
    ));
    let view = DataView::new(data, Split::Train, 3, false).unwrap();
    let err = view.batch(&[0, 1]).unwrap_err();
    assert!(err.to_string().contains("row 1 is out of range: the train split has 1 rows"), "{err}");
    assert!(view.batch(&[]).is_err());
}
