//! The `/dev/kmsg` record format.
//!
//! One `read(2)` of `/dev/kmsg` returns one record:
//! `PRI,SEQ,TS_USEC,FLAGS[,more fields];MESSAGE\n` followed by optional dictionary
//! lines ` KEY=VALUE\n` (`SUBSYSTEM=pci`, `DEVICE=+pci:0000:3b:00.0`). The kernel
//! escapes non-printable bytes of MESSAGE as `\xNN`.

use std::borrow::Cow;

/// One `/dev/kmsg` record, borrowing from the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KmsgRecord<'a> {
    /// syslog facility: `PRI >> 3` (0 kern, 1 user, ...).
    pub facility: u8,
    /// syslog level: `PRI & 7` (0 emerg .. 7 debug).
    pub level: u8,
    /// Record sequence number (gaps mean records were lost).
    pub seq: u64,
    /// Monotonic timestamp, microseconds since boot.
    pub ts_usec: u64,
    /// FLAGS contains `c`: this record continues the previous one.
    pub continuation: bool,
    /// The message, still `\xNN`-escaped (see [`KmsgRecord::message`]).
    pub message: &'a [u8],
    /// The dictionary lines (each ` KEY=VALUE`, newline separated), possibly empty.
    pub dict: &'a [u8],
}

/// Why a `/dev/kmsg` record did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The buffer was empty.
    #[error("empty kmsg record")]
    Empty,
    /// No `;` separates the header from the message.
    #[error("kmsg record has no ';' between header and message")]
    MissingSeparator,
    /// The header has fewer than the four fields `PRI,SEQ,TS_USEC,FLAGS`.
    #[error("kmsg record header has {found} fields, expected at least 4 (PRI,SEQ,TS_USEC,FLAGS)")]
    TooFewFields {
        /// Number of comma-separated fields found.
        found: usize,
    },
    /// A numeric header field is not a decimal number in range.
    #[error("kmsg record field {field} is not a valid number: {value:?}")]
    BadNumber {
        /// `PRI`, `SEQ` or `TS_USEC`.
        field: &'static str,
        /// The offending text (lossy UTF-8, at most 32 bytes).
        value: String,
    },
}

fn parse_dec(field: &'static str, s: &[u8], max: u64) -> Result<u64, RecordError> {
    let bad = || RecordError::BadNumber {
        field,
        value: String::from_utf8_lossy(&s[..s.len().min(32)]).into_owned(),
    };
    if s.is_empty() || s.len() > 20 {
        return Err(bad());
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return Err(bad());
        }
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or_else(bad)?;
    }
    if v > max {
        return Err(bad());
    }
    Ok(v)
}

/// Parses one `/dev/kmsg` record. Extra header fields after FLAGS (e.g. newer kernels'
/// `caller=T123`) are accepted and ignored; a missing trailing newline is fine.
///
/// ```
/// let r = xid_parser::parse_kmsg_record(b"6,339,5140900,-;NET: Registered PF_INET6 protocol family\n SUBSYSTEM=net\n").unwrap();
/// assert_eq!((r.facility, r.level, r.seq, r.ts_usec), (0, 6, 339, 5_140_900));
/// assert_eq!(r.dict_value("SUBSYSTEM"), Some(&b"net"[..]));
/// assert!(xid_parser::parse_kmsg_record(b"garbage").is_err());
/// ```
pub fn parse_kmsg_record(buf: &[u8]) -> Result<KmsgRecord<'_>, RecordError> {
    if buf.is_empty() {
        return Err(RecordError::Empty);
    }
    let semi = memchr::memchr(b';', buf).ok_or(RecordError::MissingSeparator)?;
    let header = &buf[..semi];
    // A newline inside the header means this is not a record header.
    if memchr::memchr(b'\n', header).is_some() {
        return Err(RecordError::MissingSeparator);
    }
    let mut fields = header.split(|&b| b == b',');
    let pri = fields.next().unwrap_or_default();
    let (Some(seq), Some(ts), Some(flags)) = (fields.next(), fields.next(), fields.next()) else {
        return Err(RecordError::TooFewFields {
            found: header.split(|&b| b == b',').count(),
        });
    };
    // The kernel's PRI is (facility << 3) | level with facility < 256.
    let pri = parse_dec("PRI", pri, 0x7ff)?;
    let seq = parse_dec("SEQ", seq, u64::MAX)?;
    let ts_usec = parse_dec("TS_USEC", ts, u64::MAX)?;
    let rest = &buf[semi + 1..];
    let (message, dict) = match memchr::memchr(b'\n', rest) {
        Some(nl) => {
            let dict = &rest[nl + 1..];
            let dict = dict.strip_suffix(b"\n").unwrap_or(dict);
            (&rest[..nl], dict)
        }
        None => (rest, &rest[rest.len()..]),
    };
    Ok(KmsgRecord {
        facility: (pri >> 3) as u8,
        level: (pri & 7) as u8,
        seq,
        ts_usec,
        continuation: flags.contains(&b'c'),
        message,
        dict,
    })
}

