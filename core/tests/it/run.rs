//! The engine thread loop: events to sinks, health published only on change,
//! state flushed and sinks flushed on exit.

use crate::support::*;
use gpuwatch_core::engine::{STATE_FILE, run_engine};
use gpuwatch_core::msg::Input;
use gpuwatch_core::{EventSink, Shutdown};
use gpuwatch_proto::{FaultEvent, NodeHealth, Verdict};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct RecordingSink {
    events: Mutex<Vec<FaultEvent>>,
    flushes: AtomicUsize,
}

impl EventSink for RecordingSink {
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
    rig.registry.add_health_observer(Box::new(move |_, h| {
        let _ = health_tx.send(Arc::clone(h));
    }));
    let sink = Arc::new(RecordingSink::default());
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
    run_engine(rig.engine, rx, sinks, Shutdown::new());

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

/// Every emitted event goes back to its source once the sinks had it (as
/// the sinks saw it); a full way back drops the rest, and the sinks still
/// get every event.
#[test]
fn emitted_events_go_back_for_reuse_after_the_sinks() {
    let mut rig = Rig::without_join_grace(None, "boot-a");
    let (back, spent) = gpuwatch_core::msg::spent_events();
    rig.engine.return_spent_events(back);
    let (tx, rx) = crossbeam_channel::bounded(16_384);
    let sink = Arc::new(RecordingSink::default());
    let sinks: Vec<Arc<dyn EventSink>> = vec![sink.clone()];
    let n = gpuwatch_core::msg::SPENT_EVENTS + 10;
    for i in 0..n {
        let pci = format!("0000:{:02x}:00.0", i + 1);
        tx.send(fault(xid(13, &pci))).unwrap();
    }
    drop(tx);
    run_engine(rig.engine, rx, sinks, Shutdown::new());
    let seen = sink.events.lock().unwrap();
    assert_eq!(seen.len(), n, "the sinks get every event");
    let back: Vec<FaultEvent> = spent.try_iter().collect();
    assert_eq!(
        back.len(),
        gpuwatch_core::msg::SPENT_EVENTS,
        "the rest dropped"
    );
    assert_eq!(&back[..], &seen[..back.len()]);
}

#[test]
fn unchanged_health_is_not_republished() {
    let rig = Rig::new(None, "boot-a");
    let (tx, rx) = crossbeam_channel::bounded(64);
    let (health_tx, health_rx) = crossbeam_channel::unbounded::<Arc<NodeHealth>>();
    rig.registry.add_health_observer(Box::new(move |_, h| {
        let _ = health_tx.send(Arc::clone(h));
    }));
    let shutdown = Shutdown::new();
    let clock = rig.clock.clone();
    let engine = rig.engine;
    let stop = shutdown.clone();
    let t = std::thread::spawn(move || run_engine(engine, rx, Vec::new(), stop));

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
    shutdown.trigger();
    t.join().unwrap();
    assert!(health_rx.try_recv().is_err());
}

/// An idle engine sleeps until its next tick (here a minute away) and still
/// stops as soon as the shutdown signal is triggered, with its input senders
/// alive (a source that has not stopped yet).
#[test]
fn an_idle_engine_stops_at_once_when_shutdown_is_triggered() {
    let rig = Rig::with(
        gpuwatch_core::engine::EngineConfig {
            tick_interval_ms: 60_000,
            ..Default::default()
        },
        Arc::new(xid_parser::Policy::default()),
        None,
        "boot-a",
        Arc::new(gpuwatch_core::clock::ManualClock::new(start_time())),
    );
    let (tx, rx) = crossbeam_channel::bounded(16);
    let (published_tx, published) = crossbeam_channel::unbounded::<()>();
    let shutdown = Shutdown::new();
    let stop = shutdown.clone();
    rig.registry.add_health_observer(Box::new(move |_, _| {
        let _ = published_tx.send(());
    }));
    let engine = rig.engine;
    let t = std::thread::spawn(move || run_engine(engine, rx, Vec::new(), stop));
    tx.send(Input::Samples {
        samples: two_gpus(),
        complete: true,
    })
    .unwrap();
    // The initial publication and the one for the samples: the engine is
    // past its start and idle from here on.
    for _ in 0..2 {
        published
            .recv_timeout(Duration::from_secs(10))
            .expect("a publication");
    }
    std::thread::sleep(Duration::from_millis(100));
    shutdown.trigger();
    // Far from the minute it would sleep, with room for a loaded machine to
    // schedule the engine thread.
    gpuwatch_core::join_by(t, Instant::now() + Duration::from_secs(10))
        .expect("the engine kept sleeping after the shutdown signal")
        .unwrap();
    drop(tx);
}

/// Each loop pass stores the wall-clock second in the heartbeat the
/// liveness check reads, even on an engine whose own clock is a manual one.
#[test]
fn each_loop_pass_beats_the_heartbeat_in_real_time() {
    let rig = Rig::new(None, "boot-a");
    let heartbeat = Arc::new(gpuwatch_core::engine::Heartbeat::default());
    let mut engine = rig.engine;
    engine.set_heartbeat(Arc::clone(&heartbeat));
    assert_eq!(heartbeat.last(), 0, "no pass yet");
    let (tx, rx) = crossbeam_channel::bounded(16);
    tx.send(fault(xid(79, PCI0))).unwrap();
    drop(tx);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    run_engine(engine, rx, Vec::new(), Shutdown::new());
    let after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        (before..=after).contains(&heartbeat.last()),
        "{before} <= {} <= {after}",
        heartbeat.last()
    );
}

