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
//! A watch that the server ends at its timeout resumes from the last version
//! seen; an expired version (410) lists again.

use super::retry::Backoff;
use super::settings::ApiSettings;
use futures::StreamExt;
use gpuwatch_core::placement::{PlacementUpdate, PodDirectory, PodInfo};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Receives the pod listing after every change (the agent forwards it to the
/// health engine; it must not block).
pub type PlacementCallback = Arc<dyn Fn(PlacementUpdate) + Send + Sync>;

/// What gpuwatch keeps of a Pod: `None` for one without a UID.
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
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

/// The listing loop (module doc); ends at shutdown.
pub(crate) async fn watch_pods(
    client: kube::Client,
    node_name: String,
    api: ApiSettings,
    on_change: PlacementCallback,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut watcher = PodWatcher {
        api: Api::all(client),
        selector: format!("spec.nodeName={node_name}"),
        timeout: api.request_timeout,
        watch_timeout_secs: api.watch_timeout_secs,
        backoff: Backoff::new(api.backoff_initial, api.backoff_max),
        pods: HashMap::new(),
        gone: VecDeque::new(),
        rv: None,
        unavailable: false,
        on_change,
    };
    loop {
        if *shutdown.borrow() {
            return;
        }
        let step = match watcher.rv.clone() {
            None => watcher.list().await,
            Some(from) => watcher.watch(&from, &mut shutdown).await,
        };
        let why = match step {
            Step::Again => continue,
            Step::Shutdown => return,
            Step::Failed(why) => why,
        };
        watcher.failed(why);
        if !pause(&mut shutdown, watcher.backoff.next_delay()).await {
            return;
        }
    }
}

/// What one list or one watch ended with.
enum Step {
    /// List or watch again at once (from `rv`, or listing when it is `None`).
    Again,
    /// Failed: said once, then retried after a backoff.
    Failed(String),
    Shutdown,
}

/// The listing's state between requests.
struct PodWatcher {
    api: Api<Pod>,
    selector: String,
    timeout: Duration,
    watch_timeout_secs: u32,
    backoff: Backoff,
    pods: HashMap<String, PodInfo>,
    /// UIDs of pods deleted lately, oldest first (at most `GONE_CAPACITY`).
    gone: VecDeque<String>,
    /// The version to watch from; `None` lists first.
    rv: Option<String>,
    /// The engine was told the listing is unavailable and not yet told it works.
    unavailable: bool,
    on_change: PlacementCallback,
}

impl PodWatcher {
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

    async fn list(&mut self) -> Step {
        let lp = ListParams::default().fields(&self.selector);
        match super::backend::timed(self.timeout, self.api.list(&lp)).await {
            Ok(list) => {
                let now: HashMap<String, PodInfo> = list
                    .items
                    .iter()
                    .filter_map(pod_info)
                    .map(|p| (p.uid.clone(), p))
                    .collect();
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
                self.rv = list.metadata.resource_version;
                self.unavailable = false;
                self.backoff.reset();
                self.publish();
                tracing::debug!(pods = self.pods.len(), "Listed the node's pods.");
                Step::Again
            }
            Err(e) => Step::Failed(e.to_string()),
        }
    }

    /// One watch from `from`, applied event by event until the server ends it.
    async fn watch(&mut self, from: &str, shutdown: &mut watch::Receiver<bool>) -> Step {
        let wp = WatchParams::default()
            .fields(&self.selector)
            .timeout(self.watch_timeout_secs);
        let stream = match self.api.watch(&wp, from).await {
            Ok(stream) => stream,
            Err(e) => {
                let e = super::backend::ApiError::from_kube(e);
                if matches!(e, super::backend::ApiError::Gone(_)) {
                    self.rv = None;
                    return Step::Again;
                }
                return Step::Failed(e.to_string());
            }
        };
        let mut stream = std::pin::pin!(stream);
        let opened = tokio::time::Instant::now();
        let mut moved = false;
        let step = loop {
            let next = tokio::select! {
                _ = shutdown.changed() => return Step::Shutdown,
                n = stream.next() => n,
            };
            let Some(next) = next else {
                break Step::Again;
            };
            moved = true;
            let event = match next {
                Ok(event) => event,
                Err(e) => break Step::Failed(e.to_string()),
            };
            if let Some(step) = self.apply(event) {
                break step;
            }
        };
        if moved {
            self.backoff.reset();
        } else if matches!(step, Step::Again) && opened.elapsed() < Duration::from_secs(1) {
            // A server that closes every watch at once is not asked again in
            // a tight loop.
            if !pause(shutdown, self.backoff.next_delay()).await {
                return Step::Shutdown;
            }
        }
        step
    }

    /// Applies one watch event; `Some` ends the watch.
    fn apply(&mut self, event: WatchEvent<Pod>) -> Option<Step> {
        match event {
            WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                self.rv = p.metadata.resource_version.clone().or(self.rv.take());
                if let Some(info) = pod_info(&p) {
                    self.pods.insert(info.uid.clone(), info);
                    self.publish();
                }
            }
            WatchEvent::Deleted(p) => {
                self.rv = p.metadata.resource_version.clone().or(self.rv.take());
                if let Some(uid) = &p.metadata.uid
                    && self.pods.remove(uid).is_some()
                {
                    self.remember_gone(uid.clone());
                    self.publish();
                }
            }
            WatchEvent::Bookmark(b) => self.rv = Some(b.metadata.resource_version),
            WatchEvent::Error(e) if e.code == 410 => {
                tracing::info!(message = %e.message, "Pod watch version expired; listing the pods again.");
                self.rv = None;
                return Some(Step::Again);
            }
            WatchEvent::Error(e) => {
                return Some(Step::Failed(format!("{} ({})", e.message, e.code)));
            }
        }
        None
    }

    /// Says a failure once per outage, and lists again next time: what
    /// changed meanwhile is not lost.
    fn failed(&mut self, why: String) {
        if !self.unavailable {
            self.unavailable = true;
            tracing::warn!(error = %why, "Cannot list or watch the node's pods; faults name pods by UID only until it works.");
            (self.on_change)(PlacementUpdate::PodsUnavailable(why));
        }
        self.rv = None;
    }
}

/// Sleeps `delay`; `false` when shutdown came first.
async fn pause(shutdown: &mut watch::Receiver<bool>, delay: Duration) -> bool {
    tokio::select! {
        _ = shutdown.changed() => false,
        () = tokio::time::sleep(delay) => true,
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
