//! Events and a classify step shared by the policy's unit tests.

use super::{ContextWindow, Policy};
use gpuwatch_proto::{FaultEvent, FaultKind};

pub(super) const GPU: &str = "0000:3b:00.0";
pub(super) const OTHER_GPU: &str = "0000:86:00.0";

/// An XID event of `code` on `pci` at `mono_ms` of monotonic time.
pub(super) fn xid(code: u32, pci: &str, mono_ms: Option<u64>) -> FaultEvent {
    let mut ev = FaultEvent {
        code,
        pci_address: pci.into(),
        monotonic_usec: mono_ms.map(|m| m * 1000),
        ..Default::default()
    };
    ev.set_kind(FaultKind::Xid);
    ev
}

pub(super) fn with_attr(mut ev: FaultEvent, k: &str, v: &str) -> FaultEvent {
    ev.attributes.insert(k.into(), v.into());
    ev
}

pub(super) fn msg(mut ev: FaultEvent, text: &str) -> FaultEvent {
    ev.message = text.into();
    ev
}

pub(super) fn classify(policy: &Policy, ctx: &mut ContextWindow, mut ev: FaultEvent) -> FaultEvent {
    policy.classify(ctx, &mut ev);
    ev
}
