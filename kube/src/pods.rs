//! The pods bound to this Node, for naming the pod a faulting process belongs
//! to: a list, then a watch from the version listed, of
//! `pods?fieldSelector=spec.nodeName=<node>` across namespaces, kept as a
//! [`PodDirectory`] and handed to the health engine after every change.
//!
//! The whole Pod is read, not its metadata alone: a container's name comes
//! from `status.containerStatuses[].containerID`, which a metadata-only list
//! does not carry. What is kept per pod is its UID, name, namespace and
//! container ids and names and its controller (the owner reference with
//! `controller: true`). Deleted pods' UIDs are remembered, a bounded number,
//! so that a fault read after its pod went says so.
//!
//! An API server that cannot be reached (or RBAC that denies the list) never
//! blocks anything: the engine is told the listing is unavailable, keeps the
//! last one, and names new pods by UID only; the list is retried with backoff.
//! The list-then-watch is kube-runtime's `watcher`: a watch that the server
//! ends at its timeout resumes from the last version seen; an expired version
//! (410) lists again.
//!
//! When the engine asks (a fault names a pod UID the listing does not know:
//! a pod that started a moment before, a watch that lags), one more list is
//! sent, at most every [`MIN_LIST_GAP`], read from the API server's current
//! state (no `resourceVersion`, so not from a possibly stale watch cache).
//! The pods it shows that the store lacks are added (not ones the watch
//! already saw deleted), and the engine is told the listing is current as of
//! when that list was sent ([`PlacementUpdate::PodsCurrent`]).

use super::KubeError;
use super::client::KubeClient;
use super::retry::Backoff;
use super::settings::{ApiSettings, KubeSettings};
use futures::{FutureExt as _, StreamExt};
use gpuwatch_core::Shutdown;
use gpuwatch_core::heartbeat::{self, Progress, Watched};
use gpuwatch_core::msg::MonitorInput;
use gpuwatch_core::placement::{PlacementUpdate, PodDirectory, PodInfo};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Asked-for lists are sent at most this often (each one reads every pod of
/// the node from the API server).
pub const MIN_LIST_GAP: Duration = Duration::from_millis(500);

/// Receives the pod listing after every change (the agent forwards it to the
/// health engine; it must not block).
pub type PlacementCallback = Arc<dyn Fn(PlacementUpdate) + Send + Sync>;

/// The listing of the pods bound to this Node (module doc), running on a
/// tokio runtime until the shutdown it was started with is triggered
/// ([`PodListing::stop_within`] then waits for it to end).
pub struct PodListing {
    task: tokio::task::JoinHandle<()>,
    progress: Arc<Progress>,
    deadline: Duration,
}

/// How often the listing loop comes round when nothing happens, only to
/// beat its heartbeat.
const LISTING_BEAT: Duration = Duration::from_secs(10);

impl std::fmt::Debug for PodListing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodListing").finish_non_exhaustive()
    }
}

impl PodListing {
    /// Starts listing the pods bound to `node_name` on `rt`, through
    /// `client` with the `[kube]` API settings (timeouts, backoff), handing
    /// every change to `on_change` (called on a runtime task; it must not
    /// block); `ask` is woken for a fresh list. The listing ends when
    /// `shutdown` is triggered (the agent's inputs share one). `Ok(None)` for a dry run's
    /// client: there is nothing to list from. An unreachable API server is
    /// not an error: the engine is told the listing is unavailable and the
    /// list is retried.
    pub fn start(
        client: &KubeClient,
        settings: &KubeSettings,
        node_name: &str,
        on_change: PlacementCallback,
        ask: Arc<Notify>,
        shutdown: &Shutdown,
        rt: &tokio::runtime::Handle,
    ) -> Result<Option<PodListing>, KubeError> {
        if node_name.is_empty() {
            return Err(KubeError::NoNodeName);
        }
        let Some(client) = client.client() else {
            return Ok(None);
        };
        let progress = Progress::new();
        let task = rt.spawn(watch_pods(
            client.clone(),
            node_name.to_owned(),
            settings.api.clone(),
            on_change,
            ask,
            shutdown.clone(),
            progress.clone(),
        ));
        // The loop beats every round (at least every LISTING_BEAT); a list
        // asked for is bounded by the request timeout.
        let deadline =
            heartbeat::deadline(LISTING_BEAT, 3, settings.api.request_timeout + LISTING_BEAT);
        Ok(Some(PodListing {
            task,
            progress,
            deadline,
        }))
    }

    /// The listing's heartbeat, for the agent's input watchdog: a listing
    /// task that died or stopped being polled stalls it.
    pub fn watched(&self) -> Watched {
        Watched::new(
            MonitorInput::PodListing,
            self.progress.clone(),
            self.deadline,
        )
    }

