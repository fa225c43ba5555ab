//! Saved-log lines: the format is detected per line, so concatenated or mixed
//! files work.
//!
//! | format | example |
//! |---|---|
//! | [`LineFormat::Kmsg`] | `3,1042,86400000000,-;NVRM: Xid ...` |
//! | [`LineFormat::Dmesg`] | `[  123.456789] msg`, with caller id `[  123.4][ T291] msg` |
//! | [`LineFormat::DmesgRaw`] | `<4>[  123.456789] msg` (`dmesg -r`) |
//! | [`LineFormat::DmesgCtime`] | `[Mon Mar  3 12:00:00 2025] msg` (`dmesg -T`, read as UTC) |
//! | [`LineFormat::DmesgHuman`] | `[Mar 3 12:00] msg`, `[  +0.000123] msg` (`dmesg -H`) |
//! | [`LineFormat::DmesgIso`] | `2025-03-03T12:00:00,123456+00:00 msg` |
//! | [`LineFormat::SyslogShort`] | `Mar  3 12:00:00 host kernel: msg` (syslog, `journalctl -k`) |
//! | [`LineFormat::SyslogPrecise`] | `Mar 03 12:00:00.123456 host kernel: msg` (`-o short-precise`) |
//! | [`LineFormat::SyslogIso`] | `2025-03-03T12:00:00.123+01:00 host kernel: msg` (rsyslog RFC 3339, `-o short-iso`) |
//!
//! `dmesg -x` prefixes the facility and level (`kern  :warn  : [  123.4] msg`,
//! `user  :err   : msg`) before any of the dmesg forms: they set `facility` and
//! `level`, the rest is parsed as usual.
//!
//! Syslog-family lines have rsyslog's `#012`-style control escapes decoded and an
//! embedded kernel timestamp (`kernel: [ 123.4] msg`) moved into `monotonic_usec`.
//! Month names are accepted in English, German, French, Spanish, Italian and
//! Portuguese abbreviations (`Mär`, `févr.`, `dic`, ...).

use crate::record::lossy;
use std::borrow::Cow;

/// The detected format of one saved-log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineFormat {
    /// A raw `/dev/kmsg` record (`PRI,SEQ,TS_USEC,FLAGS;MESSAGE`).
    Kmsg,
    /// `dmesg`: `[  123.456789] msg` (optionally with a caller id).
    Dmesg,
    /// `dmesg -r`: `<PRI>[  123.456789] msg`.
    DmesgRaw,
    /// `dmesg -T`: `[Mon Mar  3 12:00:00 2025] msg`.
    DmesgCtime,
    /// `dmesg -H`: `[Mar 3 12:00] msg` or `[  +0.000123] msg`.
    DmesgHuman,
    /// `dmesg --time-format iso`: `2025-03-03T12:00:00,123456+00:00 msg`.
    DmesgIso,
    /// Traditional syslog / `journalctl` short: `Mar  3 12:00:00 host kernel: msg`.
    SyslogShort,
    /// `journalctl -o short-precise`: `Mar 03 12:00:00.123456 host kernel: msg`.
    SyslogPrecise,
    /// RFC 3339 syslog (rsyslog) / `journalctl -o short-iso`: `2025-03-03T12:00:00+00:00 host kernel: msg`.
    SyslogIso,
    /// No known prefix: the whole line is the message.
    Unknown,
}

impl LineFormat {
    /// Stable lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            LineFormat::Kmsg => "kmsg",
            LineFormat::Dmesg => "dmesg",
            LineFormat::DmesgRaw => "dmesg_raw",
            LineFormat::DmesgCtime => "dmesg_ctime",
            LineFormat::DmesgHuman => "dmesg_human",
            LineFormat::DmesgIso => "dmesg_iso",
            LineFormat::SyslogShort => "syslog_short",
            LineFormat::SyslogPrecise => "syslog_precise",
            LineFormat::SyslogIso => "syslog_iso",
            LineFormat::Unknown => "unknown",
        }
    }
}

/// One parsed saved-log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine<'a> {
    /// Detected format.
    pub format: LineFormat,
    /// syslog facility when the line carries it (kmsg, `dmesg -r`); `Some(0)` for syslog
    /// lines tagged `kernel:`, `Some(1)` for syslog lines of any other program
    /// (user space; the exact facility is not in the line).
    pub facility: Option<u8>,
    /// syslog level when the line carries it.
    pub level: Option<u8>,
    /// kmsg sequence number (raw kmsg records only).
    pub seq: Option<u64>,
    /// Monotonic time since boot, microseconds (dmesg timestamps, kmsg, embedded `[ 123.4]`).
    pub monotonic_usec: Option<u64>,
    /// Wall-clock time, Unix nanoseconds, when the line has a full date (year
    /// included). Local-time formats without an offset (`dmesg -T`) are read as UTC.
    pub time_unix_nano: Option<u64>,
    /// The kernel message, prefix removed and escapes decoded.
    pub message: Cow<'a, str>,
    /// Wall-clock time of a syslog line whose date has no year (`Mar  3 12:00:00`);
    /// [`YearlessTime::resolve`] infers the year. `time_unix_nano` stays `None` then.
    pub yearless_time: Option<YearlessTime>,
}

/// A syslog date and time without a year (`Nov 30 12:34:56[.frac]`), as printed
/// (the writer's local time; read as UTC, like `dmesg -T` times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YearlessTime {
    /// 1..=12.
    pub month: u32,
    /// 1..=31.
    pub day: u32,
    /// Seconds since midnight.
    pub second_of_day: u32,
    /// Fraction of the second, nanoseconds.
    pub nanos: u32,
}

