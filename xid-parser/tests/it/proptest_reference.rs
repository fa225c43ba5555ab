//! The hand-written fast path agrees with a plain `regex` reference
//! implementation on generated XID lines (well-formed, truncated, in every
//! saved-log prefix format), and the memchr prefilter never rejects a line the
//! reference recognises.

use proptest::prelude::*;
use regex::Regex;
use std::sync::LazyLock;
use xid_parser::{Message, normalize_pci, parse_line, parse_message};

static XID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?)\): (?P<code>\d{1,9})(?:$|[,. ])(?:\s*pid=(?P<pid>[^,]*),?)?(?:\s*name=(?P<name>[^,]*),?)?",
    )
    .expect("valid regex")
});

#[derive(Debug, PartialEq)]
struct Ref {
    pci: String,
    code: u32,
    pid: Option<u32>,
    process: Option<String>,
}

fn reference(msg: &str) -> Option<Ref> {
    let c = XID.captures(msg)?;
    let pci = normalize_pci(&c["pci"])?;
    let process = c
        .name("name")
        .map(|m| m.as_str().trim())
        .filter(|n| !n.is_empty() && *n != "<unknown>")
        .map(str::to_owned);
    Some(Ref {
        pci,
        code: c["code"].parse().ok()?,
        pid: c.name("pid").and_then(|m| m.as_str().trim().parse().ok()),
        process,
    })
}

fn fast(msg: &str) -> Option<Ref> {
    match parse_message(msg)? {
        Message::Xid(x) => Some(Ref {
            pci: normalize_pci(x.pci)?,
            code: x.code,
            pid: x.pid,
            process: x.process.map(str::to_owned),
        }),
        _ => None,
    }
}

fn pci_strategy() -> impl Strategy<Value = String> {
    (
        0u32..0x10000,
        0u32..0x100,
        0u32..0x20,
        prop::option::of(0u32..8),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(d, b, dev, f, upper, prefix)| {
            let mut s = format!("{d:04x}:{b:02x}:{dev:02x}");
            if let Some(f) = f {
                s.push_str(&format!(".{f}"));
            }
            if upper {
                s = s.to_uppercase();
            }
            if prefix { format!("PCI:{s}") } else { s }
        })
}

fn xid_line() -> impl Strategy<Value = String> {
    (
        pci_strategy(),
        0u32..200,
        prop::option::of(prop_oneof![
            (0u32..5_000_000).prop_map(|p| p.to_string()),
            Just("'<unknown>'".to_owned())
        ]),
        prop::option::of(prop_oneof![
            "[a-z_][a-z0-9_.]{0,12}",
            Just("<unknown>".to_owned())
        ]),
        prop::option::of("[0-9a-f]{8}"),
        "[ -~]{0,60}",
    )
        .prop_map(|(pci, code, pid, name, ch, detail)| {
            let mut s = format!("NVRM: Xid ({pci}): {code}");
            if let Some(p) = pid {
                s.push_str(&format!(", pid={p}"));
            }
            if let Some(n) = name {
                s.push_str(&format!(", name={n}"));
            }
            if let Some(c) = ch {
                s.push_str(&format!(", Ch {c}"));
            }
            // Free text never starts with a field name, and has no commas inside
            // the pid/name fields by construction.
            s.push_str(", ");
            s.push_str(detail.trim_start_matches(|c: char| c == ',' || c.is_whitespace()));
            s
        })
}

fn prefix() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        (0u64..100_000, 0u64..1_000_000).prop_map(|(s, u)| format!("[{s:>5}.{u:06}] ")),
        (0u64..100_000).prop_map(|s| format!("<3>[{s:>5}.000001] ")),
        Just("[Mon Mar  3 12:00:00 2025] ".to_owned()),
        Just("Mar  3 12:00:00 node kernel: ".to_owned()),
        Just("2025-03-03T12:00:00.5+00:00 node kernel: [ 12.5] ".to_owned()),
        (0u64..1000).prop_map(|q| format!("3,{q},{q}000,-;")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn fast_path_agrees_with_regex_on_xid_lines(pre in prefix(), line in xid_line()) {
        let full = format!("{pre}{line}");
        let parsed = parse_line(full.as_bytes());
        let r = reference(&parsed.message);
        prop_assert!(r.is_some(), "reference rejected generated line {:?}", parsed.message);
        prop_assert_eq!(fast(&parsed.message), r);
    }

    #[test]
    fn fast_path_agrees_with_regex_on_truncated_lines(line in xid_line(), cut in 0usize..200) {
        let mut cut = cut.min(line.len());
        while !line.is_char_boundary(cut) { cut -= 1; }
        let t = &line[..cut];
        // A truncated name or pid may end the line: the reference reads it the same way.
        prop_assert_eq!(fast(t), reference(t), "line {:?}", t);
    }

    #[test]
    fn prefilter_never_rejects_a_reference_match(noise in "[ -~]{0,80}", line in xid_line(), at in 0usize..80) {
        let mut at = at.min(noise.len());
        while !noise.is_char_boundary(at) { at -= 1; }
        let msg = format!("{}{}{}", &noise[..at], line, &noise[at..]);
        if reference(&msg).is_some() {
            prop_assert!(xid_parser::Scanner::interesting(msg.as_bytes()));
        }
    }

    #[test]
    fn random_text_never_panics(s in "\\PC{0,200}") {
        let _ = parse_message(&s);
        let _ = parse_line(s.as_bytes());
    }
}
