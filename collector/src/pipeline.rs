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

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};
use gpuwatch_core::msg::Input;
use gpuwatch_core::registry::Tally;
use gpuwatch_core::{Outcome, Registry, Shutdown, Stage};
use gpuwatch_proto::{Action, FaultEvent, ShortName};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default capacity of the engine channel.
pub(crate) const ENGINE_CHANNEL_CAPACITY: usize = 4096;
/// Capacity of the NVML → forwarder channel.
pub(crate) const NVML_CHANNEL_CAPACITY: usize = 64;
/// Distinct faults the kmsg source keeps while the engine channel is full.
pub(crate) const PENDING_CAPACITY: usize = 1024;

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

/// What became of an input that must keep its place in the channel order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InOrder {
    /// In the channel.
    Sent,
    /// Not now (something is held, or no room); try again later.
    Deferred,
    /// The engine is gone.
    Disconnected,
}

/// Whether a send reached (or will reach) the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendStatus {
    /// Sent, or held for a later send.
    Accepted,
    /// The engine is gone; the source should stop.
    Disconnected,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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

/// One fault waiting for room in the engine channel.
#[derive(Debug)]
struct PendingFault {
    key: CoalesceKey,
    event: FaultEvent,
    read_at: Instant,
    /// Lowest kernel log sequence number among the occurrences merged here.
    seq: Option<u64>,
    /// False once evicted for a more severe fault (skipped on delivery).
    live: bool,
}

/// The kmsg source's sender: never blocks, never drops silently, and never
/// drops a severe fault for a less severe one.
///
/// Held faults wait in a FIFO (`VecDeque`) with a hash index from coalescing
/// key to position, so holding, coalescing and delivering are O(1) each even
/// with [`PENDING_CAPACITY`] distinct faults held during a storm. Positions in
/// the index are absolute (`head` is the absolute position of the front), so
/// delivering the front never renumbers the rest.
///
/// When the buffer holds `capacity` distinct faults, a new one that is more
/// severe (action rank) than some held fault evicts the least severe, oldest
/// of them (left in place as a dead entry, skipped on delivery); otherwise the
/// new one is dropped. Drops are counted (`parser/dropped`) and logged once
/// per interval with a count per action class.
#[derive(Debug)]
pub(crate) struct FaultSender {
    tx: Sender<Input>,
    registry: Arc<Registry>,
    pending: VecDeque<PendingFault>,
    index: HashMap<CoalesceKey, u64>,
    /// Absolute position of `pending[0]`.
    head: u64,
    capacity: usize,
    /// Live (not evicted) entries in `pending`.
    live: usize,
    /// Live entries per action rank (finding an eviction victim is O(1)
    /// when there is none).
    live_by_rank: [usize; RANKS],
    disconnected: bool,
    drops: DropReport,
}

/// Action ranks (`Action::rank`: unspecified .. inspect_hardware).
const RANKS: usize = 8;

fn rank_of(ev: &FaultEvent) -> usize {
    usize::try_from(ev.action().rank())
        .unwrap_or(0)
        .min(RANKS - 1)
}

/// Logs the fault events dropped since the last report, by action class, at
/// most once per [`DropReport::EVERY`]; the counts are the registry's
/// (`gpuwatch.events.dropped`), so the log and the metric agree.
#[derive(Debug, Default)]
struct DropReport {
    /// The registry's counts at the last report, per [`Action::ALL`].
    reported: [u64; Action::ALL.len()],
    last: Option<Instant>,
}

impl DropReport {
    const EVERY: Duration = Duration::from_secs(10);

    fn note(&mut self, registry: &Registry) {
        if self.last.is_none_or(|t| t.elapsed() >= Self::EVERY) {
            self.report(registry);
        }
    }

    fn report(&mut self, registry: &Registry) {
        let now = Action::ALL.map(|a| registry.source_drops(a));
        let per_action: Vec<String> = Action::ALL
            .iter()
            .zip(now.iter().zip(&self.reported))
            .filter(|(_, (n, r))| n > r)
            .map(|(a, (n, r))| format!("{}={}", a.short_name(), n - r))
            .collect();
        if per_action.is_empty() {
            return;
        }
        let total: u64 = now.iter().sum::<u64>() - self.reported.iter().sum::<u64>();
        tracing::warn!(
            dropped = total,
            per_action = %per_action.join(","),
            "Fault events dropped: the engine channel and the coalescing buffer are full (less severe faults go first)."
        );
        self.reported = now;
        self.last = Some(Instant::now());
    }
}

