//! [`ConfigError`]: what is wrong with a configuration, naming the file, the key and what was
//! expected.

use std::path::PathBuf;

/// A configuration problem, naming the file and key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {error}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{path}: not valid TOML: {message}")]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A key is unknown, missing, or has a bad value.
    #[error("{path}: key `{key}`: {message}")]
    Key {
        /// The config file (`--set KEY=VALUE` for an override, or the file a value was checked
        /// against, such as the prepared data's `meta.json`).
        path: PathBuf,
        /// Dotted key, e.g. `optimizer.lr`.
        key: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// An override is not `key=value`.
    #[error("{arg}: {message}")]
    Set {
        /// The override as the user gave it (`--set max_steps`).
        arg: String,
        /// What was expected.
        message: String,
    },
}

impl ConfigError {
    /// Key `key` of the file `path` is wrong: `message` says how and what was expected.
    pub fn at(path: impl Into<PathBuf>, key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Key { path: path.into(), key: key.into(), message: message.into() }
    }
}
