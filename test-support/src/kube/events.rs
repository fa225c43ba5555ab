//! core/v1 Events: create (409 AlreadyExists), merge-patch, list with field
//! selectors. Names are unique across namespaces here (the writer uses one).

use super::request::{Request, Target};
use super::status::{already_exists, not_found, not_served, ok, status};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

/// The stored Events by name.
#[derive(Default)]
pub(super) struct Events(pub(super) BTreeMap<String, Value>);

/// Answers a request for `events` (`rv`: the server's resourceVersion counter).
pub(super) fn serve(events: &mut Events, rv: &mut u64, req: &Request) -> Response {
    let Target::Events { namespace, name } = &req.target else {
        return not_served(req);
    };
    match (req.method.as_str(), name) {
        ("POST", None) => events.create(rv, namespace, &req.body),
        ("PATCH", Some(name)) => events.patch(rv, name, &req.body),
        ("GET", None) => {
            let sel = req.q.get("fieldSelector").cloned().unwrap_or_default();
            let items: Vec<Value> = events
                .0
                .values()
                .filter(|e| field_match(e, &sel))
                .cloned()
                .collect();
            ok(
                200,
                &json!({"apiVersion": "v1", "kind": "EventList", "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
            )
        }
        _ => not_served(req),
    }
}

impl Events {
    fn create(&mut self, rv: &mut u64, namespace: &str, body: &Value) -> Response {
        let mut ev = body.clone();
        let name = ev["metadata"]["name"].as_str().unwrap_or("").to_owned();
        if name.is_empty() {
            return status(422, "Invalid", "metadata.name required");
        }
        let slot = match self.0.entry(name) {
            Entry::Occupied(taken) => return already_exists("events", taken.key()),
            Entry::Vacant(slot) => slot,
        };
        if ev["involvedObject"]["name"].as_str().is_none() {
            return status(422, "Invalid", "involvedObject.name required");
        }
        *rv += 1;
        ev["metadata"]["namespace"] = json!(namespace);
        ev["metadata"]["resourceVersion"] = json!(rv.to_string());
        ev["metadata"]["uid"] = json!(format!("uid-{rv}"));
        ev["apiVersion"] = json!("v1");
        ev["kind"] = json!("Event");
        slot.insert(ev.clone());
        ok(201, &ev)
    }

    /// A merge patch; the version moves only when the Event exists.
    fn patch(&mut self, rv: &mut u64, name: &str, body: &Value) -> Response {
        let next = *rv + 1;
        match self.0.get_mut(name) {
            None => not_found("events", name),
            Some(ev) => {
                json_patch::merge(ev, body);
                ev["metadata"]["resourceVersion"] = json!(next.to_string());
                let out = ev.clone();
                *rv = next;
                ok(200, &out)
            }
        }
    }
}

/// The field selectors the writer and the tests use on Events.
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
