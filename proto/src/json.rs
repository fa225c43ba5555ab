//! serde adapters for enum fields: prost keeps them as `i32`; JSON carries the
//! lowercase short name. Unknown numbers are written as numbers (forward
//! compatible); both names and numbers are accepted when reading.

use crate::ShortName;
use serde::{Deserialize, Deserializer, Serializer};

fn serialize<T, S>(value: &i32, ser: S) -> Result<S::Ok, S::Error>
where
    T: ShortName + TryFrom<i32>,
    S: Serializer,
{
    match T::try_from(*value) {
        Ok(v) => ser.serialize_str(v.short_name()),
        Err(_) => ser.serialize_i32(*value),
    }
}

fn deserialize<'de, T, D>(de: D) -> Result<i32, D::Error>
where
    T: ShortName + Into<i32>,
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NameOrNumber {
        Name(String),
        Number(i32),
    }
    match NameOrNumber::deserialize(de)? {
        NameOrNumber::Number(n) => Ok(n),
        NameOrNumber::Name(name) => T::from_short_name(&name)
            .map(Into::into)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown enum value {name:?}"))),
    }
}

macro_rules! adapter {
    ($module:ident, $ty:ty) => {
        #[doc = concat!("serde `with` adapter for `", stringify!($ty), "` fields.")]
        pub mod $module {
            /// Writes the value's lowercase short name (`reset_gpu`); a number no
            /// variant has is written as the number.
            pub fn serialize<S: serde::Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
                super::serialize::<$ty, S>(v, s)
            }
            /// Reads a short name, proto name or number.
            pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
                super::deserialize::<$ty, D>(d)
            }
        }
    };
}

adapter!(fault_kind, crate::FaultKind);
adapter!(action, crate::Action);
adapter!(severity, crate::Severity);
adapter!(source, crate::Source);
adapter!(verdict, crate::Verdict);
adapter!(recovery_action, crate::RecoveryAction);
adapter!(input_state, crate::InputState);
adapter!(pod_role, crate::PodRole);

/// Appends `ev` as one JSON object to `out`, exactly as `serde_json::to_writer`
/// writes it (same field order, escapes and enum names), without serde's
/// per-character escaping: a `gpuwatch scan` of an XID storm writes millions.
pub fn write_fault_event(ev: &crate::FaultEvent, out: &mut Vec<u8>) {
    write_fault_event_ref(&ev.view(), out);
}

/// [`write_fault_event`] of a borrowed event: the same bytes the owned event
/// ([`FaultEventRef::to_event`](crate::FaultEventRef::to_event)) gives.
pub fn write_fault_event_ref(ev: &crate::FaultEventRef<'_>, out: &mut Vec<u8>) {
    // Each key is written with the punctuation around it (the quotes of a string
    // value included) in one piece.
    out.extend_from_slice(b"{\"kind\":");
    enum_value::<crate::FaultKind>(ev.kind, out);
    out.extend_from_slice(b",\"code\":");
    uint(u64::from(ev.code), out);
    out.extend_from_slice(b",\"pci_address\":\"");
    text(ev.pci_address, out);
    out.extend_from_slice(b"\",\"gpu_index\":");
    opt_uint(ev.gpu_index.map(u64::from), out);
    out.extend_from_slice(b",\"gpu_uuid\":\"");
    text(ev.gpu_uuid, out);
    out.extend_from_slice(b"\",\"pid\":");
    opt_uint(ev.pid.map(u64::from), out);
    out.extend_from_slice(b",\"process\":\"");
    text(ev.process, out);
    out.extend_from_slice(b"\",\"message\":\"");
    text(ev.message, out);
    out.extend_from_slice(b"\",\"kmsg_seq\":");
    opt_uint(ev.kmsg_seq, out);
    out.extend_from_slice(b",\"monotonic_usec\":");
    opt_uint(ev.monotonic_usec, out);
    out.extend_from_slice(b",\"time_unix_nano\":");
    opt_uint(ev.time_unix_nano, out);
    out.extend_from_slice(b",\"facility\":");
    opt_uint(ev.facility.map(u64::from), out);
    out.extend_from_slice(b",\"level\":");
    opt_uint(ev.level.map(u64::from), out);
    out.extend_from_slice(b",\"action\":");
    enum_value::<crate::Action>(ev.action, out);
    out.extend_from_slice(b",\"severity\":");
    enum_value::<crate::Severity>(ev.severity, out);
    out.extend_from_slice(b",\"policy_reason\":\"");
    text(ev.policy_reason, out);
    out.extend_from_slice(b"\",\"source\":");
    enum_value::<crate::Source>(ev.source, out);
    out.extend_from_slice(b",\"boot_id\":\"");
    text(ev.boot_id, out);
    out.extend_from_slice(b"\",\"count\":");
    uint(u64::from(ev.count), out);
    out.extend_from_slice(b",\"attributes\":{");
    for (i, (k, v)) in ev.attributes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(k, out);
        out.push(b':');
        string(v, out);
    }
    out.extend_from_slice(b"},\"name\":\"");
    text(ev.name, out);
    out.push(b'"');
    if !ev.pods.is_empty() {
        out.extend_from_slice(b",\"pods\":[");
        for (i, p) in ev.pods.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_pod_ref(p, out);
        }
        out.push(b']');
    }
    out.push(b'}');
}

