//! DRA device taints (KEP-5055): isolating one GPU or MIG device with a
//! `resource.k8s.io` DeviceTaintRule instead of tainting the whole Node.
//!
//! - **Version discovery**: DeviceTaintRules are served in `v1` (Kubernetes
//!   1.37 on), `v1beta2` (1.36) or `v1alpha3` (1.33–1.35, behind a feature
//!   gate); the first of those whose discovery lists `devicetaintrules` is
//!   used, none: [`DeviceTaintError::Unavailable`]. A collection request
//!   answered 404 (the version went away in an upgrade) discovers again.
//! - **Devices**: the Node's ResourceSlices of the NVIDIA DRA driver
//!   (`fieldSelector=spec.nodeName=<node>,spec.driver=gpu.nvidia.com`, the
//!   newest generation of each pool), each device with its `uuid` attribute
//!   (MIG devices also `parentUUID`).
//! - **Rules**: one per device, named `gpuwatch-<node>-<device>` (a hashed
//!   suffix when that is no DNS-1123 subdomain), labelled with the Node
//!   ([`NODE_LABEL`]) and the device's UUID ([`GPU_UUID_LABEL`]); the taint
//!   key is the fault taint's key for the action, its value the action, its
//!   effect `device_taint_effect`. A device name is a slot, not a card: a
//!   rule whose UUID label differs from the device's now is deleted and
//!   created again, never carried over to the new card.
//! - **Reconcile** ([`DeviceTaints::reconcile`]): the desired rules against
//!   the Node's existing ones (by label): missing ones created (a name taken
//!   is adopted: read and updated with its resourceVersion), changed ones
//!   updated (a lost race re-reads and retries), stale ones deleted (404 is
//!   fine). Repeating it with the same set writes nothing.
//!
//! [`decide`] says which faults become device rules; the Node taint stays
//! for the rest.

mod decide;
pub(crate) mod isolate;

pub use decide::{
    Decision, DeviceFault, DraDevice, NodeFault, NodeScope, decide, isolatable_gpus, isolates,
};

use super::KubeClient;
use super::backend::ApiError;
use super::settings::KubeSettings;
use gpuwatch_core::names::{is_dns_subdomain, is_qualified_name_part};
use gpuwatch_proto::ShortName;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// The API group of dynamic resource allocation.
pub const GROUP: &str = "resource.k8s.io";
/// The NVIDIA DRA driver's name (the `spec.driver` of its ResourceSlices).
pub const NVIDIA_DRIVER: &str = "gpu.nvidia.com";
/// Label on every rule: the Node it isolates a device of.
pub const NODE_LABEL: &str = "gpuwatch.io/node";
/// Label on every rule: the UUID of the device it was written for.
pub const GPU_UUID_LABEL: &str = "gpuwatch.io/gpu-uuid";
/// Annotation on every rule: the Node's full name (the label holds a hash
/// when the name is no label value).
pub const NODE_ANNOTATION: &str = "gpuwatch.io/node-name";

/// A version of `resource.k8s.io` that serves DeviceTaintRules, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DraVersion {
    /// Kubernetes 1.37 on.
    V1,
    /// Kubernetes 1.36.
    V1beta2,
    /// Kubernetes 1.33–1.35.
    V1alpha3,
}

impl DraVersion {
    /// In order of preference.
    pub const ALL: [DraVersion; 3] = [DraVersion::V1, DraVersion::V1beta2, DraVersion::V1alpha3];

    /// The version as the API names it.
    pub fn as_str(self) -> &'static str {
        match self {
            DraVersion::V1 => "v1",
            DraVersion::V1beta2 => "v1beta2",
            DraVersion::V1alpha3 => "v1alpha3",
        }
    }
}

