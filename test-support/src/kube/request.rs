//! A request as the double sees it: which resource its path names, its RBAC
//! verb and resource, the decoded query and body. A new resource kind adds its
//! path shape to [`Target`].

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Instant;

/// One request the double received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
    pub verb: String,
    /// The RBAC API group (`""` for core).
    pub group: String,
    pub resource: String,
    pub status: u16,
    pub at: Instant,
}

impl Recorded {
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

/// The resource a path names (core/v1 paths: `/api/v1/<resource>/<name>/<sub>`,
/// namespaced ones under `/api/v1/namespaces/<ns>/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// `/api/v1/nodes` and below: the segments after `nodes`.
    Nodes(Vec<String>),
    /// `/api/v1/namespaces/<ns>/events[/<name>]`.
    Events {
        namespace: String,
        name: Option<String>,
    },
    /// `/apis/coordination.k8s.io/v1/namespaces/<ns>/leases[/<name>]`.
    Leases {
        namespace: String,
        name: Option<String>,
    },
    /// `/api/v1/pods` (every namespace) or `/api/v1/namespaces/<ns>/pods`.
    Pods {
        namespace: Option<String>,
        name: Option<String>,
    },
    /// `/apis/authorization.k8s.io/v1/selfsubjectaccessreviews`.
    AccessReview,
    /// `/apis`: the API groups (discovery).
    ApiGroups,
    /// `/apis/resource.k8s.io[/<version>[/<resource>[/<name>]]]`: the
    /// group's discovery, its version's, or a resource (`dra` serves them).
    Dra {
        version: Option<String>,
        resource: Option<String>,
        name: Option<String>,
    },
    /// Anything else.
    Unknown,
}

impl Target {
    fn parse(path: &str) -> Target {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        match parts.as_slice() {
            ["api", "v1", "nodes", rest @ ..] => {
                Target::Nodes(rest.iter().map(|s| (*s).to_owned()).collect())
            }
            ["api", "v1", "pods"] => Target::Pods {
                namespace: None,
                name: None,
            },
            ["api", "v1", "namespaces", ns, "pods"] => Target::Pods {
                namespace: Some((*ns).to_owned()),
                name: None,
            },
            ["api", "v1", "namespaces", ns, "pods", name] => Target::Pods {
                namespace: Some((*ns).to_owned()),
                name: Some((*name).to_owned()),
            },
            ["api", "v1", "namespaces", ns, "events"] => Target::Events {
                namespace: (*ns).to_owned(),
                name: None,
            },
            ["api", "v1", "namespaces", ns, "events", name] => Target::Events {
                namespace: (*ns).to_owned(),
                name: Some((*name).to_owned()),
            },
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                ns,
                "leases",
            ] => Target::Leases {
                namespace: (*ns).to_owned(),
                name: None,
            },
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                ns,
                "leases",
                name,
            ] => Target::Leases {
                namespace: (*ns).to_owned(),
                name: Some((*name).to_owned()),
            },
            [
                "apis",
                "authorization.k8s.io",
                "v1",
                "selfsubjectaccessreviews",
            ] => Target::AccessReview,
            ["apis"] => Target::ApiGroups,
            ["apis", "resource.k8s.io", rest @ ..] if rest.len() <= 3 => {
                let at = |i: usize| rest.get(i).map(|s| (*s).to_owned());
                Target::Dra {
                    version: at(0),
                    resource: at(1),
                    name: at(2),
                }
            }
            _ => Target::Unknown,
        }
    }

    /// The RBAC resource (`nodes`, `nodes/status`, `events`) and whether the
    /// path is the collection; `None` for a path RBAC here does not name.
    fn rbac(&self) -> Option<(String, bool)> {
        match self {
            Target::Nodes(rest) => match rest.as_slice() {
                [] => Some(("nodes".into(), true)),
                [_] => Some(("nodes".into(), false)),
                [_, sub] => Some((format!("nodes/{sub}"), false)),
                _ => None,
            },
            Target::Events { name, .. } => Some(("events".into(), name.is_none())),
            Target::Leases { name, .. } => Some(("leases".into(), name.is_none())),
            Target::Pods { name, .. } => Some(("pods".into(), name.is_none())),
            Target::AccessReview => Some(("selfsubjectaccessreviews".into(), true)),
            Target::Dra {
                resource: Some(resource),
                name,
                ..
            } => Some((resource.clone(), name.is_none())),
            // Discovery paths are non-resource URLs (every user may read them).
            Target::Dra { resource: None, .. } | Target::ApiGroups | Target::Unknown => None,
        }
    }

    /// The name of the object the path names (`None`: a collection).
    pub(super) fn name(&self) -> Option<&str> {
        match self {
            Target::Nodes(rest) => rest.first().map(String::as_str),
            Target::Events { name, .. }
            | Target::Leases { name, .. }
            | Target::Pods { name, .. }
            | Target::Dra { name, .. } => name.as_deref(),
            Target::AccessReview | Target::ApiGroups | Target::Unknown => None,
        }
    }

    /// The namespace the path names (`None`: a cluster-scoped path, or
    /// every namespace).
    pub(super) fn namespace(&self) -> Option<&str> {
        match self {
            Target::Events { namespace, .. } | Target::Leases { namespace, .. } => Some(namespace),
            Target::Pods { namespace, .. } => namespace.as_deref(),
            Target::Nodes(_)
            | Target::AccessReview
            | Target::ApiGroups
            | Target::Dra { .. }
            | Target::Unknown => None,
        }
    }

    /// The RBAC API group of the resource.
    pub(super) fn group(&self) -> &'static str {
        match self {
            Target::Leases { .. } => "coordination.k8s.io",
            Target::AccessReview => "authorization.k8s.io",
            Target::Dra { .. } => "resource.k8s.io",
            _ => "",
        }
    }
}

