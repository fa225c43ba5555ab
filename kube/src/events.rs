//! Kubernetes Events on the Node for fault events.
//!
//! `send` (health-engine thread) only queues: a bounded queue that coalesces an
//! event into a queued one of the same reason and GPU (count + n) and drops the
//! oldest beyond capacity, every drop counted (`gpuwatch.events{stage="kube_events"}`). A tokio
//! task writes them, paced (burst, then a rate per minute), and deduplicates against Events it
//! wrote (same reason + GPU within the window → `count`/`lastTimestamp` patch) and,
//! after a restart, against the Events already on the API (listed once).
//!
//! core/v1 Events are used (not events.k8s.io/v1): both are views of the same
//! stored object, but core/v1 carries `count`/`firstTimestamp`/`lastTimestamp`
//! that `kubectl describe node` and `kubectl get events` show directly, its field
//! selectors (`involvedObject.name`, `reason`) are what the dedup listing needs,
//! and it is what kubelet and node-problem-detector write for Nodes.

use super::backend::{ApiError, NodeApi};
use super::device_taints::isolates;
use super::event_text::{PendingEvent, PodTarget, pending_from};
#[cfg(test)]
use super::event_text::{event_reason, event_type};
use super::metrics::{KubeMetrics, KubeObject, WriteResult};
use super::pod_events::Isolation;
use super::retry::ErrorPolicy;
use super::settings::KubeSettings;
use gpuwatch_core::queue::{Drain, Keyed, Settled, SinkQueue};
use gpuwatch_core::{EventSink, Outcome};
use gpuwatch_proto::{Action, FaultEvent};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Notify;

/// Annotation holding the dedup key (`reason/gpu`) on Events gpuwatch writes.
pub(crate) const DEDUP_ANNOTATION: &str = "gpuwatch.io/dedup-key";
/// `source.component` / `reportingComponent` of gpuwatch's Events.
pub(crate) const COMPONENT: &str = "gpuwatch";
/// Bounded, coalescing queue shared by the sink and the writer task.
///
/// Node Events and Pod Events wait in two lanes, keyed [`SinkQueue`]s of
/// `capacity` each, taken in turn: a storm of Node Events (a replayed ring,
/// every GPU at once) neither pushes the Event a pod owner needs out of the
/// queue nor keeps it waiting behind the whole backlog at the writes' pace,
/// and the reverse. A repeat too soon after its Event's last write is
/// deferred in its lane until its next patch is due (see
/// `event_patch_interval_secs`).
#[derive(Debug)]
pub(crate) struct EventQueue {
    node: SinkQueue<PendingEvent>,
    pods: SinkQueue<PendingEvent>,
    /// The pod lane goes next when both hold Events.
    pod_next: AtomicBool,
    /// Wakes the writer task (either lane).
    notify: Arc<Notify>,
    metrics: Arc<KubeMetrics>,
}

impl Keyed for PendingEvent {
    fn key(&self) -> &str {
        &self.key
    }

    fn merge(&mut self, newer: PendingEvent) {
        self.count = self.count.saturating_add(newer.count);
        self.message = newer.message;
        self.time = self.time.max(newer.time);
    }

    fn mark_due(&mut self) {
        self.due = true;
    }
}

impl EventQueue {
    pub(crate) fn new(capacity: usize, metrics: Arc<KubeMetrics>) -> EventQueue {
        let notify = Arc::new(Notify::new());
        let lane = || SinkQueue::keyed(capacity, metrics.clone(), notify.clone());
        EventQueue {
            node: lane(),
            pods: lane(),
            pod_next: AtomicBool::new(false),
            notify,
            metrics,
        }
    }

    fn lane(&self, p: &PendingEvent) -> &SinkQueue<PendingEvent> {
        if p.pod.is_some() {
            &self.pods
        } else {
            &self.node
        }
    }

    fn lanes(&self) -> [&SinkQueue<PendingEvent>; 2] {
        [&self.node, &self.pods]
    }

    /// Queues an event; never blocks.
    pub(crate) fn push(&self, p: PendingEvent) {
        self.lane(&p).push_or_merge(p);
    }

    /// The next Event to write, from the lanes in turn (the due repeats of
    /// both moved to their heads first).
    fn pop(&self) -> Option<PendingEvent> {
        self.node.release_due();
        self.pods.release_due();
        let [first, second] = if self.pod_next.load(Ordering::SeqCst) {
            [&self.pods, &self.node]
        } else {
            [&self.node, &self.pods]
        };
        let p = first.take().or_else(|| second.take())?;
        self.pod_next.store(p.pod.is_none(), Ordering::SeqCst);
        Some(p)
    }

    /// The Event being written is done with (its outcome counted).
    fn done(&self) {
        for lane in self.lanes() {
            if lane.in_flight() {
                lane.settle(1, Settled::Counted);
            }
        }
    }