impl YearlessTime {
    /// Unix nanoseconds of this time in `year` (`None` outside 1970..=9999).
    pub fn in_year(&self, year: i64) -> Option<u64> {
        let s = self.second_of_day;
        unix_nanos(
            year,
            self.month,
            self.day,
            s / 3600,
            s / 60 % 60,
            s % 60,
            self.nanos,
            0,
        )
    }

    /// Unix nanoseconds, with the year inferred as syslog readers do: the year of
    /// `now_unix_nano`, or the year before when that date would lie in the future
    /// (a log from December read in January). A day of slack allows for the
    /// writer's time zone, as the time is read as UTC.
    ///
    /// ```
    /// use xid_parser::parse_line;
    /// let now = 1_764_547_200_000_000_000; // 2025-12-01 00:00:00 UTC
    /// let l = parse_line(b"Nov 30 12:34:56 node kernel: NVRM: x");
    /// assert_eq!(l.yearless_time.unwrap().resolve(now), Some(1_764_506_096_000_000_000)); // 2025-11-30
    /// let l = parse_line(b"Dec 31 23:00:00 node kernel: NVRM: x");
    /// assert_eq!(l.yearless_time.unwrap().resolve(now), Some(1_735_686_000_000_000_000)); // 2024-12-31
    /// ```
    pub fn resolve(&self, now_unix_nano: u64) -> Option<u64> {
        const DAY_NANOS: u64 = 86_400 * 1_000_000_000;
        let year = year_of_unix_secs(now_unix_nano / 1_000_000_000);
        match self.in_year(year) {
            Some(t) if t <= now_unix_nano.saturating_add(DAY_NANOS) => Some(t),
            _ => self.in_year(year - 1),
        }
    }
}

/// Proleptic Gregorian year of a Unix time (Howard Hinnant's civil-from-days).
fn year_of_unix_secs(secs: u64) -> i64 {
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    yoe + era * 400 + i64::from(mp >= 10)
}

impl<'a> LogLine<'a> {
    /// What the line tells the [`Scanner`](crate::Scanner) about its record
    /// (sequence number, times, facility, level).
    pub fn meta(&self) -> crate::RecordMeta {
        crate::RecordMeta {
            seq: self.seq,
            monotonic_usec: self.monotonic_usec,
            time_unix_nano: self.time_unix_nano,
            facility: self.facility,
            level: self.level,
        }
    }

    fn new(format: LineFormat, message: Cow<'a, str>) -> Self {
        LogLine {
            format,
            facility: None,
            level: None,
            seq: None,
            monotonic_usec: None,
            time_unix_nano: None,
            message,
            yearless_time: None,
        }
    }
}

/// Parses one saved-log line, detecting its format. Never fails: a line without a
/// known prefix is returned whole as the message ([`LineFormat::Unknown`]). A trailing
/// `\n` / `\r\n` and leading NUL bytes are ignored; invalid UTF-8 is replaced by U+FFFD.
///
/// ```
/// use xid_parser::{parse_line, LineFormat};
/// let l = parse_line(b"<3>[  123.456789] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");
/// assert_eq!(l.format, LineFormat::DmesgRaw);
/// assert_eq!((l.facility, l.level, l.monotonic_usec), (Some(0), Some(3), Some(123_456_789)));
/// assert!(l.message.starts_with("NVRM: Xid"));
/// let l = parse_line(b"Mar  3 12:00:00 gpu-node-7 kernel: [ 12.5] NVRM: loading#012x");
/// assert_eq!(l.format, LineFormat::SyslogShort);
/// assert_eq!(l.monotonic_usec, Some(12_500_000));
/// assert_eq!(l.message, "NVRM: loading\nx");
/// ```
pub fn parse_line(line: &[u8]) -> LogLine<'_> {
    // A crashed machine's syslog is padded with NUL bytes up to the next boot's
    // first line: the padding is skipped, the line kept.
    let line = &line[line.iter().position(|&b| b != 0).unwrap_or(line.len())..];
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Some(&first) = line.first() else {
        return LogLine::new(LineFormat::Unknown, Cow::Borrowed(""));
    };
    let parsed = match first {
        b'0'..=b'9' => parse_kmsg_line(line).or_else(|| parse_iso_line(line)),
        b'<' => parse_raw_line(line),
        b'[' => parse_bracket_line(line, LineFormat::Dmesg),
        _ if first.is_ascii_alphabetic() => {
            parse_decoded_prefix(line).or_else(|| parse_syslog_line(line))
        }
        _ if first >= 0x80 => parse_syslog_line(line),
        _ => None,
    };
    parsed.unwrap_or_else(|| LogLine::new(LineFormat::Unknown, lossy(line)))
}

/// The GPU driver's XID line as the kernel's `dmesg` prints it, `[%5lu.%06lu] NVRM:
/// Xid (…`, read without the format detection of [`parse_line`]: `(µs since boot,
/// message)`, exactly [`parse_line`]'s `monotonic_usec` and `message` for that line
/// (its other fields are empty). `None` for any other line, and for one with a NUL
/// byte or invalid UTF-8 (the general path reads those).
#[inline]
pub(crate) fn kernel_xid_line(line: &[u8]) -> Option<(u64, &str)> {
    // Most lines are told apart by where the stamp would close and what follows,
    // before any digit is read: no caller id, no `host kernel:` tag, the message
    // right after the one blank.
    if line.first() != Some(&b'[') {
        return None;
    }
    let close = kernel_stamp_close(line)?;
    let msg = line[close + 1..].strip_prefix(b" ")?;
    // A fixed-size compare: inline word loads, no call.
    if msg.first_chunk::<11>() != Some(b"NVRM: Xid (") {
        return None;
    }
    let usec = kernel_stamp_usec(line, close)?;
    let msg = msg.strip_suffix(b"\n").unwrap_or(msg);
    let msg = msg.strip_suffix(b"\r").unwrap_or(msg);
    if memchr::memchr(0, msg).is_some() {
        return None;
    }
    Some((usec, std::str::from_utf8(msg).ok()?))
}

