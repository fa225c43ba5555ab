//! How fast a saved-log reader can go with the parser's prefilters (a model for
//! `gpuwatch scan`, without JSON output): reads FILE in 256 KiB blocks, splits lines
//! with memchr, skips lines that fail `Scanner::interesting_line` (pushing `""` for
//! them only while an event is held), parses and pushes the rest. Prints lines,
//! events and MiB/s. Used to size the `rg` comparison (`benches/scripts/rg-compare.sh`).
//!
//! Run: `cargo build --profile bench -p gpuwatch-benches --example scan_file`, then
//! `target/release/examples/scan_file FILE`.

use std::io::Read;
use std::sync::Arc;
use std::time::Instant;
use xid_parser::{Policy, RecordMeta, Scanner, parse_line};

fn main() -> std::io::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/dev/stdin".to_owned());
    let t0 = Instant::now();
    let mut file = std::fs::File::open(&path)?;
    let mut scanner = Scanner::new(Arc::new(Policy::default()));
    let mut out = Vec::new();
    let (mut lines, mut events, mut bytes) = (0u64, 0u64, 0u64);
    let mut buf = vec![0u8; 256 * 1024];
    let mut filled = 0;
    loop {
        let n = file.read(&mut buf[filled..])?;
        bytes += n as u64;
        filled += n;
        let eof = n == 0;
        let mut start = 0;
        while start < filled {
            let end = match memchr::memchr(b'\n', &buf[start..filled]) {
                Some(o) => start + o,
                None if eof => filled,
                None => break,
            };
            let line = &buf[start..end];
            start = end + 1;
            lines += 1;
            if !Scanner::interesting_line(line) {
                if scanner.has_pending() {
                    scanner.push(RecordMeta::default(), "", &mut out);
                }
            } else {
                let l = parse_line(line);
                if l.facility.is_none_or(|f| f == 0) {
                    let meta = RecordMeta {
                        seq: l.seq,
                        monotonic_usec: l.monotonic_usec,
                        time_unix_nano: l.time_unix_nano,
                        facility: l.facility,
                        level: l.level,
                    };
                    scanner.push(meta, &l.message, &mut out);
                }
            }
            events += out.len() as u64;
            out.clear();
        }
        buf.copy_within(start.min(filled)..filled, 0);
        filled -= start.min(filled);
        if eof {
            break;
        }
        if filled == buf.len() {
            // A line longer than the block: drop it (gpuwatch scan skips them too).
            filled = 0;
        }
    }
    scanner.finish(&mut out);
    events += out.len() as u64;
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "{lines} lines, {events} events, {:.1} ms, {:.0} MiB/s",
        dt * 1e3,
        bytes as f64 / dt / 1048576.0
    );
    Ok(())
}
