//! The fake's HTTP side: routes at the real paths, connections a handler
//! can reset, redirects, and the answers themselves.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::{IncomingStream, Listener};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use bf4ps_ops::domain::Resource;
use bf4ps_ops::upstream::{UpstreamSettings, platform_from_battlelog_id};

use super::{
    BODY_MARKER, HANG_LIMIT, REDIRECT_PREFIX,
    faults::{Action, Shared},
};

/// The per-connection handle a handler gets through `ConnectInfo`.
#[derive(Debug, Clone)]
pub(super) struct Peer {
    pub(super) kill: Arc<AtomicBool>,
    pub(super) addr: SocketAddr,
}

/// A TCP stream that fails every read and write once its [`Peer`] is
/// killed, so hyper drops the connection without answering; with zero
/// linger the close is an RST.
pub(super) struct KillableStream {
    pub(super) inner: TcpStream,
    pub(super) kill: Arc<AtomicBool>,
}

impl KillableStream {
    pub(super) fn killed(&self) -> bool {
        if self.kill.load(Ordering::Relaxed) {
            let _ = self.inner.set_zero_linger();
            true
        } else {
            false
        }
    }
}

pub(super) fn reset_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "reset by fake-battlelog")
}

impl AsyncRead for KillableStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.killed() {
            return Poll::Ready(Err(reset_error()));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

pub(super) struct FakeListener {
    pub(super) inner: TcpListener,
}

impl Listener for FakeListener {
    type Io = KillableStream;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    let kill = Arc::new(AtomicBool::new(false));
                    let peer = Peer {
                        kill: kill.clone(),
                        addr,
                    };
                    return (
                        KillableStream {
                            inner: stream,
                            kill,
                        },
                        peer,
                    );
                }
                Err(e) => {
                    // Per-connection errors (reset before accept) are
                    // harmless; others (out of file descriptors) need a pause.
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                    ) {
                        tracing::warn!(error = %e, "fake-battlelog accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr().map(|addr| Peer {
            kill: Arc::new(AtomicBool::new(false)),
            addr,
        })
    }
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, FakeListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, FakeListener>) -> Self {
        stream.remote_addr().clone()
    }
}

pub(super) fn html(status: StatusCode, text: &str) -> Response {
    let body = format!(
        "<!DOCTYPE html><html><body><h1>{} {text}</h1><p>{BODY_MARKER}</p></body></html>",
        status.as_u16()
    );
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

pub(super) fn json_response(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        body,
    )
        .into_response()
}

pub(super) fn not_found() -> Response {
    html(StatusCode::NOT_FOUND, "that page doesn't exist")
}

