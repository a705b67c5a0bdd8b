//! `RUN_DIR/.lock`: one training at a time in a run directory.
//!
//! The process that writes the run directory (node 0) of `ember train` and `ember train
//! --resume` holds an OS advisory lock on `RUN_DIR/.lock` (std's [`File::try_lock`]: `flock`
//! on Unix) from before it touches anything in the directory until the run ends. The file holds
//! the holder's PID and host name, for the message a second training gets. The OS releases the
//! lock when the process dies, however it dies: a lock file whose lock is free was left by a
//! process that ended without removing it, and is taken over with a warning naming it.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::TrainError;

/// The lock file's name in a run directory.
pub const LOCK_FILE: &str = ".lock";

/// The lock of a run directory, held until dropped (which removes the file, then releases the
/// lock).
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    // Holds the lock while open.
    _file: File,
}

impl RunLock {
    /// Creates `run_dir` if need be and takes its lock, writing this process's PID and host
    /// name into it. A lock file left by a process that no longer holds it is taken over, with
    /// a warning to `log` naming that process.
    ///
    /// Errors: another process holds the lock ([`TrainError::RunDirLocked`], naming its PID,
    /// host and the lock file); the directory or the file cannot be created or written.
    pub fn acquire(run_dir: &Path, log: &mut dyn FnMut(&str)) -> Result<Self, TrainError> {
        fs::create_dir_all(run_dir).map_err(TrainError::io(run_dir))?;
        let path = run_dir.join(LOCK_FILE);
        loop {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(TrainError::io(&path))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    let holder = read_holder(&mut file)
                        .unwrap_or_else(|| "another process (it has not written its PID yet)".into());
                    return Err(TrainError::RunDirLocked { run_dir: run_dir.into(), lock: path, holder });
                }
                Err(TryLockError::Error(e)) => return Err(TrainError::io(&path)(e)),
            }
            // The holder may have ended and removed the file between our open and our lock:
            // a lock on a removed file guards nothing, so open the path again.
            if !names_this_file(&path, &file) {
                continue;
            }
            if let Some(previous) = read_holder(&mut file) {
                log(&format!(
                    "{}: the lock was left by {previous}, which no longer holds it (it ended without removing it): taking it over",
                    path.display()
                ));
            }
            let me = format!("pid {}\nhost {}\n", std::process::id(), host_name());
            file.set_len(0)
                .and_then(|()| file.rewind())
                .and_then(|()| file.write_all(me.as_bytes()))
                .and_then(|()| file.sync_data())
                .map_err(TrainError::io(&path))?;
            return Ok(Self { path, _file: file });
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Removed while still locked (the file closes after this): whoever opened it meanwhile
        // sees that the path no longer names the file it locked, and opens it again.
        let _ = fs::remove_file(&self.path);
    }
}

/// `process PID on host HOST`, as written in the lock file; `None` for an empty file.
fn read_holder(file: &mut File) -> Option<String> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    let field =
        |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).filter(|v| !v.is_empty());
    match (field("pid "), field("host ")) {
        (None, None) if text.trim().is_empty() => None,
        (None, None) => Some("an unknown process (the file held no PID and host)".into()),
        (pid, host) => {
            Some(format!("process {} on host {}", pid.unwrap_or("(unknown)"), host.unwrap_or("(unknown)")))
        }
    }
}

/// Whether `path` still names `file` (same device and inode).
fn names_this_file(path: &Path, file: &File) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (fs::metadata(path), file.metadata()) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
    }
}

/// This machine's host name: `/proc/sys/kernel/hostname` (Linux), else `$HOSTNAME`, else
/// `unknown`.
pub fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_and_a_released_one_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(dir.path(), &mut |_| {}).unwrap();
        let err = RunLock::acquire(dir.path(), &mut |_| {}).unwrap_err().to_string();
        let holder = format!("process {} on host {}", std::process::id(), host_name());
        assert!(err.contains(&holder) && err.contains(".lock"), "{err}");
        drop(first);
        assert!(!dir.path().join(LOCK_FILE).exists(), "removed when released");
        let mut warnings = Vec::new();
        let _again = RunLock::acquire(dir.path(), &mut |w| warnings.push(w.to_string())).unwrap();
        assert!(warnings.is_empty(), "a cleanly released lock leaves nothing to take over: {warnings:?}");
    }

    #[test]
    fn a_lock_file_of_unknown_content_is_taken_over_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(LOCK_FILE), "garbage").unwrap();
        let mut warnings = Vec::new();
        let _lock = RunLock::acquire(dir.path(), &mut |w| warnings.push(w.to_string())).unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("left by an unknown process (the file held no PID and host)"),
            "{warnings:?}"
        );
    }
}
