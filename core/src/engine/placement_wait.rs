//! Fault records that wait for the node's placement to catch up with them.
//!
//! A pod that started a moment before its fault may not be in the engine's
//! pod listing yet, and a pod placed on a GPU a moment before the GPU failed
//! may not be in the kubelet's last device assignments. Naming the pods from
//! what the engine has would then say "pod UID only" or name no pod, while a
//! listing sent a few milliseconds later would know. So a published record
//! whose pods a fresher listing could still name waits: the engine asks the
//! edge for one ([`PlacementAsks`]) and publishes the record once a listing
//! sent after the record was read has arrived, the source reports itself
//! unavailable, or `placement_wait_ms` has passed, whichever comes first.
//!
//! Only the record waits. The fault is in the engine's state at once: the
//! verdicts, the Node conditions and the taint never wait for a listing.
//! Records leave in the order they were published (a record behind a waiting
//! one waits with it), and a kernel-log position reported while records wait
//! applies once they are out, so a state file never accounts for a record
//! that was not handed to the sinks.
//!
//! The wait is bounded: at most [`MAX_WAITING`] records, and once records
//! have been waiting without a break for [`BUSY_LIMIT_WAITS`] wait periods
//! (a storm of distinct faults, each asking again) new records no longer
//! wait for a listing, so the queue drains and the state can be written.

use super::model::Holder;
use crate::msg::KmsgPosition;
use crate::placement::Placement;
use gpuwatch_proto::FaultEvent;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Asks one placement source for a fresh listing; must not block (the
/// wiring wakes the source's task).
pub type Ask = Arc<dyn Fn() + Send + Sync>;

/// The placement sources the engine can ask for a fresh listing. A source
/// without an ask is not running: no record waits for it.
#[derive(Clone, Default)]
pub struct PlacementAsks {
    /// The node's pod listing (API server).
    pub pods: Option<Ask>,
    /// The kubelet's device assignments (PodResources).
    pub devices: Option<Ask>,
}

impl std::fmt::Debug for PlacementAsks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementAsks")
            .field("pods", &self.pods.is_some())
            .field("devices", &self.devices.is_some())
            .finish()
    }
}

/// Records waiting at most; beyond, the oldest is published at once.
pub(super) const MAX_WAITING: usize = 10_000;

/// Wait periods records may wait back to back before new ones stop waiting.
pub(super) const BUSY_LIMIT_WAITS: u64 = 5;

/// What a waiting record waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Needs {
    /// A pod listing sent after the record was read.
    pub(super) pods: bool,
    /// A kubelet `List` sent after the record was read.
    pub(super) devices: bool,
}

impl Needs {
    fn any(self) -> bool {
        self.pods || self.devices
    }
}

/// A published record held back.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) ev: FaultEvent,
    /// Where its fault lives (its pods are merged there once named).
    pub(super) holder: Holder,
    /// When its line was read (a listing sent after this knows its pods).
    pub(super) read_at: Instant,
    /// Engine clock (ns) after which it goes out whatever the listings say.
    pub(super) until: u64,
    pub(super) needs: Needs,
}

/// The records waiting for placement and the kernel-log position that
/// waits with them (module doc).
#[derive(Debug, Default)]
pub(super) struct PlacementWait {
    asks: PlacementAsks,
    waiting: VecDeque<Waiting>,
    held_position: Option<KmsgPosition>,
    /// Engine clock (ns) since when records have been waiting without a
    /// break.
    busy_since: Option<u64>,
}

impl PlacementWait {
    pub(super) fn set_asks(&mut self, asks: PlacementAsks) {
        self.asks = asks;
    }

    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// False when no record can be held: no source to ask and none waiting
    /// (the agent without Kubernetes or a kubelet: nothing else to check).
    pub(super) fn may_hold(&self) -> bool {
        self.asks.pods.is_some() || self.asks.devices.is_some() || !self.waiting.is_empty()
    }

    /// What a record read at `read_at` whose pods are `ev.pods` (and which
    /// names the pods holding some device when `wants_devices()`, asked only
    /// when the kubelet can be) should wait for at `now`, given `wait_ns`
    /// per record; asks the sources it needs.
    pub(super) fn needs(
        &self,
        ev: &FaultEvent,
        wants_devices: impl FnOnce() -> bool,
        read_at: Instant,
        placement: &Placement,
        now: u64,
        wait_ns: u64,
    ) -> Needs {
        let busy = self
            .busy_since
            .is_some_and(|t| now.saturating_sub(t) >= wait_ns.saturating_mul(BUSY_LIMIT_WAITS));
        if wait_ns == 0 || busy {
            return Needs::default();
        }
        let needs = Needs {
            pods: self.asks.pods.is_some() && placement.pods_behind(&ev.pods, read_at),
            devices: self.asks.devices.is_some()
                && placement.devices_behind(read_at)
                && wants_devices(),
        };
        if needs.pods
            && let Some(ask) = &self.asks.pods
        {
            ask();
        }
        if needs.devices
            && let Some(ask) = &self.asks.devices
        {
            ask();
        }
        needs
    }

