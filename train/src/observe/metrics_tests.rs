//! Tests of `metrics.jsonl`: records, whole-line appends, torn lines, byte-exact resume.

use super::*;

fn train(step: u64) -> Record {
    Record::Train(TrainRecord {
        step,
        loss: 2.0,
        perplexity: 2f64.exp(),
        lr: 1e-3,
        grad_norm: 0.5,
        tokens_per_sec: 1000.0,
        data_wait_frac: 0.001,
        sync_s: 0.0,
        allreduce_bytes: 0,
        allreduce: "none (1 rank)".into(),
        replicas_agree: None,
        param_hash: None,
        skipped_steps: 0,
        spikes: 0,
        loss_scale: None,
        overflow_steps: 0,
        allreduce_calls: 0,
        forward_backward_s: 0.0,
        forward_s: 0.0,
        backward_s: 0.0,
        optimizer_s: 0.0,
        data_s: 0.0,
        step_sync_s: 0.0,
        eval_s: 0.0,
        checkpoint_s: 0.0,
        mfu: None,
        rss_bytes: None,
        device_in_use_bytes: None,
        device_reserved_bytes: None,
        optimizer_state_bytes: 0,
        tokens: step * 10,
        elapsed_s: step as f64,
    })
}

#[test]
fn records_have_the_stable_field_names() {
    let json = serde_json::to_value(train(3)).unwrap();
    for key in ["step", "loss", "lr", "grad_norm", "tokens_per_sec"] {
        assert!(json.get(key).is_some(), "missing {key} in {json}");
    }
    assert_eq!(json["kind"], "train");
    let eval =
        Record::Eval(EvalRecord { step: 4, val_loss: 1.5, val_perplexity: 1.5f64.exp(), elapsed_s: 1.0 });
    let json = serde_json::to_value(eval).unwrap();
    assert_eq!(
        (json["kind"].as_str(), json["step"].as_u64(), json["val_loss"].as_f64()),
        (Some("eval"), Some(4), Some(1.5))
    );
}

#[test]
fn truncate_after_keeps_earlier_records_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let mut log = MetricsLog::open(&path).unwrap();
    for step in 1..=5 {
        log.write(&train(step)).unwrap();
    }
    truncate_after(&path, 3, &mut |_| {}).unwrap();
    let steps: Vec<u64> = read_records(&path).unwrap().iter().map(Record::step).collect();
    assert_eq!(steps, vec![1, 2, 3]);
}

fn eval_line(step: u64, val_loss: &str) -> String {
    format!(
        "{{\"kind\":\"eval\",\"step\":{step},\"val_loss\":{val_loss},\"val_perplexity\":52.0,\"elapsed_s\":1.0}}\n"
    )
}

#[test]
fn a_record_is_written_with_its_newline_in_one_write() {
    /// Records each `write` call's bytes.
    #[derive(Default)]
    struct Calls(Vec<Vec<u8>>);
    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut out = Calls::default();
    append_line(&mut out, &train(7)).unwrap();
    let sizes: Vec<usize> = out.0.iter().map(Vec::len).collect();
    assert_eq!(sizes.len(), 1, "one write per record, newline included; the writes' sizes: {sizes:?}");
    assert!(out.0[0].starts_with(b"{\"kind\":\"train\",\"step\":7,") && out.0[0].ends_with(b"}\n"));
}

#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_names_the_file_and_the_cause() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        eprintln!("skipping: no /dev/full");
        return;
    }
    let mut log = MetricsLog::open(full).unwrap();
    let err = log.write(&train(1)).unwrap_err().to_string();
    assert!(err.starts_with("/dev/full: ") && err.contains("No space left on device"), "{err}");
}

#[test]
fn resuming_keeps_the_bytes_of_earlier_records_and_drops_later_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    // Written by hand: serde_json without float_roundtrip reads 3.9582571983337402 one ULP off
    // and writes 3.95825719833374 back.
    let kept = eval_line(0, "3.9582571983337402") + &eval_line(2, "2.0000000000000004");
    std::fs::write(&path, kept.clone() + &eval_line(4, "1.5") + &eval_line(6, "1.25")).unwrap();
    let mut warnings = Vec::new();
    truncate_after(&path, 3, &mut |w| warnings.push(w.to_string())).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), kept, "byte-identical prefix");
    assert!(warnings.is_empty(), "{warnings:?}");
    // Nothing to drop: the file is left alone.
    truncate_after(&path, 3, &mut |_| {}).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), kept);
}

