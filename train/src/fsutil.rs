//! Writes that never leave a half-written file behind.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::TrainError;

/// Writes `bytes` to a temporary file beside `path`, syncs it, then renames it over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let tmp = tmp_sibling(path);
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(TrainError::io(path))
}

/// `dir/.name.tmp-<pid>` for `dir/name`.
pub fn tmp_sibling(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}
