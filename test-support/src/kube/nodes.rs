//! Nodes, served as kube-apiserver serves `nodes` and `nodes/status` (get,
//! watch, server-side apply of conditions, merge / strategic merge / JSON
//! patch, update), with the field managers of their conditions and the other
//! writers that race the client; and the collection: a list by label selector,
//! metadata-only when asked.
//!
//! A list with `resourceVersion=0` is served from the watch cache, which does
//! not paginate: `limit` is ignored and no `continue` token is given
//! (apiserver `pkg/storage/cacher/cacher.go`, `shouldDelegateList`: only a list
//! with a limit and another resourceVersion goes to etcd). Other lists honour
//! `limit` and `continue`.

use super::request::{Request, Target};
use super::selector;
use super::status::{not_found, not_served, ok, optimistic_lock_conflict, status, status_with};
use super::watch::{self, Watchers};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use tokio::sync::mpsc;

/// The Node and what the server keeps about it.
#[derive(Default)]
pub(super) struct Nodes {
    pub(super) node: Value,
    /// condition type → manager.
    pub(super) managed: BTreeMap<String, String>,
    pub(super) concurrent_taint_edits: u32,
    /// Versions below this are compacted: a watch from them is 410 Gone.
    pub(super) compacted_rv: u64,
    /// The Node does not exist (404 on every node request).
    pub(super) missing: bool,
    pub(super) watchers: Watchers,
}

/// Every Node the double holds; the first one started is the primary, which
/// the single-node helpers of [`super::ApiDouble`] act on.
#[derive(Default)]
pub(super) struct NodeStore {
    pub(super) primary: String,
    pub(super) by_name: BTreeMap<String, Nodes>,
    /// Watches whose field selector names no Node the double holds: open,
    /// silent, until their timeout (as the real server keeps them).
    idle: Vec<mpsc::UnboundedSender<Value>>,
}

impl NodeStore {
    pub(super) fn primary(&mut self) -> &mut Nodes {
        let name = self.primary.clone();
        self.by_name.entry(name).or_default()
    }

    pub(super) fn primary_ref(&self) -> Option<&Nodes> {
        self.by_name.get(&self.primary)
    }

    /// Adds a Node (named in `node.metadata.name`) at version `rv`.
    pub(super) fn insert(&mut self, mut node: Value, rv: u64) {
        let name = node["metadata"]["name"].as_str().unwrap_or("").to_owned();
        if node["metadata"]["uid"].is_null() {
            node["metadata"]["uid"] = json!(format!("node-uid-{name}"));
        }
        node["metadata"]["resourceVersion"] = json!(rv.to_string());
        if self.primary.is_empty() {
            self.primary.clone_from(&name);
        }
        self.by_name.insert(
            name,
            Nodes {
                node,
                ..Nodes::default()
            },
        );
    }

    /// Deletes a Node: its watches get a DELETED event and end.
    pub(super) fn remove(&mut self, name: &str, rv: &mut u64) -> bool {
        let Some(mut n) = self.by_name.remove(name) else {
            return false;
        };
        *rv += 1;
        n.node["metadata"]["resourceVersion"] = json!(rv.to_string());
        let ev = json!({"type": "DELETED", "object": n.node});
        n.watchers.end_all(Some(&ev));
        true
    }
}

/// Answers a request for `nodes` (`rv`: the server's resourceVersion counter):
/// the collection here, one Node in [`serve`].
pub(super) fn serve_store(store: &mut NodeStore, rv: &mut u64, req: &Request) -> Response {
    let Target::Nodes(rest) = &req.target else {
        return not_served(req);
    };
    match rest.first() {
        Some(name) => match store.by_name.get_mut(name) {
            Some(nodes) => serve(nodes, rv, req),
            None => not_found("nodes", name),
        },
        None if req.verb == "watch" => {
            let sel = req.q.get("fieldSelector").cloned().unwrap_or_default();
            let name = sel.strip_prefix("metadata.name=").unwrap_or(&store.primary);
            match store.by_name.get_mut(name) {
                Some(nodes) => serve(nodes, rv, req),
                None => {
                    let (tx, rx) = mpsc::unbounded_channel::<Value>();
                    store.idle.push(tx);
                    watch::response(rx, &req.q)
                }
            }
        }
        None if req.method == "GET" => list(store, *rv, req),
        None => not_served(req),
    }
}

