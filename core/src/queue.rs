//! The bounded queue between a sink's `send` (on the health-engine thread,
//! which must never block) and the thread or task that writes the sink's
//! output.
//!
//! - **Bounded, drop-oldest.** A push into a full queue pushes the oldest item
//!   out; every drop is counted (at the queue's [`Counts`]). The newest faults
//!   are the ones an operator is reading when the output comes back.
//! - **Batches with an in-flight mark.** The consumer takes a batch (up to a
//!   size, waiting up to a linger time for it to fill), writes it, and
//!   settles it: written (removed, counted emitted/dropped) or to retry (kept
//!   at the head). Items a push evicts while their batch is in flight are
//!   counted once the batch settles: emitted if it was written, dropped if not.
//! - **Every item counted exactly once**: emitted when written, dropped when
//!   evicted, refused after the stop, or left at the end.
//! - **Flush and stop with deadlines.** [`SinkQueue::flush`] waits until what
//!   is queued is written; [`SinkQueue::stop`] lets the consumer drain (fully,
//!   or until a deadline) and then end.
//!
//! A **keyed** queue ([`SinkQueue::keyed`], the Kubernetes Events) differs
//! where its items are one per key and its consumer an async task writing one
//! at a time:
//! - a push whose key matches a waiting item (not the one being written)
//!   merges into it (counted coalesced);
//! - the capacity bounds the waiting items only: the item being written is
//!   the consumer's, and goes back to the head for a retry only when it fits
//!   (else it is dropped, counted);
//! - the consumer may defer an item until a time ([`SinkQueue::defer`]);
//!   pushes of its key merge into it meanwhile, and it is taken again (marked
//!   due) at that time, or at once while a flush is under way or once
//!   stopping;
//! - the consumer counts the outcome of what it wrote itself
//!   ([`Settled::Counted`]), and is woken through a tokio [`Notify`].

use crate::{Outcome, Registry, Stage};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Where a queue counts what becomes of its items
/// (`gpuwatch.events{stage, outcome}`).
pub trait Counts: std::fmt::Debug + Send + Sync {
    /// Counts `n` items that ended as `outcome`.
    fn count_events(&self, outcome: Outcome, n: u64);
}

/// Counts at one stage of the registry.
struct AtStage {
    registry: Arc<Registry>,
    stage: Stage,
}

impl std::fmt::Debug for AtStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.stage.fmt(f)
    }
}

impl Counts for AtStage {
    fn count_events(&self, outcome: Outcome, n: u64) {
        self.registry.count_events(self.stage, outcome, n);
    }
}

/// Items of a keyed queue (module doc).
pub trait Keyed: Clone {
    /// Items of equal keys are one: a push merges into the waiting one.
    fn key(&self) -> &str;
    /// Takes in `newer`, an item of the same key pushed after this one.
    fn merge(&mut self, newer: Self);
    /// Marks an item taken again after its deferral.
    fn mark_due(&mut self);
}

/// How long the consumer drains after [`SinkQueue::stop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Everything queued is written first (a writer that cannot block the
    /// stopping thread, which does not wait for it).
    All,
    /// Batches are taken until this instant; what is left then is dropped.
    Until(Instant),
}

/// What became of a batch the consumer took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The batch is done with: `written` of its items reached the output,
    /// the rest are lost (counted dropped).
    Done {
        /// Items of the batch the output took.
        written: usize,
    },
    /// The batch is done with and the consumer counted each item's outcome
    /// itself (keyed queues).
    Counted,
    /// Nothing was written; the batch stays at the head for another try.
    Retry,
}

/// The two kinds of queue (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Batches,
    Keyed,
}

/// The batch being written.
#[derive(Debug, Clone, Copy, Default)]
struct InFlight {
    /// Its items still at the head of the queue.
    queued: usize,
    /// Its items a push evicted from the queue meanwhile.
    evicted: u64,
}

