//! Golden tests: real (or documented-shape) kernel lines from public sources, in
//! every saved-log format, through `parse_line` + `Scanner`. Cases and their
//! sources live in `tests/data/golden.txt` (format described at its top) and
//! `tests/data/golden-real.txt` (only verbatim lines, each case with its source URL).

use gpuwatch_proto::{FaultEvent, ShortName};
use std::sync::Arc;
use xid_parser::saved_log::{LogCounts, LogOptions, read_events, read_events_plain};
use xid_parser::{Policy, Scanner, parse_line};

struct GoldenCase {
    name: String,
    sources: Vec<String>,
    input: Vec<String>,
    expect: Vec<String>,
}

const GOLDEN: &str = include_str!("../data/golden.txt");
const GOLDEN_REAL: &str = include_str!("../data/golden-real.txt");

fn cases() -> Vec<GoldenCase> {
    parse_cases(GOLDEN)
}

fn parse_cases(text: &str) -> Vec<GoldenCase> {
    let mut out: Vec<GoldenCase> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("## case: ") {
            out.push(GoldenCase {
                name: name.trim().to_owned(),
                sources: Vec::new(),
                input: Vec::new(),
                expect: Vec::new(),
            });
        } else if let Some(src) = line.strip_prefix("# source: ") {
            if let Some(c) = out.last_mut() {
                c.sources.push(src.to_owned());
            }
        } else if let Some(l) = line.strip_prefix("> ") {
            out.last_mut()
                .expect("input before a case")
                .input
                .push(l.to_owned());
        } else if let Some(e) = line.strip_prefix("= ") {
            out.last_mut()
                .expect("expectation before a case")
                .expect
                .push(e.to_owned());
        }
    }
    out
}

/// The case's events, owned (`Scanner::push`); the same case read as borrowed
/// events (`Scanner::push_view`, as `gpuwatch scan` reads) must give equal ones.
fn run(case: &GoldenCase) -> Vec<FaultEvent> {
    let mut scanner = Scanner::new(Arc::new(Policy::default()));
    let mut viewer = Scanner::new(Arc::new(Policy::default()));
    let mut viewed = Vec::new();
    let mut events = Vec::new();
    for l in &case.input {
        // `<NUL>` in a case stands for one NUL byte (not writable in the text file).
        let bytes = l.replace("<NUL>", "\0").into_bytes();
        let line = parse_line(&bytes);
        // As `gpuwatch scan` does: only kernel lines can raise faults.
        if line.facility.is_some_and(|f| f != 0) {
            continue;
        }
        let meta = line.meta();
        scanner.push(meta, &line.message, &mut events);
        viewer.push_view(meta, &line.message, &mut |ev| viewed.push(ev.to_event()));
        assert_eq!(viewed, events, "{}: after {l:?}", case.name);
    }
    scanner.finish(&mut events);
    viewer.finish_view(&mut |ev| viewed.push(ev.to_event()));
    assert_eq!(viewed, events, "{}: at the end", case.name);
    events
}

/// Checks one `= kind code pci key=value...` expectation; returns the mismatches.
fn check(ev: &FaultEvent, expect: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut parts = expect.splitn(4, ' ');
    let kind = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    let pci = parts.next().unwrap_or_default();
    if ev.kind().short_name() != kind {
        problems.push(format!("kind {} != {kind}", ev.kind().short_name()));
    }
    let want_code = if code == "-" {
        0
    } else {
        code.parse().unwrap_or(u32::MAX)
    };
    if ev.code != want_code {
        problems.push(format!("code {} != {code}", ev.code));
    }
    let want_pci = if pci == "-" { "" } else { pci };
    if ev.pci_address != want_pci {
        problems.push(format!("pci {:?} != {want_pci:?}", ev.pci_address));
    }
    // key=value pairs; values may contain spaces (up to the next ` key=`).
    let rest = parts.next().unwrap_or_default();
    let mut pairs: Vec<(String, String)> = Vec::new();
    for tok in rest.split(' ') {
        match tok.split_once('=') {
            Some((k, v))
                if !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_') =>
            {
                pairs.push((k.to_owned(), v.to_owned()));
            }
            _ => {
                if let Some(last) = pairs.last_mut() {
                    last.1.push(' ');
                    last.1.push_str(tok);
                }
            }
        }
    }
    for (k, v) in pairs {
        let got = match k.as_str() {
            "pid" => ev.pid.map_or("-".to_owned(), |p| p.to_string()),
            "process" => ev.process.clone(),
            "uuid" => ev.gpu_uuid.clone(),
            "name" => ev.name.clone(),
            "action" => ev.action().short_name().to_owned(),
            "message_starts" => {
                if ev.message.starts_with(&v) {
                    v.clone()
                } else {
                    ev.message.lines().next().unwrap_or_default().to_owned()
                }
            }
            "message_lines" => ev.message.lines().count().to_string(),
            "policy_reason_has" => {
                if ev.policy_reason.contains(&v) {
                    v.clone()
                } else {
                    ev.policy_reason.clone()
                }
            }
            other => ev
                .attributes
                .get(other)
                .cloned()
                .unwrap_or_else(|| "<absent>".to_owned()),
        };
        if got != v {
            problems.push(format!("{k} {got:?} != {v:?}"));
        }
    }
    problems
}

#[test]
fn golden_cases() {
    let cases = cases();
    assert!(cases.len() >= 40, "golden file lost cases: {}", cases.len());
    let lines: usize = cases.iter().map(|c| c.input.len()).sum();
    assert!(lines >= 100, "only {lines} golden lines");
    check_cases(&cases);
}

