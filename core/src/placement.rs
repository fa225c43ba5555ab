//! Where pods run on this node, as the engine knows it: the pods bound to the
//! node (from the API server) and the GPUs and MIG devices each container
//! holds (from the kubelet's PodResources API). Both are read at the edge by
//! their own tasks and sent to the engine as [`crate::msg::Input::Placement`]; the
//! engine only looks them up when it names the pods of a fault, so it never
//! waits on the network.

use gpuwatch_proto::{PodRef, PodRole};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// A pod bound to this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// (runtime container id without its `<runtime>://` prefix, container
    /// name) from `status.containerStatuses` and `initContainerStatuses`.
    pub containers: Vec<(String, String)>,
    /// The owner reference with `controller: true`: (kind, name).
    pub controller: Option<(String, String)>,
}

/// The pods bound to this node, by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDirectory {
    /// By `metadata.uid`.
    pub by_uid: HashMap<String, PodInfo>,
    /// UIDs of pods deleted from the node lately (the listing keeps a bounded
    /// number): a fault of a process of one is said to be of a gone pod.
    pub gone: HashSet<String>,
}

impl PodDirectory {
    /// A directory of `pods`.
    pub fn new(pods: impl IntoIterator<Item = PodInfo>) -> PodDirectory {
        PodDirectory {
            by_uid: pods.into_iter().map(|p| (p.uid.clone(), p)).collect(),
            gone: HashSet::new(),
        }
    }

    /// The pod with this namespace and name.
    pub fn by_name(&self, namespace: &str, name: &str) -> Option<&PodInfo> {
        self.by_uid
            .values()
            .find(|p| p.namespace == namespace && p.name == name)
    }
}

/// A container that holds a device, as the kubelet lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceHolder {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The extended resource (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`).
    pub resource: String,
}

/// The device (a GPU UUID, or a MIG device) to the containers that hold
/// it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceHolders {
    /// By [`DeviceShape::key`] of the device id the device plugin reported.
    pub by_device: HashMap<String, Vec<DeviceHolder>>,
    /// Device ids under a GPU resource whose shape is none of
    /// [`DeviceShape`]'s (skipped; a fault of their GPU cannot name them).
    pub unknown_ids: u64,
}

/// What a device id the NVIDIA device plugin gave the kubelet names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceShape {
    /// `GPU-<uuid>`: a whole GPU, its NVML UUID.
    Gpu(String),
    /// `GPU-<uuid>::<n>`: replica `n` of a GPU shared by time-slicing or
    /// MPS.
    GpuReplica(String, u32),
    /// `MIG-<uuid>`: a MIG device by its own NVML UUID (R470 drivers and
    /// later); also `MIG-<uuid>::<n>`, a replica of one.
    Mig(String),
    /// `MIG-GPU-<uuid>/<gi>/<ci>`: a MIG device named by its GPU's UUID and
    /// its GPU and compute instance ids (the MIG UUID of R450/R460 drivers).
    MigOfGpu {
        /// The GPU's UUID (`GPU-…`).
        gpu: String,
        /// GPU instance id.
        gi: u32,
        /// Compute instance id.
        ci: u32,
    },
}

impl DeviceShape {
    /// Reads a device id; `None` for any other shape (an index under the
    /// device plugin's `deviceIDStrategy: index`, another vendor's id).
    pub fn parse(id: &str) -> Option<DeviceShape> {
        let (base, replica) = match id.rsplit_once("::") {
            Some((b, n)) => (b, Some(n.parse::<u32>().ok()?)),
            None => (id, None),
        };
        if let Some(rest) = base.strip_prefix("MIG-GPU-") {
            let mut parts = rest.split('/');
            let gpu = parts.next().filter(|u| is_uuid(u))?;
            let gi = parts.next()?.parse().ok()?;
            let ci = parts.next()?.parse().ok()?;
            return (parts.next().is_none() && replica.is_none()).then(|| DeviceShape::MigOfGpu {
                gpu: format!("GPU-{gpu}"),
                gi,
                ci,
            });
        }
        if let Some(u) = base.strip_prefix("MIG-") {
            return is_uuid(u).then(|| DeviceShape::Mig(base.to_owned()));
        }
        let u = base.strip_prefix("GPU-")?;
        if !is_uuid(u) {
            return None;
        }
        Some(match replica {
            Some(n) => DeviceShape::GpuReplica(base.to_owned(), n),
            None => DeviceShape::Gpu(base.to_owned()),
        })
    }

