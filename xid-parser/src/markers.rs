//! The fault markers of [`Scanner::interesting_line`](crate::Scanner::interesting_line),
//! searched for in a whole buffer at once.

use aho_corasick::{AhoCorasick, MatchKind, packed};

/// Every byte string that makes a raw saved-log line pass
/// [`Scanner::interesting_line`](crate::Scanner::interesting_line): the message
/// markers of [`Scanner::interesting`](crate::Scanner::interesting) and the
/// backslash of a kmsg `\xNN` escape.
pub const LINE_MARKERS: [&str; 24] = [
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
    "EDAC ",
    // Last: searched for apart (see `MarkerFinder::find`).
    "\\",
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
            .extend(&LINE_MARKERS[..LINE_MARKERS.len() - 1])
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

    /// Start of the first marker that starts at or after `from` and ends within
    /// `hay`.
    pub fn find(&self, hay: &[u8], from: usize) -> Option<usize> {
        if from >= hay.len() {
            return None;
        }
        let hit = match &self.searcher {
            Searcher::Teddy(t) => t
                .find_in(hay, aho_corasick::Span::from(from..hay.len()))
                .map(|m| m.start()),
            Searcher::Automaton(a) => a
                .find(aho_corasick::Input::new(hay).range(from..))
                .map(|m| m.start()),
        };
        // The backslash is searched for apart, only up to the hit: a one-byte
        // literal among the others would make Teddy report candidates everywhere.
        let end = hit.unwrap_or(hay.len());
        memchr::memchr(b'\\', &hay[from..end])
            .map(|i| from + i)
            .or(hit)
    }
}

fn automaton() -> AhoCorasick {
    AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostFirst)
        .build(&LINE_MARKERS[..LINE_MARKERS.len() - 1])
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
