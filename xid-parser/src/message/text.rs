//! Byte-level text helpers the parsers share: numbers, blanks, separators, and
//! the `Link N` field.

pub(super) fn leading_u32(s: &str) -> Option<(u32, &str)> {
    digits_u32(s.as_bytes(), 0).map(|(n, end)| (n, &s[end..]))
}

/// One to nine ASCII digits at `b[i..]`: their value and the index after them
/// (`None` for none or more than nine).
#[inline]
pub(super) fn digits_u32(b: &[u8], mut i: usize) -> Option<(u32, usize)> {
    let from = i;
    let mut n = 0u32;
    while let Some(&c) = b.get(i) {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        if i - from == 9 {
            return None;
        }
        n = n * 10 + u32::from(d);
        i += 1;
    }
    (i > from).then_some((n, i))
}

/// Index of the first `needle` at or after `from`: eight bytes at a time (a word
/// compare instead of a call into memchr, whose set-up costs more than the few
/// bytes a field of an XID line has).
#[inline]
pub(crate) fn find_byte(b: &[u8], from: usize, needle: u8) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut i = from;
    while let Some(w) = b.get(i..).and_then(|r| r.first_chunk::<8>()) {
        let x = u64::from_le_bytes(*w) ^ (LO * u64::from(needle));
        // A zero byte of `x` (a byte equal to `needle`) sets its top bit here; the
        // lowest such bit is exact (borrows only run upwards from it).
        let found = x.wrapping_sub(LO) & !x & HI;
        if found != 0 {
            return Some(i + (found.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    b.get(i..)?.iter().position(|&c| c == needle).map(|p| i + p)
}

/// Index of the first byte at or after `i` that is not ASCII whitespace, or `None`
/// when that byte is not ASCII (Unicode whitespace may follow: the general path
/// decides).
#[inline]
pub(super) fn skip_ascii_ws(b: &[u8], mut i: usize) -> Option<usize> {
    // Nearly always one blank, then the next field.
    let graphic = |c: Option<&u8>| c.is_some_and(|&c| c > b' ' && c < 0x80);
    if b.get(i) == Some(&b' ') && graphic(b.get(i + 1)) {
        return Some(i + 1);
    }
    while let Some(&c) = b.get(i) {
        if !is_ascii_ws(c) {
            return (c < 0x80).then_some(i);
        }
        i += 1;
    }
    Some(i)
}

/// Whitespace as `char::is_whitespace` sees it, ASCII part.
pub(super) fn is_ascii_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t'..=b'\r')
}

/// `s.trim_start()`: a byte loop over ASCII whitespace, `str::trim_start` only when
/// a non-ASCII character follows (it may be Unicode whitespace).
pub(super) fn trim_start(s: &str) -> &str {
    match skip_ascii_ws(s.as_bytes(), 0) {
        Some(i) => &s[i..],
        None => s.trim_start(),
    }
}

/// `s.trim_start_matches(set)` for a set of ASCII characters (bytes of other
/// characters never equal an ASCII byte, so bytes are exact).
pub(super) fn trim_start_bytes<'a>(s: &'a str, set: &[u8]) -> &'a str {
    let i = s.bytes().position(|c| !set.contains(&c)).unwrap_or(s.len());
    &s[i..]
}

/// `s.trim_end_matches(set)` for a set of ASCII characters.
///
/// A plain loop: the name of every XID line goes through it, and the iterator form
/// (`rposition`) is left out of line wherever LLVM inlines this, a call per line.
#[inline]
pub(super) fn trim_end_bytes<'a>(s: &'a str, set: &[u8]) -> &'a str {
    let b = s.as_bytes();
    let mut end = b.len();
    while end > 0 && set.iter().any(|&c| c == b[end - 1]) {
        end -= 1;
    }
    &s[..end]
}

/// `s.find(", ")`.
pub(super) fn find_comma_space(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    (1..b.len())
        .find(|&i| b[i] == b' ' && b[i - 1] == b',')
        .map(|i| i - 1)
}

/// `s.split_whitespace().next()`, without the iterator for the usual all-ASCII token.
pub(super) fn first_word(s: &str) -> Option<&str> {
    if !s.is_empty() && s.bytes().all(|c| c.is_ascii_graphic()) {
        Some(s)
    } else {
        s.split_whitespace().next()
    }
}

/// `Link 32`, `link 3`, `Link 00` → number.
pub(crate) fn link_in(s: &str) -> Option<u32> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(off) = memchr::memchr2(b'L', b'l', &b[from..]) {
        let i = from + off;
        from = i + 1;
        if b.get(i + 1..i + 4) == Some(b"ink") && (i == 0 || !b[i - 1].is_ascii_alphanumeric()) {
            let rest = s[i + 4..].trim_start_matches([' ', '#']);
            if let Some((n, _)) = leading_u32(rest) {
                return Some(n);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_byte_finds_the_first_one() {
        for len in 0..40 {
            for a in 0..=len {
                for b in a..=len {
                    let mut h = vec![b'x'; len];
                    // A byte just above the needle can look like one to the word test.
                    for (at, c) in [(a, b','), (b, b'-')] {
                        if at < len {
                            h[at] = c;
                        }
                    }
                    for from in 0..=len {
                        let want = h[from..].iter().position(|&c| c == b',').map(|p| from + p);
                        assert_eq!(find_byte(&h, from, b','), want, "{len} {a} {b} {from}");
                    }
                }
            }
        }
    }
}
