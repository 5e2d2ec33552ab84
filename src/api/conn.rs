//! Serving with bounded connections: at most `max_connections` open at once (the listener
//! stops accepting at the cap; the kernel's backlog holds the rest), and a connection that
//! does not deliver a request head in time — a slow or idle client — is closed.
//!
//! `axum::serve` has neither knob, so connections are served with hyper's HTTP/1 builder:
//! its header-read timer runs from accept, and from the end of each response on a
//! keep-alive connection, until a request head is complete, so one timeout bounds both the
//! slow-header client and the idle keep-alive connection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Connection limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// Time to deliver a request head after accept or after the previous response (so also
    /// the keep-alive idle timeout).
    pub header_read_timeout: Duration,
}

/// Pause after an accept error (out of descriptors, say), so the loop cannot spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` within `limits` until `shutdown` resolves, then lets open
/// requests finish (idle connections close at once).
///
/// # Errors
/// None today (accept errors are logged and retried); kept for the listener's signature.
pub async fn serve_limited(
    listener: TcpListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ConnLimits,
) -> std::io::Result<()> {
    let max = limits
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS.min(1 << 30));
    let permits = Arc::new(Semaphore::new(max));
    let stop = CancellationToken::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    let mut accept_errors: u64 = 0;
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    accept_errors += 1;
                    if accept_errors.is_power_of_two() {
                        warn!(error = %err, accept_errors, "Accepting a connection failed; retrying shortly.");
                    }
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let stop = stop.clone();
        tokio::spawn(async move {
            let _permit = permit;
            tokio::pin!(conn);
            let served = tokio::select! {
                served = conn.as_mut() => served,
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(err) = served {
                // Timeouts and resets by clients: not the operator's concern.
                debug!(error = %err, "An HTTP connection ended with an error.");
            }
        });
    }
    drop(listener);
    stop.cancel();
    // Every permit back = every connection closed.
    let _ = permits.acquire_many(max as u32).await;
    Ok(())
}
