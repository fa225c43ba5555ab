//! What the engine knows about its own sight: the monitoring inputs (the
//! kernel log reader, NVML, and the inputs that cover only a part: the NIC
//! poller, the placement sources, the Node writer) and whether each is
//! available, the reader's
//! first pass over the ring, the latest device validation, and NVML
//! samples that went stale. A monitoring problem makes health `unknown`,
//! never a hardware verdict.

use super::model::Gpu;
use crate::msg::MonitorInput;
use gpuwatch_proto::{InputState, InputStatus as InputStatusProto, ValidationReport};
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::{info, warn};

/// State of one monitoring input.
#[derive(Clone, Debug, Default)]
struct InputStatus {
    /// [`InputState::NotReported`] until the input reported.
    state: InputState,
    message: String,
}

impl InputStatus {
    /// Records a report; true when it changed the state or the message.
    fn report(&mut self, ok: bool, message: String) -> bool {
        let state = if ok { InputState::Up } else { InputState::Down };
        let changed = self.state != state || self.message != message;
        self.state = state;
        self.message = message;
        changed
    }
}

/// The monitoring inputs and what they reported.
#[derive(Debug, Default)]
pub(super) struct Monitors {
    kmsg: InputStatus,
    nvml: InputStatus,
    /// The inputs that cover a part of the health only, once reported.
    parts: BTreeMap<MonitorInput, InputStatus>,
    /// The kmsg source finished its first pass over the ring.
    kmsg_caught_up: bool,
    validation: Option<ValidationReport>,
    /// A GPU whose latest NVML sample is older than this (nanoseconds) is
    /// Unknown and does not validate: NVML stopped answering for it (a hung
    /// call) even if no error said so. `None`: not checked.
    sample_max_age: Option<u64>,
    /// GPUs whose sample was stale at the last check (the health is rebuilt
    /// when this changes).
    stale_samples: usize,
}

impl Monitors {
    /// Records an input's status; true when it changed. A change of
    /// availability is logged.
    pub(super) fn set(&mut self, input: MonitorInput, ok: bool, message: String) -> bool {
        let m = match input {
            MonitorInput::Kmsg => &mut self.kmsg,
            MonitorInput::Nvml => &mut self.nvml,
            // Logged by whoever saw the change (the watchdog, the source).
            MonitorInput::Network
            | MonitorInput::PodResources
            | MonitorInput::PodListing
            | MonitorInput::KubeWriter => {
                return self.parts.entry(input).or_default().report(ok, message);
            }
        };
        let was = m.state;
        if !m.report(ok, message) {
            return false;
        }
        if m.state != was {
            if ok {
                info!(input = input.as_str(), "Monitoring input is available.");
            } else {
                warn!(input = input.as_str(), message = %m.message, "Monitoring input is unavailable; GPUs it covers are reported as unknown, not faulty.");
            }
        }
        true
    }

    /// The message `input` reported last, if it covers a part only and
    /// reported.
    pub(super) fn part_message(&self, input: MonitorInput) -> Option<&str> {
        self.parts.get(&input).map(|m| m.message.as_str())
    }

    /// Every input that reported, in one shape: kmsg and NVML always
    /// ([`InputState::NotReported`] until they report), then the others in a
    /// fixed order.
    pub(super) fn inputs(&self) -> Vec<InputStatusProto> {
        let one = |input: MonitorInput, m: &InputStatus| {
            let mut s = InputStatusProto {
                input: input.as_str().to_owned(),
                message: m.message.clone(),
                ..Default::default()
            };
            s.set_state(m.state);
            s
        };
        let mut out = vec![
            one(MonitorInput::Kmsg, &self.kmsg),
            one(MonitorInput::Nvml, &self.nvml),
        ];
        out.extend(self.parts.iter().map(|(i, m)| one(*i, m)));
        out
    }

    /// NVML reported itself available.
    pub(super) fn nvml_ok(&self) -> bool {
        self.nvml.state == InputState::Up
    }

    /// NVML reported itself unavailable.
    pub(super) fn nvml_down(&self) -> bool {
        self.nvml.state == InputState::Down
    }

    /// The kernel log reader reported a failure.
    pub(super) fn kmsg_down(&self) -> bool {
        self.kmsg.state == InputState::Down
    }