impl FaultSender {
    /// A sender into `tx` with the default pending capacity.
    pub(crate) fn new(tx: Sender<Input>, registry: Arc<Registry>) -> FaultSender {
        FaultSender::with_capacity(tx, registry, PENDING_CAPACITY)
    }

    /// A sender whose pending buffer holds at most `capacity` distinct faults.
    pub(crate) fn with_capacity(
        tx: Sender<Input>,
        registry: Arc<Registry>,
        capacity: usize,
    ) -> FaultSender {
        FaultSender {
            tx,
            registry,
            pending: VecDeque::new(),
            index: HashMap::new(),
            head: 0,
            capacity: capacity.max(1),
            live: 0,
            live_by_rank: [0; RANKS],
            disconnected: false,
            drops: DropReport::default(),
        }
    }

    /// Counts `n` dropped events of class `action` (metrics, periodic log).
    fn dropped(&mut self, action: Action, n: u64) {
        self.registry
            .count_events(Stage::Parser, Outcome::Dropped, n);
        self.registry.count_source_drop(action, n);
        self.drops.note(&self.registry);
    }

    /// Events waiting for room in the engine channel.
    pub(crate) fn pending(&self) -> usize {
        self.live
    }

    /// Lowest `kmsg_seq` among the events still waiting for room in the engine
    /// channel (`None` when nothing with a sequence number waits). The kmsg
    /// cursor must not pass it: those records have not reached the engine.
    #[cfg(test)]
    pub(crate) fn lowest_pending_seq(&self) -> Option<u64> {
        self.pending
            .iter()
            .filter(|h| h.live)
            .filter_map(|h| h.seq)
            .min()
    }

    /// True once a send found the engine side gone.
    pub(crate) fn is_disconnected(&self) -> bool {
        self.disconnected
    }

    fn gone(&mut self) -> SendStatus {
        self.disconnected = true;
        SendStatus::Disconnected
    }

