//! The engine thread loop: events to sinks, health published only on change,
//! state flushed and sinks flushed on exit.

use crate::support::*;
use gpuwatch_core::EventSink;
use gpuwatch_core::engine::{STATE_FILE, run_engine};
use gpuwatch_core::msg::Input;
use gpuwatch_proto::{FaultEvent, NodeHealth, Verdict};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Collect {
    events: Mutex<Vec<FaultEvent>>,
    flushes: AtomicUsize,
}

impl EventSink for Collect {
    fn name(&self) -> &'static str {
        "collect"
    }
    fn send(&self, ev: &FaultEvent) {
        self.events.lock().unwrap().push(ev.clone());
    }
    fn flush(&self, _timeout: Duration) {
        self.flushes.fetch_add(1, Ordering::SeqCst);
    }
}

fn fault(ev: FaultEvent) -> Input {
    Input::Fault {
        event: ev,
        read_at: Instant::now(),
    }
}

#[test]
fn events_reach_sinks_health_is_published_and_state_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::new(Some(dir.path()), "boot-a");
    let registry = Arc::clone(&rig.registry);
    let (tx, rx) = crossbeam_channel::bounded(16_384);
    let (health_tx, health_rx) = crossbeam_channel::unbounded::<Arc<NodeHealth>>();
    let health_tx = move |h| {
        let _ = health_tx.send(h);
    };
    let sink = Arc::new(Collect::default());
    let sinks: Vec<Arc<dyn EventSink>> = vec![sink.clone()];
    tx.send(Input::Samples {
        samples: two_gpus(),
        complete: true,
    })
    .unwrap();
    for _ in 0..1000 {
        tx.send(fault(xid(79, PCI0))).unwrap();
    }
    drop(tx);
    run_engine(
        rig.engine,
        rx,
        sinks,
        health_tx,
        Arc::new(AtomicBool::new(false)),
    );

    let events = sink.events.lock().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].gpu_uuid, UUID0);
    assert_eq!(sink.flushes.load(Ordering::SeqCst), 1);
    let h = health_rx.try_iter().last().expect("health published");
    assert_eq!(h.verdict(), Verdict::Unhealthy);
    assert_eq!(h.gpus[0].active_faults[0].count, 1000);
    assert_eq!(registry.health().reason, "XID79");
    assert!(dir.path().join(STATE_FILE).exists());
    assert!(registry.state_writes().0 >= 1);
}

#[test]
fn unchanged_health_is_not_republished() {
    let rig = Rig::new(None, "boot-a");
    let (tx, rx) = crossbeam_channel::bounded(64);
    let (health_tx, health_rx) = crossbeam_channel::unbounded::<Arc<NodeHealth>>();
    let health_tx = move |h| {
        let _ = health_tx.send(h);
    };
    let shutdown = Arc::new(AtomicBool::new(false));
    let clock = rig.clock.clone();
    let engine = rig.engine;
    let stop = Arc::clone(&shutdown);
    let t = std::thread::spawn(move || run_engine(engine, rx, Vec::new(), health_tx, stop));

    let wait_change = |rx: &crossbeam_channel::Receiver<Arc<NodeHealth>>| {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("no publication")
    };
    // Initial publication.
    let first = wait_change(&health_rx);
    assert_eq!(first.verdict(), Verdict::Unknown);
    tx.send(Input::Samples {
        samples: two_gpus(),
        complete: true,
    })
    .unwrap();
    let second = wait_change(&health_rx);
    assert_eq!(second.verdict(), Verdict::Healthy);
    // Identical polls and ticks with the clock moving: only timestamps change.
    for _ in 0..5 {
        clock.advance(Duration::from_secs(10));
        tx.send(Input::Samples {
            samples: two_gpus(),
            complete: true,
        })
        .unwrap();
        tx.send(Input::Tick).unwrap();
    }
    // A real change afterwards proves the loop processed the inputs before it.
    tx.send(fault(xid(13, PCI0))).unwrap();
    let third = wait_change(&health_rx);
    assert_eq!(
        third.verdict(),
        Verdict::Degraded,
        "unchanged polls were not published"
    );
    shutdown.store(true, Ordering::SeqCst);
    t.join().unwrap();
    assert!(health_rx.try_recv().is_err());
}
