//! The engine's state file: round trip, restart in the same boot (nothing
//! forgotten, nothing re-emitted), the kernel-log position written with the
//! faults only at settled points, unusable states kept aside with the position
//! forgotten, failed writes reported and retried, the version 1 migration.

use crate::support::*;
use gpuwatch_core::engine::{EngineConfig, LEGACY_CURSOR_FILE, STATE_FILE};
use gpuwatch_core::msg::{Input, KmsgPosition};
use gpuwatch_proto::{NodeHealth, Verdict};
use std::path::Path;
use std::sync::Arc;

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
    assert_eq!(json["version"], 2);
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

/// Every address the scanner reports on a GPU's fault is a GPU the state
/// file can hold and give back: an address no real device has (device
/// number above 0x1f, reported as printed) once made the loader throw the
/// whole state away, escalated faults and kernel log position with it.
#[test]
fn every_gpu_the_scanner_names_survives_a_restart() {
    let lines = [
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0001:57:27): 31, pid=1, name=x, Ch 00000008, intr 10000000. MMU Fault",
        "NVRM: Xid (PCI:10000:01:00): 48, An uncorrectable double bit error",
    ];
    let mut scanner = xid_parser::Scanner::new(Arc::new(xid_parser::Policy::default()));
    let mut events = Vec::new();
    for l in lines {
        scanner.push(xid_parser::RecordMeta::default(), l, &mut events);
    }
    scanner.finish(&mut events);
    let named: Vec<String> = events.iter().map(|e| e.pci_address.clone()).collect();
    assert_eq!(named, ["0000:3b:00.0", "0001:57:27.0", "10000:01:00.0"]);

    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    for ev in events {
        rig.fault(ev);
    }
    let before = rig.health();
    assert_eq!(before.gpus.len(), 3, "{before:?}");
    rig.engine.persist().unwrap();
    let clock = rig.clock.clone();
    let rig = Rig::with(
        EngineConfig::default(),
        Arc::new(xid_parser::Policy::default()),
        Some(dir.path()),
        "boot-a",
        clock,
    );
    let after = rig.health();
    let m = after.monitor.as_ref().unwrap();
    assert!(m.state_ok, "{m:?}");
    assert!(dir.path().join(STATE_FILE).exists());
    assert_eq!(essence(&after), essence(&before));
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
        assert!(
            names
                .iter()
                .any(|n| n.contains("corrupt") || n.contains("newer")),
            "{names:?}"
        );
        let h = rig.health();
        let m = h.monitor.as_ref().unwrap();
        assert!(
            !m.state_ok && m.state_message.contains("moved aside"),
            "{m:?}"
        );
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

fn position(seq: u64) -> Input {
    Input::KmsgProgress(KmsgPosition {
        boot_id: "boot-a".into(),
        last_seq: seq,
    })
}

fn saved(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(STATE_FILE)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The state file holds exactly the faults of the records up to its
/// position: with a kernel-log fault handled after the last position, the
/// state is not written (a crash would count that record twice after the
/// restart re-reads it); the next position settles it and it is written.
#[test]
fn state_is_written_only_at_a_settled_kernel_log_position() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    rig.engine.track_kmsg_position();
    rig.samples(two_gpus());
    rig.engine.handle(position(10));
    let mut ev = xid(79, PCI0);
    ev.kmsg_seq = Some(11);
    rig.fault(ev);
    assert!(!rig.engine.is_settled());
    assert_eq!(
        rig.engine.persist_due(),
        None,
        "nothing due while unsettled"
    );
    rig.engine.persist().unwrap();
    assert!(
        !dir.path().join(STATE_FILE).exists(),
        "not written unsettled"
    );
    assert!(rig.engine.is_dirty());
    rig.engine.handle(position(12));
    assert!(rig.engine.is_settled());
    assert!(rig.engine.persist_due().is_some());
    rig.engine.persist().unwrap();
    let json = saved(dir.path());
    assert_eq!(json["kmsg"]["last_seq"], 12);
    assert_eq!(json["kmsg"]["boot_id"], "boot-a");
    assert_eq!(json["gpus"][0]["faults"][0]["count"], 1);

    // Restart: the position comes back with the faults it accounts for.
    let rig = Rig::new(Some(dir.path()), "boot-a");
    assert_eq!(
        rig.engine.kmsg_position(),
        Some(&KmsgPosition {
            boot_id: "boot-a".into(),
            last_seq: 12
        })
    );
    assert_eq!(rig.health().verdict(), Verdict::Unhealthy);
}

/// Events held for the NVML join grace are not in the state yet: a position
/// that arrives meanwhile applies only once they are.
#[test]
fn a_position_waits_for_events_held_for_the_join_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    rig.engine.track_kmsg_position();
    let mut ev = xid(79, PCI0);
    ev.kmsg_seq = Some(3);
    assert!(rig.fault(ev).is_empty(), "held for the NVML identity");
    rig.engine.handle(position(5));
    assert!(!rig.engine.is_settled());
    assert_eq!(rig.engine.kmsg_position(), None);
    // The first complete poll releases the held event and the position.
    assert_eq!(rig.samples(two_gpus()).len(), 1);
    assert!(rig.engine.is_settled());
    assert_eq!(rig.engine.kmsg_position().map(|p| p.last_seq), Some(5));
}