/// The kernel's syscall number the thread named `name` is blocked in, if
/// such a thread exists (`/proc/self/task/*/syscall`, first field).
fn blocked_syscall(name: &str) -> Option<i64> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let task = task.ok()?.path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let sc = std::fs::read_to_string(task.join("syscall")).ok()?;
            return sc.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

#[cfg(target_arch = "x86_64")]
const SYS_OPENAT: i64 = 257;
#[cfg(target_arch = "aarch64")]
const SYS_OPENAT: i64 = 56;

/// Polls `cond` every `every` until it holds; fails with `what()` after
/// `timeout`.
fn poll(timeout: Duration, every: Duration, what: impl Fn() -> String, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "{}", what());
        std::thread::sleep(every);
    }
}

/// An engine thread on a state directory whose next state write opens a
/// FIFO nobody reads (persisting every 100 ms), with two GPUs sampled and a
/// recording sink.
struct HungStateRig {
    registry: Arc<gpuwatch_core::Registry>,
    tx: crossbeam_channel::Sender<Input>,
    sink: Arc<RecordingSink>,
    shutdown: Shutdown,
    engine: std::thread::JoinHandle<()>,
    /// Where the engine writes its state first: the FIFO.
    fifo: std::path::PathBuf,
}

impl HungStateRig {
    fn start(dir: &std::path::Path) -> HungStateRig {
        let fifo = dir.join(format!(".{STATE_FILE}.tmp.{}", std::process::id()));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let rig = Rig::with(
            gpuwatch_core::engine::EngineConfig {
                persist_interval_ms: 100,
                ..Default::default()
            },
            Arc::new(xid_parser::Policy::default()),
            Some(dir),
            "boot-a",
            Arc::new(gpuwatch_core::clock::ManualClock::new(start_time())),
        );
        let registry = Arc::clone(&rig.registry);
        let (tx, rx) = crossbeam_channel::bounded(1024);
        let sink = Arc::new(RecordingSink::default());
        let sinks: Vec<Arc<dyn EventSink>> = vec![sink.clone()];
        let shutdown = Shutdown::new();
        let stop = shutdown.clone();
        let engine = rig.engine;
        let engine = std::thread::spawn(move || run_engine(engine, rx, sinks, stop));
        tx.send(Input::Samples {
            samples: two_gpus(),
            complete: true,
        })
        .unwrap();
        HungStateRig {
            registry,
            tx,
            sink,
            shutdown,
            engine,
            fifo,
        }
    }