/// `GET /api/v1/nodes`: by label selector and `metadata.name` field selector;
/// the list's resourceVersion is the server's current one; `limit` and `continue` (the name to
/// go on after) unless served from the watch cache (`resourceVersion=0`).
fn list(store: &NodeStore, rv: u64, req: &Request) -> Response {
    let sel = req.q.get("labelSelector").cloned().unwrap_or_default();
    // The field selector nodes support that clients use: one Node by name.
    let name = req
        .q
        .get("fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name="))
        .map(str::to_owned);
    let from_cache = req.q.get("resourceVersion").is_some_and(|v| v == "0");
    let limit: usize = if from_cache {
        0
    } else {
        req.q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0)
    };
    let after = req.q.get("continue").cloned().unwrap_or_default();
    let mut items: Vec<Value> = store
        .by_name
        .iter()
        .filter(|(n, _)| name.as_ref().is_none_or(|want| *n == want))
        .filter(|(name, n)| (after.is_empty() || **name > after) && !n.missing)
        .filter(|(_, n)| selector::matches(&n.node, &sel))
        .map(|(_, n)| n.node.clone())
        .collect();
    let mut cont = None;
    if limit > 0 && items.len() > limit {
        items.truncate(limit);
        cont = items
            .last()
            .and_then(|n| n["metadata"]["name"].as_str())
            .map(str::to_owned);
    }
    ok(
        200,
        &selector::list_body("Node", "v1", items, rv, &req.accept, cont),
    )
}

/// Answers a request for one Node (`rv`: the server's resourceVersion counter).
pub(super) fn serve(nodes: &mut Nodes, rv: &mut u64, req: &Request) -> Response {
    let Target::Nodes(rest) = &req.target else {
        return not_served(req);
    };
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let node_name = nodes.node["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    match (req.method.as_str(), rest.as_slice()) {
        ("GET" | "PATCH" | "PUT", [n, ..]) if nodes.missing || *n != node_name => {
            not_found("nodes", n)
        }
        ("GET", [_]) => ok(200, &selector::object_body(&nodes.node, &req.accept)),
        ("GET", []) if req.verb == "watch" => nodes.watch(&req.q, &node_name),
        ("PATCH", [_, "status"]) => {
            if req.content_type != "application/apply-patch+yaml" {
                status(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "double only supports apply on status, got {}",
                        req.content_type
                    ),
                )
            } else {
                nodes.apply_status(rv, &req.q, &req.body)
            }
        }
        ("PATCH", [_]) => nodes.patch(rv, &req.content_type, &req.body),
        ("PUT", [_]) => nodes.update(rv, &req.body),
        _ => not_served(req),
    }
}