/// Every way a state can be unusable: the engine starts, says what it did
/// (log + health), keeps the old state aside, and forgets the position with
/// it, so the reader reads the whole ring and every fault in it comes back.
#[test]
fn every_unusable_state_is_kept_aside_and_forgets_the_position() {
    let good = |dir: &Path| {
        let mut rig = Rig::new(Some(dir), "boot-a");
        rig.engine.track_kmsg_position();
        rig.samples(two_gpus());
        rig.fault(xid(79, PCI0));
        rig.engine.handle(position(40));
        rig.engine.persist().unwrap();
        std::fs::read_to_string(dir.join(STATE_FILE)).unwrap()
    };
    type Damage = fn(&Path, &str);
    let cases: [(&str, Damage); 5] = [
        ("garbage", |p, _| {
            std::fs::write(p, b"\x00\xffnot json").unwrap()
        }),
        ("truncated", |p, text| {
            std::fs::write(p, &text.as_bytes()[..text.len() / 2]).unwrap()
        }),
        ("wrong shape", |p, _| {
            std::fs::write(p, br#"{"version": 2, "boot_id": 7, "gpus": "x"}"#).unwrap()
        }),
        ("newer version", |p, text| {
            std::fs::write(p, text.replace("\"version\": 2", "\"version\": 3")).unwrap()
        }),
        ("directory", |p, _| {
            std::fs::remove_file(p).unwrap();
            std::fs::create_dir(p).unwrap();
        }),
    ];
    for (name, damage) in cases {
        let dir = tempfile::tempdir().unwrap();
        let text = good(dir.path());
        let path = dir.path().join(STATE_FILE);
        damage(&path, &text);
        let mut rig = Rig::new(Some(dir.path()), "boot-a");
        assert_eq!(
            rig.engine.kmsg_position(),
            None,
            "{name}: position forgotten"
        );
        let h = rig.health();
        let m = h.monitor.as_ref().unwrap();
        assert!(!m.state_ok, "{name}: reported");
        assert!(
            m.state_message.contains("read again"),
            "{name}: {}",
            m.state_message
        );
        assert!(
            h.gpus.iter().all(|g| g.active_faults.is_empty()),
            "{name}: starts empty"
        );
        let aside = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name();
                let n = n.to_string_lossy();
                n.starts_with("health.") && n != STATE_FILE
            })
            .count();
        assert_eq!(aside, 1, "{name}: the old state is kept aside");
        // The fault comes back from the ring, counted once.
        rig.engine.track_kmsg_position();
        rig.samples(two_gpus());
        rig.fault(xid(79, PCI0));
        rig.engine.handle(position(40));
        rig.engine.persist().unwrap();
        assert_eq!(
            saved(dir.path())["gpus"][0]["faults"][0]["count"],
            1,
            "{name}"
        );
    }
    // Missing: no problem to report, the whole ring is read.
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::new(Some(dir.path()), "boot-a");
    assert_eq!(rig.engine.kmsg_position(), None);
    assert!(rig.health().monitor.as_ref().unwrap().state_ok);
}

/// A failed write is reported in the health and retried with backoff; once
/// the directory is writable again the state is written and nothing is lost.
#[test]
fn a_failing_write_is_reported_retried_and_loses_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("state");
    let cfg = EngineConfig {
        persist_interval_ms: 100,
        ..EngineConfig::default()
    };
    let mut rig = Rig::with(
        cfg,
        Arc::new(xid_parser::Policy::default()),
        Some(&dir),
        "boot-a",
        Arc::new(gpuwatch_core::clock::ManualClock::new(start_time())),
    );
    // The state directory's path is taken by a file: every write fails.
    std::fs::write(&dir, b"not a directory").unwrap();
    rig.samples(two_gpus());
    rig.fault(xid(79, PCI0));
    assert!(rig.engine.persist().is_err());
    let h = rig.health();
    let m = h.monitor.as_ref().unwrap();
    assert!(
        !m.state_ok && m.state_message.contains("cannot be written"),
        "{m:?}"
    );
    // Backoff: not retried at once.
    let due = rig.engine.persist_due().unwrap();
    assert!(due > std::time::Instant::now());
    rig.engine.persist().unwrap();
    assert_eq!(
        rig.registry.state_writes(),
        (0, 1),
        "no retry inside the backoff"
    );
    for _ in 0..100 {
        rig.fault(xid(79, PCI0));
    }
    std::fs::remove_file(&dir).unwrap();
    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
    rig.engine.persist().unwrap();
    assert!(rig.health().monitor.as_ref().unwrap().state_ok);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(STATE_FILE)).unwrap()).unwrap();
    assert_eq!(json["gpus"][0]["faults"][0]["count"], 101, "nothing lost");
}

