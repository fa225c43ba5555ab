//! An in-process Kubernetes API-server double (axum on 127.0.0.1:0) that answers
//! the node writer's requests the way kube-apiserver does. Every response shape
//! names where the real server defines it (paths are in kubernetes/kubernetes,
//! `staging/src/k8s.io/...`; "API conventions" is
//! `community/contributors/devel/sig-architecture/api-conventions.md`):
//!
//! - `GET /api/v1/nodes/{name}`; 404 `NotFound` when the Node is missing.
//! - Watch `GET /api/v1/nodes?watch=true&fieldSelector=metadata.name=...`: JSON
//!   lines; `ADDED` first when the client's version is older; `BOOKMARK` events
//!   when asked; `410 Gone`/`Expired` for a compacted version (as the response or
//!   as an `ERROR` event); the stream closes at `timeoutSeconds`.
//! - `PATCH /api/v1/nodes/{name}/status` apply (`application/apply-patch+yaml`):
//!   condition types owned per manager (managedFields), 409 naming the other
//!   manager unless `force`.
//! - `PATCH /api/v1/nodes/{name}`: merge patch and strategic merge patch (a
//!   `metadata.resourceVersion` in the body is a precondition: 409 when stale),
//!   JSON patch (a failed `test` is the generic 422 with empty details);
//!   `PUT` update (409 on a stale resourceVersion).
//! - core/v1 Events: create (409 AlreadyExists), merge-patch, list with field
//!   selectors.
//! - On demand: 403 RBAC `Status` per (verb, resource), 429 with `Retry-After`,
//!   500/503, an outage, a delay, another writer racing every node write.
//! - Every request recorded with its RBAC verb and resource.
#![allow(dead_code, unreachable_pub)]

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use gpuwatch_sinks::kube::{ApiRequest, KubeConfig, WRITER_REQUESTS};
use k8s_openapi::api::core::v1::{Event, Node};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// One request the double received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
    pub verb: String,
    pub resource: String,
    pub status: u16,
    pub at: Instant,
}

impl Recorded {
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

#[derive(Default)]
pub struct Inner {
    node: Value,
    rv: u64,
    /// condition type → manager.
    managed: BTreeMap<String, String>,
    events: BTreeMap<String, Value>,
    requests: Vec<Recorded>,
    forbidden: HashSet<(String, String)>,
    down: bool,
    delay: Option<Duration>,
    concurrent_taint_edits: u32,
    /// Answers queued for the next requests (429, 500, 503), oldest first.
    injected: std::collections::VecDeque<u16>,
    /// Versions below this are compacted: a watch from them is 410 Gone.
    compacted_rv: u64,
    /// The Node does not exist (404 on every node request).
    node_missing: bool,
    watchers: Vec<Watcher>,
}

struct Watcher {
    tx: mpsc::UnboundedSender<Value>,
    bookmarks: bool,
}

pub type Shared = Arc<Mutex<Inner>>;

pub struct ApiDouble {
    pub url: String,
    inner: Shared,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A `metav1.Status` failure as the API server writes it (apimachinery
/// `pkg/api/errors/errors.go` builds each; apiserver
/// `pkg/endpoints/handlers/responsewriters/status.go` sets the HTTP code from
/// `code`). An empty `details` is omitted, as Go's `omitempty` does.
fn status_with(code: u16, reason: &str, message: impl Into<String>, details: Value) -> Response {
    let mut body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message.into(), "reason": reason, "code": code,
    });
    if details.as_object().is_some_and(|d| !d.is_empty()) {
        body["details"] = details;
    }
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("static response parts")
}

fn status(code: u16, reason: &str, message: impl Into<String>) -> Response {
    status_with(code, reason, message, json!({}))
}

/// `errors.NewNotFound`: `<resource> "<name>" not found`, details name + kind
/// (the resource).
fn not_found(resource: &str, name: &str) -> Response {
    status_with(
        404,
        "NotFound",
        format!("{resource} \"{name}\" not found"),
        json!({"name": name, "kind": resource}),
    )
}

/// `errors.NewConflict(resource, name, OptimisticLockErrorMsg)`: what the
/// registry store (apiserver `pkg/registry/generic/registry/store.go`, `Update`)
/// answers when the object's resourceVersion differs from the stored one.
fn optimistic_lock_conflict(resource: &str, name: &str) -> Response {
    status_with(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
        ),
        json!({"name": name, "kind": resource}),
    )
}

fn ok(code: u16, v: &Value) -> Response {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(v.to_string()))
        .expect("static response parts")
}

