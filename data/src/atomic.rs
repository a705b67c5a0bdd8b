//! Whole-or-nothing file writes: write a temp file in the destination's directory, then rename.

use std::io::Write;
use std::path::Path;

use tempfile::NamedTempFile;

use crate::DataError;

/// A fully written temp file next to its destination, not yet renamed into place.
/// Dropping it without [`Staged::commit`] deletes the temp file.
pub(crate) struct Staged<'a> {
    file: NamedTempFile,
    dest: &'a Path,
}

impl Staged<'_> {
    /// Renames the temp file onto the destination (atomic on the same filesystem).
    pub(crate) fn commit(self) -> Result<(), DataError> {
        let dest = self.dest;
        self.file.persist(dest).map_err(|e| DataError::io("cannot rename temp file onto", dest, e.error))?;
        // The rename is durable once the directory entry is on disk.
        let dir = parent_dir(dest);
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| DataError::io("cannot sync directory", dir, e))
    }
}

/// The directory `dest` is in (`.` for a bare file name).
fn parent_dir(dest: &Path) -> &Path {
    match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates a temp file in `dest`'s directory (which must exist) and fills it via `fill`;
/// the data is flushed and synced to disk before returning.
pub(crate) fn stage<'a>(
    dest: &'a Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<Staged<'a>, DataError> {
    let dir = parent_dir(dest);
    let mut file =
        NamedTempFile::new_in(dir).map_err(|e| DataError::io("cannot create temp file in", dir, e))?;
    {
        let mut w = std::io::BufWriter::new(file.as_file_mut());
        fill(&mut w)
            .and_then(|()| w.flush())
            .map_err(|e| DataError::io("cannot write temp file for", dest, e))?;
    }
    file.as_file().sync_all().map_err(|e| DataError::io("cannot sync temp file for", dest, e))?;
    // tempfile creates 0600 files; outputs are ordinary files (0644 before the umask).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(|e| DataError::io("cannot set permissions of temp file for", dest, e))?;
    }
    Ok(Staged { file, dest })
}

/// Writes `bytes` to `dest` whole or not at all: a temp file in `dest`'s directory (which must
/// exist), fsync'd, then renamed over `dest` and the directory fsync'd — so a crash leaves the
/// old file or the new one, never half of one. Ember's one atomic-write helper (prepared data, run directories,
/// checkpoints, exports).
///
/// Errors: the temp file cannot be created, written, synced or renamed (naming the path).
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<(), DataError> {
    stage(dest, |w| w.write_all(bytes))?.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.txt");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temp files left");
    }

    #[test]
    fn dropped_stage_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.txt");
        drop(stage(&p, |w| w.write_all(b"abc")).unwrap());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn failed_fill_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.txt");
        let err = stage(&p, |_| Err(std::io::Error::other("boom"))).err().unwrap();
        assert!(err.to_string().contains("x.txt"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