    /// Waits for the listing to end once its shutdown was triggered (this
    /// does not trigger it: the signal is shared with the caller's other
    /// inputs): false when it was still busy after `within` (a request in
    /// flight) and had to be aborted.
    pub async fn stop_within(self, within: Duration) -> bool {
        let mut task = self.task;
        if tokio::time::timeout(within, &mut task).await.is_err() {
            task.abort();
            return false;
        }
        true
    }
}

/// What gpuwatch keeps of a Pod: `None` for one without a UID.
pub(crate) fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let uid = pod.metadata.uid.clone()?;
    let status = pod.status.as_ref();
    let containers = status
        .into_iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
                .chain(s.ephemeral_container_statuses.iter().flatten())
        })
        .filter_map(|c| {
            let id = c.container_id.as_deref()?;
            // `containerd://<id>`, `cri-o://<id>`, `docker://<id>`.
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            Some((id.to_owned(), c.name.clone()))
        })
        .collect();
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.name.clone()));
    Some(PodInfo {
        uid,
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        containers,
        controller,
    })
}

/// Deleted pods remembered as gone (a fault read after its pod was deleted
/// says so rather than that the pod is unknown).
const GONE_CAPACITY: usize = 256;

/// The listing loop (module doc) on kube-runtime's `watcher`, which lists,
/// then watches from the version listed, resumes a watch the server ended,
/// and lists again after a 410; errors are retried after our jittered
/// backoff. Ends at shutdown.
async fn watch_pods(
    client: kube::Client,
    node_name: String,
    api: ApiSettings,
    on_change: PlacementCallback,
    ask: Arc<Notify>,
    shutdown: Shutdown,
    progress: Arc<Progress>,
) {
    let fields = format!("spec.nodeName={node_name}");
    let config = watcher::Config::default()
        .fields(&fields)
        .timeout(api.watch_timeout_secs);
    let pods = Api::<Pod>::all(client);
    let backoff = WatchBackoff(Backoff::new(api.backoff_initial, api.backoff_max));
    let events = watcher(pods.clone(), config).backoff(backoff);
    let mut events = std::pin::pin!(events);
    let mut store = PodStore::new(on_change);
    let mut last_list: Option<Instant> = None;
    loop {
        progress.beat();
        let next = tokio::select! {
            () = shutdown.triggered() => return,
            () = ask.notified() => {
                let _list = progress.begin(std::ffi::OsStr::new("a list of the Node's pods"));
                tokio::select! {
                    () = shutdown.triggered() => return,
                    () = store.list_now(&pods, &fields, &ask, &mut last_list, api.request_timeout) => {}
                }
                continue;
            }
            next = events.next() => next,
            () = tokio::time::sleep(LISTING_BEAT) => continue,
        };
        match next {
            Some(Ok(event)) => store.apply(event),
            Some(Err(e)) => store.failed(&e),
            // The watcher's stream does not end; a backoff that did would.
            None => return,
        }
    }
}

/// The shared jittered backoff, as kube-runtime's stream backoff takes it
/// (reset after every event that arrives).
struct WatchBackoff(Backoff);

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(self.0.next_delay())
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.0.reset();
    }
}

/// The node's pods as the watcher tells them, published after every change.
struct PodStore {
    pods: HashMap<String, PodInfo>,
    /// The listing under way (between `Init` and `InitDone`).
    relisting: Option<HashMap<String, PodInfo>>,
    /// UIDs of pods deleted lately, oldest first (at most `GONE_CAPACITY`).
    gone: VecDeque<String>,
    /// The engine was told the listing is unavailable and not yet told it works.
    unavailable: bool,
    on_change: PlacementCallback,
}

impl PodStore {
    fn new(on_change: PlacementCallback) -> PodStore {
        PodStore {
            pods: HashMap::new(),
            relisting: None,
            gone: VecDeque::new(),
            unavailable: false,
            on_change,
        }
    }

    fn publish(&self) {
        (self.on_change)(PlacementUpdate::Pods(Arc::new(PodDirectory {
            by_uid: self.pods.clone(),
            gone: self.gone.iter().cloned().collect(),
        })));
    }

    fn remember_gone(&mut self, uid: String) {
        self.gone.retain(|u| *u != uid);
        self.gone.push_back(uid);
        while self.gone.len() > GONE_CAPACITY {
            self.gone.pop_front();
        }
    }