    /// Holds a repeat taken from the queue until `due` (merging it into one
    /// already held for its key).
    fn hold(&self, p: PendingEvent, due: Instant) {
        self.lane(&p).defer(due);
    }

    /// When the earliest held repeat is due.
    fn next_due(&self) -> Option<Instant> {
        self.lanes().iter().filter_map(|l| l.next_due()).min()
    }

    /// Puts a failed item back at the front of its lane, next to be taken
    /// (or drops it when the lane filled meanwhile).
    fn requeue(&self, p: PendingEvent) {
        if self.lane(&p).settle(1, Settled::Retry) {
            self.pod_next.store(p.pod.is_some(), Ordering::SeqCst);
        }
    }

    /// Waits up to `timeout` for both lanes to drain, held repeats included
    /// (taken at once meanwhile).
    fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for lane in self.lanes() {
            lane.ask_flush();
        }
        for lane in self.lanes() {
            lane.wait_flushed(deadline);
        }
        for lane in self.lanes() {
            lane.end_flush();
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.node.len() + self.pods.len()
    }

    pub(crate) fn close(&self) {
        for lane in self.lanes() {
            lane.stop(Drain::All);
        }
    }

    fn closed(&self) -> bool {
        self.node.stopping()
    }

    /// Drops (counted) everything still queued: the writer gives up at
    /// shutdown.
    fn drop_all(&self) {
        for lane in self.lanes() {
            lane.finish();
        }
    }
}

/// The [`EventSink`] handed to the health engine.
pub(crate) struct KubeEventSink {
    pub(crate) queue: Arc<EventQueue>,
    pub(crate) enabled: bool,
    /// Also an Event on every Pod the fault names.
    pub(crate) pods: bool,
}

impl std::fmt::Debug for KubeEventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeEventSink")
            .field("queued", &self.queue.len())
            .finish()
    }
}

impl EventSink for KubeEventSink {
    fn name(&self) -> &'static str {
        "kube_events"
    }

    fn send(&self, event: &FaultEvent) {
        // `ignore` faults are metric-only by policy: no Event.
        if !self.enabled || matches!(event.action(), Action::Ignore) {
            return;
        }
        let now = SystemTime::now();
        self.queue.push(pending_from(event, now));
        if self.pods {
            let status = self.queue.metrics.status();
            let isolation = if isolates(event, &status.isolatable_gpus) {
                Isolation::Device
            } else if status.quarantine_deferred {
                Isolation::Deferred
            } else {
                Isolation::Node
            };
            for p in super::pod_events::pending_for_pods(event, now, isolation) {
                self.queue.push(p);
            }
        }
    }

    /// Waits for the queue to drain, held repeats included (they are
    /// patched now rather than at their time).
    fn flush(&self, timeout: Duration) {
        self.queue.flush(timeout);
    }
}

/// The Event writes' pace: `burst` at once, refilled at `per_minute` (the
/// generic cell rate algorithm, governor's).
pub(crate) struct Pacer {
    limiter: governor::RateLimiter<
        governor::state::NotKeyed,
        governor::state::InMemoryState,
        governor::clock::MonotonicClock,
    >,
}

impl Pacer {
    pub(crate) fn new(burst: u32, per_minute: u32) -> Pacer {
        let one = std::num::NonZeroU32::MIN;
        let quota =
            governor::Quota::per_minute(std::num::NonZeroU32::new(per_minute).unwrap_or(one))
                .allow_burst(std::num::NonZeroU32::new(burst).unwrap_or(one));
        Pacer {
            limiter: governor::RateLimiter::direct_with_clock(
                quota,
                governor::clock::MonotonicClock,
            ),
        }
    }

    /// Takes the right to one write, or says how long until there is one.
    pub(crate) fn take(&self) -> Result<(), Duration> {
        use governor::clock::Clock as _;
        self.limiter
            .check()
            .map_err(|not_until| not_until.wait_time_from(governor::clock::MonotonicClock.now()))
    }
}

/// The writer task's own state between Events.
struct EventWriterState {
    known: HashMap<String, Known>,
    pod_caps: PodCaps,
    /// The Events already on the API were listed (or cannot be).
    listed: bool,
    pacer: Pacer,
    backoff: ErrorPolicy,
    seq: u64,
    /// The next Normal Event is the first after a quiet period.
    spread_next_normal: bool,
}

/// What writing a pending Event takes ([`plan`]).
#[derive(Debug)]
enum WritePlan {
    /// Already on the API from an earlier run of the agent (its name).
    OnTheApi(String),
    /// A repeat too soon after its Event's last write: held until then.
    Hold(Instant),
    /// A repeat: patch the Event's `count` and `lastTimestamp`.
    Patch(Known),
    /// A new Event.
    Create,
}

