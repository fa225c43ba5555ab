//! Operator clear end to end: `gpuwatch clear` → `POST /v1/clear` on the
//! operator-clear Unix socket in the state directory → `Input::Clear` on the
//! engine thread → answer with the number cleared. Over TCP (what a sibling
//! container or `kubectl port-forward` reaches) the clear is refused.

use crate::engine_support::*;
use gpuwatch::Liveness;
use gpuwatch::{AgentStatus, ApiState};
use gpuwatch_core::msg::Input;
use gpuwatch_proto::{NodeHealth, Verdict};
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

#[test]
fn gpuwatch_clear_reaches_the_engine_only_through_the_state_dir_socket() {
    let rig = Rig::new(None, "boot-a");
    let registry = Arc::clone(&rig.registry);
    let (tx, rx) = crossbeam_channel::bounded::<Input>(64);
    let (health_tx, health_rx) = tokio::sync::watch::channel(rig.engine.health());
    registry.add_health_observer(Box::new(move |_, h| {
        health_tx.send_replace(Arc::clone(h));
    }));
    let shutdown = gpuwatch_core::Shutdown::new();
    let engine = {
        let shutdown = shutdown.clone();
        let engine = rig.engine;
        std::thread::spawn(move || {
            gpuwatch_core::engine::run_engine(engine, rx, Vec::new(), shutdown)
        })
    };
    tx.send(Input::Samples {
        samples: two_gpus(),
        complete: true,
    })
    .unwrap();
    for (code, pci) in [(79, PCI0), (13, PCI0), (79, PCI1)] {
        tx.send(Input::Fault {
            event: xid(code, pci),
            read_at: Instant::now(),
        })
        .unwrap();
    }
    wait_for(&health_rx, "three active faults", |h| {
        h.gpus.iter().map(|g| g.active_faults.len()).sum::<usize>() == 3
    });

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
    let server = rt.spawn(gpuwatch::serve_api(
        listener,
        state,
        Some(gpuwatch::ClearSocket {
            path: socket.clone(),
            engine: tx.clone(),
        }),
        async {
            let _ = stop_rx.await;
        },
    ));
    let t0 = Instant::now();
    while !socket.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "socket never appeared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let config = config.to_str().unwrap();
    let socket_arg = socket.to_str().unwrap();

    // Over TCP (a sibling container, a port-forward): refused, nothing cleared.
    let refused = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
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
    // Another user (a container running as someone else) cannot open the
    // owner-only socket.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["clear", "--socket", socket_arg, "--reason", "not mine"])
        .output()
        .expect("run setpriv");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the gpuwatch agent"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A container without the state directory has no socket to find.
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
    assert_eq!(
        health_rx
            .borrow()
            .gpus
            .iter()
            .map(|g| g.active_faults.len())
            .sum::<usize>(),
        3,
        "nothing cleared"
    );

    // One GPU, by index, finding the socket through the agent's config.
    let out = gpuwatch(&[
        "clear",
        "--config",
        config,
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
    wait_for(&health_rx, "GPU 0 cleared", |h| {
        h.gpus
            .iter()
            .find(|g| g.pci_address == PCI0)
            .is_some_and(|g| g.active_faults.is_empty())
    });
    assert_eq!(
        health_rx.borrow().verdict(),
        Verdict::Unhealthy,
        "GPU 1 still faulty"
    );

    // The reason is mandatory.
    let out = gpuwatch(&["clear", "--socket", socket_arg]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reason"));

    // Everything, by socket path.
    let out = gpuwatch(&[
        "clear",
        "--socket",
        socket_arg,
        "--reason",
        "fleet maintenance",
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Cleared 1 active fault(s)."));
    wait_for(&health_rx, "healthy", |h| h.verdict() == Verdict::Healthy);

    stop_tx.send(()).unwrap();
    rt.block_on(server).unwrap().unwrap();
    // No agent listening: a clear error, not a hang.
    let out = gpuwatch(&["clear", "--config", config, "--reason", "x"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the gpuwatch agent"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    drop(tx);
    engine.join().unwrap();
}
