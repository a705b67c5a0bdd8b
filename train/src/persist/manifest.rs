//! A checkpoint's `manifest.json`: every file's name, size and SHA-256, written last. A
//! checkpoint directory without one is incomplete; a file that does not match it is damaged.

use std::fmt;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use ember_data::{sha256_file, sha256_hex};

/// The manifest's file name in a checkpoint directory.
pub const MANIFEST: &str = "manifest.json";

/// The files every checkpoint holds (besides the manifest), in the order they are written.
pub const CHECKPOINT_FILES: [&str; 5] =
    ["model.mpk", "optim_decay.mpk", "optim_no_decay.mpk", "state.json", "config.toml"];

/// The contents of `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The checkpoint layout version ([`super::checkpoint::CHECKPOINT_VERSION`]).
    pub version: u32,
    /// Optimizer steps completed at this checkpoint.
    pub step: u64,
    /// Every file of the checkpoint.
    pub files: Vec<FileEntry>,
}

/// One file of a checkpoint as it was written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The file name, relative to the checkpoint directory.
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Lower-case hex SHA-256 of its contents.
    pub sha256: String,
}

impl FileEntry {
    /// The entry of a file holding `bytes`.
    pub fn of(name: &str, bytes: &[u8]) -> Self {
        Self { name: name.into(), bytes: bytes.len() as u64, sha256: sha256_hex(bytes) }
    }
}

/// Why a checkpoint directory cannot be loaded.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// No manifest: the process stopped while writing the checkpoint.
    Incomplete,
    /// No manifest, and `state.json` says an earlier Ember (this layout version) wrote it.
    Unverifiable {
        /// The layout version in its `state.json`.
        version: u32,
    },
    /// The manifest cannot be read or parsed, or lacks a file every checkpoint has.
    BadManifest(String),
    /// A file the manifest lists is not there.
    Missing(String),
    /// A file's size is not the manifest's.
    SizeDiffers {
        /// The file.
        file: String,
        /// Its size now.
        actual: u64,
        /// The manifest's size.
        expected: u64,
    },
    /// A file's SHA-256 is not the manifest's.
    HashDiffers(String),
    /// A file cannot be read.
    Unreadable {
        /// The file.
        file: String,
        /// The I/O error.
        error: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Incomplete => {
                write!(f, "incomplete (no {MANIFEST}: the run stopped while writing it)")
            }
            Problem::Unverifiable { version } => write!(
                f,
                "written by an earlier Ember (checkpoint version {version}, without {MANIFEST}), so it cannot be verified; continue that run with the Ember version that wrote it, or start a new run with this one"
            ),
            Problem::BadManifest(why) => write!(f, "{MANIFEST} is damaged ({why})"),
            Problem::Missing(file) => write!(f, "{file} is missing (listed in {MANIFEST})"),
            Problem::SizeDiffers { file, actual, expected } => write!(
                f,
                "{file} is damaged (size {actual} bytes differs from {MANIFEST}'s {expected})"
            ),
            Problem::HashDiffers(file) => {
                write!(f, "{file} is damaged (sha256 differs from {MANIFEST})")
            }
            Problem::Unreadable { file, error } => write!(f, "cannot read {file}: {error}"),
        }
    }
}

impl Manifest {
    /// Reads the manifest of checkpoint directory `dir`.
    ///
    /// Errors: [`Problem::Incomplete`] (or [`Problem::Unverifiable`] for an earlier Ember's
    /// checkpoint) when there is none; [`Problem::BadManifest`] when it is unreadable, not a
    /// manifest, or lacks one of [`CHECKPOINT_FILES`].
    pub fn read(dir: &Path) -> Result<Self, Problem> {
        let path = dir.join(MANIFEST);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing_manifest(dir)),
            Err(e) => return Err(Problem::BadManifest(e.to_string())),
        };
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| Problem::BadManifest(e.to_string()))?;
        if let Some(absent) = CHECKPOINT_FILES.iter().find(|name| manifest.entry(name).is_none()) {
            return Err(Problem::BadManifest(format!("it does not list {absent}")));
        }
        if manifest.version != super::checkpoint::CHECKPOINT_VERSION {
            let expected = super::checkpoint::CHECKPOINT_VERSION;
            return Err(Problem::BadManifest(format!("version {} is not {expected}", manifest.version)));
        }
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let named = name.strip_prefix("step-").and_then(|n| n.parse::<u64>().ok());
        if named != Some(manifest.step) {
            let message = format!("it is step {}'s, but the directory is named {name}", manifest.step);
            return Err(Problem::BadManifest(message));
        }
        Ok(manifest)
    }

    /// The entry of file `name`.
    pub fn entry(&self, name: &str) -> Option<&FileEntry> {
        self.files.iter().find(|e| e.name == name)
    }

    /// Checks every listed file of `dir`: all sizes first (cheap), then every SHA-256.
    ///
    /// Errors: the first file missing, of another size, or of another hash.
    pub fn verify_files(&self, dir: &Path) -> Result<(), Problem> {
        for entry in &self.files {
            let path = dir.join(&entry.name);
            let actual = match fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Problem::Missing(entry.name.clone()))
                }
                Err(e) => return Err(Problem::Unreadable { file: entry.name.clone(), error: e.to_string() }),
            };
            if actual != entry.bytes {
                return Err(Problem::SizeDiffers { file: entry.name.clone(), actual, expected: entry.bytes });
            }
        }
        for entry in &self.files {
            let hash = sha256_file(&dir.join(&entry.name))
                .map_err(|e| Problem::Unreadable { file: entry.name.clone(), error: e.to_string() })?;
            if hash != entry.sha256 {
                return Err(Problem::HashDiffers(entry.name.clone()));
            }
        }
        Ok(())
    }

    /// Checks bytes read from file `name` against its entry.
    ///
    /// Errors: the manifest does not list it; another size; another hash.
    pub fn check(&self, name: &str, bytes: &[u8]) -> Result<(), Problem> {
        let entry =
            self.entry(name).ok_or_else(|| Problem::BadManifest(format!("it does not list {name}")))?;
        if bytes.len() as u64 != entry.bytes {
            return Err(Problem::SizeDiffers {
                file: name.into(),
                actual: bytes.len() as u64,
                expected: entry.bytes,
            });
        }
        if sha256_hex(bytes) != entry.sha256 {
            return Err(Problem::HashDiffers(name.into()));
        }
        Ok(())
    }
}

/// Verifies checkpoint directory `dir` against its manifest; returns the manifest.
///
/// Errors: the [`Problem`] found.
pub fn verify(dir: &Path) -> Result<Manifest, Problem> {
    let manifest = Manifest::read(dir)?;
    manifest.verify_files(dir)?;
    Ok(manifest)
}

/// A directory without a manifest: an earlier Ember's checkpoint (its `state.json` has an
/// older version), else an interrupted one.
fn missing_manifest(dir: &Path) -> Problem {
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let version = fs::read(dir.join("state.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Version>(&bytes).ok())
        .map(|v| v.version);
    match version {
        Some(version) if version < super::checkpoint::CHECKPOINT_VERSION => Problem::Unverifiable { version },
        _ => Problem::Incomplete,
    }
}
