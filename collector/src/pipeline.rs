//! Channels between the sources and the health engine, and their overflow
//! policies.
//!
//! ```text
//! kmsg thread ──FaultSender (coalescing)──────────────┐
//!                                                     ├─► engine channel (bounded) ─► engine
//! NVML threads ─► nvml channel ─► forwarder thread ───┘
//!                                 (keeps only the newest undelivered Samples)
//! ```
//!
//! * Fault events are never dropped silently. The kmsg source sends with
//!   `try_send`; when the engine channel is full, the event is coalesced into a
//!   small pending buffer in the source (same PCI address + kind + code →
//!   `count + 1`, counted `parser/coalesced`) and delivered as soon as there is
//!   room. Only when that buffer itself holds [`PENDING_CAPACITY`] distinct
//!   faults is an event dropped (counted `parser/dropped`, logged).
//! * NVML samples may be dropped oldest-first: the forwarder holds at most one
//!   undelivered `Samples`; a newer one replaces it (counted `samples_dropped`).
//!   Other NVML inputs (faults, monitor status) wait for room and are never
//!   dropped; a held `Samples` is delivered before them to keep order.
//! * Senders stop when the engine side disconnects; the engine stops after all
//!   senders are gone and the channel is drained.

use crate::msg::Input;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError, bounded};
use gpuwatch_proto::FaultEvent;
use gpuwatch_sinks::{Outcome, Registry, Stage};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Default capacity of the engine channel.
pub const ENGINE_CHANNEL_CAPACITY: usize = 4096;
/// Capacity of the NVML → forwarder channel.
pub const NVML_CHANNEL_CAPACITY: usize = 64;
/// Distinct faults the kmsg source keeps while the engine channel is full.
pub const PENDING_CAPACITY: usize = 1024;

/// Liveness and readiness flags shared by the threads and the local API.
#[derive(Debug, Default)]
pub struct Liveness {
    /// The engine thread is running.
    pub engine_alive: AtomicBool,
    /// The kmsg reader thread is running.
    pub kmsg_alive: AtomicBool,
    /// The kmsg reader read everything the ring held at start-up (or reached
    /// the end of the replay file) at least once.
    pub kmsg_caught_up: AtomicBool,
    /// The engine loaded its persisted state.
    pub state_loaded: AtomicBool,
    /// Unix seconds of the last kmsg reader loop iteration (0 before the first).
    pub kmsg_heartbeat_unix_secs: AtomicU64,
}

impl Liveness {
    /// New flags, all false.
    pub fn new() -> Arc<Liveness> {
        Arc::new(Liveness::default())
    }

    /// Whether the agent is alive (engine and kmsg threads running).
    pub fn alive(&self) -> bool {
        self.engine_alive.load(Ordering::Relaxed) && self.kmsg_alive.load(Ordering::Relaxed)
    }

    /// Whether the agent is ready (alive, state loaded, first kmsg pass done).
    pub fn ready(&self) -> bool {
        self.alive()
            && self.state_loaded.load(Ordering::Relaxed)
            && self.kmsg_caught_up.load(Ordering::Relaxed)
    }
}

/// Clears a liveness flag when dropped (thread exit, including by panic).
#[derive(Debug)]
pub struct AliveGuard<'a>(&'a AtomicBool);

impl<'a> AliveGuard<'a> {
    /// Sets `flag` and clears it again on drop.
    pub fn set(flag: &'a AtomicBool) -> AliveGuard<'a> {
        flag.store(true, Ordering::Relaxed);
        AliveGuard(flag)
    }
}

impl Drop for AliveGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// The channels of one agent.
#[derive(Debug)]
pub struct Channels {
    /// Sender into the engine channel (kmsg source, forwarder).
    pub engine_tx: Sender<Input>,
    /// The engine's receiver.
    pub engine_rx: Receiver<Input>,
    /// Sender handed to the NVML sources.
    pub nvml_tx: Sender<Input>,
    /// The forwarder's receiver.
    pub nvml_rx: Receiver<Input>,
}

impl Channels {
    /// Creates the channels with the given engine channel capacity.
    pub fn new(engine_capacity: usize) -> Channels {
        let (engine_tx, engine_rx) = bounded(engine_capacity.max(1));
        let (nvml_tx, nvml_rx) = bounded(NVML_CHANNEL_CAPACITY);
        Channels {
            engine_tx,
            engine_rx,
            nvml_tx,
            nvml_rx,
        }
    }
}

/// Why the agent stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// SIGTERM or SIGINT.
    Signal,
    /// The replay file ended (`exit_at_eof`).
    InputEnded,
    /// A thread the agent cannot run without ended.
    ThreadExited,
}

