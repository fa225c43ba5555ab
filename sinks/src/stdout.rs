//! The stdout JSON-lines sink: one `FaultEvent` JSON object per line, for
//! debugging, the demo and `--sink stdout`.
//!
//! [`EventSink::send`] and [`EventSink::send_batch`] run on the health-engine
//! thread and must never block, but a pipe whose reader stalls (a paused
//! `| less`, a full container log pipe) blocks `write(2)`. So the sink writes
//! lines itself only when that cannot block: nothing is queued or being
//! written (order), the run of lines written at once fits in `PIPE_BUF`
//! bytes, stdout is a pipe, socket or character device, and `poll(2)` says it
//! takes them now (a regular file always polls writable but can block on a
//! hung disk). Otherwise it queues the lines for a writer thread
//! (`gpuwatch-stdout`), which writes what is queued with one `write(2)` and
//! flushes. Writing on the engine thread saves a thread wake-up per event
//! (tens to hundreds of µs on an idle machine); writing a batch of events'
//! lines together saves the reader a wake-up per line; the queue keeps a
//! stalled reader from stalling the engine. The queue is bounded ([`QUEUE_CAPACITY`] lines by default): when
//! it is full the oldest line is dropped, counted `stage="stdout",
//! outcome="dropped"`, like a line the writer failed to write (closed stdout).
//! [`EventSink::flush`] waits up to its timeout for the queue to empty.

use gpuwatch_core::queue::{Drain, Settled, SinkQueue};
use gpuwatch_core::{EventSink, Registry, Stage};
use gpuwatch_proto::FaultEvent;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Lines the sink holds while the writer is behind.
pub const QUEUE_CAPACITY: usize = 4096;

/// Longest line written on the caller's thread: a pipe that `poll(2)` reports
/// writable takes a write of up to `PIPE_BUF` (4096 bytes on Linux) whole,
/// without blocking (pipe(7)).
const INLINE_MAX_BYTES: usize = 4096;

/// Says whether a write of one line could proceed now without blocking.
type WritableProbe = Box<dyn Fn() -> bool + Send + Sync>;

/// Writes each event as one JSON line to a writer (stdout by default), from a
/// writer thread of its own.
pub struct JsonLinesSink {
    shared: Arc<JsonLinesShared>,
    /// No writer thread could be started: `send` writes itself.
    inline: bool,
}

struct JsonLinesShared {
    /// Encoded lines, each ending in a newline.
    queue: SinkQueue<Vec<u8>>,
    out: Mutex<Box<dyn Write + Send>>,
    /// `None`: the output cannot be probed; every line goes through the queue.
    writable: Option<WritableProbe>,
}

impl std::fmt::Debug for JsonLinesSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLinesSink")
            .field("capacity", &self.shared.queue.capacity())
            .finish_non_exhaustive()
    }
}

impl JsonLinesSink {
    /// A sink writing to the process's stdout.
    pub fn stdout(registry: Arc<Registry>) -> JsonLinesSink {
        let probe: Option<WritableProbe> = pollable(std::io::stdout().as_fd())
            .then(|| Box::new(|| writable_now(std::io::stdout().as_fd())) as WritableProbe);
        JsonLinesSink::build(Box::new(std::io::stdout()), registry, QUEUE_CAPACITY, probe)
    }

    /// A sink on a file descriptor it owns, set up as [`JsonLinesSink::stdout`]
    /// is: the tests' real pipes and files stand in for stdout.
    #[cfg(test)]
    fn from_fd(fd: std::os::fd::OwnedFd, registry: Arc<Registry>) -> JsonLinesSink {
        let file = Arc::new(std::fs::File::from(fd));
        let polled = Arc::clone(&file);
        let probe: Option<WritableProbe> = pollable(file.as_fd())
            .then(|| Box::new(move || writable_now(polled.as_fd())) as WritableProbe);
        JsonLinesSink::build(Box::new(SharedFile(file)), registry, QUEUE_CAPACITY, probe)
    }