/// A version 1 state and its separate cursor file are read once: the cursor
/// becomes the position, the first write replaces both with one file.
#[test]
fn version_1_state_and_cursor_migrate_to_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    rig.samples(two_gpus());
    rig.fault(xid(79, PCI0));
    rig.engine.persist().unwrap();
    let path = dir.path().join(STATE_FILE);
    let v1 = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"version\": 2", "\"version\": 1")
        .replace("\"kmsg\": null", "\"unused\": null");
    let v1: serde_json::Value = serde_json::from_str(&v1).unwrap();
    let mut v1 = v1.as_object().unwrap().clone();
    v1.remove("kmsg");
    v1.remove("unused");
    std::fs::write(&path, serde_json::to_vec(&v1).unwrap()).unwrap();
    std::fs::write(
        dir.path().join(LEGACY_CURSOR_FILE),
        br#"{"boot_id": "boot-a", "last_seq": 77}"#,
    )
    .unwrap();

    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    assert_eq!(rig.engine.kmsg_position().map(|p| p.last_seq), Some(77));
    assert_eq!(
        rig.health().verdict(),
        Verdict::Unhealthy,
        "the XID 79 is back"
    );
    assert_eq!(
        rig.health()
            .gpus
            .iter()
            .map(|g| g.active_faults.len())
            .sum::<usize>(),
        1
    );
    rig.engine.persist().unwrap();
    assert!(!dir.path().join(LEGACY_CURSOR_FILE).exists(), "replaced");
    let json = saved(dir.path());
    assert_eq!(json["version"], 2);
    assert_eq!(json["kmsg"]["last_seq"], 77);
}

/// Read-only (`gpuwatch validate` beside a running agent): the state is
/// read, never moved, written or removed, even when it is unusable.
#[test]
fn a_read_only_engine_never_touches_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_FILE);
    std::fs::write(&path, b"{ not json").unwrap();
    let ro = |d: &Path| {
        gpuwatch_core::engine::Engine::new_read_only(
            gpuwatch_core::engine::EngineSettings::default(),
            Arc::new(xid_parser::Policy::default()),
            d.to_path_buf(),
            boot("boot-a"),
            "node-a".into(),
            gpuwatch_core::Registry::new(),
            Arc::new(gpuwatch_core::clock::SystemClock),
        )
    };
    let mut e = ro(dir.path());
    e.persist().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"{ not json");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    assert!(!e.health().monitor.as_ref().unwrap().state_ok);

    // A usable state's faults are there to judge.
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(Some(dir.path()), "boot-a");
    rig.samples(two_gpus());
    rig.fault(xid(79, PCI0));
    rig.engine.persist().unwrap();
    let before = std::fs::read(dir.path().join(STATE_FILE)).unwrap();
    let mut e = ro(dir.path());
    e.handle(Input::Fault {
        event: xid(13, PCI1),
        read_at: std::time::Instant::now(),
    });
    e.persist().unwrap();
    assert_eq!(std::fs::read(dir.path().join(STATE_FILE)).unwrap(), before);
    assert_eq!(
        e.health()
            .gpus
            .iter()
            .flat_map(|g| &g.active_faults)
            .filter(|f| f.reason == "XID79")
            .count(),
        1
    );
}

/// Crash exactness at the engine level, with every interleaving the kernel
/// log reader can produce: fault events of records 1..=N, a position after
/// some of them, state writes attempted at random points and a crash (the
/// engine dropped, a new one loading the file) at random points, the reader
/// resuming after the loaded position each time. At the end every GPU's
/// count equals the records written for it: nothing counted twice, nothing
/// skipped.
#[test]
fn random_crashes_between_events_positions_and_writes_count_every_record_once() {
    const RECORDS: u64 = 600;
    const GPUS: u64 = 3;
    let pcis = [PCI0, PCI1, "0000:c1:00.0"];
    for seed in 1..=6u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let start = |dir: &Path| {
            let mut rig = Rig::without_join_grace(Some(dir), "boot-a");
            rig.engine.track_kmsg_position();
            rig
        };
        let mut rig = start(dir.path());
        let mut seq = 0;
        let mut crashes = 0;
        while seq < RECORDS {
            seq += 1;
            let mut ev = xid(13, pcis[(seq % GPUS) as usize]);
            ev.kmsg_seq = Some(seq);
            rig.fault(ev);
            if next(3) == 0 {
                rig.engine.handle(position(seq));
            }
            if next(4) == 0 {
                let _ = rig.engine.persist();
            }
            if next(25) == 0 {
                // kill -9: whatever is in memory is gone; the reader resumes
                // after the position of the state that was last written.
                crashes += 1;
                rig = start(dir.path());
                seq = rig.engine.kmsg_position().map_or(0, |p| p.last_seq);
            }
        }
        rig.engine.handle(position(seq));
        rig.engine.persist().unwrap();
        let json = saved(dir.path());
        let counts: Vec<u64> = json["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["faults"][0]["count"].as_u64().unwrap())
            .collect();
        assert!(crashes > 5, "seed {seed}: only {crashes} crashes");
        assert_eq!(
            counts,
            vec![RECORDS / GPUS; GPUS as usize],
            "seed {seed}, {crashes} crashes"
        );
    }
}