fn query_map(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        if b[i] == b'%'
            && let Some(v) = hex
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Inner {
    fn bump(&mut self) {
        self.rv += 1;
        self.node["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.write_managed_fields();
        let ev = json!({"type": "MODIFIED", "object": self.node.clone()});
        self.watchers.retain(|w| w.tx.send(ev.clone()).is_ok());
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

    fn conditions(&mut self) -> &mut Vec<Value> {
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

    fn apply_status(&mut self, q: &BTreeMap<String, String>, body: &Value) -> Response {
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
        self.bump();
        ok(200, &self.node)
    }

    /// Another writer changes the Node between the client's read and this
    /// write (as the kubelet, the device plugin, NFD or an autoscaler do).
    fn race(&mut self) {
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
        self.bump();
    }

    /// Stores a patched or replaced Node, enforcing what the registry store does
    /// on every update (apiserver `pkg/registry/generic/registry/store.go`,
    /// `Update`): a resourceVersion in the new object that differs from the
    /// stored one is a 409 Conflict; none means unconditional (Nodes allow
    /// unconditional updates). The name cannot change.
    fn store_update(&mut self, mut candidate: Value) -> Response {
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
        self.bump();
        ok(200, &self.node)
    }

    /// `PATCH nodes/<name>` (apiserver `pkg/endpoints/handlers/patch.go`).
    fn node_patch(&mut self, content_type: &str, body: &Value) -> Response {
        self.race();
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
        self.store_update(candidate)
    }

    /// `PUT nodes/<name>` (apiserver `pkg/endpoints/handlers/update.go`).
    fn node_update(&mut self, body: &Value) -> Response {
        self.race();
        if !body.is_object() {
            return status(400, "BadRequest", "invalid JSON document");
        }
        self.store_update(body.clone())
    }
}

fn classify(method: &Method, path: &str, q: &BTreeMap<String, String>) -> (String, String) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let verb_for = |collection: bool| -> &'static str {
        match (method.as_str(), collection) {
            ("GET", true) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => "watch",
            ("GET", true) => "list",
            ("GET", false) => "get",
            ("POST", _) => "create",
            ("PATCH", _) => "patch",
            ("PUT", _) => "update",
            ("DELETE", _) => "delete",
            _ => "unknown",
        }
    };
    match parts.as_slice() {
        ["api", "v1", "nodes"] => (verb_for(true).into(), "nodes".into()),
        ["api", "v1", "nodes", _] => (verb_for(false).into(), "nodes".into()),
        ["api", "v1", "nodes", _, sub] => (verb_for(false).into(), format!("nodes/{sub}")),
        ["api", "v1", "namespaces", _, "events"] => (verb_for(true).into(), "events".into()),
        ["api", "v1", "namespaces", _, "events", _] => (verb_for(false).into(), "events".into()),
        _ => ("unknown".into(), path.into()),
    }
}

fn field_match(ev: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let got = match k {
            "involvedObject.kind" => &ev["involvedObject"]["kind"],
            "involvedObject.name" => &ev["involvedObject"]["name"],
            "reason" => &ev["reason"],
            "type" => &ev["type"],
            "source" => &ev["source"]["component"],
            "metadata.name" => &ev["metadata"]["name"],
            _ => return false,
        };
        got.as_str() == Some(v)
    })
}

/// An answer queued with [`ApiDouble::inject`].
fn injected(code: u16) -> Response {
    match code {
        // The max-in-flight and priority-and-fairness filters (apiserver
        // `pkg/server/filters/maxinflight.go` `tooManyRequests`,
        // `priority-and-fairness.go`) answer before any handler: a plain-text
        // body and `Retry-After: 1`, not a Status.
        429 => Response::builder()
            .status(429)
            .header("content-type", "text/plain; charset=utf-8")
            .header("retry-after", "1")
            .body(Body::from("Too many requests, please try again later.\n"))
            .expect("static response parts"),
        // `errors.NewInternalError`: reason InternalError, the cause in details.
        500 => status_with(
            500,
            "InternalError",
            "Internal error occurred: etcdserver: request timed out",
            json!({"causes": [{"message": "etcdserver: request timed out"}]}),
        ),
        // `errors.NewServiceUnavailable`.
        503 => status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ),
        other => status(other, "Unknown", format!("injected {other}")),
    }
}

