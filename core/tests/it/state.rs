//! The engine's state file: round trip, restart in the same boot (nothing
//! forgotten, nothing re-emitted), corrupt files kept aside.

use crate::support::*;
use gpuwatch_core::engine::STATE_FILE;
use gpuwatch_proto::{NodeHealth, Verdict};

/// The parts of the health that must survive a restart.
fn essence(h: &NodeHealth) -> String {
    let mut h = h.clone();
    h.updated_unix_nano = None;
    h.monitor = None;
    for g in &mut h.gpus {
        g.sample = None;
    }
    serde_json::to_string(&h).unwrap()
}

#[test]
fn state_file_round_trip_and_write_counting() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    rig.samples(two_gpus());
    rig.fault(xid(79, PCI0));
    rig.fault(xid(13, PCI1));
    assert!(rig.engine.is_dirty());
    rig.engine.persist().unwrap();
    assert!(!rig.engine.is_dirty());
    rig.engine.persist().unwrap(); // clean: no write
    assert_eq!(rig.registry.state_writes(), (1, 0));

    let text = std::fs::read_to_string(dir.path().join(STATE_FILE)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["version"], 1);
    assert_eq!(json["boot_id"], "boot-a");
    assert_eq!(json["gpus"].as_array().unwrap().len(), 2);
    assert!(
        text.contains(UUID0) && text.contains("reboot_node"),
        "{text}"
    );
}

#[test]
fn restart_in_the_same_boot_keeps_health_and_does_not_re_emit() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    rig.samples(two_gpus());
    rig.fault(xid(79, PCI0));
    let mut s = two_gpus();
    s[1].remapped_rows_pending = Some(true);
    s[1].ecc_volatile_uncorrected = Some(3);
    assert!(!rig.samples(s.clone()).is_empty());
    let before = rig.health();
    rig.engine.persist().unwrap();
    let clock = rig.clock.clone();

    // Restart: same boot, same clock position.
    let mut rig = Rig::with(
        gpuwatch_core::engine::EngineConfig::default(),
        std::sync::Arc::new(xid_parser::Policy::default()),
        Some(dir.path()),
        "boot-a",
        clock,
    );
    rig.nvml(true, "");
    let after = rig.health();
    assert_eq!(essence(&after), essence(&before));
    assert_eq!(after.verdict(), Verdict::Unhealthy);
    // The next poll shows the same conditions and counters: nothing re-emitted.
    assert!(rig.samples(s).is_empty());
    // A repeat of the kernel fault inside the dedup window is coalesced.
    assert!(rig.fault(xid(79, PCI0)).is_empty());
    let h = rig.health();
    assert_eq!(h.gpus[0].active_faults[0].count, 2);
}

#[test]
fn corrupt_file_is_kept_aside_and_the_engine_starts_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_FILE);
    std::fs::write(&path, b"{\"version\": 1, \"boot_id\": ").unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    assert!(!path.exists(), "moved aside");
    let kept: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("corrupt"))
        .collect();
    assert_eq!(kept.len(), 1);
    rig.samples(two_gpus());
    assert_eq!(rig.health().verdict(), Verdict::Healthy);
    rig.engine.persist().unwrap();
    assert!(path.exists(), "a fresh file is written");
}

#[test]
fn unknown_version_or_bad_content_is_kept_aside() {
    for body in [
        r#"{"version": 99, "boot_id": "x"}"#,
        r#"{"version": 1, "boot_id": "x", "node_faults": [{"kind": "bogus", "code": 1, "action": "ignore", "severity": "info", "reason": "r", "count": 1, "first_seen_unix_nano": 0, "last_seen_unix_nano": 0, "last_emitted_unix_nano": 0, "boot_id": "x", "last_boot_id": "x"}]}"#,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        std::fs::write(&path, body).unwrap();
        let rig = Rig::new(Some(dir.path()), "boot-a");
        assert!(!path.exists(), "{body}");
        assert!(rig.health().node_faults.is_empty());
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().any(|n| n.contains("corrupt")), "{names:?}");
    }
}

#[test]
fn new_boot_keeps_history_but_not_counters() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-1");
    let mut s = two_gpus();
    s[0].ecc_volatile_uncorrected = Some(5);
    rig.samples(s.clone());
    rig.engine.persist().unwrap();
    // New boot: the volatile counter of the old boot is not a baseline, so a GPU
    // starting with uncorrected errors in this boot raises a fault.
    let mut rig = Rig::new(Some(dir.path()), "boot-2");
    let out = rig.samples(s);
    assert!(
        out.iter()
            .any(|e| e.kind() == gpuwatch_proto::FaultKind::Ecc)
    );
    let text = std::fs::read_to_string(dir.path().join(STATE_FILE)).unwrap();
    assert!(text.contains("boot-1"));
}

/// Regression (issue 3): a state file that exists but cannot be read (EACCES,
/// EIO; here a link to a directory, since root reads everything) was replaced
/// by a fresh one, losing its active faults and history.
#[test]
fn unreadable_state_file_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("elsewhere");
    std::fs::create_dir(&target).unwrap();
    let path = dir.path().join(STATE_FILE);
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    rig.samples(two_gpus());
    rig.fault(xid(79, PCI0));
    assert_eq!(rig.health().verdict(), Verdict::Unhealthy, "runs in memory");
    let err = rig.engine.persist().unwrap_err();
    assert!(err.to_string().contains("not overwriting"), "{err}");
    assert_eq!(
        rig.registry.state_writes(),
        (0, 1),
        "the skipped write is counted"
    );
    assert!(
        std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the unreadable file is left as it was"
    );
    // Not retried every persist interval: the next error comes with the next change.
    rig.engine.persist().unwrap();
    rig.fault(xid(13, PCI1));
    assert!(rig.engine.persist().is_err());
    assert_eq!(rig.registry.state_writes(), (0, 2));
}
