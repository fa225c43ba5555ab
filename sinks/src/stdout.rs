//! The stdout JSON-lines sink: one `FaultEvent` JSON object per line, for
//! debugging, the demo and `--sink stdout`.

use crate::{EventSink, Outcome, Registry, Stage};
use gpuwatch_proto::FaultEvent;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Writes each event as one JSON line to a writer (stdout by default).
pub struct JsonLinesSink {
    out: Mutex<Box<dyn Write + Send>>,
    registry: Arc<Registry>,
}

impl std::fmt::Debug for JsonLinesSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLinesSink").finish_non_exhaustive()
    }
}

impl JsonLinesSink {
    /// A sink writing to the process's stdout.
    pub fn stdout(registry: Arc<Registry>) -> JsonLinesSink {
        JsonLinesSink::new(Box::new(std::io::stdout()), registry)
    }

    /// A sink writing to `out`.
    pub fn new(out: Box<dyn Write + Send>, registry: Arc<Registry>) -> JsonLinesSink {
        JsonLinesSink {
            out: Mutex::new(out),
            registry,
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
                self.registry
                    .count_events(Stage::Stdout, Outcome::Dropped, 1);
                return;
            }
        };
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // A closed stdout (EPIPE) loses the line; count it instead of failing the agent.
        match writeln!(out, "{line}").and_then(|()| out.flush()) {
            Ok(()) => self
                .registry
                .count_events(Stage::Stdout, Outcome::Emitted, 1),
            Err(_) => self
                .registry
                .count_events(Stage::Stdout, Outcome::Dropped, 1),
        }
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
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["code"], 79);
        assert_eq!(reg.events(Stage::Stdout, Outcome::Emitted), 2);
    }
}
