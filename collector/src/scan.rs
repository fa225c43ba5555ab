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
//! counted and skipped. Lines longer than 64 KiB are skipped and counted. NUL bytes
//! (a crashed machine's syslog is padded with them up to the next boot's first line)
//! end the text before them: the pieces between NUL runs are read as lines, and the
//! lines that had NULs are counted. Nothing panics on input.
//!
//! Speed: input is read in 1 MiB blocks and split 16 bytes at a time; a line without any
//! fault marker ([`Scanner::interesting_line`], checked on the raw bytes) is counted
//! and skipped without being decoded, unless an event is held waiting for
//! follow-up lines (then every line goes through the full path, as an unrelated
//! kernel line ends the held event and a user-space line does not). Output goes
//! through a buffered writer.

use gpuwatch_proto::{Action, FaultEvent, ShortName, Source};
use std::collections::BTreeMap;
use std::io::{Read, Write};
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

impl ScanError {
    /// True when the output's reader went away (`gpuwatch scan ... | head`): a
    /// normal end of the output, not a failure.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, ScanError::Write(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
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
    /// Lines that contained NUL bytes; the text between NUL runs was read as lines.
    pub lines_with_nul: u64,
    /// Lines with a fault marker (see [`Scanner::interesting_line`]) skipped because
    /// they came from user space (non-kernel facility / syslog tag), e.g. a program
    /// printing `NVRM: Xid ...`. Lines without a marker cannot hold a fault and are
    /// not decoded, so they are not counted here whatever their source.
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
        // Look up before inserting: the key is cloned once per GPU, not per event.
        if !self.gpus.contains_key(&ev.pci_address) {
            self.gpus.insert(
                ev.pci_address.clone(),
                GpuSummary {
                    action: Action::Unspecified,
                    reason: String::new(),
                    events: 0,
                },
            );
        }
        let Some(g) = self.gpus.get_mut(&ev.pci_address) else {
            return;
        };
        g.events += 1;
        if action.rank() > g.action.rank() {
            g.action = action;
            // The same reason conditions, Events and the engine show.
            g.reason = ev.short_reason();
        }
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

/// Size of the blocks input is read in.
const BLOCK_BYTES: usize = 1 << 20;
/// Capacity of the output buffer.
const OUT_BUFFER_BYTES: usize = 64 * 1024;

struct Out<'a> {
    out: &'a mut dyn Write,
    format: ScanFormat,
    rows: Vec<FaultEvent>,
    /// One JSON line being written.
    line: Vec<u8>,
}

impl Out<'_> {
    fn event(&mut self, mut ev: FaultEvent, summary: &mut ScanSummary) -> Result<(), ScanError> {
        ev.set_source(Source::LogFile);
        summary.record(&ev);
        match self.format {
            ScanFormat::Json => {
                // Serialised into a reused buffer first, so a failed write (closed
                // pipe) is reported as such, not as a serialisation error.
                self.line.clear();
                serde_json::to_writer(&mut self.line, &ev).map_err(ScanError::Json)?;
                self.line.push(b'\n');
                self.out.write_all(&self.line).map_err(ScanError::Write)
            }
            ScanFormat::Text => {
                self.rows.push(ev);
                Ok(())
            }
        }
    }
}

/// One input's scan state: the scanner and its event buffer.
struct LineScan {
    scanner: Scanner,
    events: Vec<FaultEvent>,
}

impl LineScan {
    /// One complete line (`\n` included when present).
    fn line(
        &mut self,
        line: &[u8],
        out: &mut Out<'_>,
        summary: &mut ScanSummary,
    ) -> Result<(), ScanError> {
        summary.lines += 1;
        if line.len() > MAX_LINE_BYTES + 2 {
            summary.skipped_long_lines += 1;
            return Ok(());
        }
        if memchr_nul(line) {
            summary.lines_with_nul += 1;
            for piece in line.split(|&b| b == 0) {
                if !piece.trim_ascii().is_empty() {
                    self.piece(piece, out, summary)?;
                }
            }
            return Ok(());
        }
        self.piece(line, out, summary)
    }