    fn apply(&mut self, event: watcher::Event<Pod>) {
        match event {
            watcher::Event::Init => self.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(p) => {
                if let (Some(listed), Some(info)) = (self.relisting.as_mut(), pod_info(&p)) {
                    listed.insert(info.uid.clone(), info);
                }
            }
            watcher::Event::InitDone => {
                let now = self.relisting.take().unwrap_or_default();
                // Pods deleted while the watch was down are gone too.
                let vanished: Vec<String> = self
                    .pods
                    .keys()
                    .filter(|u| !now.contains_key(*u))
                    .cloned()
                    .collect();
                for uid in vanished {
                    self.remember_gone(uid);
                }
                self.gone.retain(|u| !now.contains_key(u));
                self.pods = now;
                if self.unavailable {
                    tracing::info!("The node's pods are listed again.");
                }
                self.unavailable = false;
                self.publish();
                tracing::debug!(pods = self.pods.len(), "Listed the node's pods.");
            }
            watcher::Event::Apply(p) => {
                if let Some(info) = pod_info(&p) {
                    self.pods.insert(info.uid.clone(), info);
                    self.publish();
                }
            }
            watcher::Event::Delete(p) => {
                if let Some(uid) = &p.metadata.uid
                    && self.pods.remove(uid).is_some()
                {
                    self.remember_gone(uid.clone());
                    self.publish();
                }
            }
        }
    }

    /// Sends an asked-for list (no sooner than [`MIN_LIST_GAP`] after the
    /// last; asks made until it is sent are one) and takes in its answer; a failure only waits for the next ask
    /// (the watch reports outages).
    async fn list_now(
        &mut self,
        pods: &Api<Pod>,
        fields: &str,
        ask: &Notify,
        last_list: &mut Option<Instant>,
        timeout: Duration,
    ) {
        if let Some(t) = *last_list {
            tokio::time::sleep_until((t + MIN_LIST_GAP).into()).await;
        }
        // This list answers every ask made until now, including one made
        // while it waited.
        let _ = ask.notified().now_or_never();
        let sent_at = Instant::now();
        *last_list = Some(sent_at);
        let params = ListParams::default().fields(fields);
        match tokio::time::timeout(timeout, pods.list(&params)).await {
            Ok(Ok(listed)) => self.listed(&listed.items, sent_at),
            Ok(Err(e)) => tracing::debug!(error = %e, "Asked-for pod list failed."),
            Err(_) => tracing::debug!(?timeout, "Asked-for pod list timed out."),
        }
    }

    /// An asked-for list sent at `sent_at`: adds the pods the store lacks
    /// (not ones the watch saw deleted: the watch is newer there), then
    /// tells the engine the listing is current as of `sent_at`.
    fn listed(&mut self, pods: &[Pod], sent_at: Instant) {
        let mut added = false;
        for info in pods.iter().filter_map(pod_info) {
            if !self.pods.contains_key(&info.uid) && !self.gone.contains(&info.uid) {
                self.pods.insert(info.uid.clone(), info);
                added = true;
            }
        }
        if added {
            self.publish();
        }
        (self.on_change)(PlacementUpdate::PodsCurrent(sent_at));
    }

    /// Says a failure once per outage. An expired version (410) is not one:
    /// the watcher lists again at once.
    fn failed(&mut self, e: &watcher::Error) {
        if let watcher::Error::WatchError(status) = e
            && status.code == 410
        {
            tracing::info!(message = %status.message, "Pod watch version expired; listing the pods again.");
            return;
        }
        if !self.unavailable {
            self.unavailable = true;
            tracing::warn!(error = %e, "Cannot list or watch the node's pods; faults name pods by UID only until it works.");
            (self.on_change)(PlacementUpdate::PodsUnavailable(e.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_lose_their_runtime_prefix() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u1"},
            "status": {
                "containerStatuses": [
                    {"name": "main", "containerID": "containerd://abc", "image": "", "imageID": "", "ready": true, "restartCount": 0},
                    {"name": "waiting", "image": "", "imageID": "", "ready": false, "restartCount": 0}
                ],
                "initContainerStatuses": [
                    {"name": "init", "containerID": "cri-o://def", "image": "", "imageID": "", "ready": false, "restartCount": 0}
                ]
            }
        }))
        .unwrap();
        let info = pod_info(&pod).unwrap();
        assert_eq!(
            info.containers,
            vec![
                ("abc".to_owned(), "main".to_owned()),
                ("def".to_owned(), "init".to_owned())
            ]
        );
        assert_eq!((info.name.as_str(), info.namespace.as_str()), ("p", "ml"));
        assert_eq!(info.controller, None);
        let owned: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train-42-x7k", "namespace": "ml", "uid": "u2", "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-the-controller", "uid": "o1"},
                {"apiVersion": "batch/v1", "kind": "Job", "name": "train-42", "uid": "o2", "controller": true}
            ]}
        }))
        .unwrap();
        assert_eq!(
            pod_info(&owned).unwrap().controller,
            Some(("Job".to_owned(), "train-42".to_owned()))
        );
        let no_uid: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
        assert!(pod_info(&no_uid).is_none());
    }
}
