//! Reading saved kernel logs (`dmesg` in any of its time formats and with `-x`
//! facility/level prefixes, `journalctl -k`, syslog, raw `/dev/kmsg` dumps, mixed;
//! gzip data and `nvidia-bug-report.log` through [`open_log`]) into classified
//! fault events, as `gpuwatch scan` does.
//!
//! Only kernel lines can raise faults: syslog lines of other programs (a user
//! process printing "NVRM: Xid ...") and user-facility kmsg/`dmesg -r`/`dmesg -x`
//! records are counted and skipped, as the agent skips them (unless
//! [`LogOptions::accept_user_facility`]). Lines longer than [`MAX_LINE_BYTES`] are
//! skipped and counted. NUL bytes (a crashed machine's syslog is padded with them up
//! to the next boot's first line) end the text before them: the pieces between NUL
//! runs are read as lines, and the lines that had NULs are counted. Nothing panics
//! on input.
//!
//! Speed: input is read in 1 MiB blocks, and each block is searched as a whole for
//! the fault markers ([`MarkerFinder`]: SIMD multi-literal search, as `grep` does);
//! the lines before a hit are only counted (newlines counted 64 bytes at a time,
//! long lines found from the first and last newline of each 32 KiB), and line
//! bounds are looked for only around hits. While an event is held waiting for
//! follow-up lines every line goes the full path instead, as an unrelated kernel
//! line ends the held event and a user-space line does not.

use crate::scanner::RecordMeta;
use crate::{MarkerFinder, Policy, Scanner, parse_line};
use gpuwatch_proto::{FaultEvent, FaultEventRef};
use std::io::Read;
use std::sync::Arc;

/// Longest line considered; longer lines are skipped (counted).
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Bytes asked of the input per read; a reader's buffer of this size hands its
/// data over without a copy.
pub const BLOCK_BYTES: usize = 1 << 20;

/// Which lines of a saved log count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Read lines of user-space programs too (skipped and counted otherwise).
    pub accept_user_facility: bool,
    /// The current time (Unix ns), to infer the year of syslog dates without one
    /// (`Nov 30 12:34:56`) for [`FaultEvent::time_unix_nano`]; `None` leaves those
    /// dates out.
    pub yearless_now: Option<u64>,
}

/// Line counts of a read (added to, so one value can sum several inputs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogCounts {
    /// Lines read.
    pub lines: u64,
    /// Lines skipped because they were longer than [`MAX_LINE_BYTES`].
    pub skipped_long_lines: u64,
    /// Lines with a fault marker that contained NUL bytes; the text between NUL
    /// runs was read as lines.
    pub lines_with_nul: u64,
    /// Lines with a fault marker (see [`Scanner::interesting_line`]) skipped because
    /// they came from user space (non-kernel facility / syslog tag). Lines without a
    /// marker cannot hold a fault and are not decoded, so they are not counted here
    /// whatever their source. Zero with [`LogOptions::accept_user_facility`].
    pub skipped_non_kernel_lines: u64,
}

/// Why [`read_events`] stopped early.
#[derive(Debug)]
pub enum ReadError<E> {
    /// The input could not be read.
    Read(std::io::Error),
    /// The event consumer failed (its error).
    Sink(E),
}

