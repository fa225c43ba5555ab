//! The DeviceTaintRule client against the API double serving
//! `resource.k8s.io` in each version a cluster may: discovery, the Node's
//! DRA devices, create / adopt / update / delete, reconcile across a
//! restart, a card replaced under the same device name, and the refusals
//! the caller falls back to the Node taint on.

use crate::kube_common::{ApiDouble, DraServed};
use gpuwatch_kube::device_taints::{
    DesiredRule, DeviceTaintError, DeviceTaints, DraDevice, DraVersion, Ensured, GPU_UUID_LABEL,
    NODE_LABEL, decide, desired_rules,
};
use gpuwatch_kube::{DEVICE_TAINT_REQUESTS, DeviceIsolation, KubeClient, KubeSettings};
use gpuwatch_proto::{Action, ActiveFault, FaultKind, GpuHealth, NodeHealth};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

const NODE: &str = "gpu-node-1";

async fn double(rules_in: &[&str]) -> ApiDouble {
    let mut node = Node::default();
    node.metadata.name = Some(NODE.into());
    let api = ApiDouble::start(node).await;
    api.serve_dra(DraServed::rules_in(rules_in));
    api
}

fn settings(api: &ApiDouble) -> KubeSettings {
    api.kube_config().resolve().expect("valid settings")
}

async fn client(api: &ApiDouble) -> DeviceTaints {
    let s = settings(api);
    let c = KubeClient::connect(&s).await.expect("a client");
    DeviceTaints::new(&c, NODE, &s).expect("not a dry run")
}

/// A ResourceSlice of the NVIDIA DRA driver: `(device, uuid, parentUUID)`.
fn slice(name: &str, node: &str, generation: i64, devices: &[(&str, &str, Option<&str>)]) -> Value {
    crate::kube_common::build::gpu_slice(name, node, generation, devices)
}

fn device(name: &str, uuid: &str) -> DraDevice {
    DraDevice {
        driver: "gpu.nvidia.com".into(),
        pool: NODE.into(),
        name: name.into(),
        uuid: uuid.into(),
        parent_uuid: None,
    }
}

fn rule(name: &str, dev: DraDevice, value: &str) -> DesiredRule {
    DesiredRule {
        name: name.into(),
        device: dev,
        key: "gpuwatch.io/unhealthy".into(),
        value: value.into(),
        effect: "NoSchedule".into(),
    }
}

fn faulty(uuid: &str, action: Action) -> NodeHealth {
    let mut f = ActiveFault {
        code: 79,
        first_seen_unix_nano: Some(1),
        ..ActiveFault::default()
    };
    f.set_action(action);
    f.set_kind(FaultKind::Xid);
    NodeHealth {
        node_name: NODE.into(),
        gpus: vec![GpuHealth {
            uuid: uuid.into(),
            active_faults: vec![f],
            ..GpuHealth::default()
        }],
        ..NodeHealth::default()
    }
}

fn writes(api: &ApiDouble) -> usize {
    api.requests().iter().filter(|r| r.is_write()).count()
}

/// Every request is discovery (a non-resource URL) or one of
/// `DEVICE_TAINT_REQUESTS`.
fn assert_declared(api: &ApiDouble) {
    for r in api.requests() {
        if r.verb == "unknown" {
            assert!(r.path.starts_with("/apis"), "{} {}", r.method, r.path);
            assert_eq!(r.method, "GET");
            continue;
        }
        assert!(
            DEVICE_TAINT_REQUESTS
                .iter()
                .any(|d| d.verb == r.verb && d.resource == r.resource && d.group == r.group),
            "undeclared {} {} ({} {})",
            r.method,
            r.path,
            r.verb,
            r.resource
        );
    }
}

