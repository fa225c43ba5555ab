//! The local HTTP API (axum, on the agent's small tokio runtime).
//!
//! | path | answer |
//! |---|---|
//! | `GET /healthz` | liveness: 200 while the engine and kmsg threads run, else 503; JSON body |
//! | `GET /readyz` | readiness: 200 once state is loaded and the first kmsg pass is done, else 503 |
//! | `GET /v1/health` | the `gpuwatch.v1.NodeHealth` JSON the engine published last |
//! | `GET /metrics` | Prometheus text exposition, when a renderer is installed (`--prometheus`) |
//!
//! Default listen address `127.0.0.1:9400`.

use crate::pipeline::Liveness;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use gpuwatch_sinks::Registry;
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

/// The routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
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

/// Serves until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    axum::serve(listener, router(state))
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

async fn metrics(State(s): State<ApiState>) -> Response {
    match &s.metrics {
        Some(render) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            render(),
        )
            .into_response(),
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
