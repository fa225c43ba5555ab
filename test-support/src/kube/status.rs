//! The responses every resource kind shares: objects, `metav1.Status` failures
//! as the API server writes them, and the answers of the filters in front of
//! the handlers (overload, outage, RBAC).

use super::request::Request;
use axum::body::Body;
use axum::response::Response;
use serde_json::{Value, json};

/// A `metav1.Status` failure as the API server writes it (apimachinery
/// `pkg/api/errors/errors.go` builds each; apiserver
/// `pkg/endpoints/handlers/responsewriters/status.go` sets the HTTP code from
/// `code`). An empty `details` is omitted, as Go's `omitempty` does.
pub(super) fn status_with(
    code: u16,
    reason: &str,
    message: impl Into<String>,
    details: Value,
) -> Response {
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

pub(super) fn status(code: u16, reason: &str, message: impl Into<String>) -> Response {
    status_with(code, reason, message, json!({}))
}

/// `errors.NewNotFound`: `<resource> "<name>" not found`, details name + kind
/// (the resource).
pub(super) fn not_found(resource: &str, name: &str) -> Response {
    status_with(
        404,
        "NotFound",
        format!("{resource} \"{name}\" not found"),
        json!({"name": name, "kind": resource}),
    )
}

/// A path or method the double has no handler for.
pub(super) fn not_served(req: &Request) -> Response {
    status(
        404,
        "NotFound",
        format!("the double does not serve {} {}", req.method, req.path),
    )
}

/// `errors.NewConflict(resource, name, OptimisticLockErrorMsg)`: what the
/// registry store (apiserver `pkg/registry/generic/registry/store.go`, `Update`)
/// answers when the object's resourceVersion differs from the stored one.
pub(super) fn optimistic_lock_conflict(resource: &str, name: &str) -> Response {
    status_with(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
        ),
        json!({"name": name, "kind": resource}),
    )
}

/// `errors.NewAlreadyExists`.
pub(super) fn already_exists(resource: &str, name: &str) -> Response {
    status_with(
        409,
        "AlreadyExists",
        format!("{resource} \"{name}\" already exists"),
        json!({"name": name, "kind": resource}),
    )
}

/// A list's `continue` token whose version etcd compacted: the etcd3 store
/// (apiserver `pkg/storage/etcd3/store.go`, `GetList` →
/// `handleCompactedErrorForPaging`) answers `errors.NewResourceExpired` with
/// its `inconsistentContinue` message, and a new token (in the Status's
/// `metadata.continue`) for the rest of an inconsistent list, which a client
/// that wants a consistent one ignores: it lists again from the start.
pub(super) fn continue_expired(rv: u64) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1",
        "metadata": {"continue": format!("inconsistent-from-{rv}")},
        "status": "Failure",
        "message": "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
        "reason": "Expired", "code": 410,
    });
    Response::builder()
        .status(410)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("static response parts")
}

/// `errors.NewServiceUnavailable`.
pub(super) fn service_unavailable() -> Response {
    status(
        503,
        "ServiceUnavailable",
        "the server is currently unable to handle the request",
    )
}

pub(super) fn ok(code: u16, v: &Value) -> Response {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(v.to_string()))
        .expect("static response parts")
}

/// An answer queued with [`ApiDouble::inject`](super::ApiDouble::inject).
pub(super) fn injected(code: u16) -> Response {
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
        503 => service_unavailable(),
        other => status(other, "Unknown", format!("injected {other}")),
    }
}

/// RBAC denial (apiserver `pkg/endpoints/handlers/responsewriters/errors.go`,
/// `Forbidden` → `forbiddenMessage`): `<resource> "<name>" is forbidden: User
/// "<user>" cannot <verb> resource "<resource/sub>" in API group "" at the
/// cluster scope` (or `in the namespace "<ns>"`), details name + kind (the
/// resource without subresource).
pub(super) fn forbidden(verb: &str, group: &str, resource: &str, path: &str) -> Response {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // Core paths are /api/v1/..., named groups /apis/<group>/<version>/...
    let rest: &[&str] = match parts.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => &[],
    };
    let (name, scope) = match rest {
        ["namespaces", ns, _, name, ..] => (*name, format!("in the namespace \"{ns}\"")),
        ["namespaces", ns, ..] => ("", format!("in the namespace \"{ns}\"")),
        [_, name, ..] => (*name, "at the cluster scope".to_owned()),
        _ => ("", "at the cluster scope".to_owned()),
    };
    let base = resource.split('/').next().unwrap_or(resource);
    let qualified = if group.is_empty() {
        base.to_owned()
    } else {
        format!("{base}.{group}")
    };
    let subject = if name.is_empty() {
        format!("{qualified} is forbidden")
    } else {
        format!("{qualified} \"{name}\" is forbidden")
    };
    status_with(
        403,
        "Forbidden",
        format!(
            "{subject}: User \"system:serviceaccount:gpuwatch:gpuwatch\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}"
        ),
        // Go's `omitempty` drops an empty group.
        if group.is_empty() {
            json!({"name": name, "kind": base})
        } else {
            json!({"name": name, "group": group, "kind": base})
        },
    )
}