/// A redirect to the original path below [`REDIRECT_PREFIX`].
pub(super) fn redirect(code: u16, original: &str) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::MOVED_PERMANENTLY);
    let mut response = html(status, "moved");
    if let Ok(location) = header::HeaderValue::from_str(&format!("{REDIRECT_PREFIX}{original}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// The path the client requested (for the redirect target).
pub(super) fn resource_path(resource: Resource, persona: &str, platform: &str) -> String {
    UpstreamSettings::default()
        .path_template(resource)
        .replace("{persona_id}", persona)
        .replace("{platform_id}", platform)
}

pub(super) async fn serve_resource(
    shared: Arc<Shared>,
    peer: Peer,
    resource: Resource,
    persona: String,
    platform: String,
) -> Response {
    let at = Instant::now();
    let persona_id = persona.parse::<i64>().ok();
    let platform_id = platform
        .parse::<u32>()
        .ok()
        .and_then(platform_from_battlelog_id);
    let (Some(persona_id), Some(platform_id)) = (persona_id, platform_id) else {
        return not_found();
    };
    let plan = shared.plan(at, peer.addr.ip(), platform_id, persona_id, resource);
    let wait = match plan.action {
        Action::Delay(d) => d,
        _ => plan.latency,
    };
    if !wait.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.shutdown.cancelled() => {
                return html(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
            }
        }
    }
    match plan.action {
        Action::Ok | Action::Delay(_) => json_response(plan.soldier.body(resource)),
        Action::MissingFields => json_response(plan.soldier.body_bad_counter(resource)),
        Action::NoStats => json_response(plan.soldier.body_without_stats(resource)),
        Action::Status(code) => html(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "scripted error",
        ),
        Action::Throttled(code) => html(
            StatusCode::from_u16(code).unwrap_or(StatusCode::FORBIDDEN),
            "request blocked",
        ),
        Action::Redirect(code) => redirect(code, &resource_path(resource, &persona, &platform)),
        Action::Malformed => json_response(
            format!(
                "{{\"type\":\"success\",\"message\":\"OK\",\"data\":{{\"note\":\"{BODY_MARKER}\",\"generalStats\":{{\"kills\":"
            )
            .into_bytes(),
        ),
        Action::Unavailable => json_response(
            serde_json::to_vec(&json!({
                "type": "error",
                "message": "Persona not found",
                "data": {"note": BODY_MARKER},
            }))
            .unwrap_or_default(),
        ),
        Action::NotFound => not_found(),
        Action::Hang => {
            // Clients give up long before; the cap only bounds how many
            // abandoned requests a long run can accumulate.
            tokio::select! {
                _ = shared.shutdown.cancelled() => {}
                _ = tokio::time::sleep(HANG_LIMIT) => {}
            }
            html(StatusCode::SERVICE_UNAVAILABLE, "gave up hanging")
        }
        Action::Reset => {
            peer.kill.store(true, Ordering::Relaxed);
            html(StatusCode::INTERNAL_SERVER_ERROR, "reset")
        }
    }
}

/// A user page request (`profile`): planned like the JSON resources (its
/// fault plans and scripts are keyed by the fake's number for the name,
/// on `pc`), answered with the page, a 404 for a user Battlelog does not
/// know, or the planned fault.
pub(super) async fn serve_user_page(shared: Arc<Shared>, peer: Peer, name: String) -> Response {
    let at = Instant::now();
    let (platform, key) = super::FakeServer::user_key(&name);
    let plan = shared.plan(at, peer.addr.ip(), platform, key, Resource::Profile);
    let wait = match plan.action {
        Action::Delay(d) => d,
        _ => plan.latency,
    };
    if !wait.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.shutdown.cancelled() => {
                return html(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
            }
        }
    }
    let seed = shared.seed();
    let page = |body: Vec<u8>| {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            body,
        )
            .into_response()
    };
    match plan.action {
        Action::Ok | Action::Delay(_) if super::stats::user_exists(seed, &name) => {
            page(super::stats::user_page(seed, &name))
        }
        Action::Ok | Action::Delay(_) | Action::Unavailable | Action::NotFound => not_found(),
        // A page that is not the user's (maintenance, an error page).
        Action::MissingFields | Action::NoStats | Action::Malformed => {
            html(StatusCode::OK, "Battlelog is down for maintenance")
        }
        Action::Status(code) => html(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "scripted error",
        ),
        Action::Throttled(code) => html(
            StatusCode::from_u16(code).unwrap_or(StatusCode::FORBIDDEN),
            "request blocked",
        ),
        Action::Redirect(code) => redirect(code, &format!("/bf4/user/{name}/")),
        Action::Hang => {
            tokio::select! {
                _ = shared.shutdown.cancelled() => {}
                _ = tokio::time::sleep(HANG_LIMIT) => {}
            }
            html(StatusCode::SERVICE_UNAVAILABLE, "gave up hanging")
        }
        Action::Reset => {
            peer.kill.store(true, Ordering::Relaxed);
            html(StatusCode::INTERNAL_SERVER_ERROR, "reset")
        }
    }
}

/// A request for the redirect target: counted, answered with an envelope
/// without stats (a client that followed the redirect fails to parse it).
pub(super) async fn serve_redirect_target(shared: Arc<Shared>) -> Response {
    shared.lock().redirect_target_requests += 1;
    json_response(
        serde_json::to_vec(&json!({
            "type": "success", "message": "OK", "data": {"note": BODY_MARKER},
        }))
        .unwrap_or_default(),
    )
}

pub(super) fn router(shared: Arc<Shared>) -> Router {
    let mut router = Router::new();
    let user = |State(shared): State<Arc<Shared>>,
                ConnectInfo(peer): ConnectInfo<Peer>,
                Path(name): Path<String>| serve_user_page(shared, peer, name);
    let user_path = UpstreamSettings::default()
        .path_template(Resource::Profile)
        .to_owned();
    router = router
        .route(&user_path, get(user).post(user))
        .route(user_path.trim_end_matches('/'), get(user).post(user));
    for resource in Resource::ALL.iter().copied() {
        if resource == Resource::Profile {
            continue;
        }
        let handler =
            move |State(shared): State<Arc<Shared>>,
                  ConnectInfo(peer): ConnectInfo<Peer>,
                  Path((persona, platform)): Path<(String, String)>| {
                serve_resource(shared, peer, resource, persona, platform)
            };
        // axum's `{name}` captures match the client's template syntax.
        let path = UpstreamSettings::default()
            .path_template(resource)
            .to_owned();
        router = router
            .route(&path, get(handler).post(handler))
            .route(path.trim_end_matches('/'), get(handler).post(handler));
    }
    let target = |State(shared): State<Arc<Shared>>| serve_redirect_target(shared);
    router
        .route(
            &format!("{REDIRECT_PREFIX}/{{*rest}}"),
            get(target).post(target),
        )
        .fallback(|| async { not_found() })
        .with_state(shared)
}
