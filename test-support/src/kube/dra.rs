//! `resource.k8s.io` (dynamic resource allocation) as kube-apiserver serves
//! it: API discovery, ResourceSlices and DeviceTaintRules (KEP-5055).
//!
//! Which versions serve what is the test's choice ([`Served`]): a cluster of
//! Kubernetes 1.37 serves DeviceTaintRules in `v1`, 1.36 in `v1beta2`,
//! 1.33–1.35 in `v1alpha3` (behind the `DRADeviceTaints` feature gate, off by
//! default: then in none), while ResourceSlices are served in `v1` (1.34 on)
//! and `v1beta2` (1.33 on). Every version reads and writes the same stored
//! objects (one etcd key per object, converted on the way out), so an object
//! carries the `apiVersion` of the path it was read from.
//!
//! - Discovery (apiserver `pkg/endpoints/discovery/`): `GET /apis` is an
//!   `APIGroupList` (`root.go`), `GET /apis/resource.k8s.io` an `APIGroup`
//!   (`group.go`) listing the served versions, preferred (the first of the
//!   scheme's version priority `v1`, `v1beta2`, `v1beta1`, `v1alpha3`,
//!   kubernetes `pkg/apis/resource/install/install.go`, `SetVersionPriority`)
//!   first, `GET /apis/resource.k8s.io/<v>` an
//!   `APIResourceList` (`version.go`) naming the resources of that version.
//!   A group or version not served is a 404 with the generic
//!   `the server could not find the requested resource` Status (apiserver
//!   `pkg/endpoints/handlers/responsewriters/errors.go` via the
//!   `NotFoundHandler` of `pkg/server/mux`), and so is a resource path in a
//!   version that does not serve the resource.
//! - ResourceSlices: list (cluster-scoped) with the field selectors
//!   `spec.nodeName` and `spec.driver` (kubernetes
//!   `pkg/registry/resource/resourceslice/strategy.go`,
//!   `toSelectableFields`); any other field label is 400 BadRequest
//!   (`field label not supported: <label>`, apiserver
//!   `pkg/registry/generic/registry/store.go` via
//!   `ListOptions`' field label conversion).
//! - DeviceTaintRules (kubernetes `pkg/registry/resource/devicetaintrule/`,
//!   the generic store `pkg/registry/generic/registry/store.go`):
//!   - create: 201 with `uid`, `resourceVersion`, `creationTimestamp`,
//!     `generation` 1 (`strategy.go`, `PrepareForCreate`); a taken name is
//!     409 `AlreadyExists`;
//!   - `spec.taint.timeAdded` is defaulted to now when a create or an update
//!     leaves it out (kubernetes `pkg/apis/resource/<version>/defaults.go`,
//!     `SetDefaults_DeviceTaint`, run when the body is decoded): a client
//!     that keeps the time sends it back;
//!   - validation (kubernetes `pkg/apis/resource/validation/validation.go`,
//!     `ValidateDeviceTaintRule`): the name a DNS-1123 subdomain, the taint
//!     key a qualified name (`[prefix/]name`, label-key syntax), the value a
//!     label value, the effect `None` (1.35 on), `NoSchedule` or
//!     `NoExecute`; failures are one 422 `Invalid` naming each field. The
//!     device selector is optional (`+optional` in
//!     `staging/src/k8s.io/api/resource/*/types.go`: a rule without one
//!     matches no device), so leaving it out is not an error;
//!   - get: 404 `NotFound` when absent;
//!   - update (PUT): a stale `metadata.resourceVersion` is 409 `Conflict`
//!     (`OptimisticLockErrorMsg`); none is an unconditional update (the
//!     strategy's `AllowUnconditionalUpdate` is true); the status is kept
//!     (it has its own subresource), a changed spec bumps `generation`
//!     (`PrepareForUpdate`); a missing object is 404
//!     (`AllowCreateOnUpdate` is false);
//!   - delete: 200 with the deleted object (the store returns it:
//!     `storage/storage_test.go` tests `ReturnDeletedObject`), 404 when
//!     absent;
//!   - list with `labelSelector`.

use super::request::{Request, Target};
use super::selector;
use super::status::{already_exists, not_found, ok, optimistic_lock_conflict, status, status_with};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The API group.
pub(super) const GROUP: &str = "resource.k8s.io";

