//! `RUN_DIR/written.json`: the SHA-256 of each run file Ember wrote last (`config.toml`,
//! `data_meta.json`, `tokenizer.json`), so that a new run started in the directory replaces
//! only files that are still exactly Ember's. Any difference, even one value (`seed = 1338`),
//! makes a file the user's, which is then never overwritten.
//!
//! The record is written (atomically) after the files it lists: a run killed between the two
//! leaves a file that no longer matches, which counts as the user's — the safe side.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use ember_data::sha256_hex;
use serde::{Deserialize, Serialize};

use crate::error::TrainError;

/// The record's file name in a run directory.
pub const WRITTEN: &str = "written.json";

/// What Ember wrote in a run directory: file name → SHA-256 (lowercase hex) of its bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Written {
    /// The record's format.
    pub version: u32,
    /// SHA-256 of each file Ember wrote, by name.
    pub sha256: BTreeMap<String, String>,
}

/// The record's format.
const VERSION: u32 = 1;

impl Written {
    /// The record of `run_dir`, or `None` when there is none or it is not Ember's record.
    pub fn read(run_dir: &Path) -> Option<Self> {
        let bytes = fs::read(run_dir.join(WRITTEN)).ok()?;
        serde_json::from_slice::<Self>(&bytes).ok().filter(|w| w.version == VERSION)
    }

    /// Whether `RUN_DIR/name` holds exactly the bytes Ember wrote there last.
    pub fn holds(&self, run_dir: &Path, name: &str) -> bool {
        let Some(recorded) = self.sha256.get(name) else { return false };
        fs::read(run_dir.join(name)).is_ok_and(|bytes| sha256_hex(&bytes) == *recorded)
    }

    /// Writes `files` (name, bytes) into `run_dir`, each atomically, then the record of them
    /// (replacing an earlier record).
    ///
    /// Errors: a file or the record cannot be written (naming it).
    pub fn write_files(run_dir: &Path, files: &[(&str, &[u8])]) -> Result<(), TrainError> {
        let mut record = Self { version: VERSION, sha256: BTreeMap::new() };
        for (name, bytes) in files {
            ember_data::write_atomic(&run_dir.join(name), bytes)?;
            record.sha256.insert(name.to_string(), sha256_hex(bytes));
        }
        let json = serde_json::to_vec_pretty(&record).expect("the record serializes");
        ember_data::write_atomic(&run_dir.join(WRITTEN), &json)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_ours_only_while_its_bytes_are_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        assert_eq!(Written::read(run), None, "no record yet");
        Written::write_files(run, &[("config.toml", b"seed = 1337\n"), ("data_meta.json", b"{}")]).unwrap();
        let record = Written::read(run).unwrap();
        assert_eq!(record.sha256.len(), 2);
        assert!(record.holds(run, "config.toml") && record.holds(run, "data_meta.json"));
        assert!(!record.holds(run, "tokenizer.json"), "not written: not ours");
        fs::write(run.join("config.toml"), b"seed = 1338\n").unwrap();
        assert!(!record.holds(run, "config.toml"), "one value changed: the user's");
        fs::write(run.join(WRITTEN), b"{\"mine\": 1}").unwrap();
        assert_eq!(Written::read(run), None, "a file that is not Ember's record");
    }
}
