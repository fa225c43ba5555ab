//! The local HTTP API (axum, on the agent's small tokio runtime).
//!
//! | path | answer |
//! |---|---|
//! | `GET /healthz` | liveness: 200 while the engine and kmsg threads run, else 503; JSON body |
//! | `GET /readyz` | readiness: 200 once state is loaded, the engine runs, and the kmsg source finished its first pass or reported that it cannot read the kernel log (then `/v1/health` says `monitor.kmsg_ok: false`, verdict `unknown`), else 503 |
//! | `GET /v1/health` | the `gpuwatch.v1.NodeHealth` JSON the engine published last |
//! | `GET /metrics` | Prometheus text exposition, when a renderer is installed (`--prometheus`) |
//! | `POST /v1/clear` | operator clear: `{"gpu": "0" \| "GPU-…" \| "0000:3b:00.0" (optional: all), "reason": "…"}`; loopback peers only; answers `{"cleared": N}` once the engine applied it |
//!
//! Default listen address `127.0.0.1:9400`. In Kubernetes the API may listen on
//! `0.0.0.0` for the probes; `/v1/clear` still answers only connections from a
//! loopback address (`kubectl exec … gpuwatch clear`), 403 otherwise.

use crate::pipeline::Liveness;
use axum::extract::{ConnectInfo, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use gpuwatch_core::Registry;
use gpuwatch_core::msg::Input;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Renders the Prometheus text exposition (installed by whoever wires the
/// Prometheus renderer into `run`).
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// Errors of the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The listen address is not an address.
    #[error("invalid API listen address {addr:?}: {source}")]
    Address {
        /// What was given.
        addr: String,
        /// The parse error.
        #[source]
        source: std::net::AddrParseError,
    },
    /// The socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The server stopped with an error.
    #[error("API server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// What the handlers read.
#[derive(Clone)]
pub struct ApiState {
    /// Metrics and the latest node health.
    pub registry: Arc<Registry>,
    /// Thread liveness and readiness.
    pub liveness: Arc<Liveness>,
    /// `/metrics` renderer; `None` answers 404.
    pub metrics: Option<MetricsRenderer>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("liveness", &self.liveness)
            .field("metrics", &self.metrics.is_some())
            .finish_non_exhaustive()
    }
}

/// The health engine's input channel, for operator clears (`POST /v1/clear`).
pub type EngineControl = crossbeam_channel::Sender<Input>;

/// The engine channel as the clear handler sees it (`None`: not wired).
#[derive(Clone, Debug)]
struct Control(Option<EngineControl>);

/// The routes. Without an engine channel, `POST /v1/clear` answers 503.
pub fn router(state: ApiState) -> Router {
    router_with_control(state, None)
}

/// The routes, with `POST /v1/clear` forwarding to the engine through `control`.
pub fn router_with_control(state: ApiState, control: Option<EngineControl>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/clear", post(clear))
        .layer(Extension(Control(control)))
        .with_state(state)
}

/// Binds the listen address (`host:port`; port 0 picks a free one).
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, ApiError> {
    let sock: SocketAddr = addr.parse().map_err(|source| ApiError::Address {
        addr: addr.to_string(),
        source,
    })?;
    tokio::net::TcpListener::bind(sock)
        .await
        .map_err(|source| ApiError::Bind { addr: sock, source })
}

/// Serves until `shutdown` completes (`POST /v1/clear` answers 503: use
/// [`serve_with_control`] to enable it).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    serve_with_control(listener, state, None, shutdown).await
}

