//! Profiling driver for the parser hot paths (not a benchmark): runs the same
//! loop as `benches/parser.rs` over the mixed log or the XID storm, so a profiler
//! (`valgrind --tool=callgrind`, `perf record`) sees only the parser.
//!
//! Run: `cargo build --profile bench -p gpuwatch-benches --example parser_profile`,
//! then `valgrind --tool=callgrind target/release/examples/parser_profile storm 20000`
//! (modes: `mixed BYTES`, `storm LINES`: events borrowed, as `scan` reads them;
//! `storm-recycle LINES` / `storm-drop LINES`: owned events, recycled / dropped;
//! `storm-json LINES`: borrowed events written as `scan --format json` writes them;
//! prints the number of events and the fastest and median pass; `REPS` after
//! `LINES` repeats the pass).

use gpuwatch_benches::{
    mixed_log, scan_lines, scan_lines_dropping, scan_lines_recycling, xid_storm,
};
use std::sync::Arc;
use xid_parser::{Policy, Scanner};

/// Each line's events as JSON lines into a buffer emptied every 64 KiB, as `scan`
/// writes them (the kernel's XID line in one step, else prefilter and parse;
/// borrowed events).
fn json_lines(lines: &[&[u8]], scanner: &mut Scanner) -> usize {
    let (mut n, mut buf) = (0, Vec::with_capacity(128 * 1024));
    for l in lines {
        if buf.len() >= 64 * 1024 {
            std::hint::black_box(&buf);
            buf.clear();
        }
        let mut write = |ev: &gpuwatch_proto::FaultEventRef<'_>| {
            n += 1;
            gpuwatch_proto::json::write_fault_event_ref(ev, &mut buf);
            buf.push(b'\n');
        };
        // The reader's order: the kernel's XID line in one step, else prefilter and
        // the general path.
        if scanner.push_kernel_xid_line(l, &mut write) || !Scanner::interesting_line(l) {
            continue;
        }
        let line = xid_parser::parse_line(l);
        let meta = xid_parser::RecordMeta {
            monotonic_usec: line.monotonic_usec,
            ..Default::default()
        };
        scanner.push_view(meta, &line.message, &mut write);
    }
    n
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "storm".to_owned());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let reps: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
    let policy = Arc::new(Policy::default());
    let mut scanner = Scanner::new(policy);
    let mut out = Vec::new();
    let owned: Vec<Vec<u8>> = match mode.as_str() {
        "mixed" => mixed_log(n)
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect(),
        _ => xid_storm(n).into_iter().map(String::into_bytes).collect(),
    };
    let lines: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
    let mut events = 0;
    // Fastest and median pass, for A/B runs of two builds (a profiler reads the
    // instructions): the fastest is what the code can do, the median what a busy
    // machine gave it.
    let mut passes = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = std::time::Instant::now();
        events += match mode.as_str() {
            "storm-drop" => scan_lines_dropping(&lines, &mut scanner, &mut out),
            "storm-recycle" => scan_lines_recycling(&lines, &mut scanner, &mut out),
            "storm-json" => json_lines(&lines, &mut scanner),
            _ => scan_lines(&lines, &mut scanner, &mut out),
        };
        passes.push(t.elapsed());
    }
    passes.sort();
    let rate = |d: std::time::Duration| lines.len() as f64 / d.as_secs_f64() / 1e6;
    println!(
        "{mode}: {} lines x {reps}, {events} events; fastest pass {:.2} M lines/s, median {:.2}",
        lines.len(),
        rate(passes[0]),
        rate(passes[passes.len() / 2]),
    );
}