/// syslog facility names as `dmesg -x` prints them (util-linux `dmesg.c`), in
/// facility-number order (`res0`..`res3` are 12..15).
const FACILITIES: [&str; 24] = [
    "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "authpriv",
    "ftp", "res0", "res1", "res2", "res3", "local0", "local1", "local2", "local3", "local4",
    "local5", "local6", "local7",
];
/// syslog level names as `dmesg -x` prints them, in level-number order.
const LEVELS: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug",
];

/// `dmesg -x`: `kern  :warn  : ` (names padded to six) before a dmesg line.
fn parse_decoded_prefix(line: &[u8]) -> Option<LogLine<'_>> {
    // (index after the name, its padding and `:`; length of the name).
    let field = |s: &[u8]| -> Option<(usize, usize)> {
        let n = s.iter().take_while(|b| b.is_ascii_alphanumeric()).count();
        let pad = s[n..].iter().take_while(|&&b| b == b' ').count();
        (n > 0 && s.get(n + pad) == Some(&b':')).then_some((n + pad + 1, n))
    };
    let (after_fac, fac_len) = field(line)?;
    let facility = FACILITIES
        .iter()
        .position(|f| f.as_bytes() == &line[..fac_len])?;
    let rest = &line[after_fac..];
    let (after_level, level_len) = field(rest)?;
    let level = LEVELS
        .iter()
        .position(|l| l.as_bytes() == &rest[..level_len])?;
    let msg = &rest[after_level..];
    let msg = msg.strip_prefix(b" ").unwrap_or(msg);
    let mut out = match msg.first() {
        Some(b'[') => parse_bracket_line(msg, LineFormat::Dmesg)
            .unwrap_or_else(|| LogLine::new(LineFormat::Unknown, lossy(msg))),
        _ => LogLine::new(LineFormat::Unknown, lossy(msg)),
    };
    out.facility = Some(facility as u8);
    out.level = Some(level as u8);
    Some(out)
}

fn parse_kmsg_line(line: &[u8]) -> Option<LogLine<'_>> {
    // Cheap shape check before the full parse: digits then ','.
    let comma = memchr::memchr(b',', &line[..line.len().min(5)])?;
    if !line[..comma].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let rec = crate::record::parse_kmsg_record(line).ok()?;
    let mut out = LogLine::new(LineFormat::Kmsg, crate::record::unescape_kmsg(rec.message));
    out.facility = Some(rec.facility);
    out.level = Some(rec.level);
    out.seq = Some(rec.seq);
    out.monotonic_usec = Some(rec.ts_usec);
    Some(out)
}

fn parse_raw_line(line: &[u8]) -> Option<LogLine<'_>> {
    let close = memchr::memchr(b'>', &line[..line.len().min(6)])?;
    let pri = std::str::from_utf8(&line[1..close]).ok()?;
    if pri.is_empty() || !pri.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let pri: u32 = pri.parse().ok()?;
    if pri > 0x7ff {
        return None;
    }
    let rest = &line[close + 1..];
    let mut out = if rest.first() == Some(&b'[') {
        parse_bracket_line(rest, LineFormat::DmesgRaw)?
    } else {
        LogLine::new(LineFormat::DmesgRaw, lossy(rest))
    };
    out.format = LineFormat::DmesgRaw;
    out.facility = Some((pri >> 3) as u8);
    out.level = Some((pri & 7) as u8);
    Some(out)
}

/// `[...] msg`: monotonic, relative (`-H`), ctime (`-T`) or `Mon D HH:MM` (`-H`).
fn parse_bracket_line(line: &[u8], plain: LineFormat) -> Option<LogLine<'_>> {
    let (close, format, mono, wall) = match dmesg_stamp(line) {
        Some((close, us)) => (close, plain, Some(us?), None),
        None => {
            let close = memchr::memchr(b']', &line[..line.len().min(40)])?;
            let (format, mono, wall) = match plain_secs_usec(&line[1..close]) {
                Some(us) => (plain, Some(us?), None),
                None => bracket_time(&line[1..close], plain)?,
            };
            (close, format, mono, wall)
        }
    };
    let mut rest = &line[close + 1..];
    rest = skip_caller_id(rest);
    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
    // journalctl -o short-monotonic: `[  123.456789] host kernel: msg`.
    let rest = strip_host_kernel_tag(rest).unwrap_or(rest);
    let mut out = LogLine::new(format, lossy(rest));
    out.monotonic_usec = mono;
    out.time_unix_nano = wall;
    Some(out)
}

/// The usual `[  1234.567890]` stamp read in one pass over the bytes (no search for
/// the `]` first): `(index of the ']', what [`plain_secs_usec`] gives)`. `None` for
/// any other shape, where the general path decides; when this returns `Some`, the
/// `]` is the first one within 40 bytes and the value is exactly the general one.
#[inline]
fn dmesg_stamp(line: &[u8]) -> Option<(usize, Option<u64>)> {
    match kernel_width_stamp(line) {
        Some((close, usec)) => Some((close, Some(usec))),
        None => dmesg_stamp_scan(line),
    }
}

