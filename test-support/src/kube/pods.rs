//! core/v1 Pods, as the agent's pod listing reads them: a cluster-wide list
//! and watch filtered by `fieldSelector=spec.nodeName=<node>` (the field
//! selector kube-apiserver offers on pods, `pkg/registry/core/pod/strategy.go`
//! `PodToSelectableFields`), and the test's own adds, changes and deletes,
//! each streamed to the open watches as ADDED / MODIFIED / DELETED. A list
//! may also be namespaced (`/api/v1/namespaces/<ns>/pods`: that namespace
//! only) and carry a `labelSelector`.
//!
//! A watch from an older version replays what changed since, as the watch
//! cache does: the pods changed since as they are now, and the pods deleted
//! since as DELETED (kept as tombstones until a compaction); a compacted
//! version answers 410 Expired.
//!
//! The open watches can be made to lag ([`Pods::lag`]): kube-apiserver
//! serves watches from its watch cache, which an etcd watch feeds and which
//! falls behind etcd under load, while a list without `resourceVersion` is a
//! consistent read of the current state (Kubernetes API concepts, "Resource
//! versions": unset means "Most Recent"). While lagging, changes are queued
//! for the watches and lists see them at once; ending the lag delivers the
//! queue in order.

use super::request::{Request, Target};
use super::selector;
use super::status::{not_served, ok};
use super::watch::{self, Watchers};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use tokio::sync::mpsc;

/// The stored Pods by (namespace, name), each with the version it changed at.
#[derive(Default)]
pub(super) struct Pods {
    by_key: BTreeMap<(String, String), (Value, u64)>,
    /// Deleted pods (as last stored, with the deletion's version), replayed
    /// to a watch from before the deletion.
    deleted: Vec<(Value, u64)>,
    watchers: Watchers,
    /// Versions below this are gone from the watch cache.
    pub(super) compacted_rv: u64,
    /// Watch events held back while the watches lag.
    lagging: Option<Vec<Value>>,
}

fn node_of(pod: &Value) -> &str {
    pod["spec"]["nodeName"].as_str().unwrap_or("")
}

/// Whether `pod` matches a `spec.nodeName=` (or empty) field selector; any
/// other selector matches nothing here.
fn selects(selector: &str, pod: &Value) -> bool {
    selector
        .split(',')
        .filter(|s| !s.is_empty())
        .all(|kv| match kv.split_once('=') {
            Some(("spec.nodeName", v)) => node_of(pod) == v,
            Some(("metadata.namespace", v)) => pod["metadata"]["namespace"] == v,
            _ => false,
        })
}

impl Pods {
    /// Creates or replaces a pod (a new version, an event to the watches).
    pub(super) fn put(&mut self, rv: &mut u64, mut pod: Value) {
        *rv += 1;
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
        pod["metadata"]["namespace"] = json!(ns);
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        let kind = if self.by_key.contains_key(&(ns.clone(), name.clone())) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.stream(json!({"type": kind, "object": pod.clone()}));
        self.by_key.insert((ns, name), (pod, *rv));
    }

    /// Deletes a pod; false when there is none.
    pub(super) fn delete(&mut self, rv: &mut u64, namespace: &str, name: &str) -> bool {
        let Some((mut pod, _)) = self.by_key.remove(&(namespace.to_owned(), name.to_owned()))
        else {
            return false;
        };
        *rv += 1;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.stream(json!({"type": "DELETED", "object": pod.clone()}));
        self.deleted.push((pod, *rv));
        true
    }

    /// One change to the watches that select its pod (queued while they lag).
    fn stream(&mut self, ev: Value) {
        match &mut self.lagging {
            Some(queue) => queue.push(ev),
            None => self
                .watchers
                .send_if(&ev, |sel| selects(sel, &ev["object"])),
        }
    }

    /// Makes the watches lag behind the stored pods, or catch up (module doc).
    pub(super) fn lag(&mut self, on: bool) {
        if on {
            self.lagging.get_or_insert_with(Vec::new);
            return;
        }
        for ev in self.lagging.take().unwrap_or_default() {
            self.stream(ev);
        }
    }

    /// Ends every open pod watch, with `ev` (an ERROR) as its last event or
    /// none (the server went away).
    pub(super) fn end_watches(&mut self, ev: Option<&Value>) {
        self.watchers.end_all(ev);
    }

    /// Forgets every version before `rv`: tombstones go, and a watch from
    /// before it is 410.
    pub(super) fn compact(&mut self, rv: u64) {
        self.compacted_rv = rv;
        self.deleted.clear();
    }

    /// Open pod watches.
    pub(super) fn watchers(&mut self) -> usize {
        self.watchers.open()
    }
}

/// Answers a request for `pods`.
pub(super) fn serve(pods: &mut Pods, rv: u64, req: &Request) -> Response {
    let Target::Pods {
        name: None,
        namespace,
    } = &req.target
    else {
        return not_served(req);
    };
    let sel = req.q.get("fieldSelector").cloned().unwrap_or_default();
    let labels = req.q.get("labelSelector").cloned().unwrap_or_default();
    match (req.method.as_str(), req.verb.as_str()) {
        ("GET", "watch") => pods.watch(&req.q, &sel),
        // A namespaced list (`/api/v1/namespaces/<ns>/pods`) sees that
        // namespace only; `labelSelector` as `selector::matches` reads it.
        ("GET", "list") => {
            let items: Vec<Value> = pods
                .by_key
                .iter()
                .filter(|((ns, _), _)| namespace.as_ref().is_none_or(|n| n == ns))
                .filter(|(_, (p, _))| selects(&sel, p) && selector::matches(p, &labels))
                .map(|(_, (p, _))| p.clone())
                .collect();
            ok(
                200,
                &selector::list_body("Pod", "v1", items, rv, &req.accept, None),
            )
        }
        _ => not_served(req),
    }
}

impl Pods {
    fn watch(&mut self, q: &BTreeMap<String, String>, sel: &str) -> Response {
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let (tx, rx) = mpsc::unbounded_channel::<Value>();
        if from != 0 && from < self.compacted_rv {
            // As for Nodes: the 200 whose only event is the 410 Expired Status.
            let _ = tx.send(json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {from} ({})", self.compacted_rv),
                "reason": "Expired", "code": 410,
            }}));
            drop(tx);
        } else {
            for (p, at) in self.by_key.values() {
                if *at > from && selects(sel, p) {
                    let kind = if from == 0 { "ADDED" } else { "MODIFIED" };
                    let _ = tx.send(json!({"type": kind, "object": p.clone()}));
                }
            }
            if from != 0 {
                for (p, at) in &self.deleted {
                    if *at > from && selects(sel, p) {
                        let _ = tx.send(json!({"type": "DELETED", "object": p.clone()}));
                    }
                }
            }
            self.watchers.add_selected(tx, q, sel);
        }
        watch::response(rx, q)
    }
}
