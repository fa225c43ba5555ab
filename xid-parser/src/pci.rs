//! PCI address normalisation (`PCI:0000:3B:00` → `0000:3b:00.0`).

/// Parsed PCI address parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bdf {
    domain: u32,
    bus: u8,
    dev: u8,
    func: u8,
}

/// Value of 1..=`max_len` (at most 8) hex digits; `None` for anything else.
fn hex_field(s: &[u8], max_len: usize) -> Option<u32> {
    if s.is_empty() || s.len() > max_len {
        return None;
    }
    let mut v = 0u32;
    for &b in s {
        v = v << 4 | u32::from(hex_digit(b)?);
    }
    Some(v)
}

fn hex_digit(b: u8) -> Option<u8> {
    let v = HEX_VALUE[usize::from(b)];
    (v < 16).then_some(v)
}

/// Each byte's hex value, 0xff for a byte that is not a hex digit: one load per
/// digit instead of three range tests (every XID line's address is read digit by
/// digit).
pub(crate) static HEX_VALUE: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

// Hand-written rather than `split`/`from_str_radix`: this runs for every XID of a
// storm (twice), so it avoids iterator and formatting machinery.
fn parse_bdf(addr: &str) -> Option<Bdf> {
    let b = addr.as_bytes();
    let b = b.strip_prefix(b"PCI:").unwrap_or(b);
    usual_bdf(b).or_else(|| parse_bdf_general(addr))
}

/// The driver's own forms, `dddd:bb:dd` and `dddd:bb:dd.f` (no `PCI:` prefix):
/// `None` for anything else, valid or not, which the general parser decides.
#[inline]
fn usual_bdf(b: &[u8]) -> Option<Bdf> {
    let [d0, d1, d2, d3, b':', b0, b1, b':', v0, v1, rest @ ..] = b else {
        return None;
    };
    let func = match rest {
        [] => 0,
        [b'.', f] => hex_digit(*f).filter(|&f| f <= 7)?,
        _ => return None,
    };
    let h = |c: &u8| HEX_VALUE[usize::from(*c)];
    let digits = [h(d0), h(d1), h(d2), h(d3), h(b0), h(b1), h(v0), h(v1)];
    // Every value below 16 (no 0xff): one OR over the eight instead of eight tests.
    let all_hex = digits.iter().fold(0, |a, &d| a | d) < 16;
    let pair = |i: usize| digits[i] << 4 | digits[i + 1];
    (all_hex && pair(6) <= 0x1f).then(|| Bdf {
        domain: u32::from(pair(0)) << 8 | u32::from(pair(2)),
        bus: pair(4),
        dev: pair(6),
        func,
    })
}

/// `a == b` for text as short as a PCI address: up to 16 bytes compared as two
/// overlapping words, inline (a call to `memcmp` costs several times that, and the
/// scanner compares addresses for every XID line of a storm).
#[inline]
pub(crate) fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    match (
        a.first_chunk::<8>(),
        a.last_chunk::<8>(),
        b.first_chunk::<8>(),
        b.last_chunk::<8>(),
    ) {
        (Some(a0), Some(a1), Some(b0), Some(b1)) if a.len() <= 16 => {
            u64::from_ne_bytes(*a0) == u64::from_ne_bytes(*b0)
                && u64::from_ne_bytes(*a1) == u64::from_ne_bytes(*b1)
        }
        _ => a == b,
    }
}

/// True when `addr` (no `PCI:` prefix) is in one of the driver's own forms
/// (`dddd:bb:dd`, `dddd:bb:dd.f`) and valid: then [`is_pci`] is true too.
pub(crate) fn is_usual_pci(addr: &[u8]) -> bool {
    usual_bdf(addr).is_some()
}