/// What went wrong talking to `resource.k8s.io`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceTaintError {
    /// The cluster serves no DeviceTaintRules (before 1.33, or the feature
    /// gate is off): keep the Node taint.
    #[error(
        "the API server serves no DeviceTaintRules (resource.k8s.io v1, v1beta2, v1alpha3); isolating the Node instead"
    )]
    Unavailable,
    /// A dry run's client sends nothing.
    #[error("dry run: DeviceTaintRules are not written")]
    DryRun,
    /// RBAC (or an admission policy) refused: keep the Node taint.
    #[error(
        "forbidden to {verb} {resource}.resource.k8s.io: {message} (grant it to gpuwatch's ClusterRole, or set [kube] device_isolation = \"off\")"
    )]
    Forbidden {
        /// The RBAC verb refused.
        verb: &'static str,
        /// The resource.
        resource: &'static str,
        /// What the API server said.
        message: String,
    },
    /// The API server rejected a rule as invalid (422/400).
    #[error("DeviceTaintRule {name:?} rejected: {message}")]
    Rejected {
        /// The rule's name.
        name: String,
        /// What the API server said.
        message: String,
    },
    /// Anything else (unreachable, 5xx, timeout, a race lost too often):
    /// retry later.
    #[error("{0}")]
    Api(String),
}

impl DeviceTaintError {
    /// Whether the caller should isolate the Node instead (retrying will
    /// not help soon): the feature is unavailable, forbidden, or rejected.
    pub fn use_node_taint(&self) -> bool {
        !matches!(self, DeviceTaintError::Api(_))
    }
}

/// A DeviceTaintRule as gpuwatch wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredRule {
    /// `metadata.name` ([`rule_name`]).
    pub name: String,
    /// The device it selects (by driver, pool and name).
    pub device: DraDevice,
    /// `spec.taint.key`.
    pub key: String,
    /// `spec.taint.value`: the action (`reset_gpu`).
    pub value: String,
    /// `spec.taint.effect`.
    pub effect: String,
}

/// The rules for the device faults of `decision` on `node`.
pub fn desired_rules(node: &str, decision: &Decision, settings: &KubeSettings) -> Vec<DesiredRule> {
    decision
        .devices
        .iter()
        .map(|f| DesiredRule {
            name: rule_name(node, &f.device.name),
            device: f.device.clone(),
            key: settings.taints.fault_for(f.action).key.clone(),
            value: f.action.short_name().to_owned(),
            effect: settings.devices.effect.as_str().to_owned(),
        })
        .collect()
}

/// FNV-1a, 64 bits: a hash that stays the same across builds and releases
/// (names derived from it must not change when gpuwatch is upgraded).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `gpuwatch-<node>-<device>` when that is a DNS-1123 subdomain; else the
/// same made valid (lowercase, other characters `-`, cut to fit) with a
/// hash of the full name appended, so distinct devices keep distinct names.
pub fn rule_name(node: &str, device: &str) -> String {
    let raw = format!("gpuwatch-{node}-{device}");
    if is_dns_subdomain(&raw) {
        return raw;
    }
    let mapped: String = raw
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let labels: Vec<String> = mapped
        .split('.')
        .map(|l| {
            let l = l.trim_matches('-');
            l[..l.len().min(40)].trim_matches('-').to_owned()
        })
        .filter(|l| !l.is_empty())
        .collect();
    let mut base = labels.join(".");
    // 253 in all, less "-" and 16 hex digits.
    base.truncate(236);
    let base = base.trim_end_matches(['-', '.']);
    format!("{base}-{:016x}", fnv(&raw))
}

/// A label value naming `s`: itself when it is one, else `h-` and a hash.
fn label_value(s: &str) -> String {
    if is_qualified_name_part(s) {
        s.to_owned()
    } else {
        format!("h-{:016x}", fnv(s))
    }
}

/// A rule of this Node as the API server has it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExistingRule {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.resourceVersion` (compared for equality only).
    pub resource_version: String,
    /// The UUID label (empty: none).
    pub gpu_uuid: String,
    /// The whole object, for an update.
    object: DynamicObject,
}

