//! `gpuwatch scan [--format json|text] [FILE...]`: offline analysis of saved
//! kernel logs (`dmesg` in any of its time formats, `journalctl -k`, syslog,
//! raw `/dev/kmsg` dumps, mixed). Reads stdin when no file (or `-`) is given.
//!
//! - `--format json` (default): one `FaultEvent` JSON object per line, in input
//!   order, `source = "log_file"`.
//! - `--format text`: a table of the events, then one summary line per GPU (PCI
//!   address) with the most severe action and what to do about it.
//!
//! Exit codes (the caller maps [`ScanSummary::exit_code`]): **0** nothing needs
//! action, **2** at least one fault with action `reset_gpu` or more severe, **1**
//! an error (unreadable file, output closed).
//!
//! Only kernel lines can raise faults: syslog lines of other programs (a user
//! process printing "NVRM: Xid ...") and user-facility kmsg/`dmesg -r` records are
//! counted and skipped. Lines longer than 64 KiB and lines with NUL bytes (binary
//! garbage) are skipped and counted; nothing panics on input.

use gpuwatch_proto::{Action, FaultEvent, ShortName, Source};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use xid_parser::{Policy, RecordMeta, Scanner, parse_line};

/// Longest line considered; longer lines are skipped (counted).
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Output format of `gpuwatch scan`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScanFormat {
    /// One FaultEvent JSON object per line.
    #[default]
    Json,
    /// Human-readable table and per-GPU summary.
    Text,
}

/// Arguments of `gpuwatch scan`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ScanArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = ScanFormat::Json)]
    pub format: ScanFormat,
    /// Log files to scan (`-` or none: stdin).
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// Errors of `gpuwatch scan`.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// An input file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file (`-` for stdin).
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Writing the output failed (closed pipe, full disk).
    #[error("cannot write scan output: {0}")]
    Write(#[source] std::io::Error),
    /// An event could not be serialised.
    #[error("cannot serialise event: {0}")]
    Json(#[source] serde_json::Error),
}

/// Per-GPU (PCI address) result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSummary {
    /// Most severe action among this GPU's events.
    pub action: Action,
    /// Reason of the most severe event (e.g. `XID79`).
    pub reason: String,
    /// Number of events.
    pub events: u64,
}

/// What a scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanSummary {
    /// Lines read.
    pub lines: u64,
    /// Events emitted.
    pub events: u64,
    /// Lines skipped because they were longer than [`MAX_LINE_BYTES`].
    pub skipped_long_lines: u64,
    /// Lines skipped because they contained NUL bytes (binary data).
    pub skipped_binary_lines: u64,
    /// Lines skipped because they came from user space (non-kernel facility / tag).
    pub skipped_non_kernel_lines: u64,
    /// Per PCI address (empty string: node-level, e.g. machine checks).
    pub gpus: BTreeMap<String, GpuSummary>,
}

impl ScanSummary {
    /// Most severe action found (`Unspecified` when no events).
    pub fn worst_action(&self) -> Action {
        self.gpus
            .values()
            .map(|g| g.action)
            .max_by_key(|a| a.rank())
            .unwrap_or(Action::Unspecified)
    }

    /// Process exit code: 2 when a fault needs `reset_gpu` or more, else 0.
    pub fn exit_code(&self) -> i32 {
        if self.worst_action().rank() >= Action::ResetGpu.rank() {
            2
        } else {
            0
        }
    }

    fn record(&mut self, ev: &FaultEvent) {
        self.events += 1;
        let action = ev.action();
        let g = self
            .gpus
            .entry(ev.pci_address.clone())
            .or_insert_with(|| GpuSummary {
                action: Action::Unspecified,
                reason: String::new(),
                events: 0,
            });
        g.events += 1;
        if action.rank() > g.action.rank() {
            g.action = action;
            g.reason = reason_of(ev);
        }
    }
}

fn reason_of(ev: &FaultEvent) -> String {
    match ev.kind() {
        gpuwatch_proto::FaultKind::Xid => format!("XID{}", ev.code),
        gpuwatch_proto::FaultKind::Sxid => format!("SXID{}", ev.code),
        k => k.short_name().to_owned(),
    }
}

