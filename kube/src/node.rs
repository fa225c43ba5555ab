//! Builders for the two Node writes: the server-side-apply body for our status
//! conditions and the resourceVersion-guarded merge patch for taints. Pure.

use super::desired::{DesiredCondition, DesiredTaint};
use super::settings::KubeSettings;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

/// A Node's conditions as the API returned them (none: empty).
pub(crate) fn live_conditions(node: &Node) -> &[NodeCondition] {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[])
}

/// A Node's taints as the API returned them (none: empty).
pub(crate) fn live_taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
}

/// True when any of our conditions is missing or differs in status, reason or message.
pub(crate) fn conditions_differ(node: &Node, desired: &[DesiredCondition]) -> bool {
    let live = live_conditions(node);
    desired.iter().any(|d| {
        live.iter().find(|c| c.type_ == d.type_).is_none_or(|c| {
            c.status != d.status
                || c.reason.as_deref().unwrap_or("") != d.reason
                || c.message.as_deref().unwrap_or("") != d.message
        })
    })
}

fn time_json(t: &Time) -> Value {
    serde_json::to_value(t).unwrap_or(Value::Null)
}

/// The SSA body for `nodes/<name>/status`: only our condition types.
///
/// `lastTransitionTime` is kept from the live condition when the status is unchanged
/// (so message or reason updates never reset a node-repair timer); `lastHeartbeatTime`
/// is `now` (we only write when something else changed).
pub(crate) fn condition_apply_body(
    node_name: &str,
    live: Option<&Node>,
    desired: &[DesiredCondition],
    now: &Time,
) -> Value {
    let live_conds = live.map(live_conditions).unwrap_or(&[]);
    let conditions: Vec<Value> = desired
        .iter()
        .map(|d| {
            let ltt = live_conds
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == d.status)
                .and_then(|c| c.last_transition_time.as_ref())
                .unwrap_or(now);
            json!({
                "type": d.type_,
                "status": d.status,
                "reason": d.reason,
                "message": d.message,
                "lastTransitionTime": time_json(ltt),
                "lastHeartbeatTime": time_json(now),
            })
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": node_name },
        "status": { "conditions": conditions },
    })
}

fn same_taint(t: &Taint, key: &str, value: Option<&str>, effect: &str) -> bool {
    t.key == key && t.effect == effect && t.value.as_deref() == value
}

/// Whether `node` carries the startup taint (key and effect).
pub(crate) fn has_startup_taint(node: &Node, cfg: &KubeSettings) -> bool {
    live_taints(node)
        .iter()
        .any(|t| cfg.taints.startup.is(&t.key, &t.effect))
}

/// Whether `node` carries any of our fault taints.
pub(crate) fn has_fault_taint(node: &Node, cfg: &KubeSettings) -> bool {
    let keys = cfg.taints.fault_keys();
    live_taints(node).iter().any(|t| keys.contains(&t.key))
}

/// The taint list we want: the live list with only our keys changed (others' taints
/// kept verbatim and in order). `None` when nothing changes.
pub(crate) fn desired_taints(
    node: &Node,
    cfg: &KubeSettings,
    fault: Option<&DesiredTaint>,
    remove_startup: bool,
    now: &Time,
) -> Option<Vec<Taint>> {
    let live = live_taints(node);
    let fault_keys = cfg.taints.fault_keys();
    let mut out = Vec::with_capacity(live.len() + 1);
    let mut have_fault = false;
    for t in live {
        if fault_keys.contains(&t.key) {
            match fault {
                Some(f) if !have_fault && same_taint(t, &f.key, Some(&f.value), &f.effect) => {
                    have_fault = true;
                    out.push(t.clone());
                }
                _ => {} // stale value/effect/key of ours: dropped
            }
            continue;
        }
        if remove_startup && cfg.taints.startup.is(&t.key, &t.effect) {
            continue;
        }
        out.push(t.clone());
    }
    if let Some(f) = fault
        && !have_fault
    {
        out.push(Taint {
            key: f.key.clone(),
            value: Some(f.value.clone()),
            effect: f.effect.clone(),
            // Like `kubectl taint`: timeAdded only matters (and is only set) for NoExecute.
            time_added: (f.effect == "NoExecute").then(|| now.clone()),
        });
    }
    (out.as_slice() != live).then_some(out)
}

