//! The local HTTP API (axum, on the agent's small tokio runtime).
//!
//! Over TCP (`api.listen`), read-only:
//!
//! | path | answer |
//! |---|---|
//! | `GET /healthz` | liveness: 200 while the engine and kmsg threads run and make progress (`PROGRESS_DEADLINE`; the NVML sources within their call deadline), else 503; JSON body |
//! | `GET /readyz` | readiness: 200 once the engine thread runs (it loaded the persisted state before it started), and the kmsg source finished its first pass or reported that it cannot read the kernel log (as the engine's monitor status says; `kmsg`: `not_reported`, `reading`, `caught_up` or `unavailable`, then `/v1/health` lists the `kmsg` input `down`, verdict `unknown`), and while the fleet quarantine budget works (`quarantine_budget_unavailable`; `/v1/health` `quarantine` says why), else 503; `not_ready` lists why not |
//! | `GET /v1/health` | the `gpuwatch.v1.NodeHealth` JSON the engine published last, with the Kubernetes writer's quarantine status and condition holds |
//! | `GET /metrics` | Prometheus text exposition, when a renderer is installed (`--prometheus`) |
//! | `POST /v1/clear` | 405, with a hint to use `gpuwatch clear` |
//!
//! Loopback is not a trust boundary in a pod: `kubectl port-forward` and every
//! sibling container (the dcgm-exporter sidecar) reach the pod's 127.0.0.1. So
//! nothing on TCP changes state. The TCP side is also hardened against clients
//! that hold connections open: a request's header must arrive within
//! [`ApiLimits::header_read_timeout`], at most [`ApiLimits::max_connections`]
//! are served at once (the rest wait in the listen backlog, holding no file
//! descriptor of ours), and a request's header and body are capped at
//! [`ApiLimits::max_request_bytes`] (431 / 413).
//!
//! The operator clear is served on a Unix socket in the state directory
//! ([`CLEAR_SOCKET`], mode 0600), reachable only by whoever can open that
//! directory — in Kubernetes, `kubectl exec` into the gpuwatch container:
//!
//! | path | answer |
//! |---|---|
//! | `POST /v1/clear` | `{"gpu": "0" \| "GPU-…" \| "0000:3b:00.0" (optional: all), "reason": "…"}` with `Content-Type: application/json`; answers `{"cleared": N}` once the engine applied it |

use crate::status::AgentStatus;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use gpuwatch_core::msg::Input;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// File name of the operator-clear socket in the state directory.
pub(crate) const CLEAR_SOCKET: &str = "gpuwatch.sock";

/// The operator-clear socket of an agent whose state directory is `state_dir`.
pub fn clear_socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(CLEAR_SOCKET)
}

/// Limits on the TCP side of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ApiLimits {
    /// A request's header (the first one on a connection, or the next one after
    /// a response) must be complete within this time; the connection is closed
    /// otherwise. Also the idle time of a kept-alive connection.
    pub header_read_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Largest request header, and largest declared body, in bytes.
    pub max_request_bytes: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            header_read_timeout: Duration::from_secs(5),
            // The probes, a Prometheus scrape and a person: a handful at most.
            max_connections: 64,
            max_request_bytes: 16 * 1024,
        }
    }
}

/// Renders the Prometheus exposition in the format the scraper asked for
/// (installed by whoever wires the Prometheus renderer into `run`).
pub(crate) type MetricsRenderer =
    Arc<dyn Fn(gpuwatch_sinks::prometheus::Format) -> String + Send + Sync>;

