//! Standard output and error that may be pipes their reader closed (`ember train … | head -1`,
//! `ember train … 2>&1 | head`).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Set once a write to stdout found the reader gone; later lines are dropped.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// What a closed stdout does instead of ending the program (set by `ember train`).
static ON_CLOSED: OnceLock<Box<dyn Fn() + Send + Sync>> = OnceLock::new();

/// Makes a closed stdout call `stop` once (and drop every later line) instead of exiting:
/// `ember train` then stops after the current step with a checkpoint. Only the first call
/// counts.
pub(crate) fn on_stdout_closed(stop: impl Fn() + Send + Sync + 'static) {
    let _ = ON_CLOSED.set(Box::new(stop));
}

/// Whether stdout was found closed.
pub(crate) fn stdout_closed() -> bool {
    CLOSED.load(Ordering::SeqCst)
}

/// Writes one line to stdout. If the reader went away (a broken pipe, a hung-up terminal): with an
/// [`on_stdout_closed`] hook, calls it once and drops this and later lines; without one,
/// exits with status 0, as Unix tools do (`ember sample | head`).
pub(crate) fn print_line(line: std::fmt::Arguments<'_>) {
    if stdout_closed() {
        return;
    }
    if let Err(e) = writeln!(std::io::stdout().lock(), "{line}") {
        if reader_gone(&e) {
            match ON_CLOSED.get() {
                Some(stop) => {
                    if !CLOSED.swap(true, Ordering::SeqCst) {
                        stop();
                    }
                }
                None => std::process::exit(0),
            }
        }
    }
}

/// Whether a write failed because nobody can read the output any more: a pipe whose reader
/// closed it (EPIPE), or a terminal that hung up (EIO: its window closed, an SSH disconnect).
fn reader_gone(error: &std::io::Error) -> bool {
    #[cfg(unix)]
    if error.raw_os_error() == Some(libc::EIO) {
        return true;
    }
    error.kind() == std::io::ErrorKind::BrokenPipe
}

/// Writes one line to stderr, dropping it if stderr is closed (`eprintln!` would panic there,
/// in the middle of a training step).
pub(crate) fn print_err(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