/// One [`crate::PodRef`], in the field order serde writes it.
fn write_pod_ref(p: &crate::PodRef, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"uid\":");
    string(&p.uid, out);
    out.extend_from_slice(b",\"name\":");
    string(&p.name, out);
    out.extend_from_slice(b",\"namespace\":");
    string(&p.namespace, out);
    out.extend_from_slice(b",\"container\":");
    string(&p.container, out);
    out.extend_from_slice(b",\"container_id\":");
    string(&p.container_id, out);
    out.extend_from_slice(b",\"role\":");
    enum_value::<crate::PodRole>(p.role, out);
    out.extend_from_slice(b",\"controller_kind\":");
    string(&p.controller_kind, out);
    out.extend_from_slice(b",\"controller_name\":");
    string(&p.controller_name, out);
    out.push(b'}');
}

fn enum_value<T: ShortName + TryFrom<i32>>(value: i32, out: &mut Vec<u8>) {
    match T::try_from(value) {
        Ok(v) => {
            // Short names are lowercase identifiers: nothing to escape.
            let name = v.short_name();
            debug_assert!(next_escape(name.as_bytes(), 0).is_none(), "{name}");
            out.push(b'"');
            out.extend_from_slice(name.as_bytes());
            out.push(b'"');
        }
        Err(_) => {
            if value < 0 {
                out.push(b'-');
            }
            uint(u64::from(value.unsigned_abs()), out);
        }
    }
}

fn opt_uint(v: Option<u64>, out: &mut Vec<u8>) {
    match v {
        Some(v) => uint(v, out),
        None => out.extend_from_slice(b"null"),
    }
}

/// `"00" "01" … "99"`: [`uint`] writes two digits per division.
const DIGIT_PAIRS: [u8; 200] = {
    let mut t = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        t[2 * i] = b'0' + (i / 10) as u8;
        t[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    t
};

/// `v` in decimal. The digits are built left-aligned in a 20-byte array that is
/// appended whole and the surplus cut off again: a copy of a fixed size is a few
/// moves, one of the digits' own length a call into `memcpy`.
fn uint(mut v: u64, out: &mut Vec<u8>) {
    if v < 10 {
        out.push(b'0' + v as u8);
        return;
    }
    let n = decimal_len(v);
    let mut digits = [0u8; 20];
    let mut i = n;
    while v >= 100 {
        let r = (v % 100) as usize;
        v /= 100;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&DIGIT_PAIRS[2 * r..2 * r + 2]);
    }
    if v >= 10 {
        let r = v as usize;
        digits[..2].copy_from_slice(&DIGIT_PAIRS[2 * r..2 * r + 2]);
    } else {
        digits[0] = b'0' + v as u8;
    }
    let len = out.len();
    out.extend_from_slice(&digits);
    out.truncate(len + n);
}