    /// A sink writing to `out` (which cannot be polled: every line is written
    /// by the writer thread).
    pub fn new(out: Box<dyn Write + Send>, registry: Arc<Registry>) -> JsonLinesSink {
        JsonLinesSink::with_capacity(out, registry, QUEUE_CAPACITY)
    }

    /// A sink writing to `out` that queues at most `capacity` lines.
    pub fn with_capacity(
        out: Box<dyn Write + Send>,
        registry: Arc<Registry>,
        capacity: usize,
    ) -> JsonLinesSink {
        JsonLinesSink::build(out, registry, capacity, None)
    }

    fn build(
        out: Box<dyn Write + Send>,
        registry: Arc<Registry>,
        capacity: usize,
        writable: Option<WritableProbe>,
    ) -> JsonLinesSink {
        let shared = Arc::new(JsonLinesShared {
            queue: SinkQueue::new(capacity, Stage::Stdout, registry),
            out: Mutex::new(out),
            writable,
        });
        let writer = Arc::clone(&shared);
        let inline = match std::thread::Builder::new()
            .name("gpuwatch-stdout".into())
            .spawn(move || writer.run())
        {
            Ok(_) => false,
            Err(e) => {
                tracing::error!(error = %e, "Cannot start the stdout writer thread; writing on the engine thread.");
                true
            }
        };
        JsonLinesSink { shared, inline }
    }
}

/// Whether `poll(2)` tells if a write would block: true for pipes, sockets
/// and character devices (a tty, `/dev/null`). A regular file always polls
/// writable, yet a write to it can block on a slow or hung disk, so lines
/// for a file always go through the writer thread.
fn pollable(fd: BorrowedFd<'_>) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| {
        let kind =
            nix::sys::stat::SFlag::from_bits_truncate(st.st_mode) & nix::sys::stat::SFlag::S_IFMT;
        kind == nix::sys::stat::SFlag::S_IFIFO
            || kind == nix::sys::stat::SFlag::S_IFSOCK
            || kind == nix::sys::stat::SFlag::S_IFCHR
    })
}

/// `poll(2)` with a zero timeout: the descriptor takes a small write now.
fn writable_now(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1))
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLOUT) && !r.intersects(PollFlags::POLLERR))
}

/// A file shared between the writer and the probe that polls it.
#[cfg(test)]
struct SharedFile(Arc<std::fs::File>);

