//! Fuzzes the whole-buffer marker search `gpuwatch scan` uses to skip lines
//! without looking at them (`MarkerFinder`).
//!
//! Invariants: no panic; every hit is at or after the start asked for and a
//! marker of `LINE_MARKERS` starts there; searching hit by hit from the start
//! of the buffer (skipping to the next line after each hit) marks exactly the
//! lines `Scanner::interesting_line` accepts: a line the search skips can
//! never hold a fault.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use xid_parser::{LINE_MARKERS, MarkerFinder, Scanner};

/// Built once: building the searchers costs far more than one search.
static FINDER: OnceLock<MarkerFinder> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let finder = FINDER.get_or_init(MarkerFinder::new);
    let lines: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let want: Vec<bool> = lines.iter().map(|l| Scanner::interesting_line(l)).collect();
    let mut got = vec![false; lines.len()];
    let mut from = 0;
    while let Some(hit) = finder.find(data, from) {
        assert!(hit >= from && hit < data.len());
        assert!(
            LINE_MARKERS
                .iter()
                .any(|m| data[hit..].starts_with(m.as_bytes())),
            "no marker at {hit}"
        );
        let line = data[..hit].iter().filter(|&&b| b == b'\n').count();
        got[line] = true;
        from = hit + memchr_newline(&data[hit..]).map_or(data.len() - hit, |i| i + 1);
    }
    assert_eq!(got, want, "{:?}", String::from_utf8_lossy(data));
});

fn memchr_newline(hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == b'\n')
}
