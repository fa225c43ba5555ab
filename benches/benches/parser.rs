//! Parser + classifier throughput, with baselines measured in the same run so the
//! results read as ratios.
//!
//! What it shows:
//!
//! - `mixed_log` (bytes/s): a realistic `dmesg` log, mostly non-GPU lines (~1 GPU
//!   line in 500), through gpuwatch's saved-log hot path
//!   ([`gpuwatch_benches::scan_lines`]: whole-line prefilter → `parse_line` →
//!   `Scanner::push`, i.e. parse + multi-record assembly + classification), next to
//!   a plain `regex` implementation (timestamp + `NVRM: Xid (PCI:…): N, pid=…,
//!   name=…` captures, nothing classified) and the `rmesg` crate's line parser
//!   (`rmesg::klogctl::entry_from_line`, header parse only, nothing matched).
//! - `xid_storm` (lines/s): every line an XID (13/31/43/79/94, several GPUs),
//!   each parsed and classified into an event handed out borrowed (as `scan`
//!   reads); same baselines, and the same path with owned events, recycled
//!   (`Scanner::recycle`) or dropped (fresh strings per event, as the agent's
//!   reader, whose events leave for another thread).
//! - `classify` (events/s): `Policy::classify` alone on the storm's events
//!   (table lookup, context window, reason/name strings).
//!
//! Targets: ≥ 1 GB/s on the mixed log, ≥ 10 M XID lines/s parsed + classified on
//! one core, ≥ 10× rmesg's per-line parse. The `rg` comparison of the whole
//! binary is `benches/scripts/rg-compare.sh` (and its `storm` mode for
//! `gpuwatch scan --format json` end to end); allocations per event are counted
//! in `tests/allocations.rs`.
//!
//! Run: `cargo bench -p gpuwatch-benches --bench parser -- --warm-up-time 1 --measurement-time 3`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpuwatch_benches::{
    mixed_log, scan_lines, scan_lines_dropping, scan_lines_recycling, xid_storm,
};
use std::hint::black_box;
use std::sync::Arc;
use xid_parser::{ContextWindow, Policy, Scanner};

fn regex_scan(re: &regex::Regex, lines: &[&str]) -> usize {
    let mut n = 0;
    for l in lines {
        if let Some(c) = re.captures(l) {
            n += black_box(c.get(3).map_or(0, |m| m.as_str().len()));
        }
    }
    n
}

fn rmesg_scan(lines: &[&str]) -> usize {
    let mut n = 0;
    for l in lines {
        if let Ok(e) = rmesg::klogctl::entry_from_line(l) {
            n += black_box(e.message.len());
        }
    }
    n
}

const XID_RE: &str = r"^\[\s*(\d+\.\d+)\]\s+NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)(?:, pid=([^,]*))?(?:, name=([^,]*))?";

fn bench(c: &mut Criterion) {
    let policy = Arc::new(Policy::default());
    let re = regex::Regex::new(XID_RE).expect("valid regex");

    let log = mixed_log(8 << 20);
    let text = String::from_utf8(log.clone()).expect("utf8");
    let byte_lines: Vec<&[u8]> = log
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let str_lines: Vec<&str> = text.lines().collect();
    // rmesg's parser wants the `<PRI>` prefix (dmesg -r / klogctl form).
    let raw: Vec<String> = str_lines.iter().map(|l| format!("<6>{l}")).collect();
    let raw_lines: Vec<&str> = raw.iter().map(String::as_str).collect();

    let mut g = c.benchmark_group("mixed_log");
    g.throughput(Throughput::Bytes(log.len() as u64));
    g.bench_function("gpuwatch_parse_line_scan_classify", |b| {
        let mut scanner = Scanner::new(Arc::clone(&policy));
        let mut out = Vec::new();
        b.iter(|| black_box(scan_lines(&byte_lines, &mut scanner, &mut out)))
    });
    g.bench_function("regex_baseline", |b| {
        b.iter(|| black_box(regex_scan(&re, &str_lines)))
    });
    g.bench_function("rmesg_entry_from_line", |b| {
        b.iter(|| black_box(rmesg_scan(&raw_lines)))
    });
    g.finish();

    let storm = xid_storm(100_000);
    let storm_bytes: Vec<&[u8]> = storm.iter().map(|s| s.as_bytes()).collect();
    let storm_str: Vec<&str> = storm.iter().map(String::as_str).collect();
    let storm_raw: Vec<String> = storm.iter().map(|l| format!("<3>{l}")).collect();
    let storm_raw_str: Vec<&str> = storm_raw.iter().map(String::as_str).collect();
    let mut g = c.benchmark_group("xid_storm");
    g.throughput(Throughput::Elements(storm.len() as u64));
    g.bench_function("gpuwatch_parse_line_scan_classify", |b| {
        let mut scanner = Scanner::new(Arc::clone(&policy));
        let mut out = Vec::new();
        b.iter(|| black_box(scan_lines(&storm_bytes, &mut scanner, &mut out)))
    });
    g.bench_function("gpuwatch_owned_events_recycled", |b| {
        let mut scanner = Scanner::new(Arc::clone(&policy));
        let mut out = Vec::new();
        b.iter(|| black_box(scan_lines_recycling(&storm_bytes, &mut scanner, &mut out)))
    });
    g.bench_function("gpuwatch_owned_events_dropped", |b| {
        let mut scanner = Scanner::new(Arc::clone(&policy));
        let mut out = Vec::new();
        b.iter(|| black_box(scan_lines_dropping(&storm_bytes, &mut scanner, &mut out)))
    });
    g.bench_function("regex_baseline", |b| {
        b.iter(|| black_box(regex_scan(&re, &storm_str)))
    });
    g.bench_function("rmesg_entry_from_line", |b| {
        b.iter(|| black_box(rmesg_scan(&storm_raw_str)))
    });
    g.finish();

    // The storm's events, unclassified, for the classifier alone.
    let mut events = Vec::new();
    let mut scanner = Scanner::new(Arc::clone(&policy));
    for l in &storm_bytes[..10_000] {
        let line = xid_parser::parse_line(l);
        let meta = xid_parser::RecordMeta {
            monotonic_usec: line.monotonic_usec,
            ..Default::default()
        };
        scanner.push(meta, &line.message, &mut events);
    }
    for ev in &mut events {
        ev.set_action(gpuwatch_proto::Action::Unspecified);
        ev.policy_reason.clear();
        ev.name.clear();
    }
    let mut g = c.benchmark_group("classify");
    g.throughput(Throughput::Elements(events.len() as u64));
    g.bench_function("policy_classify", |b| {
        let mut ctx = ContextWindow::new();
        b.iter(|| {
            for ev in events.iter_mut() {
                policy.classify(&mut ctx, ev);
            }
            black_box(events.len())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