/// Errors of the local API server (the HTTP listener and the operator-clear socket).
#[derive(Debug, thiserror::Error)]
pub enum LocalApiError {
    /// The listen address is not an address.
    #[error("invalid API listen address {addr:?}: {source}")]
    Address {
        /// `api.listen` as given.
        addr: String,
        /// Why it is not `host:port`.
        #[source]
        source: std::net::AddrParseError,
    },
    /// The socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The parsed `api.listen`.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The server stopped with an error.
    #[error("API server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// The operator-clear socket could not be created.
    #[error("cannot serve the operator-clear socket {path}: {source}")]
    Socket {
        /// [`CLEAR_SOCKET`] in the state directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What the handlers read.
#[derive(Clone)]
pub struct ApiState {
    /// What `/healthz`, `/readyz` and `/v1/health` show.
    pub status: AgentStatus,
    /// `/metrics` renderer; `None` answers 404.
    pub metrics: Option<MetricsRenderer>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("status", &self.status)
            .field("metrics", &self.metrics.is_some())
            .finish_non_exhaustive()
    }
}

/// The health engine's input channel, for operator clears.
pub(crate) type EngineControl = crossbeam_channel::Sender<Input>;

/// The engine channel as the clear handler sees it (`None`: not wired).
#[derive(Clone, Debug)]
struct Control(Option<EngineControl>);

/// Where operator clears are served: the Unix socket at `path`, forwarding to
/// the engine through `engine`.
#[derive(Debug, Clone)]
pub struct ClearSocket {
    /// The socket path (see [`clear_socket_path`]).
    pub path: PathBuf,
    /// The health engine's input channel.
    pub engine: EngineControl,
}

/// The read-only TCP routes.
pub(crate) fn router(state: ApiState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/clear", axum::routing::any(clear_over_tcp))
        .with_state(state)
}

/// The routes of the operator-clear socket: `POST /v1/clear` forwarding to
/// the engine through `control` (503 without one) and `GET /v1/health`.
pub(crate) fn clear_router(state: ApiState, control: Option<EngineControl>) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/clear", post(clear))
        .layer(DefaultBodyLimit::max(
            ApiLimits::default().max_request_bytes,
        ))
        .layer(Extension(Control(control)))
        .with_state(state)
}

/// Binds the listen address (`host:port`; port 0 picks a free one).
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, LocalApiError> {
    let sock: SocketAddr = addr.parse().map_err(|source| LocalApiError::Address {
        addr: addr.to_string(),
        source,
    })?;
    tokio::net::TcpListener::bind(sock)
        .await
        .map_err(|source| LocalApiError::Bind { addr: sock, source })
}

/// Creates the operator-clear socket at `path`, readable and writable by its
/// owner only (0600). A stale socket left by an earlier process is replaced;
/// any other file there is an error (never removed).
pub(crate) fn bind_clear_socket(path: &Path) -> Result<tokio::net::UnixListener, LocalApiError> {
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
    let err = |source| LocalApiError::Socket {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(err)?,
        Ok(_) => {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(listener)
}

/// Serves the read-only API until `shutdown` completes, with default limits.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), LocalApiError> {
    serve_with_limits(listener, state, ApiLimits::default(), shutdown).await
}

/// Serves the read-only API on TCP and, with `clear`, the operator-clear socket,
/// until `shutdown` completes (then the socket file is removed). A socket that
/// cannot be created is logged and the TCP side still served. The server holds
/// the engine channel until it stops.
pub async fn serve_with_control(
    listener: tokio::net::TcpListener,
    state: ApiState,
    clear: Option<ClearSocket>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), LocalApiError> {
    let Some(clear) = clear else {
        return serve(listener, state, shutdown).await;
    };
    let unix = match bind_clear_socket(&clear.path) {
        Ok(u) => u,
        Err(e) => {
            // The probes and metrics must not go down with the socket: serve
            // TCP and say why `gpuwatch clear` cannot work.
            tracing::error!(error = %e, "Operator clear is unavailable; serving the read-only API only.");
            return serve(listener, state, shutdown).await;
        }
    };
    tracing::info!(path = %clear.path.display(), "Operator-clear socket listening.");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let socket_app = clear_router(state.clone(), Some(clear.engine));
    let socket_stop = stopped(stop_rx.clone());
    let socket_task = tokio::spawn(async move {
        axum::serve(unix, socket_app)
            .with_graceful_shutdown(socket_stop)
            .await
    });
    let tcp = tokio::spawn(serve_with_limits(
        listener,
        state,
        ApiLimits::default(),
        stopped(stop_rx),
    ));
    shutdown.await;
    let _ = stop_tx.send(true);
    let tcp = tcp.await;
    let unix = socket_task.await;
    let _ = std::fs::remove_file(&clear.path);
    tcp.map_err(|e| LocalApiError::Serve(std::io::Error::other(e)))??;
    unix.map_err(|e| LocalApiError::Serve(std::io::Error::other(e)))?
        .map_err(LocalApiError::Serve)
}

/// Serves the read-only API with `limits` until `shutdown` completes.
pub(crate) async fn serve_with_limits(
    listener: tokio::net::TcpListener,
    state: ApiState,
    limits: ApiLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), LocalApiError> {
    let max = limits.max_request_bytes;
    let app = router(state).layer(axum::middleware::from_fn(
        move |headers: HeaderMap, req: axum::extract::Request, next: axum::middleware::Next| async move {
            let declared = headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > max as u64) {
                return error_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request bodies are limited to {max} bytes"),
                );
            }
            next.run(req).await
        },
    ));
    serve_connections(listener, app, limits, shutdown).await;
    Ok(())
}

