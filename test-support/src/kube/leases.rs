//! `coordination.k8s.io/v1` Leases, served as kube-apiserver's generic registry
//! store serves them (apiserver `pkg/registry/generic/registry/store.go`; the
//! Lease strategy is kubernetes `pkg/registry/coordination/lease/strategy.go`):
//!
//! - create: 201 with `uid`, `resourceVersion`, `creationTimestamp` set; an
//!   existing name is 409 `AlreadyExists` (`Store.Create`,
//!   `storeerr.InterpretCreateError` → `errors.NewAlreadyExists`).
//! - update (PUT): Leases do not allow unconditional updates
//!   (`AllowUnconditionalUpdate` is false), so a body without
//!   `metadata.resourceVersion` is 422 Invalid (`Store.Update`: `field.Invalid`
//!   on `metadata.resourceVersion`, "must be specified for an update"); a stale
//!   one is 409 `Conflict` (`OptimisticLockErrorMsg`); a missing Lease is 404
//!   (Leases do not allow create on update).
//! - delete with `preconditions`: a UID or resourceVersion that differs is 409
//!   `Conflict` (`rest.BeforeDelete`); success answers a `Status` Success whose
//!   details name the Lease (`Store.finalizeDelete`: Leases do not return the
//!   deleted object).
//! - get, list with `labelSelector`, metadata-only when asked.

use super::request::{Request, Target};
use super::selector;
use super::status::{
    already_exists, not_found, not_served, ok, optimistic_lock_conflict, status_with,
};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The stored Leases by (namespace, name).
#[derive(Default)]
pub(super) struct Leases {
    pub(super) items: BTreeMap<(String, String), Value>,
    uids: u64,
}

const RESOURCE: &str = "leases.coordination.k8s.io";

/// Answers a request for `leases`.
pub(super) fn serve(leases: &mut Leases, rv: &mut u64, req: &Request) -> Response {
    let Target::Leases { namespace, name } = &req.target else {
        return not_served(req);
    };
    match (req.method.as_str(), name) {
        ("POST", None) => leases.create(rv, namespace, &req.body),
        ("GET", None) => {
            let sel = req.q.get("labelSelector").cloned().unwrap_or_default();
            let items: Vec<Value> = leases
                .items
                .iter()
                .filter(|((ns, _), l)| ns == namespace && selector::matches(l, &sel))
                .map(|(_, l)| l.clone())
                .collect();
            ok(
                200,
                &selector::list_body(
                    "Lease",
                    "coordination.k8s.io/v1",
                    items,
                    *rv,
                    &req.accept,
                    None,
                ),
            )
        }
        ("GET", Some(name)) => match leases.items.get(&(namespace.clone(), name.clone())) {
            Some(l) => ok(200, &selector::object_body(l, &req.accept)),
            None => not_found(RESOURCE, name),
        },
        ("PUT", Some(name)) => leases.update(rv, namespace, name, &req.body),
        ("DELETE", Some(name)) => leases.delete(rv, namespace, name, &req.body),
        _ => not_served(req),
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

impl Leases {
    fn create(&mut self, rv: &mut u64, namespace: &str, body: &Value) -> Response {
        let name = body["metadata"]["name"].as_str().unwrap_or("").to_owned();
        if name.is_empty() {
            return status_with(
                422,
                "Invalid",
                "Lease.coordination.k8s.io \"\" is invalid: metadata.name: Required value: name or generateName is required",
                json!({"group": "coordination.k8s.io", "kind": "Lease", "causes": [{"reason": "FieldValueRequired", "message": "Required value: name or generateName is required", "field": "metadata.name"}]}),
            );
        }
        let key = (namespace.to_owned(), name.clone());
        if self.items.contains_key(&key) {
            return already_exists(RESOURCE, &name);
        }
        *rv += 1;
        self.uids += 1;
        let mut l = body.clone();
        l["apiVersion"] = json!("coordination.k8s.io/v1");
        l["kind"] = json!("Lease");
        l["metadata"]["namespace"] = json!(namespace);
        l["metadata"]["uid"] = json!(format!("lease-uid-{}", self.uids));
        l["metadata"]["resourceVersion"] = json!(rv.to_string());
        l["metadata"]["creationTimestamp"] = json!(now());
        self.items.insert(key, l.clone());
        ok(201, &l)
    }

    fn update(&mut self, rv: &mut u64, namespace: &str, name: &str, body: &Value) -> Response {
        let key = (namespace.to_owned(), name.to_owned());
        let Some(stored) = self.items.get(&key) else {
            return not_found(RESOURCE, name);
        };
        let sent = body["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if sent.is_empty() {
            return status_with(
                422,
                "Invalid",
                format!(
                    "Lease.coordination.k8s.io \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
                ),
                json!({"name": name, "group": "coordination.k8s.io", "kind": "Lease", "causes": [{"reason": "FieldValueInvalid", "message": "Invalid value: 0x0: must be specified for an update", "field": "metadata.resourceVersion"}]}),
            );
        }
        if Some(sent) != stored["metadata"]["resourceVersion"].as_str() {
            return optimistic_lock_conflict(RESOURCE, name);
        }
        let mut l = body.clone();
        // Server-owned fields are kept.
        for f in ["uid", "creationTimestamp", "namespace"] {
            l["metadata"][f] = stored["metadata"][f].clone();
        }
        *rv += 1;
        l["apiVersion"] = json!("coordination.k8s.io/v1");
        l["kind"] = json!("Lease");
        l["metadata"]["name"] = json!(name);
        l["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.items.insert(key, l.clone());
        ok(200, &l)
    }

    fn delete(&mut self, rv: &mut u64, namespace: &str, name: &str, body: &Value) -> Response {
        let key = (namespace.to_owned(), name.to_owned());
        let Some(stored) = self.items.get(&key) else {
            return not_found(RESOURCE, name);
        };
        let pre = &body["preconditions"];
        let uid = stored["metadata"]["uid"].as_str().unwrap_or("");
        let srv = stored["metadata"]["resourceVersion"].as_str().unwrap_or("");
        let conflict = |what: String| {
            status_with(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on Lease.coordination.k8s.io \"{name}\": {what}"
                ),
                json!({"name": name, "group": "coordination.k8s.io", "kind": "Lease"}),
            )
        };
        if let Some(want) = pre["uid"].as_str()
            && want != uid
        {
            return conflict(format!(
                "the UID in the precondition ({want}) does not match the UID in record ({uid}). The object might have been deleted and then recreated"
            ));
        }
        if let Some(want) = pre["resourceVersion"].as_str()
            && want != srv
        {
            return conflict(format!(
                "the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in record ({srv}). The object might have been modified"
            ));
        }
        let uid = uid.to_owned();
        self.items.remove(&key);
        *rv += 1;
        ok(
            200,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": "coordination.k8s.io", "kind": "leases", "uid": uid}}),
        )
    }
}
