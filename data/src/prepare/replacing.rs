//! `.ember-replacing.json`: the record a replacement of a prepared dataset (`prepare --force`)
//! writes before it removes anything, and removes at its end. It names every file the
//! replacement removes and moves in, each with its SHA-256, so that what a crash in the middle
//! leaves is still provably Ember's: a file counts as the record's only when it has an Ember
//! dataset's name and the bytes the record names (a record written by hand cannot make a
//! user's file Ember's without its exact hash).

use std::path::Path;

use crate::DataError;

/// The record's name in a prepared directory.
pub const REPLACING_FILE: &str = ".ember-replacing.json";

/// The files a replacement may leave behind if it is interrupted: (name, SHA-256), the old
/// dataset's and the new one's (a name may appear twice, with the two versions' hashes).
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Replacing {
    /// (file name, SHA-256 as lowercase hex).
    pub files: Vec<(String, String)>,
}

impl Replacing {
    /// The record in `out`, if there is one that parses.
    pub(crate) fn read(out: &Path) -> Option<Self> {
        serde_json::from_slice(&std::fs::read(out.join(REPLACING_FILE)).ok()?).ok()
    }

    /// Writes the record into `out` (atomically, synced).
    pub(crate) fn write(&self, out: &Path) -> Result<(), DataError> {
        let json = serde_json::to_vec_pretty(self).expect("the record serializes");
        crate::write_atomic(&out.join(REPLACING_FILE), &json)
    }
}