struct QueueState<T> {
    /// The in-flight batch's items (if any) first.
    items: VecDeque<Arc<T>>,
    inflight: Option<InFlight>,
    /// Items the consumer deferred, with when they are due (keyed queues).
    deferred: Vec<(Instant, Arc<T>)>,
    flush_requested: bool,
    stop: Option<Drain>,
    finished: bool,
    /// The batch size the consumer waits for (its last `next_batch`).
    batch_max: usize,
}

impl<T> QueueState<T> {
    /// Items waiting to be taken (the in-flight batch's are not).
    fn waiting(&self) -> usize {
        self.items.len() - self.inflight.map_or(0, |f| f.queued)
    }

    /// Nothing queued, deferred or being written.
    fn idle(&self) -> bool {
        self.items.is_empty() && self.inflight.is_none() && self.deferred.is_empty()
    }
}

/// A bounded drop-oldest queue with one consumer (module doc).
pub struct SinkQueue<T> {
    state: Mutex<QueueState<T>>,
    /// Wakes a consumer thread (new items, flush, stop).
    work: Condvar,
    /// Wakes a consumer task (keyed queues; new items, flush, stop).
    waker: Option<Arc<Notify>>,
    /// Wakes `flush` / `stop_and_wait` waiters (queue drained, consumer done).
    idle: Condvar,
    capacity: usize,
    mode: Mode,
    counts: Arc<dyn Counts>,
}

