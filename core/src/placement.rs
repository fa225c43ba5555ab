//! Where pods run on this node, as the engine knows it: the pods bound to the
//! node (from the API server) and the GPUs and MIG devices each container
//! holds (from the kubelet's PodResources API). Both are read at the edge by
//! their own tasks and sent to the engine as [`crate::msg::Input::Placement`]; the
//! engine only looks them up when it names the pods of a fault, so it never
//! waits on the network.

use gpuwatch_proto::{PodRef, PodRole};
use std::collections::HashMap;
use std::sync::Arc;

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
}

/// The pods bound to this node, by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDirectory {
    /// By `metadata.uid`.
    pub by_uid: HashMap<String, PodInfo>,
}

impl PodDirectory {
    /// A directory of `pods`.
    pub fn new(pods: impl IntoIterator<Item = PodInfo>) -> PodDirectory {
        PodDirectory {
            by_uid: pods.into_iter().map(|p| (p.uid.clone(), p)).collect(),
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

/// Device id (a GPU UUID, or a MIG device UUID) to the containers that hold it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceHolders {
    /// By device id as the device plugin reported it.
    pub by_device: HashMap<String, Vec<DeviceHolder>>,
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
}

/// What the engine knows of the node's pods and their devices.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pods: Option<Arc<PodDirectory>>,
    pods_note: Option<String>,
    devices: Option<Arc<DeviceHolders>>,
    devices_note: Option<String>,
}

/// The attribute saying what placement could not tell about a fault's pods.
pub const PLACEMENT_NOTE: &str = "pod_placement";

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
        }
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
                let uid = self
                    .pods
                    .as_deref()
                    .and_then(|p| p.by_name(&h.namespace, &h.pod))
                    .map(|p| p.uid.clone())
                    .unwrap_or_default();
                let mut p = PodRef {
                    uid,
                    name: h.pod.clone(),
                    namespace: h.namespace.clone(),
                    container: h.container.clone(),
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
