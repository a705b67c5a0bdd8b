//! ZeRO-1 (`[parallel] shard_optimizer = true`) with several burn-flex replicas in one process:
//! the same run as replicated AdamW state and as one rank with the global batch, each rank
//! holding only its shard of the moments, and checkpoints that hold the whole state and resume
//! at any world size, sharded or not.

mod common;

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::Optimizer;
use burn::tensor::Tensor;
use common::*;
use ember_data::{prepare, PrepareOptions, SftFields, TokenizerKind};
use ember_model::LanguageModel;
use ember_train::observe::metrics::TrainRecord;
use ember_train::persist::checkpoint::{load_optimizer, step_name};
use ember_train::step::optim::AdamWGroups;
use ember_train::step::shard::Partition;
use ember_train::tools::trained::{Source, Trained};
use ember_train::{train, RunConfig, RunOptions};

/// SFT pairs with prompts of 2 to 6 characters, prepared at character level: only the responses
/// are scored, so the ranks' micro-batches score uneven numbers of tokens.
fn prepared_sft(dir: &Path) -> PathBuf {
    let lines: String = (0..120)
        .map(|i| {
            let prompt = "w".repeat(1 + i % 5);
            format!("{{\"prompt\": \"{prompt}?\", \"response\": \"ok {}.\"}}\n", i * 7 % 13)
        })
        .collect();
    let input = dir.join("sft.jsonl");
    std::fs::write(&input, lines).unwrap();
    let out = dir.join("sft");
    let mut options = PrepareOptions::new(TokenizerKind::Char, vec![input], out.clone());
    options.input.sft = Some(SftFields::default());
    options.progress = false;
    prepare(&options).unwrap();
    out
}

/// `tiny_config` on `data` without dropout or evaluation, logging and checking the replicas
/// every step, plus `extra`.
fn config(data: &Path, extra: &[&str]) -> RunConfig {
    let base = ["model.dropout=0.0", "eval_every=0", "log_every=1", "parallel.check_every=1"];
    tiny_config(data, &[&base[..], extra].concat())
}

fn run(config: RunConfig, run_dir: &Path) {
    train::<B>(RunOptions::new(config, run_dir), Vec::new(), &mut |_| {}).unwrap();
}

fn resume(config: RunConfig, run_dir: &Path) {
    train::<B>(RunOptions::new(config, run_dir).resuming(), Vec::new(), &mut |_| {}).unwrap();
}

/// Every parameter's AdamW state in checkpoint `step` of `run_dir`, in module order: (step
/// count, bits of m, bits of v); `None` for a parameter without state.
type State = Vec<Option<(usize, Vec<u32>, Vec<u32>)>>;

fn optimizer_state(run_dir: &Path, step: u64) -> State {
    let dir = run_dir.join("checkpoints").join(step_name(step));
    let device = Default::default();
    let config = Trained::open(Source::Run(run_dir.into())).unwrap().config;
    let model = config.model.init::<B>(&device).unwrap();
    let model = ember_train::persist::checkpoint::load_model(&dir, model, &device).unwrap();
    let optimizer = load_optimizer(&dir, AdamWGroups::new(&config.optimizer, &model), &device).unwrap();
    let (decay, no_decay) = optimizer.to_record();
    struct Collect<'a> {
        records: [&'a ember_train::step::optim::AdamWRecord<LanguageModel<B>, B>; 2],
        out: State,
    }
    impl ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let bits = |t: Tensor<Inner, D>| -> Vec<u32> {
                t.into_data().to_vec::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
            };
            let state = self.records.iter().find_map(|r| r.get(&param.id)).cloned().map(|s| {
                let s = s.into_state::<D>().momentum;
                (s.time, bits(s.moment_1), bits(s.moment_2))
            });
            self.out.push(state);
        }
    }
    let mut collect = Collect { records: [&decay, &no_decay], out: Vec::new() };
    model.visit(&mut collect);
    collect.out
}

type Inner = <B as burn::tensor::backend::AutodiffBackend>::InnerBackend;

/// Losses, gradient norms and final parameters of two runs agree within `tolerance`.
fn assert_same(a: &Path, b: &Path, steps: std::ops::RangeInclusive<u64>, tolerance: f64, what: &str) {
    let (ra, rb) = (train_records(a), train_records(b));
    let pick = |r: &[TrainRecord]| -> Vec<(u64, f64, f64)> {
        r.iter().filter(|r| steps.contains(&r.step)).map(|r| (r.step, r.loss, r.grad_norm)).collect()
    };
    let (pa, pb) = (pick(&ra), pick(&rb));
    assert_eq!(pa.len(), steps.clone().count(), "{what}: every step logged");
    for ((step, la, ga), (_, lb, gb)) in pa.iter().zip(&pb) {
        assert!((la - lb).abs() <= tolerance, "{what}: step {step}: loss {la} vs {lb}");
        assert!((ga - gb).abs() <= tolerance * gb.max(1.0), "{what}: step {step}: grad norm {ga} vs {gb}");
    }
    let (wa, wb) = (flat_params(&latest_model::<B>(a)), flat_params(&latest_model::<B>(b)));
    let diff = wa.iter().zip(&wb).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    assert!(f64::from(diff) <= tolerance, "{what}: final parameters differ by {diff}");
}