/// Serves until `shutdown` completes; `POST /v1/clear` forwards operator clears
/// to the engine through `control`. The server holds `control` until it stops.
pub async fn serve_with_control(
    listener: tokio::net::TcpListener,
    state: ApiState,
    control: Option<EngineControl>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    let app =
        router_with_control(state, control).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(ApiError::Serve)
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

async fn healthz(State(s): State<ApiState>) -> Response {
    let l = &s.liveness;
    let engine = l.engine_alive.load(Ordering::Relaxed);
    let kmsg = l.kmsg_alive.load(Ordering::Relaxed);
    let status = if engine && kmsg {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(
        status,
        serde_json::json!({
            "alive": engine && kmsg,
            "engine_thread": engine,
            "kmsg_thread": kmsg,
            "kmsg_heartbeat_unix_secs": l.kmsg_heartbeat_unix_secs.load(Ordering::Relaxed),
        }),
    )
}

async fn readyz(State(s): State<ApiState>) -> Response {
    let l = &s.liveness;
    let ready = l.ready();
    json_response(
        if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        serde_json::json!({
            "ready": ready,
            "alive": l.alive(),
            "state_loaded": l.state_loaded.load(Ordering::Relaxed),
            "kmsg_caught_up": l.kmsg_caught_up.load(Ordering::Relaxed),
            "kmsg_unavailable": l.kmsg_unavailable.load(Ordering::Relaxed),
        }),
    )
}

async fn health(State(s): State<ApiState>) -> Response {
    let h = s.registry.health();
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

/// True for connections from this host's loopback (IPv4, IPv6, IPv4-mapped).
fn is_local_peer(peer: &SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

async fn clear(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(control): Extension<Control>,
    body: axum::body::Bytes,
) -> Response {
    if !is_local_peer(&peer) {
        tracing::warn!(peer = %peer, "Operator clear refused: not from a loopback address.");
        return error_response(
            StatusCode::FORBIDDEN,
            "operator clear is accepted only from a loopback address (run `gpuwatch clear` on the node)",
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
    tracing::info!(peer = %peer, gpu = gpu.as_deref().unwrap_or("all"), reason = %reason, "Operator clear requested.");
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
            let (body, encoding) = gpuwatch_sinks::prometheus::encode(render(), accept);
            let mut response = (
                StatusCode::OK,
                [
                    (
                        header::CONTENT_TYPE,
                        gpuwatch_sinks::prometheus::CONTENT_TYPE,
                    ),
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
    use crate::pipeline::AliveGuard;
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
        let registry = Registry::new();
        let liveness = Liveness::new();
        let mut h = NodeHealth {
            node_name: "n1".into(),
            ..Default::default()
        };
        h.set_verdict(Verdict::Healthy);
        registry.set_health(Arc::new(h));
        let state = ApiState {
            registry: registry.clone(),
            liveness: liveness.clone(),
            metrics: Some(Arc::new(|| "gpuwatch_up 1\n".to_string())),
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
            let _e = AliveGuard::set(&liveness.engine_alive);
            let _k = AliveGuard::set(&liveness.kmsg_alive);
            assert_eq!(get(addr, "/healthz").0, 200);
            assert_eq!(get(addr, "/readyz").0, 503);
            liveness.state_loaded.store(true, Ordering::Relaxed);
            assert_eq!(get(addr, "/readyz").0, 503, "first kmsg pass not done");
            // The kernel log cannot be read: ready, and the body says why.
            liveness.kmsg_unavailable.store(true, Ordering::Relaxed);
            let (code, body) = get(addr, "/readyz");
            assert_eq!(code, 200, "{body}");
            assert!(body.contains("\"kmsg_unavailable\":true"), "{body}");
            liveness.kmsg_unavailable.store(false, Ordering::Relaxed);
            liveness.kmsg_caught_up.store(true, Ordering::Relaxed);
            let (code, body) = get(addr, "/readyz");
            assert_eq!(code, 200, "{body}");
        }
        let (code, body) = get(addr, "/v1/health");
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["node_name"], "n1");
        assert_eq!(v["verdict"], "healthy");
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

    #[test]
    fn only_loopback_peers_may_clear() {
        for ok in ["127.0.0.1:1", "[::1]:1", "[::ffff:127.0.0.1]:1"] {
            assert!(is_local_peer(&ok.parse().unwrap()), "{ok}");
        }
        for bad in [
            "10.0.0.7:1",
            "[fd00::1]:1",
            "[::ffff:10.0.0.7]:1",
            "0.0.0.0:1",
        ] {
            assert!(!is_local_peer(&bad.parse().unwrap()), "{bad}");
        }
    }

    #[test]
    fn clear_is_forwarded_to_the_engine_and_answers_its_count() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let state = ApiState {
            registry: Registry::new(),
            liveness: Liveness::new(),
            metrics: None,
        };
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
        let server = rt.spawn(serve_with_control(
            listener,
            state.clone(),
            Some(tx),
            async {
                let _ = stop_rx.await;
            },
        ));

        let (code, body) = post(
            addr,
            "/v1/clear",
            r#"{"gpu": " 0000:3b:00.0 ", "reason": "RMA done, ticket 42"}"#,
        );
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["cleared"], 3);
        let (code, body) = post(addr, "/v1/clear", r#"{"reason": "fleet reset"}"#);
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
            let (code, body) = post(addr, "/v1/clear", bad);
            assert_eq!(code, 400, "{bad}: {body}");
        }
        assert_eq!(get(addr, "/v1/clear").0, 405);
        stop_tx.send(()).unwrap();
        rt.block_on(server).unwrap().unwrap();
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

        // Without an engine channel the endpoint says so.
        let listener = rt.block_on(bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = rt.spawn(serve(listener, state, async {
            let _ = stop_rx.await;
        }));
        assert_eq!(post(addr, "/v1/clear", r#"{"reason": "x"}"#).0, 503);
        stop_tx.send(()).unwrap();
        rt.block_on(server).unwrap().unwrap();
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