impl Nodes {
    /// A change of the Node: the next resourceVersion, managedFields, and a
    /// MODIFIED event to every watch.
    pub(super) fn bump(&mut self, rv: &mut u64) {
        *rv += 1;
        self.node["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.write_managed_fields();
        let ev = json!({"type": "MODIFIED", "object": self.node.clone()});
        self.watchers.send(&ev);
    }

    fn write_managed_fields(&mut self) {
        let mut by_manager: BTreeMap<&str, serde_json::Map<String, Value>> = BTreeMap::new();
        for (t, m) in &self.managed {
            by_manager
                .entry(m.as_str())
                .or_default()
                .insert(format!("k:{{\"type\":\"{t}\"}}"), json!({}));
        }
        let mf: Vec<Value> = by_manager
            .into_iter()
            .map(|(m, conds)| {
                json!({
                    "manager": m, "operation": "Apply", "apiVersion": "v1",
                    "fieldsType": "FieldsV1", "subresource": "status",
                    "fieldsV1": {"f:status": {"f:conditions": conds}},
                })
            })
            .collect();
        self.node["metadata"]["managedFields"] = json!(mf);
    }

    pub(super) fn conditions(&mut self) -> &mut Vec<Value> {
        if !self.node["status"].is_object() {
            self.node["status"] = json!({});
        }
        if !self.node["status"]["conditions"].is_array() {
            self.node["status"]["conditions"] = json!([]);
        }
        self.node["status"]["conditions"]
            .as_array_mut()
            .expect("just made an array")
    }

    /// `PATCH nodes/<name>/status` with a server-side apply configuration of
    /// conditions, owned per field manager.
    fn apply_status(
        &mut self,
        rv: &mut u64,
        q: &BTreeMap<String, String>,
        body: &Value,
    ) -> Response {
        let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()) else {
            return status(400, "BadRequest", "PATCH with apply requires fieldManager");
        };
        let force = q.get("force").is_some_and(|f| f == "true");
        let Some(applied) = body["status"]["conditions"].as_array().cloned() else {
            return status(
                422,
                "Invalid",
                "status.conditions missing in apply configuration",
            );
        };
        if body["kind"] != "Node" || body["apiVersion"] != "v1" {
            return status(
                400,
                "BadRequest",
                "apply configuration needs apiVersion v1, kind Node",
            );
        }
        let mut types = Vec::new();
        for c in &applied {
            let Some(t) = c["type"].as_str() else {
                return status(422, "Invalid", "condition without type");
            };
            if let Some(owner) = self.managed.get(t).cloned()
                && owner != *manager
                && !force
            {
                let same = self.conditions().iter().any(|x| x["type"] == t && x == c);
                if !same {
                    // The field manager's conflict error (apimachinery
                    // `pkg/util/managedfields/internal/conflict.go`,
                    // `NewConflictError`): 409 Conflict, one cause per field of
                    // type FieldManagerConflict naming the other manager.
                    let field = format!(".status.conditions[type=\"{t}\"]");
                    let with = format!("conflict with \"{owner}\" using v1");
                    return status_with(
                        409,
                        "Conflict",
                        format!("Apply failed with 1 conflict: {with}: {field}"),
                        json!({"causes": [{
                            "reason": "FieldManagerConflict", "message": with, "field": field,
                        }]}),
                    );
                }
            }
            types.push(t.to_owned());
        }
        for c in applied {
            let t = c["type"].as_str().unwrap_or_default().to_owned();
            let conds = self.conditions();
            match conds.iter_mut().find(|x| x["type"] == t.as_str()) {
                Some(x) => *x = c,
                None => conds.push(c),
            }
            self.managed.insert(t, manager.clone());
        }
        let dropped: Vec<String> = self
            .managed
            .iter()
            .filter(|(t, m)| *m == manager && !types.contains(t))
            .map(|(t, _)| t.clone())
            .collect();
        for t in dropped {
            self.managed.remove(&t);
            self.conditions().retain(|x| x["type"] != t.as_str());
        }
        self.bump(rv);
        ok(200, &self.node)
    }

    /// Another writer changes the Node between the client's read and this
    /// write (as the kubelet, the device plugin, NFD or an autoscaler do).
    fn race(&mut self, rv: &mut u64) {
        if self.concurrent_taint_edits == 0 {
            return;
        }
        self.concurrent_taint_edits -= 1;
        let n = self.concurrent_taint_edits;
        if !self.node["spec"]["taints"].is_array() {
            self.node["spec"]["taints"] = json!([]);
        }
        self.node["spec"]["taints"]
            .as_array_mut()
            .expect("array")
            .push(json!({"key": format!("other.example.com/edit-{n}"), "effect": "NoSchedule"}));
        self.bump(rv);
    }