/// What an operator should do about an action.
pub fn advice(action: Action) -> &'static str {
    match action {
        Action::Unspecified | Action::Ignore => "Nothing to do.",
        Action::RestartApp => "Restart the failing application; the GPU is fine.",
        Action::Investigate => "Investigate the logs; no isolation needed yet.",
        Action::ResetGpu => "Drain the GPU's workloads and reset the GPU, then re-validate.",
        Action::RebootNode => "Drain the node and reboot it, then re-validate.",
        Action::InspectHardware => {
            "Drain the node and inspect the hardware (replace / RMA the GPU if it recurs)."
        }
    }
}

/// Reads lines of at most [`MAX_LINE_BYTES`]; longer ones are skipped without being
/// buffered whole. Returns `Ok(None)` at end of input, `Ok(Some(None))` for a
/// skipped line.
fn next_line<R: BufRead>(r: &mut R, buf: &mut Vec<u8>) -> std::io::Result<Option<Option<()>>> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            return Ok(if any {
                Some(if too_long { None } else { Some(()) })
            } else {
                None
            });
        }
        any = true;
        let (part, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..=i], true),
            None => (chunk, false),
        };
        if !too_long {
            if buf.len() + part.len() > MAX_LINE_BYTES + 2 {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(part);
            }
        }
        let n = part.len();
        r.consume(n);
        if done {
            return Ok(Some(if too_long { None } else { Some(()) }));
        }
    }
}

struct Out<'a> {
    out: &'a mut dyn Write,
    format: ScanFormat,
    rows: Vec<FaultEvent>,
}

impl Out<'_> {
    fn event(&mut self, mut ev: FaultEvent, summary: &mut ScanSummary) -> Result<(), ScanError> {
        ev.set_source(Source::LogFile);
        summary.record(&ev);
        match self.format {
            ScanFormat::Json => {
                let line = serde_json::to_string(&ev).map_err(ScanError::Json)?;
                writeln!(self.out, "{line}").map_err(ScanError::Write)
            }
            ScanFormat::Text => {
                self.rows.push(ev);
                Ok(())
            }
        }
    }
}

fn scan_reader(
    name: &str,
    reader: &mut dyn Read,
    policy: &Arc<Policy>,
    out: &mut Out<'_>,
    summary: &mut ScanSummary,
) -> Result<(), ScanError> {
    let mut r = BufReader::with_capacity(256 * 1024, reader);
    let mut scanner = Scanner::new(Arc::clone(policy));
    let mut buf = Vec::with_capacity(1024);
    let mut events = Vec::new();
    let read_err = |source| ScanError::Read {
        path: name.to_owned(),
        source,
    };
    while let Some(line) = next_line(&mut r, &mut buf).map_err(read_err)? {
        summary.lines += 1;
        if line.is_none() {
            summary.skipped_long_lines += 1;
            continue;
        }
        if buf.contains(&0) {
            summary.skipped_binary_lines += 1;
            continue;
        }
        let l = parse_line(&buf);
        if l.facility.is_some_and(|f| f != 0) {
            summary.skipped_non_kernel_lines += 1;
            continue;
        }
        let meta = RecordMeta {
            seq: l.seq,
            monotonic_usec: l.monotonic_usec,
            time_unix_nano: l.time_unix_nano,
            facility: l.facility,
            level: l.level,
        };
        scanner.push(meta, &l.message, &mut events);
        for ev in events.drain(..) {
            out.event(ev, summary)?;
        }
    }
    scanner.finish(&mut events);
    for ev in events.drain(..) {
        out.event(ev, summary)?;
    }
    Ok(())
}

/// Runs `gpuwatch scan`: reads every file (or stdin), writes events to `out`, and
/// returns what was found (see [`ScanSummary::exit_code`]).
pub fn run(
    args: &ScanArgs,
    policy: Arc<Policy>,
    out: &mut dyn Write,
) -> Result<ScanSummary, ScanError> {
    let mut summary = ScanSummary::default();
    let mut o = Out {
        out,
        format: args.format,
        rows: Vec::new(),
    };
    let stdin_only = args.files.is_empty();
    let files: Vec<PathBuf> = if stdin_only {
        vec![PathBuf::from("-")]
    } else {
        args.files.clone()
    };
    for path in &files {
        let name = path.display().to_string();
        if name == "-" {
            let stdin = std::io::stdin();
            let mut lock = stdin.lock();
            scan_reader(&name, &mut lock, &policy, &mut o, &mut summary)?;
        } else {
            let mut f = std::fs::File::open(path).map_err(|source| ScanError::Read {
                path: name.clone(),
                source,
            })?;
            scan_reader(&name, &mut f, &policy, &mut o, &mut summary)?;
        }
    }
    if summary.skipped_long_lines + summary.skipped_binary_lines > 0 {
        tracing::warn!(
            long_lines = summary.skipped_long_lines,
            binary_lines = summary.skipped_binary_lines,
            "Skipped unreadable lines."
        );
    }
    if args.format == ScanFormat::Text {
        let rows = std::mem::take(&mut o.rows);
        write_text(o.out, &rows, &summary).map_err(ScanError::Write)?;
    }
    o.out.flush().map_err(ScanError::Write)?;
    Ok(summary)
}

