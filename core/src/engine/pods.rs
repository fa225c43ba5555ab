//! The pods of a fault, and faults contained to one MIG GPU instance.
//!
//! A fault names the pod whose process the kernel line names (the edge read
//! its UID and container id from the pid's cgroup; the engine adds the name,
//! namespace and container name from the node's pod listing) and, for a fault
//! of the GPU itself (one whose action isolates the node), every pod that
//! holds the GPU or one of its MIG devices, from the kubelet's device
//! assignments. A fault contained to one GPU instance that names no process
//! names the pods of that instance.
//!
//! A fault is contained to a GPU instance when the kernel line names the
//! instance (`GPU-I:05`) and the policy asks for no more than restarting the
//! application: it marks that instance only, and the GPU's verdict (and the
//! node's) stays what its other faults make it. A fault that isolates the node
//! (uncontained ECC, a lost GPU) hits the whole GPU and every instance on it,
//! even when the line names an instance.

use super::Engine;
use super::model::{FaultKey, GPU_INSTANCE, Gpu, contained, key_instance};
use super::model::{Holder, fault_in};
use super::placement_wait::{Needs, Waiting};
use crate::placement::{PLACEMENT_NOTE, POD_ATTRIBUTION, mig_of_gpu_key};
use gpuwatch_proto::{
    Action, FaultEvent, MigDevice, MigInstanceHealth, PodRef, PodRole, ShortName, Verdict,
};
use std::time::Instant;

/// The attribute of a MIG compute instance id (the parser's name).
const COMPUTE_INSTANCE: &str = "compute_instance";
/// The attribute naming the MIG device UUID of the instance an event names.
pub(super) const MIG_UUID: &str = "mig_uuid";

/// The MIG device of `g` (its latest sample's) with GPU instance `gi` and,
/// when given, compute instance `ci` (a GPU instance split into compute
/// instances has one MIG device per compute instance; without `ci` the
/// first).
pub(super) fn mig_device(g: &Gpu, gi: u32, ci: Option<u32>) -> Option<&MigDevice> {
    g.sample
        .iter()
        .flat_map(|s| &s.mig_devices)
        .filter(|m| !m.uuid.is_empty())
        .find(|m| m.gpu_instance == gi && ci.is_none_or(|ci| m.compute_instance == ci))
}

/// Pods kept per active fault (a fault of a GPU shared by many small pods
/// still has a bounded health listing).
const MAX_PODS_PER_FAULT: usize = 32;

/// Merges `new` into a fault's pods: the latest first, each pod once,
/// bounded.
pub(super) fn merge_pods(kept: &mut Vec<PodRef>, new: &[PodRef]) {
    if new.is_empty() {
        return;
    }
    let same = |a: &PodRef, b: &PodRef| {
        a.role == b.role
            && if a.uid.is_empty() || b.uid.is_empty() {
                a.namespace == b.namespace && a.name == b.name
            } else {
                a.uid == b.uid
            }
    };
    kept.retain(|p| !new.iter().any(|n| same(p, n)));
    let mut merged = new.to_vec();
    merged.append(kept);
    merged.truncate(MAX_PODS_PER_FAULT);
    *kept = merged;
}

/// Adds the MIG device UUID of the instance `ev` names ([`MIG_UUID`]), from
/// the GPU's latest MIG devices.
fn name_instance(ev: &mut FaultEvent, gpu: Option<&Gpu>) {
    let id = |k: &str| ev.attributes.get(k).and_then(|v| v.parse::<u32>().ok());
    let (Some(g), Some(gi)) = (gpu, id(GPU_INSTANCE)) else {
        return;
    };
    if let Some(m) = mig_device(g, gi, id(COMPUTE_INSTANCE)) {
        let uuid = m.uuid.clone();
        ev.attributes.insert(MIG_UUID.to_owned(), uuid);
    }
}