/// 20 steps on 2 ranks with uneven SFT masks and 2 accumulation steps: sharded equals
/// replicated (the same numbers: every rank's update is the same arithmetic, the gather
/// exact) and one rank with the global batch; every rank holds only its shard of the moments
/// (as the partition says), the checkpoints hold the whole state, and the exchange carries
/// twice the bytes.
#[test]
fn sharded_state_trains_as_replicated_state_and_as_one_rank() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_sft(dir.path());
    let steps = ["max_steps=20", "checkpoint_every=10", "micro_batch_size=2"];
    let two =
        |extra: &[&str]| config(&data, &[&steps[..], &["devices=2", "accumulation_steps=2"], extra].concat());
    let (sharded, replicated, single) =
        (dir.path().join("sharded"), dir.path().join("replicated"), dir.path().join("single"));
    run(two(&["parallel.shard_optimizer=true"]), &sharded);
    run(two(&[]), &replicated);
    run(config(&data, &[&steps[..], &["accumulation_steps=4"]].concat()), &single);

    assert_same(&sharded, &replicated, 1..=20, 1e-6, "sharded vs replicated");
    assert_same(&sharded, &single, 1..=20, 1e-5, "sharded vs 1 rank");
    let (s, r) = (train_records(&sharded), train_records(&replicated));
    for (a, b) in s.iter().zip(&r) {
        assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "step {}: bit for bit", a.step);
        assert_eq!(a.replicas_agree, Some(true), "step {}: the sharded replicas agree", a.step);
    }
    let model = latest_model::<B>(&sharded);
    let params = model.num_params();
    let partition = Partition::of(&model, 2);
    assert_eq!(partition.elements.iter().sum::<usize>(), params);
    assert!(partition.elements[0] < params, "rank 0 owns a part: {:?}", partition.elements);
    assert_eq!(s[19].optimizer_state_bytes, 8 * partition.elements[0] as u64, "rank 0 holds its shard");
    assert_eq!(r[19].optimizer_state_bytes, 8 * params as u64, "unsharded: 8 B/param");
    assert_eq!(s[19].allreduce_bytes, 2 * r[19].allreduce_bytes, "the gather doubles the traffic");
    let calls: Vec<u64> = s.iter().take(3).map(|r| r.allreduce_calls).collect();
    assert_eq!(calls, [2, 4, 6], "an exchange and a gather per step");

    // The checkpoints hold every parameter's state, bit for bit those of replicated AdamW.
    for step in [10, 20] {
        let (a, b) = (optimizer_state(&sharded, step), optimizer_state(&replicated, step));
        assert!(
            a.iter().all(|s| s.as_ref().is_some_and(|s| s.0 == step as usize)),
            "step {step}: every state"
        );
        assert!(a == b, "step {step}: the gathered state equals the replicated one");
    }
}

/// A sharded checkpoint resumes exactly on 2 sharded ranks; 1 rank continues from it exactly
/// as from a replicated checkpoint of the same run; and 2 sharded ranks continue from a
/// 1-rank checkpoint exactly as 2 replicated ranks do.
#[test]
fn sharded_checkpoints_resume_exactly_at_any_world_size() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_sft(dir.path());
    let at = |name: &str| dir.path().join(name);
    let cfg =
        |extra: &[&str]| config(&data, &[&["checkpoint_every=5", "micro_batch_size=2"][..], extra].concat());
    let sharded = ["devices=2", "parallel.shard_optimizer=true"];

    // 2 sharded ranks: straight to 10, and 5 + 5.
    run(cfg(&[&sharded[..], &["max_steps=10"]].concat()), &at("straight"));
    run(cfg(&[&sharded[..], &["max_steps=5"]].concat()), &at("resumed"));
    resume(cfg(&[&sharded[..], &["max_steps=10"]].concat()), &at("resumed"));
    assert_same(&at("straight"), &at("resumed"), 1..=10, 0.0, "2 sharded ranks resumed");

    // 1 rank continues a sharded and a replicated 2-rank checkpoint alike.
    run(cfg(&[&sharded[..], &["max_steps=5"]].concat()), &at("from-sharded"));
    run(cfg(&["devices=2", "max_steps=5"]), &at("from-replicated"));
    for name in ["from-sharded", "from-replicated"] {
        resume(cfg(&["devices=1", "max_steps=9"]), &at(name));
    }
    assert_same(&at("from-sharded"), &at("from-replicated"), 1..=9, 0.0, "1 rank after 2");

    // 2 sharded ranks continue a 1-rank checkpoint as 2 replicated ranks do.
    run(cfg(&["max_steps=5"]), &at("one-sharded"));
    run(cfg(&["max_steps=5"]), &at("one-replicated"));
    resume(cfg(&[&sharded[..], &["max_steps=9"]].concat()), &at("one-sharded"));
    resume(cfg(&["devices=2", "max_steps=9"]), &at("one-replicated"));
    assert_same(&at("one-sharded"), &at("one-replicated"), 1..=9, 0.0, "2 sharded ranks after 1");
    assert!(optimizer_state(&at("one-sharded"), 9) == optimizer_state(&at("one-replicated"), 9));
}
