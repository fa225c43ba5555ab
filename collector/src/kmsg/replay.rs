//! Reading a replay: a file or FIFO of kmsg-format lines, followed like
//! `tail -f` unless it is to end the source.

use super::reader::{FALLBACK_WAIT, ReadOn, Reader};
use super::{KmsgError, MAX_BUFFER};
use crate::pipeline::SendStatus;
use gpuwatch_core::registry::Tally;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::Instant;

const REPLAY_CHUNK: usize = 256 * 1024;

const READ_AT_PER_RECORD: Option<Instant> = None;

impl Reader {
    /// Kmsg-format lines from a file or FIFO. Ok(true) at end of input with
    /// `exit_at_eof`.
    pub(super) fn read_replay(&mut self, file: &File) -> Result<bool, KmsgError> {
        let is_fifo = file
            .metadata()
            .map(|m| m.file_type().is_fifo())
            .unwrap_or(false);
        // Set up before the first read: a write after any read that found
        // the end leaves an event, so no write is ever missed.
        let growth = Growth::watch(&self.cfg.path);
        let mut buf = vec![0u8; REPLAY_CHUNK];
        let mut filled = 0usize;
        let mut seen_data = false;
        let mut f = file;
        loop {
            if self.stopping() {
                return Ok(false);
            }
            if filled == buf.len() {
                // A single line longer than the buffer: grow (bounded).
                if buf.len() >= MAX_BUFFER * 4 {
                    self.registry.count(Tally::KmsgMalformed, 1);
                    tracing::warn!(bytes = filled, "Replay line too long; skipped.");
                    filled = 0;
                } else {
                    let len = buf.len() * 2;
                    buf.resize(len, 0);
                }
            }
            match f.read(&mut buf[filled..]) {
                Ok(0) => {
                    if is_fifo && !seen_data {
                        // No writer yet: not the end of the input.
                        if let ReadOn::EngineGone = self.idle_replay(growth.as_ref()) {
                            return Ok(false);
                        }
                        continue;
                    }
                    // End of input: a last line without newline is complete
                    // now, when the input really ended (`exit_at_eof`, or the
                    // FIFO's writers closed it). A regular file that is still
                    // being written may end in the middle of a line: keep the
                    // part until the rest arrives.
                    if filled > 0 && (self.cfg.exit_at_eof || is_fifo) {
                        let line = buf[..filled].to_vec();
                        filled = 0;
                        if let ReadOn::EngineGone = self.process_line(&line) {
                            return Ok(false);
                        }
                    }
                    self.mark_caught_up();
                    if self.cfg.exit_at_eof {
                        return Ok(true);
                    }
                    if let ReadOn::EngineGone = self.idle_replay(growth.as_ref()) {
                        return Ok(false);
                    }
                }
                Ok(n) => {
                    seen_data = true;
                    filled += n;
                    let mut start = 0;
                    while let Some(pos) = memchr::memchr(b'\n', &buf[start..filled]) {
                        let end = start + pos;
                        if let ReadOn::EngineGone = self.process_line_at(&buf, start, end) {
                            return Ok(false);
                        }
                        start = end + 1;
                    }
                    buf.copy_within(start..filled, 0);
                    filled -= start;
                    if self.sender.pending() > 0 && self.sender.flush() == SendStatus::Disconnected
                    {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // A FIFO with a writer attached: read to its current end.
                    self.mark_caught_up();
                    if let ReadOn::EngineGone = self.idle(Some(file.as_fd())) {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(KmsgError::Read {
                        path: self.cfg.path.clone(),
                        source,
                    });
                }
            }
        }
    }

    fn process_line_at(&mut self, buf: &[u8], start: usize, end: usize) -> ReadOn {
        let line = &buf[start..end];
        // Dictionary continuation lines and blank lines carry no record.
        if line.is_empty() || line[0] == b' ' {
            return ReadOn::Continue;
        }
        // `process` wants the line without its newline; the caller's buffer is
        // borrowed immutably while `self` is borrowed mutably, which is fine
        // because `buf` is not part of `self`.
        self.process(line, READ_AT_PER_RECORD)
    }

    fn process_line(&mut self, line: &[u8]) -> ReadOn {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        if line.is_empty() || line[0] == b' ' {
            return ReadOn::Continue;
        }
        self.process(line, READ_AT_PER_RECORD)
    }

    /// Idle work for a replay at its end (a file or a FIFO without writer,
    /// which `poll(2)` cannot wait on): waits for `growth` to report a write,
    /// or without it [`FALLBACK_WAIT`] before reading again.
    fn idle_replay(&mut self, growth: Option<&Growth>) -> ReadOn {
        let Some(growth) = growth else {
            if let ReadOn::EngineGone = self.idle_work() {
                return ReadOn::EngineGone;
            }
            let wait = self.idle_wait().min(FALLBACK_WAIT);
            self.wait(None, wait);
            return ReadOn::Continue;
        };
        let outcome = self.idle(Some(growth.inotify.as_fd()));
        // Events from before the next read are consumed now: a write after
        // it leaves a fresh one.
        growth.drain();
        outcome
    }
}

/// Writes to a followed replay input (inotify `IN_MODIFY`): a reader at the
/// end of a file waits on this instead of reading again and again.
#[derive(Debug)]
struct Growth {
    inotify: Inotify,
}

impl Growth {
    /// A watch on `path`; `None` (logged) when inotify is unavailable.
    fn watch(path: &Path) -> Option<Growth> {
        let watched =
            Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).and_then(|inotify| {
                inotify.add_watch(path, AddWatchFlags::IN_MODIFY)?;
                Ok(inotify)
            });
        match watched {
            Ok(inotify) => Some(Growth { inotify }),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "Cannot watch the replay input with inotify; reading it again every 250 ms.");
                None
            }
        }
    }

    /// Consumes the events queued so far.
    fn drain(&self) {
        while self
            .inotify
            .read_events()
            .is_ok_and(|events| !events.is_empty())
        {}
    }
}