impl Engine {
    /// The device keys whose holders a fault of `ev` on `gpu` hits (module
    /// doc): every key a device plugin may have named the GPU or its MIG
    /// devices by (`DeviceShape::key`); empty when it names no holders.
    fn devices_hit(ev: &FaultEvent, gpu: Option<&Gpu>) -> Vec<String> {
        let instance = ev
            .attributes
            .get(GPU_INSTANCE)
            .and_then(|v| v.parse::<u32>().ok());
        let whole = ev.action().needs_isolation();
        let mut devices: Vec<String> = Vec::new();
        let Some(g) = gpu else {
            return devices;
        };
        // The pods the kernel line's process names, not the holders an
        // earlier naming added.
        let no_process = ev.pods.iter().all(|p| p.role() == PodRole::Affected);
        if !(whole || (instance.is_some() && no_process)) {
            return devices;
        }
        if whole && !g.uuid.is_empty() {
            devices.push(g.uuid.clone());
        }
        for m in g.sample.iter().flat_map(|s| &s.mig_devices) {
            if whole || Some(m.gpu_instance) == instance {
                devices.push(m.uuid.clone());
                if !g.uuid.is_empty() {
                    devices.push(mig_of_gpu_key(&g.uuid, m.gpu_instance, m.compute_instance));
                }
            }
        }
        devices
    }

    /// Names the pods of a classified event on `gpu` (module doc); what
    /// could not be told is said in [`PLACEMENT_NOTE`].
    pub(super) fn name_pods(&self, ev: &mut FaultEvent, gpu: Option<&Gpu>) {
        name_instance(ev, gpu);
        let mut notes: Vec<String> = Vec::new();
        notes.extend(self.placement.name_known_pods(&mut ev.pods));
        let devices = Self::devices_hit(ev, gpu);
        let asked_kubelet = !devices.is_empty();
        if asked_kubelet {
            let devices: Vec<&str> = devices.iter().map(String::as_str).collect();
            notes.extend(self.placement.add_holders(&devices, &mut ev.pods));
        }
        if !notes.is_empty() {
            ev.attributes
                .insert(PLACEMENT_NOTE.to_owned(), notes.join("; "));
        }
        if self.placement.names_a_gone_pod(&ev.pods) {
            ev.attributes
                .insert(POD_ATTRIBUTION.to_owned(), "pod_gone".to_owned());
        } else if asked_kubelet && self.placement.devices_unavailable() {
            ev.attributes.insert(
                POD_ATTRIBUTION.to_owned(),
                "pod_resources_unavailable".to_owned(),
            );
        }
    }

    /// A published record: returned when it goes out now, else held until
    /// a fresher placement listing can name its pods (`placement_wait`
    /// module doc).
    pub(super) fn publish_or_wait(
        &mut self,
        ev: FaultEvent,
        holder: Holder,
        read_at: Option<Instant>,
    ) -> Option<FaultEvent> {
        if !self.wait.may_hold() {
            return Some(ev);
        }
        let now = self.clock.now_unix_nanos();
        let read_at = read_at.unwrap_or_else(Instant::now);
        let gpu = self.holder_gpu(&holder);
        let wants_devices = || !Self::devices_hit(&ev, gpu).is_empty();
        let wait_ns = self.cfg.placement_wait_ns;
        let needs = self
            .wait
            .needs(&ev, wants_devices, read_at, &self.placement, now, wait_ns);
        if !self.wait.must_hold(needs) {
            return Some(ev);
        }
        let w = Waiting {
            ev,
            holder,
            read_at,
            until: now.saturating_add(wait_ns),
            needs,
        };
        let over = self.wait.hold(w, now)?;
        Some(self.renamed(over))
    }

