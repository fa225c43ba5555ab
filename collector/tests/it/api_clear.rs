//! Operator clear end to end: `gpuwatch clear` → `POST /v1/clear` on the
//! operator-clear Unix socket in the state directory → `Input::Clear` on the
//! engine thread → answer with the number cleared. Over TCP (what a sibling
//! container or `kubectl port-forward` reaches) the clear is refused.

use crate::engine_support::*;
use gpuwatch::Liveness;
use gpuwatch::{AgentStatus, ApiState};
use gpuwatch_core::msg::Input;
use gpuwatch_proto::{NodeHealth, Verdict};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn wait_for(
    rx: &tokio::sync::watch::Receiver<Arc<NodeHealth>>,
    what: &str,
    pred: impl Fn(&NodeHealth) -> bool,
) {
    let t0 = Instant::now();
    while !pred(&rx.borrow()) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn gpuwatch(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(args)
        .output()
        .expect("run gpuwatch")
}

/// An engine thread holding three active faults (XID 79 and 13 on GPU 0,
/// XID 79 on GPU 1) behind the local API on TCP and the operator-clear
/// socket in a state directory of its own, whose `gpuwatch.toml` names it.
struct ClearRig {
    health: tokio::sync::watch::Receiver<Arc<NodeHealth>>,
    engine_tx: crossbeam_channel::Sender<Input>,
    engine: std::thread::JoinHandle<()>,
    rt: tokio::runtime::Runtime,
    /// The API server's task; its error as text.
    server: tokio::task::JoinHandle<Result<(), String>>,
    stop_api: Option<tokio::sync::oneshot::Sender<()>>,
    addr: std::net::SocketAddr,
    socket: PathBuf,
    config: PathBuf,
    _state_dir: tempfile::TempDir,
}

impl ClearRig {
    fn start() -> ClearRig {
        let rig = Rig::new(None, "boot-a");
        let registry = Arc::clone(&rig.registry);
        let (engine_tx, rx) = crossbeam_channel::bounded::<Input>(64);
        let (health_tx, health) = tokio::sync::watch::channel(rig.engine.health());
        registry.add_health_observer(Box::new(move |_, h| {
            health_tx.send_replace(Arc::clone(h));
        }));
        let engine = {
            let engine = rig.engine;
            let shutdown = gpuwatch_core::Shutdown::new();
            std::thread::spawn(move || {
                gpuwatch_core::engine::run_engine(engine, rx, Vec::new(), shutdown)
            })
        };
        engine_tx
            .send(Input::Samples {
                samples: two_gpus(),
                complete: true,
            })
            .unwrap();
        for (code, pci) in [(79, PCI0), (13, PCI0), (79, PCI1)] {
            engine_tx
                .send(Input::Fault {
                    event: xid(code, pci),
                    read_at: Instant::now(),
                })
                .unwrap();
        }
        wait_for(&health, "three active faults", |h| active_faults(h) == 3);

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt.block_on(gpuwatch::bind_api("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let state_dir = tempfile::tempdir().unwrap();
        let socket = gpuwatch::clear_socket_path(state_dir.path());
        let config = state_dir.path().join("gpuwatch.toml");
        std::fs::write(
            &config,
            format!("state_dir = {:?}\n", state_dir.path().display().to_string()),
        )
        .unwrap();
        let state = ApiState {
            status: AgentStatus::new(
                registry,
                gpuwatch_kube::KubeMetrics::new().subscribe(),
                Liveness::new(),
            ),
            metrics: None,
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serve = gpuwatch::serve_api(
            listener,
            state,
            Some(gpuwatch::ClearSocket {
                path: socket.clone(),
                engine: engine_tx.clone(),
            }),
            async {
                let _ = stop_rx.await;
            },
        );
        let server = rt.spawn(async move { serve.await.map_err(|e| e.to_string()) });
        let t0 = Instant::now();
        while !socket.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "socket never appeared"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        ClearRig {
            health,
            engine_tx,
            engine,
            rt,
            server,
            stop_api: Some(stop_tx),
            addr,
            socket,
            config,
            _state_dir: state_dir,
        }
    }

    fn socket(&self) -> &str {
        self.socket.to_str().unwrap()
    }

    fn config(&self) -> &str {
        self.config.to_str().unwrap()
    }

    /// The active faults the engine last published.
    fn active_faults(&self) -> usize {
        active_faults(&self.health.borrow())
    }

    /// Stops the API server (it must end without an error), then the engine
    /// (its input channel closes).
    fn stop(mut self) {
        if let Some(stop) = self.stop_api.take() {
            stop.send(()).unwrap();
            self.rt.block_on(&mut self.server).unwrap().unwrap();
        }
        drop(self.engine_tx);
        self.engine.join().unwrap();
    }

    /// Stops the API server only, the engine still running.
    fn stop_api(&mut self) {
        self.stop_api.take().unwrap().send(()).unwrap();
        self.rt.block_on(&mut self.server).unwrap().unwrap();
    }
}

fn active_faults(h: &NodeHealth) -> usize {
    h.gpus.iter().map(|g| g.active_faults.len()).sum()
}

/// Over TCP (what a sibling container or a port-forward reaches) `POST
/// /v1/clear` is refused, pointing at `gpuwatch clear`, and clears nothing.
#[test]
fn a_clear_over_tcp_is_refused_and_clears_nothing() {
    let rig = ClearRig::start();
    let refused = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(rig.addr).unwrap();
        let body = r#"{"reason": "from the sidecar"}"#;
        write!(
            s,
            "POST /v1/clear HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(refused.starts_with("HTTP/1.1 405"), "{refused}");
    assert!(refused.contains("gpuwatch clear"), "{refused}");
    assert_eq!(rig.active_faults(), 3, "nothing cleared");
    rig.stop();
}

/// Another user (a container running as someone else) cannot open the
/// owner-only socket: `gpuwatch clear` fails and clears nothing.
#[test]
fn another_user_cannot_clear_through_the_owner_only_socket() {
    let rig = ClearRig::start();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["clear", "--socket", rig.socket(), "--reason", "not mine"])
        .output()
        .expect("run setpriv");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the gpuwatch agent"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rig.active_faults(), 3, "nothing cleared");
    rig.stop();
}

/// A container without the state directory has no socket to find: the
/// clear fails and clears nothing.
#[test]
fn a_clear_without_the_state_dir_socket_fails() {
    let rig = ClearRig::start();
    let elsewhere = tempfile::tempdir().unwrap();
    let other_socket = gpuwatch::clear_socket_path(elsewhere.path());
    let out = gpuwatch(&[
        "clear",
        "--socket",
        other_socket.to_str().unwrap(),
        "--reason",
        "x",
    ]);
    assert!(!out.status.success());
    assert_eq!(rig.active_faults(), 3, "nothing cleared");
    rig.stop();
}

/// `gpuwatch clear --gpu 0` finds the socket through the agent's config and
/// clears GPU 0's two faults, GPU 1's fault stays.
#[test]
fn gpuwatch_clear_of_one_gpu_finds_the_socket_through_the_config() {
    let rig = ClearRig::start();
    let out = gpuwatch(&[
        "clear",
        "--config",
        rig.config(),
        "--gpu",
        "0",
        "--reason",
        "GPU 0 reseated, ticket 42",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Cleared 2 active fault(s) of GPU 0"),
        "{stdout}"
    );
    wait_for(&rig.health, "GPU 0 cleared", |h| {
        h.gpus
            .iter()
            .find(|g| g.pci_address == PCI0)
            .is_some_and(|g| g.active_faults.is_empty())
    });
    assert_eq!(
        rig.health.borrow().verdict(),
        Verdict::Unhealthy,
        "GPU 1 still faulty"
    );
    rig.stop();
}

/// The reason is mandatory.
#[test]
fn gpuwatch_clear_without_a_reason_is_refused() {
    let rig = ClearRig::start();
    let out = gpuwatch(&["clear", "--socket", rig.socket()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reason"));
    assert_eq!(rig.active_faults(), 3, "nothing cleared");
    rig.stop();
}

/// Without `--gpu`, by socket path: every active fault is cleared.
#[test]
fn gpuwatch_clear_by_socket_path_clears_everything() {
    let rig = ClearRig::start();
    let out = gpuwatch(&[
        "clear",
        "--socket",
        rig.socket(),
        "--reason",
        "fleet maintenance",
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Cleared 3 active fault(s)."));
    wait_for(&rig.health, "healthy", |h| h.verdict() == Verdict::Healthy);
    rig.stop();
}

/// No agent listening on the socket the config names: a clear error, not a
/// hang.
#[test]
fn gpuwatch_clear_with_no_agent_listening_says_so() {
    let mut rig = ClearRig::start();
    rig.stop_api();
    let out = gpuwatch(&["clear", "--config", rig.config(), "--reason", "x"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the gpuwatch agent"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rig.stop();
}