impl<T> std::fmt::Debug for SinkQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkQueue")
            .field("counts", &self.counts)
            .field("capacity", &self.capacity)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl<T> SinkQueue<T> {
    /// A queue of at most `capacity` items (at least one), counting at `stage`.
    pub fn new(capacity: usize, stage: Stage, registry: Arc<Registry>) -> SinkQueue<T> {
        SinkQueue::with_mode(
            capacity,
            Mode::Batches,
            Arc::new(AtStage { registry, stage }),
            None,
        )
    }

    fn with_mode(
        capacity: usize,
        mode: Mode,
        counts: Arc<dyn Counts>,
        waker: Option<Arc<Notify>>,
    ) -> SinkQueue<T> {
        SinkQueue {
            state: Mutex::new(QueueState {
                items: VecDeque::new(),
                inflight: None,
                deferred: Vec::new(),
                flush_requested: false,
                stop: None,
                finished: false,
                batch_max: 1,
            }),
            work: Condvar::new(),
            waker,
            idle: Condvar::new(),
            capacity: capacity.max(1),
            mode,
            counts,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, outcome: Outcome, n: u64) {
        if n > 0 {
            self.counts.count_events(outcome, n);
        }
    }

    /// Queues `item`; never blocks beyond a short mutex hold.
    pub fn push(&self, item: T) {
        self.push_unless(item, |_| false);
    }

    /// Hands `item` to `bypass` instead of queueing it when nothing is queued
    /// or being written (so order holds); `bypass` returns whether it took
    /// the item, and runs with the queue locked, so the consumer cannot start
    /// a batch meanwhile. Otherwise (or when `bypass` declines) queues it.
    pub fn push_unless(&self, item: T, bypass: impl FnOnce(&T) -> bool) {
        let st = self.lock();
        if st.stop.is_some() {
            drop(st);
            self.count(Outcome::Dropped, 1);
            return;
        }
        if st.items.is_empty() && st.inflight.is_none() && bypass(&item) {
            return;
        }
        self.enqueue(st, item);
    }

    /// [`SinkQueue::push_unless`] for several items, in order, with one
    /// lock and at most one wake-up of the consumer: when nothing is queued
    /// or being written, `bypass` is offered the items and returns how many
    /// of the first it took (it runs with the queue locked); the rest are
    /// queued.
    pub fn push_many_unless(&self, items: Vec<T>, bypass: impl FnOnce(&[T]) -> usize) {
        if items.is_empty() {
            return;
        }
        let mut st = self.lock();
        if st.stop.is_some() {
            drop(st);
            self.count(Outcome::Dropped, items.len() as u64);
            return;
        }
        let n = items.len();
        let taken = if st.items.is_empty() && st.inflight.is_none() {
            bypass(&items).min(n)
        } else {
            0
        };
        let mut wake = false;
        for item in items.into_iter().skip(taken) {
            wake |= self.enqueue_locked(&mut st, item);
        }
        drop(st);
        if wake {
            self.work.notify_one();
        }
        if taken < n
            && let Some(waker) = &self.waker
        {
            waker.notify_one();
        }
    }

    /// Queues `item` at the tail, pushing the oldest out of a full queue
    /// (module doc: what the capacity bounds), and wakes the consumer when
    /// it waits for this push.
    fn enqueue(&self, mut st: MutexGuard<'_, QueueState<T>>, item: T) {
        let wake = self.enqueue_locked(&mut st, item);
        drop(st);
        if wake {
            self.work.notify_one();
        }
        if let Some(waker) = &self.waker {
            waker.notify_one();
        }
    }

    /// [`SinkQueue::enqueue`] with the lock held by the caller; true when the
    /// consumer thread is to be woken.
    fn enqueue_locked(&self, st: &mut QueueState<T>, item: T) -> bool {
        match self.mode {
            Mode::Batches => {
                if st.items.len() >= self.capacity && st.items.pop_front().is_some() {
                    match &mut st.inflight {
                        Some(f) if f.queued > 0 => {
                            f.queued -= 1;
                            f.evicted += 1;
                        }
                        _ => self.count(Outcome::Dropped, 1),
                    }
                }
            }
            Mode::Keyed => {
                let oldest = st.items.len() - st.waiting();
                if st.waiting() >= self.capacity && st.items.remove(oldest).is_some() {
                    self.count(Outcome::Dropped, 1);
                }
            }
        }
        st.items.push_back(Arc::new(item));
        // The consumer waits for a first item, then (lingering) for a full
        // batch: any other push needs no wake-up (a syscall on the engine
        // thread saved per event).
        st.items.len() == 1 || st.items.len() >= st.batch_max
    }

    /// The most items the queue holds (keyed: waiting items).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counts an item that reached the output without being queued (a
    /// bypass, or a producer writing on its own thread): emitted, or dropped
    /// when the output lost it.
    pub fn count_unqueued(&self, written: bool) {
        self.count_unqueued_many(usize::from(written), usize::from(!written));
    }

    /// [`SinkQueue::count_unqueued`] for `written` items that reached the
    /// output and `lost` that did not.
    pub fn count_unqueued_many(&self, written: usize, lost: usize) {
        self.count(Outcome::Emitted, written as u64);
        self.count(Outcome::Dropped, lost as u64);
    }

    /// Items waiting (including a batch being written, and deferred ones).
    pub fn len(&self) -> usize {
        let st = self.lock();
        st.items.len() + st.deferred.len()
    }

    /// No item waiting ([`SinkQueue::len`] is 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Asks the consumer to write now and waits until the queue is empty (or
    /// the consumer ended) or `timeout` passed; true when it is empty.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.ask_flush();
        let flushed = self.wait_flushed(deadline);
        if self.mode == Mode::Keyed {
            self.end_flush();
        }
        flushed
    }

    /// Asks the consumer to write now (a keyed queue's consumer: to take
    /// deferred items at once, until [`SinkQueue::end_flush`]).
    pub fn ask_flush(&self) {
        self.lock().flush_requested = true;
        self.work.notify_all();
        if let Some(waker) = &self.waker {
            waker.notify_one();
        }
    }

    /// Waits until the queue is empty (or the consumer ended) or `deadline`
    /// passed; true when it is empty.
    pub fn wait_flushed(&self, deadline: Instant) -> bool {
        let st = self.wait_until(self.lock(), deadline, |st| st.finished || st.idle());
        st.is_some_and(|st| st.items.is_empty() && st.deferred.is_empty())
    }

    /// Ends a keyed queue's flush, done or not: deferred items wait for
    /// their time again. (Another queue's flush ends once its consumer finds
    /// it empty.)
    pub fn end_flush(&self) {
        self.lock().flush_requested = false;
    }

    /// Waits on `idle` until `done` holds (`Some`) or `deadline` passes
    /// (`None`).
    fn wait_until<'a>(
        &'a self,
        mut st: MutexGuard<'a, QueueState<T>>,
        deadline: Instant,
        done: impl Fn(&QueueState<T>) -> bool,
    ) -> Option<MutexGuard<'a, QueueState<T>>> {
        while !done(&st) {
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            st = self
                .idle
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Some(st)
    }

    /// Refuses new items from now on and tells the consumer to drain as
    /// `drain` says and end. Does not wait.
    pub fn stop(&self, drain: Drain) {
        let mut st = self.lock();
        if st.stop.is_none() {
            st.stop = Some(drain);
        }
        self.work.notify_all();
        drop(st);
        if let Some(waker) = &self.waker {
            waker.notify_one();
        }
    }

    /// [`SinkQueue::stop`] until `timeout` from now, then waits (up to the
    /// same deadline) for the consumer to end; false when it did not.
    pub fn stop_and_wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.stop(Drain::Until(deadline));
        self.wait_until(self.lock(), deadline, |st| st.finished)
            .is_some()
    }

    /// True while the consumer writes a batch.
    pub fn in_flight(&self) -> bool {
        self.lock().inflight.is_some()
    }

    /// True once [`SinkQueue::stop`] was called.
    pub fn stopping(&self) -> bool {
        self.lock().stop.is_some()
    }

    /// The consumer's wait for its next batch: up to `max` items, once
    /// `max` are queued, a flush is asked, the stop drains, or the first
    /// item has waited `linger`. `None` when the consumer should end.
    pub fn next_batch(&self, max: usize, linger: Duration) -> Option<Vec<Arc<T>>> {
        let max = max.max(1);
        let mut st = self.lock();
        st.batch_max = max;
        let mut first_seen: Option<Instant> = None;
        loop {
            if let Some(drain) = st.stop {
                let past = matches!(drain, Drain::Until(d) if Instant::now() >= d);
                if st.items.is_empty() || past {
                    return None;
                }
                break;
            }
            if st.items.is_empty() {
                first_seen = None;
                st.flush_requested = false;
                self.idle.notify_all();
                st = self.work.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let waited = first_seen.get_or_insert_with(Instant::now).elapsed();
            if st.items.len() >= max || st.flush_requested || waited >= linger {
                break;
            }
            st = self
                .work
                .wait_timeout(st, linger - waited)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let batch: Vec<Arc<T>> = st.items.iter().take(max).cloned().collect();
        st.inflight = Some(InFlight {
            queued: batch.len(),
            evicted: 0,
        });
        Some(batch)
    }

    /// Settles the batch the consumer took (module doc); true when it stays
    /// at the head for another try (a keyed queue drops a retried item that
    /// no longer fits).
    pub fn settle(&self, batch_len: usize, settled: Settled) -> bool {
        let mut st = self.lock();
        let f = st.inflight.take().unwrap_or_default();
        // A finished queue was cleared under the batch.
        let queued = f.queued.min(st.items.len());
        let kept = match settled {
            Settled::Done { written } => {
                st.items.drain(..queued);
                let written = written.min(batch_len);
                self.count(Outcome::Emitted, written as u64);
                self.count(Outcome::Dropped, (batch_len - written) as u64);
                false
            }
            Settled::Counted => {
                st.items.drain(..queued);
                false
            }
            Settled::Retry
                if self.mode == Mode::Keyed && st.items.len() - queued >= self.capacity =>
            {
                st.items.drain(..queued);
                self.count(Outcome::Dropped, f.queued as u64 + f.evicted);
                false
            }
            Settled::Retry => {
                self.count(Outcome::Dropped, f.evicted);
                true
            }
        };
        if st.idle() {
            self.idle.notify_all();
        }
        kept
    }

    /// Sleeps for a retry delay unless a stop comes first; false when the
    /// consumer should not try again (stopping with no time left).
    pub fn backoff(&self, delay: Duration) -> bool {
        let until = Instant::now() + delay;
        let mut st = self.lock();
        loop {
            match st.stop {
                // One last try while the drain deadline allows.
                Some(Drain::Until(deadline)) => return Instant::now() < deadline,
                Some(Drain::All) => return true,
                None => {}
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            st = self
                .work
                .wait_timeout(st, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The consumer's end: counts what is left (deferred items included) as
    /// dropped (returned) and wakes whoever waits for it.
    pub fn finish(&self) -> u64 {
        let mut st = self.lock();
        let left = (st.items.len() + st.deferred.len()) as u64;
        st.items.clear();
        st.deferred.clear();
        self.count(Outcome::Dropped, left);
        st.finished = true;
        self.idle.notify_all();
        left
    }
}

impl<T: Keyed> SinkQueue<T> {
    /// A keyed queue (module doc) of at most `capacity` waiting items (at
    /// least one), counting at `counts`, that wakes its consumer task through
    /// `waker`.
    pub fn keyed(capacity: usize, counts: Arc<dyn Counts>, waker: Arc<Notify>) -> SinkQueue<T> {
        SinkQueue::with_mode(capacity, Mode::Keyed, counts, Some(waker))
    }

    /// Merges `item` into the deferred or waiting item of its key (counted
    /// coalesced), or else queues it; never blocks beyond a short mutex hold.
    pub fn push_or_merge(&self, item: T) {
        let mut guard = self.lock();
        if guard.stop.is_some() {
            drop(guard);
            self.count(Outcome::Dropped, 1);
            return;
        }
        let st = &mut *guard;
        let in_flight = st.items.len() - st.waiting();
        let same = st
            .deferred
            .iter_mut()
            .map(|(_, queued)| queued)
            .chain(st.items.iter_mut().skip(in_flight))
            .find(|queued| queued.key() == item.key());
        if let Some(queued) = same {
            Arc::make_mut(queued).merge(item);
            drop(guard);
            self.count(Outcome::Coalesced, 1);
            return;
        }
        self.enqueue(guard, item);
    }

    /// Moves the deferred items that are due (all of them while a flush is
    /// under way or once stopping) to the head, marked due.
    pub fn release_due(&self) {
        let mut guard = self.lock();
        let st = &mut *guard;
        let all = st.flush_requested || st.stop.is_some();
        let now = Instant::now();
        let mut i = 0;
        while i < st.deferred.len() {
            if all || st.deferred[i].0 <= now {
                let (_, mut item) = st.deferred.swap_remove(i);
                Arc::make_mut(&mut item).mark_due();
                st.items.push_front(item);
            } else {
                i += 1;
            }
        }
    }

    /// The consumer's next item, without waiting ([`SinkQueue::release_due`]
    /// first). It stays queued, in flight, until settled
    /// ([`SinkQueue::settle`], [`SinkQueue::defer`]).
    pub fn take(&self) -> Option<T> {
        self.release_due();
        let mut st = self.lock();
        debug_assert!(st.inflight.is_none(), "one item in flight at a time");
        let Some(item) = st.items.front() else {
            if st.idle() {
                self.idle.notify_all();
            }
            return None;
        };
        let item = T::clone(item);
        st.inflight = Some(InFlight {
            queued: 1,
            evicted: 0,
        });
        Some(item)
    }

    /// Settles the item being written by deferring it until `due` (merged
    /// into one already deferred for its key).
    pub fn defer(&self, due: Instant) {
        let mut guard = self.lock();
        let st = &mut *guard;
        let queued = st.inflight.take().map_or(0, |f| f.queued);
        let taken: Vec<Arc<T>> = st.items.drain(..queued.min(st.items.len())).collect();
        for item in taken {
            match st.deferred.iter_mut().find(|(_, d)| d.key() == item.key()) {
                Some((_, deferred)) => Arc::make_mut(deferred).merge(T::clone(&item)),
                None => st.deferred.push((due, item)),
            }
        }
    }

    /// When the earliest deferred item is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.lock().deferred.iter().map(|(due, _)| *due).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(capacity: usize) -> (Arc<Registry>, Arc<SinkQueue<u32>>) {
        let reg = Registry::new();
        let q = Arc::new(SinkQueue::new(capacity, Stage::Stdout, reg.clone()));
        (reg, q)
    }

    fn counts(reg: &Registry) -> (u64, u64) {
        (
            reg.events(Stage::Stdout, Outcome::Emitted),
            reg.events(Stage::Stdout, Outcome::Dropped),
        )
    }

    fn items(b: &[Arc<u32>]) -> Vec<u32> {
        b.iter().map(|i| **i).collect()
    }

    #[test]
    fn a_full_queue_drops_the_oldest_and_counts_each() {
        let (reg, q) = queue(3);
        for i in 0..5 {
            q.push(i);
        }
        assert_eq!(counts(&reg), (0, 2));
        let b = q.next_batch(10, Duration::ZERO).unwrap();
        assert_eq!(items(&b), [2, 3, 4]);
        q.settle(b.len(), Settled::Done { written: 3 });
        assert_eq!(counts(&reg), (3, 2));
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn a_batch_to_retry_stays_at_the_head_and_evictions_meanwhile_count_once() {
        let (reg, q) = queue(2);
        q.push(1);
        q.push(2);
        let b = q.next_batch(2, Duration::ZERO).unwrap();
        // Both in flight are pushed out while the write is under way.
        q.push(3);
        q.push(4);
        assert_eq!(counts(&reg), (0, 0));
        q.settle(b.len(), Settled::Retry);
        assert_eq!(counts(&reg), (0, 2));
        assert_eq!(items(&q.next_batch(5, Duration::ZERO).unwrap()), [3, 4]);
        // Evicted in flight, then written: emitted, not dropped.
        q.push(5);
        q.settle(2, Settled::Done { written: 2 });
        assert_eq!(counts(&reg), (2, 2));
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn a_partly_written_batch_counts_the_rest_dropped() {
        let (reg, q) = queue(8);
        for i in 0..4 {
            q.push(i);
        }
        let b = q.next_batch(8, Duration::ZERO).unwrap();
        q.settle(b.len(), Settled::Done { written: 1 });
        assert_eq!(counts(&reg), (1, 3));
    }

    #[test]
    fn bypass_only_when_nothing_is_queued_or_in_flight() {
        let (_, q) = queue(8);
        let mut taken = Vec::new();
        q.push_unless(1, |i| {
            taken.push(*i);
            true
        });
        q.push(2);
        q.push_unless(3, |_| panic!("queued items come first"));
        let b = q.next_batch(8, Duration::ZERO).unwrap();
        assert_eq!(items(&b), [2, 3]);
        q.push_unless(4, |_| panic!("a batch is in flight"));
        q.settle(b.len(), Settled::Done { written: 2 });
        q.next_batch(8, Duration::ZERO).unwrap();
        q.settle(1, Settled::Done { written: 1 });
        q.push_unless(5, |_| false);
        assert_eq!(taken, [1]);
        assert_eq!(q.len(), 1, "declined: queued");
    }

    #[test]
    fn the_batch_waits_for_linger_size_or_flush() {
        let (_, q) = queue(8);
        q.push(1);
        let t0 = Instant::now();
        let b = q.next_batch(4, Duration::from_millis(100)).unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(90));
        q.settle(b.len(), Settled::Done { written: 1 });
        for i in 0..4 {
            q.push(i);
        }
        let t0 = Instant::now();
        assert_eq!(q.next_batch(4, Duration::from_secs(30)).unwrap().len(), 4);
        assert!(t0.elapsed() < Duration::from_secs(5));
        q.settle(4, Settled::Done { written: 4 });
        // A flush sends a part batch at once; it returns once it is written.
        q.push(9);
        let consumer = {
            let q = q.clone();
            std::thread::spawn(move || {
                let b = q.next_batch(4, Duration::from_secs(30)).unwrap();
                q.settle(b.len(), Settled::Done { written: b.len() });
            })
        };
        assert!(q.flush(Duration::from_secs(10)));
        consumer.join().unwrap();
    }

    #[test]
    fn a_stop_drains_then_ends_and_refuses_new_items() {
        let (reg, q) = queue(8);
        q.push(1);
        q.push(2);
        q.stop(Drain::All);
        q.push(3);
        assert_eq!(counts(&reg), (0, 1), "refused after the stop");
        let b = q.next_batch(1, Duration::from_secs(30)).unwrap();
        q.settle(b.len(), Settled::Done { written: 1 });
        let b = q.next_batch(1, Duration::from_secs(30)).unwrap();
        q.settle(b.len(), Settled::Done { written: 1 });
        assert!(q.next_batch(1, Duration::ZERO).is_none());
        assert_eq!(q.finish(), 0);
        assert_eq!(counts(&reg), (2, 1));
    }

    #[test]
    fn a_deadline_stop_drops_what_is_left_and_backoff_gives_up() {
        let (reg, q) = queue(8);
        q.push(1);
        q.push(2);
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || q.stop_and_wait(Duration::from_millis(50)))
        };
        // No consumer finishes: the stop's wait gives up at its deadline.
        // Joined first (not a fixed sleep), so the stop is surely asked for
        // and its deadline past, however late a loaded machine runs the
        // waiter, and the `finish` below cannot come before its deadline.
        assert!(
            !waiter.join().unwrap(),
            "the consumer ended after the deadline"
        );
        assert!(!q.backoff(Duration::from_secs(30)), "no time left");
        assert!(q.next_batch(8, Duration::ZERO).is_none());
        assert_eq!(q.finish(), 2);
        assert_eq!(counts(&reg), (0, 2));
        // A stop that finds the consumer ending in time says so.
        let (_, q) = queue(8);
        let consumer = {
            let q = q.clone();
            std::thread::spawn(move || {
                while q.next_batch(8, Duration::ZERO).is_some() {}
                q.finish();
            })
        };
        assert!(q.stop_and_wait(Duration::from_secs(10)));
        consumer.join().unwrap();
    }

    /// A keyed item: like a pending Kubernetes Event, `n` occurrences of
    /// `key`, merged by adding up.
    #[derive(Debug, Clone, PartialEq)]
    struct Ev {
        key: &'static str,
        n: u32,
        due: bool,
    }

    impl Keyed for Ev {
        fn key(&self) -> &str {
            self.key
        }
        fn merge(&mut self, newer: Ev) {
            self.n += newer.n;
        }
        fn mark_due(&mut self) {
            self.due = true;
        }
    }

    fn ev(key: &'static str, n: u32) -> Ev {
        Ev { key, n, due: false }
    }

    fn keyed(capacity: usize) -> (Arc<Registry>, Arc<Notify>, SinkQueue<Ev>) {
        let reg = Registry::new();
        let counts = Arc::new(AtStage {
            registry: reg.clone(),
            stage: Stage::Stdout,
        });
        let waker = Arc::new(Notify::new());
        let q = SinkQueue::keyed(capacity, counts, waker.clone());
        (reg, waker, q)
    }

    fn coalesced(reg: &Registry) -> u64 {
        reg.events(Stage::Stdout, Outcome::Coalesced)
    }

    #[test]
    fn a_keyed_push_merges_into_the_waiting_item_not_the_one_in_flight() {
        let (reg, _, q) = keyed(8);
        q.push_or_merge(ev("a", 1));
        q.push_or_merge(ev("a", 2));
        assert_eq!(coalesced(&reg), 1);
        assert_eq!(q.take(), Some(ev("a", 3)));
        // In flight: a new one queues behind it.
        q.push_or_merge(ev("a", 1));
        q.push_or_merge(ev("a", 1));
        assert_eq!(q.len(), 2);
        assert_eq!(coalesced(&reg), 2);
        q.settle(1, Settled::Counted);
        assert_eq!(q.take(), Some(ev("a", 2)));
        assert_eq!(counts(&reg), (0, 0), "the consumer counts what it wrote");
    }

    #[test]
    fn a_keyed_capacity_bounds_the_waiting_items_and_a_retry_must_fit() {
        let (reg, _, q) = keyed(2);
        q.push_or_merge(ev("a", 1));
        q.push_or_merge(ev("b", 1));
        assert_eq!(q.take().unwrap().key, "a");
        // "a" in flight is not counted against the bound.
        q.push_or_merge(ev("c", 1));
        assert_eq!(counts(&reg), (0, 0));
        assert_eq!(q.len(), 3);
        // Full: the oldest waiting ("b") goes, not the one in flight.
        q.push_or_merge(ev("d", 1));
        assert_eq!(counts(&reg), (0, 1));
        // The retry no longer fits: dropped.
        assert!(!q.settle(1, Settled::Retry));
        assert_eq!(counts(&reg), (0, 2));
        assert_eq!(q.take().unwrap().key, "c");
        // With room, a retry goes back to the head and is taken again.
        assert!(q.settle(1, Settled::Retry));
        assert_eq!(q.take().unwrap().key, "c");
    }

    #[test]
    fn a_deferred_item_merges_pushes_and_comes_back_due_at_its_time() {
        let (reg, _, q) = keyed(8);
        q.push_or_merge(ev("a", 1));
        q.take().unwrap();
        let due = Instant::now() + Duration::from_millis(50);
        q.defer(due);
        assert_eq!(q.next_due(), Some(due));
        q.push_or_merge(ev("a", 2));
        assert_eq!(coalesced(&reg), 1, "merged into the deferred one");
        assert_eq!(q.len(), 1);
        assert_eq!(q.take(), None, "not due yet");
        std::thread::sleep(Duration::from_millis(60));
        let a = q.take().unwrap();
        assert_eq!((a.n, a.due), (3, true));
        assert_eq!(q.next_due(), None);
        // One pushed while "a" was in flight, deferred in its turn, merges
        // into the one already deferred for the key.
        q.push_or_merge(ev("a", 4));
        q.defer(Instant::now() + Duration::from_secs(600));
        assert_eq!(q.take(), Some(ev("a", 4)));
        q.defer(Instant::now() + Duration::from_secs(900));
        assert_eq!(q.len(), 1);
        assert!(q.next_due().unwrap() < Instant::now() + Duration::from_secs(601));
        q.ask_flush();
        assert_eq!(q.take().map(|a| (a.n, a.due)), Some((7, true)));
    }

    #[test]
    fn a_keyed_flush_takes_deferred_items_at_once_and_waits_for_them() {
        let (reg, waker, q) = keyed(8);
        let q = Arc::new(q);
        q.push_or_merge(ev("a", 1));
        q.take().unwrap();
        q.defer(Instant::now() + Duration::from_secs(600));
        let consumer = {
            let q = q.clone();
            std::thread::spawn(move || {
                loop {
                    futures::executor::block_on(waker.notified());
                    if let Some(a) = q.take() {
                        q.settle(1, Settled::Counted);
                        return a;
                    }
                }
            })
        };
        assert!(q.flush(Duration::from_secs(10)));
        assert!(consumer.join().unwrap().due);
        // The flush is over: what is deferred now waits for its time.
        q.push_or_merge(ev("b", 1));
        q.take().unwrap();
        q.defer(Instant::now() + Duration::from_secs(600));
        assert!(!q.flush(Duration::from_millis(20)));
        assert_eq!(q.take(), None);
        // Once stopping, deferred items are taken at once; pushes are refused.
        q.stop(Drain::All);
        q.push_or_merge(ev("b", 1));
        assert_eq!(reg.events(Stage::Stdout, Outcome::Dropped), 1);
        assert!(q.take().unwrap().due);
        assert_eq!(q.finish(), 1);
    }

    #[test]
    fn a_keyed_queue_wakes_its_task_on_pushes_flushes_and_the_stop() {
        let (_, waker, q) = keyed(8);
        let woken = || futures::FutureExt::now_or_never(waker.notified()).is_some();
        q.push_or_merge(ev("a", 1));
        assert!(woken());
        q.push_or_merge(ev("a", 1));
        assert!(!woken(), "a merge needs no write of its own");
        q.ask_flush();
        assert!(woken());
        q.stop(Drain::All);
        assert!(woken());
    }
}