    /// Appends the held records that may go out now (every one when
    /// `all`, at shutdown) to `out`, their pods named again from the
    /// placement the engine has now; applies the kernel-log position that
    /// waited for them.
    pub(super) fn release_waiting(&mut self, all: bool, out: &mut Vec<FaultEvent>) {
        if self.wait.is_empty() {
            return;
        }
        let now = self.clock.now_unix_nanos();
        let (ready, position) = self.wait.release(now, &self.placement, all);
        for w in ready {
            let ev = self.renamed(w);
            out.push(ev);
        }
        if let Some(p) = position {
            self.set_kmsg_position(p);
        }
    }

    /// A held record with its pods named again (the pods the earlier
    /// listing named for the kubelet's devices dropped first), and its
    /// fault given the pods it names now.
    fn renamed(&mut self, w: Waiting) -> FaultEvent {
        let Waiting {
            mut ev,
            holder,
            needs,
            ..
        } = w;
        if needs == Needs::default() {
            return ev;
        }
        ev.pods.retain(|p| p.role() != PodRole::Affected);
        ev.attributes.remove(PLACEMENT_NOTE);
        if ev
            .attributes
            .get(POD_ATTRIBUTION)
            .is_some_and(|v| v == "pod_gone" || v == "pod_resources_unavailable")
        {
            ev.attributes.remove(POD_ATTRIBUTION);
        }
        let gpu = self.holder_gpu(&holder);
        self.name_pods(&mut ev, gpu);
        let key = FaultKey::of(&ev);
        if let Some(f) = fault_in(
            &mut self.gpus,
            &mut self.node_faults,
            &holder,
            &ev.pci_address,
            &key,
        ) {
            merge_pods(&mut f.pods, &ev.pods);
        }
        self.touch();
        ev
    }

    fn holder_gpu(&self, holder: &Holder) -> Option<&Gpu> {
        match holder {
            Holder::Gpu(pci) => self.gpus.get(pci),
            Holder::Node => None,
        }
    }

    /// How long until the oldest held record goes out at the latest.
    pub(super) fn placement_due_in(&self) -> Option<std::time::Duration> {
        let until = self.wait.next_deadline()?;
        Some(std::time::Duration::from_nanos(
            until.saturating_sub(self.clock.now_unix_nanos()),
        ))
    }

    /// The verdict of each MIG device of `g` (its latest sample's): the
    /// whole GPU's faults hit every instance, a contained fault its own.
    pub(super) fn mig_health(
        &self,
        g: &Gpu,
        gpu_action: Action,
        gpu_verdict: Verdict,
    ) -> Vec<MigInstanceHealth> {
        let Some(s) = &g.sample else {
            return Vec::new();
        };
        s.mig_devices
            .iter()
            .map(|m| {
                let own = g
                    .faults
                    .iter()
                    .filter(|(k, f)| contained(k, f) && key_instance(k) == Some(m.gpu_instance))
                    .map(|(_, f)| f.action)
                    .max_by_key(|a| a.rank())
                    .unwrap_or(Action::Unspecified);
                let action = if own.rank() > gpu_action.rank() {
                    own
                } else {
                    gpu_action
                };
                // A MIG device NVML cannot read is that instance's monitor
                // problem: unknown, unless the whole GPU is worse.
                let verdict = match gpu_verdict {
                    Verdict::Healthy | Verdict::Degraded if !m.error.is_empty() => {
                        Verdict::Unknown
                    }
                    Verdict::Healthy if matches!(own, Action::RestartApp | Action::Investigate) => {
                        Verdict::Degraded
                    }
                    v => v,
                };
                let mut h = MigInstanceHealth {
                    uuid: m.uuid.clone(),
                    gpu_instance: m.gpu_instance,
                    compute_instance: m.compute_instance,
                    profile: m.profile.clone(),
                    message: if m.error.is_empty() {
                        String::new()
                    } else {
                        format!("NVML cannot read this MIG device: {}", m.error)
                    },
                    ..Default::default()
                };
                h.set_action(action);
                h.set_verdict(verdict);
                tracing::trace!(uuid = %h.uuid, verdict = h.verdict().short_name(), "MIG instance health.");
                h
            })
            .collect()
    }
}