/// gzip's magic bytes (RFC 1952 2.3.1).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The kernel-log text of an input: gzip data (by its magic bytes, whatever the
/// file name) is decompressed on the fly, multi-member files included (as `gzip
/// -d` reads them); of an `nvidia-bug-report.log` (plain or gzip) only the
/// kernel-log sections are kept (`kern.log`, `messages`, `syslog`, `dmesg`,
/// `journalctl`: the rest of a report can look like log lines); anything else is
/// read as it is. Reads up to 4 KiB ahead to tell (however short the reads the
/// input gives).
pub fn open_log<'a>(mut input: Box<dyn Read + 'a>) -> std::io::Result<Box<dyn Read + 'a>> {
    let head = read_head(&mut input)?;
    let (head, text): (Vec<u8>, Box<dyn Read + 'a>) = if head.starts_with(&GZIP_MAGIC) {
        let mut text = flate2::read::MultiGzDecoder::new(std::io::Cursor::new(head).chain(input));
        (read_head(&mut text)?, Box::new(text))
    } else {
        (head, input)
    };
    if memchr::memmem::find(&head[..head.len().min(512)], BUG_REPORT_START).is_some() {
        Ok(Box::new(KernelLogSections {
            inner: text,
            pending: Vec::new(),
            pos: 0,
            buf: head,
            in_kernel_section: false,
            after_separator: false,
            eof: false,
        }))
    } else {
        // Not a report: the bytes read go first.
        Ok(Box::new(std::io::Cursor::new(head).chain(text)))
    }
}

