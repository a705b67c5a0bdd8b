//! Batches assembled on a background thread into a bounded queue while the model computes.

use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{Batch, DataError, DataView, EpochSampler, SamplerState};

/// Runs a producer on its own thread, `depth` items ahead of the consumer.
///
/// The producer (`FnMut() -> Option<Result<T, DataError>>`) is called until it returns `None`
/// or an error (which is delivered, then the thread stops). Items arrive in the producer's
/// order. Dropping the prefetcher stops the thread: a producer blocked on a full queue is woken
/// at once; one in the middle of producing an item finishes that item first; the drop waits
/// for the thread to end, so no thread outlives it.
pub struct Prefetcher<T> {
    rx: Option<Receiver<Result<T, DataError>>>,
    handle: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Prefetcher<T> {
    /// Starts the thread. `depth` (≥ 1; 0 is taken as 1) items are produced ahead.
    ///
    /// Errors: [`DataError::Prefetch`] if the thread cannot be spawned.
    pub fn spawn<F>(depth: usize, mut producer: F) -> Result<Self, DataError>
    where
        F: FnMut() -> Option<Result<T, DataError>> + Send + 'static,
    {
        let (tx, rx) = sync_channel(depth.max(1));
        let handle = std::thread::Builder::new()
            .name("ember-prefetch".into())
            .spawn(move || {
                while let Some(item) = producer() {
                    let stop = item.is_err();
                    // Blocks while the queue is full; fails at once when the receiver is
                    // dropped (also while blocked), which ends the thread.
                    if tx.send(item).is_err() {
                        return;
                    }
                    if stop {
                        return;
                    }
                }
            })
            .map_err(|e| DataError::Prefetch { reason: format!("cannot spawn the prefetch thread: {e}") })?;
        Ok(Prefetcher { rx: Some(rx), handle: Some(handle) })
    }
}

impl<T> Iterator for Prefetcher<T> {
    /// An item and how long [`Iterator::next`] waited for it (≈ 0 when the producer keeps
    /// ahead), or the producer's error.
    type Item = Result<(T, Duration), DataError>;

    /// The next item; `None` once the producer is exhausted or after an error was returned.
    /// A producer that panicked gives [`DataError::Prefetch`] with its message.
    fn next(&mut self) -> Option<Self::Item> {
        let rx = self.rx.as_ref()?;
        let start = Instant::now();
        match rx.recv() {
            Ok(Ok(item)) => Some(Ok((item, start.elapsed()))),
            Ok(Err(e)) => {
                self.rx = None;
                Some(Err(e))
            }
            Err(_) => {
                // The thread ended: exhausted, or panicked.
                self.rx = None;
                match self.handle.take().map(JoinHandle::join) {
                    Some(Err(panic)) => {
                        let reason = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "the producer panicked".into());
                        Some(Err(DataError::Prefetch { reason }))
                    }
                    _ => None,
                }
            }
        }
    }
}

impl<T> Drop for Prefetcher<T> {
    fn drop(&mut self) {
        // Dropping the receiver first makes a blocked `send` return an error at once.
        self.rx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The data of one optimizer step: its micro-batches and the sampler state after them.
#[derive(Clone, Debug)]
pub struct StepData {
    /// `micro_steps` batches of `batch_size` rows, in order.
    pub micro_batches: Vec<Batch>,
    /// The sampler state after these batches: what a checkpoint taken after this step must
    /// record (the consumer records the state of what it consumed, not of what was prefetched).
    pub state: SamplerState,
    /// Where each micro-batch came from, in order.
    pub sources: Vec<BatchSource>,
}

/// The rows one micro-batch was built from: the epoch they were drawn in and their indices in
/// the split (row `i` of a packed split is the window of tokens `[i·L, i·L + L]`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BatchSource {
    /// The epoch of the draw, from 0.
    pub epoch: u64,
    /// Row (window) indices, in batch order.
    pub rows: Vec<usize>,
}

/// A producer for [`Prefetcher`]: endless steps of `micro_steps` batches drawn by `sampler`
/// from `view`, starting at `state`.
pub fn step_producer(
    view: DataView,
    mut sampler: EpochSampler,
    mut state: SamplerState,
    micro_steps: usize,
) -> impl FnMut() -> Option<Result<StepData, DataError>> + Send + 'static {
    move || {
        let mut micro_batches = Vec::with_capacity(micro_steps);
        let mut sources = Vec::with_capacity(micro_steps);
        for _ in 0..micro_steps {
            let epoch = state.epoch;
            let drawn = sampler.next(&mut state).and_then(|rows| Ok((view.batch(&rows)?, rows)));
            match drawn {
                Ok((batch, rows)) => {
                    micro_batches.push(batch);
                    sources.push(BatchSource { epoch, rows });
                }
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(StepData { micro_batches, state, sources }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn order_is_kept_and_waits_are_small_when_the_producer_is_fast() {
        let mut n = 0;
        // A queue deep enough for every item: once the producer has run ahead, no call waits.
        let mut p = Prefetcher::spawn(64, move || {
            n += 1;
            (n <= 50).then_some(Ok(n))
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut got = Vec::new();
        let mut waited = Duration::ZERO;
        for item in p.by_ref() {
            let (x, w) = item.unwrap();
            got.push(x);
            waited += w;
        }
        assert_eq!(got, (1..=50).collect::<Vec<_>>());
        assert!(waited < Duration::from_millis(20), "waited {waited:?} for items already queued");
        assert!(p.next().is_none());
    }

    #[test]
    fn slow_producer_shows_in_the_wait() {
        let mut p = Prefetcher::spawn(1, || {
            std::thread::sleep(Duration::from_millis(30));
            Some(Ok(()))
        })
        .unwrap();
        p.next().unwrap().unwrap();
        let (_, wait) = p.next().unwrap().unwrap();
        assert!(wait >= Duration::from_millis(10), "{wait:?}");
    }

    #[test]
    fn errors_propagate_then_the_stream_ends() {
        let mut n = 0;
        let mut p = Prefetcher::spawn(2, move || {
            n += 1;
            Some(if n < 3 { Ok(n) } else { Err(DataError::InvalidBatch { reason: format!("bad {n}") }) })
        })
        .unwrap();
        assert_eq!(p.next().unwrap().unwrap().0, 1);
        assert_eq!(p.next().unwrap().unwrap().0, 2);
        assert!(p.next().unwrap().unwrap_err().to_string().contains("bad 3"));
        assert!(p.next().is_none());
    }

    #[test]
    fn a_panicking_producer_is_an_error() {
        let mut p: Prefetcher<u32> = Prefetcher::spawn(1, || panic!("boom")).unwrap();
        let err = p.next().unwrap().unwrap_err();
        assert!(matches!(err, DataError::Prefetch { .. }) && err.to_string().contains("boom"), "{err}");
    }

    #[test]
    fn drop_while_the_producer_is_blocked_does_not_hang() {
        let produced = Arc::new(AtomicUsize::new(0));
        let count = produced.clone();
        let p = Prefetcher::spawn(2, move || {
            count.fetch_add(1, Ordering::SeqCst);
            Some(Ok(vec![0u8; 16]))
        })
        .unwrap();
        // Wait until the queue is full and the producer is blocked on the third send.
        let t = Instant::now();
        while produced.load(Ordering::SeqCst) < 3 && t.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        let start = Instant::now();
        drop(p); // joins the thread
        assert!(start.elapsed() < Duration::from_secs(2));
        let after = produced.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(produced.load(Ordering::SeqCst), after, "the thread has stopped");
    }
}
