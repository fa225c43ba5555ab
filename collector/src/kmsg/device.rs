//! Reading `/dev/kmsg`: one record per `read(2)`.

use super::reader::{ReadOn, Reader};
use super::{KmsgError, MAX_BUFFER};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::time::Instant;

const MIN_BUFFER: usize = 16 * 1024;

impl Reader {
    /// One record per read. Returns Ok(false) at shutdown / engine gone.
    pub(super) fn read_device(&mut self, file: &File) -> Result<bool, KmsgError> {
        let mut buf = vec![0u8; MIN_BUFFER];
        let mut reads_since_check = 0u32;
        // The first record read since the open ends a run of failures.
        let mut failing = true;
        let mut f = file;
        loop {
            match f.read(&mut buf) {
                Ok(0) => {
                    // /dev/kmsg never returns end of file (no record:
                    // EAGAIN); something else is at its path.
                    return Err(KmsgError::Eof {
                        path: self.cfg.path.clone(),
                    });
                }
                Ok(n) => {
                    if failing {
                        failing = false;
                        self.retry.reset();
                    }
                    let read_at = Instant::now();
                    if let ReadOn::EngineGone = self.process(&buf[..n], Some(read_at)) {
                        return Ok(false);
                    }
                    reads_since_check += 1;
                    if reads_since_check >= 1024 {
                        reads_since_check = 0;
                        if self.stopping() {
                            return Ok(false);
                        }
                        self.heartbeat();
                        self.maybe_report_position();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.mark_caught_up();
                    if self.stopping() {
                        return Ok(false);
                    }
                    if let ReadOn::EngineGone = self.idle(Some(file.as_fd())) {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
                    // The ring overwrote unread records; the next read returns
                    // the oldest record and the sequence gap is counted there.
                    tracing::debug!("Kernel log ring overran the reader.");
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && buf.len() < MAX_BUFFER => {
                    let len = (buf.len() * 2).min(MAX_BUFFER);
                    tracing::debug!(
                        buffer = len,
                        "Kernel log record larger than the buffer; growing it."
                    );
                    buf.resize(len, 0);
                }
                Err(source) => {
                    return Err(KmsgError::Read {
                        path: self.cfg.path.clone(),
                        source,
                    });
                }
            }
        }
    }
}
