//! The fault markers of [`Scanner::interesting_line`](crate::Scanner::interesting_line),
//! searched for in a whole buffer at once.

use aho_corasick::{AhoCorasick, MatchKind, packed};

/// Every byte string that makes a raw saved-log line pass
/// [`Scanner::interesting_line`](crate::Scanner::interesting_line): the message
/// markers of [`Scanner::interesting`](crate::Scanner::interesting) and the
/// backslash of a kmsg `\xNN` escape.
pub const LINE_MARKERS: [&str; 36] = [
    // The mlx5 NIC driver's health and cable module lines (with `Link up`,
    // `Link down` and the markers after `EDAC ` below): the lines' own words,
    // not `mlx5_core`, most of whose lines are no fault and would all be
    // decoded. Placed where they cost the search least (see `SEARCHED`).
    "compromised",
    "Port module",
    "Fatal error",
    "NVRM",
    "nVRM",
    "NVLink",
    "nVLink",
    "NVLINK",
    "nVLINK",
    "Xid",
    "AER",
    "[Hardware Error]",
    "    [",
    "device [",
    "PCIe Bus Error",
    "Machine Check",
    "Machine check",
    "machine check",
    "nvidia-",
    "nvidia:",
    "nvidia ",
    "nvlink",
    "nvswitch",
    "temperature",
    "mce:",
    "Link up",
    "Link down",
    "EDAC ",
    // The mlx5 firmware command timeout, slot power, health recovery and health
    // dump lines, and the transmit watchdog (see `SEARCHED` for their places).
    "command resource",
    "the PCIe slot",
    "NETDEV WATCHDOG",
    "done completion",
    "recovery failed",
    "PCI reads still",
    "synd 0x",
    // Last: searched for apart (see `MarkerFinder::find`).
    "\\",
];

/// What the SIMD searcher looks for: each marker, or the end of it that tells it
/// apart best, with the number of bytes of the marker before that end (checked at
/// each hit). Teddy tells patterns apart by their first three bytes: `tem` (every
/// `system`), `dev` (`device`), `PCI`, `nvi` (`nvidia_modprobe`) and `   ` (padded
/// timestamps) start hundreds of thousands of candidates per 50 MB of a real-looking
/// log that all fail; `mpe`, `e [`, ` Bu`, `ia-` and `  [` start almost none.
///
/// The order matters too: Teddy puts patterns into buckets by their place in the
/// list and a bucket passes any mix of its patterns' nibbles, so one literal in the
/// wrong bucket makes it pass common text. The NIC markers' literals and places
/// (`mpromised` and two others first, `Link up`/`Link down` before `EDAC `) were
/// measured on the benches' mixed log: as fast as the list without them, where
/// appending them to the end, or `omised` for `compromised`, made the search 2-10
/// times slower. The later NIC markers' literals (the last seven) are each the end
/// that, appended alone, left the search as fast as without it (measured one by
/// one: `ne completion` where `one completion` or `pletion` cost 7×, `y failed`
/// where `very failed` cost 6×), and none matches the driver's frequent `PCIe slot
/// advertised sufficient power` line. Together they still cost: past 32 literals
/// Teddy needs more buckets, and on the benches' mixed log the search went from
/// about 15 GB/s to about 6 GB/s (same run, 2-core machine under load).
const SEARCHED: [(&str, usize); 35] = [
    ("mpromised", 2), // "compromised"
    ("Port module", 0),
    ("Fatal error", 0),
    ("NVRM", 0),
    ("nVRM", 0),
    ("NVLink", 0),
    ("nVLink", 0),
    ("NVLINK", 0),
    ("nVLINK", 0),
    ("Xid", 0),
    ("AER", 0),
    ("[Hardware Error]", 0),
    ("  [", 2),        // "    ["
    ("e [", 5),        // "device ["
    (" Bus Error", 4), // "PCIe Bus Error"
    ("Machine Check", 0),
    ("Machine check", 0),
    ("machine check", 0),
    ("ia-", 4), // "nvidia-"
    ("ia:", 4), // "nvidia:"
    ("ia ", 4), // "nvidia "
    ("nvlink", 0),
    ("nvswitch", 0),
    ("mperature", 2), // "temperature"
    ("mce:", 0),
    ("Link up", 0),
    ("Link down", 0),
    ("EDAC ", 0),
    ("mand resource", 3), // "command resource"
    ("e PCIe slot", 2),   // "the PCIe slot"
    ("V WATCHDOG", 5),    // "NETDEV WATCHDOG"
    ("ne completion", 2), // "done completion"
    ("y failed", 7),      // "recovery failed"
    ("ds still", 7),      // "PCI reads still"
    ("nd 0x", 2),         // "synd 0x"
];

/// Finds [`LINE_MARKERS`] in a buffer of many lines, so a reader looks at line
/// bounds only around hits (as `grep` does) instead of testing every line: a line
/// passes [`Scanner::interesting_line`](crate::Scanner::interesting_line) exactly when
/// a marker starts in it (no marker contains `\n`).
///
/// Uses the SIMD "Teddy" searcher where the CPU has it (x86-64 with SSSE3/AVX2,
/// aarch64 NEON), else an Aho-Corasick automaton.
#[derive(Debug, Clone)]
pub struct MarkerFinder {
    searcher: Searcher,
}