/// [`dmesg_stamp`] for any width: one pass over the bytes.
#[inline]
fn dmesg_stamp_scan(line: &[u8]) -> Option<(usize, Option<u64>)> {
    // The `]` counts only within the first 40 bytes, as in the general path.
    let line = &line[..line.len().min(40)];
    let mut i = 1;
    while line.get(i) == Some(&b' ') {
        i += 1;
    }
    let start = i;
    let mut secs = 0u64;
    while let Some(&d) = line.get(i).filter(|d| d.is_ascii_digit()) {
        // Wrapping: more than 19 digits is refused below, and 19 fit in a u64.
        secs = secs.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
        i += 1;
    }
    let n_secs = i - start;
    if n_secs == 0 || n_secs > 19 || line.get(i) != Some(&b'.') {
        return None;
    }
    i += 1;
    let frac_start = i;
    let mut frac = 0u64;
    while let Some(&d) = line.get(i).filter(|d| d.is_ascii_digit()) {
        frac = frac.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
        i += 1;
    }
    let n_frac = i - frac_start;
    if n_frac == 0 || n_frac > 9 {
        return None;
    }
    while line.get(i) == Some(&b' ') {
        i += 1;
    }
    if line.get(i) != Some(&b']') {
        return None;
    }
    let usec = if n_frac <= 6 {
        frac * 10u64.pow(6 - n_frac as u32)
    } else {
        frac / 10u64.pow(n_frac as u32 - 6)
    };
    Some((
        i,
        secs.checked_mul(1_000_000)
            .and_then(|v| v.checked_add(usec)),
    ))
}

/// Where the stamp the kernel prints, `[%5lu.%06lu]`, closes, found by its fixed
/// places alone (the `.` at 6, 7 or 8, the `]` seven bytes after it): the index of
/// the `]`. The digits are not looked at ([`kernel_stamp_usec`] reads them).
#[inline]
pub(crate) fn kernel_stamp_close(line: &[u8]) -> Option<usize> {
    let dot = (6..=8).find(|&d| line.get(d) == Some(&b'.'))?;
    (line.get(dot + 7) == Some(&b']')).then_some(dot + 7)
}

/// The stamp as the kernel prints it, `[%5lu.%06lu]`: seconds right-aligned in at
/// least five places (up to seven here), six fraction digits, read at their fixed
/// positions: `(index of the ']', µs)`. `None` for any other shape; where this gives
/// a value, it is [`dmesg_stamp`]'s.
#[inline]
fn kernel_width_stamp(line: &[u8]) -> Option<(usize, u64)> {
    let close = kernel_stamp_close(line)?;
    Some((close, kernel_stamp_usec(line, close)?))
}

/// The µs of a kernel-width stamp closing at `close` (see [`kernel_stamp_close`]):
/// blanks then digits before the dot, six digits after it.
#[inline]
fn kernel_stamp_usec(line: &[u8], close: usize) -> Option<u64> {
    let dot = close - 7;
    let mut secs = 0u64;
    let mut digits = false;
    for &c in &line[1..dot] {
        match c {
            b' ' if !digits => {}
            b'0'..=b'9' => {
                secs = secs * 10 + u64::from(c - b'0');
                digits = true;
            }
            _ => return None,
        }
    }
    let mut frac = 0u64;
    for &c in &line[dot + 1..close] {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        frac = frac * 10 + u64::from(d);
    }
    digits.then_some(secs * 1_000_000 + frac)
}

/// Fast path for the common `dmesg` stamp ` 123.456789`: ASCII spaces, digits, one
/// `.`, 1..=9 fraction digits, spaces. Returns `None` when `inner` has another
/// shape (the general parser decides), else exactly what [`parse_secs_usec`] gives.
fn plain_secs_usec(inner: &[u8]) -> Option<Option<u64>> {
    let inner = inner.trim_ascii_end();
    let start = inner.iter().position(|&b| b != b' ')?;
    let digits = &inner[start..];
    let dot = digits.iter().position(|&b| b == b'.')?;
    let (secs, frac) = (&digits[..dot], &digits[dot + 1..]);
    if secs.is_empty()
        || secs.len() > 19
        || frac.is_empty()
        || frac.len() > 9
        || !secs.iter().chain(frac).all(u8::is_ascii_digit)
    {
        return None;
    }
    let num = |d: &[u8]| d.iter().fold(0u64, |v, &b| v * 10 + u64::from(b - b'0'));
    let frac_v = num(frac);
    let usec = if frac.len() <= 6 {
        frac_v * 10u64.pow(6 - frac.len() as u32)
    } else {
        frac_v / 10u64.pow(frac.len() as u32 - 6)
    };
    Some(
        num(secs)
            .checked_mul(1_000_000)
            .and_then(|v| v.checked_add(usec)),
    )
}

