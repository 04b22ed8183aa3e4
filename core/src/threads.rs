//! The kernels' threads: the one rule for how many a run may ask for (the CLI, the server, bench
//! and Python all go through [`pool`]), and the rayon pool that holds them.

use crate::error::{Error, Result};

/// The most threads a run may ask for: far past any core count kvgpt is run on, and short of
/// where starting them exhausts the system (Python's `threads=5000` did).
pub const MAX_THREADS: usize = 1024;

/// A pool of `threads` threads (None: one per core), named `name-0`, `name-1`, …
pub fn pool(threads: Option<usize>, name: &'static str) -> Result<rayon::ThreadPool> {
    let mut b = rayon::ThreadPoolBuilder::new().thread_name(move |i| format!("{name}-{i}"));
    if let Some(n) = threads {
        if !(1..=MAX_THREADS).contains(&n) {
            return Err(Error::Invalid(format!(
                "{n} threads: ask for 1 to {MAX_THREADS} (or none: one per core; this machine has {})",
                std::thread::available_parallelism().map_or(1, |n| n.get())
            )));
        }
        b = b.num_threads(n);
    }
    b.build().map_err(|e| Error::Invalid(format!("could not start the worker threads: {e}")))
}