    /// True when a record with `needs` must be held: it needs a listing, or
    /// records ahead of it wait (they leave in order).
    pub(super) fn must_hold(&self, needs: Needs) -> bool {
        needs.any() || !self.waiting.is_empty()
    }

    /// Holds a record; returns the oldest one when the queue is full (it
    /// goes out at once, as it is).
    pub(super) fn hold(&mut self, w: Waiting, now: u64) -> Option<Waiting> {
        self.busy_since.get_or_insert(now);
        self.waiting.push_back(w);
        (self.waiting.len() > MAX_WAITING)
            .then(|| self.waiting.pop_front())
            .flatten()
    }

    /// A kernel-log position: back when it applies now (nothing waits),
    /// else kept until the records ahead of it are out.
    pub(super) fn position(&mut self, position: KmsgPosition) -> Option<KmsgPosition> {
        if self.waiting.is_empty() {
            Some(position)
        } else {
            self.held_position = Some(position);
            None
        }
    }

    /// The records ready to go at `now`, oldest first, stopping at the
    /// first that still waits (`all`: every record, at shutdown); with the
    /// position that waited for them when none is left.
    pub(super) fn release(
        &mut self,
        now: u64,
        placement: &Placement,
        all: bool,
    ) -> (Vec<Waiting>, Option<KmsgPosition>) {
        let mut out = Vec::new();
        while let Some(w) = self.waiting.front() {
            if !all && now < w.until && still_behind(w, placement) {
                break;
            }
            out.extend(self.waiting.pop_front());
        }
        if !self.waiting.is_empty() {
            return (out, None);
        }
        self.busy_since = None;
        (out, self.held_position.take())
    }

    /// Engine clock (ns) when the oldest record goes out at the latest.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        self.waiting.front().map(|w| w.until)
    }
}

