//! Operator clear end to end: `gpuwatch clear` → `POST /v1/clear` on the local
//! API → `Input::Clear` on the engine thread → answer with the number cleared
//! (regression, issue 3: `Engine::clear` had no caller).

use crate::engine_support::*;
use gpuwatch::api::{self, ApiState};
use gpuwatch::pipeline::Liveness;
use gpuwatch_core::msg::Input;
use gpuwatch_proto::{NodeHealth, Verdict};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
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
fn gpuwatch_clear_reaches_the_engine_through_the_api() {
    let rig = Rig::new(None, "boot-a");
    let registry = Arc::clone(&rig.registry);
    let (tx, rx) = crossbeam_channel::bounded::<Input>(64);
    let (health_tx, health_rx) = tokio::sync::watch::channel(rig.engine.health());
    let shutdown = Arc::new(AtomicBool::new(false));
    let engine = {
        let shutdown = Arc::clone(&shutdown);
        let engine = rig.engine;
        std::thread::spawn(move || {
            gpuwatch_core::engine::run_engine(
                engine,
                rx,
                Vec::new(),
                move |h| {
                    health_tx.send_replace(h);
                },
                shutdown,
            )
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
    let listener = rt.block_on(api::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let state = ApiState {
        registry,
        liveness: Liveness::new(),
        metrics: None,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(api::serve_with_control(
        listener,
        state,
        Some(tx.clone()),
        async {
            let _ = stop_rx.await;
        },
    ));

    // One GPU, by index.
    let out = gpuwatch(&[
        "clear",
        "--api",
        &addr,
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
    let out = gpuwatch(&["clear", "--api", &addr]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reason"));

    // Everything.
    let out = gpuwatch(&["clear", "--api", &addr, "--reason", "fleet maintenance"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Cleared 1 active fault(s)."));
    wait_for(&health_rx, "healthy", |h| h.verdict() == Verdict::Healthy);

    stop_tx.send(()).unwrap();
    rt.block_on(server).unwrap().unwrap();
    // No agent listening: a clear error, not a hang.
    let out = gpuwatch(&["clear", "--api", &addr, "--reason", "x"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the gpuwatch API"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    drop(tx);
    engine.join().unwrap();
}
