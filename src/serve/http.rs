//! `serve`'s HTTP server: the axum [`Router`] on hyper's HTTP/1 connection
//! driver, with the limits `axum::serve` does not offer.
//!
//! Invariants:
//! - a request's head (request line and headers) must arrive within
//!   [`HttpLimits::header_read_timeout`] of the moment the connection is
//!   ready for it (accepted, or done with the previous request of a
//!   keep-alive connection), else the connection is closed: a client that
//!   trickles bytes, or keeps an idle connection, holds it that long at most;
//! - every connection, however busy, is asked to finish after
//!   [`HttpLimits::max_connection_age`] (its in-flight request completes)
//!   and is dropped one header timeout later whatever it is doing (a client
//!   that reads its response slowly, or trickles a body);
//! - at most [`HttpLimits::max_connections`] connections are served at once.
//!   Beyond that a new connection is accepted and closed at once (no
//!   response): the listen backlog never fills with connections nobody
//!   serves, and a scraper fails fast instead of hanging; capacity returns
//!   as the held connections are cut by the limits above. A warning is
//!   logged when the cap is first reached (again after it was free);
//! - shutdown (the token) stops accepting, lets in-flight requests finish
//!   and closes idle connections; the task returns when every connection is
//!   gone (serve's shutdown timeout bounds the wait). Connections live in a
//!   [`JoinSet`] owned by the server, so aborting it drops them all.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Limits of the HTTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest wait for a request's head (`BF4PS_HTTP_HEADER_TIMEOUT`).
    pub(crate) header_read_timeout: Duration,
    /// Connections served at once (`BF4PS_HTTP_MAX_CONNECTIONS`).
    pub max_connections: usize,
    /// Age after which a connection is asked to close.
    pub(crate) max_connection_age: Duration,
}

/// [`HttpLimits::max_connection_age`] in production: long enough for
/// Prometheus to reuse a connection for a few scrapes.
pub(crate) const MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);

/// Serves `app` on `listener` until `cancel` fires and every connection is
/// closed (see the module doc).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    cancel: CancellationToken,
) -> Result<(), String> {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = JoinSet::new();
    let mut saturated = false;
    loop {
        let stream = tokio::select! {
            _ = cancel.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if !std::mem::replace(&mut saturated, true) {
                tracing::warn!(
                    max = limits.max_connections,
                    "HTTP connection cap reached: closing new connections until some finish"
                );
            }
            drop(stream);
            continue;
        };
        saturated = false;
        let _ = stream.set_nodelay(true);
        connections.spawn(connection(
            builder.clone(),
            stream,
            app.clone(),
            limits,
            permit,
            cancel.clone(),
        ));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One connection, under the limits; holds its permit until it is gone.
async fn connection(
    builder: http1::Builder,
    stream: TcpStream,
    app: Router,
    limits: HttpLimits,
    _permit: OwnedSemaphorePermit,
    cancel: CancellationToken,
) {
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let finish_by = tokio::select! {
        r = conn.as_mut() => return done(r),
        _ = cancel.cancelled() => None,
        _ = tokio::time::sleep(limits.max_connection_age) => Some(limits.header_read_timeout),
    };
    conn.as_mut().graceful_shutdown();
    match finish_by {
        None => done(conn.await),
        Some(limit) => match tokio::time::timeout(limit, conn).await {
            Ok(r) => done(r),
            Err(_) => tracing::debug!("HTTP connection dropped: still busy past its age limit"),
        },
    }
}

fn done(r: Result<(), hyper::Error>) {
    if let Err(e) = r {
        // Timeouts, resets and malformed requests: the client's business.
        tracing::debug!(error = %e, "HTTP connection closed");
    }
}

/// What `axum::serve` does: errors of one connection are ignored; others
/// (e.g. too many open files) are logged and retried after a second.
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "HTTP accept failed; retrying in 1s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