/// What [`DeviceTaints::reconcile`] did, by rule name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Rules created.
    pub created: Vec<String>,
    /// Rules updated in place (taint or labels changed, or adopted).
    pub updated: Vec<String>,
    /// Rules deleted and created again: the device holds another card.
    pub replaced: Vec<String>,
    /// Rules deleted: no fault wants them any more.
    pub deleted: Vec<String>,
    /// Rules already as wanted.
    pub unchanged: Vec<String>,
}

impl ReconcileReport {
    /// Whether anything was written.
    pub fn wrote(&self) -> bool {
        !(self.created.is_empty()
            && self.updated.is_empty()
            && self.replaced.is_empty()
            && self.deleted.is_empty())
    }
}

/// What [`DeviceTaints::ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// Created.
    Created,
    /// Updated (or adopted) in place.
    Updated,
    /// Deleted and created again for another card.
    Replaced,
    /// Already as wanted.
    Unchanged,
}

/// The DeviceTaintRules of the version discovery found.
struct Rules {
    api: Api<DynamicObject>,
    ar: ApiResource,
}

/// The versions discovery found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Served {
    rules: Option<DraVersion>,
    slices: Option<DraVersion>,
}

/// The client of this Node's DeviceTaintRules and DRA devices.
pub struct DeviceTaints {
    client: kube::Client,
    node: String,
    timeout: Duration,
    served: tokio::sync::Mutex<Option<Served>>,
}

impl std::fmt::Debug for DeviceTaints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTaints")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// How many times a write lost to another writer is retried.
const RACE_TRIES: usize = 3;

