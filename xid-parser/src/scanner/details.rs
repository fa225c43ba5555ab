//! The per-line details of the scanner: the attributes an XID line states
//! itself, the small tables of recent SXid heads and fallen-off GPUs, machine
//! check ranks, and the names of AER events.

use super::*;

/// The attributes an XID line states itself: the code as printed when out of
/// range, the channel, each code's own details (NVLink5 fields with the driver
/// version that decodes them, XID 154's recovery action, XID 74's link) and the
/// ECC error type; `link` holds the link number's digits.
#[inline]
pub(super) fn xid_line_attrs<'a>(
    x: &XidMsg<'a>,
    driver_version: Option<&'a str>,
    link: &'a mut [u8; 10],
    add: &mut impl FnMut((&'a str, &'a str)),
) {
    if let Some(printed) = x.code_as_printed {
        add(("xid_as_printed", printed));
    }
    if let Some(c) = x.channel {
        add(("channel", c));
    }
    if let Some(gi) = x.gpu_instance {
        add(("gpu_instance", gi));
    }
    if let Some(ci) = x.compute_instance {
        add(("compute_instance", ci));
    }
    match x.code {
        144..=150 => {
            if let Some(v) = parse_nvlink5(x.detail) {
                add(("sub_component", v.sub_component));
                if let Some(f) = v.fatal {
                    add(("fatal", if f { "true" } else { "false" }));
                }
                if let Some(l) = v.link {
                    add(("link", decimal(l, link)));
                }
                if let Some(i) = v.intr_info {
                    add(("intr_info", i));
                }
                if let Some(e) = v.error_status {
                    add(("error_status", e));
                }
                if let Some(d) = driver_version {
                    add(("driver_version", d));
                }
            }
        }
        154 => {
            if let Some(a) = crate::message::recovery_action_from_text(x.detail) {
                add(("recovery_action", a.short_name()));
            }
        }
        74 => {
            if let Some(l) = crate::message::link_in(x.detail) {
                add(("link", decimal(l, link)));
            }
        }
        _ => {}
    }
    if let Some(t) = crate::message::ecc_type_of(x.detail) {
        add(("ecc_type", t));
    }
}

/// Remembers when `switch` last printed an SXid head line of `code` (updated in
/// place; bounded like the identity table).
pub(super) fn note_sxid(
    last: &mut Vec<(String, u32, Option<u64>)>,
    switch: &str,
    code: u32,
    at: Option<u64>,
) {
    match last.iter_mut().find(|(p, c, _)| p == switch && *c == code) {
        Some(e) => e.2 = at,
        None => {
            if last.len() >= MAX_IDENTITIES {
                last.remove(0);
            }
            last.push((switch.to_owned(), code, at));
        }
    }
}

/// The CPU number of an x86 thermal-throttle line (`CPU3: …`, after an `mce: `
/// prefix when the kernel prints one).
pub(super) fn cpu_number(raw: &str) -> Option<u32> {
    let i = find!(raw, "CPU")?;
    let digits = &raw[i + 3..];
    let end = digits
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 || digits.as_bytes().get(end) != Some(&b':') {
        return None;
    }
    digits[..end].parse().ok()
}

/// Remembers the time of `pci`'s XID 79 in `last_fallen` (updated in place: a
/// storm of XID 79s allocates nothing here; bounded like the identities).
pub(super) fn note_fallen(
    last_fallen: &mut Vec<(String, Option<u64>)>,
    pci: &str,
    at: Option<u64>,
) {
    match last_fallen.iter_mut().find(|(p, _)| same_text(p, pci)) {
        Some((_, t)) => *t = at,
        None => {
            if last_fallen.len() >= MAX_IDENTITIES {
                last_fallen.remove(0);
            }
            last_fallen.push((pci.to_owned(), at));
        }
    }
}

/// `n` in decimal, written into `buf`.
fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // ASCII digits: the conversion cannot fail.
    std::str::from_utf8(&buf[i..]).unwrap_or("")
}

/// Sorted-insert of `pair` into the first `*n` entries of `list` (a handful).
pub(super) fn insert_attr<'a>(
    list: &mut [(&'a str, &'a str)],
    n: &mut usize,
    pair: (&'a str, &'a str),
) {
    let mut i = *n;
    while i > 0 && list[i - 1].0 > pair.0 {
        list[i] = list[i - 1];
        i -= 1;
    }
    list[i] = pair;
    *n += 1;
}

/// XIDs whose one fault may print several lines. Not: 79 (its own assembly),
/// 119/120 (GSP dump), 154 (each line is a change of recovery action), NVLink
/// 74/144-150 (one line per link), ECC 48/63/64/92/94/95 (one line per error).
pub(super) fn multi_line_xid(code: u32) -> bool {
    !matches!(
        code,
        48 | 63 | 64 | 74 | 79 | 92 | 94 | 95 | 119 | 120 | 144..=150 | 154
    )
}

/// True when `meta` is within [`XID_REPEAT_USEC`] of `ev`'s first line (monotonic
/// time, else wall-clock time; lines without time are adjacent records).
pub(super) fn within_repeat_window(ev: &FaultEvent, meta: &RecordMeta) -> bool {
    match (ev.monotonic_usec, meta.monotonic_usec) {
        (Some(a), Some(b)) => b.abs_diff(a) <= XID_REPEAT_USEC,
        _ => match (ev.time_unix_nano, meta.time_unix_nano) {
            (Some(a), Some(b)) => b.abs_diff(a) <= XID_REPEAT_USEC * 1000,
            (None, None) => true,
            _ => false,
        },
    }
}

pub(super) fn mce_bit(p: McePart) -> u8 {
    match p {
        McePart::Summary => 1,
        McePart::Status => 2,
        McePart::BankDecode => 4,
        McePart::Severity => 8,
        McePart::MemoryError => 16,
        McePart::Panic => 32,
        McePart::Heading => 64,
    }
}

/// Rank of a machine-check severity (`mce_severity`): the report keeps the worst.
fn mce_rank(s: &str) -> u8 {
    match s {
        "corrected" => 1,
        "recoverable" => 2,
        "uncorrected" => 3,
        "fatal" => 4,
        _ => 0,
    }
}

pub(super) fn mce_details(ev: &mut FaultEvent, m: &MceMsg) {
    if let Some(b) = m.bank {
        ev.attributes
            .entry("mce_bank".to_owned())
            .or_insert_with(|| b.to_string());
    }
    if let Some(sev) = m.severity {
        let cur = ev.attributes.get("mce_severity").map_or(0, |c| mce_rank(c));
        if mce_rank(sev) > cur {
            attr(ev, "mce_severity", sev);
        }
    }
    if m.part == Some(McePart::Panic) {
        attr(ev, "mce_panic", "true");
    }
}

pub(super) fn aer_name(severity: &str) -> String {
    match severity {
        "corrected" => "PCIe AER corrected error",
        "uncorrected_nonfatal" => "PCIe AER uncorrected non-fatal error",
        _ => "PCIe AER uncorrected fatal error",
    }
    .to_owned()
}
