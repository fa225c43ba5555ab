//! What a run did, printed on stderr at exit with `--exit-at-eof`
//! (`gpuwatch-summary {...}`).

use super::inputs::InputsSummary;
use crate::pipeline::StopReason;
use gpuwatch_core::Registry;
use gpuwatch_core::registry::Tally;

/// What a run did (printed at exit with `--exit-at-eof`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunSummary {
    /// Why the agent stopped.
    pub stopped_by: &'static str,
    /// Kernel log records processed.
    pub records: u64,
    /// Fault events the kmsg source produced.
    pub kmsg_events: u64,
    /// Seconds from the kmsg source's start to its end.
    pub kmsg_seconds: f64,
    /// records / kmsg_seconds.
    pub records_per_sec: f64,
    /// Records lost to ring overruns / sequence gaps.
    pub records_lost: u64,
    /// Records that did not parse.
    pub records_malformed: u64,
    /// Events the engine emitted to sinks.
    pub engine_events: u64,
    /// Pipeline latency p50 (record read → emitted by the engine), microseconds.
    pub latency_p50_us: Option<f64>,
    /// Pipeline latency p99, microseconds.
    pub latency_p99_us: Option<f64>,
    /// Pipeline latency max, microseconds.
    pub latency_max_us: Option<f64>,
    /// Peak resident set size (VmHWM), KiB.
    pub peak_rss_kib: Option<u64>,
}

impl RunSummary {
    /// The summary of a run that stopped for `reason`.
    pub(super) fn new(
        reason: StopReason,
        inputs: &InputsSummary,
        registry: &Registry,
    ) -> RunSummary {
        let micros = |q: f64| {
            registry
                .latency_quantile_nanos(q)
                .map(|n| n as f64 / 1000.0)
        };
        let kmsg_seconds = inputs.kmsg_seconds;
        RunSummary {
            stopped_by: match reason {
                StopReason::Signal => "signal",
                StopReason::InputEnded => "end_of_input",
                StopReason::ThreadExited => "thread_exited",
            },
            records: inputs.kmsg.records,
            kmsg_events: inputs.kmsg.events,
            kmsg_seconds,
            records_per_sec: if kmsg_seconds > 0.0 {
                inputs.kmsg.records as f64 / kmsg_seconds
            } else {
                0.0
            },
            records_lost: registry.tally(Tally::KmsgLost),
            records_malformed: registry.tally(Tally::KmsgMalformed),
            engine_events: registry.events(
                gpuwatch_core::Stage::Engine,
                gpuwatch_core::Outcome::Emitted,
            ),
            latency_p50_us: micros(0.5),
            latency_p99_us: micros(0.99),
            latency_max_us: micros(1.0),
            peak_rss_kib: peak_rss_kib(),
        }
    }
}

/// VmHWM of this process from `/proc/self/status`, KiB.
pub(super) fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_is_read() {
        assert!(peak_rss_kib().unwrap() > 0);
    }
}