/// An Event of ours known to exist on the API.
#[derive(Debug, Clone)]
struct Known {
    /// The Event's namespace (a Pod's Events are in the pod's).
    namespace: String,
    name: String,
    count: i32,
    last: SystemTime,
    /// Listed from the API at startup (written by an earlier run).
    from_list: bool,
    /// Patches written since it was created (each doubles the wait before
    /// the next; see `event_patch_interval_secs`).
    patches: u32,
    /// When this process last wrote or listed it (the age the map is pruned by:
    /// Event times come from the kernel log and NVML and may lag the clock).
    touched: Instant,
}

/// New Events written per pod, and for all pods of the node, within the
/// dedup window (the per-pod and per-node caps).
#[derive(Debug, Default)]
pub(crate) struct PodCaps {
    by_pod: HashMap<(String, String), VecDeque<SystemTime>>,
    all: VecDeque<SystemTime>,
}

impl PodCaps {
    /// Whether one more new Event about `pod` at `at` fits under `limit`
    /// for the pod and `node_limit` for the node within `window`; counts it
    /// when it does.
    pub(crate) fn admit(
        &mut self,
        pod: &PodTarget,
        at: SystemTime,
        window: Duration,
        limit: u32,
        node_limit: u32,
    ) -> bool {
        let recent = |t: &SystemTime| at.duration_since(*t).unwrap_or(Duration::ZERO) < window;
        self.by_pod.retain(|_, q| q.back().is_some_and(recent));
        if self.by_pod.len() >= KNOWN_CAPACITY {
            self.by_pod.clear();
        }
        while self.all.front().is_some_and(|t| !recent(t)) {
            self.all.pop_front();
        }
        if self.all.len() >= node_limit as usize {
            return false;
        }
        let q = self
            .by_pod
            .entry((pod.namespace.clone(), pod.name.clone()))
            .or_default();
        while q.front().is_some_and(|t| !recent(t)) {
            q.pop_front();
        }
        if q.len() >= limit as usize {
            return false;
        }
        q.push_back(at);
        self.all.push_back(at);
        true
    }
}

/// How long after an Event's last write its next repeat is patched: the
/// interval after the create, doubling with each patch, at most `window`.
fn patch_wait(interval: Duration, patches: u32, window: Duration) -> Duration {
    interval.saturating_mul(1u32 << patches.min(16)).min(window)
}

/// What writing `p` takes at `now`, decided before any request (so only a
/// request spends the pace), given the Event of ours with its key that is
/// known to exist (`known`): nothing (on the API from an earlier run), a hold
/// (a repeat too soon after its Event's last write: until its [`patch_wait`]
/// has passed), a patch of the known Event, or a new Event (none known, or
/// the known one older than `window`). A due repeat (held until its time, or
/// flushed) is patched without waiting.
fn plan(
    p: &PendingEvent,
    known: Option<&Known>,
    window: Duration,
    interval: Duration,
    now: Instant,
) -> WritePlan {
    let Some(k) = known else {
        return WritePlan::Create;
    };
    let since = p.time.duration_since(k.last).unwrap_or(Duration::ZERO);
    if since >= window {
        return WritePlan::Create;
    }
    if k.from_list && secs(p.time) <= secs(k.last) {
        return WritePlan::OnTheApi(k.name.clone());
    }
    let wait = patch_wait(interval, k.patches, window);
    if !p.due && since < wait {
        return WritePlan::Hold(now + (wait - since));
    }
    WritePlan::Patch(k.clone())
}

/// Most Events the dedup map remembers; beyond it the least recently written go.
pub(crate) const KNOWN_CAPACITY: usize = 1024;

/// Ages the dedup map out: an Event this process has not written (or listed)
/// for longer than `window` is forgotten (a repeat that late would start a
/// fresh Event anyway in any realistic timeline); of the rest, at most `cap`
/// stay, the most recently written.
fn prune_known(known: &mut HashMap<String, Known>, now: Instant, window: Duration, cap: usize) {
    known.retain(|_, k| now.saturating_duration_since(k.touched) < window);
    if known.len() > cap {
        let mut by_age: Vec<(Instant, String)> = known
            .iter()
            .map(|(key, k)| (k.touched, key.clone()))
            .collect();
        by_age.sort();
        for (_, key) in by_age.into_iter().take(known.len() - cap) {
            known.remove(&key);
        }
    }
}