/// Scans an in-memory log (tests, `gpuwatch scan` on buffers).
pub fn scan_bytes(
    input: &[u8],
    format: ScanFormat,
    policy: Arc<Policy>,
    out: &mut dyn Write,
) -> Result<ScanSummary, ScanError> {
    let mut summary = ScanSummary::default();
    let mut o = Out {
        out,
        format,
        rows: Vec::new(),
    };
    let mut reader = input;
    scan_reader("<memory>", &mut reader, &policy, &mut o, &mut summary)?;
    if format == ScanFormat::Text {
        let rows = std::mem::take(&mut o.rows);
        write_text(o.out, &rows, &summary).map_err(ScanError::Write)?;
    }
    Ok(summary)
}

fn truncate(s: &str, max: usize) -> String {
    let first = s.lines().next().unwrap_or("");
    if first.chars().count() <= max {
        first.to_owned()
    } else {
        let t: String = first.chars().take(max.saturating_sub(1)).collect();
        format!("{t}…")
    }
}

fn write_text(out: &mut dyn Write, rows: &[FaultEvent], s: &ScanSummary) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<14} {:<13} {:<16} {:>6} {:<17} MESSAGE",
        "TIME", "PCI", "KIND", "CODE", "ACTION"
    )?;
    for ev in rows {
        let time = match (ev.monotonic_usec, ev.time_unix_nano) {
            (Some(us), _) => format!("{}.{:06}", us / 1_000_000, us % 1_000_000),
            (None, Some(ns)) => format!("@{}", ns / 1_000_000_000),
            (None, None) => "-".to_owned(),
        };
        let pci = if ev.pci_address.is_empty() {
            "-"
        } else {
            &ev.pci_address
        };
        let code = if ev.code == 0 {
            "-".to_owned()
        } else {
            ev.code.to_string()
        };
        writeln!(
            out,
            "{:<14} {:<13} {:<16} {:>6} {:<17} {}",
            time,
            pci,
            ev.kind().short_name(),
            code,
            ev.action().short_name(),
            truncate(&ev.message, 100)
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{} lines, {} events ({} long, {} binary, {} non-kernel lines skipped)",
        s.lines, s.events, s.skipped_long_lines, s.skipped_binary_lines, s.skipped_non_kernel_lines
    )?;
    if s.gpus.is_empty() {
        writeln!(out, "No GPU faults found.")?;
    }
    for (pci, g) in &s.gpus {
        let who = if pci.is_empty() { "node" } else { pci.as_str() };
        writeln!(
            out,
            "{who}: {} ({}, {} events). {}",
            g.action.short_name(),
            g.reason,
            g.events,
            advice(g.action)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_and_binary_are_skipped_and_counted() {
        let mut input = Vec::new();
        input.extend_from_slice(
            b"[  1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n",
        );
        input.extend(std::iter::repeat_n(b'a', MAX_LINE_BYTES + 10));
        input.extend_from_slice(b"\nbinary\0garbage NVRM: Xid (PCI:0000:3b:00): 79, x\n");
        input.extend_from_slice(b"[  2.0] NVRM: Xid (PCI:0000:3c:00): 13, Graphics Exception");
        let mut out = Vec::new();
        let s = scan_bytes(
            &input,
            ScanFormat::Json,
            Arc::new(Policy::default()),
            &mut out,
        )
        .unwrap();
        assert_eq!(s.lines, 4);
        assert_eq!(s.skipped_long_lines, 1);
        assert_eq!(s.skipped_binary_lines, 1);
        assert_eq!(s.events, 2);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.contains(r#""source":"log_file""#));
    }
}