/// The smallest read buffer hyper accepts; a smaller `max_request_bytes`
/// caps the header at this instead.
const MIN_HEADER_BUFFER: usize = 8 * 1024;

/// Accepts connections while fewer than `max_connections` are open (the
/// rest wait in the listen backlog, holding no file descriptor of ours) and
/// serves each over HTTP/1 with hyper's own header limits: the header of
/// every request, the first and each one after a response, must arrive
/// within `header_read_timeout` (else the connection is closed unanswered)
/// and fit in `max_request_bytes` (else 431). On `shutdown`, stops
/// accepting, closes idle connections and waits for the answers in flight.
async fn serve_connections(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ApiLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_request_bytes.max(MIN_HEADER_BUFFER));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = accept_within(&listener, &permits) => accepted,
        };
        let Some((io, permit)) = accepted else {
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(hyper_util::rt::TokioIo::new(io), service));
        tokio::spawn(async move {
            // A client that hangs up or times out is not the server's error.
            let _ = conn.await;
            drop(permit);
        });
    }
    graceful.shutdown().await;
}

/// Waits for a free connection permit, then for a connection. An accept
/// error (out of file descriptors) pauses accepting for a moment.
async fn accept_within(
    listener: &tokio::net::TcpListener,
    permits: &Arc<Semaphore>,
) -> Option<(tokio::net::TcpStream, OwnedSemaphorePermit)> {
    let permit = permits
        .clone()
        .acquire_owned()
        .await
        .expect("the semaphore is never closed");
    match listener.accept().await {
        Ok((io, _)) => Some((io, permit)),
        Err(e) => {
            tracing::warn!(error = %e, "The API cannot accept a connection; pausing.");
            tokio::time::sleep(Duration::from_millis(500)).await;
            None
        }
    }
}

async fn clear_over_tcp() -> Response {
    let mut r = error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "the TCP API is read-only: run `gpuwatch clear --reason TEXT` inside the gpuwatch container (kubectl exec); it talks to the Unix socket in the state directory",
    );
    // No method changes state here (RFC 9110: an empty Allow means none).
    r.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(""));
    r
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// Unix seconds now, the clock of the threads' heartbeats.
fn now_unix_secs() -> u64 {
    gpuwatch_core::clock::unix_nanos(std::time::SystemTime::now()) / 1_000_000_000
}

async fn healthz(State(s): State<ApiState>) -> Response {
    let l = s.status.liveness(now_unix_secs());
    let alive = l.alive();
    let status = if alive {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(
        status,
        serde_json::json!({
            "alive": alive,
            "engine_thread": l.engine_alive,
            "kmsg_thread": l.kmsg_alive,
            "stalled": l.stalled,
            "kmsg_heartbeat_unix_secs": l.kmsg_heartbeat_unix_secs,
            "engine_heartbeat_unix_secs": l.engine_heartbeat_unix_secs,
        }),
    )
}

async fn readyz(State(s): State<ApiState>) -> Response {
    let r = s.status.readiness(now_unix_secs());
    let not_ready: Vec<&str> = r.not_ready().into_iter().map(|n| n.as_str()).collect();
    let ready = r.ready();
    let l = &r.liveness;
    json_response(
        if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        serde_json::json!({
            "ready": ready,
            "not_ready": not_ready,
            "alive": l.threads_running(),
            "kmsg": r.kmsg.as_str(),
            "quarantine_budget_unavailable": r.quarantine_budget_unavailable,
        }),
    )
}

async fn health(State(s): State<ApiState>) -> Response {
    let h = s.status.health();
    match serde_json::to_value(&*h) {
        Ok(v) => json_response(StatusCode::OK, v),
        Err(e) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({ "error": e.to_string() }),
        ),
    }
}