/// The general bracket timestamp: monotonic, relative (`-H`), ctime (`-T`) or
/// `Mon D HH:MM` (`-H`) → (format, monotonic µs, wall-clock ns).
fn bracket_time(inner: &[u8], plain: LineFormat) -> Option<(LineFormat, Option<u64>, Option<u64>)> {
    let inner = std::str::from_utf8(inner).ok()?;
    let trimmed = inner.trim_start();
    let (format, mono, wall) = if let Some(rel) = trimmed.strip_prefix('+') {
        parse_secs_usec(rel)?;
        (LineFormat::DmesgHuman, None, None)
    } else if trimmed.starts_with(|c: char| c.is_ascii_digit()) {
        (plain, Some(parse_secs_usec(trimmed)?), None)
    } else {
        // Up to 6 words on the stack (6 = "too many" for both shapes): no allocation.
        let mut words = [""; 6];
        let mut n = 0;
        for w in trimmed.split_ascii_whitespace().take(6) {
            words[n] = w;
            n += 1;
        }
        match &words[..n] {
            // `Mon Mar  3 12:00:00 2025`
            [_wday, mon, day, time, year] => {
                let month = month_number(mon)?;
                let day: u32 = day.parse().ok()?;
                let (h, m, s, nanos) = parse_hms(time)?;
                let year: i64 = year.parse().ok()?;
                let t = unix_nanos(year, month, day, h, m, s, nanos, 0)?;
                (LineFormat::DmesgCtime, None, Some(t))
            }
            // `Mar 3 12:00`
            [mon, day, time] => {
                month_number(mon)?;
                day.parse::<u32>().ok().filter(|d| (1..=31).contains(d))?;
                parse_hm(time)?;
                (LineFormat::DmesgHuman, None, None)
            }
            _ => return None,
        }
    };
    Some((format, mono, wall))
}

/// Skips a printk caller id right after the timestamp: `[ T291]`, ` [    C3]`.
#[inline]
fn skip_caller_id(rest: &[u8]) -> &[u8] {
    let candidate = rest.strip_prefix(b" ").unwrap_or(rest);
    if candidate.first() != Some(&b'[') {
        return rest;
    }
    let Some(close) = memchr::memchr(b']', &candidate[..candidate.len().min(16)]) else {
        return rest;
    };
    let inner = candidate[1..close].trim_ascii_start();
    match inner.split_first() {
        Some((b'T' | b'C', digits))
            if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) =>
        {
            &candidate[close + 1..]
        }
        _ => rest,
    }
}

/// `HOST kernel: msg` → `msg`.
#[inline]
fn strip_host_kernel_tag(rest: &[u8]) -> Option<&[u8]> {
    // The first space is near the start (a host name, or the message's first word):
    // a byte loop over a few bytes costs less than memchr's call and set-up.
    let near = &rest[..rest.len().min(16)];
    let sp = match near.iter().position(|&b| b == b' ') {
        Some(sp) => sp,
        None => near.len() + memchr::memchr(b' ', &rest[near.len()..])?,
    };
    if sp == 0 {
        return None;
    }
    rest[sp + 1..].strip_prefix(b"kernel: ")
}

/// `123.456789` → microseconds (fewer fraction digits are scaled).
fn parse_secs_usec(s: &str) -> Option<u64> {
    let (secs, frac) = s.trim().split_once('.')?;
    if secs.is_empty() || frac.is_empty() || frac.len() > 9 {
        return None;
    }
    if !secs.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let frac_v: u64 = frac.parse().ok()?;
    let usec = if frac.len() <= 6 {
        frac_v * 10u64.pow(6 - frac.len() as u32)
    } else {
        frac_v / 10u64.pow(frac.len() as u32 - 6)
    };
    secs.checked_mul(1_000_000)?.checked_add(usec)
}

/// Month abbreviations (lowercase, trailing `.` removed) in the locales syslog and
/// `dmesg -T` commonly use.
const MONTHS: [&[&str]; 12] = [
    &[
        "jan", "janv", "ene", "gen", "jän", "january", "janvier", "enero",
    ],
    &["feb", "févr", "fév", "fev", "fevr", "february", "février"],
    &["mar", "mär", "mrz", "mars", "march", "marzo"],
    &["apr", "avr", "abr", "april", "avril", "abril"],
    &["may", "mai", "mag", "mayo"],
    &["jun", "juin", "giu", "june", "junio"],
    &["jul", "juil", "lug", "july", "juillet", "julio"],
    &["aug", "août", "aou", "ago", "august", "agosto"],
    &["sep", "sept", "set", "september", "septembre", "septiembre"],
    &["oct", "okt", "ott", "out", "october", "octobre", "octubre"],
    &["nov", "november", "novembre", "noviembre"],
    &[
        "dec",
        "dez",
        "déc",
        "dic",
        "december",
        "décembre",
        "diciembre",
    ],
];

fn month_number(token: &str) -> Option<u32> {
    let token = token.strip_suffix('.').unwrap_or(token);
    if token.is_empty() || token.len() > 12 {
        return None;
    }
    let lowered;
    let t = if token.is_ascii() {
        token
    } else {
        lowered = token.to_lowercase();
        lowered.as_str()
    };
    MONTHS
        .iter()
        .position(|names| names.iter().any(|n| n.eq_ignore_ascii_case(t)))
        .map(|i| i as u32 + 1)
}

/// `HH:MM:SS[.frac]` → (h, m, s, nanos).
fn parse_hms(s: &str) -> Option<(u32, u32, u32, u32)> {
    let (hms, frac) = match s.split_once(['.', ',']) {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    };
    let b = hms.as_bytes();
    if b.len() != 8 || b[2] != b':' || b[5] != b':' {
        return None;
    }
    let h = two_digits(&b[0..2])?;
    let m = two_digits(&b[3..5])?;
    let sec = two_digits(&b[6..8])?;
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let nanos = match frac {
        Some(f) if !f.is_empty() && f.len() <= 9 && f.bytes().all(|c| c.is_ascii_digit()) => {
            f.parse::<u32>().ok()? * 10u32.pow(9 - f.len() as u32)
        }
        Some(_) => return None,
        None => 0,
    };
    Some((h, m, sec, nanos))
}