/// Whether a send reached (or will reach) the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStatus {
    /// Sent, or held for a later send.
    Accepted,
    /// The engine is gone; the source should stop.
    Disconnected,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct CoalesceKey {
    pci: String,
    kind: i32,
    code: u32,
}

impl CoalesceKey {
    fn of(ev: &FaultEvent) -> CoalesceKey {
        CoalesceKey {
            pci: ev.pci_address.clone(),
            kind: ev.kind,
            code: ev.code,
        }
    }
}

/// The kmsg source's sender: never blocks, never drops silently.
#[derive(Debug)]
pub struct FaultSender {
    tx: Sender<Input>,
    registry: Arc<Registry>,
    pending: Vec<(CoalesceKey, FaultEvent, Instant)>,
    capacity: usize,
}

impl FaultSender {
    /// A sender into `tx` with the default pending capacity.
    pub fn new(tx: Sender<Input>, registry: Arc<Registry>) -> FaultSender {
        FaultSender::with_capacity(tx, registry, PENDING_CAPACITY)
    }

    /// A sender whose pending buffer holds at most `capacity` distinct faults.
    pub fn with_capacity(
        tx: Sender<Input>,
        registry: Arc<Registry>,
        capacity: usize,
    ) -> FaultSender {
        FaultSender {
            tx,
            registry,
            pending: Vec::new(),
            capacity: capacity.max(1),
        }
    }

    /// Events waiting for room in the engine channel.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Sends one fault event read at `read_at`.
    pub fn send(&mut self, event: FaultEvent, read_at: Instant) -> SendStatus {
        self.registry
            .count_events(Stage::Parser, Outcome::Emitted, 1);
        if self.flush() == SendStatus::Disconnected {
            return SendStatus::Disconnected;
        }
        if self.pending.is_empty() {
            match self.tx.try_send(Input::Fault { event, read_at }) {
                Ok(()) => return SendStatus::Accepted,
                Err(TrySendError::Disconnected(_)) => return SendStatus::Disconnected,
                Err(TrySendError::Full(Input::Fault { event, read_at })) => {
                    self.hold(event, read_at);
                }
                Err(TrySendError::Full(_)) => {}
            }
        } else {
            self.hold(event, read_at);
        }
        SendStatus::Accepted
    }

    fn hold(&mut self, event: FaultEvent, read_at: Instant) {
        let key = CoalesceKey::of(&event);
        if let Some((_, held, _)) = self.pending.iter_mut().find(|(k, _, _)| *k == key) {
            held.count = held.count.saturating_add(event.count.max(1));
            self.registry
                .count_events(Stage::Parser, Outcome::Coalesced, 1);
            return;
        }
        if self.pending.len() >= self.capacity {
            self.registry
                .count_events(Stage::Parser, Outcome::Dropped, 1);
            tracing::warn!(
                code = event.code,
                kind = event.kind,
                pci = %event.pci_address,
                pending = self.pending.len(),
                "Fault event dropped: the engine channel and the coalescing buffer are full."
            );
            return;
        }
        let mut event = event;
        event.count = event.count.max(1);
        self.pending.push((key, event, read_at));
    }

    /// Tries to deliver held events, oldest first.
    pub fn flush(&mut self) -> SendStatus {
        while !self.pending.is_empty() {
            let (key, event, read_at) = self.pending.remove(0);
            match self.tx.try_send(Input::Fault { event, read_at }) {
                Ok(()) => {}
                Err(TrySendError::Disconnected(_)) => return SendStatus::Disconnected,
                Err(TrySendError::Full(Input::Fault { event, read_at })) => {
                    self.pending.insert(0, (key, event, read_at));
                    break;
                }
                Err(TrySendError::Full(_)) => break,
            }
        }
        SendStatus::Accepted
    }

