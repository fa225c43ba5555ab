//! `gpuwatch scan [--format auto|json|text] [FILE...]`: offline analysis of saved
//! kernel logs (`dmesg` in any of its time formats and with `-x` facility/level
//! prefixes, `journalctl -k`, syslog, raw `/dev/kmsg` dumps, mixed; `.gz` files
//! and `nvidia-bug-report.log.gz` read directly). Reads stdin when no file (or
//! `-`) is given.
//!
//! - `--format auto` (default): `text` when stdout is a terminal, else `json`.
//! - `--format json`: one `FaultEvent` JSON object per line, in input order,
//!   `source = "log_file"`.
//! - `--format text`: a table of the events as they are found (memory stays flat
//!   however many there are), then one summary line per GPU (PCI address), most
//!   severe first, with the action and what to do about it. The TIME column is the
//!   line's own wall-clock time when it has one (as printed, read as UTC), else
//!   seconds since boot. Syslog dates carry no year (`Nov 30 12:34:56`): it is
//!   inferred as syslog readers do, the current year, or the previous one when that
//!   date would be in the future (more than a day ahead, for the writer's time
//!   zone). JSON output keeps `time_unix_nano` for dates with a year only.
//!
//! Exit codes (the caller maps [`ScanSummary::exit_code`]): **0** nothing needs
//! action, **2** at least one fault with action `reset_gpu` or more severe, **1**
//! an error (unreadable file, output closed).
//!
//! Reading (line formats, gzip, bug reports, which lines count, NUL bytes, long
//! lines, the whole-buffer marker search) is [`xid_parser::saved_log`]. JSON is
//! written by hand (serde_json's exact output) into a reused buffer handed to
//! stdout in 64 KiB writes. `benches/scripts/rg-compare.sh` times this against `rg -c` on
//! the same markers, and an XID storm against `wc -l` / `rg -c Xid`.

use gpuwatch_proto::{Action, FaultEventRef, ShortName, Source};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use xid_parser::Policy;
use xid_parser::saved_log::{BLOCK_BYTES, LogCounts, LogOptions, ReadError, open_log, read_events};

/// Output format of `gpuwatch scan`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScanFormat {
    /// `text` when stdout is a terminal, `json` otherwise.
    #[default]
    Auto,
    /// One FaultEvent JSON object per line.
    Json,
    /// Human-readable table and per-GPU summary.
    Text,
}

impl ScanFormat {
    /// The concrete format: `Auto` becomes `Text` on a terminal, else `Json`.
    pub fn resolve(self, stdout_is_terminal: bool) -> ScanFormat {
        match self {
            ScanFormat::Auto if stdout_is_terminal => ScanFormat::Text,
            ScanFormat::Auto => ScanFormat::Json,
            f => f,
        }
    }
}

/// Arguments of `gpuwatch scan`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ScanArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = ScanFormat::Auto)]
    pub format: ScanFormat,
    /// Also read user-facility lines (a program writing to the kernel log, syslog
    /// lines of other programs); by default they are skipped and counted, as the
    /// agent skips them.
    #[arg(long)]
    pub accept_user_facility: bool,
    /// Log files to scan (`-` or none: stdin); `.gz` files are decompressed.
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
    /// Fault events found for this GPU.
    pub events: u64,
}

