//! Fuzzes the scanner's multi-line assembly with structured input: the driver's
//! three-line "fallen off the bus" reports, XID 79 lines, multi-line XID 13
//! reports, AER and machine-check lines and unrelated lines, for up to eight GPUs,
//! in any order, with or without timestamps (line shapes from the golden tests).
//!
//! Invariants: no panic; nothing pending after `finish`; every event's first
//! line carries a marker; and when the input holds only fallen-off reports and
//! XID 79 lines (each GPU at most one report and one XID 79, as the driver prints
//! them once per lost GPU), exactly one event per GPU named, whatever the order
//! and interleaving; the events handed out borrowed (`Scanner::push_view`) equal
//! the owned ones.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::sync::Arc;
use xid_parser::{Policy, RecordMeta, Scanner, parse_line};

fn bus(gpu: u8) -> u8 {
    0x10 + gpu * 0x11
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, ops)) = data.split_first() else {
        return;
    };
    let timestamps = flags & 1 == 1;
    let mut lines: Vec<String> = Vec::new();
    let mut only_fallen = true;
    let mut gpus_named = std::collections::BTreeSet::new();
    let mut reported = std::collections::BTreeSet::new();
    let mut xid79 = std::collections::BTreeSet::new();
    for op in ops.iter().take(200) {
        let gpu = op & 7;
        let b = bus(gpu);
        match op >> 3 {
            0..=9 => {
                if !reported.insert(b) {
                    continue;
                }
                lines.push(format!("NVRM: The NVIDIA GPU 0000:{b:02x}:00.0"));
                lines.push("NVRM: (PCI ID: 10de:2330) installed in this system has".into());
                lines.push("NVRM: fallen off the bus and is not responding to commands.".into());
                gpus_named.insert(b);
            }
            10..=14 => {
                if !xid79.insert(b) {
                    continue;
                }
                lines.push(format!(
                    "NVRM: Xid (PCI:0000:{b:02x}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
                ));
                gpus_named.insert(b);
            }
            15..=17 => {
                only_fallen = false;
                lines.push(format!(
                    "NVRM: Xid (PCI:0000:{b:02x}:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 4, SM 0): Misaligned Address"
                ));
                lines.push(format!(
                    "NVRM: Xid (PCI:0000:{b:02x}:00): 13, pid={}, name=xid, Graphics Exception: channel 0x0000000a",
                    500 + u32::from(gpu)
                ));
            }
            18..=20 => {
                only_fallen = false;
                lines.push(format!(
                    "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:{b:02x}:00.0"
                ));
                lines.push(format!(
                    "nvidia 0000:{b:02x}:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)"
                ));
                lines.push(
                    "PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)".into(),
                );
            }
            21..=23 => {
                only_fallen = false;
                lines.push("mce: [Hardware Error]: Machine check events logged".into());
                lines.push("EDAC sbridge MC1: HANDLING MCE MEMORY ERROR".into());
                lines.push(format!(
                    "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank {gpu}: be00000000800400"
                ));
                lines.push("Kernel panic - not syncing: Fatal machine check".into());
            }
            24..=27 => {
                only_fallen = false;
                lines.push("usb 1-1: new high-speed USB device number 2 using xhci_hcd".into());
            }
            _ => {
                only_fallen = false;
                lines.push(format!(
                    "NVRM: GPU 0000:{b:02x}:00.0: GPU has fallen off the bus."
                ));
            }
        }
    }
    let mut scanner = Scanner::new(Arc::new(Policy::default()));
    let mut viewer = Scanner::new(Arc::new(Policy::default()));
    let mut events = Vec::new();
    let mut viewed = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let text = if timestamps {
            // 1 µs apart: every line is within every hold window.
            format!("[{:>5}.{:06}] {l}", 100, i)
        } else {
            l.clone()
        };
        let line = parse_line(text.as_bytes());
        let meta = RecordMeta {
            seq: Some(i as u64),
            monotonic_usec: line.monotonic_usec,
            ..Default::default()
        };
        scanner.push(meta, &line.message, &mut events);
        viewer.push_view(meta, &line.message, &mut |ev| viewed.push(ev.to_event()));
    }
    scanner.finish(&mut events);
    viewer.finish_view(&mut |ev| viewed.push(ev.to_event()));
    assert!(!scanner.has_pending());
    assert_eq!(viewed, events);
    for ev in &events {
        let first = ev.message.lines().next().unwrap_or("");
        assert!(
            Scanner::interesting(first.as_bytes()),
            "event whose first line has no marker: {first:?}"
        );
        assert_ne!(ev.action, 0);
    }
    if only_fallen {
        let mut per_gpu: BTreeMap<&str, usize> = BTreeMap::new();
        for ev in &events {
            *per_gpu.entry(ev.pci_address.as_str()).or_default() += 1;
        }
        assert_eq!(per_gpu.len(), gpus_named.len(), "{per_gpu:?} {lines:#?}");
        assert!(per_gpu.values().all(|&n| n == 1), "{per_gpu:?} {lines:#?}");
    }
});