    fn events(&self) -> usize {
        self.sink.events.lock().unwrap().len()
    }

    /// The disk comes back: a reader drains the FIFO, so the blocked open
    /// returns (and the write goes on to fail: a FIFO cannot be fsynced).
    fn unblock(&self) {
        let fifo = self.fifo.clone();
        let written = std::thread::spawn(move || std::fs::read(&fifo).unwrap())
            .join()
            .unwrap();
        assert!(!written.is_empty());
    }

    fn stop(self) {
        self.shutdown.trigger();
        self.engine.join().unwrap();
    }
}

/// The state file in `dir` holds a fault of every code in `codes`.
fn assert_state_holds(dir: &std::path::Path, codes: &[u32]) {
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(STATE_FILE)).unwrap()).unwrap();
    let text = state.to_string();
    for code in codes {
        assert!(
            text.contains(&format!("\"XID{code}\"")) || text.contains(&format!("\"code\":{code}")),
            "XID {code} missing from the state file"
        );
    }
}

/// A state write that blocks in the kernel (here: opening a FIFO nobody
/// reads, which blocks like a write to a hung volume) never holds up events:
/// they reach the sinks while the writer thread is stuck. When the write
/// fails (fsync on a FIFO: EINVAL) it is reported and retried, and the file
/// written afterwards holds every fault.
#[test]
fn a_hung_state_write_never_delays_events_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let rig = HungStateRig::start(dir.path());
    rig.tx.send(fault(xid(79, PCI0))).unwrap();
    poll(
        Duration::from_secs(10),
        Duration::from_millis(5),
        || "the state write never started".to_owned(),
        || blocked_syscall("gpuwatch-state") == Some(SYS_OPENAT),
    );
    // The writer is stuck in open(2); events keep flowing.
    let codes = [13, 31, 43, 45, 63, 64, 94, 95];
    for pci in [PCI0, PCI1] {
        for code in codes {
            rig.tx.send(fault(xid(code, pci))).unwrap();
        }
    }
    let want = 1 + 2 * codes.len();
    poll(
        Duration::from_secs(10),
        Duration::from_millis(5),
        || {
            format!(
                "events were held up by the stuck state write: {} of {want}",
                rig.events()
            )
        },
        || rig.events() >= want,
    );
    assert_eq!(blocked_syscall("gpuwatch-state"), Some(SYS_OPENAT));
    assert_eq!(rig.registry.state_writes(), (0, 0), "no write finished yet");
    // The write fails once the open returns, is counted, and the retry
    // writes a regular file.
    rig.unblock();
    poll(
        Duration::from_secs(20),
        Duration::from_millis(20),
        || {
            format!(
                "the state was never written after the failure: {:?}",
                rig.registry.state_writes()
            )
        },
        || rig.registry.state_writes().0 > 0,
    );
    assert!(
        rig.registry.state_writes().1 >= 1,
        "the failed write was counted"
    );
    rig.stop();
    let every: Vec<u32> = codes.iter().copied().chain([79]).collect();
    assert_state_holds(dir.path(), &every);
}

/// A log writer that keeps what it is given.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Records how much had been logged when each event reached it.
struct LogAtSend {
    log: LogBuf,
    logged_before: Mutex<Vec<usize>>,
}

impl EventSink for LogAtSend {
    fn name(&self) -> &'static str {
        "log-at-send"
    }
    fn send(&self, _: &FaultEvent) {
        let n = self.log.0.lock().unwrap().len();
        self.logged_before.lock().unwrap().push(n);
    }
}

