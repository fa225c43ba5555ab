//! Heap allocations on the parser's hot paths, counted with a counting global
//! allocator (`allocation-counter`, linked into this test binary only):
//!
//! - lines that are not faults allocate nothing, through every step a reader takes
//!   (whole-line prefilter, `parse_line`, message prefilter, `Scanner::push`);
//! - an XID event handed out borrowed (`Scanner::push_view`, as `scan` reads)
//!   allocates nothing, attributes included;
//! - an owned XID event allocates nothing once the reader recycles the events it
//!   is done with (`Scanner::recycle`), except for its attributes (a map), so a
//!   storm's cost is bounded and regressions show here;
//! - a NIC sysfs scan with its layout cached allocates what the scan it returns
//!   holds and a little per device for listing the class directory, nothing
//!   per file read.

use gpuwatch_benches::{STORM, mixed_messages, scan_lines, scan_lines_recycling, xid_storm};
use std::sync::Arc;
use xid_parser::{Policy, RecordMeta, Scanner, parse_kmsg_record, parse_line};

fn noise_lines() -> Vec<String> {
    let mut msgs: Vec<String> = mixed_messages(2000)
        .into_iter()
        .filter(|m| !m.contains("NVRM") && !m.contains("AER"))
        .collect();
    // Driver lines that pass the prefilters without being faults.
    for m in [
        "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
        "nvidia 0000:3b:00.0: enabling device (0000 -> 0003)",
        "nvidia-nvlink: Nvlink Core is being initialized, major device number 234",
        "mlx5_core 0000:61:00.0: print_health_info:521:(pid 0): ext_synd 0x8f1e",
    ] {
        msgs.push(m.to_owned());
        msgs.rotate_right(7);
    }
    let mut lines = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        lines.push(match i % 6 {
            0 => format!("[{:>5}.{:06}] {m}", i, i * 7 % 1_000_000),
            1 => format!("<6>[{:>5}.{:06}] {m}", i, i),
            2 => format!("6,{i},{i}000,-;{m}"),
            3 => format!("Mar  3 12:00:{:02} gpu-node-7 kernel: {m}", i % 60),
            4 => format!("2025-03-03T12:00:00.{i:06}+00:00 gpu-node-7 kernel: {m}"),
            _ => format!("[Mon Mar  3 12:00:00 2025] {m}"),
        });
    }
    lines
}

#[test]
fn non_fault_lines_allocate_nothing() {
    let lines = noise_lines();
    assert!(lines.len() > 1000);
    let mut scanner = Scanner::new(Arc::new(Policy::default()));
    let mut out = Vec::with_capacity(16);
    let mut candidates = 0;
    let info = allocation_counter::measure(|| {
        for l in &lines {
            if Scanner::interesting_line(l.as_bytes()) {
                candidates += 1;
            }
            let parsed = parse_line(l.as_bytes());
            let meta = RecordMeta {
                monotonic_usec: parsed.monotonic_usec,
                ..Default::default()
            };
            if Scanner::interesting(parsed.message.as_bytes()) {
                candidates += 1;
            }
            scanner.push(meta, &parsed.message, &mut out);
        }
    });
    assert!(out.is_empty(), "noise produced events: {out:?}");
    // Some noise lines do pass the prefilters (a driver's own lines); they must
    // still not allocate.
    assert!(candidates > 0);
    assert_eq!(info.count_total, 0, "{info:?}");
}

#[test]
fn kmsg_records_that_are_not_faults_allocate_nothing() {
    let recs: Vec<String> = mixed_messages(500)
        .into_iter()
        .enumerate()
        .map(|(i, m)| format!("6,{i},{i}000,-;{m}\n SUBSYSTEM=net\n"))
        .filter(|r| !r.contains("NVRM") && !r.contains("AER"))
        .collect();
    let mut scanner = Scanner::new(Arc::new(Policy::default()));
    let mut out = Vec::with_capacity(16);
    let info = allocation_counter::measure(|| {
        for r in &recs {
            let rec = parse_kmsg_record(r.as_bytes()).expect("valid record");
            if Scanner::interesting(rec.message) {
                let meta = RecordMeta {
                    seq: Some(rec.seq),
                    monotonic_usec: Some(rec.ts_usec),
                    ..Default::default()
                };
                scanner.push(meta, &rec.message(), &mut out);
            }
        }
    });
    assert!(out.is_empty());
    assert_eq!(info.count_total, 0, "{info:?}");
}