#[derive(Debug, Clone)]
enum Searcher {
    Teddy(packed::Searcher),
    /// Where the CPU has no Teddy (built only then: it costs more to build).
    Automaton(AhoCorasick),
}

impl Default for MarkerFinder {
    fn default() -> Self {
        MarkerFinder::new()
    }
}

impl MarkerFinder {
    /// Longest marker, bytes: a buffer searched up to `end` can still hold a
    /// marker starting at `end - (MAX_MARKER_BYTES - 1)` once more bytes arrive.
    pub const MAX_MARKER_BYTES: usize = 16;

    /// The finder (builds the searchers; reuse it).
    pub fn new() -> MarkerFinder {
        let teddy = packed::Config::new()
            .match_kind(packed::MatchKind::LeftmostFirst)
            .builder()
            .extend(SEARCHED.iter().map(|(l, _)| l))
            .build();
        let searcher = match teddy {
            Some(t) => Searcher::Teddy(t),
            None => Searcher::Automaton(automaton()),
        };
        MarkerFinder { searcher }
    }

    /// One finder for the whole process, built at first use: building costs more
    /// than searching a small input.
    pub fn shared() -> &'static MarkerFinder {
        static SHARED: std::sync::LazyLock<MarkerFinder> =
            std::sync::LazyLock::new(MarkerFinder::new);
        &SHARED
    }

    /// Start of a marker that starts at or after `from` and ends within `hay`, in
    /// the first line after `from` that holds one (the first marker of that line,
    /// or one overlapping it); `None` when no marker starts at or after `from`.
    pub fn find(&self, hay: &[u8], from: usize) -> Option<usize> {
        let mut at = from;
        let hit = loop {
            if at >= hay.len() {
                break None;
            }
            let found = match &self.searcher {
                Searcher::Teddy(t) => t
                    .find_in(hay, aho_corasick::Span::from(at..hay.len()))
                    .map(|m| (m.start(), m.pattern().as_usize())),
                Searcher::Automaton(a) => a
                    .find(aho_corasick::Input::new(hay).range(at..))
                    .map(|m| (m.start(), m.pattern().as_usize())),
            };
            let Some((start, pattern)) = found else {
                break None;
            };
            let (literal, before) = SEARCHED[pattern];
            let marker = LINE_MARKERS[pattern];
            // The marker is the searched end and the `before` bytes ahead of it.
            if let Some(m) = start.checked_sub(before)
                && m >= from
                && hay[m..start] == marker.as_bytes()[..before]
            {
                debug_assert!(marker.ends_with(literal));
                break Some(m);
            }
            at = start + 1;
        };
        // The backslash is searched for apart, only up to the hit: a one-byte
        // literal among the others would make Teddy report candidates everywhere.
        let end = hit.unwrap_or(hay.len());
        memchr::memchr(b'\\', &hay[from.min(end)..end])
            .map(|i| from + i)
            .or(hit)
    }
}

fn automaton() -> AhoCorasick {
    AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostFirst)
        .build(SEARCHED.iter().map(|(l, _)| l))
        .expect("a handful of short literals always builds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_searchers_are_fast_where_the_cpu_allows() {
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            assert!(matches!(MarkerFinder::new().searcher, Searcher::Teddy(_)));
        }
        assert_eq!(LINE_MARKERS.last(), Some(&"\\"));
        // Each searched literal is its marker's end, `before` bytes in.
        for ((literal, before), marker) in SEARCHED.iter().zip(LINE_MARKERS) {
            assert!(marker.ends_with(literal), "{marker:?}");
            assert_eq!(marker.len(), literal.len() + before, "{marker:?}");
        }
    }

    #[test]
    fn longest_marker_bound_holds() {
        let longest = LINE_MARKERS.iter().map(|m| m.len()).max();
        assert_eq!(longest, Some(MarkerFinder::MAX_MARKER_BYTES));
        assert!(LINE_MARKERS.iter().all(|m| !m.contains('\n')));
    }

    #[test]
    fn finds_each_marker_at_every_offset() {
        // The SIMD searcher and the fallback of CPUs without it.
        for f in [
            MarkerFinder::new(),
            MarkerFinder {
                searcher: Searcher::Automaton(automaton()),
            },
        ] {
            finds_each_marker_at_every_offset_with(&f);
        }
    }

    fn finds_each_marker_at_every_offset_with(f: &MarkerFinder) {
        for m in LINE_MARKERS {
            for pad in 0..70 {
                let hay = format!("{}{m}tail", "x".repeat(pad));
                assert_eq!(f.find(hay.as_bytes(), 0), Some(pad), "{hay:?}");
                assert_eq!(f.find(hay.as_bytes(), pad + 1), None, "{hay:?}");
                assert!(crate::Scanner::interesting_line(hay.as_bytes()), "{hay:?}");
                // A marker cut at the end of the buffer is not found.
                let cut = &hay.as_bytes()[..pad + m.len() - 1];
                assert_eq!(f.find(cut, 0), None, "{hay:?}");
            }
        }
    }
}