#[tokio::test]
async fn each_served_version_is_found_and_used_and_none_is_unavailable() {
    for (served, want) in [
        (&["v1"][..], Some(DraVersion::V1)),
        (&["v1beta2"][..], Some(DraVersion::V1beta2)),
        (&["v1alpha3"][..], Some(DraVersion::V1alpha3)),
        (&["v1beta2", "v1alpha3"][..], Some(DraVersion::V1beta2)),
        (&[][..], None),
    ] {
        let api = double(served).await;
        api.put_resource_slice(slice("s0", NODE, 1, &[("gpu-0", "GPU-0", None)]));
        let dt = client(&api).await;
        let r = rule(
            "gpuwatch-gpu-node-1-gpu-0",
            device("gpu-0", "GPU-0"),
            "reset_gpu",
        );
        match want {
            Some(v) => {
                assert_eq!(dt.version().await, Ok(v), "{served:?}");
                let report = dt.reconcile(std::slice::from_ref(&r)).await.unwrap();
                assert_eq!(report.created, [r.name.as_str()], "{served:?}");
                let path = format!("/apis/resource.k8s.io/{}/devicetaintrules", v.as_str());
                assert!(
                    api.requests()
                        .iter()
                        .any(|q| q.method == "POST" && q.path == path && q.status == 201),
                    "{served:?}: no create at {path}"
                );
                // The devices come from the v1 ResourceSlices whatever
                // version serves the rules.
                assert_eq!(dt.devices().await.unwrap(), [device("gpu-0", "GPU-0")]);
            }
            None => {
                let e = dt.version().await.unwrap_err();
                assert_eq!(e, DeviceTaintError::Unavailable);
                assert!(e.use_node_taint());
                let e = dt.reconcile(&[r]).await.unwrap_err();
                assert_eq!(e, DeviceTaintError::Unavailable);
                assert_eq!(writes(&api), 0);
            }
        }
        assert_declared(&api);
    }
}

#[tokio::test]
async fn devices_are_this_nodes_newest_slices_with_their_uuids() {
    let api = double(&["v1"]).await;
    // An outdated generation of the pool the driver is replacing.
    api.put_resource_slice(slice("old", NODE, 1, &[("gpu-0", "GPU-OLD", None)]));
    api.put_resource_slice(slice(
        "new",
        NODE,
        2,
        &[
            ("gpu-0", "GPU-0", None),
            ("gpu-1", "GPU-1", None),
            ("gpu-1-mig-1g.10gb-9-0", "MIG-1a", Some("GPU-1")),
        ],
    ));
    api.put_resource_slice(slice(
        "other-node",
        "gpu-node-2",
        5,
        &[("gpu-0", "GPU-X", None)],
    ));
    let mut foreign = slice("other-driver", NODE, 3, &[("nic-0", "NIC-0", None)]);
    foreign["spec"]["driver"] = json!("net.example.com");
    api.put_resource_slice(foreign);
    let dt = client(&api).await;
    let got = dt.devices().await.unwrap();
    let mut mig = device("gpu-1-mig-1g.10gb-9-0", "MIG-1a");
    mig.parent_uuid = Some("GPU-1".into());
    assert_eq!(
        got,
        [device("gpu-0", "GPU-0"), device("gpu-1", "GPU-1"), mig]
    );
    let list = api
        .requests()
        .into_iter()
        .find(|r| r.resource == "resourceslices")
        .expect("a slice list");
    assert!(
        list.query.contains("spec.nodeName%3Dgpu-node-1")
            || list.query.contains("spec.nodeName=gpu-node-1"),
        "{}",
        list.query
    );
}

#[tokio::test]
async fn create_adopt_update_and_delete() {
    let api = double(&["v1"]).await;
    let dt = client(&api).await;
    let name = "gpuwatch-gpu-node-1-gpu-0";
    let r = rule(name, device("gpu-0", "GPU-0"), "reset_gpu");
    assert_eq!(dt.ensure(&r).await, Ok(Ensured::Created));
    let stored = &api.device_taint_rules()[name];
    assert_eq!(stored["metadata"]["labels"][NODE_LABEL], NODE);
    assert_eq!(stored["metadata"]["labels"][GPU_UUID_LABEL], "GPU-0");
    assert_eq!(
        stored["spec"]["deviceSelector"],
        json!({"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"})
    );
    assert_eq!(stored["spec"]["taint"]["value"], "reset_gpu");
    let added = stored["spec"]["taint"]["timeAdded"].clone();
    assert!(added.is_string());

    // The same again: adopted, nothing written.
    let before = writes(&api);
    assert_eq!(dt.ensure(&r).await, Ok(Ensured::Unchanged));
    assert_eq!(writes(&api), before + 1, "only the refused create");

    // The action changed: updated in place with its resourceVersion.
    let worse = rule(name, device("gpu-0", "GPU-0"), "inspect_hardware");
    assert_eq!(dt.ensure(&worse).await, Ok(Ensured::Updated));
    let put = api
        .requests()
        .into_iter()
        .rfind(|q| q.method == "PUT")
        .expect("an update");
    assert!(put.body["metadata"]["resourceVersion"].is_string());
    assert_eq!(put.status, 200);
    let stored = &api.device_taint_rules()[name];
    assert_eq!(stored["spec"]["taint"]["value"], "inspect_hardware");

    // Another client changed the rule: the next ensure converges it back.
    api.edit_device_taint_rule(name, |r| r["spec"]["taint"]["effect"] = json!("None"));
    assert_eq!(dt.ensure(&worse).await, Ok(Ensured::Updated));
    assert_eq!(
        api.device_taint_rules()[name]["spec"]["taint"]["effect"],
        "NoSchedule"
    );

    // Another client dropped the labels: they come back, and the taint,
    // unchanged, keeps the time it was added.
    let then = "2020-01-01T00:00:00Z";
    api.edit_device_taint_rule(name, |r| {
        r["metadata"]["labels"] = json!({});
        r["spec"]["taint"]["timeAdded"] = json!(then);
    });
    assert_eq!(dt.ensure(&worse).await, Ok(Ensured::Updated));
    let stored = &api.device_taint_rules()[name];
    assert_eq!(stored["metadata"]["labels"][GPU_UUID_LABEL], "GPU-0");
    assert_eq!(stored["spec"]["taint"]["timeAdded"], then);
    // A changed taint is a new one: the server dates it anew.
    assert_eq!(dt.ensure(&r).await, Ok(Ensured::Updated));
    assert_ne!(
        api.device_taint_rules()[name]["spec"]["taint"]["timeAdded"],
        then
    );

    assert_eq!(dt.remove(name).await, Ok(true));
    assert_eq!(dt.remove(name).await, Ok(false), "404 is fine");
    assert!(api.device_taint_rules().is_empty());

    // A rule the API server finds invalid is a clear error, not a retry.
    let mut bad = rule(
        "gpuwatch-gpu-node-1-gpu-1",
        device("gpu-1", "GPU-1"),
        "reset_gpu",
    );
    bad.key = "not a key".into();
    let e = dt.ensure(&bad).await.unwrap_err();
    assert!(
        matches!(&e, DeviceTaintError::Rejected { message, .. } if message.contains("spec.taint.key")),
        "{e}"
    );
    assert!(e.use_node_taint());
    assert_declared(&api);
}

