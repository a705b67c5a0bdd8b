//! A run's initial weights from its seed, the same on every backend. They are drawn on the
//! CPU, by burn-flex's generator (the one flex runs have always used), and copied to the
//! device — as nanoGPT builds its model on the CPU and moves it with `.to(device)`. So a run on
//! wgpu or CUDA starts from exactly the weights the same run on flex starts from, and their
//! losses can be compared step by step (each backend's own generator draws other numbers).

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::Backend;
use ember_model::LanguageModel;

use crate::config::RunConfig;
use crate::error::TrainError;

/// The model of `config` with its seeded initial weights on `device`; also seeds `device`'s own
/// generator with `config.seed`.
///
/// Errors: a model configuration the model rejects (naming its `model.` key).
pub fn seeded_model<B: Backend>(
    config: &RunConfig,
    device: &B::Device,
) -> Result<LanguageModel<B>, TrainError> {
    B::seed(device, config.seed);
    let init = |device: &B::Device| {
        config.model.init::<B>(device).map_err(|e| config.origin.at(&format!("model.{}", e.field), e.message))
    };
    let on_flex = |t| t == std::any::TypeId::of::<Flex>() || t == std::any::TypeId::of::<Autodiff<Flex>>();
    if on_flex(std::any::TypeId::of::<B>()) {
        return Ok(init(device)?);
    }
    let host = Default::default();
    Flex::seed(&host, config.seed);
    let cpu: LanguageModel<Flex> =
        config.model.init(&host).map_err(|e| config.origin.at(&format!("model.{}", e.field), e.message))?;
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let copy = |e: burn::record::RecorderError| {
        TrainError::Backend(format!("copying the initial weights to the device: {e}"))
    };
    let bytes = recorder.record(cpu.into_record(), ()).map_err(copy)?;
    Ok(init(device)?.load_record(recorder.load(bytes, device).map_err(copy)?))
}
