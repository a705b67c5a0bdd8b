//! Two numeric metrics burn-train lacks: [`TokensPerSecondMetric`] and [`GradNormMetric`], fed
//! from [`LmStats`].

use std::sync::Arc;

use burn_train::metric::{
    format_float, Adaptor, Metric, MetricAttributes, MetricMetadata, MetricName, Numeric, NumericAttributes,
    NumericEntry, SerializedEntry,
};

use super::model::LmStats;

/// Input of [`TokensPerSecondMetric`].
#[derive(Clone, Copy, Debug)]
pub struct TokensInput {
    /// Tokens processed by the step.
    pub tokens: usize,
    /// Its wall time, seconds.
    pub seconds: f64,
}

impl Adaptor<TokensInput> for LmStats {
    fn adapt(&self) -> TokensInput {
        TokensInput { tokens: self.tokens, seconds: self.seconds }
    }
}

/// Input of [`GradNormMetric`]: the pre-clip global gradient norm.
#[derive(Clone, Copy, Debug)]
pub struct GradNormInput(pub Option<f64>);

impl Adaptor<GradNormInput> for LmStats {
    fn adapt(&self) -> GradNormInput {
        GradNormInput(self.grad_norm)
    }
}

/// Throughput in tokens/s (input positions per second, as nanoGPT counts them). The step value
/// is the step's tokens ÷ its wall time, from fetching its data to reading its loss back; the
/// epoch value is Σ tokens ÷ Σ seconds.
#[derive(Clone, Default)]
pub struct TokensPerSecondMetric {
    current: f64,
    tokens: usize,
    seconds: f64,
}

impl TokensPerSecondMetric {
    /// No steps yet.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Metric for TokensPerSecondMetric {
    type Input = TokensInput;

    fn name(&self) -> MetricName {
        Arc::new("Tokens Per Second".to_string())
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes { unit: Some("tok/s".into()), higher_is_better: true }.into()
    }

    fn update(&mut self, input: &TokensInput, _: &MetricMetadata) -> SerializedEntry {
        self.current = rate(input.tokens, input.seconds);
        self.tokens += input.tokens;
        self.seconds += input.seconds;
        let epoch = rate(self.tokens, self.seconds);
        SerializedEntry::new(
            format!("epoch {} tok/s - batch {} tok/s", format_float(epoch, 0), format_float(self.current, 0)),
            NumericEntry::Aggregated { aggregated_value: self.current, count: 1 }.serialize(),
        )
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

impl Numeric for TokensPerSecondMetric {
    fn value(&self) -> NumericEntry {
        NumericEntry::Value(self.current)
    }

    fn running_value(&self) -> NumericEntry {
        NumericEntry::Value(rate(self.tokens, self.seconds))
    }
}

fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

/// The pre-clip global L2 norm of the gradient (PyTorch `clip_grad_norm_`'s return value):
/// the step value, and its mean over the epoch's steps.
#[derive(Clone, Default)]
pub struct GradNormMetric {
    current: f64,
    sum: f64,
    steps: usize,
}

impl GradNormMetric {
    /// No steps yet.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Metric for GradNormMetric {
    type Input = GradNormInput;

    fn name(&self) -> MetricName {
        Arc::new("Grad Norm".to_string())
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes { unit: None, higher_is_better: false }.into()
    }

    fn update(&mut self, input: &GradNormInput, _: &MetricMetadata) -> SerializedEntry {
        if let Some(norm) = input.0 {
            self.current = norm;
            self.sum += norm;
            self.steps += 1;
        }
        let mean = self.sum / self.steps.max(1) as f64;
        SerializedEntry::new(
            format!("epoch {} - batch {}", format_float(mean, 3), format_float(self.current, 3)),
            NumericEntry::Aggregated { aggregated_value: self.current, count: 1 }.serialize(),
        )
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

impl Numeric for GradNormMetric {
    fn value(&self) -> NumericEntry {
        NumericEntry::Value(self.current)
    }

    fn running_value(&self) -> NumericEntry {
        NumericEntry::Value(self.sum / self.steps.max(1) as f64)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use burn::data::dataloader::Progress;
    use burn::tensor::Tensor;
    use burn_train::metric::ItemLazy;
    use ember_data::Batch;

    use super::super::model::LmOutput;
    use super::*;

    fn metadata() -> MetricMetadata {
        let progress = Progress { items_processed: 1, items_total: 1 };
        MetricMetadata { progress: progress.clone(), global_progress: progress, iteration: Some(1), lr: None }
    }

    #[test]
    fn tokens_per_second_is_the_steps_rate_and_the_epochs_total_rate() {
        let mut metric = TokensPerSecondMetric::new();
        metric.update(&TokensInput { tokens: 1000, seconds: 0.5 }, &metadata());
        assert_eq!(metric.value().current(), 2000.0);
        metric.update(&TokensInput { tokens: 1000, seconds: 1.5 }, &metadata());
        assert_eq!(metric.value().current(), 1000.0 / 1.5);
        // Σ tokens ÷ Σ seconds = 2000 / 2, not the mean of the two rates (1333.3).
        assert_eq!(metric.running_value().current(), 1000.0);
        metric.clear();
        assert_eq!(metric.running_value().current(), 0.0);
    }

    #[test]
    fn grad_norm_is_the_steps_norm_and_the_epochs_mean_ignoring_evaluation() {
        let mut metric = GradNormMetric::new();
        metric.update(&GradNormInput(Some(2.0)), &metadata());
        metric.update(&GradNormInput(None), &metadata());
        metric.update(&GradNormInput(Some(1.0)), &metadata());
        assert_eq!(metric.value().current(), 1.0);
        assert_eq!(metric.running_value().current(), 1.5);
    }

    #[test]
    fn an_output_syncs_to_its_loss_norm_and_token_counts() {
        type B = burn::backend::Flex;
        let device = Default::default();
        let batch = Batch {
            batch_size: 2,
            seq_len: 3,
            inputs: vec![1, 2, 3, 4, 5, 6],
            targets: vec![2, 3, -100, 5, 6, 7],
            segments: None,
        };
        let output = LmOutput::<B>::new(
            Tensor::from_floats([2.5], &device),
            Some(Tensor::from_floats([0.75], &device)),
            batch.inputs.len(),
            batch.scored_tokens(),
            Instant::now(),
        );
        let stats = output.sync();
        assert_eq!((stats.loss, stats.grad_norm, stats.tokens, stats.scored_tokens), (2.5, Some(0.75), 6, 5));
        let tokens: TokensInput = stats.adapt();
        assert_eq!(tokens.tokens, 6);
    }
}