/// True when a listing the record waits for has not arrived (and its
/// source still works).
fn still_behind(w: &Waiting, placement: &Placement) -> bool {
    (w.needs.pods && placement.pods_behind(&w.ev.pods, w.read_at))
        || (w.needs.devices && placement.devices_behind(w.read_at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{PlacementUpdate, PodDirectory, PodInfo};
    use gpuwatch_proto::{PodRef, PodRole};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    const WAIT: u64 = 1_000_000_000;

    fn at(last_seq: u64) -> KmsgPosition {
        KmsgPosition {
            boot_id: "b".into(),
            last_seq,
        }
    }

    fn app_fault(uid: &str) -> FaultEvent {
        let mut p = PodRef {
            uid: uid.into(),
            ..Default::default()
        };
        p.set_role(PodRole::Caused);
        FaultEvent {
            code: 13,
            pods: vec![p],
            ..Default::default()
        }
    }

    fn counting() -> (Ask, Arc<AtomicU32>) {
        let n = Arc::new(AtomicU32::new(0));
        let m = n.clone();
        (
            Arc::new(move || {
                m.fetch_add(1, Ordering::Relaxed);
            }),
            n,
        )
    }

    fn waiting(ev: FaultEvent, read_at: Instant, needs: Needs, until: u64) -> Waiting {
        Waiting {
            ev,
            holder: Holder::Node,
            read_at,
            until,
            needs,
        }
    }

    fn listed(uid: &str) -> PlacementUpdate {
        PlacementUpdate::Pods(Arc::new(PodDirectory::new([PodInfo {
            uid: uid.into(),
            name: "trainer-0".into(),
            namespace: "ml".into(),
            ..Default::default()
        }])))
    }

    #[test]
    fn an_unknown_pod_waits_for_a_listing_sent_after_its_line_was_read() {
        let (ask, asked) = counting();
        let mut w = PlacementWait::default();
        w.set_asks(PlacementAsks {
            pods: Some(ask),
            devices: None,
        });
        let mut pl = Placement::default();
        pl.apply(listed("other"));
        let read_at = Instant::now();
        let ev = app_fault("new-pod");
        let needs = w.needs(&ev, || true, read_at, &pl, 0, WAIT);
        // No kubelet source: nothing to wait for from it.
        assert_eq!(
            needs,
            Needs {
                pods: true,
                devices: false
            }
        );
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        assert!(w.must_hold(needs));
        assert!(w.hold(waiting(ev, read_at, needs, WAIT), 0).is_none());
        // A later record that needs nothing waits behind it.
        assert!(w.must_hold(Needs::default()));
        w.hold(waiting(app_fault(""), read_at, Needs::default(), WAIT), 0);
        assert_eq!(w.position(at(7)), None);
        let (out, pos) = w.release(10, &pl, false);
        assert!(out.is_empty() && pos.is_none());
        // The listing the ask caused arrives: both leave, in order, then
        // the position that waited for them.
        pl.apply(listed("new-pod"));
        pl.apply(PlacementUpdate::PodsCurrent(
            read_at + Duration::from_millis(1),
        ));
        let (out, pos) = w.release(20, &pl, false);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].ev.pods[0].uid, "new-pod");
        assert_eq!(pos, Some(at(7)));
        assert!(w.is_empty());
        assert_eq!(w.position(at(7)), Some(at(7)));
    }

    #[test]
    fn a_record_goes_out_at_its_deadline_or_when_the_source_fails() {
        let (ask, _) = counting();
        let mut w = PlacementWait::default();
        w.set_asks(PlacementAsks {
            pods: Some(ask.clone()),
            devices: Some(ask),
        });
        let mut pl = Placement::default();
        let read_at = Instant::now();
        let needs = w.needs(&app_fault("u"), || true, read_at, &pl, 0, WAIT);
        assert!(needs.pods && needs.devices);
        w.hold(waiting(app_fault("u"), read_at, needs, WAIT), 0);
        assert_eq!(w.next_deadline(), Some(WAIT));
        assert!(w.release(WAIT - 1, &pl, false).0.is_empty());
        assert_eq!(w.release(WAIT, &pl, false).0.len(), 1);

        w.hold(waiting(app_fault("u"), read_at, needs, 2 * WAIT), WAIT);
        pl.apply(PlacementUpdate::PodsUnavailable("503".into()));
        // Still waiting for the kubelet.
        assert!(w.release(WAIT + 1, &pl, false).0.is_empty());
        pl.apply(PlacementUpdate::DevicesUnavailable("no socket".into()));
        assert_eq!(w.release(WAIT + 2, &pl, false).0.len(), 1);
        // Nothing to ask of a failed source.
        assert_eq!(
            w.needs(&app_fault("u"), || true, Instant::now(), &pl, WAIT, WAIT),
            Needs::default()
        );
    }

    #[test]
    fn no_source_no_wait_and_a_storm_stops_waiting() {
        let pl = Placement::default();
        let idle = PlacementWait::default();
        let now = Instant::now();
        assert_eq!(
            idle.needs(&app_fault("u"), || true, now, &pl, 0, WAIT),
            Needs::default()
        );
        assert!(!idle.must_hold(Needs::default()));

        let (ask, asked) = counting();
        let mut w = PlacementWait::default();
        w.set_asks(PlacementAsks {
            pods: Some(ask),
            devices: None,
        });
        assert_eq!(
            w.needs(&app_fault("u"), || false, now, &pl, 0, 0),
            Needs::default()
        );
        let needs = w.needs(&app_fault("u"), || false, now, &pl, 0, WAIT);
        w.hold(waiting(app_fault("u"), now, needs, WAIT), 0);
        let late = WAIT * BUSY_LIMIT_WAITS;
        assert!(
            w.needs(&app_fault("v"), || false, now, &pl, late - 1, WAIT)
                .pods
        );
        assert_eq!(
            w.needs(&app_fault("v"), || false, now, &pl, late, WAIT),
            Needs::default()
        );
        assert_eq!(asked.load(Ordering::Relaxed), 2);
        // Shutdown: everything goes.
        assert_eq!(w.release(0, &pl, true).0.len(), 1);
    }

    #[test]
    fn a_full_queue_lets_the_oldest_go() {
        let pl = Placement::default();
        let mut w = PlacementWait::default();
        let now = Instant::now();
        let needs = Needs {
            pods: true,
            devices: false,
        };
        for i in 0..MAX_WAITING {
            let mut ev = app_fault("u");
            ev.code = i as u32;
            assert!(w.hold(waiting(ev, now, needs, WAIT), 0).is_none());
        }
        let out = w
            .hold(waiting(app_fault("u"), now, needs, WAIT), 0)
            .unwrap();
        assert_eq!(out.ev.code, 0);
        assert!(w.release(0, &pl, false).0.is_empty());
    }
}