#[test]
fn a_torn_last_line_is_dropped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let whole = eval_line(0, "4.2") + &eval_line(1, "3.9582571983337402");
    std::fs::write(&path, whole.clone() + "{\"kind\":\"eval\",\"step\":2,\"val_lo").unwrap();
    assert_eq!(read_records(&path).unwrap().len(), 2, "readers skip the torn line");
    let mut warnings = Vec::new();
    truncate_after(&path, 5, &mut |w| warnings.push(w.to_string())).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), whole);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let want = format!("{}: line 3: dropped a torn last line", path.display());
    assert!(warnings[0].starts_with(&want), "{}", warnings[0]);
    // A whole last record without its newline is kept, and gets one.
    std::fs::write(&path, whole.trim_end()).unwrap();
    truncate_after(&path, 5, &mut |_| {}).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), whole);
}

#[test]
fn only_records_or_nothing_count_as_an_ember_metrics_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let whole = eval_line(0, "4.2") + &eval_line(1, "3.9");
    for (text, strict, torn_allowed) in [
        (String::new(), true, true),
        ("\n  \n".to_string(), true, true),
        (whole.clone(), true, true),
        (whole.clone() + "{\"kind\":\"eval\",\"st", false, true),
        // A whole line of someone else's (it has its newline): not a torn write of Ember's.
        (whole.clone() + "my note\n", false, false),
        (whole.clone() + "my note", false, true),
        (whole.clone() + "my note\n" + &eval_line(2, "3.8"), false, false),
        ("user content\n".to_string(), false, false),
    ] {
        std::fs::write(&path, &text).unwrap();
        assert_eq!(holds_only_records(&path, false), strict, "{text:?}");
        assert_eq!(holds_only_records(&path, true), torn_allowed, "{text:?}");
    }
    assert!(!holds_only_records(&dir.path().join("missing.jsonl"), true));
}

#[test]
fn a_bad_line_before_the_last_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let text = eval_line(0, "4.2") + "{\"kind\":\"ev\n" + &eval_line(1, "3.0");
    std::fs::write(&path, &text).unwrap();
    let err = truncate_after(&path, 5, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("metrics.jsonl: line 2: not a metrics record"), "{err}");
    assert!(read_records(&path).unwrap_err().to_string().contains("line 2: not a metrics record"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "left as it was");
}

#[test]
fn a_diverged_evaluation_reads_back_as_nan_in_the_middle_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let mut log = MetricsLog::open(&path).unwrap();
    log.write(&Record::Eval(EvalRecord::new(10, f64::NAN, 1.0))).unwrap();
    log.write(&train(11)).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with(r#"{"kind":"eval","step":10,"val_loss":null,"val_perplexity":null,"#), "{text}");
    let records = read_records(&path).unwrap();
    match &records[0] {
        Record::Eval(e) => assert!(e.val_loss.is_nan() && e.val_perplexity.is_nan()),
        other => panic!("{other:?}"),
    }
    assert_eq!(records.len(), 2);
}

#[test]
fn forward_and_backward_times_round_trip_and_older_records_read_as_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let Record::Train(mut record) = train(5) else { unreachable!() };
    (record.forward_backward_s, record.forward_s, record.backward_s) = (0.1472, 0.0491, 0.0981);
    let mut log = MetricsLog::open(&path).unwrap();
    log.write(&Record::Train(record.clone())).unwrap();
    let line = std::fs::read_to_string(&path).unwrap();
    assert!(
        line.contains(r#""forward_backward_s":0.1472,"forward_s":0.0491,"backward_s":0.0981,"#),
        "{line}"
    );
    // A record of an earlier version: no forward_s/backward_s (nor most other optional keys).
    let old = r#"{"kind":"train","step":6,"loss":2.0,"perplexity":7.38905609893065,"lr":0.001,"grad_norm":0.5,"tokens_per_sec":1000.0,"forward_backward_s":0.25,"tokens":60,"elapsed_s":6.0}"#;
    std::fs::write(&path, format!("{line}{old}\n")).unwrap();
    let records = read_records(&path).unwrap();
    assert_eq!(records[0], Record::Train(record));
    match &records[1] {
        Record::Train(r) => assert_eq!((r.forward_backward_s, r.forward_s, r.backward_s), (0.25, 0.0, 0.0)),
        other => panic!("{other:?}"),
    }
}

/// A diverged training step (loss 55697: its perplexity overflows; a NaN gradient norm) is
/// written with `null`s and reads back, so a run the sentinel stopped can be resumed.
#[test]
fn a_diverged_training_record_reads_back_so_the_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let Record::Train(mut record) = train(3) else { unreachable!() };
    (record.loss, record.perplexity, record.grad_norm) = (55697.0, 55697f64.exp(), f64::NAN);
    let mut log = MetricsLog::open(&path).unwrap();
    log.write(&Record::Train(record)).unwrap();
    log.write(&train(4)).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(r#""loss":55697.0,"perplexity":null,"#) && text.contains(r#""grad_norm":null"#),
        "{text}"
    );
    let records = read_records(&path).unwrap();
    match &records[0] {
        Record::Train(r) => {
            assert_eq!(r.loss, 55697.0);
            assert!(r.perplexity.is_nan() && r.grad_norm.is_nan());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(records.len(), 2);
}