/// RBAC denial (apiserver `pkg/endpoints/handlers/responsewriters/errors.go`,
/// `Forbidden` → `forbiddenMessage`): `<resource> "<name>" is forbidden: User
/// "<user>" cannot <verb> resource "<resource/sub>" in API group "" at the
/// cluster scope` (or `in the namespace "<ns>"`), details name + kind (the
/// resource without subresource).
fn forbidden(verb: &str, resource: &str, path: &str) -> Response {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (name, scope) = match parts.as_slice() {
        ["api", "v1", "namespaces", ns, _, name, ..] => {
            (*name, format!("in the namespace \"{ns}\""))
        }
        ["api", "v1", "namespaces", ns, ..] => ("", format!("in the namespace \"{ns}\"")),
        ["api", "v1", _, name, ..] => (*name, "at the cluster scope".to_owned()),
        _ => ("", "at the cluster scope".to_owned()),
    };
    let base = resource.split('/').next().unwrap_or(resource);
    let subject = if name.is_empty() {
        format!("{base} is forbidden")
    } else {
        format!("{base} \"{name}\" is forbidden")
    };
    status_with(
        403,
        "Forbidden",
        format!(
            "{subject}: User \"system:serviceaccount:gpuwatch:gpuwatch\" cannot {verb} resource \"{resource}\" in API group \"\" {scope}"
        ),
        json!({"name": name, "kind": base}),
    )
}

async fn handle(
    State(inner): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or("").to_owned();
    let q = query_map(&query);
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body_json: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()))
    };
    let (verb, resource) = classify(&method, &path, &q);
    let delay = inner.lock().expect("double lock").delay;
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let mut g = inner.lock().expect("double lock");
    let record = |g: &mut Inner, code: u16| {
        g.requests.push(Recorded {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            content_type: content_type.clone(),
            body: body_json.clone(),
            verb: verb.clone(),
            resource: resource.clone(),
            status: code,
            at: Instant::now(),
        });
    };
    if g.down {
        record(&mut g, 503);
        // What a client sees from an API server behind a load balancer while
        // it is unavailable (`errors.NewServiceUnavailable`).
        return status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
    }
    if let Some(code) = g.injected.pop_front() {
        record(&mut g, code);
        return injected(code);
    }
    if g.forbidden.contains(&(verb.clone(), resource.clone())) {
        record(&mut g, 403);
        return forbidden(&verb, &resource, &path);
    }
    let node_name = g.node["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let resp = match (method.as_str(), parts.as_slice()) {
        ("GET" | "PATCH" | "PUT", ["api", "v1", "nodes", n, ..])
            if g.node_missing || *n != node_name =>
        {
            not_found("nodes", n)
        }
        ("GET", ["api", "v1", "nodes", _]) => ok(200, &g.node),
        ("GET", ["api", "v1", "nodes"]) if verb == "watch" => {
            let sel = q.get("fieldSelector").cloned().unwrap_or_default();
            let matches = sel.is_empty() || sel == format!("metadata.name={node_name}");
            let from: u64 = q
                .get("resourceVersion")
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            let (tx, rx) = mpsc::unbounded_channel::<Value>();
            if from != 0 && from < g.compacted_rv {
                // The watch cache no longer holds `from` (apiserver
                // `pkg/storage/cacher/watch_cache.go`: `NewResourceExpired("too
                // old resource version: ...")`), and `Cacher.Watch` returns it
                // through `newErrWatcher`: a 200 whose only event is an ERROR
                // carrying the 410 Expired Status.
                let _ = tx.send(json!({"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {from} ({})", g.compacted_rv),
                    "reason": "Expired", "code": 410,
                }}));
                drop(tx);
            } else {
                let node_rv: u64 = g.node["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(0);
                if matches && !g.node_missing && from < node_rv {
                    // `0` (any version) starts with the current state as ADDED;
                    // an older version replays what changed since. The double
                    // keeps no history: its replay is the latest state.
                    let kind = if from == 0 { "ADDED" } else { "MODIFIED" };
                    let _ = tx.send(json!({"type": kind, "object": g.node.clone()}));
                }
                if matches {
                    // Bookmarks only for a client that asked (`allowWatchBookmarks`).
                    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
                    g.watchers.push(Watcher { tx, bookmarks });
                }
            }
            // The server ends the watch at `timeoutSeconds` by closing the body
            // (apiserver `pkg/endpoints/handlers/watch.go`, `serveWatch`).
            let timeout = q
                .get("timeoutSeconds")
                .and_then(|t| t.parse().ok())
                .map_or(Duration::from_secs(1800), Duration::from_secs);
            let deadline = tokio::time::Instant::now() + timeout;
            let stream = futures::stream::unfold(rx, move |mut rx| async move {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(v)) => Some((
                        Ok::<_, std::convert::Infallible>(Bytes::from(format!("{v}\n"))),
                        rx,
                    )),
                    _ => None,
                }
            });
            record(&mut g, 200);
            return Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Body::from_stream(stream))
                .expect("static response parts");
        }
        ("PATCH", ["api", "v1", "nodes", _, "status"]) => {
            if content_type != "application/apply-patch+yaml" {
                status(
                    415,
                    "UnsupportedMediaType",
                    format!("double only supports apply on status, got {content_type}"),
                )
            } else {
                g.apply_status(&q, &body_json)
            }
        }
        ("PATCH", ["api", "v1", "nodes", _]) => g.node_patch(&content_type, &body_json),
        ("PUT", ["api", "v1", "nodes", _]) => g.node_update(&body_json),
        ("POST", ["api", "v1", "namespaces", ns, "events"]) => {
            let mut ev = body_json.clone();
            let name = ev["metadata"]["name"].as_str().unwrap_or("").to_owned();
            if name.is_empty() {
                status(422, "Invalid", "metadata.name required")
            } else if g.events.contains_key(&name) {
                // `errors.NewAlreadyExists`.
                status_with(
                    409,
                    "AlreadyExists",
                    format!("events \"{name}\" already exists"),
                    json!({"name": name, "kind": "events"}),
                )
            } else if ev["involvedObject"]["name"].as_str().is_none() {
                status(422, "Invalid", "involvedObject.name required")
            } else {
                g.rv += 1;
                ev["metadata"]["namespace"] = json!(ns);
                ev["metadata"]["resourceVersion"] = json!(g.rv.to_string());
                ev["metadata"]["uid"] = json!(format!("uid-{}", g.rv));
                ev["apiVersion"] = json!("v1");
                ev["kind"] = json!("Event");
                g.events.insert(name, ev.clone());
                ok(201, &ev)
            }
        }
        ("PATCH", ["api", "v1", "namespaces", _, "events", name]) => {
            let rv = g.rv + 1;
            match g.events.get_mut(*name) {
                None => not_found("events", name),
                Some(ev) => {
                    json_patch::merge(ev, &body_json);
                    ev["metadata"]["resourceVersion"] = json!(rv.to_string());
                    let out = ev.clone();
                    g.rv = rv;
                    ok(200, &out)
                }
            }
        }
        ("GET", ["api", "v1", "namespaces", _, "events"]) => {
            let sel = q.get("fieldSelector").cloned().unwrap_or_default();
            let items: Vec<Value> = g
                .events
                .values()
                .filter(|e| field_match(e, &sel))
                .cloned()
                .collect();
            ok(
                200,
                &json!({"apiVersion": "v1", "kind": "EventList", "metadata": {"resourceVersion": g.rv.to_string()}, "items": items}),
            )
        }
        _ => status(
            404,
            "NotFound",
            format!("the double does not serve {method} {path}"),
        ),
    };
    let code = resp.status().as_u16();
    record(&mut g, code);
    resp
}

