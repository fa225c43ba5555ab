//! The bounded queue between a sink's `send` (on the health-engine thread,
//! which must never block) and the thread that writes the sink's output.
//!
//! - **Bounded, drop-oldest.** A push into a full queue pushes the oldest item
//!   out; every drop is counted at the queue's [`Stage`]. The newest faults
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

use gpuwatch_core::{Outcome, Registry, Stage};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long the consumer drains after [`SinkQueue::stop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drain {
    /// Everything queued is written first (a writer that cannot block the
    /// stopping thread, which does not wait for it).
    All,
    /// Batches are taken until this instant; what is left then is dropped.
    Until(Instant),
}

/// What became of a batch the consumer took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The batch is done with: `written` of its items reached the output,
    /// the rest are lost (counted dropped).
    Done {
        /// Items of the batch the output took.
        written: usize,
    },
    /// Nothing was written; the batch stays at the head for another try.
    Retry,
}

struct State<T> {
    items: VecDeque<(u64, Arc<T>)>,
    next_id: u64,
    /// Highest id of the batch being written, if any.
    inflight_upto: Option<u64>,
    /// Items of the in-flight batch a push evicted from the queue.
    evicted_inflight: u64,
    flush_requested: bool,
    stop: Option<Drain>,
    finished: bool,
    /// The batch size the consumer waits for (its last `next_batch`).
    batch_max: usize,
}

/// A bounded drop-oldest queue with one consumer (module doc).
pub(crate) struct SinkQueue<T> {
    state: Mutex<State<T>>,
    /// Wakes the consumer (new items, flush, stop).
    work: Condvar,
    /// Wakes `flush` / `stop_and_wait` waiters (queue drained, consumer done).
    idle: Condvar,
    capacity: usize,
    stage: Stage,
    registry: Arc<Registry>,
}

impl<T> std::fmt::Debug for SinkQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkQueue")
            .field("stage", &self.stage)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl<T> SinkQueue<T> {
    /// A queue of at most `capacity` items (at least one), counting at `stage`.
    pub(crate) fn new(capacity: usize, stage: Stage, registry: Arc<Registry>) -> SinkQueue<T> {
        SinkQueue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                next_id: 0,
                inflight_upto: None,
                evicted_inflight: 0,
                flush_requested: false,
                stop: None,
                finished: false,
                batch_max: 1,
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
            capacity: capacity.max(1),
            stage,
            registry,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, outcome: Outcome, n: u64) {
        if n > 0 {
            self.registry.count_events(self.stage, outcome, n);
        }
    }

    /// Queues `item`; never blocks beyond a short mutex hold.
    pub(crate) fn push(&self, item: T) {
        self.push_unless(item, |_| false);
    }

    /// Hands `item` to `bypass` instead of queueing it when nothing is queued
    /// or being written (so order holds); `bypass` returns whether it took
    /// the item, and runs with the queue locked, so the consumer cannot start
    /// a batch meanwhile. Otherwise (or when `bypass` declines) queues it.
    pub(crate) fn push_unless(&self, item: T, bypass: impl FnOnce(&T) -> bool) {
        let mut st = self.lock();
        if st.stop.is_some() {
            drop(st);
            self.count(Outcome::Dropped, 1);
            return;
        }
        if st.items.is_empty() && st.inflight_upto.is_none() && bypass(&item) {
            return;
        }
        if st.items.len() >= self.capacity
            && let Some((old, _)) = st.items.pop_front()
        {
            if st.inflight_upto.is_some_and(|upto| old <= upto) {
                st.evicted_inflight += 1;
            } else {
                self.count(Outcome::Dropped, 1);
            }
        }
        let id = st.next_id;
        st.next_id += 1;
        st.items.push_back((id, Arc::new(item)));
        // The consumer waits for a first item, then (lingering) for a full
        // batch: any other push needs no wake-up (a syscall on the engine
        // thread saved per event).
        let wake = st.items.len() == 1 || st.items.len() >= st.batch_max;
        drop(st);
        if wake {
            self.work.notify_one();
        }
    }

    /// Items waiting (including a batch being written).
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Asks the consumer to write now and waits until the queue is empty (or
    /// the consumer ended) or `timeout` passed; true when it is empty.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        st.flush_requested = true;
        self.work.notify_all();
        let st = self.wait_until(st, deadline, |st| {
            st.finished || st.items.is_empty() && st.inflight_upto.is_none()
        });
        st.is_some_and(|st| st.items.is_empty())
    }

    /// Waits on `idle` until `done` holds (`Some`) or `deadline` passes
    /// (`None`).
    fn wait_until<'a>(
        &'a self,
        mut st: MutexGuard<'a, State<T>>,
        deadline: Instant,
        done: impl Fn(&State<T>) -> bool,
    ) -> Option<MutexGuard<'a, State<T>>> {
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
    pub(crate) fn stop(&self, drain: Drain) {
        let mut st = self.lock();
        if st.stop.is_none() {
            st.stop = Some(drain);
        }
        self.work.notify_all();
    }

    /// [`SinkQueue::stop`] until `timeout` from now, then waits (up to the
    /// same deadline) for the consumer to end; false when it did not.
    pub(crate) fn stop_and_wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.stop(Drain::Until(deadline));
        self.wait_until(self.lock(), deadline, |st| st.finished)
            .is_some()
    }

    /// True while the consumer writes a batch.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> bool {
        self.lock().inflight_upto.is_some()
    }

    /// True once [`SinkQueue::stop`] was called.
    pub(crate) fn stopping(&self) -> bool {
        self.lock().stop.is_some()
    }

    /// The consumer's wait for its next batch: up to `max` items, once
    /// `max` are queued, a flush is asked, the stop drains, or the first
    /// item has waited `linger`. `None` when the consumer should end.
    pub(crate) fn next_batch(&self, max: usize, linger: Duration) -> Option<Vec<Arc<T>>> {
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
        let batch: Vec<(u64, Arc<T>)> = st.items.iter().take(max).cloned().collect();
        st.inflight_upto = batch.last().map(|(id, _)| *id);
        st.evicted_inflight = 0;
        Some(batch.into_iter().map(|(_, item)| item).collect())
    }

    /// Settles the batch [`SinkQueue::next_batch`] gave (module doc).
    pub(crate) fn settle(&self, batch_len: usize, settled: Settled) {
        let mut st = self.lock();
        let upto = st.inflight_upto.take();
        let evicted = std::mem::take(&mut st.evicted_inflight);
        match settled {
            Settled::Done { written } => {
                if let Some(upto) = upto {
                    while st.items.front().is_some_and(|(id, _)| *id <= upto) {
                        st.items.pop_front();
                    }
                }
                let written = written.min(batch_len);
                self.count(Outcome::Emitted, written as u64);
                self.count(Outcome::Dropped, (batch_len - written) as u64);
            }
            Settled::Retry => self.count(Outcome::Dropped, evicted),
        }
        if st.items.is_empty() {
            self.idle.notify_all();
        }
    }

    /// Sleeps for a retry delay unless a stop comes first; false when the
    /// consumer should not try again (stopping with no time left).
    pub(crate) fn backoff(&self, delay: Duration) -> bool {
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

    /// The consumer's end: counts what is left as dropped (returned) and
    /// wakes whoever waits for it.
    pub(crate) fn finish(&self) -> u64 {
        let mut st = self.lock();
        let left = st.items.len() as u64;
        st.items.clear();
        self.count(Outcome::Dropped, left);
        st.finished = true;
        self.idle.notify_all();
        left
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
        std::thread::sleep(Duration::from_millis(80));
        assert!(!q.backoff(Duration::from_secs(30)), "no time left");
        assert!(q.next_batch(8, Duration::ZERO).is_none());
        assert_eq!(q.finish(), 2);
        assert_eq!(counts(&reg), (0, 2));
        assert!(
            !waiter.join().unwrap(),
            "the consumer ended after the deadline"
        );
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
}
