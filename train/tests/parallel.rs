//! Data parallelism on burn-collective, with several burn-flex replicas in one process: the
//! same updates as one rank with the whole global batch, one all-reduce per optimizer step,
//! the exact global token mean with uneven masks, and replica hashes that catch a broken rank.

mod common;

use std::path::Path;

use burn::tensor::backend::Backend;
use common::*;
use ember_model::LanguageModel;
use ember_train::observe::metrics::TrainRecord;
use ember_train::parallel::{join, Faults, Group};
use ember_train::step::scalar;
use ember_train::step::{forward_backward, global_gradients, StepSettings};
use ember_train::{train, RunConfig, RunOptions, TrainError};

/// Trains `config` in `run_dir` with `train` (one replica per `devices` of the config).
fn run(config: RunConfig, run_dir: &Path) -> Result<(), TrainError> {
    run_with(RunOptions::new(config, run_dir))
}

/// Trains as `options` say (one replica per `devices` of the config).
fn run_with(options: RunOptions) -> Result<(), TrainError> {
    train::<B>(options, Vec::new(), &mut |_| {}).map(|_| ())
}

/// Every parameter of the run's latest checkpoint, flattened in module order.
fn final_params(run_dir: &Path) -> Vec<f32> {
    flat_params(&latest_model::<burn::backend::Flex>(run_dir))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Runs `parallel` and `single` (same data, same global batch) for 5 steps and checks that
/// their losses and final parameters agree within 1e-5; returns the parallel run's records and
/// the model's parameter count.
fn assert_same_run(parallel: &[&str], single: &[&str]) -> (Vec<TrainRecord>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let base = ["max_steps=5", "model.dropout=0.0", "eval_every=0", "log_every=1", "parallel.check_every=1"];
    let config = |extra: &[&str]| tiny_config(&data, &[&base[..], extra].concat());
    run(config(parallel), &dir.path().join("parallel")).unwrap();
    run(config(single), &dir.path().join("single")).unwrap();
    let (p, s) = (train_records(&dir.path().join("parallel")), train_records(&dir.path().join("single")));
    assert_eq!(p.len(), 5);
    for (a, b) in p.iter().zip(&s) {
        assert_eq!(a.step, b.step);
        assert!(
            (a.loss - b.loss).abs() <= 1e-5,
            "step {}: loss {} (2 ranks) vs {} (1 rank)",
            a.step,
            a.loss,
            b.loss
        );
        assert!((a.grad_norm - b.grad_norm).abs() <= 1e-5 * b.grad_norm.max(1.0), "step {}", a.step);
        assert_eq!(a.replicas_agree, Some(true), "step {}: the replicas agree", a.step);
    }
    let single_params = final_params(&dir.path().join("single"));
    let diff = max_diff(&final_params(&dir.path().join("parallel")), &single_params);
    assert!(diff <= 1e-5, "final parameters differ by {diff}");
    (p, single_params.len())
}

#[test]
fn two_ranks_equal_one_rank_with_twice_the_micro_batch() {
    let _g = serial();
    let (p, params) = assert_same_run(&["devices=2", "micro_batch_size=4"], &["micro_batch_size=8"]);
    assert_eq!(p[0].allreduce, "tree");
    // [flattened gradients | 23 slots of sums (Σ NLL, 2 token limbs, stop, checkpoint, failed,
    // 17 of hash)] in f32.
    assert_eq!(p[0].allreduce_bytes, 4 * (params + 23) as u64);
}

#[test]
fn two_ranks_with_accumulation_equal_one_rank_with_more_accumulation_and_one_all_reduce_per_step() {
    let _g = serial();
    let (p, _) = assert_same_run(
        &["devices=2", "micro_batch_size=2", "accumulation_steps=2", "parallel.strategy=\"centralized\""],
        &["micro_batch_size=2", "accumulation_steps=4"],
    );
    // Two micro-steps per optimizer step on each rank, one all-reduce.
    let calls: Vec<u64> = p.iter().map(|r| r.allreduce_calls).collect();
    assert_eq!(calls, [1, 2, 3, 4, 5]);
    assert_eq!(p[0].allreduce, "centralized");
}

#[test]
fn uneven_scored_tokens_give_the_global_token_mean() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut config = tiny_config(&prepared_corpus(dir.path()), &["devices=2", "model.dropout=0.0"]);
    config.resolve_vocab(Some(40)).unwrap();
    let device = Default::default();
    <B as Backend>::seed(&device, 5);
    let model: LanguageModel<B> = config.model.init(&device).unwrap();
    // Rank 0 scores 3 targets, rank 1 scores 7: the mean is over all 10.
    let rank0 = batch(&[(&[1, 2, 3, 4, 5, 6, 7, 8], &[X, X, X, X, X, 7, 8, 9])]);
    let rank1 = batch(&[(&[9, 8, 7, 6, 5, 4, 3, 2], &[8, 7, 6, 5, 4, 3, 2, X])]);
    let (single_grads, single_loss, tokens) =
        forward_backward(&model, &[rank0.clone(), rank1.clone()], 1, &device).unwrap();
    assert_eq!(tokens, 10);
    let single = flat_grads(&model, &single_grads);
    let single_loss = scalar(single_loss);

    let group = Group::new(&config, 2);
    let settings = StepSettings::new(1, 0.0, 0.0);
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = [rank0, rank1]
            .into_iter()
            .enumerate()
            .map(|(rank, batch)| {
                let (config, group, model) = (&config, group.clone(), model.clone());
                scope.spawn(move || {
                    let mut sync = join::<B>(config, rank, &Default::default(), group).unwrap();
                    let global =
                        global_gradients(&model, &[batch], &settings, &mut sync, &Default::default())
                            .unwrap();
                    (flat_grads(&model, &global.grads), scalar(global.loss), global.scored_tokens)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    burn::collective::reset_collective::<<B as burn::tensor::backend::AutodiffBackend>::InnerBackend>();
    for (rank, (grads, loss, scored)) in results.iter().enumerate() {
        assert_eq!(*scored, 10, "rank {rank} normalizes by the global count");
        assert!((loss - single_loss).abs() <= 1e-6, "rank {rank}: loss {loss} vs {single_loss}");
        let diff = max_abs_diff(grads, &single);
        assert!(diff <= 1e-6, "rank {rank}: gradients differ by {diff}");
    }
    // The per-rank means (3 and 7 tokens) would give another loss: the test can fail.
    assert_eq!(results[0].0, results[1].0, "both ranks hold the same reduced gradient");
}

#[test]
fn replica_hashes_agree_every_step_and_a_broken_rank_is_caught() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let common = ["devices=2", "max_steps=21", "eval_every=0", "checkpoint_every=0", "model.dropout=0.0"];
    let with = |extra: &[&str]| tiny_config(&data, &[&common[..], extra].concat());
    // Every step compares the hashes of the parameters the previous step left: 21 steps
    // check the replicas after steps 0..=20.
    run(with(&["log_every=1", "parallel.check_every=1"]), &dir.path().join("ok")).unwrap();
    let ok = train_records(&dir.path().join("ok"));
    assert_eq!(ok.len(), 21);
    for r in &ok {
        assert_eq!(r.replicas_agree, Some(true), "step {}", r.step);
        assert_eq!(r.param_hash.as_ref().map(String::len), Some(16), "step {}", r.step);
    }
    let hashes: std::collections::HashSet<_> = ok.iter().map(|r| r.param_hash.clone()).collect();
    assert_eq!(hashes.len(), 21, "every step changes the parameters");

    // Rank 1 uses its own gradient at step 7 (as if it skipped that all-reduce): the default
    // check, at logged steps (every 5), stops the run before step 10.
    let mut options = RunOptions::new(with(&["log_every=5"]), dir.path().join("broken"));
    options.faults = Faults { skip_all_reduce: Some((1, 7)), ..Faults::default() };
    let broken = run_with(options);
    let err = broken.unwrap_err().to_string();
    assert!(err.contains("differed before step 10"), "{err}");
    let logged: Vec<u64> = train_records(&dir.path().join("broken")).iter().map(|r| r.step).collect();
    assert_eq!(logged, [5], "nothing is logged after the divergence");
}

#[test]
fn a_failing_rank_stops_the_others_with_an_error_naming_it() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    // Rank 1 fails at step 3 (an injected fault); rank 0 must stop too, naming it, not hang.
    let config = tiny_config(&data, &["devices=2", "max_steps=6", "eval_every=0", "parallel.timeout_s=20"]);
    let mut options = RunOptions::new(config, dir.path().join("run"));
    options.faults = Faults { fail: Some((1, 3)), ..Faults::default() };
    let result = run_with(options);
    let err = result.unwrap_err().to_string();
    assert!(err.contains("rank 1"), "{err}");
}

#[test]
fn any_rank_count_resumes_a_checkpoint() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    run(tiny_config(&data, &["devices=2", "max_steps=3", "eval_every=0"]), &run_dir).unwrap();
    let more = tiny_config(&data, &["max_steps=5", "eval_every=0"]);
    let options = RunOptions::new(more, &run_dir).resuming();
    let mut lines = Vec::new();
    let summary = train::<B>(options, Vec::new(), &mut |l| lines.push(l.to_string())).unwrap();
    assert_eq!(summary.steps, 5);
    assert!(lines.iter().any(|l| l.contains("written by 2 ranks, this run has 1")), "{lines:?}");
    let steps: Vec<u64> = train_records(&run_dir).iter().map(|r| r.step).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5]);
}

#[test]
fn two_ranks_recomputing_blocks_equal_one_rank_keeping_every_activation() {
    let _g = serial();
    assert_same_run(
        &["devices=2", "micro_batch_size=2", "accumulation_steps=2", "activation_checkpointing=\"blocks\""],
        &["micro_batch_size=2", "accumulation_steps=4"],
    );
}

/// With dropout on, two in-process replicas (sharing burn-flex's one random stream) draw the
/// same masks with and without checkpointing, micro-batch by micro-batch, with packed
/// documents masked.
#[test]
fn checkpointing_composes_with_dropout_accumulation_and_document_masking_on_two_ranks() {
    let _g = serial();
    let common = [
        "devices=2",
        "micro_batch_size=2",
        "accumulation_steps=2",
        "model.dropout=0.2",
        "document_masking=true",
    ];
    assert_same_run(&[&common[..], &["activation_checkpointing=\"blocks\""]].concat(), &common);
}