#[cfg(test)]
impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (&*self.0).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl JsonLinesShared {
    /// Writes `lines` (each ends in a newline) in one `write(2)` where the
    /// output takes them all (one wake-up of its reader), and flushes once;
    /// returns how many reached the output whole. A closed stdout (EPIPE)
    /// loses the rest: counted, never fatal to the agent.
    fn write<'a>(&self, lines: impl ExactSizeIterator<Item = &'a [u8]>) -> usize {
        let mut buf = Vec::new();
        // Where each line ends in `buf`.
        let mut ends = Vec::with_capacity(lines.len());
        for line in lines {
            buf.extend_from_slice(line);
            ends.push(buf.len());
        }
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let mut done = 0;
        while done < buf.len() {
            match out.write(&buf[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let written = ends.iter().take_while(|&&end| end <= done).count();
        if out.flush().is_err() {
            // Whatever was buffered did not make it out.
            return 0;
        }
        written
    }

    /// Writes `lines` on the caller's thread and counts them (at the queue's
    /// stage, like the queued lines).
    fn write_counted(&self, lines: &[Vec<u8>]) {
        let written = self.write(lines.iter().map(|l| l.as_slice()));
        self.queue
            .count_unqueued_many(written, lines.len() - written);
    }

    /// The writer thread: takes everything queued, writes it, repeats; ends
    /// once the sink is dropped and what it queued is written.
    fn run(&self) {
        while let Some(batch) = self.queue.next_batch(usize::MAX, Duration::ZERO) {
            let written = self.write(batch.iter().map(|l| l.as_slice()));
            self.queue.settle(batch.len(), Settled::Done { written });
        }
        self.queue.finish();
    }
}

impl EventSink for JsonLinesSink {
    fn name(&self) -> &'static str {
        "stdout"
    }

    fn send(&self, event: &FaultEvent) {
        self.send_batch(std::slice::from_ref(event));
    }

    /// Whole lines only, newline included: a reader never wakes for half a
    /// line. Written here in runs of lines of at most `PIPE_BUF` (4,096) bytes,
    /// one `write(2)` per run, each after `poll(2)` said the output takes
    /// it; the lines from the first run that cannot go now on are queued
    /// for the writer thread (one wake-up).
    fn send_batch(&self, events: &[FaultEvent]) {
        // The hand-written encoder writes what serde_json would, without its
        // per-character escaping (this runs on the engine thread).
        let lines: Vec<Vec<u8>> = events
            .iter()
            .map(|event| {
                let mut line = Vec::with_capacity(1024);
                gpuwatch_proto::json::write_fault_event(event, &mut line);
                line.push(b'\n');
                line
            })
            .collect();
        if self.inline {
            self.shared.write_counted(&lines);
            return;
        }
        // Nothing ahead of these lines: write here what the output takes
        // now; the queue stays locked meanwhile, so the writer thread cannot
        // start a write in between (order).
        self.shared.queue.push_many_unless(lines, |lines| {
            let mut taken = 0;
            while taken < lines.len() {
                let mut bytes = 0;
                let run = lines[taken..]
                    .iter()
                    .take_while(|l| {
                        bytes += l.len();
                        bytes <= INLINE_MAX_BYTES
                    })
                    .count();
                if run == 0 || !self.shared.writable.as_ref().is_some_and(|w| w()) {
                    break;
                }
                self.shared.write_counted(&lines[taken..taken + run]);
                taken += run;
            }
            taken
        });
    }

    /// Waits until every queued line is written, at most `timeout`.
    fn flush(&self, timeout: Duration) {
        if !self.shared.queue.flush(timeout) {
            tracing::warn!(
                queued = self.shared.queue.len(),
                "The stdout sink did not finish writing in time."
            );
        }
    }
}

impl Drop for JsonLinesSink {
    /// Lets the writer thread finish what is queued and end. It is not joined:
    /// a blocked stdout must not block whoever drops the sink.
    fn drop(&mut self) {
        self.shared.queue.stop(Drain::All);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_core::Outcome;
    use std::sync::Condvar;
    use std::time::Instant;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A writer that blocks until released (a stalled pipe reader).
    #[derive(Clone)]
    struct Stalled {
        open: Arc<(Mutex<bool>, Condvar)>,
        buf: Buf,
    }
    impl Stalled {
        fn new() -> Stalled {
            Stalled {
                open: Arc::new((Mutex::new(false), Condvar::new())),
                buf: Buf::default(),
            }
        }
        fn release(&self) {
            *self.open.0.lock().unwrap() = true;
            self.open.1.notify_all();
        }
    }
    impl Write for Stalled {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let mut open = self.open.0.lock().unwrap();
            while !*open {
                open = self.open.1.wait(open).unwrap();
            }
            drop(open);
            self.buf.write(b)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct Closed;
    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    fn xid(code: u32) -> FaultEvent {
        FaultEvent {
            code,
            ..Default::default()
        }
    }

    fn codes(buf: &Buf) -> Vec<u64> {
        codes_of(&buf.0.lock().unwrap())
    }

    /// The `code` of every JSON line in `bytes`.
    fn codes_of(bytes: &[u8]) -> Vec<u64> {
        std::str::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["code"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn one_json_object_per_line() {
        let buf = Buf::default();
        let reg = Registry::new();
        let sink = JsonLinesSink::new(Box::new(buf.clone()), reg.clone());
        let ev = FaultEvent {
            code: 79,
            ..Default::default()
        };
        sink.send(&ev);
        sink.send(&ev);
        sink.flush(Duration::from_secs(10));
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["code"], 79);
        assert_eq!(reg.events(Stage::Stdout, Outcome::Emitted), 2);
    }

    /// The line is exactly what serde_json writes for the event.
    #[test]
    fn the_line_is_serde_jsons_encoding() {
        let buf = Buf::default();
        let reg = Registry::new();
        let sink = JsonLinesSink::new(Box::new(buf.clone()), reg);
        let mut ev = FaultEvent {
            code: 79,
            pci_address: "0000:3b:00.0".into(),
            message: "GPU has \"fallen\" off\tthe bus\n\u{1}é".into(),
            ..Default::default()
        };
        ev.attributes.insert("pid".into(), "42".into());
        sink.send(&ev);
        sink.flush(Duration::from_secs(10));
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text, serde_json::to_string(&ev).unwrap() + "\n");
    }

    /// A stalled stdout must not stall the engine thread;
    /// the oldest lines go first when the queue is full, each counted.
    #[test]
    fn a_stalled_stdout_never_blocks_send_and_drops_the_oldest() {
        let out = Stalled::new();
        let reg = Registry::new();
        let sink = JsonLinesSink::with_capacity(Box::new(out.clone()), reg.clone(), 4);
        sink.send(&xid(0));
        // Wait until the writer has taken line 0 and is stuck writing it.
        let t0 = Instant::now();
        while !sink.shared.queue.in_flight() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "writer never started"
            );
            std::thread::yield_now();
        }
        // These return although nothing can be written.
        for code in 1..=10 {
            sink.send(&xid(code));
        }
        assert_eq!(reg.events(Stage::Stdout, Outcome::Dropped), 6);
        // flush gives up at its timeout while stdout is stalled.
        sink.flush(Duration::from_millis(20));
        assert_eq!(reg.events(Stage::Stdout, Outcome::Emitted), 0);

        out.release();
        sink.flush(Duration::from_secs(10));
        assert_eq!(codes(&out.buf), vec![0, 7, 8, 9, 10]);
        assert_eq!(reg.events(Stage::Stdout, Outcome::Emitted), 5);
        assert_eq!(reg.events(Stage::Stdout, Outcome::Dropped), 6);
    }

    /// A real pipe (the agent's stdout under a container runtime or `| jq`):
    /// returns the read end (non-blocking) and a sink on the write end.
    fn pipe_sink(reg: &Arc<Registry>, pipe_bytes: i32) -> (std::fs::File, JsonLinesSink) {
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(pipe_bytes)).unwrap();
        let flags = nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(flags)).unwrap();
        (
            std::fs::File::from(r),
            JsonLinesSink::from_fd(w, reg.clone()),
        )
    }

    fn read_available(r: &mut std::fs::File) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match std::io::Read::read(r, &mut buf) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return out,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// With room in the pipe the line is written before `send` returns, on
    /// the caller's thread: no wake-up of the writer thread in between.
    #[test]
    fn a_writable_pipe_has_the_line_when_send_returns() {
        let reg = Registry::new();
        let (mut r, sink) = pipe_sink(&reg, 65536);
        for code in [13, 79] {
            sink.send(&xid(code));
            let got = read_available(&mut r);
            let text = String::from_utf8(got).unwrap();
            assert_eq!(text.matches('\n').count(), 1, "{text:?}");
            let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
            assert_eq!(v["code"], code);
        }
        assert_eq!(reg.events(Stage::Stdout, Outcome::Emitted), 2);
    }

    /// A batch goes out whole and in order: with room in the pipe in runs of
    /// lines of at most `PIPE_BUF` bytes written on the caller's thread,
    /// into a pipe with less room partly through the writer thread, every
    /// line counted once.
    #[test]
    fn a_batch_reaches_the_pipe_in_order() {
        for pipe_bytes in [65536, 4096] {
            let reg = Registry::new();
            let (mut r, sink) = pipe_sink(&reg, pipe_bytes);
            let batch: Vec<FaultEvent> = (1..=40).map(xid).collect();
            sink.send_batch(&batch);
            let mut got = Vec::new();
            let t0 = Instant::now();
            while got.iter().filter(|&&b| b == b'\n').count() < batch.len() {
                assert!(t0.elapsed() < Duration::from_secs(10), "lines never came");
                got.extend(read_available(&mut r));
                std::thread::yield_now();
            }
            let codes = codes_of(&got);
            assert_eq!(
                codes,
                (1..=40).collect::<Vec<u64>>(),
                "pipe of {pipe_bytes}"
            );
            sink.flush(Duration::from_secs(10));
            assert_eq!(reg.events(Stage::Stdout, Outcome::Emitted), 40);
            assert_eq!(reg.events(Stage::Stdout, Outcome::Dropped), 0);
        }
    }

    /// A full pipe (its reader stalled) never blocks `send`; the lines wait in
    /// the queue and come out in order, after the bytes already in the pipe,
    /// once the reader drains it; a line longer than `PIPE_BUF` keeps its place.
    #[test]
    fn a_full_pipe_never_blocks_send_and_keeps_the_order() {
        let reg = Registry::new();
        let page = 4096;
        let (mut r, sink) = pipe_sink(&reg, page);
        // Exactly fill the pipe: a blocking write of the pipe's size completes.
        let mut filler = sink.shared.out.lock().unwrap();
        filler.write_all(&vec![b'x'; page as usize]).unwrap();
        drop(filler);
        let long = FaultEvent {
            code: 2,
            message: "m".repeat(5000),
            ..Default::default()
        };
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let sink = Arc::new(sink);
        let sender = Arc::clone(&sink);
        std::thread::spawn(move || {
            sender.send(&xid(1));
            sender.send(&long);
            sender.send(&xid(3));
            done_tx.send(()).unwrap();
        });
        done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("send blocked on a full pipe");
        let mut got = Vec::new();
        let t0 = Instant::now();
        while got.iter().filter(|&&b| b == b'\n').count() < 3 {
            assert!(t0.elapsed() < Duration::from_secs(10), "lines never came");
            got.extend(read_available(&mut r));
            std::thread::yield_now();
        }
        assert!(got[..page as usize].iter().all(|&b| b == b'x'));
        let codes = codes_of(&got[page as usize..]);
        assert_eq!(codes, vec![1, 2, 3]);
        sink.flush(Duration::from_secs(10));
        assert_eq!(reg.events(Stage::Stdout, Outcome::Emitted), 3);
    }

    /// A regular file polls writable but can block on a hung disk: its lines
    /// always go through the writer thread.
    #[test]
    fn a_regular_file_is_never_written_on_the_callers_thread() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("out")).unwrap();
        assert!(!pollable(file.as_fd()));
        let (r, w) = nix::unistd::pipe().unwrap();
        assert!(pollable(w.as_fd()));
        drop(r);
        let reg = Registry::new();
        let sink = JsonLinesSink::from_fd(file.into(), reg.clone());
        assert!(sink.shared.writable.is_none());
        sink.send(&xid(79));
        sink.flush(Duration::from_secs(10));
        let text = std::fs::read_to_string(dir.path().join("out")).unwrap();
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn a_closed_stdout_counts_lines_as_dropped() {
        let reg = Registry::new();
        let sink = JsonLinesSink::new(Box::new(Closed), reg.clone());
        for code in 0..3 {
            sink.send(&xid(code));
        }
        sink.flush(Duration::from_secs(10));
        assert_eq!(reg.events(Stage::Stdout, Outcome::Emitted), 0);
        assert_eq!(reg.events(Stage::Stdout, Outcome::Dropped), 3);
    }

    #[test]
    fn lines_queued_before_drop_are_still_written() {
        let buf = Buf::default();
        let reg = Registry::new();
        let sink = JsonLinesSink::new(Box::new(buf.clone()), reg.clone());
        for code in 0..100 {
            sink.send(&xid(code));
        }
        drop(sink);
        let t0 = Instant::now();
        while reg.events(Stage::Stdout, Outcome::Emitted) < 100 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "writer stopped early"
            );
            std::thread::yield_now();
        }
        assert_eq!(codes(&buf), (0..100).collect::<Vec<_>>());
    }
}