/// At least 100 verbatim kernel lines from public sources, every
/// case naming where its lines were published.
#[test]
fn golden_real_cases() {
    let cases = parse_cases(GOLDEN_REAL);
    let lines: usize = cases.iter().map(|c| c.input.len()).sum();
    assert!(lines >= 100, "only {lines} real golden lines");
    for case in &cases {
        assert!(
            case.sources
                .iter()
                .any(|s| s.contains("https://") || s.contains("http://")),
            "{}: no `# source:` URL",
            case.name
        );
        assert!(!case.input.is_empty(), "{}: no input lines", case.name);
    }
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len(), "duplicate case names");
    check_cases(&cases);
}

fn check_cases(cases: &[GoldenCase]) {
    let mut failures = Vec::new();
    for case in cases {
        let events = run(case);
        if events.len() != case.expect.len() {
            failures.push(format!(
                "{}: {} events, expected {}: {:#?}",
                case.name,
                events.len(),
                case.expect.len(),
                events
                    .iter()
                    .map(|e| (&e.message, e.kind().short_name(), e.code, &e.pci_address))
                    .collect::<Vec<_>>()
            ));
            continue;
        }
        for (i, (ev, exp)) in events.iter().zip(&case.expect).enumerate() {
            let p = check(ev, exp);
            if !p.is_empty() {
                failures.push(format!("{} event {i}: {}", case.name, p.join("; ")));
            }
        }
        for ev in &events {
            // Invariants for every event: classified, normalised PCI, count 1.
            assert_ne!(ev.action, 0, "{}: unclassified", case.name);
            assert_eq!(ev.count, 1);
            if !ev.pci_address.is_empty() && !ev.attributes.contains_key("pci_note") {
                assert_eq!(
                    xid_parser::normalize_pci(&ev.pci_address).as_deref(),
                    Some(ev.pci_address.as_str())
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "golden failures:\n{}",
        failures.join("\n")
    );
}

#[test]
fn gsp_dump_is_attached_to_xid119() {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "gsp_rpc_timeout_xid119_with_rpc_history_dump")
        .expect("case exists");
    let events = run(&case);
    assert_eq!(events.len(), 1);
    assert!(events[0].message.contains("RPC history (CPU -> GSP)"));
    assert!(!events[0].message.contains("Tainted"));
}

#[test]
fn checker_reports_mismatches() {
    let case = GoldenCase {
        name: "self_test".into(),
        sources: Vec::new(),
        input: vec!["[ 1.0] NVRM: Xid (PCI:0000:3b:00): 43, pid=7, name=a b, Ch 00000002".into()],
        expect: Vec::new(),
    };
    let events = run(&case);
    assert_eq!(events.len(), 1);
    assert!(
        check(
            &events[0],
            "xid 43 0000:3b:00.0 pid=7 process=a b channel=00000002"
        )
        .is_empty()
    );
    assert_eq!(
        check(&events[0], "xid 44 0000:3b:00.1 pid=8 channel=1").len(),
        4
    );
}

/// Whole input through `read_events` (`gpuwatch scan`'s reader: block reads and a
/// whole-buffer marker search that looks only at lines around a hit).
fn read_whole(input: &[u8], step: usize) -> Vec<FaultEvent> {
    struct Chunks<'a>(&'a [u8], usize);
    impl std::io::Read for Chunks<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }
    let policy = Arc::new(Policy::default());
    let mut events = Vec::new();
    let mut counts = LogCounts::default();
    read_events(
        &mut Chunks(input, step),
        &policy,
        LogOptions::default(),
        &mut counts,
        |ev| {
            events.push(ev.to_event());
            Ok::<(), ()>(())
        },
    )
    .expect("in-memory reads do not fail");
    events
}

/// A marker search that misses a shape loses its lines only on the whole-buffer
/// path (the per-line path tests every line), so every golden case and every
/// line of the repository's kernel-line corpora goes through both, as one input
/// and line by line, and must give the same events.
#[test]
fn whole_buffer_and_per_line_paths_agree_on_every_golden_and_corpus_line() {
    let policy = Arc::new(Policy::default());
    let mut cases = cases();
    cases.extend(parse_cases(GOLDEN_REAL));
    for case in &cases {
        let text: String = case
            .input
            .iter()
            .map(|l| l.replace("<NUL>", "\0") + "\n")
            .collect();
        let per_line = run(case);
        for step in [usize::MAX, 7] {
            assert_eq!(
                read_whole(text.as_bytes(), step),
                per_line,
                "{} (step {step})",
                case.name
            );
        }
    }
    let corpora: [(&str, &str); 3] = [
        (
            "shapes",
            include_str!("../../../fuzz/seeds/message_scanner/shapes.txt"),
        ),
        (
            "storm",
            include_str!("../../../fuzz/seeds/message_scanner/storm.txt"),
        ),
        (
            "e2e-kmsg",
            include_str!("../../../deploy/tests/e2e-kmsg.txt"),
        ),
    ];
    let mut lines = 0;
    for (name, text) in corpora {
        let (plain, _) = read_events_plain(text.as_bytes(), &policy, LogOptions::default());
        assert_eq!(read_whole(text.as_bytes(), usize::MAX), plain, "{name}");
        for line in text.lines() {
            let one = format!("{line}\n");
            let (plain, _) = read_events_plain(one.as_bytes(), &policy, LogOptions::default());
            assert_eq!(
                read_whole(one.as_bytes(), usize::MAX),
                plain,
                "{name}: {line:?}"
            );
            lines += 1;
        }
    }
    assert!(lines >= 30, "corpora lost lines: {lines}");
}