    /// Delivers every held event, waiting up to `timeout` for room; what is
    /// still held afterwards is counted dropped (shutdown).
    pub fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for (_, event, read_at) in std::mem::take(&mut self.pending) {
            let left = deadline.saturating_duration_since(Instant::now());
            if self
                .tx
                .send_timeout(Input::Fault { event, read_at }, left)
                .is_err()
            {
                self.registry
                    .count_events(Stage::Parser, Outcome::Dropped, 1);
            }
        }
    }

    /// Sends a non-fault input (monitor status), waiting for room.
    pub fn send_control(&mut self, input: Input) -> SendStatus {
        if self.flush() == SendStatus::Disconnected {
            return SendStatus::Disconnected;
        }
        match self.tx.send(input) {
            Ok(()) => SendStatus::Accepted,
            Err(_) => SendStatus::Disconnected,
        }
    }
}

/// Forwards NVML inputs into the engine channel with the drop-oldest policy
/// for samples. Returns when the NVML senders are gone or the engine is gone;
/// `shutdown` stops it after delivering what it holds.
pub fn forward_nvml(
    rx: Receiver<Input>,
    tx: Sender<Input>,
    registry: Arc<Registry>,
    shutdown: Arc<AtomicBool>,
) {
    let mut held: Option<Input> = None;
    loop {
        if let Some(s) = held.take() {
            match tx.try_send(s) {
                Ok(()) => {}
                Err(TrySendError::Full(s)) => held = Some(s),
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
        let wait = if held.is_some() {
            Duration::from_millis(5)
        } else {
            Duration::from_millis(250)
        };
        match rx.recv_timeout(wait) {
            Ok(Input::Samples(s)) => {
                if held.replace(Input::Samples(s)).is_some() {
                    registry.samples_dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(other) => {
                if let Some(s) = held.take()
                    && tx.send(s).is_err()
                {
                    return;
                }
                if tx.send(other).is_err() {
                    return;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if shutdown.load(Ordering::Relaxed) {
                    // Samples are disposable at shutdown.
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                if let Some(s) = held.take() {
                    let _ = tx.send_timeout(s, Duration::from_secs(1));
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_proto::{FaultKind, GpuSample};

    fn xid(pci: &str, code: u32) -> FaultEvent {
        let mut ev = FaultEvent {
            code,
            pci_address: pci.into(),
            count: 1,
            ..Default::default()
        };
        ev.set_kind(FaultKind::Xid);
        ev
    }

    fn faults(rx: &Receiver<Input>) -> Vec<FaultEvent> {
        rx.try_iter()
            .filter_map(|i| match i {
                Input::Fault { event, .. } => Some(event),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn full_channel_coalesces_same_gpu_and_code() {
        let reg = Registry::new();
        let (tx, rx) = bounded(1);
        let mut s = FaultSender::new(tx, reg.clone());
        let now = Instant::now();
        assert_eq!(s.send(xid("0000:01:00.0", 79), now), SendStatus::Accepted);
        // Channel full from here on.
        for _ in 0..5 {
            s.send(xid("0000:01:00.0", 31), now);
        }
        s.send(xid("0000:02:00.0", 31), now);
        assert_eq!(s.pending(), 2);
        assert_eq!(reg.events(Stage::Parser, Outcome::Coalesced), 4);
        assert_eq!(reg.events(Stage::Parser, Outcome::Dropped), 0);
        assert_eq!(reg.events(Stage::Parser, Outcome::Emitted), 7);

        let first = faults(&rx);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].code, 79);
        // Room again: held events go out oldest first with their counts.
        s.flush();
        let second = faults(&rx);
        assert_eq!((second[0].code, second[0].count), (31, 5));
        s.flush();
        let third = faults(&rx);
        assert_eq!(
            (third[0].pci_address.as_str(), third[0].count),
            ("0000:02:00.0", 1)
        );
        assert_eq!(s.pending(), 0);
    }

    #[test]
    fn order_is_kept_while_events_are_held() {
        let reg = Registry::new();
        let (tx, rx) = bounded(2);
        let mut s = FaultSender::new(tx, reg);
        let now = Instant::now();
        s.send(xid("a", 1), now);
        s.send(xid("a", 2), now);
        s.send(xid("a", 3), now); // held
        let _ = rx.recv().unwrap(); // room for one
        s.send(xid("a", 4), now); // 3 goes first, 4 is held behind it
        let codes: Vec<u32> = faults(&rx).iter().map(|e| e.code).collect();
        assert_eq!(codes, vec![2, 3]);
        s.flush();
        assert_eq!(faults(&rx)[0].code, 4);
    }

    #[test]
    fn overflowing_the_pending_buffer_drops_and_counts() {
        let reg = Registry::new();
        let (tx, _rx) = bounded(1);
        let mut s = FaultSender::with_capacity(tx, reg.clone(), 2);
        let now = Instant::now();
        for code in 1..=5 {
            s.send(xid("a", code), now);
        }
        // 1 sent, 2 and 3 held, 4 and 5 dropped.
        assert_eq!(s.pending(), 2);
        assert_eq!(reg.events(Stage::Parser, Outcome::Dropped), 2);
        s.drain(Duration::from_millis(1));
        assert_eq!(reg.events(Stage::Parser, Outcome::Dropped), 4);
    }

    #[test]
    fn disconnected_engine_is_reported() {
        let reg = Registry::new();
        let (tx, rx) = bounded(1);
        drop(rx);
        let mut s = FaultSender::new(tx, reg);
        assert_eq!(
            s.send(xid("a", 1), Instant::now()),
            SendStatus::Disconnected
        );
    }

    #[test]
    fn forwarder_keeps_only_the_newest_samples_and_never_drops_faults() {
        let reg = Registry::new();
        let (ntx, nrx) = bounded(16);
        let (etx, erx) = bounded(1);
        let shutdown = Arc::new(AtomicBool::new(false));
        // Fill the engine channel so the forwarder must hold.
        etx.send(Input::Tick).unwrap();
        for i in 0..3u32 {
            ntx.send(Input::Samples(vec![GpuSample {
                index: i,
                ..Default::default()
            }]))
            .unwrap();
        }
        let (r2, s2) = (reg.clone(), shutdown.clone());
        let fwd_tx = etx.clone();
        let h = std::thread::spawn(move || forward_nvml(nrx, fwd_tx, r2, s2));
        // Let the forwarder read all three samples while the channel is full.
        let t0 = Instant::now();
        while reg.samples_dropped.load(Ordering::Relaxed) < 2 && t0.elapsed().as_secs() < 5 {
            std::thread::yield_now();
        }
        assert_eq!(reg.samples_dropped.load(Ordering::Relaxed), 2);
        ntx.send(Input::Fault {
            event: xid("a", 79),
            read_at: Instant::now(),
        })
        .unwrap();
        drop(ntx);
        let mut got = Vec::new();
        while let Ok(i) = erx.recv_timeout(Duration::from_secs(5)) {
            got.push(i);
            if got.len() == 3 {
                break;
            }
        }
        h.join().unwrap();
        assert!(matches!(got[0], Input::Tick));
        match &got[1] {
            Input::Samples(s) => assert_eq!(s[0].index, 2, "newest sample kept"),
            other => panic!("expected samples, got {other:?}"),
        }
        assert!(matches!(&got[2], Input::Fault { event, .. } if event.code == 79));
    }

    #[test]
    fn liveness_flags() {
        let l = Liveness::new();
        assert!(!l.alive());
        {
            let _e = AliveGuard::set(&l.engine_alive);
            let _k = AliveGuard::set(&l.kmsg_alive);
            assert!(l.alive());
            assert!(!l.ready());
            l.state_loaded.store(true, Ordering::Relaxed);
            l.kmsg_caught_up.store(true, Ordering::Relaxed);
            assert!(l.ready());
        }
        assert!(!l.alive());
    }
}