/// The "GPU fault became active" lines are written after the sinks got the
/// events, at the publication once the input paused: formatting one and
/// writing it to stderr must not delay an event.
#[test]
fn faults_are_logged_after_the_sinks_have_their_events() {
    let log = LogBuf::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let rig = Rig::without_join_grace(None, "boot-a");
    let (tx, rx) = crossbeam_channel::bounded(16);
    let sink = Arc::new(LogAtSend {
        log: log.clone(),
        logged_before: Mutex::new(Vec::new()),
    });
    let sinks: Vec<Arc<dyn EventSink>> = vec![sink.clone()];
    tx.send(fault(xid(79, PCI0))).unwrap();
    tx.send(fault(xid(48, PCI1))).unwrap();
    drop(tx);
    tracing::subscriber::with_default(subscriber, || {
        run_engine(rig.engine, rx, sinks, Shutdown::new())
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let at = text
        .find("GPU fault became active.")
        .expect("the activation is logged");
    assert_eq!(
        text.matches("GPU fault became active.").count(),
        2,
        "{text}"
    );
    let before = sink.logged_before.lock().unwrap().clone();
    assert_eq!(before.len(), 2, "two events");
    assert!(
        before.iter().all(|&n| n <= at),
        "a log line was written before the sink got its event: {text}"
    );
}

/// A rig whose engine asks the kubelet (the ask does nothing: no answer
/// comes), ticking once a minute so only the wait's own deadline can
/// release a record.
fn waiting_rig(wait_ms: u64) -> Rig {
    let mut rig = Rig::with(
        gpuwatch_core::engine::EngineConfig {
            tick_interval_ms: 60_000,
            placement_wait_ms: wait_ms,
            ..Default::default()
        },
        Arc::new(xid_parser::Policy::default()),
        None,
        "boot-a",
        Arc::new(gpuwatch_core::clock::ManualClock::new(start_time())),
    );
    rig.engine
        .set_placement_asks(gpuwatch_core::engine::PlacementAsks {
            pods: None,
            devices: Some(Arc::new(|| {})),
        });
    rig
}

#[test]
fn the_loop_wakes_for_a_records_placement_deadline_and_shutdown_releases_the_rest() {
    // The rig's clock is manual: the loop sees the deadline as "due now"
    // only once the clock has moved, which the test does from outside.
    let rig = waiting_rig(500);
    let clock = rig.clock.clone();
    // Every published health, to know when the loop has taken a fault in.
    let (health_tx, published) = crossbeam_channel::unbounded::<Arc<NodeHealth>>();
    rig.registry.add_health_observer(Box::new(move |_, h| {
        let _ = health_tx.send(h.clone());
    }));
    let faulted = |pci: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Ok(h) = published.recv_deadline(deadline) {
            if h.gpus
                .iter()
                .any(|g| g.pci_address == pci && !g.active_faults.is_empty())
            {
                return true;
            }
        }
        false
    };
    let (tx, rx) = crossbeam_channel::bounded(64);
    let sink = Arc::new(RecordingSink::default());
    let sinks: Vec<Arc<dyn EventSink>> = vec![sink.clone()];
    let shutdown = Shutdown::new();
    let stop = shutdown.clone();
    let engine = std::thread::spawn(move || {
        run_engine(rig.engine, rx, sinks, stop);
    });
    tx.send(Input::Samples {
        samples: two_gpus(),
        complete: true,
    })
    .unwrap();
    tx.send(fault(xid(79, PCI0))).unwrap();
    let seen = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if sink.events.lock().unwrap().len() >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    };
    // Taken in (the fault is in the published health), and its record held.
    assert!(faulted(PCI0), "the loop never took the fault in");
    assert!(sink.events.lock().unwrap().is_empty(), "the record waits");
    clock.advance(Duration::from_millis(500));
    assert!(seen(1), "released by the loop at its deadline, not a tick");
    // A second record waits; stopping the engine hands it to the sinks
    // before they are flushed.
    tx.send(fault(xid(79, PCI1))).unwrap();
    assert!(faulted(PCI1), "the loop never took the second fault in");
    assert_eq!(sink.events.lock().unwrap().len(), 1);
    shutdown.trigger();
    engine.join().unwrap();
    assert_eq!(sink.events.lock().unwrap().len(), 2);
    assert_eq!(sink.flushes.load(Ordering::SeqCst), 1);
}