    /// Stores a patched or replaced Node, enforcing what the registry store does
    /// on every update (apiserver `pkg/registry/generic/registry/store.go`,
    /// `Update`): a resourceVersion in the new object that differs from the
    /// stored one is a 409 Conflict; none means unconditional (Nodes allow
    /// unconditional updates). The name cannot change.
    fn store_update(&mut self, rv: &mut u64, mut candidate: Value) -> Response {
        let name = self.node["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let sent = candidate["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("");
        if !sent.is_empty() && Some(sent) != self.node["metadata"]["resourceVersion"].as_str() {
            return optimistic_lock_conflict("nodes", &name);
        }
        if candidate["metadata"]["name"] != self.node["metadata"]["name"] {
            // `rest.BeforeUpdate` → `ValidateObjectMetaUpdate`: field.Invalid.
            return status_with(
                422,
                "Invalid",
                format!(
                    "Node \"{name}\" is invalid: metadata.name: Invalid value: field is immutable"
                ),
                json!({"name": name, "kind": "Node", "causes": [{"reason": "FieldValueInvalid", "message": "Invalid value: field is immutable", "field": "metadata.name"}]}),
            );
        }
        // Server-owned fields are not the client's to set.
        candidate["metadata"]["managedFields"] = self.node["metadata"]["managedFields"].clone();
        candidate["metadata"]["uid"] = self.node["metadata"]["uid"].clone();
        self.node = candidate;
        self.bump(rv);
        ok(200, &self.node)
    }

    /// `PATCH nodes/<name>` (apiserver `pkg/endpoints/handlers/patch.go`).
    fn patch(&mut self, rv: &mut u64, content_type: &str, body: &Value) -> Response {
        self.race(rv);
        let mut candidate = self.node.clone();
        match content_type {
            "application/json-patch+json" => {
                let patch: json_patch::Patch = match serde_json::from_value(body.clone()) {
                    Ok(p) => p,
                    // `jsonpatch.DecodePatch` failing → `errors.NewBadRequest`.
                    Err(e) => return status(400, "BadRequest", e.to_string()),
                };
                if json_patch::patch(&mut candidate, &patch).is_err() {
                    // `applyJSPatch`: any failure of `patchObj.Apply`, a failed
                    // `test` op included, is
                    // `NewGenericServerResponse(422, "", GroupResource{}, "", err, 0, false)`:
                    // reason Invalid, the generic message, no causes (the
                    // server's message is dropped), so empty details.
                    return status(
                        422,
                        "Invalid",
                        "the server rejected our request due to an error in our request",
                    );
                }
                // A JSON patch keeps whatever resourceVersion the object had
                // (unless an op changed it): the store sees the current one.
            }
            // RFC 7386 merge patch (`jsonpatch.MergePatch`); a strategic merge
            // patch is the same for the fields the double serves (Node taints
            // carry no patch strategy in `k8s.io/api/core/v1/types.go`, so the
            // list is replaced whole).
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                if !body.is_object() {
                    return status(400, "BadRequest", "invalid JSON document");
                }
                json_patch::merge(&mut candidate, body);
            }
            other => {
                // go-restful rejects other content types before the handler.
                return status(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other})"
                    ),
                );
            }
        }
        self.store_update(rv, candidate)
    }

    /// `PUT nodes/<name>` (apiserver `pkg/endpoints/handlers/update.go`).
    fn update(&mut self, rv: &mut u64, body: &Value) -> Response {
        self.race(rv);
        if !body.is_object() {
            return status(400, "BadRequest", "invalid JSON document");
        }
        self.store_update(rv, body.clone())
    }

    /// `GET nodes?watch=true`, for this Node only (`fieldSelector`
    /// `metadata.name=<name>`, or none).
    fn watch(&mut self, q: &BTreeMap<String, String>, node_name: &str) -> Response {
        let sel = q.get("fieldSelector").cloned().unwrap_or_default();
        let matches = sel.is_empty() || sel == format!("metadata.name={node_name}");
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let (tx, rx) = mpsc::unbounded_channel::<Value>();
        if from != 0 && from < self.compacted_rv {
            // The watch cache no longer holds `from` (apiserver
            // `pkg/storage/cacher/watch_cache.go`: `NewResourceExpired("too
            // old resource version: ...")`), and `Cacher.Watch` returns it
            // through `newErrWatcher`: a 200 whose only event is an ERROR
            // carrying the 410 Expired Status.
            let _ = tx.send(json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {from} ({})", self.compacted_rv),
                "reason": "Expired", "code": 410,
            }}));
            drop(tx);
        } else {
            let node_rv: u64 = self.node["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            if matches && !self.missing && from < node_rv {
                // `0` (any version) starts with the current state as ADDED;
                // an older version replays what changed since. The double
                // keeps no history: its replay is the latest state.
                let kind = if from == 0 { "ADDED" } else { "MODIFIED" };
                let _ = tx.send(json!({"type": kind, "object": self.node.clone()}));
            }
            if matches {
                self.watchers.add(tx, q);
            }
        }
        watch::response(rx, q)
    }
}
