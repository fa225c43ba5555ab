//! [`FaultEventRef`]: a [`FaultEvent`] whose text borrows from elsewhere (the
//! kernel line it was parsed from, the policy table, the parser's state), so a
//! reader that only writes or counts an event never copies it into owned strings.

use crate::{Action, FaultEvent, FaultKind, PodRef, Severity, Source, kind_reason};
use std::collections::BTreeMap;

/// The attributes of a [`FaultEventRef`], in key order like a [`FaultEvent`]'s map.
#[derive(Debug, Clone, Copy)]
pub enum Attrs<'a> {
    /// Borrowed from a [`FaultEvent`]'s `attributes`.
    Map(&'a BTreeMap<String, String>),
    /// Pairs sorted by key, each key once (see [`Attrs::list`]).
    List(&'a [(&'a str, &'a str)]),
}

impl<'a> Attrs<'a> {
    /// Attributes from `pairs`, which must be sorted by key with no key twice (a
    /// debug build checks): they are written out in this order.
    pub fn list(pairs: &'a [(&'a str, &'a str)]) -> Attrs<'a> {
        debug_assert!(
            pairs.windows(2).all(|w| w[0].0 < w[1].0),
            "attribute keys unsorted or repeated: {pairs:?}"
        );
        Attrs::List(pairs)
    }

    /// The value of `key`; a list is searched in order, a map by key.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        match *self {
            Attrs::Map(m) => m.get(key).map(String::as_str),
            Attrs::List(l) => l.iter().find(|(k, _)| *k == key).map(|(_, v)| *v),
        }
    }

    /// How many pairs ([`Attrs::iter`] yields that many).
    pub fn len(&self) -> usize {
        match self {
            Attrs::Map(m) => m.len(),
            Attrs::List(l) => l.len(),
        }
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a> {
        let (map, list) = match *self {
            Attrs::Map(m) => (Some(m.iter()), None),
            Attrs::List(l) => (None, Some(l.iter())),
        };
        map.into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(list.into_iter().flatten().map(|&(k, v)| (k, v)))
    }
}

impl PartialEq for Attrs<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// A fault event with borrowed text: the same fields as [`FaultEvent`] (enums as
/// their `i32` numbers, like prost keeps them). [`FaultEvent::view`] borrows an
/// owned one; [`FaultEventRef::to_event`] / [`FaultEventRef::write_into`] make one.
#[derive(Debug, Clone, Copy, PartialEq)]
#[allow(missing_docs)]
pub struct FaultEventRef<'a> {
    pub kind: i32,
    pub code: u32,
    pub pci_address: &'a str,
    pub gpu_index: Option<u32>,
    pub gpu_uuid: &'a str,
    pub pid: Option<u32>,
    pub process: &'a str,
    pub message: &'a str,
    pub kmsg_seq: Option<u64>,
    pub monotonic_usec: Option<u64>,
    pub time_unix_nano: Option<u64>,
    pub facility: Option<u32>,
    pub level: Option<u32>,
    pub action: i32,
    pub severity: i32,
    pub policy_reason: &'a str,
    pub source: i32,
    pub boot_id: &'a str,
    pub count: u32,
    pub attributes: Attrs<'a>,
    pub name: &'a str,
    pub pods: &'a [PodRef],
}