impl ApiDouble {
    /// Starts the double serving `node` (resourceVersion set to 1).
    pub async fn start(node: Node) -> ApiDouble {
        let mut v = serde_json::to_value(&node).expect("node serialises");
        v["apiVersion"] = json!("v1");
        v["kind"] = json!("Node");
        if v["metadata"]["uid"].is_null() {
            v["metadata"]["uid"] = json!("node-uid-1");
        }
        v["metadata"]["resourceVersion"] = json!("1");
        let inner: Shared = Arc::new(Mutex::new(Inner {
            node: v,
            rv: 1,
            ..Default::default()
        }));
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        ApiDouble {
            url: format!("http://{addr}"),
            inner,
            stop: Some(tx),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("double lock")
    }

    /// Writer settings pointing at this double, with test-sized pacing.
    pub fn kube_config(&self) -> KubeConfig {
        KubeConfig {
            enabled: true,
            api_server_url: Some(self.url.clone()),
            backoff_initial_ms: 50,
            backoff_max_ms: 400,
            validation_interval_secs: 1,
            request_timeout_secs: 2,
            watch_timeout_secs: 30,
            // Tests wait for Normal Events; the fleet spread is tested on its own.
            normal_event_spread_secs: 0,
            ..KubeConfig::default()
        }
    }

    pub fn node(&self) -> Node {
        serde_json::from_value(self.lock().node.clone()).expect("stored node parses")
    }

    pub fn node_json(&self) -> Value {
        self.lock().node.clone()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    pub fn events(&self) -> Vec<Event> {
        self.lock()
            .events
            .values()
            .map(|e| serde_json::from_value(e.clone()).expect("stored event parses"))
            .collect()
    }

    pub fn set_down(&self, down: bool) {
        let mut g = self.lock();
        g.down = down;
        if down {
            g.watchers.clear(); // open watches end, as when the server goes away
        }
    }

    pub fn set_delay(&self, d: Option<Duration>) {
        self.lock().delay = d;
    }

    pub fn forbid(&self, verb: &str, resource: &str) {
        self.lock().forbidden.insert((verb.into(), resource.into()));
    }

    pub fn unforbid(&self, verb: &str, resource: &str) {
        self.lock()
            .forbidden
            .remove(&(verb.to_owned(), resource.to_owned()));
    }

    /// Another writer changes the Node right before each of the next `n` node
    /// writes (after the client read it): each of those writes loses a race.
    pub fn concurrent_taint_edits(&self, n: u32) {
        self.lock().concurrent_taint_edits = n;
    }

    /// The next requests get these answers (429, 500, 503), one each, in order.
    pub fn inject(&self, codes: &[u16]) {
        self.lock().injected.extend(codes.iter().copied());
    }

    /// Whether the Node exists (404 on every node request while it does not).
    pub fn set_node_missing(&self, missing: bool) {
        self.lock().node_missing = missing;
    }

    /// Compacts history: every version before the current one is gone; open
    /// watches get an ERROR 410 Expired and end (what the watch cache does to a
    /// watcher that fell behind its window).
    pub fn compact(&self) {
        let mut g = self.lock();
        g.compacted_rv = g.rv;
        let ev = json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {} ({})", g.rv.saturating_sub(1), g.rv),
            "reason": "Expired", "code": 410,
        }});
        for w in g.watchers.drain(..) {
            let _ = w.tx.send(ev.clone());
        }
    }

    /// Advances the version without changing the Node (other objects changed)
    /// and sends a BOOKMARK to the watchers that asked for them: the object
    /// carries only `resourceVersion` (apiserver `pkg/storage/cacher`,
    /// bookmark events).
    pub fn bookmark(&self) -> u64 {
        let mut g = self.lock();
        g.rv += 1;
        let rv = g.rv;
        let ev = json!({"type": "BOOKMARK", "object": {
            "kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()},
        }});
        g.watchers
            .retain(|w| !w.bookmarks || w.tx.send(ev.clone()).is_ok());
        rv
    }

    /// Open watch streams.
    pub fn watchers(&self) -> usize {
        let mut g = self.lock();
        g.watchers.retain(|w| !w.tx.is_closed());
        g.watchers.len()
    }

    /// Another client edits the node (update by someone else): rv bumps, watchers notified.
    pub fn edit_node(&self, f: impl FnOnce(&mut Value)) {
        let mut g = self.lock();
        f(&mut g.node);
        g.bump();
    }

    /// Another field manager applies a condition of this type (and so owns it).
    pub fn own_condition(&self, type_: &str, manager: &str, status: &str) {
        let mut g = self.lock();
        let c = json!({"type": type_, "status": status, "reason": "SetByOther", "message": "set by another manager"});
        let conds = g.conditions();
        conds.retain(|x| x["type"] != type_);
        conds.push(c);
        g.managed.insert(type_.to_owned(), manager.to_owned());
        g.bump();
    }

    /// Removes a condition as another writer would (ownership of that type dropped).
    pub fn remove_condition(&self, type_: &str) {
        let mut g = self.lock();
        g.managed.remove(type_);
        g.conditions().retain(|c| c["type"] != type_);
        g.bump();
    }

    /// Every recorded request maps onto a request the writer declares.
    pub fn assert_requests_declared(&self) {
        for r in self.requests() {
            let declared = WRITER_REQUESTS.iter().any(|d: &ApiRequest| {
                d.verb == r.verb && d.resource == r.resource && d.group.is_empty()
            });
            assert!(
                declared,
                "undeclared request {} {} ({} {})",
                r.method, r.path, r.verb, r.resource
            );
        }
    }

    pub fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for ApiDouble {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub async fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn condition(node: &Node, type_: &str) -> Option<k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

pub fn taint_value(node: &Node, key: &str) -> Option<String> {
    node.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == key)
        .map(|t| t.value.clone().unwrap_or_default())
}

pub fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}