/// What a scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanSummary {
    /// Input lines read, over every file.
    pub lines: u64,
    /// Fault events written to the output.
    pub events: u64,
    /// Lines skipped because they were longer than [`MAX_LINE_BYTES`](xid_parser::saved_log::MAX_LINE_BYTES).
    pub skipped_long_lines: u64,
    /// Lines with a fault marker that contained NUL bytes; the text between NUL
    /// runs was read as lines.
    pub lines_with_nul: u64,
    /// Lines with a fault marker (see [`xid_parser::Scanner::interesting_line`]) skipped because
    /// they came from user space (non-kernel facility / syslog tag), e.g. a program
    /// printing `NVRM: Xid ...`. Lines without a marker cannot hold a fault and are
    /// not decoded, so they are not counted here whatever their source. Zero with
    /// `--accept-user-facility`.
    pub skipped_non_kernel_lines: u64,
    /// Per PCI address (empty string: node-level, e.g. machine checks).
    pub gpus: BTreeMap<String, GpuSummary>,
    /// NIC events (`nic` kind: mlx5 link, cable-module, health, firmware
    /// command timeout and slot power lines, transmit watchdog lines) per the
    /// NIC's PCI address, or per interface name (`netdev`) for a line that
    /// prints no address (the older watchdog line): network faults, never a
    /// GPU's, and not in the exit code.
    pub nics: BTreeMap<String, GpuSummary>,
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

    fn record(&mut self, ev: &FaultEventRef<'_>) {
        self.events += 1;
        let action = ev.action();
        let nic = ev.kind() == gpuwatch_proto::FaultKind::Nic;
        let by_address = if nic { &mut self.nics } else { &mut self.gpus };
        // A NIC line without an address is grouped by the interface it names.
        let key = match ev.attr("netdev") {
            Some(netdev) if nic && ev.pci_address.is_empty() && !netdev.is_empty() => netdev,
            _ => ev.pci_address,
        };
        // Looked up before inserting: the key is copied once per GPU, not per event.
        let g = match by_address.get_mut(key) {
            Some(g) => g,
            None => by_address.entry(key.to_owned()).or_insert(GpuSummary {
                action: Action::Unspecified,
                reason: String::new(),
                events: 0,
            }),
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
pub(crate) fn advice(action: Action) -> &'static str {
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

/// Capacity of the output buffer.
const OUT_BUFFER_BYTES: usize = 64 * 1024;

struct Out<'a> {
    out: &'a mut dyn Write,
    /// `Json` or `Text` (resolved).
    format: ScanFormat,
    /// Output lines not yet written: events are formatted straight into it and it
    /// is handed to `out` in large writes (which pass a `BufWriter` without a copy).
    pending: Vec<u8>,
    /// Text mode: the table header is written.
    header_done: bool,
}

impl<'a> Out<'a> {
    fn new(out: &'a mut dyn Write, format: ScanFormat) -> Out<'a> {
        Out {
            out,
            format,
            pending: Vec::with_capacity(OUT_BUFFER_BYTES + 16 * 1024),
            header_done: false,
        }
    }

    fn event(
        &mut self,
        ev: &FaultEventRef<'_>,
        summary: &mut ScanSummary,
    ) -> Result<(), ScanError> {
        let ev = &FaultEventRef {
            source: Source::LogFile as i32,
            ..*ev
        };
        summary.record(ev);
        match self.format {
            ScanFormat::Json | ScanFormat::Auto => {
                // serde_json's exact output, written by hand.
                gpuwatch_proto::json::write_fault_event_ref(ev, &mut self.pending);
                self.pending.push(b'\n');
            }
            ScanFormat::Text => {
                if !self.header_done {
                    self.header_done = true;
                    write_header(&mut self.pending).map_err(ScanError::Write)?;
                }
                // Each row is written as it is found: nothing accumulates.
                write_row(&mut self.pending, ev).map_err(ScanError::Write)?;
            }
        }
        if self.pending.len() >= OUT_BUFFER_BYTES {
            self.write_pending()?;
        }
        Ok(())
    }

    fn write_pending(&mut self) -> Result<(), ScanError> {
        let r = self.out.write_all(&self.pending);
        self.pending.clear();
        r.map_err(ScanError::Write)
    }

    /// Text mode: the table header (when no row wrote it) and the summary.
    fn finish(&mut self, summary: &ScanSummary) -> Result<(), ScanError> {
        if self.format == ScanFormat::Text {
            if !self.header_done {
                self.header_done = true;
                write_header(&mut self.pending).map_err(ScanError::Write)?;
            }
            write_summary(&mut self.pending, summary).map_err(ScanError::Write)?;
        }
        self.write_pending()?;
        self.out.flush().map_err(ScanError::Write)
    }
}

impl Drop for Out<'_> {
    /// A scan that stops on an error still writes the events found before it.
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let _ = self.out.write_all(&self.pending);
        }
    }
}

/// Opens one input: stdin for `-`, a file otherwise, read through
/// [`open_log`] (gzip, bug reports).
fn open_input(path: &std::path::Path) -> Result<Box<dyn Read>, ScanError> {
    let name = path.display().to_string();
    let err = |source| ScanError::Read {
        path: name.clone(),
        source,
    };
    let reader: Box<dyn Read> = if name == "-" {
        Box::new(std::io::BufReader::with_capacity(
            BLOCK_BYTES,
            std::io::stdin(),
        ))
    } else {
        let meta = std::fs::metadata(path).map_err(err)?;
        if meta.is_dir() {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a directory",
            )));
        }
        let f = std::fs::File::open(path).map_err(err)?;
        Box::new(std::io::BufReader::with_capacity(BLOCK_BYTES, f))
    };
    open_log(reader).map_err(err)
}