/// Number of decimal digits of `v` (1 for 0).
fn decimal_len(v: u64) -> usize {
    v.checked_ilog10().map_or(1, |l| l as usize + 1)
}

/// A JSON string as serde_json writes it: `"` and `\` escaped, control characters
/// as `\b \t \n \f \r` or `\u00XX` (lowercase hex), everything else (DEL, non-ASCII)
/// as is. Runs without escapes are found [`W`] bytes at a time and copied whole.
fn string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    text(s, out);
    out.push(b'"');
}

/// The inside of [`string`]: `s` escaped, without the quotes.
fn text(s: &str, out: &mut Vec<u8>) {
    let b = s.as_bytes();
    if b.is_empty() {
        return;
    }
    // Most strings (a kernel message, a policy reason) need no escape: tested whole,
    // without looking for where, then copied in one piece.
    if b.len() >= W && clean_long(b) {
        out.extend_from_slice(b);
        return;
    }
    let mut start = 0;
    while let Some(i) = next_escape(b, start) {
        out.extend_from_slice(&b[start..i]);
        start = i + 1;
        match b[i] {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            c => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(c >> 4)]);
                out.push(HEX[usize::from(c & 0xf)]);
            }
        }
    }
    out.extend_from_slice(&b[start..]);
}

fn needs_escape(c: u8) -> bool {
    (c < 0x20) | (c == b'"') | (c == b'\\')
}

/// Bytes tested at a time by [`next_escape`].
const W: usize = 32;

/// Position of the first byte of `c` that needs an escape: one byte per position
/// in a mask (plain compares over fixed-size arrays, which the compiler turns into
/// vector compares), the first set one found from the mask's trailing zeros.
fn first_escape(c: &[u8; W]) -> Option<usize> {
    let mut m = [0u8; W];
    add_escape_flags(&mut m, c);
    let (lo, hi) = halves(&m);
    if lo != 0 {
        Some((lo.trailing_zeros() / 8) as usize)
    } else if hi != 0 {
        Some(W / 2 + (hi.trailing_zeros() / 8) as usize)
    } else {
        None
    }
}

/// Whether no byte of `b` (at least [`W`] long) needs an escape: each [`W`]-byte
/// step's flags are or-ed into one array lane by lane (vector compares and ors, no
/// branch per step), the last step ending at the end; one test at the end.
fn clean_long(b: &[u8]) -> bool {
    let mut acc = [0u8; W];
    let mut steps = b.chunks_exact(W);
    for c in &mut steps {
        add_escape_flags(&mut acc, c.try_into().unwrap_or(&[b'"'; W]));
    }
    if !steps.remainder().is_empty()
        && let Some(c) = b.last_chunk::<W>()
    {
        add_escape_flags(&mut acc, c);
    }
    let (lo, hi) = halves(&acc);
    lo | hi == 0
}

/// Sets `m[k]` to 1 where `c[k]` needs an escape (leaves it otherwise).
#[inline]
fn add_escape_flags(m: &mut [u8; W], c: &[u8; W]) {
    for k in 0..W {
        m[k] |= u8::from(needs_escape(c[k]));
    }
}

/// `m` as two little-endian 128-bit words, low half first.
#[inline]
fn halves(m: &[u8; W]) -> (u128, u128) {
    let (lo, hi) = m.split_at(W / 2);
    let word = |h: &[u8]| u128::from_le_bytes(h.try_into().unwrap_or([1; W / 2]));
    (word(lo), word(hi))
}