fn api_resource(version: DraVersion, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: version.as_str().into(),
        api_version: format!("{GROUP}/{}", version.as_str()),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn string_attr(attrs: &Value, name: &str) -> Option<String> {
    [name.to_owned(), format!("{NVIDIA_DRIVER}/{name}")]
        .iter()
        .find_map(|k| attrs[k]["string"].as_str())
        .map(str::to_owned)
}

impl DeviceTaints {
    /// The client for `node` through the agent's client, with the request
    /// timeout of `settings`. Sends nothing yet.
    pub fn new(
        client: &KubeClient,
        node: &str,
        settings: &KubeSettings,
    ) -> Result<DeviceTaints, DeviceTaintError> {
        let client = client.client().cloned().ok_or(DeviceTaintError::DryRun)?;
        Ok(DeviceTaints::with_client(
            client,
            node,
            settings.api.request_timeout,
        ))
    }

    /// The client for `node` through `client` (`node-cleanup`'s), each
    /// request bounded by `timeout`.
    pub(crate) fn with_client(client: kube::Client, node: &str, timeout: Duration) -> DeviceTaints {
        DeviceTaints {
            client,
            node: node.to_owned(),
            timeout,
            served: tokio::sync::Mutex::new(None),
        }
    }

    async fn call<T>(
        &self,
        verb: &'static str,
        resource: &'static str,
        name: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, (ApiError, DeviceTaintError)> {
        let e = match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => ApiError::from_kube(e),
            Err(_) => ApiError::Transient(format!("no answer within {:?}", self.timeout)),
        };
        let mapped = match &e {
            ApiError::Forbidden(m) => DeviceTaintError::Forbidden {
                verb,
                resource,
                message: m.clone(),
            },
            ApiError::Rejected(m) => DeviceTaintError::Rejected {
                name: name.to_owned(),
                message: m.clone(),
            },
            other => DeviceTaintError::Api(format!("{verb} {resource} {name}: {other}")),
        };
        Err((e, mapped))
    }

    /// Asks the API server which versions serve DeviceTaintRules and
    /// ResourceSlices.
    async fn discover(&self) -> Result<Served, DeviceTaintError> {
        let groups = self
            .call("get", "discovery", "/apis", self.client.list_api_groups())
            .await
            .map_err(|(_, e)| e)?;
        let Some(group) = groups.groups.iter().find(|g| g.name == GROUP) else {
            return Ok(Served::default());
        };
        let mut served = Served::default();
        for v in DraVersion::ALL {
            if !group.versions.iter().any(|gv| gv.version == v.as_str()) {
                continue;
            }
            let gv = format!("{GROUP}/{}", v.as_str());
            let list = match self
                .call(
                    "get",
                    "discovery",
                    &gv,
                    self.client.list_api_group_resources(&gv),
                )
                .await
            {
                Ok(l) => l,
                // Gone between the two requests (an upgrade): not served.
                Err((ApiError::NotFound(_), _)) => continue,
                Err((_, e)) => return Err(e),
            };
            let has = |r: &str| list.resources.iter().any(|x| x.name == r);
            if served.rules.is_none() && has("devicetaintrules") {
                served.rules = Some(v);
            }
            // v1alpha3 ResourceSlices have another device shape; 1.33 on
            // serves them in v1beta2 too.
            if served.slices.is_none() && v != DraVersion::V1alpha3 && has("resourceslices") {
                served.slices = Some(v);
            }
        }
        Ok(served)
    }

    async fn served(&self, fresh: bool) -> Result<Served, DeviceTaintError> {
        let mut g = self.served.lock().await;
        if fresh || g.is_none() {
            *g = Some(self.discover().await?);
        }
        Ok(g.unwrap_or_default())
    }

    /// Makes the next request discover the versions again (a cluster
    /// upgraded, or a feature gate turned on, since the last discovery).
    pub async fn forget_versions(&self) {
        *self.served.lock().await = None;
    }

    /// The version serving DeviceTaintRules (discovered once, again after a
    /// 404); [`DeviceTaintError::Unavailable`] when none does.
    pub async fn version(&self) -> Result<DraVersion, DeviceTaintError> {
        self.served(false)
            .await?
            .rules
            .ok_or(DeviceTaintError::Unavailable)
    }

    async fn rules_api(&self, fresh: bool) -> Result<Rules, DeviceTaintError> {
        let v = self
            .served(fresh)
            .await?
            .rules
            .ok_or(DeviceTaintError::Unavailable)?;
        let ar = api_resource(v, "DeviceTaintRule", "devicetaintrules");
        Ok(Rules {
            api: Api::all_with(self.client.clone(), &ar),
            ar,
        })
    }

    /// This Node's devices of the NVIDIA DRA driver (empty when no version
    /// serves ResourceSlices or the driver publishes none).
    pub async fn devices(&self) -> Result<Vec<DraDevice>, DeviceTaintError> {
        let Some(v) = self.served(false).await?.slices else {
            return Ok(Vec::new());
        };
        let api: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &api_resource(v, "ResourceSlice", "resourceslices"),
        );
        let lp = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={NVIDIA_DRIVER}",
            self.node
        ));
        let list = match self.call("list", "resourceslices", "", api.list(&lp)).await {
            Ok(l) => l,
            Err((ApiError::NotFound(_), _)) => {
                self.served(true).await?;
                return Ok(Vec::new());
            }
            Err((_, e)) => return Err(e),
        };
        // A pool's slices of an older generation are outdated (the driver is
        // replacing them): only the newest generation counts.
        let mut newest: HashMap<String, i64> = HashMap::new();
        for s in &list.items {
            let pool = &s.data["spec"]["pool"];
            let name = pool["name"].as_str().unwrap_or("").to_owned();
            let gen_ = pool["generation"].as_i64().unwrap_or(0);
            let e = newest.entry(name).or_insert(gen_);
            *e = (*e).max(gen_);
        }
        let mut out = Vec::new();
        for s in &list.items {
            let spec = &s.data["spec"];
            let pool = spec["pool"]["name"].as_str().unwrap_or("");
            if newest.get(pool) != Some(&spec["pool"]["generation"].as_i64().unwrap_or(0)) {
                continue;
            }
            for d in spec["devices"].as_array().into_iter().flatten() {
                let attrs = &d["attributes"];
                let (Some(name), Some(uuid)) = (d["name"].as_str(), string_attr(attrs, "uuid"))
                else {
                    continue;
                };
                out.push(DraDevice {
                    driver: spec["driver"].as_str().unwrap_or(NVIDIA_DRIVER).to_owned(),
                    pool: pool.to_owned(),
                    name: name.to_owned(),
                    uuid,
                    parent_uuid: string_attr(attrs, "parentUUID"),
                });
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn node_selector(&self) -> String {
        format!("{NODE_LABEL}={}", label_value(&self.node))
    }

    fn existing(obj: DynamicObject) -> ExistingRule {
        ExistingRule {
            name: obj.metadata.name.clone().unwrap_or_default(),
            resource_version: obj.metadata.resource_version.clone().unwrap_or_default(),
            gpu_uuid: obj
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(GPU_UUID_LABEL))
                .cloned()
                .unwrap_or_default(),
            object: obj,
        }
    }

    /// This Node's rules (by [`NODE_LABEL`]).
    pub async fn rules(&self) -> Result<Vec<ExistingRule>, DeviceTaintError> {
        self.rules_matching(&self.node_selector()).await
    }

    /// The rules of every Node (any [`NODE_LABEL`]): what
    /// `node-cleanup --all-nodes` deletes.
    pub(crate) async fn every_nodes_rules(&self) -> Result<Vec<ExistingRule>, DeviceTaintError> {
        self.rules_matching(NODE_LABEL).await
    }

    async fn rules_matching(&self, selector: &str) -> Result<Vec<ExistingRule>, DeviceTaintError> {
        let lp = ListParams::default().labels(selector);
        let rules = self.rules_api(false).await?;
        let list = match self
            .call("list", "devicetaintrules", "", rules.api.list(&lp))
            .await
        {
            Ok(l) => l,
            // The version went away (an upgrade, a feature gate turned
            // off): discover again.
            Err((ApiError::NotFound(_), _)) => {
                let rules = self.rules_api(true).await?;
                self.call("list", "devicetaintrules", "", rules.api.list(&lp))
                    .await
                    .map_err(|(_, e)| e)?
            }
            Err((_, e)) => return Err(e),
        };
        Ok(list.items.into_iter().map(Self::existing).collect())
    }

    fn labels(&self, rule: &DesiredRule) -> BTreeMap<String, String> {
        BTreeMap::from([
            (NODE_LABEL.to_owned(), label_value(&self.node)),
            (GPU_UUID_LABEL.to_owned(), label_value(&rule.device.uuid)),
        ])
    }

    fn selector(rule: &DesiredRule) -> Value {
        json!({"driver": rule.device.driver, "pool": rule.device.pool, "device": rule.device.name})
    }

    /// Whether `obj` is `rule` as wanted (`timeAdded` is the server's).
    fn matches(&self, obj: &DynamicObject, rule: &DesiredRule) -> bool {
        let labels = obj.metadata.labels.clone().unwrap_or_default();
        let t = &obj.data["spec"]["taint"];
        self.labels(rule)
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && obj.data["spec"]["deviceSelector"] == Self::selector(rule)
            && t["key"] == rule.key.as_str()
            && t["value"] == rule.value.as_str()
            && t["effect"] == rule.effect.as_str()
    }

    fn object(&self, ar: &ApiResource, rule: &DesiredRule) -> DynamicObject {
        let mut o = DynamicObject::new(&rule.name, ar);
        o.metadata.labels = Some(self.labels(rule));
        o.metadata.annotations = Some(BTreeMap::from([(
            NODE_ANNOTATION.to_owned(),
            self.node.clone(),
        )]));
        o.data = json!({"spec": {
            "deviceSelector": Self::selector(rule),
            "taint": {"key": rule.key, "value": rule.value, "effect": rule.effect},
        }});
        o
    }

    async fn create(
        &self,
        rules: &Rules,
        rule: &DesiredRule,
    ) -> Result<DynamicObject, (ApiError, DeviceTaintError)> {
        let o = self.object(&rules.ar, rule);
        self.call(
            "create",
            "devicetaintrules",
            &rule.name,
            rules.api.create(&PostParams::default(), &o),
        )
        .await
    }

    async fn delete_named(&self, rules: &Rules, name: &str) -> Result<bool, DeviceTaintError> {
        match self
            .call(
                "delete",
                "devicetaintrules",
                name,
                rules.api.delete(name, &DeleteParams::default()),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err((ApiError::NotFound(_), _)) => Ok(false),
            Err((_, e)) => Err(e),
        }
    }

    /// Brings the live `obj` to `rule`: nothing when it is as wanted; a
    /// different card's rule (UUID label) is deleted and created again;
    /// otherwise updated with its resourceVersion.
    async fn converge(
        &self,
        rules: &Rules,
        obj: DynamicObject,
        rule: &DesiredRule,
    ) -> Result<Ensured, (ApiError, DeviceTaintError)> {
        if self.matches(&obj, rule) {
            return Ok(Ensured::Unchanged);
        }
        let live_uuid = obj
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(GPU_UUID_LABEL))
            .cloned();
        if live_uuid.is_some_and(|u| u != label_value(&rule.device.uuid)) {
            self.delete_named(rules, &rule.name)
                .await
                .map_err(|e| (ApiError::Transient(e.to_string()), e))?;
            self.create(rules, rule).await?;
            return Ok(Ensured::Replaced);
        }
        let mut want = self.object(&rules.ar, rule);
        want.types = obj.types.clone();
        want.metadata = obj.metadata.clone();
        let mut labels = want.metadata.labels.take().unwrap_or_default();
        labels.extend(self.labels(rule));
        want.metadata.labels = Some(labels);
        let mut annotations = want.metadata.annotations.take().unwrap_or_default();
        annotations.insert(NODE_ANNOTATION.to_owned(), self.node.clone());
        want.metadata.annotations = Some(annotations);
        // The same taint keeps the time it was added; a changed one gets a
        // new time from the server.
        let old = &obj.data["spec"]["taint"];
        if old["key"] == rule.key.as_str()
            && old["value"] == rule.value.as_str()
            && old["effect"] == rule.effect.as_str()
            && !old["timeAdded"].is_null()
        {
            want.data["spec"]["taint"]["timeAdded"] = old["timeAdded"].clone();
        }
        self.call(
            "update",
            "devicetaintrules",
            &rule.name,
            rules.api.replace(&rule.name, &PostParams::default(), &want),
        )
        .await?;
        Ok(Ensured::Updated)
    }

    /// Creates `rule`, or adopts the rule of that name: read and brought to
    /// `rule` (a race lost to another writer re-reads and retries).
    pub async fn ensure(&self, rule: &DesiredRule) -> Result<Ensured, DeviceTaintError> {
        let rules = self.rules_api(false).await?;
        let rules = match self.create(&rules, rule).await {
            Ok(_) => return Ok(Ensured::Created),
            Err((ApiError::AlreadyExists(_), _)) => rules,
            // The version went away: discover again.
            Err((ApiError::NotFound(_), _)) => {
                let rules = self.rules_api(true).await?;
                match self.create(&rules, rule).await {
                    Ok(_) => return Ok(Ensured::Created),
                    Err((ApiError::AlreadyExists(_), _)) => rules,
                    Err((_, e)) => return Err(e),
                }
            }
            Err((_, e)) => return Err(e),
        };
        self.adopt(&rules, rule, None).await
    }

    /// Reads the rule (unless `live` is given) and converges it, retrying a
    /// lost race.
    async fn adopt(
        &self,
        rules: &Rules,
        rule: &DesiredRule,
        mut live: Option<DynamicObject>,
    ) -> Result<Ensured, DeviceTaintError> {
        let mut last = None;
        for _ in 0..RACE_TRIES {
            let obj = match live.take() {
                Some(o) => o,
                None => match self
                    .call(
                        "get",
                        "devicetaintrules",
                        &rule.name,
                        rules.api.get_opt(&rule.name),
                    )
                    .await
                    .map_err(|(_, e)| e)?
                {
                    Some(o) => o,
                    // Deleted meanwhile: create it.
                    None => match self.create(rules, rule).await {
                        Ok(_) => return Ok(Ensured::Created),
                        Err((ApiError::AlreadyExists(_), e)) => {
                            last = Some(e);
                            continue;
                        }
                        Err((_, e)) => return Err(e),
                    },
                },
            };
            match self.converge(rules, obj, rule).await {
                Ok(done) => return Ok(done),
                Err((ApiError::Conflict(_) | ApiError::NotFound(_), e)) => last = Some(e),
                Err((_, e)) => return Err(e),
            }
        }
        Err(DeviceTaintError::Api(format!(
            "DeviceTaintRule {:?}: lost {RACE_TRIES} races to other writers{}",
            rule.name,
            last.map(|e| format!(" (last: {e})")).unwrap_or_default()
        )))
    }

    /// Deletes the rule `name`; `false` when there was none.
    pub async fn remove(&self, name: &str) -> Result<bool, DeviceTaintError> {
        let rules = self.rules_api(false).await?;
        self.delete_named(&rules, name).await
    }

    /// Converges this Node's rules to `desired`: creates the missing ones,
    /// updates changed ones, replaces those of another card, deletes the
    /// ones no longer wanted. Nothing is written when they already match.
    pub async fn reconcile(
        &self,
        desired: &[DesiredRule],
    ) -> Result<ReconcileReport, DeviceTaintError> {
        let existing = self.rules().await?;
        let rules = self.rules_api(false).await?;
        let mut report = ReconcileReport::default();
        let mut live: BTreeMap<String, ExistingRule> =
            existing.into_iter().map(|r| (r.name.clone(), r)).collect();
        for rule in desired {
            let done = match live.remove(&rule.name) {
                Some(e) => self.adopt(&rules, rule, Some(e.object)).await?,
                None => self.ensure(rule).await?,
            };
            let list = match done {
                Ensured::Created => &mut report.created,
                Ensured::Updated => &mut report.updated,
                Ensured::Replaced => &mut report.replaced,
                Ensured::Unchanged => &mut report.unchanged,
            };
            list.push(rule.name.clone());
        }
        for name in live.into_keys() {
            if self.delete_named(&rules, &name).await? {
                report.deleted.push(name);
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_are_deterministic_and_valid() {
        assert_eq!(rule_name("node-a", "gpu-0"), "gpuwatch-node-a-gpu-0");
        assert_eq!(
            rule_name("ip-10-0-0-1.ec2.internal", "gpu-1-mig-1g.10gb-9-0"),
            "gpuwatch-ip-10-0-0-1.ec2.internal-gpu-1-mig-1g.10gb-9-0"
        );
        let long = "n".repeat(250);
        let a = rule_name(&long, "gpu-0");
        let b = rule_name(&long, "gpu-1");
        assert!(a.len() <= 253 && b.len() <= 253, "{}", a.len());
        assert_ne!(a, b);
        assert_eq!(a, rule_name(&long, "gpu-0"));
        let odd = rule_name("Node_A", "gpu-0");
        assert!(odd.starts_with("gpuwatch-node-a-gpu-0-"), "{odd}");
        for n in [&a, &b, &odd] {
            assert!(
                n.split('.').all(|l| !l.is_empty()
                    && l.bytes()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')),
                "{n}"
            );
        }
        assert_eq!(label_value("node-a"), "node-a");
        assert!(label_value(&long).starts_with("h-"));
    }
}