/// The first 4 KiB of `r` (less at its end), read until there.
fn read_head(r: &mut dyn Read) -> std::io::Result<Vec<u8>> {
    let mut head = vec![0u8; 4096];
    let mut n = 0;
    while n < head.len() {
        match r.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    head.truncate(n);
    Ok(head)
}

/// One input's read state.
struct LineScan {
    scanner: Scanner,
    markers: &'static MarkerFinder,
    /// Lines of user-space programs are read too (see [`LogOptions`]).
    accept_user: bool,
    /// See [`LogOptions::yearless_now`].
    yearless_now: Option<u64>,
}

impl LineScan {
    /// One complete line (`\n` included when present); `hit`: a fault marker was
    /// found in it. Returns whether it holds one (`hit`, or found here).
    fn line<E, F: FnMut(&FaultEventRef<'_>) -> Result<(), E>>(
        &mut self,
        line: &[u8],
        hit: bool,
        out: &mut F,
        counts: &mut LogCounts,
    ) -> Result<bool, ReadError<E>> {
        counts.lines += 1;
        if line.len() > MAX_LINE_BYTES + 2 {
            counts.skipped_long_lines += 1;
            return Ok(false);
        }
        // Every line of an XID storm: read in one step (a kernel line, so whatever
        // the facility options).
        let mut failed = None;
        if self
            .scanner
            .push_kernel_xid_line(line, &mut |ev| sink(out, &mut failed, ev))
        {
            return failed.map_or(Ok(true), |e| Err(ReadError::Sink(e)));
        }
        // A line without a fault marker can neither start nor continue an event; it
        // only matters while an event is held (see the module docs). NUL bytes never
        // create a marker, so only lines that go on are searched for them.
        let marked = hit || Scanner::interesting_line(line);
        if !marked && !self.scanner.has_pending() {
            return Ok(false);
        }
        if memchr::memchr(0, line).is_some() {
            counts.lines_with_nul += u64::from(marked);
            for piece in line.split(|&b| b == 0) {
                if !piece.trim_ascii().is_empty() {
                    self.piece(piece, Scanner::interesting_line(piece), out, counts)?;
                }
            }
            return Ok(marked);
        }
        self.piece(line, marked, out, counts)?;
        Ok(marked)
    }

    /// One line's text without NUL bytes; `marked`: it passes
    /// [`Scanner::interesting_line`].
    fn piece<E, F: FnMut(&FaultEventRef<'_>) -> Result<(), E>>(
        &mut self,
        line: &[u8],
        marked: bool,
        out: &mut F,
        counts: &mut LogCounts,
    ) -> Result<(), ReadError<E>> {
        if !marked && !self.scanner.has_pending() {
            return Ok(());
        }
        let l = parse_line(line);
        if !self.accept_user && l.facility.is_some_and(|f| f != 0) {
            // Counted only with a marker: unmarked lines are usually not decoded.
            counts.skipped_non_kernel_lines += u64::from(marked);
            return Ok(());
        }
        let meta = meta_of(&l, self.yearless_now);
        let mut failed = None;
        self.scanner
            .push_view(meta, &l.message, &mut |ev| sink(out, &mut failed, ev));
        failed.map_or(Ok(()), |e| Err(ReadError::Sink(e)))
    }
}

/// Bytes counted per step by [`count_lines`]; at most [`MAX_LINE_BYTES`], so a
/// line between two newlines of one step is never too long.
const COUNT_STEP: usize = 32 * 1024;

/// Number of `\n` bytes in `hay`: byte compares summed into 64 lanes of `u8`
/// (emptied every 255 rounds), which the compiler turns into vector compares.
fn count_newlines(hay: &[u8]) -> usize {
    const W: usize = 64;
    let mut n = 0;
    let mut chunks = hay.chunks_exact(W);
    let mut acc = [0u8; W];
    let mut rounds = 0;
    for c in &mut chunks {
        let c: &[u8; W] = c.try_into().unwrap_or(&[0; W]);
        for k in 0..W {
            acc[k] = acc[k].wrapping_add(u8::from(c[k] == b'\n'));
        }
        rounds += 1;
        if rounds == 255 {
            n += acc.iter().map(|&a| usize::from(a)).sum::<usize>();
            (acc, rounds) = ([0; W], 0);
        }
    }
    n += acc.iter().map(|&a| usize::from(a)).sum::<usize>();
    n + chunks.remainder().iter().filter(|&&b| b == b'\n').count()
}

/// Counts the lines of `region`, complete lines without a fault marker that start at
/// its start and end with its last byte (a `\n`), and those longer than
/// [`MAX_LINE_BYTES`], without looking at each line: newlines are counted
/// [`COUNT_STEP`] bytes at a time, and only the first and last newline of each step
/// are located (a line longer than a step has no newline inside it).
fn count_lines(region: &[u8], counts: &mut LogCounts) {
    let mut line_start = 0;
    let mut at = 0;
    for step in region.chunks(COUNT_STEP) {
        let n = count_newlines(step);
        if n > 0 {
            counts.lines += n as u64;
            if let Some(first) = memchr::memchr(b'\n', step)
                && at + first + 1 - line_start > MAX_LINE_BYTES + 2
            {
                counts.skipped_long_lines += 1;
            }
            if let Some(last) = memchr::memrchr(b'\n', step) {
                line_start = at + last + 1;
            }
        }
        at += step.len();
    }
    debug_assert_eq!(line_start, region.len());
}

/// Where a block's processing stands: `buf[start..filled]` is unprocessed input
/// beginning at a line start; `buf[start..nl_from]` holds no `\n` and no marker starts
/// in `buf[start..hit_from]` (so a long line is searched once, not per read).
#[derive(Debug, Default)]
struct Cursor {
    start: usize,
    nl_from: usize,
    hit_from: usize,
    /// The last line held a fault marker: the next one is tested on its own
    /// ([`Scanner::interesting_line`]) instead of searched for. In a storm every line
    /// is a hit, and a search costs several times the test; the search resumes at the
    /// first line without a marker.
    dense: bool,
}

impl Cursor {
    fn shift(&mut self, by: usize) {
        self.start -= by;
        self.nl_from -= by;
        self.hit_from -= by;
    }

    fn set(&mut self, at: usize) {
        (self.start, self.nl_from, self.hit_from) = (at, at, at);
    }
}

impl LineScan {
    /// Processes every complete line of `buf[cur.start..filled]`: while nothing is
    /// held and the last line had no fault marker, the buffer is searched for the
    /// next one and the lines before the hit's line are only counted; the hit's line,
    /// the line after a line with a marker, and every line while an event is held go
    /// the full path ([`LineScan::line`]).
    fn lines<E, F: FnMut(&FaultEventRef<'_>) -> Result<(), E>>(
        &mut self,
        buf: &[u8],
        filled: usize,
        cur: &mut Cursor,
        out: &mut F,
        counts: &mut LogCounts,
    ) -> Result<(), ReadError<E>> {
        loop {
            let hit = !self.scanner.has_pending() && !cur.dense;
            if hit {
                let from = cur.hit_from.max(cur.start);
                let Some(hit) = self.markers.find(&buf[..filled], from) else {
                    // No marker: count the complete lines, keep the partial one.
                    if let Some(last) = memchr::memrchr(b'\n', &buf[cur.nl_from..filled]) {
                        let end = cur.nl_from + last + 1;
                        count_lines(&buf[cur.start..end], counts);
                        cur.start = end;
                    }
                    cur.nl_from = filled;
                    cur.hit_from = filled
                        .saturating_sub(MarkerFinder::MAX_MARKER_BYTES - 1)
                        .max(cur.start);
                    return Ok(());
                };
                if let Some(nl) = memchr::memrchr(b'\n', &buf[cur.start..hit]) {
                    let line_start = cur.start + nl + 1;
                    count_lines(&buf[cur.start..line_start], counts);
                    cur.start = line_start;
                }
                // No newline in `buf[start..hit]`.
                cur.nl_from = cur.nl_from.max(hit);
                cur.hit_from = hit;
            }
            let Some(off) = memchr::memchr(b'\n', &buf[cur.nl_from..filled]) else {
                cur.nl_from = filled;
                return Ok(());
            };
            let end = cur.nl_from + off + 1;
            cur.dense = self.line(&buf[cur.start..end], hit, out, counts)?;
            cur.set(end);
        }
    }
}

/// Reads a saved kernel log (plain text; see [`open_log`] for gzip and bug
/// reports) and hands every fault event to `out`, in input order, counting lines
/// into `counts`. `out` borrows each event ([`FaultEventRef::to_event`] what must
/// outlive the call): an XID line that is its own event is handed out from the
/// read buffer's text (see [`Scanner::push_view`]), so a storm allocates nothing
/// per event. `policy` classifies; `opts` says which lines count.
///
/// Errors: the reader's (`Read`, interrupted reads retried) and the first error
/// `out` returns (`Sink`, reading stops there).
pub fn read_events<E, F: FnMut(&FaultEventRef<'_>) -> Result<(), E>>(
    reader: &mut dyn Read,
    policy: &Arc<Policy>,
    opts: LogOptions,
    counts: &mut LogCounts,
    mut out: F,
) -> Result<(), ReadError<E>> {
    let out = &mut out;
    let mut scan = LineScan {
        scanner: Scanner::new(Arc::clone(policy)),
        markers: MarkerFinder::shared(),
        accept_user: opts.accept_user_facility,
        yearless_now: opts.yearless_now,
    };
    // Every read asks for at least a block, so the input's `BufReader` (of one
    // block) hands it over without copying it through its own buffer.
    let mut buf = vec![0u8; 2 * BLOCK_BYTES];
    let mut cur = Cursor::default();
    let mut filled = 0;
    // Inside a line longer than `MAX_LINE_BYTES` whose start was dropped.
    let mut in_long_line = false;
    loop {
        // Room to read: move the partial line to the front once little is left.
        if buf.len() - filled < BLOCK_BYTES {
            buf.copy_within(cur.start..filled, 0);
            filled -= cur.start;
            cur.shift(cur.start);
        }
        let n = match reader.read(&mut buf[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadError::Read(e)),
        };
        filled += n;
        let eof = n == 0;
        if in_long_line {
            if let Some(off) = memchr::memchr(b'\n', &buf[cur.nl_from..filled]) {
                in_long_line = false;
                counts.lines += 1;
                counts.skipped_long_lines += 1;
                cur.set(cur.nl_from + off + 1);
            } else {
                cur.set(filled);
            }
        }
        if !in_long_line {
            scan.lines(&buf, filled, &mut cur, out, counts)?;
        }
        if eof {
            if in_long_line {
                counts.lines += 1;
                counts.skipped_long_lines += 1;
            } else if cur.start < filled {
                scan.line(&buf[cur.start..filled], false, out, counts)?;
            }
            break;
        }
        if filled - cur.start > MAX_LINE_BYTES + 2 {
            // Too long already: drop what is buffered, skip to its end.
            in_long_line = true;
            cur.set(filled);
        }
        if cur.start == filled {
            cur.set(0);
            filled = 0;
        }
    }
    let mut failed = None;
    scan.scanner
        .finish_view(&mut |ev| sink(out, &mut failed, ev));
    failed.map_or(Ok(()), |e| Err(ReadError::Sink(e)))
}

/// The record metadata of a saved-log line; a syslog date without a year gets one
/// from `yearless_now` (see [`LogOptions::yearless_now`]).
fn meta_of(l: &crate::LogLine<'_>, yearless_now: Option<u64>) -> RecordMeta {
    let time_unix_nano = l
        .time_unix_nano
        .or_else(|| l.yearless_time?.resolve(yearless_now?));
    RecordMeta {
        time_unix_nano,
        ..l.meta()
    }
}

/// Hands `ev` to `out` unless an earlier event of the same record failed (reading
/// stops at the first error, which is kept in `failed`).
fn sink<E, F: FnMut(&FaultEventRef<'_>) -> Result<(), E>>(
    out: &mut F,
    failed: &mut Option<E>,
    ev: &FaultEventRef<'_>,
) {
    if failed.is_none()
        && let Err(e) = out(ev)
    {
        *failed = Some(e);
    }
}

/// The plain definition [`read_events`] implements, which tests and fuzzing
/// compare it with: `input` split into lines at `\n`; a line longer than
/// [`MAX_LINE_BYTES`] skipped; a line with NUL bytes read as the non-blank pieces
/// between them; every line or piece decoded and pushed, owned events out. No
/// prefilter, no blocks, no buffer management: slow and obviously right.
pub fn read_events_plain(
    input: &[u8],
    policy: &Arc<Policy>,
    opts: LogOptions,
) -> (Vec<FaultEvent>, LogCounts) {
    let mut scanner = Scanner::new(Arc::clone(policy));
    let mut events = Vec::new();
    let mut counts = LogCounts::default();
    let mut lines: Vec<&[u8]> = input.split_inclusive(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    for line in lines {
        counts.lines += 1;
        if line.len() > MAX_LINE_BYTES + 2 {
            counts.skipped_long_lines += 1;
            continue;
        }
        let pieces: Vec<&[u8]> = if line.contains(&0) {
            counts.lines_with_nul += u64::from(Scanner::interesting_line(line));
            line.split(|&b| b == 0)
                .filter(|p| !p.trim_ascii().is_empty())
                .collect()
        } else {
            vec![line]
        };
        for piece in pieces {
            let l = parse_line(piece);
            if !opts.accept_user_facility && l.facility.is_some_and(|f| f != 0) {
                counts.skipped_non_kernel_lines += u64::from(Scanner::interesting_line(piece));
                continue;
            }
            scanner.push(meta_of(&l, opts.yearless_now), &l.message, &mut events);
        }
    }
    scanner.finish(&mut events);
    (events, counts)
}

/// `nvidia-bug-report.log`: only its kernel-log sections are scanned (the rest is
/// `lspci`, `nvidia-smi -q`, config files, ... whose text can look like log lines).
///
/// The report (`nvidia-bug-report.sh`, shipped with the driver) opens with the
/// line `Start of NVIDIA bug report log file.` and separates sections with a line
/// of underscores followed by a header such as `*** /var/log/kern.log`,
/// `*** /var/log/messages`, `*** /var/log/syslog`, `dmesg:` /
/// `Skipping dmesg` or `journalctl -b -0 ...`. A section is scanned when its
/// header names a kernel log (`kern.log`, `messages`, `syslog`, `dmesg`,
/// `journalctl`); every line of it is kept, and scanning stops at the next
/// separator.
struct KernelLogSections<'a> {
    inner: Box<dyn Read + 'a>,
    /// Undelivered bytes of the current kernel-log section.
    pending: Vec<u8>,
    pos: usize,
    /// Bytes read but not yet split into lines.
    buf: Vec<u8>,
    /// Inside a kernel-log section.
    in_kernel_section: bool,
    /// The previous line was a separator: this line is a section header.
    after_separator: bool,
    eof: bool,
}

/// First line of an `nvidia-bug-report.log`.
const BUG_REPORT_START: &[u8] = b"Start of NVIDIA bug report log file";

impl KernelLogSections<'_> {
    /// Splits complete lines out of `buf` into `pending` (kernel sections only).
    fn split_lines(&mut self) {
        let mut start = 0;
        while let Some(off) = memchr::memchr(b'\n', &self.buf[start..]) {
            let end = start + off + 1;
            self.line(start, end);
            start = end;
        }
        if self.eof && start < self.buf.len() {
            let end = self.buf.len();
            self.line(start, end);
            start = end;
        }
        self.buf.drain(..start);
    }

    fn line(&mut self, start: usize, end: usize) {
        let line = &self.buf[start..end];
        let text = line.trim_ascii();
        if text.len() >= 20 && text.iter().all(|&b| b == b'_') {
            self.in_kernel_section = false;
            self.after_separator = true;
            return;
        }
        if self.after_separator && !text.is_empty() {
            self.after_separator = false;
            let header = String::from_utf8_lossy(text).to_ascii_lowercase();
            self.in_kernel_section = ["kern.log", "messages", "syslog", "dmesg", "journalctl"]
                .iter()
                .any(|k| header.contains(k))
                && !header.starts_with("skipping");
            return;
        }
        if self.in_kernel_section {
            self.pending.extend_from_slice(line);
        }
    }
}

