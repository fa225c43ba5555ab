//! ECC, dynamic page retirement and row remapping lines, and the ECC error type
//! named in free text.

/// ECC, page retirement or row remapping message outside the XID path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EccMsg<'a> {
    /// A PCI address named in the line.
    pub pci: Option<&'a str>,
    /// `sbe`, `dbe`, `corrected`, `uncorrected`, when stated.
    pub ecc_type: Option<&'static str>,
}

/// ECC error type named in free text, by precedence: `dbe` (`DBE`, `double bit`,
/// `double-bit`), `sbe` (`SBE`, `single bit`, `single-bit`), `uncorrected`
/// (`ncorrectable`, `ncorrected`), `corrected` (`orrectable`, `orrected`).
///
/// Every marker contains `BE`, `bit` or `orrect`, and the bytes around each hit tell
/// which one it is: one SIMD search for the three (no two of them can overlap, so
/// its non-overlapping hits are all of them), or two passes where the CPU has no
/// packed searcher.
pub(crate) fn ecc_type_of(s: &str) -> Option<&'static str> {
    use aho_corasick::packed;
    use std::sync::LazyLock;
    static CORES: LazyLock<Option<packed::Searcher>> = LazyLock::new(|| {
        packed::Config::new()
            .match_kind(packed::MatchKind::LeftmostFirst)
            .builder()
            .extend(["BE", "bit", "orrect"])
            .build()
    });
    let Some(cores) = CORES.as_ref() else {
        return ecc_type_two_passes(s);
    };
    let b = s.as_bytes();
    let before = |i: usize, n: usize| i.checked_sub(n).map(|start| &b[start..i]);
    let (mut sbe, mut uncorrected, mut corrected) = (false, false, false);
    for m in cores.find_iter(b) {
        let i = m.start();
        match m.pattern().as_usize() {
            0 => match before(i, 1) {
                Some(b"D") => return Some("dbe"),
                Some(b"S") => sbe = true,
                _ => {}
            },
            1 => match before(i, 7) {
                Some(b"double " | b"double-") => return Some("dbe"),
                Some(b"single " | b"single-") => sbe = true,
                _ => {}
            },
            _ => {
                let after = &b[i + 6..];
                if after.starts_with(b"able") || after.starts_with(b"ed") {
                    if before(i, 2) == Some(b"nc") {
                        uncorrected = true;
                    } else {
                        corrected = true;
                    }
                }
            }
        }
    }
    if sbe {
        Some("sbe")
    } else if uncorrected {
        Some("uncorrected")
    } else {
        corrected.then_some("corrected")
    }
}

/// [`ecc_type_of`] without the packed searcher: the markers' rare first letters
/// `B`/`b` found together, then `orrect`.
fn ecc_type_two_passes(s: &str) -> Option<&'static str> {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    static ORRECT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("orrect"));
    let b = s.as_bytes();
    let before = |i: usize, n: usize| i.checked_sub(n).map(|start| &b[start..i]);
    // `BE` and `bit` start with a `B` or `b`, rare in a driver's text: one pass for both.
    let mut sbe = false;
    for i in memchr::memchr2_iter(b'B', b'b', b) {
        if b[i..].starts_with(b"BE") {
            match before(i, 1) {
                Some(b"D") => return Some("dbe"),
                Some(b"S") => sbe = true,
                _ => {}
            }
        } else if b[i..].starts_with(b"bit") {
            match before(i, 7) {
                Some(b"double " | b"double-") => return Some("dbe"),
                Some(b"single " | b"single-") => sbe = true,
                _ => {}
            }
        }
    }
    if sbe {
        return Some("sbe");
    }
    let mut corrected = false;
    let mut at = 0;
    while let Some(i) = b.get(at..).and_then(|h| ORRECT.find(h)).map(|i| at + i) {
        at = i + 1;
        let after = &b[i + 6..];
        if after.starts_with(b"able") || after.starts_with(b"ed") {
            if before(i, 2) == Some(b"nc") {
                return Some("uncorrected");
            }
            corrected = true;
        }
    }
    corrected.then_some("corrected")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The twelve-search definition `ecc_type_of` replaced (one search per marker).
    fn ecc_type_reference(s: &str) -> Option<&'static str> {
        let has = |n: &str| s.contains(n);
        if has("DBE") || has("double bit") || has("double-bit") {
            Some("dbe")
        } else if has("SBE") || has("single bit") || has("single-bit") {
            Some("sbe")
        } else if has("ncorrectable") || has("ncorrected") {
            Some("uncorrected")
        } else if has("orrectable") || has("orrected") {
            Some("corrected")
        } else {
            None
        }
    }

    #[test]
    fn ecc_type_shapes() {
        for (text, want) in [
            ("Contained: SM (0x1). RST: No, D-RST: No", None),
            ("DBE (0x1) at 0x123", Some("dbe")),
            (
                "uncorrectable single-bit and double-bit errors",
                Some("dbe"),
            ),
            ("SBE count exceeded; Uncorrected", Some("sbe")),
            ("single bit error", Some("sbe")),
            ("Uncorrectable ECC error", Some("uncorrected")),
            ("Corrected then uncorrected", Some("uncorrected")),
            ("corrected error", Some("corrected")),
            ("Correctable", Some("corrected")),
            ("orrect only, BE, bit, xSBEy", Some("sbe")),
            ("incorrect", None),
            ("BEBE", None),
            ("", None),
        ] {
            assert_eq!(ecc_type_of(text), want, "{text}");
            assert_eq!(ecc_type_two_passes(text), want, "two passes: {text}");
            assert_eq!(ecc_type_reference(text), want, "reference: {text}");
        }
    }

    /// Each marker and near miss at every offset of a filler text, at its end and
    /// followed by more text.
    #[test]
    fn ecc_type_at_every_offset_is_the_reference() {
        for marker in [
            "DBE",
            "SBE",
            "xBE",
            "double-bit",
            "single bit",
            "doublebit",
            "Uncorrectable",
            "uncorrected",
            "Corrected",
            "orrectable",
            "orrect",
            "Bit",
            "bi",
            "rr",
        ] {
            for at in 0..90 {
                for len in [at + marker.len(), at + marker.len() + 1, 100, 129] {
                    let mut text = "Graphics Exception: ESR 0x5041b0=0x1 ".repeat(4);
                    text.truncate(at);
                    text.push_str(marker);
                    while text.len() < len {
                        text.push('x');
                    }
                    let want = ecc_type_reference(&text);
                    assert_eq!(ecc_type_of(&text), want, "{text:?}");
                    assert_eq!(ecc_type_two_passes(&text), want, "two passes: {text:?}");
                }
            }
        }
    }

    proptest::proptest! {
        /// The one-search reading and the two-pass fallback agree with the
        /// one-search-per-marker definition on text made of marker fragments, near
        /// misses and noise.
        #[test]
        fn ecc_type_matches_reference(parts in proptest::collection::vec(
            proptest::sample::select(&[
                "DBE", "SBE", "BE", "D", "S", "double", "single", " ", "-", "bit", "bits",
                "nc", "n", "c", "orrect", "able", "ed", "U", "Un", "ncorrect", "Correct",
                "error", "x", "é", "(0x1)", "B", "b", "bi", "BEE", "Bbit",
            ][..]),
            0..24,
        )) {
            let text = parts.concat();
            let want = ecc_type_reference(&text);
            proptest::prop_assert_eq!(ecc_type_of(&text), want, "{}", text);
            proptest::prop_assert_eq!(ecc_type_two_passes(&text), want, "two passes: {}", text);
        }
    }
}
