//! The stdout JSON-lines sink: one `FaultEvent` JSON object per line, for
//! debugging, the demo and `--sink stdout`.
//!
//! [`EventSink::send`] runs on the health-engine thread and must never block,
//! but a pipe whose reader stalls (a paused `| less`, a full container log
//! pipe) blocks `write(2)`. So `send` only encodes the event and queues the
//! line; a writer thread (`gpuwatch-stdout`) writes and flushes. The queue is
//! bounded ([`QUEUE_CAPACITY`] lines by default): when it is full the oldest
//! line is dropped, counted `stage="stdout", outcome="dropped"`, like a line
//! the writer failed to write (closed stdout). [`EventSink::flush`] waits up to
//! its timeout for the queue to empty.

use gpuwatch_core::{EventSink, Outcome, Registry, Stage};
use gpuwatch_proto::FaultEvent;
use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Lines the sink holds while the writer is behind.
pub const QUEUE_CAPACITY: usize = 4096;

/// Writes each event as one JSON line to a writer (stdout by default), from a
/// writer thread of its own.
pub struct JsonLinesSink {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when lines arrive or the sink closes (writer waits) and when
    /// the writer finished a batch (flush waits).
    changed: Condvar,
    out: Mutex<Box<dyn Write + Send>>,
    registry: Arc<Registry>,
    capacity: usize,
}

#[derive(Default)]
struct Queue {
    lines: VecDeque<String>,
    /// The writer took lines and has not finished writing them.
    writing: bool,
    closed: bool,
    /// No writer thread could be started: `send` writes itself.
    inline: bool,
}

impl std::fmt::Debug for JsonLinesSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLinesSink")
            .field("capacity", &self.shared.capacity)
            .finish_non_exhaustive()
    }
}

impl JsonLinesSink {
    /// A sink writing to the process's stdout.
    pub fn stdout(registry: Arc<Registry>) -> JsonLinesSink {
        JsonLinesSink::new(Box::new(std::io::stdout()), registry)
    }

    /// A sink writing to `out`.
    pub fn new(out: Box<dyn Write + Send>, registry: Arc<Registry>) -> JsonLinesSink {
        JsonLinesSink::with_capacity(out, registry, QUEUE_CAPACITY)
    }

    /// A sink writing to `out` that queues at most `capacity` lines.
    pub fn with_capacity(
        out: Box<dyn Write + Send>,
        registry: Arc<Registry>,
        capacity: usize,
    ) -> JsonLinesSink {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            out: Mutex::new(out),
            registry,
            capacity: capacity.max(1),
        });
        let writer = Arc::clone(&shared);
        if let Err(e) = std::thread::Builder::new()
            .name("gpuwatch-stdout".into())
            .spawn(move || writer.run())
        {
            tracing::error!(error = %e, "Cannot start the stdout writer thread; writing on the engine thread.");
            shared.lock_queue().inline = true;
        }
        JsonLinesSink { shared }
    }
}

impl Shared {
    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `lines` and flushes once; counts each line.
    fn write(&self, lines: &mut VecDeque<String>) {
        let n = lines.len() as u64;
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let mut written = 0u64;
        let mut failed = false;
        for line in lines.drain(..) {
            // A closed stdout (EPIPE) loses the line; count it instead of
            // failing the agent.
            if failed || writeln!(out, "{line}").is_err() {
                failed = true;
                continue;
            }
            written += 1;
        }
        if !failed && out.flush().is_err() {
            // Whatever was buffered did not make it out.
            written = 0;
        }
        drop(out);
        self.registry
            .count_events(Stage::Stdout, Outcome::Emitted, written);
        self.registry
            .count_events(Stage::Stdout, Outcome::Dropped, n - written);
    }

    /// The writer thread: takes everything queued, writes it, repeats; ends
    /// when the sink is dropped and the queue is empty.
    fn run(&self) {
        let mut batch = VecDeque::new();
        loop {
            {
                let mut q = self.lock_queue();
                q.writing = false;
                self.changed.notify_all();
                while q.lines.is_empty() && !q.closed {
                    q = self.changed.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                if q.lines.is_empty() {
                    return;
                }
                std::mem::swap(&mut batch, &mut q.lines);
                q.writing = true;
            }
            self.write(&mut batch);
        }
    }
}

impl EventSink for JsonLinesSink {
    fn name(&self) -> &'static str {
        "stdout"
    }

    fn send(&self, event: &FaultEvent) {
        let line = match serde_json::to_string(event) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "Cannot encode fault event as JSON.");
                self.shared
                    .registry
                    .count_events(Stage::Stdout, Outcome::Dropped, 1);
                return;
            }
        };
        let mut q = self.shared.lock_queue();
        if q.inline {
            drop(q);
            self.shared.write(&mut VecDeque::from([line]));
            return;
        }
        if q.lines.len() >= self.shared.capacity {
            q.lines.pop_front();
            self.shared
                .registry
                .count_events(Stage::Stdout, Outcome::Dropped, 1);
        }
        q.lines.push_back(line);
        drop(q);
        self.shared.changed.notify_all();
    }

    /// Waits until every queued line is written, at most `timeout`.
    fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.lock_queue();
        while !q.inline && (!q.lines.is_empty() || q.writing) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    queued = q.lines.len(),
                    "The stdout sink did not finish writing in time."
                );
                return;
            }
            q = self
                .shared
                .changed
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for JsonLinesSink {
    /// Lets the writer thread finish what is queued and end. It is not joined:
    /// a blocked stdout must not block whoever drops the sink.
    fn drop(&mut self) {
        self.shared.lock_queue().closed = true;
        self.shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        String::from_utf8(buf.0.lock().unwrap().clone())
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
        while !sink.shared.lock_queue().writing {
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