    /// One line's text without NUL bytes.
    fn piece(
        &mut self,
        line: &[u8],
        out: &mut Out<'_>,
        summary: &mut ScanSummary,
    ) -> Result<(), ScanError> {
        // A line without a fault marker can neither start nor continue an event; it
        // only matters while an event is held (see the module docs).
        let marked = Scanner::interesting_line(line);
        if !marked && !self.scanner.has_pending() {
            return Ok(());
        }
        let l = parse_line(line);
        if l.facility.is_some_and(|f| f != 0) {
            // Counted only with a marker: unmarked lines are usually not decoded.
            summary.skipped_non_kernel_lines += u64::from(marked);
            return Ok(());
        }
        let meta = RecordMeta {
            seq: l.seq,
            monotonic_usec: l.monotonic_usec,
            time_unix_nano: l.time_unix_nano,
            facility: l.facility,
            level: l.level,
        };
        self.scanner.push(meta, &l.message, &mut self.events);
        self.drain(out, summary)
    }

    fn drain(&mut self, out: &mut Out<'_>, summary: &mut ScanSummary) -> Result<(), ScanError> {
        for ev in self.events.drain(..) {
            out.event(ev, summary)?;
        }
        Ok(())
    }
}

/// True when `line` has a NUL byte (16 bytes at a time, as [`find_newline`]).
fn memchr_nul(line: &[u8]) -> bool {
    const W: usize = 16;
    let mut chunks = line.chunks_exact(W);
    for c in &mut chunks {
        let mut any = 0u8;
        for &b in c {
            any |= u8::from(b == 0);
        }
        if any != 0 {
            return true;
        }
    }
    chunks.remainder().contains(&0)
}

/// Position of the first `\n` in `hay`. Tests 16 bytes at a time with plain byte
/// compares over a fixed-size array, which the compiler turns into vector
/// compares (this crate has no `memchr` dependency and forbids `unsafe`).
fn find_newline(hay: &[u8]) -> Option<usize> {
    const W: usize = 16;
    let mut i = 0;
    while let Some(c) = hay[i..].first_chunk::<W>() {
        let mut m = [0u8; W];
        for k in 0..W {
            m[k] = u8::from(c[k] == b'\n');
        }
        let hits = u128::from_le_bytes(m);
        if hits != 0 {
            return Some(i + hits.trailing_zeros() as usize / 8);
        }
        i += W;
    }
    hay[i..].iter().position(|&b| b == b'\n').map(|p| i + p)
}

fn scan_reader(
    name: &str,
    reader: &mut dyn Read,
    policy: &Arc<Policy>,
    out: &mut Out<'_>,
    summary: &mut ScanSummary,
) -> Result<(), ScanError> {
    let mut scan = LineScan {
        scanner: Scanner::new(Arc::clone(policy)),
        events: Vec::new(),
    };
    let read_err = |source| ScanError::Read {
        path: name.to_owned(),
        source,
    };
    let mut buf = vec![0u8; BLOCK_BYTES];
    // `buf[start..filled]` is unprocessed input beginning at a line start, with no
    // `\n` in `buf[start..scanned]` (a long line is searched once, not per read).
    let (mut start, mut scanned, mut filled) = (0, 0, 0);
    // Inside a line longer than `MAX_LINE_BYTES` whose start was dropped.
    let mut in_long_line = false;
    loop {
        // Room to read: move the partial line to the front once little is left.
        if buf.len() - filled < BLOCK_BYTES / 4 {
            buf.copy_within(start..filled, 0);
            filled -= start;
            scanned -= start;
            start = 0;
        }
        let n = match reader.read(&mut buf[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_err(e)),
        };
        filled += n;
        let eof = n == 0;
        while let Some(off) = find_newline(&buf[scanned..filled]) {
            let end = scanned + off + 1;
            if in_long_line {
                in_long_line = false;
                summary.lines += 1;
                summary.skipped_long_lines += 1;
            } else {
                scan.line(&buf[start..end], out, summary)?;
            }
            start = end;
            scanned = end;
        }
        scanned = filled;
        if eof {
            if in_long_line {
                summary.lines += 1;
                summary.skipped_long_lines += 1;
            } else if start < filled {
                scan.line(&buf[start..filled], out, summary)?;
            }
            break;
        }
        if filled - start > MAX_LINE_BYTES + 2 {
            // Too long already: drop what is buffered, skip to its end.
            in_long_line = true;
            start = filled;
        }
        if start == filled {
            (start, scanned, filled) = (0, 0, 0);
        }
    }
    scan.scanner.finish(&mut scan.events);
    scan.drain(out, summary)
}