#[tokio::test]
async fn reconcile_after_a_restart_writes_nothing_and_removes_what_is_stale() {
    let api = double(&["v1beta2"]).await;
    api.put_resource_slice(slice(
        "s0",
        NODE,
        1,
        &[("gpu-0", "GPU-0", None), ("gpu-1", "GPU-1", None)],
    ));
    let s = settings(&api);
    let dt = client(&api).await;
    let devices = dt.devices().await.unwrap();
    let mut health = faulty("GPU-0", Action::ResetGpu);
    let mut second = faulty("GPU-1", Action::InspectHardware).gpus.remove(0);
    second.active_faults[0].first_seen_unix_nano = Some(2);
    health.gpus.push(second);
    let decision = decide(&health, &devices, DeviceIsolation::Auto, true);
    assert!(decision.node.is_empty(), "{decision:?}");
    let desired = desired_rules(NODE, &decision, &s);
    assert_eq!(desired.len(), 2);
    let report = dt.reconcile(&desired).await.unwrap();
    assert_eq!(report.created.len(), 2);

    // A new agent process (a restart): same desired set, no writes.
    let dt = client(&api).await;
    let before = writes(&api);
    let report = dt.reconcile(&desired).await.unwrap();
    assert!(!report.wrote(), "{report:?}");
    assert_eq!(report.unchanged.len(), 2);
    assert_eq!(writes(&api), before);
    assert_eq!(api.device_taint_rules().len(), 2, "no duplicates");

    // GPU-1's fault cleared: its rule goes, the other stays.
    let report = dt.reconcile(&desired[..1]).await.unwrap();
    assert_eq!(report.deleted, [desired[1].name.clone()]);
    assert_eq!(
        api.device_taint_rules().keys().collect::<Vec<_>>(),
        [&desired[0].name]
    );
    // Another Node's rules are not this agent's to delete.
    let s2 = settings(&api);
    let c2 = KubeClient::connect(&s2).await.unwrap();
    let dt2 = DeviceTaints::new(&c2, "gpu-node-2", &s2).unwrap();
    let r2 = rule(
        "gpuwatch-gpu-node-2-gpu-0",
        DraDevice {
            pool: "gpu-node-2".into(),
            ..device("gpu-0", "GPU-X")
        },
        "reset_gpu",
    );
    dt2.reconcile(&[r2]).await.unwrap();
    let report = dt.reconcile(&[]).await.unwrap();
    assert_eq!(report.deleted, [desired[0].name.clone()]);
    assert_eq!(
        api.device_taint_rules().keys().collect::<Vec<_>>(),
        ["gpuwatch-gpu-node-2-gpu-0"]
    );
    assert_declared(&api);
}

