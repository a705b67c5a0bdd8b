//! Fetching the tinyshakespeare corpus, checksum-verified.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::sha256_hex;

use crate::atomic::write_atomic;
use crate::DataError;

/// Karpathy's char-rnn tinyshakespeare input.txt.
pub const TINYSHAKESPEARE_URL: &str =
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt";

/// SHA-256 (lowercase hex) of tinyshakespeare input.txt (1,115,394 bytes).
pub const TINYSHAKESPEARE_SHA256: &str = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed";

/// Largest response accepted, in bytes (guards against a wrong URL serving something huge).
const MAX_BYTES: u64 = 64 << 20;

/// Downloads tinyshakespeare to `dest` (temp file in the same directory + rename) and verifies
/// its SHA-256; returns `dest`. If `dest` already exists with the right hash, nothing is done;
/// if it exists with another hash, it is replaced. `dest`'s parent directory is created if missing.
///
/// Errors: [`DataError::Download`] if offline or the server fails (the message says to pass
/// `--input` a local copy of input.txt); [`DataError::ChecksumMismatch`] naming the expected and
/// actual hash (the download is not kept); [`DataError::Io`] if `dest` cannot be written.
pub fn download_tinyshakespeare(dest: &Path) -> Result<PathBuf, DataError> {
    download_verified(TINYSHAKESPEARE_URL, TINYSHAKESPEARE_SHA256, dest)
}

/// Downloads `url` to `dest` if `dest` does not already hold bytes with SHA-256 `sha256`.
pub(crate) fn download_verified(url: &str, sha256: &str, dest: &Path) -> Result<PathBuf, DataError> {
    if let Ok(existing) = std::fs::read(dest) {
        if sha256_hex(&existing) == sha256 {
            return Ok(dest.into());
        }
    }
    let failed = |reason: String| DataError::Download { url: url.into(), reason };
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(30))
        .timeout(Duration::from_secs(300))
        .build();
    let response = agent.get(url).call().map_err(|e| failed(e.to_string()))?;
    let mut bytes = Vec::new();
    response
        .into_reader()
        .take(MAX_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| failed(format!("reading the response: {e}")))?;
    let actual = sha256_hex(&bytes);
    if actual != sha256 {
        return Err(DataError::ChecksumMismatch {
            url: url.into(),
            dest: dest.into(),
            expected: sha256.into(),
            actual,
        });
    }
    if let Some(dir) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| DataError::io("cannot create directory", dir, e))?;
    }
    write_atomic(dest, &bytes)?;
    Ok(dest.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_url_says_pass_input_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("sub/input.txt");
        // Port 9 (discard) on localhost: connection refused, no network needed.
        let err =
            download_verified("http://127.0.0.1:9/input.txt", TINYSHAKESPEARE_SHA256, &dest).unwrap_err();
        assert!(matches!(err, DataError::Download { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("`--input`") && msg.contains("http://127.0.0.1:9/input.txt"), "{msg}");
        assert!(!dest.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing created");
    }

    #[test]
    fn existing_file_with_right_hash_is_kept_without_network() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("input.txt");
        std::fs::write(&dest, b"ab\n").unwrap();
        // sha256sum of "ab\n"; the URL is unreachable, so success proves no download happened.
        let hash = "a63d8014dba891345b30174df2b2a57efbb65b4f9f09b98f245d1b3192277ece";
        let got = download_verified("http://127.0.0.1:9/input.txt", hash, &dest).unwrap();
        assert_eq!(got, dest);
        assert_eq!(std::fs::read(&dest).unwrap(), b"ab\n");
    }

    #[test]
    fn existing_file_with_wrong_hash_triggers_download() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("input.txt");
        std::fs::write(&dest, b"stale").unwrap();
        let err =
            download_verified("http://127.0.0.1:9/input.txt", TINYSHAKESPEARE_SHA256, &dest).unwrap_err();
        assert!(matches!(err, DataError::Download { .. }), "{err:?}");
        assert_eq!(std::fs::read(&dest).unwrap(), b"stale", "old file untouched on failure");
    }

    /// Serves one HTTP response with `body` on a local port; returns the URL.
    fn serve_once(body: &'static [u8]) -> String {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            let head =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            conn.write_all(head.as_bytes()).unwrap();
            conn.write_all(body).unwrap();
        });
        format!("http://{addr}/input.txt")
    }

    #[test]
    fn verified_download_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("data/input.txt");
        let url = serve_once(b"ab\n");
        let hash = "a63d8014dba891345b30174df2b2a57efbb65b4f9f09b98f245d1b3192277ece";
        assert_eq!(download_verified(&url, hash, &dest).unwrap(), dest);
        assert_eq!(std::fs::read(&dest).unwrap(), b"ab\n");
        assert_eq!(std::fs::read_dir(dest.parent().unwrap()).unwrap().count(), 1, "no temp files left");
    }

    #[test]
    fn checksum_mismatch_names_both_hashes_and_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("input.txt");
        let url = serve_once(b"ab\n");
        let err = download_verified(&url, TINYSHAKESPEARE_SHA256, &dest).unwrap_err();
        assert!(matches!(err, DataError::ChecksumMismatch { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(TINYSHAKESPEARE_SHA256), "{msg}");
        assert!(msg.contains("a63d8014dba891345b30174df2b2a57efbb65b4f9f09b98f245d1b3192277ece"), "{msg}");
        assert!(!dest.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
