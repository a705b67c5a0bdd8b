//! Requests to a running training loop from another thread (Ctrl-C, the dashboard's keys).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Flags a run polls between optimizer steps. Every rank acts on the leader's (rank 0's).
#[derive(Debug, Default)]
pub struct Controls {
    /// Stop after the current step, with a checkpoint.
    pub stop: AtomicBool,
    /// Write a checkpoint after the current step (cleared when written).
    pub checkpoint: AtomicBool,
    /// Hold before the next step while set. With several ranks, a pause longer than
    /// `parallel.timeout_s` stops the others with a timeout error.
    pub pause: AtomicBool,
}

impl Controls {
    /// Controls with `stop` already set (the run stops after its first step).
    pub fn stopping() -> Arc<Self> {
        let controls = Self::default();
        controls.stop.store(true, Ordering::SeqCst);
        Arc::new(controls)
    }

    /// Whether a stop was requested.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Takes a checkpoint request (true once per request).
    pub fn take_checkpoint(&self) -> bool {
        self.checkpoint.swap(false, Ordering::SeqCst)
    }

    /// Waits while paused (polling every 50 ms); returns early on a stop request.
    pub fn wait_while_paused(&self) {
        while self.pause.load(Ordering::SeqCst) && !self.stop_requested() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}
