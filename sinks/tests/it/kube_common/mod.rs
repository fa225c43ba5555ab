//! An in-process Kubernetes API-server double (axum on 127.0.0.1:0), faithful on
//! what the node writer uses:
//!
//! - `GET /api/v1/nodes/{name}`;
//! - `GET /api/v1/nodes?watch=true&fieldSelector=metadata.name=...&resourceVersion=...`
//!   streaming JSON lines (`resourceVersion=0` or an older one → synthetic ADDED first;
//!   `timeoutSeconds` ends the stream);
//! - `PATCH /api/v1/nodes/{name}/status` with `application/apply-patch+yaml`,
//!   `fieldManager`, `force`: conditions merge by `type`, each type owned by one
//!   manager (managedFields written), a type owned by another manager is a 409 unless
//!   forced, types the manager stops applying are removed;
//! - `PATCH /api/v1/nodes/{name}` with `application/json-patch+json`: RFC 6902 applied
//!   to the stored object; a failed `test` answers 409 (configurable to 422, what a
//!   real kube-apiserver answers for a failed test op);
//! - core/v1 Events: create (409 AlreadyExists), merge-patch, list with field selectors;
//! - resourceVersion bumps on every write; 403 per (verb, resource) on demand; 503 or
//!   a delay on demand; every request recorded with its RBAC verb and resource.
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
    test_failure_status: u16,
    concurrent_taint_edits: u32,
    watchers: Vec<mpsc::UnboundedSender<Value>>,
}

pub type Shared = Arc<Mutex<Inner>>;

pub struct ApiDouble {
    pub url: String,
    inner: Shared,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

fn status(code: u16, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message.into(), "reason": reason, "code": code,
    });
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("static response parts")
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
        self.watchers.retain(|w| w.send(ev.clone()).is_ok());
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
                    return status(
                        409,
                        "Conflict",
                        format!(
                            "Apply failed with 1 conflict: conflict with \"{owner}\": .status.conditions[type=\"{t}\"]"
                        ),
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

    fn json_patch(&mut self, body: &Value) -> Response {
        let patch: json_patch::Patch = match serde_json::from_value(body.clone()) {
            Ok(p) => p,
            Err(e) => return status(400, "BadRequest", format!("invalid JSON patch: {e}")),
        };
        if self.concurrent_taint_edits > 0 {
            // Another writer changes the taints between the client's read and this write.
            self.concurrent_taint_edits -= 1;
            let n = self.concurrent_taint_edits;
            if !self.node["spec"]["taints"].is_array() {
                self.node["spec"]["taints"] = json!([]);
            }
            self.node["spec"]["taints"]
                .as_array_mut()
                .expect("array")
                .push(
                    json!({"key": format!("other.example.com/edit-{n}"), "effect": "NoSchedule"}),
                );
            self.bump();
        }
        let mut candidate = self.node.clone();
        if let Err(e) = json_patch::patch(&mut candidate, &patch) {
            let is_test = matches!(e.kind, json_patch::PatchErrorKind::TestFailed);
            if is_test {
                let code = self.test_failure_status;
                let reason = if code == 409 { "Conflict" } else { "Invalid" };
                return status(
                    code,
                    reason,
                    format!(
                        "the server rejected our request: jsonpatch test operation does not apply: {e}"
                    ),
                );
            }
            return status(422, "Invalid", format!("jsonpatch error: {e}"));
        }
        if candidate["metadata"]["name"] != self.node["metadata"]["name"] {
            return status(422, "Invalid", "metadata.name is immutable");
        }
        self.node = candidate;
        self.bump();
        ok(200, &self.node)
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
        return status(
            503,
            "ServiceUnavailable",
            "the API server is down (test outage)",
        );
    }
    if g.forbidden.contains(&(verb.clone(), resource.clone())) {
        record(&mut g, 403);
        return status(
            403,
            "Forbidden",
            format!(
                "User \"system:serviceaccount:gpuwatch:gpuwatch\" cannot {verb} resource \"{resource}\""
            ),
        );
    }
    let node_name = g.node["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let resp = match (method.as_str(), parts.as_slice()) {
        ("GET", ["api", "v1", "nodes", n]) if *n == node_name => ok(200, &g.node),
        ("GET", ["api", "v1", "nodes"]) if verb == "watch" => {
            let sel = q.get("fieldSelector").cloned().unwrap_or_default();
            if !sel.is_empty() && sel != format!("metadata.name={node_name}") {
                record(&mut g, 200);
                return ok(200, &json!({"kind": "Status"}));
            }
            let from: u64 = q
                .get("resourceVersion")
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            let (tx, rx) = mpsc::unbounded_channel::<Value>();
            if from < g.rv {
                let _ = tx.send(json!({"type": "ADDED", "object": g.node.clone()}));
            }
            g.watchers.push(tx);
            let timeout = q
                .get("timeoutSeconds")
                .and_then(|t| t.parse().ok())
                .map_or(Duration::from_secs(300), Duration::from_secs);
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
        ("PATCH", ["api", "v1", "nodes", n, "status"]) if *n == node_name => {
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
        ("PATCH", ["api", "v1", "nodes", n]) if *n == node_name => {
            if content_type != "application/json-patch+json" {
                status(
                    415,
                    "UnsupportedMediaType",
                    format!("double only supports JSON patch on nodes, got {content_type}"),
                )
            } else {
                g.json_patch(&body_json)
            }
        }
        ("GET", ["api", "v1", "nodes", n]) | ("PATCH", ["api", "v1", "nodes", n, ..]) => {
            status(404, "NotFound", format!("nodes \"{n}\" not found"))
        }
        ("POST", ["api", "v1", "namespaces", ns, "events"]) => {
            let mut ev = body_json.clone();
            let name = ev["metadata"]["name"].as_str().unwrap_or("").to_owned();
            if name.is_empty() {
                status(422, "Invalid", "metadata.name required")
            } else if g.events.contains_key(&name) {
                status(
                    409,
                    "AlreadyExists",
                    format!("events \"{name}\" already exists"),
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
                None => status(404, "NotFound", format!("events \"{name}\" not found")),
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
            test_failure_status: 409,
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

    pub fn set_test_failure_status(&self, code: u16) {
        self.lock().test_failure_status = code;
    }

    pub fn concurrent_taint_edits(&self, n: u32) {
        self.lock().concurrent_taint_edits = n;
    }

    /// Another client edits the node (update by someone else): rv bumps, watchers notified.
    pub fn edit_node(&self, f: impl FnOnce(&mut Value)) {
        let mut g = self.lock();
        f(&mut g.node);
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