    /// The key the engine looks a device up by: the GPU UUID for a whole GPU
    /// and its replicas, the MIG UUID, or `<GPU UUID>/<gi>/<ci>`.
    pub fn key(&self) -> String {
        match self {
            DeviceShape::Gpu(u) | DeviceShape::GpuReplica(u, _) | DeviceShape::Mig(u) => u.clone(),
            DeviceShape::MigOfGpu { gpu, gi, ci } => mig_of_gpu_key(gpu, *gi, *ci),
        }
    }
}

/// The [`DeviceShape::key`] of a MIG device named by its GPU and instances.
pub fn mig_of_gpu_key(gpu_uuid: &str, gi: u32, ci: u32) -> String {
    format!("{gpu_uuid}/{gi}/{ci}")
}

/// An NVML UUID after its `GPU-`/`MIG-` prefix: hex digits in the
/// `8-4-4-4-12` groups NVML prints.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The extended resources whose device ids are GPUs: a name, or a prefix
/// ending in `*` (`nvidia.com/mig-*`).
pub fn is_gpu_resource(resource: &str, names: &[String]) -> bool {
    names.iter().any(|n| match n.strip_suffix('*') {
        Some(prefix) => resource.starts_with(prefix),
        None => resource == n,
    })
}

/// One placement source's news for the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementUpdate {
    /// The pods bound to the node now (a full listing, after every change).
    Pods(Arc<PodDirectory>),
    /// The pod listing cannot be kept current (API server down, RBAC): what
    /// the engine has may be stale, and new pods are known by UID only.
    PodsUnavailable(String),
    /// The kubelet's device assignments now.
    Devices(Arc<DeviceHolders>),
    /// The kubelet cannot be asked (no socket, an error).
    DevicesUnavailable(String),
    /// The pod listing the engine has is current as of this instant: a list
    /// of the node's pods sent then (and every change it showed) has
    /// reached the engine, so a pod it does not know did not exist then.
    PodsCurrent(Instant),
    /// The device assignments the engine has are current as of this
    /// instant: the kubelet answered a `List` sent then.
    DevicesCurrent(Instant),
}

/// What the engine knows of the node's pods and their devices.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pods: Option<Arc<PodDirectory>>,
    pods_note: Option<String>,
    /// When the last list of the node's pods the engine has seen was sent.
    pods_current: Option<Instant>,
    devices: Option<Arc<DeviceHolders>>,
    devices_note: Option<String>,
    /// When the last `List` whose answer the engine has was sent.
    devices_current: Option<Instant>,
}

/// The attribute saying what placement could not tell about a fault's pods.
pub const PLACEMENT_NOTE: &str = "pod_placement";
/// The attribute saying why a fault names a pod by UID only, or no pods:
/// `pod_gone` (the pod was deleted before its fault was read),
/// `pod_resources_unavailable` (the kubelet could not say which pods hold
/// the GPU); the edge adds `not_in_pod`, `process_exited`, `pid_reused`,
/// `unreadable`.
pub const POD_ATTRIBUTION: &str = "pod_attribution";

impl Placement {
    /// Applies one source's update. A source that becomes unavailable keeps
    /// its last listing (a pod that faults is still likely the one listed),
    /// with the note saying it may be stale.
    pub fn apply(&mut self, u: PlacementUpdate) {
        match u {
            PlacementUpdate::Pods(d) => {
                self.pods = Some(d);
                self.pods_note = None;
            }
            PlacementUpdate::PodsUnavailable(why) => self.pods_note = Some(why),
            PlacementUpdate::Devices(d) => {
                self.devices = Some(d);
                self.devices_note = None;
            }
            PlacementUpdate::DevicesUnavailable(why) => self.devices_note = Some(why),
            PlacementUpdate::PodsCurrent(at) => {
                self.pods_current = self.pods_current.max(Some(at));
            }
            PlacementUpdate::DevicesCurrent(at) => {
                self.devices_current = self.devices_current.max(Some(at));
            }
        }
    }

    /// Drops the note of the pod listing (`pods`) or of the device
    /// assignments when it is `note` (one the source did not replace).
    pub fn clear_note(&mut self, pods: bool, note: &str) {
        let slot = if pods {
            &mut self.pods_note
        } else {
            &mut self.devices_note
        };
        if slot.as_deref() == Some(note) {
            *slot = None;
        }
    }

    /// True when a listing of the node's pods sent after `read_at` could
    /// still name a pod of `pods` known by UID only: the listing works, has
    /// not been current since `read_at`, and the pod is neither listed nor
    /// gone (a pod that started a moment before its fault).
    pub fn pods_behind(&self, pods: &[PodRef], read_at: Instant) -> bool {
        if self.pods_note.is_some() || self.pods_current.is_some_and(|t| t >= read_at) {
            return false;
        }
        let dir = self.pods.as_deref();
        pods.iter().any(|p| {
            p.name.is_empty()
                && !p.uid.is_empty()
                && dir.is_none_or(|d| !d.by_uid.contains_key(&p.uid) && !d.gone.contains(&p.uid))
        })
    }