#[test]
fn a_borrowed_xid_event_allocates_nothing() {
    let storm = xid_storm(STORM.len() * 200);
    let lines: Vec<&[u8]> = storm.iter().map(|s| s.as_bytes()).collect();
    let mut scanner = Scanner::new(Arc::new(Policy::default()));
    let mut out = Vec::new();
    // Warm up (context window, last XID 79 per GPU) outside the measurement.
    scan_lines(&lines[..STORM.len()], &mut scanner, &mut out);
    let mut events = 0;
    let info = allocation_counter::measure(|| {
        events = scan_lines(&lines, &mut scanner, &mut out);
    });
    assert_eq!(events, lines.len());
    assert_eq!(info.count_total, 0, "{info:?}");
}

#[test]
fn an_xid_event_costs_a_bounded_number_of_allocations() {
    let storm = xid_storm(STORM.len() * 200);
    let lines: Vec<&[u8]> = storm.iter().map(|s| s.as_bytes()).collect();
    let mut scanner = Scanner::new(Arc::new(Policy::default()));
    let mut out = Vec::with_capacity(16);
    // Warm up (context window, identities) outside the measurement.
    scan_lines_recycling(&lines[..STORM.len()], &mut scanner, &mut out);
    let mut events = 0;
    let info = allocation_counter::measure(|| {
        events = scan_lines_recycling(&lines, &mut scanner, &mut out);
    });
    assert_eq!(events, lines.len());
    let per_event = info.count_total as f64 / events as f64;
    // Recycled events keep their strings' buffers: only XIDs with a channel
    // allocate, the attribute's key, value and map node (2 of the 5 shapes).
    assert!(
        per_event <= 1.2 + 1e-9,
        "{per_event:.2} allocations per XID event ({info:?})"
    );
    assert_eq!(info.count_current, 0, "events leaked: {info:?}");
    eprintln!("{per_event:.2} allocations per XID event");
}

/// Allocations per event for each storm line shape, in isolation.
#[test]
fn allocations_per_xid_shape() {
    // (line, allocations per event): the strings of a recycled event keep their
    // buffers; the attributes map frees its node when emptied.
    let expected = [
        (0, 0), // 13
        (1, 3), // 31: the channel attribute (key, value, map node)
        (2, 3), // 43: same as 31
        (3, 0), // 79
        (4, 0), // 94
    ];
    for (idx, want) in expected {
        let storm: Vec<String> = xid_storm(STORM.len() * 50)
            .into_iter()
            .skip(idx)
            .step_by(STORM.len())
            .collect();
        let lines: Vec<&[u8]> = storm.iter().map(|s| s.as_bytes()).collect();
        let mut scanner = Scanner::new(Arc::new(Policy::default()));
        let mut out = Vec::with_capacity(16);
        scan_lines_recycling(&lines[..1], &mut scanner, &mut out);
        let mut events = 0;
        let info = allocation_counter::measure(|| {
            events = scan_lines_recycling(&lines[1..], &mut scanner, &mut out);
        });
        assert_eq!(events, lines.len() - 1);
        assert_eq!(
            info.count_total,
            want * events as u64,
            "{}: {info:?}",
            STORM[idx]
        );
    }
}

/// The fake 8-NIC node of `benches/nic.rs`, scanned once to lay it out, then
/// measured: the scan's own strings and vectors, plus the listing of
/// `class/infiniband` (`read_dir`'s state and two names per device).
#[test]
fn nic_steady_scan_allocates_only_what_the_scan_holds() {
    use gpuwatch::NicReader;
    use gpuwatch_test_support::sysfs::FakeSysfs;
    use std::time::Instant;

    let fake = FakeSysfs::node_of(8);
    let mut reader = NicReader::new(fake.root().to_path_buf());
    reader.scan(Instant::now());
    let mut scan = None;
    let info = allocation_counter::measure(|| scan = Some(reader.scan(Instant::now())));
    let scan = scan.expect("scanned");
    assert_eq!(scan.ports.len(), 8);
    // The ports vector; per port its device name, netdev, PCI address,
    // counters vector and each counter's name.
    let held: u64 = 1 + scan
        .ports
        .iter()
        .map(|p| {
            2 + u64::from(p.netdev.is_some())
                + u64::from(p.pci_address.is_some())
                + p.counters.len() as u64
        })
        .sum::<u64>();
    let files: usize = scan.ports.iter().map(|p| 4 + p.counters.len()).sum();
    assert!(files > 300, "{files} files read");
    let listing = info.count_total.checked_sub(held);
    assert!(
        listing.is_some_and(|l| l <= 2 + 3 * 8),
        "{} allocations for a scan holding {held} ({info:?})",
        info.count_total
    );
}
