//! A terminal that is gone (an SSH disconnect, a closed window, `tmux kill-session`): seen by
//! `poll(2)` on the terminal the dashboard reads keys from, so that the dashboard neither
//! waits for a key that can never come nor spins in crossterm 0.29's event poll, which loops
//! forever, ignoring its timeout, once its reads return 0 bytes or EIO.
//!
//! [`Watchdog`] covers what the dashboard loop cannot: a hang-up that happens while the loop is
//! inside crossterm's poll. It asks the run to stop with a checkpoint and ends the process
//! once the training has ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ember_train::Controls;

/// What the keyboard's terminal has for the dashboard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Nothing within the time waited.
    None,
    /// Bytes to read (a key, perhaps).
    Ready,
    /// It hung up or reads at its end: nobody is at the keyboard any more.
    HungUp,
}

/// The terminal the dashboard reads keys from: standard input when it is a terminal, else
/// `/dev/tty` (where crossterm then reads keys).
pub struct KeyboardTerminal {
    #[cfg(unix)]
    tty: Option<std::fs::File>,
}

impl KeyboardTerminal {
    /// The terminal crossterm reads keys from.
    pub fn open() -> Self {
        #[cfg(unix)]
        {
            use std::io::IsTerminal;
            let tty = match std::io::stdin().is_terminal() {
                true => None,
                false => std::fs::File::open("/dev/tty").ok(),
            };
            Self { tty }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Waits up to `timeout` for input, or a hang-up.
    pub fn wait(&self, timeout: Duration) -> Input {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            let fd = self.tty.as_ref().map_or(libc::STDIN_FILENO, |f| f.as_raw_fd());
            let mut fds = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: poll(2) on one pollfd of an open descriptor.
            let ready = unsafe { libc::poll(&mut fds, 1, millis) };
            match ready {
                n if n < 0 => Input::None, // EINTR (a signal): the next frame looks again
                0 => Input::None,
                _ if fds.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 => Input::HungUp,
                _ => Input::Ready,
            }
        }
        #[cfg(not(unix))]
        {
            match ratatui::crossterm::event::poll(timeout) {
                Ok(true) => Input::Ready,
                Ok(false) => Input::None,
                Err(_) => Input::HungUp,
            }
        }
    }

    /// Whether it hung up, without waiting.
    pub fn hung_up(&self) -> bool {
        self.wait(Duration::ZERO) == Input::HungUp
    }
}

/// How the training of a run with a dashboard ended: `None` while it runs, then whether it
/// succeeded.
#[derive(Default)]
pub struct Ended {
    outcome: Mutex<Option<bool>>,
    changed: Condvar,
    already_finished: AtomicBool,
}

impl Ended {
    /// Records that the training ended, successfully or not, and whether it found its run
    /// already finished (a resume at `max_steps`).
    pub fn set(&self, ok: bool, already_finished: bool) {
        self.already_finished.store(already_finished, Ordering::SeqCst);
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(ok);
        self.changed.notify_all();
    }

    /// Whether the training ended finding its run already finished.
    pub fn already_finished(&self) -> bool {
        self.already_finished.load(Ordering::SeqCst)
    }

    /// Waits until the training has ended; returns whether it succeeded.
    fn wait(&self) -> bool {
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(ok) = *outcome {
                return ok;
            }
            outcome = self.changed.wait(outcome).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Watches the keyboard's terminal while the dashboard is up. If it hangs up, asks the run to
/// stop (a checkpoint of the current step, as SIGHUP does), waits for the training to end and
/// ends the process: status 0 when the training ended well, else 1. Nothing can be printed to
/// a terminal that is gone. Dropping it stops the watch.
pub struct Watchdog {
    done: Arc<AtomicBool>,
}

impl Watchdog {
    /// Starts watching, every 100 ms.
    pub fn start(controls: Arc<Controls>, ended: Arc<Ended>) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let watching = done.clone();
        std::thread::spawn(move || {
            let keyboard = KeyboardTerminal::open();
            while !watching.load(Ordering::SeqCst) {
                if keyboard.hung_up() {
                    controls.stop.store(true, Ordering::SeqCst);
                    let ok = ended.wait();
                    // The dashboard loop may be stuck in crossterm's poll: end here.
                    if !watching.load(Ordering::SeqCst) {
                        std::process::exit(if ok { 0 } else { 1 });
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}
