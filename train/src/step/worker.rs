//! Running a single-rank training loop on one of rayon's worker threads.
//!
//! On burn-flex every matmul and fused kernel runs on rayon's global pool. Called from a thread
//! outside the pool (the main thread), each of them is handed over: the caller queues the
//! work, wakes the pool's threads and sleeps until they finish, then is woken to go on. A
//! GPT-2 step on the CPU makes ~1,000 such calls (6/6/384: 13,800 context switches in a
//! 12-step `ember bench`). Run on a worker thread, the loop calls rayon from inside the pool:
//! the worker does its own share of each operation and the other threads steal the rest, so
//! nothing is handed over and nobody sleeps between operations (4,450 context switches).
//! Measured on 2 vCPUs in alternating runs: 4/4/128 context 64, 43.5–47.7 against 45.7–50.8
//! ms per step (7 of 8 pairs faster, 6% on average); 6/6/384 context 256, 2% faster (5 of 6).
//!
//! Only for one rank with one device: a loop that blocks on other ranks (an all-reduce) must
//! not sit on a worker thread, where rayon may start a second rank's loop on top of it while
//! it waits, or where the collective's own work (its sums run on the pool) could find every
//! worker busy waiting.

/// Stack size of rayon's worker threads in the `ember` binary: 8 MiB, the main thread's on
/// Linux, where the loop ran before (Rust gives spawned threads 2 MiB).
pub const WORKER_STACK_BYTES: usize = 8 << 20;

/// Builds rayon's global pool with [`WORKER_STACK_BYTES`] stacks, its thread count rayon's own
/// (`RAYON_NUM_THREADS`, else one per core). Call it before anything uses rayon; once the pool
/// exists (built here or by a first use) it is left as it is.
pub fn build_pool() {
    let _ = rayon::ThreadPoolBuilder::new().stack_size(WORKER_STACK_BYTES).build_global();
}

/// Runs `f` on a worker thread of rayon's global pool and returns its result; the caller
/// waits. Runs `f` right here when this thread is already a worker, or when the pool has a
/// single thread (nothing to gain, and `f` would then own the only worker).
///
/// A panic in `f` reaches the caller as before (rayon resumes it here).
pub fn on_pool_worker<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() || rayon::current_num_threads() < 2 {
        return f();
    }
    // `rayon::scope` runs its body on a worker of the global pool when called from outside it.
    rayon::scope(|_| f())
}

#[cfg(test)]
mod tests {
    use super::on_pool_worker;

    #[test]
    fn runs_on_a_worker_and_returns_the_result() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        // The global pool: outside it (a test thread), `f` runs on one of its workers.
        assert!(rayon::current_thread_index().is_none());
        let threads = rayon::current_num_threads();
        let (index, value) = on_pool_worker(|| (rayon::current_thread_index(), 6 * 7));
        assert_eq!(value, 42);
        assert_eq!(index.is_some(), threads >= 2, "{threads} threads in the global pool");
        // Already on a worker (of another pool): runs in place, on that worker.
        let here = pool.install(|| {
            let outer = rayon::current_thread_index();
            (outer, on_pool_worker(rayon::current_thread_index))
        });
        assert_eq!(here.0, here.1);
    }

    #[test]
    fn a_panic_reaches_the_caller() {
        let caught = std::panic::catch_unwind(|| on_pool_worker(|| panic!("inside")));
        let message = caught.unwrap_err();
        assert_eq!(message.downcast_ref::<&str>(), Some(&"inside"));
    }
}
