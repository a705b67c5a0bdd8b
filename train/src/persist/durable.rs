//! The file-system steps a checkpoint is made of: write a new file and fsync it, fsync a
//! directory, say what to do about a failed write. (SHA-256: [`ember_data::sha256_hex`].)

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Creates `path` (which must not exist), writes `bytes` and fsyncs the file. A full disk or a
/// file-size limit surfaces as the write's own error ("No space left on device", "File too
/// large").
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Fsyncs a directory, so the entries created, renamed or removed in it are on disk.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What to do about a failed write, by its cause.
pub(crate) fn remedy(error: &io::Error) -> &'static str {
    match error.kind() {
        io::ErrorKind::StorageFull => "free disk space",
        io::ErrorKind::QuotaExceeded => "free space within the disk quota",
        io::ErrorKind::FileTooLarge => "raise the file-size limit (`ulimit -f`)",
        _ => "fix the cause",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synced_write_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        write_synced(&path, b"abc").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abc");
        assert!(write_synced(&path, b"again").is_err(), "never overwrites");
        sync_dir(dir.path()).unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_full_device_says_so() {
        // /dev/full fails every write with ENOSPC.
        let mut file = OpenOptions::new().write(true).open("/dev/full").unwrap();
        let err = file.write_all(&[0u8; 4096]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert!(err.to_string().contains("No space left on device"), "{err}");
        assert_eq!(remedy(&err), "free disk space");
    }
}