impl Read for KernelLogSections<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if self.pos < self.pending.len() {
                let n = out.len().min(self.pending.len() - self.pos);
                out[..n].copy_from_slice(&self.pending[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            self.pending.clear();
            self.pos = 0;
            if self.eof {
                return Ok(0);
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = loop {
                match self.inner.read(&mut chunk) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    r => break r?,
                }
            };
            if n == 0 {
                self.eof = true;
            }
            self.buf.extend_from_slice(&chunk[..n]);
            self.split_lines();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// Hands out one byte per read, as a pipe may.
    struct OneByte(std::io::Cursor<Vec<u8>>);

    impl Read for OneByte {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(1);
            self.0.read(&mut buf[..n])
        }
    }

    fn text_of(input: Vec<u8>) -> Vec<u8> {
        let mut text = Vec::new();
        open_log(Box::new(OneByte(std::io::Cursor::new(input))))
            .unwrap()
            .read_to_end(&mut text)
            .unwrap();
        text
    }

    const LOG: &[u8] = b"[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n";

    #[test]
    fn gzip_and_bug_reports_are_told_apart_however_short_the_reads() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(LOG).unwrap();
        let gz = gz.finish().unwrap();
        // Two members, as `cat a.gz b.gz` makes.
        assert_eq!(text_of([gz.clone(), gz].concat()), [LOG, LOG].concat());
        let report = [
            b"Start of NVIDIA bug report log file.\n".as_slice(),
            b"____________________________________________\n",
            b"*** /etc/modprobe.d/nvidia.conf\n",
            b"options nvidia NVreg_Xid=79\n",
            b"____________________________________________\n",
            b"*** /var/log/kern.log\n",
            LOG,
        ]
        .concat();
        assert_eq!(text_of(report), LOG);
        assert_eq!(text_of(LOG.to_vec()), LOG);
        assert_eq!(text_of(Vec::new()), b"");
    }
}
