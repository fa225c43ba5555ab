//! `gpuwatch validate` (the init-container check) reads the agent's state
//! file, read-only: a fault the agent holds — here one escalated to
//! `inspect_hardware` by recurring across reboots — fails the validation with
//! a message naming it, while `gpuwatch run` keeps the node tainted for it.

use crate::common::{data, run_validate};
use crate::engine_support::{Rig, xid};
use gpuwatch_core::engine::STATE_FILE;

/// One of the GPUs of `kube-8gpu-healthy.toml`.
const PCI: &str = "0000:1b:00.0";

fn validate(state_dir: &std::path::Path) -> (Option<i32>, String) {
    let out = run_validate(
        state_dir,
        &data("kube-8gpu-healthy.toml"),
        "",
        &["--expected-gpus", "8"],
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn validate_fails_on_a_persisted_escalated_fault_and_never_writes_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = validate(dir.path());
    assert_eq!(code, Some(0), "no state yet: {out}");

    // XID 79 on the same GPU in three boots: recurred after two reboots,
    // escalated to inspect_hardware (kept across reboots).
    for boot in ["boot-1", "boot-2", "boot-3"] {
        let mut rig = Rig::without_join_grace(Some(dir.path()), boot);
        rig.fault(xid(79, PCI));
        rig.engine.persist().unwrap();
    }
    let state = std::fs::read(dir.path().join(STATE_FILE)).unwrap();
    assert!(
        String::from_utf8_lossy(&state).contains("inspect_hardware"),
        "escalated"
    );
    let (code, out) = validate(dir.path());
    assert_eq!(code, Some(1), "{out}");
    assert!(out.starts_with("Validation FAILED"), "{out}");
    assert!(out.contains("XID79"), "names the fault: {out}");
    assert_eq!(
        std::fs::read(dir.path().join(STATE_FILE)).unwrap(),
        state,
        "validate only reads the state"
    );
}
