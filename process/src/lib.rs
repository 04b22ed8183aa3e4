//! Facts about the process that safe std cannot tell: whether standard output was closed when
//! the process started.
//!
//! A crate of its own because it is neither numerics nor the engine: it is a fact about the
//! process, read once before `main` by a function placed in `.init_array`, and both that static
//! and the `fcntl` call need `unsafe`. The kernels crate holds numerics only, and the main crate
//! says `#![forbid(unsafe_code)]`, which no `#[allow]` can lift; so the probe lives here, with
//! its one `unsafe` block.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set once, before `main`, by [`probe`]: whether file descriptor 1 was closed.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Whether standard output was closed when the process started (`kvgpt … >&-`). Rust's
/// runtime reopens a closed descriptor 0–2 on /dev/null before `main`, after which writes
/// succeed and vanish; this records what it was before.
pub fn stdout_closed_at_start() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static PROBE: extern "C" fn() = probe;

/// Runs from `.init_array`, before Rust's runtime touches the standard descriptors.
#[cfg(target_os = "linux")]
extern "C" fn probe() {
    // SAFETY: fcntl(F_GETFD) only reads the descriptor's flags; on a closed descriptor it
    // returns -1 (EBADF) and changes nothing.
    let r = unsafe { libc::fcntl(1, libc::F_GETFD) };
    STDOUT_CLOSED.store(r == -1, Ordering::Relaxed);
}
