//! Configuration errors shared by every architecture.

use std::fmt;

/// A model configuration that cannot build a model: names the field and what was expected.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The offending field, e.g. `"d_model"`.
    pub field: &'static str,
    /// What is wrong and what was expected.
    pub message: String,
    /// The other field of a check between two (e.g. `n_head` when `d_model` is not divisible
    /// by it), so a caller can name whichever of the two the user changed.
    pub also: Option<&'static str>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "model.{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Errors with the first of `sizes` (`(field, value)`) that is 0.
pub(crate) fn require_positive(sizes: &[(&'static str, usize)]) -> Result<(), ConfigError> {
    match sizes.iter().find(|(_, value)| *value == 0) {
        Some(&(field, _)) => {
            Err(ConfigError { field, message: "must be at least 1, got 0".into(), also: None })
        }
        None => Ok(()),
    }
}

/// Errors (on `d_model`, also naming `n_head`) unless `n_head` divides `d_model`.
pub(crate) fn require_heads_divide(d_model: usize, n_head: usize) -> Result<(), ConfigError> {
    if d_model.is_multiple_of(n_head) {
        return Ok(());
    }
    Err(ConfigError {
        field: "d_model",
        message: format!(
            "must be divisible by n_head ({n_head}), got {d_model} (remainder {})",
            d_model % n_head
        ),
        also: Some("n_head"),
    })
}
