//! Shutting down: SIGTERM (or Ctrl-C) starts a drain in which `/health` answers 503 and new
//! completions are refused, while those in flight go on for a bounded time.

use super::http::Shared;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Resolves when a drain that SIGTERM (or Ctrl-C) started is over: from the signal on, `/health`
/// answers 503 and new completions are refused, while those in flight go on for at most `bound`.
/// Resolves to the time left of `bound`, for the connections still open.
pub async fn drain(app: Shared, bound: Duration) -> Duration {
    shutdown_signal().await;
    app.draining.store(true, Ordering::Relaxed);
    app.metrics.draining();
    let until = tokio::time::Instant::now() + bound;
    while app.working.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // No completion in flight: what is still open has not delivered a whole request (a head or a
    // body half sent; a body being read stops at once while draining), or is a short answer
    // being written: a moment, not the rest of the bound.
    let left = until.saturating_duration_since(tokio::time::Instant::now());
    if app.working.load(Ordering::Relaxed) == 0 {
        return left.min(GRACE);
    }
    left
}

/// What connections get after the drain when no completion is in flight.
const GRACE: Duration = Duration::from_millis(500);

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down, finishing the requests in flight");
}
