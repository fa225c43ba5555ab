//! Fuzzes the message parser and the scanner with arbitrary multi-line input.
//! Invariants: no panic; the one-pass XID reading agrees with the general one; no
//! event from input whose lines carry none of the markers (`Scanner::interesting`
//! false for every line); every event's first line carries a marker; every PCI address in an event is normalised (except an
//! edited address reported as given, marked `pci_note`); every event is classified
//! and counts 1.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use xid_parser::{Policy, RecordMeta, Scanner, normalize_pci, parse_line, parse_message};

fuzz_target!(|data: &[u8]| {
    let policy = Arc::new(Policy::default());
    let mut scanner = Scanner::new(policy);
    let mut events = Vec::new();
    let mut any_interesting = false;
    for (i, raw) in data.split(|&b| b == b'\n').enumerate() {
        let line = parse_line(raw);
        let interesting = Scanner::interesting(line.message.as_bytes());
        any_interesting |= interesting;
        if let Some(body) = line.message.strip_prefix("NVRM: Xid (") {
            assert!(
                xid_parser::fuzz_checks::xid_readings_agree(body),
                "one-pass XID reading differs: {body:?}"
            );
        }
        let parsed = parse_message(&line.message);
        assert!(
            interesting || parsed.is_none(),
            "prefilter rejected a message that parses"
        );
        let meta = RecordMeta {
            seq: Some(i as u64),
            monotonic_usec: line.monotonic_usec,
            ..Default::default()
        };
        scanner.push(meta, &line.message, &mut events);
        if let Some(t) = line.monotonic_usec {
            scanner.flush_expired(t, &mut events);
        }
    }
    scanner.finish(&mut events);
    assert!(!scanner.has_pending());
    if !any_interesting {
        assert!(events.is_empty(), "event from input without markers");
    }
    for ev in &events {
        let first = ev.message.lines().next().unwrap_or("");
        assert!(
            Scanner::interesting(first.as_bytes()),
            "event whose first line has no marker: {first:?}"
        );
        if !ev.pci_address.is_empty() && !ev.attributes.contains_key("pci_note") {
            assert_eq!(
                normalize_pci(&ev.pci_address).as_deref(),
                Some(ev.pci_address.as_str())
            );
        }
        assert_ne!(ev.action, 0);
        assert_eq!(ev.count, 1);
    }
});
