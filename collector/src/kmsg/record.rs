//! One record: sequence checks, the scanner, and delivery of its events.

use super::reader::{ReadOn, Reader};
use crate::boot;
use crate::pipeline::SendStatus;
use gpuwatch_core::registry::Tally;
use gpuwatch_proto::Source;
use std::time::Instant;
use xid_parser::{RecordMeta, Scanner};

/// A sequence gap larger than any ring can hold (the kernel caps the log
/// buffer at 2 GiB, and a record takes at least 32 bytes of it) is not a count
/// of lost records.
const MAX_PLAUSIBLE_GAP: u64 = (2u64 << 30) / 32;

impl Reader {
    /// One record (without trailing newline for replays; a full `/dev/kmsg`
    /// record with dictionary lines for the device).
    pub(super) fn process(&mut self, record: &[u8], read_at: Option<Instant>) -> ReadOn {
        let rec = match xid_parser::parse_kmsg_record(record) {
            Ok(r) => r,
            Err(e) => {
                self.registry.count(Tally::KmsgMalformed, 1);
                tracing::debug!(error = %e, "Malformed kernel log record skipped.");
                return ReadOn::Continue;
            }
        };
        let seq = rec.seq;
        // Device sequence numbers only grow within a boot: anything up to the
        // last record read was processed before (the saved cursor at start; a
        // reopen after a read error starts at the oldest record again).
        if self.device && self.last_seq.is_some_and(|done| seq <= done) {
            return ReadOn::Continue;
        }
        self.registry.count(Tally::KmsgRead, 1);
        self.summary.records += 1;
        if let Some(last) = self.last_seq
            && seq > last.saturating_add(1)
        {
            let lost = seq - last - 1;
            if lost > MAX_PLAUSIBLE_GAP {
                // No ring holds that many records: a corrupt or edited
                // sequence number, not lost records.
                tracing::warn!(
                    after_seq = last,
                    next_seq = seq,
                    "Kernel log sequence number jumped implausibly far; not counted as lost records."
                );
            } else {
                self.registry.count(Tally::KmsgLost, lost);
                tracing::warn!(
                    lost,
                    after_seq = last,
                    next_seq = seq,
                    "Kernel log records were lost."
                );
            }
        }
        self.last_seq = Some(seq);
        let accepted = rec.facility == 0 || self.cfg.accept_user_facility;
        let pending = self.scanner.has_pending();
        // One prefilter pass on the raw, still escaped message bytes (a `\xNN`
        // escape could hide a marker, so a backslash passes too); only records
        // that pass are unescaped. The scanner checks the unescaped text again.
        let interesting = accepted && Scanner::interesting_line(rec.message);
        if interesting || (accepted && pending) {
            let meta = RecordMeta {
                seq: Some(seq),
                monotonic_usec: Some(rec.ts_usec),
                time_unix_nano: Some(boot::wall_time_unix_nanos(self.boot_time, rec.ts_usec)),
                facility: Some(rec.facility),
                level: Some(rec.level),
            };
            if interesting {
                self.take_spent();
                let message = rec.message();
                self.scanner.push(meta, &message, &mut self.out);
            } else {
                // Not a fault line: it only ends the held event. The scanner
                // treats every message failing the prefilter alike, so the
                // unescaped text is not needed.
                self.scanner.push(meta, "", &mut self.out);
            }
            let read_at = read_at.unwrap_or_else(Instant::now);
            if let ReadOn::EngineGone = self.deliver(read_at) {
                return ReadOn::EngineGone;
            }
        } else if pending {
            self.scanner.flush_expired(rec.ts_usec, &mut self.out);
            if let ReadOn::EngineGone = self.deliver(Instant::now()) {
                return ReadOn::EngineGone;
            }
        }
        if !self.scanner.has_pending() {
            self.processed_seq = Some(seq);
        }
        ReadOn::Continue
    }

    /// Gives the scanner every spent event the engine handed back, before
    /// a record that may make events: the events of one burst come back
    /// once the engine emitted them, often after the reader read the burst,
    /// and refill the next burst's (the scanner keeps a burst's worth and
    /// drops the rest).
    fn take_spent(&mut self) {
        if let Some(rx) = &self.spent {
            for ev in rx.try_iter() {
                self.scanner.recycle(ev);
            }
        }
    }

    pub(super) fn deliver(&mut self, read_at: Instant) -> ReadOn {
        for mut ev in self.out.drain(..) {
            ev.set_source(Source::Kmsg);
            if ev.boot_id.is_empty() {
                ev.boot_id.clone_from(&self.boot_id);
            }
            ev.count = ev.count.max(1);
            if self.device && ev.pid.is_some() {
                crate::attribution::annotate(&mut ev, &self.cfg.proc_root, self.clock_ticks);
            }
            self.summary.events += 1;
            if self.sender.send(ev, read_at) == SendStatus::Disconnected {
                return ReadOn::EngineGone;
            }
        }
        ReadOn::Continue
    }
}