    /// The kernel log reader finished its first pass over the ring; true
    /// the first time (logged).
    pub(super) fn caught_up(&mut self) -> bool {
        if self.kmsg_caught_up {
            return false;
        }
        info!("The kernel log reader caught up with the ring buffer.");
        self.kmsg_caught_up = true;
        true
    }

    pub(super) fn kmsg_caught_up(&self) -> bool {
        self.kmsg_caught_up
    }

    /// Stores a validation report; true when the result changed (logged). A
    /// report that differs from the stored one only in its time is the same
    /// result (the stored one, with the time the result was first obtained,
    /// is kept): re-validating on every published health must not
    /// republish the health and loop.
    pub(super) fn set_validation(&mut self, report: ValidationReport) -> bool {
        let same = self.validation.as_ref().is_some_and(|v| {
            v.passed == report.passed
                && v.complete == report.complete
                && v.checks == report.checks
                && v.boot_id == report.boot_id
        });
        if same {
            return false;
        }
        info!(
            passed = report.passed,
            complete = report.complete,
            checks = report.checks.len(),
            "Device validation result changed."
        );
        self.validation = Some(report);
        true
    }

    pub(super) fn validation(&self) -> Option<&ValidationReport> {
        self.validation.as_ref()
    }

    /// A GPU whose latest sample is older than `max_age` is Unknown and
    /// does not validate until a fresh sample arrives.
    pub(super) fn set_sample_max_age(&mut self, max_age: Duration) {
        self.sample_max_age = Some(u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Whether GPU `g`'s latest sample is recent enough to judge it by.
    pub(super) fn sample_fresh(&self, g: &Gpu, now: u64) -> bool {
        match self.sample_max_age {
            None => true,
            Some(max) => g.sample_time.is_some_and(|t| now.saturating_sub(t) <= max),
        }
    }

    /// Confirmed GPUs present in NVML whose sample is stale at `now` (none
    /// while NVML is not available: that is its own problem).
    pub(super) fn count_stale<'a>(
        &self,
        gpus: impl IntoIterator<Item = &'a Gpu>,
        now: u64,
    ) -> usize {
        if self.sample_max_age.is_none() || !self.nvml_ok() {
            return 0;
        }
        gpus.into_iter()
            .filter(|g| g.confirmed && !g.lost && !self.sample_fresh(g, now))
            .count()
    }

    /// Records how many GPUs have a stale sample now; true when that
    /// changed (a rise is logged).
    pub(super) fn update_stale(&mut self, stale: usize) -> bool {
        if stale == self.stale_samples {
            return false;
        }
        if stale > self.stale_samples {
            warn!(
                gpus = stale,
                "NVML samples are stale: NVML has not answered for these GPUs within three poll intervals; they are reported unknown."
            );
        }
        self.stale_samples = stale;
        true
    }

    /// The inputs that have not reported or reported a failure, with their
    /// messages (empty when every input is available).
    pub(super) fn detail(&self) -> String {
        let mut parts = Vec::new();
        for (name, m) in [("nvml", &self.nvml), ("kmsg", &self.kmsg)] {
            match m.state {
                InputState::NotReported => parts.push(format!("{name}: not reported yet")),
                InputState::Down => parts.push(format!("{name}: {}", m.message)),
                InputState::Up => {}
            }
        }
        parts.join("; ")
    }

    /// Why GPU health cannot be determined (the node message of an
    /// `unknown` verdict), with `stale` GPUs whose samples are stale.
    pub(super) fn why_unknown(&self, stale: usize) -> String {
        match (self.nvml.state, self.kmsg.state) {
            (InputState::Down, _) => format!(
                "NVML is unavailable ({}); GPU health cannot be determined.",
                self.nvml.message
            ),
            (_, InputState::Down) => format!(
                "The kernel log reader is unavailable ({}); GPU faults cannot be seen.",
                self.kmsg.message
            ),
            _ if stale > 0 => format!(
                "NVML has not answered for {stale} GPU(s) within three poll intervals (a hung NVML call?); their health cannot be determined."
            ),
            _ => "Waiting for the first NVML sample.".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn gpu(sample_time: Option<u64>) -> Gpu {
        let mut g = Gpu::new("0000:3b:00.0".into());
        g.confirmed = true;
        g.sample_time = sample_time;
        g
    }

    #[test]
    fn every_input_has_one_status_shape() {
        let mut m = Monitors::default();
        m.set(MonitorInput::Kmsg, true, String::new());
        assert!(m.set(
            MonitorInput::PodResources,
            false,
            "List has not returned for 31 s".into()
        ));
        assert!(!m.set(
            MonitorInput::PodResources,
            false,
            "List has not returned for 31 s".into()
        ));
        m.set(MonitorInput::Network, true, String::new());
        let got: Vec<_> = m
            .inputs()
            .into_iter()
            .map(|i| (i.input.clone(), i.state(), i.message))
            .collect();
        assert_eq!(
            got,
            vec![
                ("kmsg".into(), InputState::Up, String::new()),
                ("nvml".into(), InputState::NotReported, String::new()),
                ("network".into(), InputState::Up, String::new()),
                (
                    "pod_resources".into(),
                    InputState::Down,
                    "List has not returned for 31 s".into()
                ),
            ]
        );
        assert_eq!(
            m.part_message(MonitorInput::PodResources),
            Some("List has not returned for 31 s")
        );
        assert!(
            !m.nvml_down() && m.kmsg.state == InputState::Up,
            "a part's input touches no GPU input"
        );
    }

    #[test]
    fn a_status_counts_as_a_change_only_when_it_differs() {
        let mut m = Monitors::default();
        assert_eq!(m.detail(), "nvml: not reported yet; kmsg: not reported yet");
        assert!(m.set(MonitorInput::Nvml, false, "no driver".into()));
        assert!(!m.set(MonitorInput::Nvml, false, "no driver".into()));
        assert!(m.nvml_down() && !m.nvml_ok());
        assert!(m.set(MonitorInput::Nvml, false, "still no driver".into()));
        assert!(m.set(MonitorInput::Kmsg, true, String::new()));
        assert!(m.kmsg.state == InputState::Up && !m.kmsg_down());
        assert_eq!(m.detail(), "nvml: still no driver");
        assert_eq!(
            m.why_unknown(0),
            "NVML is unavailable (still no driver); GPU health cannot be determined."
        );
        assert!(m.set(MonitorInput::Nvml, true, String::new()));
        assert_eq!(m.detail(), "");
        assert_eq!(m.why_unknown(0), "Waiting for the first NVML sample.");
    }

    #[test]
    fn the_reader_catches_up_once() {
        let mut m = Monitors::default();
        assert!(!m.kmsg_caught_up());
        assert!(m.caught_up());
        assert!(!m.caught_up());
        assert!(m.kmsg_caught_up());
    }

    #[test]
    fn a_validation_that_differs_only_in_its_time_is_the_same_result() {
        let mut m = Monitors::default();
        let report = ValidationReport {
            passed: true,
            complete: true,
            boot_id: "b".into(),
            ..Default::default()
        };
        assert!(m.set_validation(report.clone()));
        let first = m.validation().cloned();
        let later = ValidationReport {
            time_unix_nano: Some(42),
            ..report.clone()
        };
        assert!(!m.set_validation(later));
        assert_eq!(m.validation().cloned(), first, "the first time is kept");
        assert!(m.set_validation(ValidationReport {
            passed: false,
            ..report
        }));
    }

    #[test]
    fn samples_go_stale_only_with_a_max_age_and_nvml_available() {
        let mut m = Monitors::default();
        let gpus = [gpu(Some(10 * SEC)), gpu(Some(100 * SEC)), gpu(None)];
        let now = 101 * SEC;
        assert!(m.sample_fresh(&gpus[2], now), "not checked");
        assert_eq!(m.count_stale(&gpus, now), 0);
        m.set_sample_max_age(Duration::from_secs(30));
        assert!(!m.sample_fresh(&gpus[0], now));
        assert!(m.sample_fresh(&gpus[1], now));
        assert!(!m.sample_fresh(&gpus[2], now), "never sampled");
        assert_eq!(m.count_stale(&gpus, now), 0, "NVML not available");
        m.set(MonitorInput::Nvml, true, String::new());
        assert_eq!(m.count_stale(&gpus, now), 2);
        assert!(m.update_stale(2));
        assert!(!m.update_stale(2));
        assert_eq!(
            m.why_unknown(2),
            "NVML has not answered for 2 GPU(s) within three poll intervals (a hung NVML call?); their health cannot be determined."
        );
        assert!(m.update_stale(0));
    }
}