/// Runs `gpuwatch scan`: reads every file (or stdin), writes events to `out`, and
/// returns what was found (see [`ScanSummary::exit_code`]).
pub fn run(
    args: &ScanArgs,
    policy: Arc<Policy>,
    out: &mut dyn Write,
) -> Result<ScanSummary, ScanError> {
    let mut summary = ScanSummary::default();
    let mut buffered = std::io::BufWriter::with_capacity(OUT_BUFFER_BYTES, out);
    let mut o = Out {
        out: &mut buffered,
        format: args.format,
        rows: Vec::new(),
        line: Vec::new(),
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
    if summary.skipped_long_lines > 0 {
        tracing::warn!(
            long_lines = summary.skipped_long_lines,
            "Skipped lines longer than the limit."
        );
    }
    if summary.lines_with_nul > 0 {
        tracing::info!(
            lines = summary.lines_with_nul,
            "Read lines around NUL bytes (padding of a log written during a crash)."
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
    let mut buffered = std::io::BufWriter::with_capacity(OUT_BUFFER_BYTES, out);
    let mut o = Out {
        out: &mut buffered,
        format,
        rows: Vec::new(),
        line: Vec::new(),
    };
    let mut reader = input;
    scan_reader("<memory>", &mut reader, &policy, &mut o, &mut summary)?;
    if format == ScanFormat::Text {
        let rows = std::mem::take(&mut o.rows);
        write_text(o.out, &rows, &summary).map_err(ScanError::Write)?;
    }
    o.out.flush().map_err(ScanError::Write)?;
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
        "{} lines, {} events ({} long, {} non-kernel lines skipped; {} lines with NUL bytes read around them)",
        s.lines, s.events, s.skipped_long_lines, s.skipped_non_kernel_lines, s.lines_with_nul
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

    /// The plain definition the fast reader must agree with: every line split on
    /// `\n`, decoded and pushed (no prefilter, no blocks).
    fn reference(input: &[u8], policy: &Arc<Policy>) -> (Vec<String>, ScanSummary) {
        let mut summary = ScanSummary::default();
        let mut scanner = Scanner::new(Arc::clone(policy));
        let mut events = Vec::new();
        let mut lines: Vec<&[u8]> = input.split_inclusive(|&b| b == b'\n').collect();
        if lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        for line in lines {
            summary.lines += 1;
            if line.len() > MAX_LINE_BYTES + 2 {
                summary.skipped_long_lines += 1;
                continue;
            }
            let pieces: Vec<&[u8]> = if line.contains(&0) {
                summary.lines_with_nul += 1;
                line.split(|&b| b == 0)
                    .filter(|p| !p.trim_ascii().is_empty())
                    .collect()
            } else {
                vec![line]
            };
            for line in pieces {
                let l = parse_line(line);
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
            }
        }
        scanner.finish(&mut events);
        let json = events
            .into_iter()
            .map(|mut ev| {
                ev.set_source(Source::LogFile);
                summary.record(&ev);
                serde_json::to_string(&ev).unwrap()
            })
            .collect();
        (json, summary)
    }

    /// Hands out at most `step` bytes per read, so lines straddle every refill.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn fast_reader_agrees_with_the_plain_definition() {
        let policy = Arc::new(Policy::default());
        let mut input = Vec::new();
        for i in 0..40u32 {
            let t = 100 + i;
            input.extend_from_slice(
                format!(
                    "[{t}.000001] usb 1-1: new high-speed USB device number {i}\n\
                     [{t}.000002] pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0\n\
                     Mar  3 12:00:{:02} node sshd[12]: Accepted publickey for root\n\
                     [{t}.000003] nvidia 0000:01:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)\n\
                     Mar  3 12:00:{:02} node python[7]: NVRM: Xid (PCI:0000:3b:00): 79, fake\n\
                     [{t}.000004] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=python, Graphics Exception\n\
                     [{t}.000005] NVRM: Xid (PCI:0000:3b:00): 119, pid=1, Timeout waiting for RPC from GSP\n\
                     [{t}.000006] NVRM: GPU0 RPC history (CPU -> GSP):\n\
                     [{t}.000007] random: crng init done\n\
                     bin\0ary NVRM: Xid (PCI:0000:3b:00): 13, x\n\
                     \n",
                    i % 60,
                    i % 60
                )
                .as_bytes(),
            );
            if i % 13 == 0 {
                input.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 3 + i as usize));
                input.push(b'\n');
            }
        }
        input.extend_from_slice(b"[999.0] NVRM: Xid (PCI:0000:3c:00): 48, DBE (0x1)");
        let (want, want_summary) = reference(&input, &policy);
        assert!(want.len() > 100, "{}", want.len());
        for step in [usize::MAX, 7, 4096, MAX_LINE_BYTES + 1, BLOCK_BYTES / 3] {
            let mut out = Vec::new();
            let mut o = Out {
                out: &mut out,
                format: ScanFormat::Json,
                rows: Vec::new(),
                line: Vec::new(),
            };
            let mut summary = ScanSummary::default();
            let mut reader = Trickle { data: &input, step };
            scan_reader("<test>", &mut reader, &policy, &mut o, &mut summary).unwrap();
            let got: Vec<String> = String::from_utf8(out)
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect();
            assert_eq!(got, want, "step {step}");
            let ScanSummary {
                lines,
                events,
                skipped_long_lines,
                lines_with_nul,
                skipped_non_kernel_lines,
                gpus,
            } = &summary;
            assert_eq!(
                (*lines, *events, *skipped_long_lines, *lines_with_nul),
                (
                    want_summary.lines,
                    want_summary.events,
                    want_summary.skipped_long_lines,
                    want_summary.lines_with_nul
                ),
                "step {step}"
            );
            assert_eq!(*gpus, want_summary.gpus, "step {step}");
            // Only user-space lines with a marker are counted.
            assert_eq!(*skipped_non_kernel_lines, 40, "step {step}");
            assert_eq!(want_summary.skipped_non_kernel_lines, 80);
        }
    }

    #[test]
    fn newline_search_matches_position() {
        let mut hay = vec![b'a'; 100];
        assert_eq!(find_newline(&hay), None);
        for at in [0, 1, 15, 16, 17, 31, 32, 63, 99] {
            hay.fill(b'a');
            hay[at] = b'\n';
            if at + 5 < hay.len() {
                hay[at + 5] = b'\n';
            }
            assert_eq!(find_newline(&hay), Some(at), "{at}");
            assert_eq!(find_newline(&hay[..at]), None, "{at}");
        }
    }

    #[test]
    fn long_lines_are_skipped_and_nul_padding_is_read_around() {
        let mut input = Vec::new();
        input.extend_from_slice(
            b"[  1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n",
        );
        input.extend(std::iter::repeat_n(b'a', MAX_LINE_BYTES + 10));
        input.extend_from_slice(b"\ngarbage\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0[ 5.0] NVRM: Xid (PCI:0000:3d:00): 79, x\n");
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
        assert_eq!(s.lines_with_nul, 1);
        assert_eq!(s.events, 3);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.contains(r#""pci_address":"0000:3d:00.0""#), "{text}");
        assert!(text.contains(r#""source":"log_file""#));
    }
}