fn to_time(t: SystemTime) -> Time {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn from_time(t: &Time) -> SystemTime {
    let secs = u64::try_from(t.0.as_second()).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Writes queued Events. Runs until the queue is closed and drained.
pub(crate) struct EventWriter {
    pub(crate) queue: Arc<EventQueue>,
    pub(crate) backend: Arc<dyn NodeApi>,
    pub(crate) cfg: KubeSettings,
    pub(crate) node_name: String,
    pub(crate) node_uid: Arc<Mutex<Option<String>>>,
    pub(crate) metrics: Arc<KubeMetrics>,
}

impl EventWriter {
    fn new_event(&self, p: &PendingEvent, seq: u64) -> Event {
        let t = to_time(p.time);
        let nanos = p
            .time
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let (name, namespace, involved) = match &p.pod {
            Some(pod) => (
                format!("{}.{:x}.{seq}", pod.name, nanos),
                pod.namespace.clone(),
                ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name.clone()),
                    namespace: Some(pod.namespace.clone()),
                    uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
                    ..Default::default()
                },
            ),
            None => {
                let uid = self
                    .node_uid
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_else(|| self.node_name.clone());
                (
                    format!("{}.{:x}.{seq}", self.node_name, nanos),
                    self.cfg.events.namespace.clone(),
                    ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Node".into()),
                        name: Some(self.node_name.clone()),
                        uid: Some(uid),
                        ..Default::default()
                    },
                )
            }
        };
        Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace),
                annotations: Some(BTreeMap::from([(
                    DEDUP_ANNOTATION.to_owned(),
                    p.key.clone(),
                )])),
                ..Default::default()
            },
            involved_object: involved,
            reason: Some(p.reason.clone()),
            message: Some(p.message.clone()),
            type_: Some(p.type_.to_owned()),
            count: Some(i32::try_from(p.count).unwrap_or(i32::MAX)),
            first_timestamp: Some(t.clone()),
            last_timestamp: Some(t),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: Some(self.node_name.clone()),
            }),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(self.node_name.clone()),
            ..Default::default()
        }
    }

    async fn load_existing(&self, known: &mut HashMap<String, Known>) -> Result<(), ApiError> {
        for e in self.backend.list_events(&self.node_name).await? {
            if e.source.as_ref().and_then(|s| s.component.as_deref()) != Some(COMPONENT) {
                continue;
            }
            let (Some(name), Some(key)) = (
                e.metadata.name.clone(),
                e.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DEDUP_ANNOTATION))
                    .cloned(),
            ) else {
                continue;
            };
            let last = e
                .last_timestamp
                .as_ref()
                .or(e.first_timestamp.as_ref())
                .map_or(SystemTime::UNIX_EPOCH, from_time);
            let newer = known.get(&key).is_none_or(|k| k.last < last);
            if newer {
                known.insert(
                    key,
                    Known {
                        namespace: self.cfg.events.namespace.clone(),
                        name,
                        count: e.count.unwrap_or(1),
                        last,
                        from_list: true,
                        patches: 0,
                        touched: Instant::now(),
                    },
                );
            }
        }
        Ok(())
    }

    /// What writing `p` takes now ([`plan`] with this writer's settings).
    fn plan(&self, p: &PendingEvent, known: &HashMap<String, Known>) -> WritePlan {
        plan(
            p,
            known.get(&p.key),
            self.cfg.events.dedup_window,
            self.cfg.events.patch_interval,
            Instant::now(),
        )
    }

    /// Patches the known Event `k` with `p`'s occurrence: `Ok(false)` when
    /// it is gone from the API (expired or deleted), so a new one is due.
    async fn patch(
        &self,
        p: &PendingEvent,
        k: Known,
        known: &mut HashMap<String, Known>,
    ) -> Result<bool, ApiError> {
        let count = k
            .count
            .saturating_add(i32::try_from(p.count).unwrap_or(i32::MAX));
        let last = k.last.max(p.time);
        let patch = serde_json::json!({
            "count": count,
            "lastTimestamp": to_time(last),
            "message": p.message,
        });
        match self
            .backend
            .patch_event(&k.namespace, &k.name, &patch)
            .await
        {
            Ok(_) => {
                self.metrics
                    .count_kube_write(KubeObject::Event, WriteResult::Ok);
                self.metrics.count_events(Outcome::Coalesced, 1);
                let patches = k.patches.saturating_add(1);
                known.insert(
                    p.key.clone(),
                    Known {
                        count,
                        last,
                        from_list: false,
                        patches,
                        touched: Instant::now(),
                        ..k
                    },
                );
                Ok(true)
            }
            Err(ApiError::NotFound(_)) => {
                known.remove(&p.key);
                Ok(false)
            }
            Err(e) => {
                self.metrics
                    .count_kube_write(KubeObject::Event, WriteResult::Error);
                Err(e)
            }
        }
    }

    /// Creates a new Event for `p`, unless it is on a Pod whose Event
    /// limits are reached (then dropped, counted).
    async fn create(
        &self,
        p: &PendingEvent,
        known: &mut HashMap<String, Known>,
        pod_caps: &mut PodCaps,
        seq: u64,
    ) -> Result<(), ApiError> {
        let events = &self.cfg.events;
        if let Some(pod) = &p.pod
            && !pod_caps.admit(
                pod,
                p.time,
                events.dedup_window,
                events.pod_limit,
                events.pod_node_limit,
            )
        {
            tracing::debug!(reason = %p.reason, pod = %pod.name, namespace = %pod.namespace, "Pod Event limit reached; dropped.");
            self.metrics.count_events(Outcome::Dropped, 1);
            return Ok(());
        }
        let ev = self.new_event(p, seq);
        match self.backend.create_event(&ev).await {
            Ok(created) => {
                self.metrics
                    .count_kube_write(KubeObject::Event, WriteResult::Ok);
                self.metrics.count_events(Outcome::Emitted, 1);
                known.insert(
                    p.key.clone(),
                    Known {
                        namespace: ev.metadata.namespace.clone().unwrap_or_default(),
                        name: created
                            .metadata
                            .name
                            .or(ev.metadata.name)
                            .unwrap_or_default(),
                        count: i32::try_from(p.count).unwrap_or(i32::MAX),
                        last: p.time,
                        from_list: false,
                        patches: 0,
                        touched: Instant::now(),
                    },
                );
                Ok(())
            }
            Err(e) => {
                let result = if matches!(e, ApiError::Conflict(_) | ApiError::AlreadyExists(_)) {
                    WriteResult::Conflict
                } else {
                    WriteResult::Error
                };
                self.metrics.count_kube_write(KubeObject::Event, result);
                Err(e)
            }
        }
    }

    /// Writes one Event as `plan` says (a patch, or a create); `Err` means
    /// retry later.
    async fn write(
        &self,
        p: &PendingEvent,
        plan: WritePlan,
        known: &mut HashMap<String, Known>,
        pod_caps: &mut PodCaps,
        seq: u64,
    ) -> Result<(), ApiError> {
        if let WritePlan::Patch(k) = plan
            && self.patch(p, k, known).await?
        {
            return Ok(());
        }
        self.create(p, known, pod_caps, seq).await
    }

    /// Writes queued Events until the queue closes and drains: first lists
    /// the Events already on the API for this Node (a restart sends none
    /// twice), then writes at the pacer's rate, retrying what failed.
    pub(crate) async fn run(self) {
        let mut st = EventWriterState {
            known: HashMap::new(),
            pod_caps: PodCaps::default(),
            listed: false,
            pacer: Pacer::new(self.cfg.events.burst, self.cfg.events.per_minute),
            backoff: ErrorPolicy::new(self.cfg.api.backoff_initial, self.cfg.api.backoff_max),
            seq: 0,
            spread_next_normal: true,
        };
        while let Some(p) = self.next_pending(&mut st.spread_next_normal).await {
            let Some(p) = self.listed_first(&mut st, p).await else {
                continue;
            };
            prune_known(
                &mut st.known,
                Instant::now(),
                self.cfg.events.dedup_window,
                KNOWN_CAPACITY,
            );
            let plan = match self.plan(&p, &st.known) {
                WritePlan::OnTheApi(name) => {
                    tracing::debug!(reason = %p.reason, event = %name, "Event already on the API; not resent.");
                    self.metrics.count_events(Outcome::Coalesced, 1);
                    self.queue.done();
                    continue;
                }
                WritePlan::Hold(due) => {
                    self.metrics.count_events(Outcome::Coalesced, 1);
                    self.queue.hold(p, due);
                    continue;
                }
                plan => plan,
            };
            if let Err(wait) = st.pacer.take() {
                self.queue.requeue(p);
                self.sleep_or_close(wait).await;
                continue;
            }
            st.seq += 1;
            let written = self
                .write(&p, plan, &mut st.known, &mut st.pod_caps, st.seq)
                .await;
            self.settle(p, written, &mut st.backoff).await;
        }
    }

    /// The next Event to write; `None` once the queue is closed and empty.
    /// The first Normal Event after a quiet period waits a random part of
    /// the spread (`normal_event_spread_secs`) first; repeats arriving
    /// meanwhile coalesce into it.
    async fn next_pending(&self, spread_next_normal: &mut bool) -> Option<PendingEvent> {
        loop {
            let closed = self.queue.closed();
            let Some(p) = self.queue.pop() else {
                if closed {
                    return None;
                }
                *spread_next_normal = true;
                match self.queue.next_due() {
                    Some(due) => {
                        tokio::select! {
                            () = self.queue.notify.notified() => {}
                            () = tokio::time::sleep_until(due.into()) => {}
                        }
                    }
                    None => self.queue.notify.notified().await,
                }
                continue;
            };
            let spread = self.cfg.events.normal_spread;
            if *spread_next_normal && p.type_ == "Normal" && !spread.is_zero() && !closed {
                *spread_next_normal = false;
                let delay = spread.mul_f64(rand::random_range(0.0..1.0));
                self.queue.requeue(p);
                self.sleep_unless_closed(delay).await;
                continue;
            }
            if p.type_ != "Normal" {
                *spread_next_normal = false;
            }
            return Some(p);
        }
    }

    /// Lists the Events already on the API once, before the first write;
    /// `None` when that must be retried (`p` is queued again meanwhile).
    async fn listed_first(
        &self,
        st: &mut EventWriterState,
        p: PendingEvent,
    ) -> Option<PendingEvent> {
        if st.listed {
            return Some(p);
        }
        match self.load_existing(&mut st.known).await {
            Ok(()) => st.listed = true,
            Err(e @ (ApiError::Transient(_) | ApiError::Throttled { .. })) => {
                tracing::warn!(error = %e, "Cannot list existing Events; retrying.");
                self.queue.requeue(p);
                let delay = st.backoff.after(&e);
                self.sleep_or_close(delay).await;
                return None;
            }
            Err(e) => {
                // Forbidden or rejected: dedup only against what this run writes.
                tracing::warn!(error = %e, "Cannot list existing Events; deduplicating only against new ones.");
                st.listed = true;
            }
        }
        Some(p)
    }

    /// After a write: done, retried after a backoff (a transient error, a
    /// race, throttling), or dropped (rejected by the API server).
    async fn settle(
        &self,
        p: PendingEvent,
        written: Result<(), ApiError>,
        backoff: &mut ErrorPolicy,
    ) {
        match written {
            Ok(()) => {
                backoff.reset();
                self.queue.done();
            }
            Err(
                e @ (ApiError::Transient(_)
                | ApiError::Conflict(_)
                | ApiError::AlreadyExists(_)
                | ApiError::Throttled { .. }),
            ) => {
                tracing::warn!(reason = %p.reason, error = %e, "Cannot write Event; retrying.");
                self.queue.requeue(p);
                let delay = backoff.after(&e);
                self.sleep_or_close(delay).await;
            }
            Err(e) => {
                tracing::warn!(reason = %p.reason, error = %e, "Event rejected by the API server; dropped.");
                self.metrics.count_events(Outcome::Dropped, 1);
                self.queue.done();
            }
        }
    }

    /// Sleeps `d` (new events do not cut it short), ending early only when
    /// the sink closes.
    async fn sleep_unless_closed(&self, d: Duration) {
        let end = tokio::time::Instant::now() + d;
        while tokio::time::Instant::now() < end && !self.queue.closed() {
            let left = end.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(left.min(Duration::from_millis(100))).await;
        }
    }

    async fn sleep_or_close(&self, d: Duration) {
        if self.queue.closed() {
            // Shutting down: give up on what cannot be written now.
            self.queue.drop_all();
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            () = self.queue.notify.notified() => {
                // Woken by a new event or close; re-check soon but keep pacing.
                tokio::time::sleep(d.min(Duration::from_millis(50))).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_proto::FaultKind;

    fn ev(code: u32, action: Action) -> FaultEvent {
        let mut e = FaultEvent {
            code,
            gpu_index: Some(1),
            gpu_uuid: "GPU-1".into(),
            pci_address: "0000:1b:00.0".into(),
            message: "NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.".into(),
            boot_id: "b".into(),
            count: 1,
            ..Default::default()
        };
        e.set_kind(FaultKind::Xid);
        e.classify(action, "catalog");
        e
    }

    #[test]
    fn reasons_and_types() {
        assert_eq!(event_reason(&ev(79, Action::RebootNode)), "XID79");
        let mut s = ev(12028, Action::Investigate);
        s.set_kind(FaultKind::Sxid);
        assert_eq!(event_reason(&s), "SXID12028");
        let mut a = ev(0, Action::RebootNode);
        a.set_kind(FaultKind::PcieAer);
        a.attributes
            .insert("aer_severity".into(), "uncorrected_fatal".into());
        assert_eq!(event_reason(&a), "PCIeAERFatal");
        let mut l = ev(0, Action::InspectHardware);
        l.set_kind(FaultKind::GpuLost);
        assert_eq!(event_reason(&l), "GPULost");
        // Thermal: one reason whatever the source's name for it (Event dedup).
        let mut t = ev(0, Action::Investigate);
        t.set_kind(FaultKind::Thermal);
        t.name = "Clocks slowed down".into();
        let mut u = t.clone();
        u.name = "Thermal slowdown".into();
        assert_eq!(event_reason(&t), event_reason(&u));
        assert_eq!(event_reason(&t), t.short_reason());
        // ECC from the kernel log (dbe) and from NVML (uncorrected) agree.
        let mut k = ev(0, Action::ResetGpu);
        k.set_kind(FaultKind::Ecc);
        k.attributes.insert("ecc_type".into(), "dbe".into());
        let mut n = k.clone();
        n.attributes.insert("ecc_type".into(), "uncorrected".into());
        assert_eq!(event_reason(&k), event_reason(&n));
        assert_eq!(event_type(Action::RestartApp), "Normal");
        assert_eq!(event_type(Action::Investigate), "Warning");
    }

    #[test]
    fn message_names_the_gpu() {
        let p = pending_from(&ev(79, Action::RebootNode), SystemTime::UNIX_EPOCH);
        assert_eq!(p.key, "XID79/GPU-1");
        assert!(
            p.message.starts_with("GPU 1 (GPU-1, 0000:1b:00.0): XID 79, action reboot_node, boot b; catalog; kernel: NVRM"),
            "{}",
            p.message
        );
    }

    #[test]
    fn queue_coalesces_and_drops_oldest() {
        let metrics = KubeMetrics::new();
        let q = EventQueue::new(2, metrics.clone());
        let mk = |code| pending_from(&ev(code, Action::ResetGpu), SystemTime::UNIX_EPOCH);
        q.push(mk(1));
        q.push(mk(1));
        q.push(mk(2));
        q.push(mk(3));
        assert_eq!(q.len(), 2);
        assert_eq!(metrics.events(Outcome::Coalesced), 1);
        assert_eq!(metrics.events(Outcome::Dropped), 1);
        let first = q.pop().unwrap();
        assert_eq!(first.reason, "XID2");
        q.done();
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn a_storm_of_node_events_neither_evicts_nor_starves_a_pod_event() {
        let metrics = KubeMetrics::new();
        let q = EventQueue::new(4, metrics.clone());
        let node = |code| pending_from(&ev(code, Action::ResetGpu), SystemTime::UNIX_EPOCH);
        let mut pod = node(13);
        pod.key = "pod/ml/trainer-0/XID13".into();
        pod.pod = Some(super::PodTarget {
            namespace: "ml".into(),
            name: "trainer-0".into(),
            uid: "u".into(),
        });
        q.push(node(1));
        q.push(pod.clone());
        for code in 2..50 {
            q.push(node(code));
        }
        // The node lane dropped its oldest; the pod's Event is still there.
        assert_eq!(q.len(), 5);
        assert_eq!(metrics.events(Outcome::Dropped), 45);
        let first = q.pop().unwrap();
        assert!(first.pod.is_none());
        // A failed write goes back to the front of its lane and is taken next.
        q.requeue(first);
        assert!(q.pop().unwrap().pod.is_none());
        q.done();
        assert_eq!(
            q.pop().unwrap().key,
            pod.key,
            "taken in turn with the node lane"
        );
        q.done();
        let rest: Vec<String> = std::iter::from_fn(|| {
            let p = q.pop()?;
            q.done();
            Some(p.reason)
        })
        .collect();
        assert_eq!(rest, ["XID47", "XID48", "XID49"]);
    }

    #[test]
    fn the_pacer_allows_a_burst_then_the_rate() {
        let p = Pacer::new(2, 60);
        let t0 = std::time::Instant::now();
        assert!(p.take().is_ok());
        assert!(p.take().is_ok());
        let wait = p.take().unwrap_err();
        // One a second at 60 a minute, counted from the burst: the pacer's
        // clock is the real one, so the time this thread took since (long on
        // a loaded machine) is already off the wait (a millisecond spared
        // for the limiter's rounding).
        let since = t0.elapsed();
        assert!(
            wait <= Duration::from_secs(1) && wait + since >= Duration::from_millis(999),
            "{wait:?} to wait, {since:?} after the burst"
        );
        // A zero setting still lets one write through.
        assert!(Pacer::new(0, 0).take().is_ok());
    }

    #[test]
    fn ignore_faults_make_no_event() {
        let metrics = KubeMetrics::new();
        let sink = KubeEventSink {
            queue: Arc::new(EventQueue::new(8, metrics)),
            enabled: true,
            pods: true,
        };
        sink.send(&ev(0, Action::Ignore));
        assert_eq!(sink.queue.len(), 0);
        sink.send(&ev(13, Action::RestartApp));
        assert_eq!(sink.queue.len(), 1);
    }

    #[test]
    fn pod_events_are_capped_per_pod_within_the_window() {
        let mut caps = PodCaps::default();
        let pod = |name: &str| super::PodTarget {
            namespace: "ml".into(),
            name: name.into(),
            uid: String::new(),
        };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let w = Duration::from_secs(600);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!((0..3).all(|i| caps.admit(&pod("a"), at(i), w, 3, 100)));
        assert!(
            !caps.admit(&pod("a"), at(10), w, 3, 100),
            "fourth within the window"
        );
        assert!(
            caps.admit(&pod("b"), at(10), w, 3, 100),
            "another pod has its own cap"
        );
        assert!(
            caps.admit(&pod("a"), at(601), w, 3, 100),
            "the window moved on"
        );
    }

    #[test]
    fn pod_events_are_capped_per_node_within_the_window() {
        let mut caps = PodCaps::default();
        let pod = |name: String| super::PodTarget {
            namespace: "ml".into(),
            name,
            uid: String::new(),
        };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let w = Duration::from_secs(600);
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Ten pods, one Event each: the node's cap of 4 lets the first four in.
        let admitted = (0..10)
            .filter(|&i| caps.admit(&pod(format!("p{i}")), at(i), w, 3, 4))
            .count();
        assert_eq!(admitted, 4);
        assert!(
            caps.admit(&pod("p9".into()), at(605), w, 3, 4),
            "the window moved on"
        );
    }

    #[test]
    fn repeats_are_patched_at_doubling_intervals_up_to_the_window() {
        let w = Duration::from_secs(600);
        let waits: Vec<u64> = (0..6)
            .map(|n| patch_wait(Duration::from_secs(60), n, w).as_secs())
            .collect();
        assert_eq!(waits, [60, 120, 240, 480, 600, 600]);
        assert_eq!(patch_wait(Duration::from_secs(60), u32::MAX, w), w);
    }

    /// A pod crash-looping on one fault, a repeat every 10 s for 10 minutes
    /// against the defaults (600 s window, patches 60 s after the create,
    /// doubling): the repeats are held and merged between writes, so the
    /// Event is created once and patched 60, 180 and 420 s after the create
    /// (each write takes every repeat held until then); a repeat after the
    /// window starts a new Event, one from the earlier run's listing that is
    /// no newer is left alone.
    #[test]
    fn a_repeat_is_held_patched_or_created_by_its_time_since_the_last_write() {
        let window = Duration::from_secs(600);
        let interval = Duration::from_secs(60);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let now = Instant::now();
        let at = |secs: u64, due: bool| PendingEvent {
            key: "XID13/gpu0".into(),
            reason: "XID13".into(),
            type_: "Normal",
            message: String::new(),
            count: 1,
            time: t0 + Duration::from_secs(secs),
            pod: None,
            due,
        };
        let mut k = Known {
            namespace: "default".into(),
            name: "ev".into(),
            count: 1,
            last: t0,
            from_list: false,
            patches: 0,
            touched: now,
        };
        assert!(matches!(
            plan(&at(0, false), None, window, interval, now),
            WritePlan::Create
        ));
        // A crash every 10 s: held until the patch is due (the repeats
        // merge into the held one meanwhile), patched once it is.
        let mut writes = vec![0];
        for crash in (10..600).step_by(10) {
            let time = t0 + Duration::from_secs(crash);
            let next_write = k.last + patch_wait(interval, k.patches, window);
            match plan(&at(crash, false), Some(&k), window, interval, now) {
                WritePlan::Hold(until) => assert_eq!(time + (until - now), next_write),
                WritePlan::Patch(_) => {
                    assert_eq!(time, next_write);
                    writes.push(crash);
                    k.last = time;
                    k.patches += 1;
                }
                other => panic!("crash at {crash} s: {other:?}"),
            }
        }
        assert_eq!(writes, [0, 60, 180, 420]);
        // A flush makes the held repeat due: patched at once.
        assert!(matches!(
            plan(&at(590, true), Some(&k), window, interval, now),
            WritePlan::Patch(_)
        ));
        // A window after the last write: a new Event.
        assert!(matches!(
            plan(&at(420 + 600, false), Some(&k), window, interval, now),
            WritePlan::Create
        ));
        // Listed from the API at startup, and this occurrence is no newer:
        // already there, not sent again; a newer one patches it.
        k.from_list = true;
        k.patches = 0;
        k.last = t0 + Duration::from_secs(1000);
        assert!(matches!(
            plan(&at(1000, false), Some(&k), window, interval, now),
            WritePlan::OnTheApi(name) if name == "ev"
        ));
        assert!(matches!(
            plan(&at(1000, true), Some(&k), window, interval, now),
            WritePlan::OnTheApi(_)
        ));
        assert!(matches!(
            plan(&at(1001, false), Some(&k), window, interval, now),
            WritePlan::Hold(_)
        ));
    }

    #[test]
    fn dedup_map_ages_out_and_stays_bounded() {
        let now = Instant::now() + Duration::from_secs(10_000);
        let window = Duration::from_secs(600);
        let known_at = |secs_ago: u64| Known {
            namespace: "default".into(),
            name: format!("ev-{secs_ago}"),
            count: 1,
            last: SystemTime::UNIX_EPOCH,
            from_list: false,
            patches: 0,
            touched: now - Duration::from_secs(secs_ago),
        };
        let mut known: HashMap<String, Known> = HashMap::new();
        known.insert("old".into(), known_at(601));
        known.insert("edge".into(), known_at(600));
        for i in 0..10 {
            known.insert(format!("k{i}"), known_at(i));
        }
        prune_known(&mut known, now, window, 4);
        let mut keys: Vec<&str> = known.keys().map(String::as_str).collect();
        keys.sort_unstable();
        // Untouched for the window: gone; of the rest, the four most recent stay.
        assert_eq!(keys, ["k0", "k1", "k2", "k3"]);
    }
}