/// Position of the first byte at or after `from` that needs an escape, [`W`]
/// bytes at a time; the last bytes are padded with a byte that needs none.
fn next_escape(b: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(c) = b[i..].first_chunk::<W>() {
        if let Some(p) = first_escape(c) {
            return Some(i + p);
        }
        i += W;
    }
    if i == b.len() {
        return None;
    }
    // The last bytes: one more step that ends at the end, where every byte it shares
    // with the steps before was found clean.
    if let Some(c) = b.last_chunk::<W>()
        && b.len() - W >= from
    {
        return first_escape(c).map(|p| b.len() - W + p);
    }
    // Shorter than a step (most fields): a word at a time, the same way at the end.
    while let Some(c) = b[i..].first_chunk::<8>() {
        let m = escape_bits(u64::from_le_bytes(*c));
        if m != 0 {
            return Some(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    if let Some(c) = b.last_chunk::<8>()
        && b.len() - 8 >= from
    {
        let m = escape_bits(u64::from_le_bytes(*c));
        return (m != 0).then(|| b.len() - 8 + (m.trailing_zeros() / 8) as usize);
    }
    b[i..].iter().position(|&c| needs_escape(c)).map(|p| i + p)
}

/// The top bit of each byte of `w` (little-endian) that needs an escape; bits above
/// the lowest set one may be wrong (a borrow carries upwards from a hit), the lowest
/// is exact, which is all [`next_escape`] reads.
fn escape_bits(w: u64) -> u64 {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |x: u64| x.wrapping_sub(LO) & !x & HI;
    // Below 0x20 (a byte of 0x80 or more never is: its top bit is masked by `!w`).
    let control = w.wrapping_sub(LO * 0x20) & !w & HI;
    control | zero_byte(w ^ (LO * u64::from(b'"'))) | zero_byte(w ^ (LO * u64::from(b'\\')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FaultEvent;

    /// Strings with every kind of escape, non-ASCII text and plain runs.
    fn text(rng: &mut u64) -> String {
        const PIECES: &[&str] = &[
            "",
            "NVRM: Xid (PCI:0000:3b:00): 79",
            "\"",
            "\\",
            "\n",
            "\r\n",
            "\t",
            "\u{0}",
            "\u{1}",
            "\u{8}",
            "\u{c}",
            "\u{b}",
            "\u{1f}",
            "\u{7f}",
            "é",
            "GPU 🔥",
            "\u{2028}",
            "</script>",
            "'",
        ];
        // Up to a few hundred bytes: escapes fall in every position of a 32-byte step.
        let n = (*rng % 14) as usize;
        (0..n)
            .map(|_| {
                *rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                PIECES[(*rng >> 33) as usize % PIECES.len()]
            })
            .collect()
    }

    /// Every ASCII byte value at every position of a string spanning a chunk and a
    /// padded tail, after a byte above it or not: escaped exactly as serde_json does
    /// (the word tests flag bytes above a hit too; only the lowest may be used).
    #[test]
    fn every_byte_at_every_position() {
        let mut buf = Vec::new();
        for c in 0u8..0x80 {
            for at in 0..40 {
                for before in [b'a', b'"', 0x1f, b'\\'] {
                    let mut s = vec![b'x'; 40];
                    s[at] = c;
                    if at > 0 {
                        s[at - 1] = before;
                    }
                    s.extend_from_slice("é\u{1}ü".as_bytes());
                    let s = String::from_utf8(s).expect("ascii + utf8");
                    buf.clear();
                    string(&s, &mut buf);
                    let want = serde_json::to_string(&s).expect("string");
                    assert_eq!(String::from_utf8_lossy(&buf), want, "{c:#x} at {at}");
                }
            }
        }
    }

    /// Strings of every length up to two steps and a half, with up to two bytes that
    /// need escapes at every pair of positions: the step, the overlapping last step,
    /// the word and the byte tail each find them as serde_json escapes them.
    #[test]
    fn every_length_with_escapes_anywhere() {
        let mut buf = Vec::new();
        for len in 0..80usize {
            for a in 0..=len {
                for b in a..=len {
                    let mut s = vec![b'y'; len];
                    for (at, c) in [(a, b'"'), (b, 0x01)] {
                        if at < len {
                            s[at] = c;
                        }
                    }
                    let s = String::from_utf8(s).expect("ascii");
                    buf.clear();
                    string(&s, &mut buf);
                    let want = serde_json::to_string(&s).expect("string");
                    assert_eq!(
                        String::from_utf8_lossy(&buf),
                        want,
                        "len {len}, at {a} and {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn writes_exactly_what_serde_writes() {
        let mut rng = 7u64;
        let step = |rng: &mut u64| {
            *rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            *rng >> 11
        };
        let mut buf = Vec::new();
        for i in 0..5000u64 {
            let r = step(&mut rng);
            let opt = |bit: u64, v: u64| (r >> bit & 1 == 1).then_some(v);
            let mut ev = FaultEvent {
                // Unknown enum numbers (negative too) are written as numbers.
                kind: (r % 40) as i32 - 3,
                code: (step(&mut rng) % 200) as u32 * (i as u32 % 3),
                pci_address: text(&mut rng),
                gpu_index: opt(1, r % 8).map(|v| v as u32),
                gpu_uuid: text(&mut rng),
                pid: opt(2, u64::from(u32::MAX) - r % 3).map(|v| v as u32),
                process: text(&mut rng),
                message: text(&mut rng),
                kmsg_seq: opt(3, u64::MAX - i),
                monotonic_usec: opt(4, i * 1_000_003),
                time_unix_nano: opt(5, 1_700_000_000_000_000_000 + i),
                facility: opt(6, r % 24).map(|v| v as u32),
                level: opt(7, 0).map(|v| v as u32),
                action: (step(&mut rng) % 9) as i32 - 1,
                severity: (step(&mut rng) % 6) as i32,
                policy_reason: text(&mut rng),
                source: (step(&mut rng) % 7) as i32,
                boot_id: text(&mut rng),
                count: (r % 3) as u32 * (u32::MAX / 2),
                name: text(&mut rng),
                ..Default::default()
            };
            for _ in 0..(r >> 8) % 4 {
                ev.attributes.insert(text(&mut rng), text(&mut rng));
            }
            for _ in 0..(r >> 12) % 3 {
                ev.pods.push(crate::PodRef {
                    uid: text(&mut rng),
                    name: text(&mut rng),
                    namespace: text(&mut rng),
                    container: text(&mut rng),
                    container_id: text(&mut rng),
                    role: (step(&mut rng) % 4) as i32,
                    controller_kind: text(&mut rng),
                    controller_name: text(&mut rng),
                });
            }
            buf.clear();
            write_fault_event(&ev, &mut buf);
            let want = serde_json::to_string(&ev).expect("serialisable");
            assert_eq!(String::from_utf8_lossy(&buf), want, "event {i}");
            // The same event with its attributes borrowed as a list.
            let pairs: Vec<(&str, &str)> = ev
                .attributes
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let listed = crate::FaultEventRef {
                attributes: crate::Attrs::list(&pairs),
                ..ev.view()
            };
            buf.clear();
            write_fault_event_ref(&listed, &mut buf);
            assert_eq!(String::from_utf8_lossy(&buf), want, "event {i}, listed");
        }
    }
    /// Every digit count, at and around each power of ten, and the extremes.
    #[test]
    fn numbers_at_every_length_are_written_as_rust_formats_them() {
        let mut values = vec![0, 1, 9, u64::MAX, u64::MAX - 1];
        let mut p = 1u64;
        for _ in 0..20 {
            values.extend([
                p.saturating_sub(1),
                p,
                p.saturating_add(1),
                p.saturating_mul(7),
            ]);
            p = p.saturating_mul(10);
        }
        let mut buf = b"prefix".to_vec();
        for v in values {
            buf.truncate(6);
            uint(v, &mut buf);
            assert_eq!(&buf[6..], v.to_string().as_bytes(), "{v}");
        }
    }
}
