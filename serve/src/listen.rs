//! The listener: accepts connections and serves each with hyper's HTTP/1 (the router is the
//! service), with a deadline for a request's headers; once `shutdown` resolves (after the drain:
//! see `serve`'s `stop`) it stops accepting, lets the connections in flight finish for the time
//! the drain left, then closes the rest.
//!
//! axum's own `serve` sets no timer, so hyper's header timeout never fires there and a client
//! that sends half a request holds its connection (and the shutdown) forever.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Serves `router` on `listener` until `shutdown` resolves to the time left for the connections
/// still open, which then get that long to finish. `header`: from the moment the server waits for
/// a request (a new connection, or the next request on a kept-alive one) to the end of its
/// headers; past it the connection is closed. Returns how many connections were still open when
/// the time ran out.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    header: Duration,
    shutdown: impl Future<Output = Duration>,
) -> usize {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(header);
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    let left = loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait for connections to close.
                    tracing::warn!("could not accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            left = &mut shutdown => break left,
        };
        let service = TowerToHyperService::new(router.clone());
        let conn = http.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        conns.spawn(async move {
            let _ = conn.await;
        });
        while conns.try_join_next().is_some() {}
    };
    drop(listener);
    // Idle connections close now; a request in flight finishes, then its connection closes.
    tokio::select! {
        _ = graceful.shutdown() => 0,
        _ = tokio::time::sleep(left) => {
            while conns.try_join_next().is_some() {}
            let open = conns.len();
            // Dropping a connection drops its response stream, which cancels its sequences.
            conns.shutdown().await;
            open
        }
    }
}