impl KmsgRecord<'_> {
    /// The message with `\xNN` escapes decoded (invalid UTF-8 replaced by U+FFFD).
    /// Borrows when there is nothing to decode.
    pub fn message(&self) -> Cow<'_, str> {
        unescape_kmsg(self.message)
    }

    /// The value of dictionary key `key` (`SUBSYSTEM`, `DEVICE`, ...), if present.
    pub fn dict_value(&self, key: &str) -> Option<&[u8]> {
        self.dict.split(|&b| b == b'\n').find_map(|line| {
            let line = line.strip_prefix(b" ").unwrap_or(line);
            let rest = line.strip_prefix(key.as_bytes())?;
            rest.strip_prefix(b"=")
        })
    }
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `String::from_utf8_lossy`, with the valid-UTF-8 case (nearly every kernel line)
/// checked by `std::str::from_utf8`, which validates ASCII a word at a time.
pub(crate) fn lossy(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// Decodes the kernel's `\xNN` escapes (a `\` not followed by `x` and two hex digits
/// is kept as is) and replaces invalid UTF-8 with U+FFFD. Borrows when possible.
pub fn unescape_kmsg(bytes: &[u8]) -> Cow<'_, str> {
    if memchr::memchr(b'\\', bytes).is_none() {
        return lossy(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1] == b'x'
            && let (Some(h), Some(l)) = (hex_val(bytes[i + 2]), hex_val(bytes[i + 3]))
        {
            out.push(h << 4 | l);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fields_and_flags() {
        let r = parse_kmsg_record(b"4,1,2,c,caller=T42;hello").unwrap();
        assert_eq!((r.facility, r.level, r.seq, r.ts_usec), (0, 4, 1, 2));
        assert!(r.continuation);
        assert_eq!(r.message, b"hello");
        assert!(r.dict.is_empty());
        let r = parse_kmsg_record(b"14,7,8,-;user line\n").unwrap();
        assert_eq!((r.facility, r.level), (1, 6));
        assert!(!r.continuation);
    }

    #[test]
    fn message_may_contain_semicolons_and_dict_follows() {
        let r =
            parse_kmsg_record(b"3,5,6,-;a;b\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n").unwrap();
        assert_eq!(r.message, b"a;b");
        assert_eq!(r.dict_value("DEVICE"), Some(&b"+pci:0000:3b:00.0"[..]));
        assert_eq!(r.dict_value("SUBSYSTEM"), Some(&b"pci"[..]));
        assert_eq!(r.dict_value("SUB"), None);
    }

    #[test]
    fn errors_are_typed() {
        assert_eq!(parse_kmsg_record(b""), Err(RecordError::Empty));
        assert_eq!(
            parse_kmsg_record(b"3,4,5"),
            Err(RecordError::MissingSeparator)
        );
        assert_eq!(
            parse_kmsg_record(b"3,4;x"),
            Err(RecordError::TooFewFields { found: 2 })
        );
        assert!(matches!(
            parse_kmsg_record(b"x,4,5,-;m"),
            Err(RecordError::BadNumber { field: "PRI", .. })
        ));
        assert!(matches!(
            parse_kmsg_record(b"3,99999999999999999999999,5,-;m"),
            Err(RecordError::BadNumber { field: "SEQ", .. })
        ));
        assert!(matches!(
            parse_kmsg_record(b"4096,1,5,-;m"),
            Err(RecordError::BadNumber { field: "PRI", .. })
        ));
        assert_eq!(
            parse_kmsg_record(b"3,4\n,5,-;m"),
            Err(RecordError::MissingSeparator)
        );
    }

    #[test]
    fn unescapes_hex() {
        assert_eq!(unescape_kmsg(b"a\\x0ab"), "a\nb");
        assert_eq!(unescape_kmsg(b"tab\\x09end\\x"), "tab\tend\\x");
        assert_eq!(unescape_kmsg(b"keep \\q and \\xZZ"), "keep \\q and \\xZZ");
        assert!(matches!(unescape_kmsg(b"plain"), Cow::Borrowed("plain")));
        assert_eq!(unescape_kmsg(b"\\xff"), "\u{fffd}");
    }
}