    /// Sends one fault event read at `read_at`.
    pub(crate) fn send(&mut self, event: FaultEvent, read_at: Instant) -> SendStatus {
        self.registry
            .count_events(Stage::Parser, Outcome::Emitted, 1);
        if self.flush() == SendStatus::Disconnected {
            return SendStatus::Disconnected;
        }
        if self.pending.is_empty() {
            match self.tx.try_send(Input::Fault { event, read_at }) {
                Ok(()) => {
                    return SendStatus::Accepted;
                }
                Err(TrySendError::Disconnected(_)) => return self.gone(),
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
        if let Some(&pos) = self.index.get(&key) {
            // The index only holds positions of entries still queued.
            let slot = usize::try_from(pos - self.head)
                .ok()
                .and_then(|i| self.pending.get_mut(i));
            if let Some(held) = slot {
                held.event.count = held.event.count.saturating_add(event.count.max(1));
                held.seq = match (held.seq, event.kmsg_seq) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                self.registry
                    .count_events(Stage::Parser, Outcome::Coalesced, 1);
                return;
            }
        }
        let rank = rank_of(&event);
        if self.live >= self.capacity && !self.evict_below(rank) {
            self.dropped(event.action(), 1);
            return;
        }
        let mut event = event;
        event.count = event.count.max(1);
        let pos = self.head + self.pending.len() as u64;
        self.index.insert(key.clone(), pos);
        self.pending.push_back(PendingFault {
            key,
            seq: event.kmsg_seq,
            event,
            read_at,
            live: true,
        });
        self.live += 1;
        self.live_by_rank[rank] += 1;
        if self.pending.len() > 2 * self.capacity {
            self.compact();
        }
    }

    /// Evicts the oldest held fault of the lowest rank below `rank`; false
    /// when every held fault is at least as severe.
    fn evict_below(&mut self, rank: usize) -> bool {
        let Some(victim_rank) = (0..rank).find(|&r| self.live_by_rank[r] > 0) else {
            return false;
        };
        let Some(held) = self
            .pending
            .iter_mut()
            .find(|h| h.live && rank_of(&h.event) == victim_rank)
        else {
            return false;
        };
        held.live = false;
        let count = u64::from(held.event.count.max(1));
        let action = held.event.action();
        self.index.remove(&held.key);
        self.live -= 1;
        self.live_by_rank[victim_rank] -= 1;
        self.dropped(action, count);
        true
    }

    /// Removes evicted entries from the middle of the queue (they would
    /// otherwise stay until they reach the front) and renumbers the index.
    fn compact(&mut self) {
        self.pending.retain(|h| h.live);
        self.index.clear();
        for (i, h) in self.pending.iter().enumerate() {
            self.index.insert(h.key.clone(), self.head + i as u64);
        }
    }

    /// Takes the front live entry out of the buffer and the index (dead
    /// entries in front of it are discarded).
    fn pop_front(&mut self) -> Option<PendingFault> {
        loop {
            let held = self.pending.pop_front()?;
            self.head += 1;
            if held.live {
                self.index.remove(&held.key);
                self.live -= 1;
                self.live_by_rank[rank_of(&held.event)] -= 1;
                return Some(held);
            }
        }
    }

    /// Discards dead entries at the front of the queue.
    fn skip_dead(&mut self) {
        while self.pending.front().is_some_and(|h| !h.live) {
            self.pending.pop_front();
            self.head += 1;
        }
    }

    /// Tries to deliver held events, oldest first.
    pub(crate) fn flush(&mut self) -> SendStatus {
        self.skip_dead();
        while let Some(front) = self.pending.front_mut() {
            // Moves the event out for the send; put back (same position, index
            // untouched) when the channel is full.
            let event = std::mem::take(&mut front.event);
            let read_at = front.read_at;
            let rank = rank_of(&event);
            match self.tx.try_send(Input::Fault { event, read_at }) {
                Ok(()) => {
                    let front = self.pending.pop_front();
                    if let Some(h) = front {
                        self.index.remove(&h.key);
                    }
                    self.head += 1;
                    self.live -= 1;
                    self.live_by_rank[rank] -= 1;
                    self.skip_dead();
                }
                Err(TrySendError::Disconnected(Input::Fault { event, .. })) => {
                    front.event = event;
                    return self.gone();
                }
                Err(TrySendError::Full(Input::Fault { event, .. })) => {
                    front.event = event;
                    break;
                }
                // try_send hands back the input it was given: always a Fault.
                Err(TrySendError::Full(_)) => break,
                Err(TrySendError::Disconnected(_)) => return self.gone(),
            }
        }
        SendStatus::Accepted
    }

    /// Delivers every held event, waiting up to `timeout` for room; what is
    /// still held afterwards is counted dropped (shutdown). Returns the lowest
    /// `kmsg_seq` among the events not delivered, so the cursor stays before
    /// them and they are read again at the next start.
    pub(crate) fn drain(&mut self, timeout: Duration) -> Option<u64> {
        let deadline = Instant::now() + timeout;
        let mut lowest_lost: Option<u64> = None;
        while let Some(PendingFault {
            event,
            read_at,
            seq,
            ..
        }) = self.pop_front()
        {
            let left = deadline.saturating_duration_since(Instant::now());
            let action = event.action();
            let sent = self.tx.send_timeout(Input::Fault { event, read_at }, left);
            if let Err(e) = sent {
                if matches!(e, crossbeam_channel::SendTimeoutError::Disconnected(_)) {
                    self.disconnected = true;
                }
                self.dropped(action, 1);
                if let Some(s) = seq {
                    lowest_lost = Some(lowest_lost.map_or(s, |l| l.min(s)));
                }
            }
        }
        lowest_lost
    }

    /// Sends `input` only when it keeps its place in the order: nothing is
    /// held and the channel has room now (the kmsg position: a later report
    /// replaces one that could not go).
    pub(crate) fn try_send_in_order(&mut self, input: Input) -> InOrder {
        if self.live > 0 {
            return InOrder::Deferred;
        }
        match self.tx.try_send(input) {
            Ok(()) => InOrder::Sent,
            Err(TrySendError::Full(_)) => InOrder::Deferred,
            Err(TrySendError::Disconnected(_)) => {
                self.disconnected = true;
                InOrder::Disconnected
            }
        }
    }

    /// Sends an input, waiting up to `timeout` for room, after every held
    /// event. False when it could not be sent in time.
    pub(crate) fn send_in_order_timeout(&mut self, input: Input, timeout: Duration) -> bool {
        if self.live > 0 {
            return false;
        }
        match self.tx.send_timeout(input, timeout) {
            Ok(()) => true,
            Err(e) => {
                if matches!(e, crossbeam_channel::SendTimeoutError::Disconnected(_)) {
                    self.disconnected = true;
                }
                false
            }
        }
    }

    /// Sends a non-fault input (monitor status), waiting for room.
    pub(crate) fn send_control(&mut self, input: Input) -> SendStatus {
        if self.flush() == SendStatus::Disconnected {
            return SendStatus::Disconnected;
        }
        match self.tx.send(input) {
            Ok(()) => SendStatus::Accepted,
            Err(_) => self.gone(),
        }
    }
}

/// Forwards NVML inputs into the engine channel with the drop-oldest policy
/// for samples. Returns when the NVML senders are gone or the engine is gone,
/// or at once when `shutdown` is triggered (after passing on the non-sample
/// inputs already queued; samples are disposable at shutdown). Idle, it
/// blocks until an input arrives or shutdown is triggered.
pub(crate) fn forward_nvml(
    rx: Receiver<Input>,
    tx: Sender<Input>,
    registry: Arc<Registry>,
    shutdown: Shutdown,
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
        let received = if held.is_some() {
            // The engine channel is full: offer the held samples again soon.
            rx.recv_timeout(Duration::from_millis(5))
        } else {
            crossbeam_channel::select! {
                recv(rx) -> input => input.map_err(|_| RecvTimeoutError::Disconnected),
                recv(shutdown.receiver()) -> _ => Err(RecvTimeoutError::Timeout),
            }
        };
        match received {
            Ok(s @ Input::Samples { .. }) => {
                if held.replace(s).is_some() {
                    registry.count(Tally::SamplesDropped, 1);
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
                if shutdown.is_triggered() {
                    for input in rx.try_iter() {
                        if !matches!(input, Input::Samples { .. }) && tx.send(input).is_err() {
                            return;
                        }
                    }
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

/// The fault events waiting in an engine channel now (other inputs are
/// discarded): what a source under test delivered.
#[cfg(test)]
pub(crate) fn faults(rx: &Receiver<Input>) -> Vec<FaultEvent> {
    rx.try_iter()
        .filter_map(|i| match i {
            Input::Fault { event, .. } => Some(event),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::bounded;
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

    fn with_action(mut ev: FaultEvent, action: Action) -> FaultEvent {
        ev.set_action(action);
        ev
    }

    /// A full buffer: a more severe event evicts the oldest least severe held
    /// one; an event with nothing less severe to evict is itself dropped.
    /// Each drop is counted by action class.
    #[test]
    fn drops_are_counted_per_action_class() {
        let reg = Registry::new();
        let (tx, rx) = bounded(1);
        let mut s = FaultSender::with_capacity(tx, reg.clone(), 2);
        let now = Instant::now();
        s.send(with_action(xid("a", 13), Action::RestartApp), now); // sent
        s.send(with_action(xid("b", 13), Action::RestartApp), now); // held
        s.send(with_action(xid("c", 31), Action::RestartApp), now); // held
        s.send(with_action(xid("d", 79), Action::RebootNode), now); // evicts b
        s.send(with_action(xid("e", 43), Action::Ignore), now); // dropped
        assert_eq!(reg.events(Stage::Parser, Outcome::Dropped), 2);
        assert_eq!(reg.source_drops(Action::RestartApp), 1);
        assert_eq!(reg.source_drops(Action::Ignore), 1);
        assert_eq!(reg.source_drops(Action::RebootNode), 0);
        s.flush();
        let mut got: Vec<(String, u32)> = faults(&rx)
            .into_iter()
            .map(|e| (e.pci_address, e.code))
            .collect();
        while s.pending() > 0 {
            s.flush();
            got.extend(faults(&rx).into_iter().map(|e| (e.pci_address, e.code)));
        }
        assert_eq!(
            got,
            vec![("a".into(), 13), ("c".into(), 31), ("d".into(), 79)]
        );
    }

    fn xid_at(pci: &str, code: u32, seq: u64) -> FaultEvent {
        let mut ev = xid(pci, code);
        ev.kmsg_seq = Some(seq);
        ev
    }

    /// The index must keep pointing at the right entry while
    /// the front of the buffer is delivered piece by piece.
    #[test]
    fn coalescing_finds_the_right_entry_after_partial_deliveries() {
        let reg = Registry::new();
        let (tx, rx) = bounded(1);
        let mut s = FaultSender::new(tx, reg.clone());
        let now = Instant::now();
        s.send(xid("x", 1), now); // fills the channel
        for code in 10..20 {
            s.send(xid("a", code), now); // held, in order
        }
        assert_eq!(s.pending(), 10);
        // Deliver the first three held events one at a time.
        // (Each flush moves the next held event into the channel, which is
        // full again afterwards.)
        let mut delivered = Vec::new();
        for _ in 0..3 {
            delivered.extend(faults(&rx).iter().map(|e| e.code));
            s.flush();
        }
        assert_eq!(delivered, vec![1, 10, 11]);
        assert_eq!(s.pending(), 7, "12 is in the channel, 13..=19 held");
        // Coalesce into entries behind the (moved) front.
        for _ in 0..4 {
            s.send(xid("a", 15), now);
        }
        s.send(xid("a", 19), now);
        // A code already delivered is a new entry at the back.
        s.send(xid("a", 10), now);
        assert_eq!(s.pending(), 8);
        let mut rest = Vec::new();
        loop {
            rest.extend(faults(&rx).iter().map(|e| (e.code, e.count)));
            if s.pending() == 0 {
                break;
            }
            s.flush();
        }
        assert_eq!(
            rest,
            vec![
                (12, 1),
                (13, 1),
                (14, 1),
                (15, 5),
                (16, 1),
                (17, 1),
                (18, 1),
                (19, 2),
                (10, 1)
            ]
        );
        assert_eq!(reg.events(Stage::Parser, Outcome::Coalesced), 5);
        assert_eq!(reg.events(Stage::Parser, Outcome::Dropped), 0);
    }

    #[test]
    fn a_storm_against_a_full_buffer_keeps_every_occurrence_counted() {
        let reg = Registry::new();
        let (tx, rx) = bounded(1);
        let mut s = FaultSender::new(tx, reg.clone());
        let now = Instant::now();
        s.send(xid("x", 1), now);
        // PENDING_CAPACITY distinct faults, each repeated: 100 k events held
        // with a full buffer (quadratic before: a linear find per event).
        let n = 100_000u32;
        for i in 0..n {
            let bus = i % PENDING_CAPACITY as u32;
            s.send(xid(&format!("0000:{bus:04x}:00.0"), 31), now);
        }
        s.send(xid("extra", 31), now); // one distinct fault too many
        assert_eq!(s.pending(), PENDING_CAPACITY);
        assert_eq!(reg.events(Stage::Parser, Outcome::Dropped), 1);
        assert_eq!(
            reg.events(Stage::Parser, Outcome::Coalesced),
            u64::from(n) - PENDING_CAPACITY as u64
        );
        let mut total = 0u64;
        loop {
            total += faults(&rx).iter().map(|e| u64::from(e.count)).sum::<u64>();
            if s.pending() == 0 {
                break;
            }
            s.flush();
        }
        assert_eq!(total, 1 + u64::from(n), "every occurrence delivered");
    }

    #[test]
    fn lowest_pending_seq_and_drain_report_what_did_not_reach_the_engine() {
        let reg = Registry::new();
        let (tx, rx) = bounded(1);
        let mut s = FaultSender::new(tx, reg.clone());
        let now = Instant::now();
        assert_eq!(s.lowest_pending_seq(), None);
        s.send(xid_at("a", 1, 5), now);
        assert_eq!(s.lowest_pending_seq(), None, "sent, not held");
        s.send(xid_at("a", 2, 7), now);
        s.send(xid_at("a", 3, 9), now);
        s.send(xid_at("a", 2, 11), now); // coalesced into seq 7
        assert_eq!(s.lowest_pending_seq(), Some(7));
        assert_eq!(faults(&rx).len(), 1);
        s.flush(); // seq 7 delivered, 9 held
        assert_eq!(s.lowest_pending_seq(), Some(9));
        assert_eq!(s.drain(Duration::from_millis(1)), Some(9));
        assert_eq!(reg.events(Stage::Parser, Outcome::Dropped), 1);
        assert_eq!(s.pending(), 0);
        assert!(!s.is_disconnected());
        drop(rx);
        s.send(xid_at("a", 4, 12), now);
        assert!(s.is_disconnected());
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
        let shutdown = Shutdown::new();
        // Fill the engine channel so the forwarder must hold.
        etx.send(Input::Tick).unwrap();
        for i in 0..3u32 {
            ntx.send(Input::Samples {
                samples: vec![GpuSample {
                    index: i,
                    ..Default::default()
                }],
                complete: true,
            })
            .unwrap();
        }
        let (r2, s2) = (reg.clone(), shutdown.clone());
        let fwd_tx = etx.clone();
        let h = std::thread::spawn(move || forward_nvml(nrx, fwd_tx, r2, s2));
        // Let the forwarder read all three samples while the channel is full.
        let t0 = Instant::now();
        while reg.tally(Tally::SamplesDropped) < 2 && t0.elapsed().as_secs() < 5 {
            std::thread::yield_now();
        }
        assert_eq!(reg.tally(Tally::SamplesDropped), 2);
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
            Input::Samples { samples, .. } => {
                assert_eq!(samples[0].index, 2, "newest sample kept")
            }
            other => panic!("expected samples, got {other:?}"),
        }
        assert!(matches!(&got[2], Input::Fault { event, .. } if event.code == 79));
    }

    /// An idle forwarder blocks with nothing to time out on; triggering
    /// shutdown ends it at once even though the NVML senders are still alive
    /// (an abandoned NVML worker may hold one forever).
    #[test]
    fn an_idle_forwarder_stops_at_once_on_shutdown() {
        let (ntx, nrx) = bounded(16);
        let (etx, erx) = bounded(16);
        let shutdown = Shutdown::new();
        let stop = shutdown.clone();
        let h = std::thread::spawn(move || forward_nvml(nrx, etx, Registry::new(), stop));
        ntx.send(Input::KmsgCaughtUp).unwrap();
        assert!(matches!(
            erx.recv_timeout(Duration::from_secs(5)),
            Ok(Input::KmsgCaughtUp)
        ));
        std::thread::sleep(Duration::from_millis(300));
        assert!(!h.is_finished());
        shutdown.trigger();
        // Without the signal it would block for ever: 10 s is only what a
        // loaded machine may need to wake it.
        gpuwatch_core::join_by(h, Instant::now() + Duration::from_secs(10))
            .expect("the forwarder kept waiting after shutdown")
            .unwrap();
        drop(ntx);
    }

    /// A fault queued when shutdown comes is passed on before the forwarder
    /// returns (samples may not be: they are disposable at shutdown).
    #[test]
    fn a_stopping_forwarder_passes_on_a_queued_fault() {
        let (ntx, nrx) = bounded(16);
        let (etx, erx) = bounded(16);
        let shutdown = Shutdown::new();
        shutdown.trigger();
        ntx.send(Input::Samples {
            samples: vec![GpuSample::default()],
            complete: true,
        })
        .unwrap();
        ntx.send(Input::Fault {
            event: xid("a", 79),
            read_at: Instant::now(),
        })
        .unwrap();
        forward_nvml(nrx, etx, Registry::new(), shutdown);
        let got: Vec<Input> = erx.try_iter().collect();
        assert!(
            got.iter()
                .any(|i| matches!(i, Input::Fault { event, .. } if event.code == 79)),
            "{got:?}"
        );
        drop(ntx);
    }
}