/// kube-apiserver's priority order of the group's versions: the first served
/// one is the preferred version.
const PRIORITY: [&str; 4] = ["v1", "v1beta2", "v1beta1", "v1alpha3"];

/// The versions that serve each resource (empty: the group is not served).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    /// Versions serving `devicetaintrules`.
    pub taint_rules: Vec<String>,
    /// Versions serving `resourceslices`.
    pub slices: Vec<String>,
}

impl Served {
    /// A cluster serving DeviceTaintRules in `rules` (`[]`: in none, the
    /// feature off) and ResourceSlices in `v1`.
    pub fn rules_in(rules: &[&str]) -> Served {
        Served {
            taint_rules: rules.iter().map(|v| (*v).to_owned()).collect(),
            slices: vec!["v1".to_owned()],
        }
    }

    /// The group's versions, preferred first.
    fn versions(&self) -> Vec<&'static str> {
        PRIORITY
            .into_iter()
            .filter(|v| self.taint_rules.iter().chain(&self.slices).any(|s| s == v))
            .collect()
    }

    fn serves(&self, version: &str, resource: &str) -> bool {
        match resource {
            "devicetaintrules" => self.taint_rules.iter().any(|v| v == version),
            "resourceslices" => self.slices.iter().any(|v| v == version),
            _ => false,
        }
    }
}

/// The stored objects of the group.
#[derive(Default)]
pub(super) struct Dra {
    pub(super) served: Served,
    pub(super) slices: BTreeMap<String, Value>,
    pub(super) rules: BTreeMap<String, Value>,
    uids: u64,
}

const RULES: &str = "devicetaintrules.resource.k8s.io";

/// What the generic 404 of an unserved path says.
fn not_here() -> Response {
    status_with(
        404,
        "NotFound",
        "the server could not find the requested resource",
        json!({}),
    )
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// `GET /apis`: the groups the double serves.
pub(super) fn root(dra: &Dra) -> Response {
    let gv = |group: &str, v: &str| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    let mut groups = vec![
        json!({"name": "coordination.k8s.io", "versions": [gv("coordination.k8s.io", "v1")], "preferredVersion": gv("coordination.k8s.io", "v1")}),
        json!({"name": "authorization.k8s.io", "versions": [gv("authorization.k8s.io", "v1")], "preferredVersion": gv("authorization.k8s.io", "v1")}),
    ];
    if let Some(g) = group(dra) {
        groups.push(g);
    }
    ok(
        200,
        &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
    )
}

/// The `APIGroup` of `resource.k8s.io`, when any version is served.
fn group(dra: &Dra) -> Option<Value> {
    let versions: Vec<Value> = dra
        .served
        .versions()
        .into_iter()
        .map(|v| json!({"groupVersion": format!("{GROUP}/{v}"), "version": v}))
        .collect();
    let preferred = versions.first()?.clone();
    Some(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": versions, "preferredVersion": preferred}),
    )
}

/// Answers a request under `/apis/resource.k8s.io`.
pub(super) fn serve(dra: &mut Dra, rv: &mut u64, req: &Request) -> Response {
    let Target::Dra {
        version,
        resource,
        name,
    } = &req.target
    else {
        return not_here();
    };
    let Some(version) = version else {
        return match group(dra) {
            Some(g) => ok(200, &g),
            None => not_here(),
        };
    };
    if !dra.served.versions().contains(&version.as_str()) {
        return not_here();
    }
    let Some(resource) = resource else {
        return ok(200, &resource_list(&dra.served, version));
    };
    if !dra.served.serves(version, resource) {
        return not_here();
    }
    let api_version = format!("{GROUP}/{version}");
    match (resource.as_str(), req.method.as_str(), name) {
        ("resourceslices", "GET", None) => list_slices(dra, *rv, req, &api_version),
        ("devicetaintrules", "GET", None) => {
            let sel = req.q.get("labelSelector").cloned().unwrap_or_default();
            let items = dra
                .rules
                .values()
                .filter(|r| selector::matches(r, &sel))
                .map(|r| as_version(r, &api_version))
                .collect();
            ok(
                200,
                &selector::list_body(
                    "DeviceTaintRule",
                    &api_version,
                    items,
                    *rv,
                    &req.accept,
                    None,
                ),
            )
        }
        ("devicetaintrules", "POST", None) => dra.create(rv, &req.body, &api_version),
        ("devicetaintrules", "GET", Some(name)) => match dra.rules.get(name) {
            Some(r) => ok(200, &as_version(r, &api_version)),
            None => not_found(RULES, name),
        },
        ("devicetaintrules", "PUT", Some(name)) => dra.update(rv, name, &req.body, &api_version),
        ("devicetaintrules", "DELETE", Some(name)) => match dra.rules.remove(name) {
            Some(r) => {
                *rv += 1;
                ok(200, &as_version(&r, &api_version))
            }
            None => not_found(RULES, name),
        },
        _ => status(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({} {})",
                req.method, req.path
            ),
        ),
    }
}