/// Reads one input's events into `out`, its line counts into `summary`.
fn scan_reader(
    name: &str,
    reader: &mut dyn Read,
    policy: &Arc<Policy>,
    accept_user: bool,
    out: &mut Out<'_>,
    summary: &mut ScanSummary,
) -> Result<(), ScanError> {
    let opts = LogOptions {
        accept_user_facility: accept_user,
        // Text output: the TIME column shows syslog dates without a year too.
        yearless_now: (out.format == ScanFormat::Text)
            .then(|| gpuwatch_core::clock::unix_nanos(std::time::SystemTime::now())),
    };
    let mut counts = LogCounts::default();
    let res = read_events(reader, policy, opts, &mut counts, |ev| {
        out.event(ev, summary)
    });
    summary.lines += counts.lines;
    summary.skipped_long_lines += counts.skipped_long_lines;
    summary.lines_with_nul += counts.lines_with_nul;
    summary.skipped_non_kernel_lines += counts.skipped_non_kernel_lines;
    res.map_err(|e| match e {
        ReadError::Read(source) => ScanError::Read {
            path: name.to_owned(),
            source,
        },
        ReadError::Sink(e) => e,
    })
}
/// Runs `gpuwatch scan`: reads every file (or stdin), writes events to `out`, and
/// returns what was found (see [`ScanSummary::exit_code`]). `--format auto` is
/// resolved against the process's stdout.
pub fn run(
    args: &ScanArgs,
    policy: Arc<Policy>,
    out: &mut dyn Write,
) -> Result<ScanSummary, ScanError> {
    use std::io::IsTerminal as _;
    let format = args.format.resolve(std::io::stdout().is_terminal());
    let mut summary = ScanSummary::default();
    let mut buffered = std::io::BufWriter::with_capacity(OUT_BUFFER_BYTES, out);
    let mut o = Out::new(&mut buffered, format);
    let stdin_only = args.files.is_empty();
    let files: Vec<PathBuf> = if stdin_only {
        vec![PathBuf::from("-")]
    } else {
        args.files.clone()
    };
    for path in &files {
        let name = path.display().to_string();
        let mut input = open_input(path)?;
        scan_reader(
            &name,
            &mut input,
            &policy,
            args.accept_user_facility,
            &mut o,
            &mut summary,
        )?;
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
    o.finish(&summary)?;
    Ok(summary)
}

/// Scans an in-memory log (tests, `gpuwatch scan` on buffers). `Auto` is JSON.
pub fn scan_bytes(
    input: &[u8],
    format: ScanFormat,
    policy: Arc<Policy>,
    out: &mut dyn Write,
) -> Result<ScanSummary, ScanError> {
    let mut summary = ScanSummary::default();
    let mut buffered = std::io::BufWriter::with_capacity(OUT_BUFFER_BYTES, out);
    let mut o = Out::new(&mut buffered, format.resolve(false));
    let mut reader = input;
    scan_reader(
        "<memory>",
        &mut reader,
        &policy,
        false,
        &mut o,
        &mut summary,
    )?;
    o.finish(&summary)?;
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

/// `YYYY-MM-DD HH:MM:SS` (UTC) of Unix nanoseconds (Howard Hinnant's
/// days-to-civil algorithm, proleptic Gregorian).
fn utc_time(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The TIME column: the line's own wall-clock time (UTC) when it had one, else
/// seconds since boot, else `-`. Never raw epoch seconds.
fn time_column(ev: &FaultEventRef<'_>) -> String {
    match (ev.time_unix_nano, ev.monotonic_usec) {
        (Some(ns), _) => utc_time(ns),
        (None, Some(us)) => format!("{}.{:06}", us / 1_000_000, us % 1_000_000),
        (None, None) => "-".to_owned(),
    }
}

fn write_header(out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<19} {:<13} {:<16} {:>6} {:<17} MESSAGE",
        "TIME", "PCI", "KIND", "CODE", "ACTION"
    )
}

fn write_row(out: &mut Vec<u8>, ev: &FaultEventRef<'_>) -> std::io::Result<()> {
    let pci = if ev.pci_address.is_empty() {
        "-"
    } else {
        ev.pci_address
    };
    let code = if ev.code == 0 {
        ev.attr("xid_as_printed").unwrap_or("-").to_owned()
    } else {
        ev.code.to_string()
    };
    writeln!(
        out,
        "{:<19} {:<13} {:<16} {:>6} {:<17} {}",
        time_column(ev),
        pci,
        ev.kind().short_name(),
        code,
        ev.action().short_name(),
        truncate(ev.message, 100)
    )
}

fn write_summary(out: &mut dyn Write, s: &ScanSummary) -> std::io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "{} lines, {} events ({} long, {} non-kernel lines skipped; {} lines with NUL bytes read around them)",
        s.lines, s.events, s.skipped_long_lines, s.skipped_non_kernel_lines, s.lines_with_nul
    )?;
    if s.skipped_non_kernel_lines > 0 {
        writeln!(
            out,
            "User-space lines with fault markers were skipped as the agent skips them; \
             --accept-user-facility includes them."
        )?;
    }
    if s.gpus.is_empty() {
        writeln!(out, "No GPU faults found.")?;
    }
    // Most severe first, then by address.
    let mut gpus: Vec<(&String, &GpuSummary)> = s.gpus.iter().collect();
    gpus.sort_by(|a, b| b.1.action.rank().cmp(&a.1.action.rank()).then(a.0.cmp(b.0)));
    for (pci, g) in gpus {
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
    for (pci_or_netdev, n) in &s.nics {
        let who = if pci_or_netdev.is_empty() {
            "unknown NIC"
        } else {
            pci_or_netdev.as_str()
        };
        writeln!(
            out,
            "NIC {who}: {} ({}, {} events). Network, not the GPUs: check the port's cable, \
             module and switch port (a live node shows it as NetworkProblem).",
            n.action.short_name(),
            n.reason,
            n.events,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use xid_parser::saved_log::{MAX_LINE_BYTES, read_events_plain};

    /// What `scan --format json` must write for `input`: the events of the plain
    /// reading (`read_events_plain`), each serialised by serde_json, and their
    /// summary. The reader itself is checked against that definition in xid-parser.
    fn reference(input: &[u8], policy: &Arc<Policy>) -> (Vec<String>, ScanSummary) {
        let (events, counts) = read_events_plain(input, policy, LogOptions::default());
        let mut summary = ScanSummary {
            lines: counts.lines,
            skipped_long_lines: counts.skipped_long_lines,
            lines_with_nul: counts.lines_with_nul,
            skipped_non_kernel_lines: counts.skipped_non_kernel_lines,
            ..ScanSummary::default()
        };
        let json = events
            .into_iter()
            .map(|mut ev| {
                ev.set_source(Source::LogFile);
                summary.record(&ev.view());
                serde_json::to_string(&ev).unwrap()
            })
            .collect();
        (json, summary)
    }

    /// Scan's own part (borrowed events to JSON lines, the summary) on every kind of
    /// event: its reading of the input is checked against the same plain definition,
    /// at every read size, in xid-parser.
    #[test]
    fn json_output_is_the_plain_reading_serialised() {
        let policy = Arc::new(Policy::default());
        let mut input = b"[1.000001] NVRM: GPU at PCI:0000:3b:00: GPU-6b1a2c3d-0000-1111-2222-333344445555
[1.000002] NVRM: Xid (PCI:0000:3b:00): 31, pid=7, name=python, Ch 00000008, MMU Fault
[2.000001] pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0
[2.000002] nvidia 0000:01:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)
Mar  3 12:00:01 node python[7]: NVRM: Xid (PCI:0000:3b:00): 79, fake
[3.000001] NVRM: Xid (PCI:0000:3b:00): 119, pid=1, Timeout waiting for RPC from GSP
[3.000002] NVRM: GPU0 RPC history (CPU -> GSP):
bin\0ary NVRM: Xid (PCI:0000:3b:00): 13, x
[4.0] NVRM: Xid (PCI:0000:3c:00): 48, DBE (0x1)
"
        .to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 3));
        input.extend_from_slice(b"\n[5.0] NVRM: Xid (PCI:0000:3d:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.");
        let (want, want_summary) = reference(&input, &policy);
        assert_eq!(want.len(), 6, "{want:#?}");
        let mut out = Vec::new();
        let mut o = Out::new(&mut out, ScanFormat::Json);
        let mut summary = ScanSummary::default();
        scan_reader(
            "<test>",
            &mut &input[..],
            &policy,
            false,
            &mut o,
            &mut summary,
        )
        .unwrap();
        o.finish(&summary).unwrap();
        drop(o);
        let got: Vec<String> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(got, want);
        assert_eq!(summary, want_summary);
        assert_eq!(
            (
                summary.skipped_non_kernel_lines,
                summary.skipped_long_lines,
                summary.lines_with_nul
            ),
            (1, 1, 1)
        );
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

    #[test]
    fn nic_lines_are_summarised_apart_from_the_gpus_and_keep_the_exit_code() {
        let input = b"[10.0] mlx5_core 0000:1a:00.0 ibp26s0: Link down
[11.0] mlx5_core 0000:1a:00.0 ibp26s0: Link up
[12.0] mlx5_core 0000:1a:00.0: Port module event[error]: module 0, Cable error, Bad or shorted cable/module
";
        let mut out = Vec::new();
        let s = scan_bytes(
            input,
            ScanFormat::Text,
            Arc::new(Policy::default()),
            &mut out,
        )
        .unwrap();
        assert_eq!(s.events, 3);
        assert!(s.gpus.is_empty(), "{:?}", s.gpus);
        let nic = &s.nics["0000:1a:00.0"];
        assert_eq!((nic.events, nic.action), (3, Action::Investigate));
        assert_eq!(s.exit_code(), 0);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("No GPU faults found."), "{text}");
        // The first of the most severe events names it.
        assert!(
            text.contains("NIC 0000:1a:00.0: investigate (NICLinkDown, 3 events)"),
            "{text}"
        );
    }
}
