use super::*;
use crate::inputs::SftFields;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// All pieces of `files`, and the reader's stats.
fn read_all(
    files: &[PathBuf],
    opts: &InputOptions,
    split: Option<usize>,
) -> Result<(Vec<Piece>, ReadStats), DataError> {
    let mut r = Reader::new(files, opts, split);
    let mut out = Vec::new();
    while let Some(p) = r.next_piece()? {
        out.push(p);
    }
    Ok((out, r.stats))
}

fn doc(text: &str) -> Piece {
    Piece::Text { text: text.into(), last: true }
}

#[test]
fn txt_file_is_a_document_and_empty_files_are_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.txt", b"one\ntwo\n");
    let e = write(tmp.path(), "e.txt", b"");
    let (pieces, stats) = read_all(&[a.clone(), e, a], &InputOptions::default(), None).unwrap();
    assert_eq!(pieces, vec![doc("one\ntwo\n"), doc("one\ntwo\n")]);
    assert_eq!((stats.empty_documents, stats.bytes), (1, 16));
}

#[test]
fn separator_lines_split_documents() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.txt", b"SEP\nfirst\nline\nSEP\r\nSEP\nsecond\nSEP\n");
    let opts = InputOptions { doc_separator: Some("SEP".into()), ..Default::default() };
    let (pieces, stats) = read_all(&[a], &opts, None).unwrap();
    assert_eq!(pieces, vec![doc("first\nline\n"), doc("second\n")]);
    // The empty piece before the first SEP and the one between "SEP\r\n" and "SEP"; the empty
    // tail after the last separator is not counted.
    assert_eq!(stats.empty_documents, 2);
}

#[test]
fn jsonl_text_field_blank_lines_and_sources() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(
        tmp.path(),
        "a.jsonl",
        b"{\"text\":\"x\\ny\",\"id\":1}\n\n   \n{\"text\":\"\"}\n{\"body\":\"z\",\"text\":\"w\"}",
    );
    let defaults = InputOptions::default();
    let mut r = Reader::new(std::slice::from_ref(&a), &defaults, None);
    let mut pieces = Vec::new();
    while let Some(p) = r.next_piece().unwrap() {
        pieces.push(p);
    }
    assert_eq!(pieces, vec![doc("x\ny"), doc("w")]);
    assert_eq!(r.stats.empty_documents, 1);
    assert_eq!(r.sources.len(), 1);
    assert_eq!(r.sources[0].bytes, std::fs::metadata(&a).unwrap().len());
    let opts = InputOptions { text_field: "body".into(), ..Default::default() };
    let err = read_all(std::slice::from_ref(&a), &opts, None).unwrap_err();
    assert!(matches!(err, DataError::BadLine { line: 1, .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("{}:1:", a.display())) && msg.contains("missing field \"body\""), "{msg}");
}

#[test]
fn jsonl_errors_name_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.jsonl", b"{\"text\":\"ok\"}\n{\"text\": 3}\n");
    let msg = read_all(std::slice::from_ref(&a), &InputOptions::default(), None).unwrap_err().to_string();
    assert!(
        msg.contains(&format!("{}:2:", a.display())) && msg.contains("must be a string, found a number"),
        "{msg}"
    );
    let b = write(tmp.path(), "b.jsonl", b"{\"text\":\"ok\"}\n\n{not json}\n");
    let msg = read_all(std::slice::from_ref(&b), &InputOptions::default(), None).unwrap_err().to_string();
    assert!(msg.contains(&format!("{}:3: not valid JSON", b.display())), "{msg}");
    let c = write(tmp.path(), "c.jsonl", b"[1, 2]\n");
    let msg = read_all(&[c], &InputOptions::default(), None).unwrap_err().to_string();
    assert!(msg.contains(":1: expected a JSON object"), "{msg}");
}

#[test]
fn invalid_utf8_is_an_error_with_line_and_offset_or_replaced_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    // Line 2 starts at byte 3; the bad byte is at offset 5.
    let a = write(tmp.path(), "a.txt", b"ok\nab\xffc\xfe\xfd\n");
    let err = read_all(std::slice::from_ref(&a), &InputOptions::default(), None).unwrap_err();
    assert!(matches!(err, DataError::InvalidUtf8 { line: 2, offset: 5, .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&a.display().to_string()) && msg.contains("offset 5") && msg.contains("--lossy"),
        "{msg}"
    );
    let opts = InputOptions { lossy: true, ..Default::default() };
    let (pieces, stats) = read_all(&[a], &opts, None).unwrap();
    // Three invalid bytes, each its own maximal invalid sequence: three U+FFFD.
    assert_eq!(pieces, vec![doc("ok\nab\u{FFFD}c\u{FFFD}\u{FFFD}\n")]);
    assert_eq!(stats.lossy_replacements, 3);
}

#[test]
fn documents_are_cut_at_safe_line_ends_only() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.txt", b"aa\nbb \ncc\n dd\nee\nff");
    let (pieces, _) = read_all(&[a], &InputOptions::default(), Some(2)).unwrap();
    let part = |t: &str| Piece::Text { text: t.into(), last: false };
    // Not before "cc" (trailing space before it), not before " dd" (leading space).
    assert_eq!(pieces, vec![part("aa\n"), part("bb \ncc\n dd\n"), part("ee\n"), doc("ff")]);
}

#[test]
fn sft_reads_jsonl_only() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.jsonl", b"{\"prompt\":\"Q\",\"response\":\"A\"}\n");
    let opts = InputOptions { sft: Some(SftFields::default()), ..Default::default() };
    let (pieces, _) = read_all(&[a], &opts, None).unwrap();
    assert_eq!(pieces, vec![Piece::Sft { prompt: "Q".into(), response: "A".into() }]);
    let t = write(tmp.path(), "t.txt", b"text");
    let msg = read_all(&[t], &opts, None).unwrap_err().to_string();
    assert!(msg.contains("t.txt") && msg.contains(".jsonl"), "{msg}");
}

#[test]
fn unreadable_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("gone.txt");
    let msg =
        read_all(std::slice::from_ref(&missing), &InputOptions::default(), None).unwrap_err().to_string();
    assert!(msg.contains(&missing.display().to_string()), "{msg}");
}