#[tokio::test]
async fn a_new_card_at_the_same_device_name_drops_the_old_cards_rule() {
    let api = double(&["v1"]).await;
    api.put_resource_slice(slice("s0", NODE, 1, &[("gpu-0", "GPU-OLD", None)]));
    let s = settings(&api);
    let dt = client(&api).await;
    let old = faulty("GPU-OLD", Action::InspectHardware);
    let d = decide(
        &old,
        &dt.devices().await.unwrap(),
        DeviceIsolation::Auto,
        true,
    );
    dt.reconcile(&desired_rules(NODE, &d, &s)).await.unwrap();
    let name = "gpuwatch-gpu-node-1-gpu-0";
    assert_eq!(
        api.device_taint_rules()[name]["metadata"]["labels"][GPU_UUID_LABEL],
        "GPU-OLD"
    );

    // The card was replaced: the driver lists another UUID at gpu-0. The old
    // card's fault no longer names a listed device (the Node taint keeps it
    // until the fault is gone), and its rule is deleted.
    api.put_resource_slice(slice("s0", NODE, 2, &[("gpu-0", "GPU-NEW", None)]));
    let d = decide(
        &old,
        &dt.devices().await.unwrap(),
        DeviceIsolation::Auto,
        true,
    );
    assert!(d.devices.is_empty());
    assert_eq!(d.node_action(), Some(Action::InspectHardware));
    let report = dt.reconcile(&desired_rules(NODE, &d, &s)).await.unwrap();
    assert_eq!(report.deleted, [name]);

    // The new card faults too: a rule of its own, never the old one reused.
    dt.reconcile(&[rule(name, device("gpu-0", "GPU-OLD"), "inspect_hardware")])
        .await
        .unwrap();
    let uid_old = api.device_taint_rules()[name]["metadata"]["uid"].clone();
    let new = faulty("GPU-NEW", Action::ResetGpu);
    let d = decide(
        &new,
        &dt.devices().await.unwrap(),
        DeviceIsolation::Auto,
        true,
    );
    let report = dt.reconcile(&desired_rules(NODE, &d, &s)).await.unwrap();
    assert_eq!(report.replaced, [name]);
    let stored = &api.device_taint_rules()[name];
    assert_eq!(stored["metadata"]["labels"][GPU_UUID_LABEL], "GPU-NEW");
    assert_ne!(stored["metadata"]["uid"], uid_old);
}

#[tokio::test]
async fn forbidden_requests_are_a_clear_error_to_fall_back_on() {
    let api = double(&["v1"]).await;
    api.forbid("create", "devicetaintrules");
    let dt = client(&api).await;
    let r = rule(
        "gpuwatch-gpu-node-1-gpu-0",
        device("gpu-0", "GPU-0"),
        "reset_gpu",
    );
    let e = dt.reconcile(std::slice::from_ref(&r)).await.unwrap_err();
    assert!(
        matches!(
            &e,
            DeviceTaintError::Forbidden {
                verb: "create",
                resource: "devicetaintrules",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.use_node_taint());
    let text = e.to_string();
    assert!(
        text.contains("forbidden to create devicetaintrules.resource.k8s.io")
            && text.contains("device_isolation"),
        "{text}"
    );
    api.unforbid("create", "devicetaintrules");
    api.forbid("list", "devicetaintrules");
    let e = dt.reconcile(&[r]).await.unwrap_err();
    assert!(
        matches!(e, DeviceTaintError::Forbidden { verb: "list", .. }),
        "{e:?}"
    );
    // A transient failure is not a reason to give up on the device taint.
    assert!(!DeviceTaintError::Api("503".into()).use_node_taint());
}

#[tokio::test]
async fn a_version_that_goes_away_is_discovered_again() {
    let api = double(&["v1beta2"]).await;
    let dt = client(&api).await;
    let r = rule(
        "gpuwatch-gpu-node-1-gpu-0",
        device("gpu-0", "GPU-0"),
        "reset_gpu",
    );
    dt.reconcile(std::slice::from_ref(&r)).await.unwrap();
    assert_eq!(dt.version().await, Ok(DraVersion::V1beta2));
    // The control plane was upgraded: v1 only. The stored rule is the same
    // object, read in the new version.
    api.serve_dra(DraServed::rules_in(&["v1"]));
    let report = dt.reconcile(std::slice::from_ref(&r)).await.unwrap();
    assert_eq!(report.unchanged, [r.name.as_str()]);
    assert_eq!(dt.version().await, Ok(DraVersion::V1));
    assert!(
        api.requests()
            .iter()
            .any(|q| q.path == "/apis/resource.k8s.io/v1beta2/devicetaintrules" && q.status == 404)
    );
}