/// `APIResourceList` of one version.
fn resource_list(served: &Served, version: &str) -> Value {
    let mut resources = Vec::new();
    if served.serves(version, "devicetaintrules") {
        resources.push(json!({"name": "devicetaintrules", "singularName": "devicetaintrule", "namespaced": false, "kind": "DeviceTaintRule",
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}));
        resources.push(json!({"name": "devicetaintrules/status", "singularName": "", "namespaced": false, "kind": "DeviceTaintRule",
            "verbs": ["get", "patch", "update"]}));
    }
    if served.serves(version, "resourceslices") {
        resources.push(json!({"name": "resourceslices", "singularName": "resourceslice", "namespaced": false, "kind": "ResourceSlice",
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}));
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{version}"), "resources": resources})
}

fn as_version(obj: &Value, api_version: &str) -> Value {
    let mut o = obj.clone();
    o["apiVersion"] = json!(api_version);
    o
}

fn list_slices(dra: &Dra, rv: u64, req: &Request, api_version: &str) -> Response {
    let mut wanted = Vec::new();
    for term in req
        .q
        .get("fieldSelector")
        .map(String::as_str)
        .unwrap_or("")
        .split(',')
        .filter(|t| !t.is_empty())
    {
        let (label, value) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .unwrap_or((term, ""));
        let path = match label {
            "spec.nodeName" => "nodeName",
            "spec.driver" => "driver",
            other => {
                return status(
                    400,
                    "BadRequest",
                    format!("field label not supported: {other}"),
                );
            }
        };
        wanted.push((path, value.to_owned()));
    }
    let items = dra
        .slices
        .values()
        .filter(|s| {
            wanted
                .iter()
                .all(|(f, v)| s["spec"][f].as_str().unwrap_or("") == v)
        })
        .map(|s| as_version(s, api_version))
        .collect();
    ok(
        200,
        &selector::list_body("ResourceSlice", api_version, items, rv, &req.accept, None),
    )
}

/// Whether `s` is a DNS-1123 subdomain (apimachinery
/// `pkg/util/validation/validation.go`, `IsDNS1123Subdomain`).
fn is_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Whether `s` is a label value or a qualified name's name part
/// (`IsValidLabelValue`, `IsQualifiedName`): at most 63 of
/// `[A-Za-z0-9_.-]`, alphanumeric at both ends; `allow_empty` for values.
fn is_name_part(s: &str, allow_empty: bool) -> bool {
    if s.is_empty() {
        return allow_empty;
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && alnum(s.chars().next())
        && alnum(s.chars().last())
}

/// Every validation failure of a DeviceTaintRule, as (field, reason, message).
fn invalid(rule: &Value) -> Vec<(String, &'static str, String)> {
    let mut out = Vec::new();
    let name = rule["metadata"]["name"].as_str().unwrap_or("");
    if name.is_empty() {
        out.push((
            "metadata.name".into(),
            "FieldValueRequired",
            "Required value: name or generateName is required".into(),
        ));
    } else if !is_subdomain(name) {
        out.push((
            "metadata.name".into(),
            "FieldValueInvalid",
            format!(
                "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
            ),
        ));
    }
    let taint = &rule["spec"]["taint"];
    let key = taint["key"].as_str().unwrap_or("");
    let (prefix, key_name) = key.split_once('/').unwrap_or(("", key));
    let key_ok = !key.is_empty()
        && key.matches('/').count() <= 1
        && (!key.contains('/') || is_subdomain(prefix))
        && is_name_part(key_name, false);
    if key.is_empty() {
        out.push((
            "spec.taint.key".into(),
            "FieldValueRequired",
            "Required value".into(),
        ));
    } else if !key_ok {
        out.push((
            "spec.taint.key".into(),
            "FieldValueInvalid",
            format!("Invalid value: {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
        ));
    }
    let value = taint["value"].as_str().unwrap_or("");
    if !is_name_part(value, true) {
        out.push((
            "spec.taint.value".into(),
            "FieldValueInvalid",
            format!("Invalid value: {value:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
        ));
    }
    match taint["effect"].as_str().unwrap_or("") {
        "None" | "NoSchedule" | "NoExecute" => {}
        "" => out.push((
            "spec.taint.effect".into(),
            "FieldValueRequired",
            "Required value".into(),
        )),
        other => out.push((
            "spec.taint.effect".into(),
            "FieldValueNotSupported",
            format!(
                "Unsupported value: {other:?}: supported values: \"NoExecute\", \"NoSchedule\", \"None\""
            ),
        )),
    }
    out
}

/// `errors.NewInvalid`: `DeviceTaintRule.resource.k8s.io "<name>" is
/// invalid: <field>: <message>, ...`, one cause per field.
fn invalid_status(name: &str, problems: Vec<(String, &'static str, String)>) -> Response {
    let message = problems
        .iter()
        .map(|(f, _, m)| format!("{f}: {m}"))
        .collect::<Vec<_>>();
    let message = if message.len() == 1 {
        message[0].clone()
    } else {
        format!("[{}]", message.join(", "))
    };
    let causes: Vec<Value> = problems
        .into_iter()
        .map(|(f, r, m)| json!({"reason": r, "message": m, "field": f}))
        .collect();
    status_with(
        422,
        "Invalid",
        format!("DeviceTaintRule.resource.k8s.io \"{name}\" is invalid: {message}"),
        json!({"name": name, "group": GROUP, "kind": "DeviceTaintRule", "causes": causes}),
    )
}

impl Dra {
    /// Stores `rule` as a create by another client would (its checks
    /// included); panics when the double would refuse it.
    pub(super) fn put_rule(&mut self, rv: &mut u64, rule: &Value) {
        let r = self.create(rv, rule, "resource.k8s.io/v1");
        assert_eq!(r.status(), 201, "the double refused {rule}");
    }

    fn create(&mut self, rv: &mut u64, body: &Value, api_version: &str) -> Response {
        let name = body["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let problems = invalid(body);
        if !problems.is_empty() {
            return invalid_status(&name, problems);
        }
        if self.rules.contains_key(&name) {
            return already_exists(RULES, &name);
        }
        *rv += 1;
        self.uids += 1;
        let mut r = body.clone();
        r["kind"] = json!("DeviceTaintRule");
        r["metadata"]["uid"] = json!(format!("devicetaintrule-uid-{}", self.uids));
        r["metadata"]["resourceVersion"] = json!(rv.to_string());
        r["metadata"]["creationTimestamp"] = json!(now());
        r["metadata"]["generation"] = json!(1);
        if r["spec"]["taint"]["timeAdded"].is_null() {
            r["spec"]["taint"]["timeAdded"] = json!(now());
        }
        if let Some(o) = r.as_object_mut() {
            o.remove("status");
        }
        self.rules.insert(name, r.clone());
        ok(201, &as_version(&r, api_version))
    }

    fn update(&mut self, rv: &mut u64, name: &str, body: &Value, api_version: &str) -> Response {
        let Some(stored) = self.rules.get(name) else {
            return not_found(RULES, name);
        };
        let problems = invalid(body);
        if !problems.is_empty() {
            return invalid_status(name, problems);
        }
        let sent = body["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !sent.is_empty() && Some(sent) != stored["metadata"]["resourceVersion"].as_str() {
            return optimistic_lock_conflict(RULES, name);
        }
        let mut r = body.clone();
        for f in ["uid", "creationTimestamp", "generation"] {
            r["metadata"][f] = stored["metadata"][f].clone();
        }
        r["status"] = stored["status"].clone();
        if r["status"].is_null()
            && let Some(o) = r.as_object_mut()
        {
            o.remove("status");
        }
        if r["spec"]["taint"]["timeAdded"].is_null() {
            r["spec"]["taint"]["timeAdded"] = json!(now());
        }
        if r["spec"] != stored["spec"] {
            let g = stored["metadata"]["generation"].as_i64().unwrap_or(1);
            r["metadata"]["generation"] = json!(g + 1);
        }
        *rv += 1;
        r["kind"] = json!("DeviceTaintRule");
        r["metadata"]["name"] = json!(name);
        r["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.rules.insert(name.to_owned(), r.clone());
        ok(200, &as_version(&r, api_version))
    }
}
