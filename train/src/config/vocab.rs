//! The vocabulary size of the model, settled once the data (or the weights) are known: the one
//! place that decides it, for training, benchmarks, evaluation and sampling alike.

use super::error::ConfigError;
use super::schema::{RunConfig, VocabSource};

impl RunConfig {
    /// Settles `model.vocab_size` and checks it against the data's vocabulary `data_vocab`
    /// (tokens; `None` when there is no prepared data):
    /// - given in the config: it must hold the data's vocabulary;
    /// - left out, with `init_from`: the weights' (the published GPT-2 has 50257 rows, while the
    ///   `gpt2` preset pads to 50304), which must hold the data's vocabulary;
    /// - left out: the preset's (e.g. GPT-2's padded 50304) if it holds the data's vocabulary,
    ///   else the data's own size.
    ///
    /// Errors, naming the config file and the key: a size below the data's vocabulary; no size
    /// from the config, the weights, a preset or the data; `init_from` weights that cannot be
    /// read.
    pub fn resolve_vocab(&mut self, data_vocab: Option<usize>) -> Result<(), ConfigError> {
        let key = "model.vocab_size";
        if let VocabSource::Pending { preset } = self.origin.vocab {
            let size = match (&self.init_from, preset, data_vocab) {
                (Some(weights), _, _) => ember_model::hf::vocab_size(weights)
                    .map_err(|e| self.origin.at("init_from", e.to_string()))?,
                (None, Some(preset), Some(data)) if preset >= data => preset,
                (None, _, Some(data)) => data,
                (None, Some(preset), None) => preset,
                (None, None, None) => {
                    return Err(self.origin.at(
                        key,
                        "unknown: set it (--set model.vocab_size=N), name a preset, or point `data` at a prepared directory",
                    ))
                }
            };
            self.model.set_vocab_size(size);
            self.origin.vocab = VocabSource::Given;
        }
        let size = self.model.vocab_size();
        match data_vocab {
            Some(data) if size < data => Err(self
                .origin
                .at(key, format!("{size} is smaller than the prepared data's vocabulary ({data} tokens)"))),
            _ => Ok(()),
        }
    }

    /// The vocabulary size of the prepared directory `data` names; `None` when `data` is not a
    /// directory (unset, missing, or a text file not prepared yet).
    ///
    /// Errors: the directory is not valid prepared data.
    pub fn data_vocab(&self) -> Result<Option<usize>, ember_data::DataError> {
        match self.data.as_deref().filter(|d| d.is_dir()) {
            Some(dir) => Ok(Some(ember_data::PreparedData::open(dir)?.meta.vocab_size)),
            None => Ok(None),
        }
    }
}