/// A request, parsed once.
#[derive(Debug)]
pub(super) struct Request {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) query: String,
    pub(super) q: BTreeMap<String, String>,
    pub(super) content_type: String,
    /// The `Accept` header (metadata-only lists and gets ask in it).
    pub(super) accept: String,
    pub(super) body: Value,
    pub(super) target: Target,
    /// The RBAC verb (`get`, `list`, `watch`, `create`, `patch`, `update`,
    /// `delete`; `unknown` for a path RBAC here does not name).
    pub(super) verb: String,
    /// The RBAC resource (`nodes/status`); the path when unknown.
    pub(super) resource: String,
}

impl Request {
    pub(super) fn new(method: Method, uri: &Uri, headers: &HeaderMap, body: &Bytes) -> Request {
        let path = uri.path().to_owned();
        let query = uri.query().unwrap_or("").to_owned();
        let q = query_map(&query);
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let content_type = header("content-type");
        let accept = header("accept");
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into()))
        };
        let target = Target::parse(&path);
        let (verb, resource) = match target.rbac() {
            Some((resource, collection)) => (verb(&method, collection, &q).into(), resource),
            None => ("unknown".into(), path.clone()),
        };
        Request {
            method,
            path,
            query,
            q,
            content_type,
            accept,
            body,
            target,
            verb,
            resource,
        }
    }

    /// What the double keeps of the request, with the answer's status code.
    pub(super) fn recorded(&self, status: u16) -> Recorded {
        Recorded {
            method: self.method.to_string(),
            path: self.path.clone(),
            query: self.query.clone(),
            content_type: self.content_type.clone(),
            body: self.body.clone(),
            verb: self.verb.clone(),
            group: self.target.group().to_owned(),
            resource: self.resource.clone(),
            status,
            at: Instant::now(),
        }
    }
}

/// The RBAC verb of a request (apiserver `pkg/endpoints/request/requestinfo.go`:
/// a GET of a collection is `list`, or `watch` with `watch=true`).
fn verb(method: &Method, collection: bool, q: &BTreeMap<String, String>) -> &'static str {
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
