//! The file-system steps a checkpoint is made of: write a new file and fsync it, fsync a
//! directory, hash bytes or a file with SHA-256.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

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

/// Lower-case hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lower-case hex SHA-256 of a file's contents, read in 1 MiB pieces.
pub(crate) fn sha256_file(path: &Path) -> io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf)? {
            0 => break,
            n => hasher.update(&buf[..n]),
        }
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
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
    fn sha256_of_bytes_and_file_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        write_synced(&path, b"abc").unwrap();
        let expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_hex(b"abc"), expected);
        assert_eq!(sha256_file(&path).unwrap(), expected);
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