    /// True when a `List` sent after `read_at` could name pods on a GPU that
    /// the engine's device assignments do not: the kubelet answers and has
    /// not been asked since `read_at` (a pod placed on the GPU a moment
    /// before its fault).
    pub fn devices_behind(&self, read_at: Instant) -> bool {
        self.devices_note.is_none() && self.devices_current.is_none_or(|t| t < read_at)
    }

    /// Fills the name, namespace and container name of every pod `pods`
    /// knows by UID only; returns a note when some could not be.
    pub fn name_known_pods(&self, pods: &mut [PodRef]) -> Option<String> {
        let mut unnamed = false;
        for p in pods.iter_mut().filter(|p| p.name.is_empty()) {
            let Some(info) = self.pods.as_deref().and_then(|d| d.by_uid.get(&p.uid)) else {
                unnamed = true;
                continue;
            };
            p.name.clone_from(&info.name);
            p.namespace.clone_from(&info.namespace);
            if let Some((kind, name)) = &info.controller {
                p.controller_kind.clone_from(kind);
                p.controller_name.clone_from(name);
            }
            if p.container.is_empty()
                && let Some((_, c)) = info
                    .containers
                    .iter()
                    .find(|(id, _)| !p.container_id.is_empty() && *id == p.container_id)
            {
                p.container.clone_from(c);
            }
        }
        if !unnamed {
            return None;
        }
        Some(match (&self.pods, &self.pods_note) {
            (None, None) => "pod UID only: the node's pods are not listed yet".to_owned(),
            (_, Some(why)) => format!("pod UID only: cannot list the node's pods ({why})"),
            (Some(_), None) => "pod UID only: the pod is not among the node's pods".to_owned(),
        })
    }

    /// True when a pod of `pods` known by UID only was deleted from the node
    /// lately.
    pub fn names_a_gone_pod(&self, pods: &[PodRef]) -> bool {
        let Some(d) = self.pods.as_deref() else {
            return false;
        };
        pods.iter()
            .any(|p| p.name.is_empty() && !p.uid.is_empty() && d.gone.contains(&p.uid))
    }

    /// True when the kubelet's device assignments are not known now (never
    /// listed, or its last call failed).
    pub fn devices_unavailable(&self) -> bool {
        self.devices.is_none() || self.devices_note.is_some()
    }