/// JSON merge patch (RFC 7386) replacing `spec.taints` with `taints`, carrying the
/// node's `metadata.resourceVersion` as a precondition: the API server answers
/// 409 Conflict when the Node changed since that version (another writer won the
/// race), and the caller re-reads and recomputes. A merge patch replaces a list
/// whole, so the list sent is the live one with only our keys changed; `null`
/// removes the field when no taint is left.
pub(crate) fn taint_patch(node: &Node, taints: &[Taint]) -> Value {
    let rv = node.metadata.resource_version.clone().unwrap_or_default();
    let taints_json = if taints.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(taints).unwrap_or(Value::Null)
    };
    json!({
        "metadata": { "resourceVersion": rv },
        "spec": { "taints": taints_json },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use k8s_openapi::jiff::Timestamp;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn node(taints: Vec<Taint>, conds: Vec<NodeCondition>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.resource_version = Some("42".into());
        n.spec = Some(NodeSpec {
            taints: Some(taints),
            ..Default::default()
        });
        n.status = Some(NodeStatus {
            conditions: Some(conds),
            ..Default::default()
        });
        n
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn dc(status: &'static str, message: &str) -> DesiredCondition {
        DesiredCondition {
            type_: "GPUProblem".into(),
            status,
            reason: "XID79".into(),
            message: message.into(),
        }
    }

    #[test]
    fn transition_time_kept_when_status_unchanged() {
        let live = node(
            vec![],
            vec![NodeCondition {
                type_: "GPUProblem".into(),
                status: "True".into(),
                reason: Some("XID79".into()),
                message: Some("x1".into()),
                last_transition_time: Some(t(1000)),
                last_heartbeat_time: Some(t(1000)),
            }],
        );
        let d = [dc("True", "x2")];
        assert!(conditions_differ(&live, &d));
        let body = condition_apply_body("n1", Some(&live), &d, &t(2000));
        let c = &body["status"]["conditions"][0];
        assert_eq!(c["lastTransitionTime"], time_json(&t(1000)));
        assert_eq!(c["lastHeartbeatTime"], time_json(&t(2000)));
        assert_eq!(c["message"], "x2");
        // Status change → new transition time.
        let body = condition_apply_body("n1", Some(&live), &[dc("False", "")], &t(3000));
        assert_eq!(
            body["status"]["conditions"][0]["lastTransitionTime"],
            time_json(&t(3000))
        );
        assert!(!conditions_differ(&live, &[dc("True", "x1")]));
    }

    #[test]
    fn taints_change_only_our_key() {
        let cfg = KubeSettings::default();
        let others = vec![
            taint("dedicated", Some("gpu"), "NoSchedule"),
            taint("gpuwatch.io/unhealthy", Some("reset_gpu"), "NoSchedule"),
            taint("nvidia.com/gpu", None, "NoSchedule"),
        ];
        let live = node(others, vec![]);
        let want = DesiredTaint {
            key: "gpuwatch.io/unhealthy".into(),
            value: "inspect_hardware".into(),
            effect: "NoSchedule".into(),
        };
        let new = desired_taints(&live, &cfg, Some(&want), false, &t(5)).unwrap();
        let keys: Vec<(&str, Option<&str>)> = new
            .iter()
            .map(|t| (t.key.as_str(), t.value.as_deref()))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("dedicated", Some("gpu")),
                ("nvidia.com/gpu", None),
                ("gpuwatch.io/unhealthy", Some("inspect_hardware")),
            ]
        );
        assert!(new[2].time_added.is_none());
        // Already as wanted: no patch.
        let live2 = node(new.clone(), vec![]);
        assert!(desired_taints(&live2, &cfg, Some(&want), false, &t(5)).is_none());
        // Cleared: only ours removed.
        let cleared = desired_taints(&live2, &cfg, None, false, &t(5)).unwrap();
        assert_eq!(cleared.len(), 2);
    }

    #[test]
    fn startup_taint_removed_only_when_asked() {
        let cfg = KubeSettings::default();
        let live = node(
            vec![taint(&cfg.taints.startup.key, None, "NoSchedule")],
            vec![],
        );
        assert!(has_startup_taint(&live, &cfg));
        assert!(desired_taints(&live, &cfg, None, false, &t(1)).is_none());
        assert_eq!(
            desired_taints(&live, &cfg, None, true, &t(1)).unwrap(),
            vec![]
        );
    }

    #[test]
    fn patch_is_guarded_by_resource_version() {
        let live = node(vec![], vec![]);
        let p = taint_patch(&live, &[taint("a", None, "NoSchedule")]);
        assert_eq!(p["metadata"], json!({"resourceVersion": "42"}));
        assert_eq!(
            p["spec"]["taints"],
            json!([{"key": "a", "effect": "NoSchedule"}])
        );
        // The last taint gone: the field is removed, the guard stays.
        let p = taint_patch(&live, &[]);
        assert_eq!(p["spec"]["taints"], Value::Null);
        assert_eq!(p["metadata"]["resourceVersion"], "42");
    }

    #[test]
    fn no_execute_gets_time_added() {
        let mut cfg = KubeSettings::default();
        cfg.taints.fault.effect = crate::settings::TaintEffect::NoExecute;
        let want = DesiredTaint {
            key: "gpuwatch.io/unhealthy".into(),
            value: "reset_gpu".into(),
            effect: "NoExecute".into(),
        };
        let new = desired_taints(&node(vec![], vec![]), &cfg, Some(&want), false, &t(9)).unwrap();
        assert_eq!(new[0].time_added, Some(t(9)));
    }
}
