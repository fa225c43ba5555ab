//! The position reported to the engine, and the end of the source.

use super::reader::{EngineGone, Reader};
use crate::pipeline::InOrder;
use gpuwatch_core::msg::{Input, KmsgPosition};
use std::time::Instant;

impl Reader {
    pub(super) fn maybe_report_position(&mut self) {
        if self.last_report.elapsed() >= self.cfg.cursor_interval {
            // A gone engine is noticed by the next send.
            let _ = self.report_position();
        }
    }

    /// The exact position, when there is one: every record read so far had
    /// its events handed to the engine channel and nothing is held (by the
    /// scanner or the sender). `None` otherwise, or for a replay.
    pub(super) fn exact_position(&self) -> Option<u64> {
        if !self.device || self.scanner.has_pending() || self.sender.pending() > 0 {
            return None;
        }
        self.last_seq
    }

    /// Tells the engine the exact position when it moved. Err when the engine
    /// is gone.
    pub(super) fn report_position(&mut self) -> Result<(), EngineGone> {
        self.last_report = Instant::now();
        let Some(seq) = self.exact_position() else {
            return Ok(());
        };
        if self.reported_seq.is_some_and(|r| r >= seq) {
            return Ok(());
        }
        let progress = Input::KmsgProgress(KmsgPosition {
            boot_id: self.boot_id.clone(),
            last_seq: seq,
        });
        match self.sender.try_send_in_order(progress) {
            InOrder::Sent => self.reported_seq = Some(seq),
            InOrder::Deferred => {}
            InOrder::Disconnected => return Err(EngineGone),
        }
        Ok(())
    }

    /// End of the source: emit what the scanner holds, deliver, and report
    /// the final position when everything was delivered. Events the bounded
    /// drain could not deliver are not covered by any reported position, so
    /// the next start reads their records again.
    pub(super) fn finish(&mut self) {
        self.scanner.finish(&mut self.out);
        let _ = self.deliver(Instant::now());
        let undelivered = self.sender.drain(self.drain_timeout);
        if self.sender.is_disconnected() || undelivered.is_some() {
            return;
        }
        if let Some(seq) = self.exact_position()
            && self.reported_seq.is_none_or(|r| seq > r)
        {
            let progress = Input::KmsgProgress(KmsgPosition {
                boot_id: self.boot_id.clone(),
                last_seq: seq,
            });
            if self
                .sender
                .send_in_order_timeout(progress, self.drain_timeout)
            {
                self.reported_seq = Some(seq);
            }
        }
    }
}