impl<'a> FaultEventRef<'a> {
    /// Every field at its default (what [`FaultEvent::default`] holds): written into
    /// an event, it empties it and keeps its buffers.
    pub const EMPTY: FaultEventRef<'static> = FaultEventRef {
        kind: 0,
        code: 0,
        pci_address: "",
        gpu_index: None,
        gpu_uuid: "",
        pid: None,
        process: "",
        message: "",
        kmsg_seq: None,
        monotonic_usec: None,
        time_unix_nano: None,
        facility: None,
        level: None,
        action: 0,
        severity: 0,
        policy_reason: "",
        source: 0,
        boot_id: "",
        count: 0,
        attributes: Attrs::List(&[]),
        name: "",
        pods: &[],
    };

    /// The kind (`Unspecified` for an unknown number, as prost's accessor).
    pub fn kind(&self) -> FaultKind {
        FaultKind::try_from(self.kind).unwrap_or_default()
    }

    /// The action (`Unspecified` for an unknown number).
    pub fn action(&self) -> Action {
        Action::try_from(self.action).unwrap_or_default()
    }

    /// The severity (`Unspecified` for an unknown number).
    pub fn severity(&self) -> Severity {
        Severity::try_from(self.severity).unwrap_or_default()
    }

    /// The source (`Unspecified` for an unknown number).
    pub fn source(&self) -> Source {
        Source::try_from(self.source).unwrap_or_default()
    }

    /// The value of attribute `key`.
    pub fn attr(&self, key: &str) -> Option<&'a str> {
        self.attributes.get(key)
    }

    /// See [`FaultEvent::short_reason`].
    pub fn short_reason(&self) -> String {
        let attr = |k: &str| self.attr(k).unwrap_or("");
        match self.kind() {
            FaultKind::PcieAer => match attr("aer_severity") {
                "uncorrected_fatal" => "PCIeAERFatal".into(),
                "uncorrected_nonfatal" => "PCIeAERNonFatal".into(),
                "corrected" => "PCIeAERCorrected".into(),
                _ => kind_reason(FaultKind::PcieAer, self.code),
            },
            FaultKind::Ecc => match attr("ecc_type") {
                "sbe" | "corrected" => "ECCCorrected".into(),
                "dbe" | "uncorrected" => "ECCUncorrected".into(),
                _ => kind_reason(FaultKind::Ecc, self.code),
            },
            FaultKind::RowRemap => {
                let state = match attr("remap") {
                    "" => attr("row_remap"),
                    s => s,
                };
                match state {
                    "failure" => "RowRemapFailure".into(),
                    "pending" => "RowRemapPending".into(),
                    _ if attr("row_remap_failure") == "true" => "RowRemapFailure".into(),
                    _ => kind_reason(FaultKind::RowRemap, self.code),
                }
            }
            FaultKind::Fabric => crate::fabric::Problem::from_name(attr("fabric_problem"))
                .map_or_else(
                    || kind_reason(FaultKind::Fabric, self.code),
                    |p| p.reason().into(),
                ),
            FaultKind::Nic => match (attr("nic_reason"), attr("nic_event")) {
                // A port's status change decided by the network monitor.
                (r, _) if !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric()) => r.into(),
                (_, "link_down") => "NICLinkDown".into(),
                (_, "link_up") => "NICLinkUp".into(),
                (_, "module") => "NICModuleEvent".into(),
                (_, "health") => "NICHealthEvent".into(),
                (_, "slot_power") => "NICSlotPower".into(),
                (_, "tx_timeout") => "NICTxTimeout".into(),
                _ => kind_reason(FaultKind::Nic, self.code),
            },
            k => kind_reason(k, self.code),
        }
    }

    /// A [`FaultEvent`] with this event's fields (allocates every string; see
    /// [`FaultEventRef::write_into`] to reuse one).
    pub fn to_event(&self) -> FaultEvent {
        let mut ev = FaultEvent::default();
        self.write_into(&mut ev);
        ev
    }

    /// Overwrites every field of `ev` with this event's, reusing its string
    /// buffers (only the attribute map allocates).
    pub fn write_into(&self, ev: &mut FaultEvent) {
        let FaultEventRef {
            kind,
            code,
            pci_address,
            gpu_index,
            gpu_uuid,
            pid,
            process,
            message,
            kmsg_seq,
            monotonic_usec,
            time_unix_nano,
            facility,
            level,
            action,
            severity,
            policy_reason,
            source,
            boot_id,
            count,
            attributes,
            name,
            pods,
        } = *self;
        let set = |s: &mut String, v: &str| {
            s.clear();
            s.push_str(v);
        };
        set(&mut ev.pci_address, pci_address);
        set(&mut ev.gpu_uuid, gpu_uuid);
        set(&mut ev.process, process);
        set(&mut ev.message, message);
        set(&mut ev.policy_reason, policy_reason);
        set(&mut ev.boot_id, boot_id);
        set(&mut ev.name, name);
        (ev.kind, ev.code, ev.action, ev.severity, ev.source) =
            (kind, code, action, severity, source);
        (ev.gpu_index, ev.pid, ev.facility, ev.level, ev.count) =
            (gpu_index, pid, facility, level, count);
        (ev.kmsg_seq, ev.monotonic_usec, ev.time_unix_nano) =
            (kmsg_seq, monotonic_usec, time_unix_nano);
        ev.attributes.clear();
        for (k, v) in attributes.iter() {
            ev.attributes.insert(k.to_owned(), v.to_owned());
        }
        ev.pods.clear();
        ev.pods.extend_from_slice(pods);
    }
}