/// Body of `POST /v1/clear`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ClearRequest {
    /// GPU index, UUID or PCI address; absent: every GPU and the node.
    #[serde(default)]
    gpu: Option<String>,
    /// Why the operator clears (mandatory, logged with every cleared fault).
    reason: String,
}

/// How long a clear waits for room in the engine channel and for the answer.
const CLEAR_SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
const CLEAR_REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn error_response(status: StatusCode, msg: impl Into<String>) -> Response {
    json_response(status, serde_json::json!({ "error": msg.into() }))
}

async fn clear(
    Extension(control): Extension<Control>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "operator clear takes Content-Type: application/json",
        );
    }
    let req: ClearRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                format!(
                    "expected {{\"gpu\": \"<index|UUID|PCI>\" (optional), \"reason\": \"<text>\"}}: {e}"
                ),
            );
        }
    };
    let reason = req.reason.trim().to_string();
    if reason.is_empty() {
        return error_response(StatusCode::BAD_REQUEST, "reason: must not be empty");
    }
    let gpu = req
        .gpu
        .map(|g| g.trim().to_string())
        .filter(|g| !g.is_empty());
    let Some(tx) = control.0 else {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "operator clear is not available in this process",
        );
    };
    tracing::info!(gpu = gpu.as_deref().unwrap_or("all"), reason = %reason, "Operator clear requested.");
    let (reply_tx, reply_rx) = crossbeam_channel::bounded(1);
    let input = Input::Clear {
        gpu: gpu.clone(),
        reason: reason.clone(),
        reply: Some(reply_tx),
    };
    let outcome = tokio::task::spawn_blocking(move || {
        tx.send_timeout(input, CLEAR_SEND_TIMEOUT).map_err(|_| {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the health engine is busy or stopped",
            )
        })?;
        reply_rx.recv_timeout(CLEAR_REPLY_TIMEOUT).map_err(|_| {
            (
                StatusCode::GATEWAY_TIMEOUT,
                "the health engine did not answer in time",
            )
        })
    })
    .await;
    match outcome {
        Ok(Ok(cleared)) => json_response(
            StatusCode::OK,
            serde_json::json!({ "cleared": cleared, "gpu": gpu, "reason": reason }),
        ),
        Ok(Err((status, msg))) => error_response(status, msg),
        Err(e) => error_response(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn metrics(State(s): State<ApiState>, headers: axum::http::HeaderMap) -> Response {
    match &s.metrics {
        Some(render) => {
            let accept = headers
                .get(header::ACCEPT_ENCODING)
                .and_then(|v| v.to_str().ok());
            // OpenMetrics when the scraper asks for it (counters' `_created`).
            let format = gpuwatch_sinks::prometheus::Format::negotiate(
                headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()),
            );
            let (body, encoding) = gpuwatch_sinks::prometheus::encode(render(format), accept);
            let mut response = (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, format.content_type()),
                    (header::VARY, "Accept-Encoding"),
                ],
                body,
            )
                .into_response();
            if let Some(e) = encoding.header() {
                response.headers_mut().insert(
                    header::CONTENT_ENCODING,
                    header::HeaderValue::from_static(e),
                );
            }
            response
        }
        None => (
            StatusCode::NOT_FOUND,
            "Prometheus endpoint disabled; start gpuwatch with --prometheus.\n",
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::liveness::Liveness;
    use gpuwatch_core::Registry;
    use gpuwatch_core::msg::{Input, MonitorInput};
    use gpuwatch_proto::{NodeHealth, Verdict};
    use std::io::{Read, Write};

    /// Minimal HTTP/1.1 GET over a std socket (no client dependency).
    fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    }

    #[test]
    fn endpoints_answer_with_status_and_json() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut rig = gpuwatch_test_support::engine::Rig::new(None, "b1");
        let registry = rig.registry.clone();
        let liveness = Liveness::new();
        // What the engine loop does after each input: publish its health.
        let mut engine_input = |input: Input| {
            rig.engine.handle(input);
            registry.set_health(rig.engine.health());
        };
        let kmsg = |ok: bool, message: &str| Input::MonitorStatus {
            input: MonitorInput::Kmsg,
            ok,
            message: message.into(),
        };
        let kube = gpuwatch_kube::KubeMetrics::new();
        let state = ApiState {
            status: AgentStatus::new(registry.clone(), kube.subscribe(), liveness.clone()),
            metrics: Some(Arc::new(|_| "gpuwatch_up 1\n".to_string())),
        };
        let listener = rt.block_on(bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = rt.spawn(serve(listener, state, async {
            let _ = stop_rx.await;
        }));

        let (code, body) = get(addr, "/healthz");
        assert_eq!(code, 503);
        assert!(body.contains("\"alive\":false"), "{body}");
        {
            let _e = liveness.engine_running();
            let _k = liveness.kmsg_running();
            assert_eq!(get(addr, "/healthz").0, 200);
            // Just started: the reader has not reported to the engine yet.
            let (code, body) = get(addr, "/readyz");
            assert_eq!(code, 503, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["kmsg"], "not_reported", "{body}");
            assert_eq!(
                v["not_ready"],
                serde_json::json!(["kernel log reader has not reported yet"]),
                "{body}"
            );
            engine_input(kmsg(true, "reading /dev/kmsg"));
            let (code, body) = get(addr, "/readyz");
            assert_eq!(code, 503, "first kmsg pass not done: {body}");
            assert!(
                body.contains("\"not_ready\":[\"kernel log not caught up yet\"]"),
                "{body}"
            );
            // The kernel log cannot be read: ready, and the body says why.
            engine_input(kmsg(false, "open /dev/kmsg: permission denied"));
            let (code, body) = get(addr, "/readyz");
            assert_eq!(code, 200, "{body}");
            assert!(body.contains("\"kmsg\":\"unavailable\""), "{body}");
            engine_input(kmsg(true, "reading /dev/kmsg"));
            assert_eq!(get(addr, "/readyz").0, 503, "reads again, not caught up");
            engine_input(Input::KmsgCaughtUp);
            let (code, body) = get(addr, "/readyz");
            assert_eq!(code, 200, "{body}");
            assert!(body.contains("\"kmsg\":\"caught_up\""), "{body}");
            // A quarantine budget that cannot work (a Role without Leases)
            // fails readiness, so a rollout of the broken Role stops.
            kube.publish(|s| s.quarantine_unavailable = true);
            let (code, body) = get(addr, "/readyz");
            assert_eq!(code, 503, "{body}");
            assert!(
                body.contains("\"quarantine_budget_unavailable\":true")
                    && body.contains("\"not_ready\":[\"quarantine budget unavailable\"]"),
                "{body}"
            );
            kube.publish(|s| s.quarantine_unavailable = false);
            assert_eq!(get(addr, "/readyz").0, 200);
        }
        let mut h = NodeHealth {
            node_name: "n1".into(),
            ..Default::default()
        };
        h.set_verdict(Verdict::Healthy);
        registry.set_health(Arc::new(h));
        let (code, body) = get(addr, "/v1/health");
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["node_name"], "n1");
        assert_eq!(v["verdict"], "healthy");
        assert!(v.get("condition_holds").is_none(), "none held: left out");
        // A hold the Kubernetes writer published shows beside the health.
        kube.set_condition_holds(vec![gpuwatch_proto::ConditionHold {
            condition: "GPUProblem".into(),
            held_until_unix_nano: 1_800_000_000_000_000_000,
            message: "held until 2027-01-15T08:00:00Z: cleared 3 times within 60 min".into(),
        }]);
        let v: serde_json::Value = serde_json::from_str(&get(addr, "/v1/health").1).unwrap();
        assert_eq!(v["condition_holds"][0]["condition"], "GPUProblem");
        assert_eq!(
            v["condition_holds"][0]["held_until_unix_nano"],
            1_800_000_000_000_000_000u64
        );
        assert!(
            v.get("isolated_devices").is_none(),
            "none isolated: left out"
        );
        assert!(v.get("device_isolation_unavailable").is_none());
        // The devices the writer isolates, and why isolation cannot work.
        kube.publish(|s| {
            s.isolated_devices = vec![gpuwatch_proto::IsolatedDevice {
                device: "gpu-0".into(),
                uuid: "GPU-0".into(),
                rule: "gpuwatch-n1-gpu-0".into(),
                key: "gpuwatch.io/unhealthy".into(),
                value: "reset_gpu".into(),
                effect: "NoSchedule".into(),
            }];
            s.device_isolation_unavailable = Some("forbidden".into());
        });
        let v: serde_json::Value = serde_json::from_str(&get(addr, "/v1/health").1).unwrap();
        assert_eq!(v["isolated_devices"][0]["device"], "gpu-0");
        assert_eq!(v["isolated_devices"][0]["rule"], "gpuwatch-n1-gpu-0");
        assert_eq!(v["isolated_devices"][0]["value"], "reset_gpu");
        assert_eq!(v["device_isolation_unavailable"], "forbidden");
        let (code, body) = get(addr, "/metrics");
        assert_eq!((code, body.as_str()), (200, "gpuwatch_up 1\n"));
        assert_eq!(get(addr, "/nope").0, 404);

        stop_tx.send(()).unwrap();
        rt.block_on(server).unwrap().unwrap();
    }

    /// Minimal HTTP/1.1 POST with a JSON body.
    fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    }

    /// Minimal HTTP/1.1 POST over the operator-clear Unix socket.
    fn post_unix(path: &Path, body: &str, content_type: &str) -> (u16, String) {
        let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
        write!(
            s,
            "POST /v1/clear HTTP/1.1\r\nHost: gpuwatch\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    fn state() -> ApiState {
        ApiState {
            status: AgentStatus::new(
                Registry::new(),
                gpuwatch_kube::KubeMetrics::new().subscribe(),
                Liveness::new(),
            ),
            metrics: None,
        }
    }

    #[test]
    fn clear_goes_over_the_owner_only_socket_and_answers_the_engine_count() {
        use std::os::unix::fs::PermissionsExt as _;
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        let sock = clear_socket_path(dir.path());
        // A stale socket from an earlier process is replaced.
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        // A stand-in engine thread: answers each clear with 3 (one GPU) or 7 (all).
        let (tx, rx) = crossbeam_channel::bounded::<Input>(4);
        let engine = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while let Ok(input) = rx.recv() {
                if let Input::Clear { gpu, reason, reply } = input {
                    let n = if gpu.is_some() { 3 } else { 7 };
                    seen.push((gpu, reason));
                    reply.unwrap().send(n).unwrap();
                }
            }
            seen
        });
        let listener = rt.block_on(bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let clear = ClearSocket {
            path: sock.clone(),
            engine: tx,
        };
        let server = rt.spawn(serve_with_control(listener, state(), Some(clear), async {
            let _ = stop_rx.await;
        }));
        let up = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
        assert!(up, "socket served");
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        let json = "application/json";
        let (code, body) = post_unix(
            &sock,
            r#"{"gpu": " 0000:3b:00.0 ", "reason": "RMA done, ticket 42"}"#,
            json,
        );
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["cleared"], 3);
        let (code, body) = post_unix(
            &sock,
            r#"{"reason": "fleet reset"}"#,
            "application/json; charset=utf-8",
        );
        assert_eq!(
            (
                code,
                serde_json::from_str::<serde_json::Value>(&body).unwrap()["cleared"].clone()
            ),
            (200, 7.into())
        );
        // A reason is mandatory; unknown fields and bad JSON are refused.
        for bad in [
            r#"{"gpu": "0"}"#,
            r#"{"gpu": "0", "reason": "  "}"#,
            r#"{"reason": "x", "force": true}"#,
            "not json",
        ] {
            let (code, body) = post_unix(&sock, bad, json);
            assert_eq!(code, 400, "{bad}: {body}");
        }
        // Only JSON: a form or text body (what a page can send cross-site
        // without a preflight) is refused.
        for ct in ["text/plain", "application/x-www-form-urlencoded"] {
            assert_eq!(post_unix(&sock, r#"{"reason": "x"}"#, ct).0, 415, "{ct}");
        }
        // Over TCP nothing changes state: 405 with a hint, the engine untouched.
        let (code, body) = post(addr, "/v1/clear", r#"{"reason": "from a sidecar"}"#);
        assert_eq!(code, 405, "{body}");
        assert!(body.contains("gpuwatch clear"), "{body}");
        assert_eq!(get(addr, "/v1/clear").0, 405);
        stop_tx.send(()).unwrap();
        rt.block_on(server).unwrap().unwrap();
        assert!(!sock.exists(), "socket removed at shutdown");
        let seen = engine.join().unwrap();
        assert_eq!(
            seen,
            vec![
                (
                    Some("0000:3b:00.0".to_string()),
                    "RMA done, ticket 42".to_string()
                ),
                (None, "fleet reset".to_string())
            ]
        );
    }

    #[test]
    fn clear_socket_never_replaces_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = clear_socket_path(dir.path());
        std::fs::write(&path, "keep me").unwrap();
        let rt = runtime();
        let err = rt.block_on(async { bind_clear_socket(&path).unwrap_err() });
        assert!(err.to_string().contains("not a socket"), "{err:#}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
    }

    #[test]
    fn tcp_is_served_when_the_clear_socket_cannot_be_created() {
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir");
        let listener = rt.block_on(bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, _rx) = crossbeam_channel::bounded::<Input>(1);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let clear = ClearSocket {
            path: clear_socket_path(&missing),
            engine: tx,
        };
        let server = rt.spawn(serve_with_control(listener, state(), Some(clear), async {
            let _ = stop_rx.await;
        }));
        assert_eq!(get(addr, "/v1/health").0, 200);
        stop_tx.send(()).unwrap();
        rt.block_on(server).unwrap().unwrap();
    }

    #[test]
    fn clear_socket_without_an_engine_says_so() {
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        let sock = clear_socket_path(dir.path());
        let listener = rt.block_on(async { bind_clear_socket(&sock).unwrap() });
        let server =
            rt.spawn(async move { axum::serve(listener, clear_router(state(), None)).await });
        assert_eq!(
            post_unix(&sock, r#"{"reason": "x"}"#, "application/json").0,
            503
        );
        server.abort();
    }

    /// Serves the TCP API with `limits`; returns the address and a stopper.
    fn limited(
        rt: &tokio::runtime::Runtime,
        limits: ApiLimits,
    ) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = rt.block_on(bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(serve_with_limits(listener, state(), limits, async {
            let _ = stop_rx.await;
        }));
        (addr, stop_tx)
    }

    #[test]
    fn half_sent_headers_time_out_and_connections_are_capped() {
        let rt = runtime();
        let limits = ApiLimits {
            header_read_timeout: Duration::from_millis(300),
            max_connections: 2,
            ..ApiLimits::default()
        };
        let (addr, stop) = limited(&rt, limits);
        // Two clients take every slot with a header they never finish.
        let mut stalled: Vec<std::net::TcpStream> = (0..2)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        // A third, complete request waits for a slot: it is answered only once
        // the stalled ones have been cut off by the header timeout.
        let t0 = std::time::Instant::now();
        let (code, _) = get(addr, "/healthz");
        let waited = t0.elapsed();
        assert_eq!(code, 503, "answered (liveness not set)");
        assert!(
            waited >= Duration::from_millis(200),
            "not capped: {waited:?}"
        );
        // Below the default 5 s header timeout: the 300 ms one cut them off.
        assert!(waited < Duration::from_secs(4), "{waited:?}");
        for s in &mut stalled {
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let mut buf = Vec::new();
            // Closed by the server, without an answer.
            let _ = s.read_to_end(&mut buf);
            assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf));
        }
        stop.send(()).unwrap();
    }

    #[test]
    fn an_idle_kept_alive_connection_is_closed_after_the_header_timeout() {
        let rt = runtime();
        let limits = ApiLimits {
            header_read_timeout: Duration::from_millis(300),
            ..ApiLimits::default()
        };
        let (addr, stop) = limited(&rt, limits);
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut first = [0u8; 12];
        s.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"HTTP/1.1 200");
        // The connection stays open for a next request; none comes, and the
        // server closes it once the header timeout has passed.
        let t0 = std::time::Instant::now();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        // Below the default 5 s header timeout: the 300 ms one closed it.
        assert!(waited < Duration::from_secs(4), "{waited:?}");
        stop.send(()).unwrap();
    }

    #[test]
    fn oversized_requests_are_refused() {
        let rt = runtime();
        let (addr, stop) = limited(&rt, ApiLimits::default());
        // A header past the limit: 431, and the connection is closed.
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let big = format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(20_000)
        );
        let _ = s.write_all(big.as_bytes());
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        // A declared body past the limit: 413.
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
        // Normal requests are unaffected.
        assert_eq!(get(addr, "/v1/health").0, 200);
        stop.send(()).unwrap();
    }

    #[test]
    fn bad_listen_address_is_a_clear_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt.block_on(bind("localhost-ish")).unwrap_err();
        assert!(err.to_string().contains("localhost-ish"), "{err}");
    }
}