    /// Adds every container that holds one of `devices` to `pods` as
    /// [`PodRole::Affected`] (once per pod and container; a pod already named
    /// is not repeated); returns a note when the kubelet could not be asked.
    pub fn add_holders(&self, devices: &[&str], pods: &mut Vec<PodRef>) -> Option<String> {
        let Some(holders) = self.devices.as_deref() else {
            return Some(match &self.devices_note {
                Some(why) => format!("pods on the GPU unknown: {why}"),
                None => "pods on the GPU unknown: the kubelet was not asked yet".to_owned(),
            });
        };
        for d in devices {
            for h in holders.by_device.get(*d).into_iter().flatten() {
                let named = pods
                    .iter()
                    .any(|p| p.namespace == h.namespace && p.name == h.pod);
                if named {
                    continue;
                }
                let info = self
                    .pods
                    .as_deref()
                    .and_then(|p| p.by_name(&h.namespace, &h.pod));
                let (kind, controller) =
                    info.and_then(|p| p.controller.clone()).unwrap_or_default();
                let mut p = PodRef {
                    uid: info.map(|p| p.uid.clone()).unwrap_or_default(),
                    name: h.pod.clone(),
                    namespace: h.namespace.clone(),
                    container: h.container.clone(),
                    controller_kind: kind,
                    controller_name: controller,
                    ..Default::default()
                };
                p.set_role(PodRole::Affected);
                pods.push(p);
            }
        }
        self.devices_note
            .as_ref()
            .map(|why| format!("pods on the GPU from an earlier listing: {why}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caused(uid: &str, container_id: &str) -> PodRef {
        let mut p = PodRef {
            uid: uid.into(),
            container_id: container_id.into(),
            ..Default::default()
        };
        p.set_role(PodRole::Caused);
        p
    }

    fn directory() -> Arc<PodDirectory> {
        Arc::new(PodDirectory::new([PodInfo {
            uid: "u1".into(),
            name: "trainer-0".into(),
            namespace: "ml".into(),
            containers: vec![
                ("c1".into(), "main".into()),
                ("c2".into(), "sidecar".into()),
            ],
            controller: Some(("Job".into(), "train-42".into())),
        }]))
    }

    #[test]
    fn a_pid_pod_gets_its_name_namespace_and_container() {
        let mut pl = Placement::default();
        pl.apply(PlacementUpdate::Pods(directory()));
        let mut pods = vec![caused("u1", "c2")];
        assert_eq!(pl.name_known_pods(&mut pods), None);
        assert_eq!(
            (
                pods[0].name.as_str(),
                pods[0].namespace.as_str(),
                pods[0].container.as_str()
            ),
            ("trainer-0", "ml", "sidecar")
        );
        assert_eq!(
            (
                pods[0].controller_kind.as_str(),
                pods[0].controller_name.as_str()
            ),
            ("Job", "train-42")
        );
    }

    #[test]
    fn a_pod_deleted_before_its_fault_is_said_to_be_gone() {
        let mut pl = Placement::default();
        let mut d = (*directory()).clone();
        d.gone.insert("u7".into());
        pl.apply(PlacementUpdate::Pods(Arc::new(d)));
        let mut pods = vec![caused("u7", "c9")];
        assert!(pl.name_known_pods(&mut pods).is_some());
        assert!(pl.names_a_gone_pod(&pods));
        assert!(!pl.names_a_gone_pod(&[caused("u8", "")]));
    }

    /// Every device id shape the NVIDIA device plugin (github.com/NVIDIA/
    /// k8s-device-plugin) hands the kubelet, and where it comes from:
    /// - `GPU-<uuid>`: a full GPU's NVML UUID, the default
    ///   `deviceIDStrategy: uuid` (`internal/rm/nvml_devices.go`, the
    ///   device's `GetUUID`).
    /// - `GPU-<uuid>::<n>`: replica `n` of a shared GPU, time-slicing or MPS
    ///   (`internal/rm/devices.go`, `NewAnnotatedID`: `"%s::%d"`).
    /// - `MIG-<uuid>`: a MIG device's NVML UUID, R470 drivers and later
    ///   (`internal/rm/nvml_devices.go`, the MIG device's `GetUUID`), under
    ///   `nvidia.com/mig-<profile>` (mixed strategy) or `nvidia.com/gpu`
    ///   (single strategy).
    /// - `MIG-GPU-<uuid>/<gi>/<ci>`: the MIG UUID R450/R460 drivers returned,
    ///   passed through the same way.
    /// - `0`, `0:1`: `deviceIDStrategy: index` (`internal/rm/nvml_devices.go`,
    ///   the index); not a shape a GPU's identity can be matched to: skipped
    ///   and counted.
    #[test]
    fn device_id_shapes_name_their_gpu_or_mig_device() {
        let u = "6b1c2d3e-4f50-4a61-8b72-93a4b5c6d7e1";
        let gpu = format!("GPU-{u}");
        let mig = "MIG-1d2c3b4a-5f6e-5a7b-8c9d-0e1f2a3b4c05";
        for (id, shape) in [
            (gpu.clone(), Some(DeviceShape::Gpu(gpu.clone()))),
            (
                format!("{gpu}::3"),
                Some(DeviceShape::GpuReplica(gpu.clone(), 3)),
            ),
            (mig.to_owned(), Some(DeviceShape::Mig(mig.to_owned()))),
            (format!("{mig}::1"), Some(DeviceShape::Mig(mig.to_owned()))),
            (
                format!("MIG-GPU-{u}/5/0"),
                Some(DeviceShape::MigOfGpu {
                    gpu: gpu.clone(),
                    gi: 5,
                    ci: 0,
                }),
            ),
            ("0".to_owned(), None),
            ("0:1".to_owned(), None),
            (format!("{gpu}::x"), None),
            (format!("MIG-GPU-{u}/5"), None),
            (format!("MIG-GPU-{u}/5/0/1"), None),
            ("GPU-not-a-uuid".to_owned(), None),
            ("/dev/infiniband/uverbs0".to_owned(), None),
        ] {
            assert_eq!(DeviceShape::parse(&id), shape, "{id}");
        }
        // The keys the engine looks a fault's GPU up by.
        assert_eq!(DeviceShape::parse(&format!("{gpu}::3")).unwrap().key(), gpu);
        assert_eq!(
            DeviceShape::parse(&format!("MIG-GPU-{u}/5/0"))
                .unwrap()
                .key(),
            mig_of_gpu_key(&gpu, 5, 0)
        );
    }

    #[test]
    fn gpu_resources_are_names_or_prefixes() {
        let names = vec![
            "nvidia.com/gpu".to_owned(),
            "nvidia.com/mig-*".to_owned(),
            "nvidia.com/gpu.shared".to_owned(),
        ];
        for (resource, gpu) in [
            ("nvidia.com/gpu", true),
            ("nvidia.com/mig-1g.10gb", true),
            ("nvidia.com/gpu.shared", true),
            ("nvidia.com/gpu-other", false),
            ("rdma/hca", false),
        ] {
            assert_eq!(is_gpu_resource(resource, &names), gpu, "{resource}");
        }
    }

    #[test]
    fn a_listing_is_behind_a_fault_until_one_sent_after_it_arrives() {
        let before = Instant::now();
        let read_at = before + std::time::Duration::from_millis(5);
        let after = read_at + std::time::Duration::from_millis(5);
        let mut pl = Placement::default();
        let unknown = [caused("u9", "")];
        // Never listed yet: the first listing may name it.
        assert!(pl.pods_behind(&unknown, read_at));
        assert!(pl.devices_behind(read_at));
        pl.apply(PlacementUpdate::Pods(directory()));
        pl.apply(PlacementUpdate::PodsCurrent(before));
        assert!(pl.pods_behind(&unknown, read_at));
        // A pod the listing knows, or knows to be gone, needs nothing more.
        let mut named = [caused("u1", "")];
        assert!(!pl.pods_behind(&named, read_at));
        named[0].name = "x".into();
        assert!(!pl.pods_behind(&named, read_at));
        let mut d = (*directory()).clone();
        d.gone.insert("u7".into());
        pl.apply(PlacementUpdate::Pods(Arc::new(d)));
        assert!(!pl.pods_behind(&[caused("u7", "")], read_at));
        // A listing sent after the fault was read settles it.
        pl.apply(PlacementUpdate::PodsCurrent(after));
        assert!(!pl.pods_behind(&unknown, read_at));
        // An older "current" never moves the mark back.
        pl.apply(PlacementUpdate::PodsCurrent(before));
        assert!(!pl.pods_behind(&unknown, read_at));
        // A listing that does not work has nothing coming.
        let mut down = Placement::default();
        down.apply(PlacementUpdate::PodsUnavailable("503".into()));
        assert!(!down.pods_behind(&unknown, read_at));

        pl.apply(PlacementUpdate::DevicesCurrent(before));
        assert!(pl.devices_behind(read_at));
        pl.apply(PlacementUpdate::DevicesCurrent(after));
        assert!(!pl.devices_behind(read_at));
        let mut gone = Placement::default();
        gone.apply(PlacementUpdate::DevicesUnavailable("no socket".into()));
        assert!(!gone.devices_behind(read_at));
    }

    #[test]
    fn an_unlisted_pod_is_said_to_be_known_by_uid_only() {
        let mut pl = Placement::default();
        let mut pods = vec![caused("u9", "")];
        assert!(
            pl.name_known_pods(&mut pods)
                .unwrap()
                .contains("not listed yet")
        );
        pl.apply(PlacementUpdate::Pods(directory()));
        assert!(
            pl.name_known_pods(&mut pods)
                .unwrap()
                .contains("not among the node's pods")
        );
        pl.apply(PlacementUpdate::PodsUnavailable("403 Forbidden".into()));
        assert!(pl.name_known_pods(&mut pods).unwrap().contains("403"));
        assert!(pods[0].name.is_empty());
    }

    #[test]
    fn holders_of_a_device_are_added_once_with_their_uid() {
        let mut pl = Placement::default();
        let mut pods = Vec::new();
        assert!(pl.add_holders(&["GPU-1"], &mut pods).is_some());
        pl.apply(PlacementUpdate::Pods(directory()));
        let holder = DeviceHolder {
            namespace: "ml".into(),
            pod: "trainer-0".into(),
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
        };
        pl.apply(PlacementUpdate::Devices(Arc::new(DeviceHolders {
            by_device: HashMap::from([
                ("GPU-1".into(), vec![holder.clone()]),
                ("MIG-2".into(), vec![holder]),
            ]),
            unknown_ids: 0,
        })));
        assert_eq!(
            pl.add_holders(&["GPU-1", "MIG-2", "GPU-3"], &mut pods),
            None
        );
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].uid, "u1");
        assert_eq!(pods[0].role(), PodRole::Affected);
        pl.apply(PlacementUpdate::DevicesUnavailable("socket gone".into()));
        let mut again = Vec::new();
        let note = pl.add_holders(&["GPU-1"], &mut again).unwrap();
        assert!(note.contains("earlier listing"), "{note}");
        assert_eq!(again.len(), 1);
    }
}