fn parse_hm(s: &str) -> Option<()> {
    let b = s.as_bytes();
    if b.len() != 5 || b[2] != b':' {
        return None;
    }
    (two_digits(&b[0..2])? <= 23 && two_digits(&b[3..5])? <= 59).then_some(())
}

fn two_digits(b: &[u8]) -> Option<u32> {
    match b {
        [a, c] if a.is_ascii_digit() && c.is_ascii_digit() => {
            Some(u32::from(a - b'0') * 10 + u32::from(c - b'0'))
        }
        _ => None,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[allow(clippy::too_many_arguments)]
fn unix_nanos(
    year: i64,
    month: u32,
    day: u32,
    h: u32,
    m: u32,
    s: u32,
    nanos: u32,
    offset_secs: i64,
) -> Option<u64> {
    if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let secs = days_from_civil(year, month, day) * 86_400
        + i64::from(h) * 3600
        + i64::from(m) * 60
        + i64::from(s)
        - offset_secs;
    let secs = u64::try_from(secs).ok()?;
    secs.checked_mul(1_000_000_000)?
        .checked_add(u64::from(nanos))
}

/// `2025-03-03T12:00:00[.,frac][Z|±HH:MM|±HHMM]` → (unix nanos, bytes used, used comma).
fn parse_iso_timestamp(b: &[u8]) -> Option<(u64, usize, bool)> {
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !(b[10] == b'T' || b[10] == b' ') {
        return None;
    }
    let year = std::str::from_utf8(&b[0..4]).ok()?.parse::<i64>().ok()?;
    if !b[0..4].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let month = two_digits(&b[5..7])?;
    let day = two_digits(&b[8..10])?;
    let mut end = 19;
    let mut comma = false;
    if end < b.len() && (b[end] == b'.' || b[end] == b',') {
        comma = b[end] == b',';
        end += 1;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
    }
    let hms = std::str::from_utf8(&b[11..end]).ok()?;
    let (h, m, s, nanos) = parse_hms(hms)?;
    let mut offset = 0i64;
    match b.get(end) {
        Some(b'Z') => end += 1,
        Some(&sign @ (b'+' | b'-')) => {
            let tz = &b[end + 1..];
            let (oh, om, used) = if tz.len() >= 5 && tz[2] == b':' {
                (two_digits(&tz[0..2])?, two_digits(&tz[3..5])?, 5)
            } else if tz.len() >= 4 {
                (two_digits(&tz[0..2])?, two_digits(&tz[2..4])?, 4)
            } else {
                return None;
            };
            offset = i64::from(oh * 3600 + om * 60);
            if sign == b'-' {
                offset = -offset;
            }
            end += 1 + used;
        }
        _ => {}
    }
    let t = unix_nanos(year, month, day, h, m, s, nanos, offset)?;
    Some((t, end, comma))
}

fn parse_iso_line(line: &[u8]) -> Option<LogLine<'_>> {
    let (t, used, comma) = parse_iso_timestamp(line)?;
    let rest = line[used..].strip_prefix(b" ")?;
    if !comma && let Some(mut out) = parse_host_tag(rest, LineFormat::SyslogIso) {
        out.time_unix_nano = Some(t);
        return Some(out);
    }
    let mut out = LogLine::new(LineFormat::DmesgIso, lossy(rest));
    out.time_unix_nano = Some(t);
    Some(out)
}

/// `Mar  3 12:00:00[.frac] host tag: msg`.
fn parse_syslog_line(line: &[u8]) -> Option<LogLine<'_>> {
    let sp = memchr::memchr(b' ', &line[..line.len().min(16)])?;
    let mon = std::str::from_utf8(&line[..sp]).ok()?;
    let month = month_number(mon)?;
    let mut rest = &line[sp..];
    rest = rest.trim_ascii_start();
    let sp = memchr::memchr(b' ', &rest[..rest.len().min(3)])?;
    let day = std::str::from_utf8(&rest[..sp]).ok()?;
    let day = day.parse::<u32>().ok().filter(|d| (1..=31).contains(d))?;
    rest = rest[sp..].trim_ascii_start();
    let sp = memchr::memchr(b' ', &rest[..rest.len().min(20)])?;
    let time = std::str::from_utf8(&rest[..sp]).ok()?;
    let (h, m, sec, nanos) = parse_hms(time)?;
    let format = if time.len() > 8 {
        LineFormat::SyslogPrecise
    } else {
        LineFormat::SyslogShort
    };
    let mut out = parse_host_tag(&rest[sp + 1..], format)?;
    out.yearless_time = Some(YearlessTime {
        month,
        day,
        second_of_day: (h * 3600 + m * 60 + sec).min(86_399),
        nanos,
    });
    Some(out)
}