impl FaultEvent {
    /// A view whose strings and attributes borrow from this event; for code
    /// that takes either kind ([`FaultEventRef`] is what the parser emits).
    pub fn view(&self) -> FaultEventRef<'_> {
        let FaultEvent {
            kind,
            code,
            pci_address,
            gpu_index,
            gpu_uuid,
            pid,
            process,
            message,
            kmsg_seq,
            monotonic_usec,
            time_unix_nano,
            facility,
            level,
            action,
            severity,
            policy_reason,
            source,
            boot_id,
            count,
            attributes,
            name,
            pods,
        } = self;
        FaultEventRef {
            kind: *kind,
            code: *code,
            pci_address,
            gpu_index: *gpu_index,
            gpu_uuid,
            pid: *pid,
            process,
            message,
            kmsg_seq: *kmsg_seq,
            monotonic_usec: *monotonic_usec,
            time_unix_nano: *time_unix_nano,
            facility: *facility,
            level: *level,
            action: *action,
            severity: *severity,
            policy_reason,
            source: *source,
            boot_id,
            count: *count,
            attributes: Attrs::Map(attributes),
            name,
            pods,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> FaultEvent {
        let mut ev = FaultEvent {
            code: 79,
            pci_address: "0000:3b:00.0".into(),
            gpu_index: Some(1),
            gpu_uuid: "GPU-1".into(),
            pid: Some(7),
            process: "python".into(),
            message: "NVRM: Xid".into(),
            kmsg_seq: Some(1),
            monotonic_usec: Some(2),
            time_unix_nano: Some(3),
            facility: Some(0),
            level: Some(3),
            policy_reason: "why".into(),
            boot_id: "b".into(),
            count: 4,
            attributes: [("a", "1"), ("b", "2")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            name: "n".into(),
            ..Default::default()
        };
        ev.set_kind(FaultKind::Xid);
        ev.set_action(Action::RebootNode);
        ev.set_severity(Severity::Error);
        ev.set_source(Source::Kmsg);
        ev
    }

    #[test]
    fn a_view_copies_back_to_the_same_event() {
        let ev = full();
        assert_eq!(ev.view().to_event(), ev);
        // Into an event holding other values.
        let mut other = FaultEvent {
            message: "old".into(),
            attributes: [("z".to_owned(), "9".to_owned())].into(),
            ..Default::default()
        };
        ev.view().write_into(&mut other);
        assert_eq!(other, ev);
        let pairs = [("a", "1"), ("b", "2")];
        let listed = FaultEventRef {
            attributes: Attrs::list(&pairs),
            ..ev.view()
        };
        assert_eq!(listed, ev.view());
        assert_eq!(listed.to_event(), ev);
        assert_eq!(listed.attr("b"), Some("2"));
        assert_eq!(listed.attr("c"), None);
    }

    #[test]
    fn attribute_lists_and_maps_compare_by_content() {
        let map: BTreeMap<String, String> = [("k".to_owned(), "v".to_owned())].into();
        assert_eq!(Attrs::Map(&map), Attrs::list(&[("k", "v")]));
        assert_ne!(Attrs::Map(&map), Attrs::list(&[("k", "w")]));
        assert_ne!(Attrs::Map(&map), Attrs::list(&[]));
        assert!(Attrs::list(&[]).is_empty());
    }

    #[test]
    fn the_empty_view_empties_an_event() {
        let mut ev = full();
        FaultEventRef::EMPTY.write_into(&mut ev);
        assert_eq!(ev, FaultEvent::default());
        assert_eq!(FaultEventRef::EMPTY, FaultEvent::default().view());
    }
}