/// Every form [`parse_bdf`] accepts; the fast path there must agree with it.
fn parse_bdf_general(addr: &str) -> Option<Bdf> {
    // `str::trim` decodes chars from both ends; an address is ASCII, so check that first.
    let trimmed = match addr.as_bytes() {
        [f, .., l] if f.is_ascii_graphic() && l.is_ascii_graphic() => addr,
        _ => addr.trim(),
    };
    let addr = trimmed.as_bytes();
    let addr = addr
        .strip_prefix(b"PCI:")
        .or_else(|| addr.strip_prefix(b"pci:"))
        .unwrap_or(addr);
    let (head, func) = match addr.iter().rposition(|&b| b == b'.') {
        Some(dot) => {
            let f = hex_field(&addr[dot + 1..], 1)?;
            if f > 7 {
                return None;
            }
            (&addr[..dot], f as u8)
        }
        None => (addr, 0),
    };
    // Tiny slices: plain loops beat memchr's call and setup here.
    let colon = |s: &[u8]| s.iter().position(|&b| b == b':');
    let c1 = colon(head)?;
    let (a, rest) = (&head[..c1], &head[c1 + 1..]);
    let (domain, bus, dev) = match colon(rest) {
        Some(c2) => {
            let (b, c) = (&rest[..c2], &rest[c2 + 1..]);
            if colon(c).is_some() {
                return None;
            }
            (hex_field(a, 8)?, hex_field(b, 2)?, hex_field(c, 2)?)
        }
        None => (0, hex_field(a, 2)?, hex_field(rest, 2)?),
    };
    if dev > 0x1f {
        return None;
    }
    Some(Bdf {
        domain,
        bus: bus as u8,
        dev: dev as u8,
        func,
    })
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl Bdf {
    /// `dddd:bb:dd.f`, lowercase (domains above `ffff` keep all their digits).
    /// Built in a stack buffer, without formatting machinery.
    fn to_normalized(self) -> String {
        let mut buf = [0u8; 20];
        let n = self.write_normalized(&mut buf);
        // Hex digits, ':' and '.': always ASCII, so the conversion cannot fail.
        std::str::from_utf8(&buf[..n]).unwrap_or("").to_owned()
    }

    /// Writes `dddd:bb:dd.f` into `buf`; returns its length (at most 17).
    fn write_normalized(self, buf: &mut [u8; 20]) -> usize {
        let domain_digits = (32 - self.domain.leading_zeros() as usize)
            .div_ceil(4)
            .max(4);
        let mut n = 0;
        for i in (0..domain_digits).rev() {
            buf[n] = HEX[((self.domain >> (i * 4)) & 0xf) as usize];
            n += 1;
        }
        for (sep, v) in [(b':', self.bus), (b':', self.dev)] {
            buf[n] = sep;
            buf[n + 1] = HEX[usize::from(v >> 4)];
            buf[n + 2] = HEX[usize::from(v & 0xf)];
            n += 3;
        }
        buf[n] = b'.';
        buf[n + 1] = HEX[usize::from(self.func & 0xf)];
        n + 2
    }
}

/// Normalises a PCI address to lowercase `dddd:bb:dd.f`: strips a `PCI:` prefix, adds
/// the `0000` domain and the `.0` function when missing, shortens NVML's 8-digit
/// domain (`00000000:3B:00.0`) to 4 digits (domains above `ffff`, as behind Intel
/// VMD, keep their digits). Returns `None` when `addr` is not a PCI address.
///
/// ```
/// use xid_parser::normalize_pci;
/// assert_eq!(normalize_pci("PCI:0000:3B:00").as_deref(), Some("0000:3b:00.0"));
/// assert_eq!(normalize_pci("3b:00.1").as_deref(), Some("0000:3b:00.1"));
/// assert_eq!(normalize_pci("00000000:3B:00.0").as_deref(), Some("0000:3b:00.0"));
/// assert_eq!(normalize_pci("GPU-1234"), None);
/// ```
pub fn normalize_pci(addr: &str) -> Option<String> {
    parse_bdf(addr).map(Bdf::to_normalized)
}

/// True when [`normalize_pci`] accepts `addr` (validation only, no allocation).
pub(crate) fn is_pci(addr: &str) -> bool {
    parse_bdf(addr).is_some()
}

/// True when `addr` looks like a PCI address someone edited before pasting the log:
/// redacted (`...`, `xxxx:xx:xx`, `****`: only `.`, `x`, `X`, `*`, `:` and hex digits,
/// at least one of `.`/`x`/`X`/`*`) or with a device number above 0x1f (no such
/// device exists; see [`edited_pci`]).
pub(crate) fn is_edited_pci(addr: &str) -> bool {
    let b = addr.as_bytes();
    !b.is_empty()
        && b.len() <= 24
        && b.iter()
            .all(|&c| c.is_ascii_hexdigit() || matches!(c, b'.' | b'x' | b'X' | b'*' | b':'))
        && (b.iter().any(|&c| matches!(c, b'.' | b'x' | b'X' | b'*'))
            || parse_bdf_any_dev(addr).is_some())
}

/// The address an edited XID line names, for the report: `Some(dddd:bb:dd.f)` for a
/// device number above 0x1f (reported as given, normalised), `None` when the
/// address was redacted (unknown).
pub(crate) fn edited_pci(addr: &str) -> Option<String> {
    parse_bdf_any_dev(addr).map(Bdf::to_normalized)
}

/// [`parse_bdf`] without the device-number limit.
fn parse_bdf_any_dev(addr: &str) -> Option<Bdf> {
    let a = addr.strip_prefix("PCI:").unwrap_or(addr);
    let (head, func) = match a.rsplit_once('.') {
        Some((h, f)) => (h, hex_field(f.as_bytes(), 1).filter(|&f| f <= 7)?),
        None => (a, 0),
    };
    let parts: Vec<&str> = head.split(':').collect();
    let (domain, bus, dev) = match parts[..] {
        [d, b, v] => (
            hex_field(d.as_bytes(), 8)?,
            hex_field(b.as_bytes(), 2)?,
            hex_field(v.as_bytes(), 2)?,
        ),
        [b, v] => (0, hex_field(b.as_bytes(), 2)?, hex_field(v.as_bytes(), 2)?),
        _ => return None,
    };
    Some(Bdf {
        domain,
        bus: bus as u8,
        dev: dev as u8,
        func: func as u8,
    })
}

/// True when `addr` is a PCI address whose normalised form is `normalized`
/// (`normalize_pci(addr).as_deref() == Some(normalized)`, without allocating).
pub(crate) fn pci_matches(addr: &str, normalized: &str) -> bool {
    let Some(bdf) = parse_bdf(addr) else {
        return false;
    };
    let mut buf = [0u8; 20];
    let n = bdf.write_normalized(&mut buf);
    &buf[..n] == normalized.as_bytes()
}

/// PCI address `domain:bus:dev.fn` of the device that `id` (the kernel's old AER
/// `id=0018` form: bus << 8 | devfn) names, in the domain of `reporter`.
pub(crate) fn pci_from_requester_id(id: &str, reporter: &str) -> Option<String> {
    let v = hex_field(id.as_bytes(), 4)?;
    let domain = parse_bdf(reporter).map_or(0, |b| b.domain);
    let devfn = v & 0xff;
    let bdf = Bdf {
        domain,
        bus: (v >> 8) as u8,
        dev: (devfn >> 3) as u8,
        func: (devfn & 7) as u8,
    };
    Some(bdf.to_normalized())
}

fn is_hex(b: u8) -> bool {
    b.is_ascii_hexdigit()
}

/// Finds the first full PCI address (`dddd:bb:dd.f`, or `bb:dd.f`) in free text,
/// e.g. `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.` → `0000:3b:00.0`.
/// The match must not be glued to other hex digits or colons.
pub fn find_pci(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(off) = memchr::memchr(b':', &b[i..]) {
        let colon = i + off;
        i = colon + 1;
        // Expect `bb:dd.f` around this colon: two hex before, two hex + '.' + hex after.
        if colon < 2 || colon + 5 > b.len() {
            continue;
        }
        if !(is_hex(b[colon - 1]) && is_hex(b[colon - 2])) {
            continue;
        }
        if !(is_hex(b[colon + 1]) && is_hex(b[colon + 2]) && b[colon + 3] == b'.') {
            continue;
        }
        if !is_hex(b[colon + 4]) {
            continue;
        }
        let end = colon + 5;
        if end < b.len() && is_hex(b[end]) {
            continue;
        }
        let mut start = colon - 2;
        // Optional domain `dddd:` (1..=8 hex digits) in front.
        if start >= 2 && b[start - 1] == b':' {
            let mut d = start - 1;
            while d > 0 && is_hex(b[d - 1]) && start - 1 - (d - 1) <= 8 {
                d -= 1;
            }
            if d < start - 1 && (d == 0 || !(b[d - 1].is_ascii_alphanumeric() || b[d - 1] == b':'))
            {
                start = d;
            }
        } else if start > 0 && (b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b':') {
            continue;
        }
        let cand = &text[start..end];
        if parse_bdf(cand).is_some() {
            return Some(cand);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_text_is_string_equality() {
        let texts: Vec<String> = (0..40)
            .flat_map(|n| {
                let base = "0000:3b:00.0-abcdefghijklmnopqrstuvwxyz0123"
                    .chars()
                    .take(n);
                let s: String = base.collect();
                let mut other = s.clone().into_bytes();
                if let Some(last) = other.last_mut() {
                    *last ^= 1;
                }
                let mut first = s.clone().into_bytes();
                if let Some(f) = first.first_mut() {
                    *f ^= 1;
                }
                [
                    s,
                    String::from_utf8(other).unwrap_or_default(),
                    String::from_utf8(first).unwrap_or_default(),
                ]
            })
            .collect();
        for a in &texts {
            for b in &texts {
                assert_eq!(same_text(a, b), a == b, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn normalises_every_driver_form() {
        for (input, want) in [
            ("PCI:0000:3B:00", Some("0000:3b:00.0")),
            ("0000:3b:00", Some("0000:3b:00.0")),
            ("0000:3b:00.0", Some("0000:3b:00.0")),
            ("3b:00.0", Some("0000:3b:00.0")),
            ("00000000:3B:00.0", Some("0000:3b:00.0")),
            ("0008:01:00", Some("0008:01:00.0")),
            ("10000:e1:00.0", Some("10000:e1:00.0")),
            ("0000:3b:20.0", None),
            ("0000:3b:00.8", None),
            ("0000:3b", None),
            ("", None),
            ("GPU-abc", None),
            ("0000:3g:00.0", None),
            ("1:2:3:4", None),
        ] {
            assert_eq!(normalize_pci(input).as_deref(), want, "{input}");
        }
    }

    #[test]
    fn finds_addresses_in_text() {
        assert_eq!(
            find_pci("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            find_pci("nvidia: probe of 0000:41:00.0 failed with error -1"),
            Some("0000:41:00.0")
        );
        assert_eq!(find_pci("at 12:34:56.7 nothing"), None);
        assert_eq!(find_pci("GPU at 3b:00.0 has"), Some("3b:00.0"));
        assert_eq!(find_pci("time 12:00:00 only"), None);
    }

    #[test]
    fn hand_written_hex_matches_format() {
        for (domain, bus, dev, func) in [
            (0u32, 0u8, 0u8, 0u8),
            (0, 0x3b, 0x1f, 7),
            (0xffff, 0xff, 0x10, 1),
            (0x10000, 0xe1, 0, 0),
            (0xdead_beef, 0x0a, 0x0b, 3),
            (u32::MAX, 0xff, 0x1f, 7),
        ] {
            let want = format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}");
            let got = Bdf {
                domain,
                bus,
                dev,
                func,
            }
            .to_normalized();
            assert_eq!(got, want);
            assert_eq!(normalize_pci(&want.to_uppercase()).as_deref(), Some(&*want));
        }
        assert_eq!(
            normalize_pci(" pci:3B:00 ").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(normalize_pci("0000:3b.1:00.0"), None);
        assert_eq!(normalize_pci("000000000:3b:00.0"), None);
        assert_eq!(normalize_pci(":3b:00.0"), None);
        assert_eq!(normalize_pci("0000:3b:00."), None);
    }

    #[test]
    fn address_fast_path_agrees_with_the_general_parser() {
        // Each position of the driver's `dddd:bb:dd.f` form over digits, letters of
        // both cases, a non-hex letter and separators, one or two positions at a time.
        let base = *b"0000:3b:1f.7";
        let alphabet = b"09afAFgG:. 8";
        let mut fast_hits = 0;
        for i in 0..base.len() {
            for j in i..base.len() {
                for &x in alphabet {
                    for &y in alphabet {
                        let mut a = base;
                        a[i] = x;
                        a[j] = y;
                        for cut in [10, 12] {
                            let s = std::str::from_utf8(&a[..cut]).unwrap();
                            let got = parse_bdf(s);
                            assert_eq!(got, parse_bdf_general(s), "{s}");
                            fast_hits += usize::from(got.is_some());
                        }
                    }
                }
            }
        }
        assert!(fast_hits > 1000, "{fast_hits}");
    }

    #[test]
    fn check_only_helpers_agree_with_normalize() {
        for addr in [
            "PCI:0000:3B:00",
            "3b:00.1",
            "00000000:3B:00.0",
            "10000:e1:00.0",
            "0000:3b:20.0",
            "GPU-abc",
            "",
        ] {
            let want = normalize_pci(addr);
            assert_eq!(is_pci(addr), want.is_some(), "{addr}");
            for normalized in ["0000:3b:00.0", "0000:3b:00.1", "10000:e1:00.0", ""] {
                assert_eq!(
                    pci_matches(addr, normalized),
                    want.as_deref() == Some(normalized),
                    "{addr} vs {normalized}"
                );
            }
        }
    }

    #[test]
    fn requester_id_decodes_bus_and_devfn() {
        assert_eq!(
            pci_from_requester_id("0018", "0000:00:03.0").as_deref(),
            Some("0000:00:03.0")
        );
        assert_eq!(
            pci_from_requester_id("0300", "0002:00:01.0").as_deref(),
            Some("0002:03:00.0")
        );
        assert_eq!(pci_from_requester_id("xyz", "0000:00:01.0"), None);
    }
}