/// `host tag[pid]: msg` → message (with `#ooo` escapes decoded and an embedded
/// `[ 123.4]` kernel timestamp lifted out).
fn parse_host_tag(rest: &[u8], format: LineFormat) -> Option<LogLine<'_>> {
    // People often cut the host name before pasting: `Feb 23 03:28:16 kernel: msg`.
    let unpadded = rest.trim_ascii_start();
    let after_host = if unpadded.starts_with(b"kernel: ") {
        unpadded
    } else {
        let sp = memchr::memchr(b' ', rest)?;
        if sp == 0 {
            return None;
        }
        &rest[sp + 1..]
    };
    let colon = memchr::memchr(b':', &after_host[..after_host.len().min(64)])?;
    let tag = &after_host[..colon];
    let valid_tag = !tag.is_empty()
        && tag.iter().all(|&b| {
            b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/' | b'[' | b']' | b'@')
        });
    if !valid_tag {
        return None;
    }
    let is_kernel = tag == b"kernel";
    let mut msg = &after_host[colon + 1..];
    msg = msg.strip_prefix(b" ").unwrap_or(msg);
    let mut mono = None;
    if is_kernel
        && msg.first() == Some(&b'[')
        && let Some(close) = memchr::memchr(b']', &msg[..msg.len().min(24)])
        && let Some(us) = std::str::from_utf8(&msg[1..close])
            .ok()
            .and_then(parse_secs_usec)
    {
        mono = Some(us);
        msg = &msg[close + 1..];
        msg = skip_caller_id(msg);
        msg = msg.strip_prefix(b" ").unwrap_or(msg);
    }
    let mut out = LogLine::new(format, unescape_syslog(msg));
    out.facility = Some(if is_kernel { 0 } else { 1 });
    out.monotonic_usec = mono;
    Some(out)
}

