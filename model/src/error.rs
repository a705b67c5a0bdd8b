//! Configuration errors shared by every architecture.

use std::fmt;

/// A model configuration that cannot build a model: names the field and what was expected.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The offending field, e.g. `"d_model"`.
    pub field: &'static str,
    /// What is wrong and what was expected.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "model.{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}
