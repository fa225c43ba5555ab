//! Fuzzes the saved-log line reader (`parse_line`) on the shapes `gpuwatch scan`
//! meets: `dmesg -x` facility/level prefixes, NUL padding before a line, and any
//! bytes after them.
//!
//! Invariants: no panic; NUL bytes before a line change nothing (the line is
//! read as without them); a `dmesg -x` prefix with a known facility and level
//! sets exactly that facility and level and the rest reads as the line alone
//! (same message and monotonic time).
#![no_main]

use libfuzzer_sys::fuzz_target;
use xid_parser::parse_line;

/// util-linux dmesg.c names.
const FACILITIES: [&str; 4] = ["kern", "user", "daemon", "local7"];
const FACILITY_NUMBERS: [u8; 4] = [0, 1, 3, 23];
const LEVELS: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug",
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    // Never panics on anything.
    let _ = parse_line(rest);
    let body: Vec<u8> = rest.iter().copied().filter(|&b| b != b'\n').collect();
    if body.first() == Some(&0) {
        return;
    }
    let plain = parse_line(&body);
    // NUL padding before the line.
    let mut padded = vec![0u8; usize::from(sel & 0x1f) + 1];
    padded.extend_from_slice(&body);
    assert_eq!(parse_line(&padded), plain);
    // `dmesg -x` prefix before a line that starts with a bracket timestamp or text.
    let f = usize::from(sel >> 5) % FACILITIES.len();
    let l = usize::from(sel) % LEVELS.len();
    if body
        .first()
        .is_some_and(|&b| b == b'[' || b.is_ascii_alphabetic())
    {
        let mut prefixed = format!("{:<6}:{:<6}: ", FACILITIES[f], LEVELS[l]).into_bytes();
        prefixed.extend_from_slice(&body);
        let x = parse_line(&prefixed);
        assert_eq!(x.facility, Some(FACILITY_NUMBERS[f]));
        assert_eq!(x.level, Some(l as u8));
        if body[0] == b'[' && plain.monotonic_usec.is_some() {
            assert_eq!(x.monotonic_usec, plain.monotonic_usec);
            assert_eq!(x.message, plain.message);
        }
    }
});