/// Decodes rsyslog's control-character escapes `#ooo` (octal, `#012` = newline).
fn unescape_syslog(msg: &[u8]) -> Cow<'_, str> {
    let is_escape = |w: &[u8]| {
        w.len() >= 4
            && w[0] == b'#'
            && matches!(w[1], b'0'..=b'3')
            && matches!(w[2], b'0'..=b'7')
            && matches!(w[3], b'0'..=b'7')
            && {
                let v = (w[1] - b'0') * 64 + (w[2] - b'0') * 8 + (w[3] - b'0');
                v < 0x20 || v == 0x7f
            }
    };
    let has = memchr::memchr_iter(b'#', msg).any(|i| is_escape(&msg[i..]));
    if !has {
        return lossy(msg);
    }
    let mut out = Vec::with_capacity(msg.len());
    let mut i = 0;
    while i < msg.len() {
        if is_escape(&msg[i..]) {
            out.push((msg[i + 1] - b'0') * 64 + (msg[i + 2] - b'0') * 8 + (msg[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(msg[i]);
            i += 1;
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> LogLine<'_> {
        parse_line(s.as_bytes())
    }

    #[test]
    fn dmesg_decoded_facility_and_level_prefixes() {
        let l = parse_line(b"kern  :warn  : [   42.023596] NVRM: Xid (PCI:0000:00:06): 13, x");
        assert_eq!((l.facility, l.level), (Some(0), Some(4)));
        assert_eq!(l.monotonic_usec, Some(42_023_596));
        assert_eq!(l.format, LineFormat::Dmesg);
        assert!(l.message.starts_with("NVRM: Xid"));
        let l = parse_line(
            b"user  :err   : [Mon Oct  3 13:52:42 2022] NVRM: Xid (PCI:0000:00:06): 79, x",
        );
        assert_eq!((l.facility, l.level), (Some(1), Some(3)));
        assert_eq!(l.format, LineFormat::DmesgCtime);
        let l = parse_line(b"local7:debug : plain message");
        assert_eq!((l.facility, l.level), (Some(23), Some(7)));
        assert_eq!(l.message, "plain message");
        // Not a facility name / not a level: not this form.
        assert_eq!(parse_line(b"kernel:warn  : x").facility, None);
        assert_eq!(parse_line(b"kern  :warning: x").facility, None);
    }

    #[test]
    fn dmesg_plain_and_caller_ids() {
        let l = p("[  123.456789] NVRM: x");
        assert_eq!(l.format, LineFormat::Dmesg);
        assert_eq!(l.monotonic_usec, Some(123_456_789));
        assert_eq!(l.message, "NVRM: x");
        for s in ["[  123.4][ T291] NVRM: x", "[  123.4] [    C3] NVRM: x"] {
            let l = p(s);
            assert_eq!(l.message, "NVRM: x", "{s}");
            assert_eq!(l.monotonic_usec, Some(123_400_000));
        }
    }

    #[test]
    fn dmesg_ctime_is_utc() {
        let l = p("[Mon Mar  3 12:00:00 2025] NVRM: x");
        assert_eq!(l.format, LineFormat::DmesgCtime);
        assert_eq!(l.time_unix_nano, Some(1_741_003_200_000_000_000));
        assert_eq!(l.message, "NVRM: x");
    }

    #[test]
    fn dmesg_human_forms() {
        for s in ["[Mar 3 12:00] NVRM: x", "[  +0.000123] NVRM: x"] {
            let l = p(s);
            assert_eq!(l.format, LineFormat::DmesgHuman, "{s}");
            assert_eq!(l.message, "NVRM: x");
        }
    }

    #[test]
    fn iso_forms() {
        let l = p("2025-03-03T12:00:00,123456+00:00 NVRM: x");
        assert_eq!(l.format, LineFormat::DmesgIso);
        assert_eq!(l.time_unix_nano, Some(1_741_003_200_123_456_000));
        assert_eq!(l.message, "NVRM: x");
        let l = p("2025-03-03T13:00:00.5+01:00 gpu1 kernel: NVRM: x");
        assert_eq!(l.format, LineFormat::SyslogIso);
        assert_eq!(l.time_unix_nano, Some(1_741_003_200_500_000_000));
        assert_eq!(l.facility, Some(0));
        let l = p("2025-03-03T12:00:00+0000 gpu1 kernel: NVRM: x");
        assert_eq!(l.time_unix_nano, Some(1_741_003_200_000_000_000));
        assert_eq!(l.message, "NVRM: x");
    }

    #[test]
    fn syslog_and_journal() {
        let l = p("Mar 03 12:00:00.123456 gpu1 kernel: NVRM: x");
        assert_eq!(l.format, LineFormat::SyslogPrecise);
        assert_eq!(l.message, "NVRM: x");
        let l = p("Mär  3 12:00:00 gpu1 kernel: NVRM: x");
        assert_eq!(l.format, LineFormat::SyslogShort);
        let l = p("févr. 13 08:01:02 gpu1 kernel: NVRM: x");
        assert_eq!(l.message, "NVRM: x");
        let l = p("dic 24 23:59:59 gpu1 kernel: NVRM: x");
        assert_eq!(l.facility, Some(0));
        let l = p("Mar  3 12:00:00 gpu1 python3[4242]: NVRM: Xid (PCI:0000:3b:00): 79");
        assert_eq!(l.facility, Some(1));
        assert!(l.message.starts_with("NVRM"));
    }

    #[test]
    fn unknown_prefix_is_whole_line() {
        for s in [
            "hello world",
            "Marvel 3 is out",
            "[broken",
            "<x>[1.0] y",
            "",
        ] {
            let l = p(s);
            assert_eq!(l.format, LineFormat::Unknown, "{s}");
            assert_eq!(l.message, s);
        }
    }

    #[test]
    fn kernel_width_stamps_read_as_any_stamp() {
        // The kernel's shapes (5 to 7 second places, 6 fraction digits) with every
        // byte of the stamp replaced by each of a few others.
        let mut hits = 0;
        for base in [
            "[    1.000000] NVRM",
            "[12345.678901] x",
            "[123456.789012]",
            "[1234567.000001] y",
            "[    0.000000]",
            "[   12.5] z",
        ] {
            for at in 0..base.len() {
                for b in [b' ', b'0', b'9', b'.', b']', b'x', b'[', 0x80] {
                    let mut line = base.as_bytes().to_vec();
                    line[at] = b;
                    for l in [&line[..], base.as_bytes()] {
                        if let Some((close, usec)) = kernel_width_stamp(l) {
                            hits += 1;
                            assert_eq!(
                                dmesg_stamp_scan(l),
                                Some((close, Some(usec))),
                                "{:?}",
                                String::from_utf8_lossy(l)
                            );
                        }
                    }
                }
            }
        }
        assert!(hits > 100, "{hits}");
    }

    #[test]
    fn timestamp_fast_path_agrees_with_the_general_parser() {
        // Every string of up to 6 bytes over the interesting alphabet, plus long ones.
        let alphabet = [b' ', b'0', b'7', b'9', b'.', b'\t', b'+', b'x'];
        let mut inputs: Vec<Vec<u8>> = vec![Vec::new()];
        let mut frontier = inputs.clone();
        for _ in 0..6 {
            let next: Vec<Vec<u8>> = frontier
                .iter()
                .flat_map(|p| alphabet.iter().map(move |&b| [p.as_slice(), &[b]].concat()))
                .collect();
            inputs.extend(next.iter().cloned());
            frontier = next;
        }
        for long in [
            "99999999999999999999.1",
            "9999999999999999999.999999999",
            "18446744073709.551615",
            "18446744073709.551616",
            "  123.456789  ",
            "1.1234567891",
        ] {
            inputs.push(long.as_bytes().to_vec());
        }
        let mut fast_hits = 0;
        for inner in &inputs {
            let Some(fast) = plain_secs_usec(inner) else {
                continue;
            };
            fast_hits += 1;
            let general = bracket_time(inner, LineFormat::Dmesg);
            assert_eq!(
                fast,
                general.and_then(|(_, mono, _)| mono),
                "{:?}",
                String::from_utf8_lossy(inner)
            );
            if fast.is_some() {
                assert_eq!(general.map(|g| g.0), Some(LineFormat::Dmesg));
            } else {
                assert!(general.is_none());
            }
        }
        assert!(fast_hits > 1000, "{fast_hits}");
        // The one-pass reader of a whole `[stamp] msg` line agrees with the search
        // for the `]` plus the general parser (the `]` included in the alphabet).
        let mut stamp_hits = 0;
        for inner in inputs
            .iter()
            .chain(&[b"1.5]".to_vec(), b" 1.5 ] ]".to_vec()])
        {
            let line = [b"[".as_slice(), inner, b"] m"].concat();
            let Some((close, fast)) = dmesg_stamp(&line) else {
                continue;
            };
            stamp_hits += 1;
            let general_close = memchr::memchr(b']', &line[..line.len().min(40)]);
            assert_eq!(
                Some(close),
                general_close,
                "{:?}",
                String::from_utf8_lossy(&line)
            );
            let general = bracket_time(&line[1..close], LineFormat::Dmesg);
            assert_eq!(fast, general.and_then(|(_, mono, _)| mono));
            assert_eq!(plain_secs_usec(&line[1..close]), Some(fast));
        }
        assert!(stamp_hits > 1000, "{stamp_hits}");
    }

    #[test]
    fn kmsg_and_raw() {
        let l = p("3,1042,86400000000,-;NVRM: a\\x0ab\n");
        assert_eq!(l.format, LineFormat::Kmsg);
        assert_eq!(l.seq, Some(1042));
        assert_eq!(l.message, "NVRM: a\nb");
        let l = p("<12>hello");
        assert_eq!((l.facility, l.level), (Some(1), Some(4)));
        assert_eq!(l.message, "hello");
    }
}
