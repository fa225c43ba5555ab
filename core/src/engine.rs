//! The health engine: one thread that owns all health state.
//!
//! Inputs ([`Input`]) arrive from the kmsg reader, the NVML poller and event
//! thread, and the validator. The engine
//!
//! - joins kernel-log events (which carry only a PCI address) to the GPU identity
//!   NVML reported for that address (`gpu_index`, `gpu_uuid`); at startup,
//!   kernel-log GPU faults for an address NVML has not reported yet wait for the
//!   first complete NVML poll (at most `nvml_join_grace_secs`, not at all once
//!   NVML reports itself unavailable or disabled), so ring faults read before
//!   the first sample carry the GPU identity too;
//! - merges the same occurrence reported by two sources (kernel log and NVML
//!   event: same GPU, kind and code within `cross_source_window_ms`) before
//!   anything is counted, keeping the kernel log's text (pid, process);
//! - classifies unclassified events with the [`Policy`] and applies context rules:
//!   XID 63/64 defer to NVML's row-remap state, count-within-window thresholds,
//!   recurrence across boots (a reset/reboot-class fault that recurs after N
//!   reboots — seen in N + 1 distinct boots; N is the policy's
//!   `recurrence_reboots`, default 2 — escalates to `inspect_hardware`);
//! - trusts NVML's row-remap state for an XID 63/64 only from a sample at least as
//!   new as the XID: before one arrives the policy action stands (the reason says
//!   NVML has not confirmed yet), and the first such sample re-evaluates the
//!   active fault — up (pending → `reset_gpu`, failure → `inspect_hardware`) or
//!   down (neither → `ignore`) — logged and published as a reclassification
//!   event (attribute `reclassified_from`);
//! - derives faults from consecutive NVML samples of the same GPU;
//! - coalesces storms (same GPU + kind + code within `dedup_window_secs` of the last
//!   emitted event → `count + 1`, not re-emitted). A repeat that cannot change
//!   the fault is checked first and only bumps counters; the registry's fault
//!   counters get the coalesced occurrences in bulk (each tick and before each
//!   health publication). A fault from an earlier boot that recurs is always
//!   published;
//! - keeps the active faults and computes the GPU and node verdicts;
//! - clears faults by explicit, logged rules (below) and persists its state in
//!   `state_dir/health.json`.
//!
//! # Which faults are GPU faults
//!
//! An event is attached to a GPU when its PCI address (or UUID) is one NVML
//! reported. Kinds that can only come from a GPU (XID, fallen off the bus, ECC,
//! row remap, ...) create a GPU entry for an unknown PCI address (identity filled
//! in once NVML reports it). Everything else (MCE, an NVSwitch SXid, AER on a root
//! port) is a node-level fault, with its PCI address in the message.
//!
//! # Recovery: when an active fault clears
//!
//! Every clear is logged with its reason; recurrence history is kept regardless.
//!
//! - `ignore`, `restart_app`, `investigate`: after `active_window_secs` without a new
//!   occurrence; `ignore` and `restart_app` also after a reboot (the application
//!   restarted with the node). Faults raised from an NVML condition (thermal
//!   slowdown, link below max, NVLink down, ...) instead clear once the condition
//!   has been absent in `condition_clear_samples` consecutive NVML samples.
//! - `reset_gpu`: when (1) the GPU validates (latest sample clean: no pending or
//!   failed row remap, no pending page retirement, no uncorrectable ECC rise since
//!   the last counter reset, PCIe link at max width/gen, recovery action none), and
//!   (2) evidence of a GPU reset was observed after the fault's last occurrence (the
//!   GPU re-appeared after being lost, volatile ECC counters went down, the recovery
//!   action returned to none, the row-remap pending flag cleared, the PCIe link
//!   returned to max) or the node rebooted since, and (3) the fault did not recur for
//!   `reset_clear_quiet_secs`. An NVML-condition fault additionally needs its
//!   condition gone.
//! - `reboot_node`: after a reboot (new boot id), once the GPU validates in the new
//!   boot and the fault has not recurred in it.
//! - `inspect_hardware`: after a reboot in which the GPU has validated continuously
//!   for `inspect_clear_quiet_secs` without the fault recurring, or at once when the
//!   GPU at that PCI address reports a different UUID (hardware replaced).
//! - Node-level faults (no GPU to validate): `ignore`..`investigate` as above; the
//!   others after a reboot plus `reset_clear_quiet_secs` (reset/reboot class) or
//!   `inspect_clear_quiet_secs` (inspect) without recurrence.
//! - A fault from an earlier boot on a GPU that a complete NVML poll of this
//!   boot no longer enumerates (neither its PCI address nor its UUID): converted
//!   to `investigate` with the reason "GPU no longer present after reboot:
//!   hardware removed or replaced, or not detected" (then clears as an
//!   `investigate` fault). With its UUID at another PCI address (bus
//!   renumbered) the fault moves there instead.
//! - [`Engine::clear`] (`Input::Clear`, `POST /v1/clear`, `gpuwatch clear`): an
//!   operator clear, with the operator's reason.
//!
//! # NVML is a monitor, not a verdict
//!
//! Only a complete poll (every enumerated GPU read, each with its UUID and PCI
//! address) can declare a GPU lost; a poll with no GPU at all makes NVML
//! unavailable (verdict `unknown`, no `gpu_lost`). While NVML is unavailable
//! the last samples are not published (exporters would export stale gauges).
//!
//! # State file
//!
//! A corrupt file is moved aside and a fresh one written. A file that exists but
//! cannot be read (EACCES, EIO) is never overwritten: the engine runs without
//! persistence and counts/logs every skipped write.
//!
//! Without NVML a GPU cannot validate, so its reset/reboot/inspect faults stay
//! active until NVML reports again (or an operator clears them); the node message
//! says so.
//!
//! # Verdicts
//!
//! `unhealthy` for an active reset/reboot/inspect fault (from any source, even
//! while NVML is down: an XID 79 in the kernel log is real), else `unknown` while
//! NVML is down or has not reported yet (or the kernel log reader reported a
//! failure), else `degraded` for active restart_app/investigate faults, else
//! `healthy`. A monitoring failure never produces a hardware verdict.

mod derive;
mod health;
mod model;
mod persist;
pub use persist::{LEGACY_CURSOR_FILE, preset_kmsg_position};
mod recovery;
mod writer;
use writer::StateWriter;

use crate::clock::Clock;
use crate::msg::{Input, KmsgPosition, MonitorInput};
use crate::statefile::StateFileError;
use crate::{EventSink, Outcome, Registry, Shutdown, Stage};
use crossbeam_channel::RecvTimeoutError;
use derive::secs;
use gpuwatch_proto::{Action, FaultEvent, FaultKind, NodeHealth, ShortName, ValidationReport};
use model::{
    Fault, FaultKey, Gpu, History, HistoryKey, fallback_action, is_gpu_kind, pci_identity,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};
use xid_parser::{ContextWindow, Policy};

pub(crate) const NANOS: u64 = 1_000_000_000;

/// Name of the engine's state file inside `state_dir`.
pub const STATE_FILE: &str = "health.json";

/// Health engine settings (`[engine]`).
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// A repeat of an active fault (same GPU, kind and code) within this many seconds
    /// of the last emitted event is coalesced (`count + 1`) instead of re-emitted.
    pub dedup_window_secs: u64,
    /// `ignore` / `restart_app` / `investigate` faults clear after this many seconds
    /// without a new occurrence.
    pub active_window_secs: u64,
    /// Seconds without recurrence (after reset evidence) before a `reset_gpu` fault
    /// clears.
    pub reset_clear_quiet_secs: u64,
    /// A non-isolating fault raised from an NVML condition (thermal slowdown, PCIe
    /// link below max, NVLink down) clears once the condition has been absent in
    /// this many consecutive NVML samples.
    pub condition_clear_samples: u32,
    /// Seconds the GPU must validate without recurrence after a reboot before an
    /// `inspect_hardware` fault clears.
    pub inspect_clear_quiet_secs: u64,
    /// Engine tick (recovery evaluation when no input arrives), milliseconds.
    pub tick_interval_ms: u64,
    /// Minimum interval between state-file writes, milliseconds.
    pub persist_interval_ms: u64,
    /// Treat a PCIe link generation below the maximum as a fault. Off by default:
    /// GPUs lower the link generation (down to Gen1) when idle to save power, so
    /// the check would flag healthy idle GPUs. Link width below the maximum is
    /// always a fault.
    pub pcie_link_gen_check: bool,
    /// The same fault (GPU, kind, code) reported by two different sources (the
    /// kernel log and an NVML event) within this many milliseconds is one
    /// occurrence: counted once, the kernel-log text (pid, process) kept.
    pub cross_source_window_ms: u64,
    /// At startup, kernel-log GPU faults whose PCI address NVML has not reported
    /// yet wait up to this many seconds for the first complete NVML poll, so they
    /// are published with the GPU's index and UUID. Released at once when NVML
    /// reports itself unavailable or disabled. 0 disables the wait.
    pub nvml_join_grace_secs: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            dedup_window_secs: 60,
            active_window_secs: 3600,
            reset_clear_quiet_secs: 60,
            condition_clear_samples: 3,
            inspect_clear_quiet_secs: 3600,
            tick_interval_ms: 1000,
            persist_interval_ms: 1000,
            pcie_link_gen_check: false,
            cross_source_window_ms: 2000,
            nvml_join_grace_secs: 5,
        }
    }
}

impl EngineConfig {
    /// Every problem with the settings (empty when valid); keys relative to `[engine]`.
    pub fn validate(&self) -> Vec<String> {
        let mut errs = Vec::new();
        if self.dedup_window_secs == 0 {
            errs.push("dedup_window_secs: must be at least 1".to_string());
        }
        if self.active_window_secs == 0 {
            errs.push("active_window_secs: must be at least 1".to_string());
        }
        if self.dedup_window_secs > self.active_window_secs {
            errs.push(format!(
                "dedup_window_secs: {} is longer than active_window_secs ({}); a fault would expire while its repeats are still coalesced",
                self.dedup_window_secs, self.active_window_secs
            ));
        }
        if !(10..=60_000).contains(&self.tick_interval_ms) {
            errs.push(format!(
                "tick_interval_ms: {} is outside 10..=60000",
                self.tick_interval_ms
            ));
        }
        if !(100..=600_000).contains(&self.persist_interval_ms) {
            errs.push(format!(
                "persist_interval_ms: {} is outside 100..=600000",
                self.persist_interval_ms
            ));
        }
        if !(1..=1000).contains(&self.condition_clear_samples) {
            errs.push(format!(
                "condition_clear_samples: {} is outside 1..=1000",
                self.condition_clear_samples
            ));
        }
        if self.cross_source_window_ms > 60_000 {
            errs.push(format!(
                "cross_source_window_ms: {} is longer than 60000",
                self.cross_source_window_ms
            ));
        }
        if self.nvml_join_grace_secs > 300 {
            errs.push(format!(
                "nvml_join_grace_secs: {} is longer than 300",
                self.nvml_join_grace_secs
            ));
        }
        for (key, v) in [
            ("reset_clear_quiet_secs", self.reset_clear_quiet_secs),
            ("inspect_clear_quiet_secs", self.inspect_clear_quiet_secs),
        ] {
            if v > 30 * 86_400 {
                errs.push(format!("{key}: {v} is longer than 30 days"));
            }
        }
        errs
    }
}

/// The boot the engine runs in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootInfo {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// Wall-clock time of the boot, Unix epoch nanoseconds (0 when unknown).
    pub boot_time_unix_nano: u64,
}

/// State of one monitoring input.
#[derive(Clone, Debug, Default)]
struct Monitor {
    /// `None` until the input reported.
    ok: Option<bool>,
    message: String,
}

/// The health engine. See the module documentation for the rules.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    policy: Arc<Policy>,
    state_path: Option<PathBuf>,
    boot: BootInfo,
    node_name: String,
    registry: Arc<Registry>,
    clock: Arc<dyn Clock>,
    /// GPUs by normalised PCI address.
    gpus: BTreeMap<String, Gpu>,
    /// Node-level faults by (PCI address, fault).
    node_faults: BTreeMap<(String, FaultKey), Fault>,
    /// Recent XIDs per GPU for the policy's context rules.
    ctx: ContextWindow,
    history: BTreeMap<HistoryKey, History>,
    /// Boots the engine ran in (most recent last, bounded).
    boots: VecDeque<String>,
    /// Count-within-window occurrences by (device identity, XID).
    thresholds: HashMap<(String, u32), VecDeque<u64>>,
    kmsg: Monitor,
    nvml: Monitor,
    validation: Option<ValidationReport>,
    /// The kmsg source finished its first pass over the ring.
    kmsg_caught_up: bool,
    /// When the engine started (the NVML join grace counts from here).
    started_at: u64,
    /// The startup join grace is over (first complete NVML poll, NVML
    /// unavailable, or `nvml_join_grace_secs` passed).
    join_grace_over: bool,
    /// Kernel-log events held for the join grace, in arrival order.
    held: Vec<(FaultEvent, Option<Instant>)>,
    /// Some fault has coalesced occurrences not yet counted in the registry.
    unrecorded: bool,
    /// Why the state file must not be written (it exists but could not be read
    /// at startup; overwriting it would lose its faults and history).
    persist_blocked: Option<String>,
    /// When this boot started (node-level quiet periods count from here).
    boot_start: u64,
    /// State changed since the last successful persist.
    dirty: bool,
    /// Time of the last health change.
    updated_at: u64,
    cache: RefCell<Option<Arc<NodeHealth>>>,
    /// The kernel-log position the state accounts for (see
    /// [`Input::KmsgProgress`]); persisted with the faults in one write.
    kmsg_position: Option<KmsgPosition>,
    /// A position reported while events were held for the join grace: it
    /// applies once they are.
    kmsg_position_held: Option<KmsgPosition>,
    /// The engine tracks the kernel-log position (a device reader feeds it):
    /// the state is then only written at a settled point.
    track_kmsg: bool,
    /// A kernel-log fault was handled after the last position: the state
    /// holds effects of records beyond `kmsg_position`, so writing it now
    /// would count them twice after a crash.
    kmsg_unsettled: bool,
    /// Why the state file is not usable or not written (startup problem or
    /// the latest write error); shown in the health's monitor status.
    state_problem: Option<String>,
    /// Reads the state file but never writes, renames or removes anything.
    read_only: bool,
    /// A GPU whose latest NVML sample is older than this (nanoseconds) is
    /// Unknown and does not validate: NVML stopped answering for it (a hung
    /// call) even if no error said so. `None`: not checked.
    sample_max_age: Option<u64>,
    /// GPUs whose sample was stale at the last check (the health is rebuilt
    /// when this changes).
    stale_samples: usize,
    /// Where [`run_engine`] records its progress (Unix seconds of the latest
    /// loop pass), for the liveness check.
    heartbeat: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// A version 1 cursor file is to be removed after the next write.
    legacy_cursor_pending: bool,
    /// Consecutive failed state writes.
    write_failures: u32,
    /// Delays between retries of a failed state write.
    write_backoff: crate::retry::Backoff,
    /// No state write is attempted before this time (backoff after failures).
    retry_write_at: Option<Instant>,
    /// Log activations after the events went to the sinks
    /// ([`run_engine`]): a log line (formatting, a write to stderr) must not
    /// delay the event it reports.
    defer_activation_logs: bool,
    /// Activations not logged yet (only while deferred; logged after every
    /// input).
    activations: Vec<Activation>,
    /// GPU faults dropped because the engine already tracks as many GPUs as
    /// a node can have; logged once per interval.
    over_capacity: OverCapacity,
}

/// GPUs whose identity NVML has not confirmed that the engine tracks at most
/// (kernel-log addresses). An HGX node has 8 GPUs, the largest nodes 16;
/// anything far beyond is a kernel log naming addresses no node has.
pub const MAX_UNCONFIRMED_GPUS: usize = 64;
/// Node-level faults (MCE, NVSwitch, AER on other devices) tracked at most.
pub const MAX_NODE_FAULTS: usize = 256;
/// Count-within-window threshold windows (device, XID) tracked at most.
const MAX_THRESHOLD_KEYS: usize = 1024;

/// Events dropped because the engine was at capacity, reported once per
/// interval rather than once per event.
#[derive(Debug, Default)]
struct OverCapacity {
    /// Occurrences dropped since the last report.
    dropped: u64,
    /// One address refused since the last report.
    example: String,
    last_report: Option<Instant>,
}

impl OverCapacity {
    /// How often a capacity problem is logged at most.
    const REPORT_EVERY: Duration = Duration::from_secs(10);

    fn note(&mut self, occurrences: u64, pci: &str) {
        self.dropped = self.dropped.saturating_add(occurrences);
        if self.example.is_empty() {
            self.example = pci.to_string();
        }
        if self
            .last_report
            .is_none_or(|t| t.elapsed() >= Self::REPORT_EVERY)
        {
            self.report();
        }
    }

    fn report(&mut self) {
        if self.dropped == 0 {
            return;
        }
        warn!(
            dropped = self.dropped,
            example_pci = %self.example,
            max_unconfirmed_gpus = MAX_UNCONFIRMED_GPUS,
            max_node_faults = MAX_NODE_FAULTS,
            "The kernel log names more GPUs or devices than a node can have; less severe faults beyond the engine's bounds were dropped (reset/reboot/inspect-class faults are kept)."
        );
        self.dropped = 0;
        self.example.clear();
        self.last_report = Some(Instant::now());
    }
}

impl Engine {
    /// Creates the engine and loads `state_dir/health.json` when there is one. A
    /// corrupt or unreadable file is logged, kept aside, and the engine starts fresh.
    pub fn new(
        cfg: EngineConfig,
        policy: Arc<Policy>,
        state_dir: Option<PathBuf>,
        boot: BootInfo,
        node_name: String,
        registry: Arc<Registry>,
        clock: Arc<dyn Clock>,
    ) -> Engine {
        let now = clock.now_unix_nanos();
        let boot_start = if boot.boot_time_unix_nano > 0 && boot.boot_time_unix_nano <= now {
            boot.boot_time_unix_nano
        } else {
            now
        };
        let cfg_persist = cfg.persist_interval_ms;
        let mut engine = Engine {
            cfg,
            policy,
            state_path: state_dir.map(|d| d.join(STATE_FILE)),
            boot,
            node_name,
            registry,
            clock,
            gpus: BTreeMap::new(),
            node_faults: BTreeMap::new(),
            ctx: ContextWindow::new(),
            history: BTreeMap::new(),
            boots: VecDeque::new(),
            thresholds: HashMap::new(),
            kmsg: Monitor::default(),
            nvml: Monitor::default(),
            validation: None,
            kmsg_caught_up: false,
            started_at: now,
            join_grace_over: false,
            held: Vec::new(),
            unrecorded: false,
            persist_blocked: None,
            boot_start,
            dirty: false,
            updated_at: now,
            cache: RefCell::new(None),
            kmsg_position: None,
            kmsg_position_held: None,
            track_kmsg: false,
            kmsg_unsettled: false,
            state_problem: None,
            read_only: false,
            sample_max_age: None,
            stale_samples: 0,
            heartbeat: None,
            legacy_cursor_pending: false,
            write_failures: 0,
            write_backoff: write_backoff(&cfg_persist),
            retry_write_at: None,
            defer_activation_logs: false,
            activations: Vec::new(),
            over_capacity: OverCapacity::default(),
        };
        engine.load();
        engine.note_boot();
        engine
    }

    /// Like [`Engine::new`], but the state in `state_dir` is only read: a
    /// problem with it is reported, not moved aside, and nothing is ever
    /// written (for `gpuwatch validate` beside a running agent, which owns the
    /// file).
    #[allow(clippy::too_many_arguments)]
    pub fn new_read_only(
        cfg: EngineConfig,
        policy: Arc<Policy>,
        state_dir: PathBuf,
        boot: BootInfo,
        node_name: String,
        registry: Arc<Registry>,
        clock: Arc<dyn Clock>,
    ) -> Engine {
        let mut engine = Engine::new(cfg, policy, None, boot, node_name, registry, clock);
        engine.state_path = Some(state_dir.join(STATE_FILE));
        engine.read_only = true;
        engine.load();
        engine.note_boot();
        engine.persist_blocked = Some("read-only".into());
        engine
    }

    fn note_boot(&mut self) {
        let engine = self;
        if engine.boots.back() != Some(&engine.boot.boot_id) {
            engine.boots.push_back(engine.boot.boot_id.clone());
            while engine.boots.len() > model::HISTORY_BOOTS {
                engine.boots.pop_front();
            }
            engine.dirty = true;
        }
    }

    /// Applies one input; returns the events to publish (classified, joined to GPU
    /// identity, coalesced: a repeat inside the dedup window of an active fault bumps
    /// its count and is not returned again).
    pub fn handle(&mut self, input: Input) -> Vec<FaultEvent> {
        match input {
            Input::Fault { event, read_at } => {
                if self.track_kmsg && event.source() == gpuwatch_proto::Source::Kmsg {
                    self.kmsg_unsettled = true;
                }
                if self.should_hold(&event) {
                    self.held.push((event, Some(read_at)));
                    return Vec::new();
                }
                let out: Vec<FaultEvent> = self
                    .accept(event, Some(read_at), false)
                    .into_iter()
                    .collect();
                out
            }
            Input::Samples { samples, complete } => self.on_samples(samples, complete),
            Input::MonitorStatus { input, ok, message } => {
                self.set_monitor(input, ok, message);
                let mut out = Vec::new();
                if input == MonitorInput::Nvml && !ok {
                    // No NVML identity is coming: publish what waited for it.
                    self.end_join_grace("NVML is unavailable", &mut out);
                }
                out
            }
            Input::Validation(report) => {
                self.set_validation(report);
                Vec::new()
            }
            Input::KmsgCaughtUp => {
                if !self.kmsg_caught_up {
                    info!("The kernel log reader caught up with the ring buffer.");
                    self.kmsg_caught_up = true;
                    self.updated_at = self.clock.now_unix_nanos();
                    *self.cache.get_mut() = None;
                }
                Vec::new()
            }
            Input::Clear { gpu, reason, reply } => {
                let n = self.clear(gpu.as_deref(), &reason);
                if let Some(reply) = reply {
                    // The requester may have given up waiting; nothing to undo.
                    let _ = reply.try_send(n);
                }
                Vec::new()
            }
            Input::KmsgProgress(position) => {
                self.track_kmsg = true;
                if self.held.is_empty() {
                    self.set_kmsg_position(position);
                } else {
                    self.kmsg_position_held = Some(position);
                }
                Vec::new()
            }
            Input::Tick => {
                let now = self.clock.now_unix_nanos();
                let mut out = Vec::new();
                if !self.join_grace_over
                    && now.saturating_sub(self.started_at) >= secs(self.cfg.nvml_join_grace_secs)
                {
                    self.end_join_grace("the NVML join grace passed", &mut out);
                }
                self.flush_fault_counts();
                self.evaluate_recovery(now);
                let stale = self.count_stale(now);
                if stale != self.stale_samples {
                    if stale > self.stale_samples {
                        warn!(
                            gpus = stale,
                            "NVML samples are stale: NVML has not answered for these GPUs within three poll intervals; they are reported unknown."
                        );
                    }
                    self.stale_samples = stale;
                    self.updated_at = now;
                    *self.cache.get_mut() = None;
                }
                out
            }
        }
    }

    /// Stores a validation report. A report that differs from the stored one
    /// only in its time is the same result (the stored one, with the time the
    /// result was first obtained, is kept): re-validating on every published
    /// health must not republish the health and loop.
    fn set_validation(&mut self, report: ValidationReport) {
        let same = self.validation.as_ref().is_some_and(|v| {
            v.passed == report.passed
                && v.complete == report.complete
                && v.checks == report.checks
                && v.boot_id == report.boot_id
        });
        if !same {
            info!(
                passed = report.passed,
                complete = report.complete,
                checks = report.checks.len(),
                "Device validation result changed."
            );
            self.validation = Some(report);
            self.touch();
        }
    }

    /// True when a kernel-log GPU fault should wait for the first complete NVML
    /// poll (its PCI address has no NVML identity yet).
    fn should_hold(&self, ev: &FaultEvent) -> bool {
        const MAX_HELD: usize = 10_000;
        if self.join_grace_over
            || self.cfg.nvml_join_grace_secs == 0
            || self.nvml.ok == Some(false)
            || ev.source() != gpuwatch_proto::Source::Kmsg
            || !is_gpu_kind(ev.kind())
            || ev.pci_address.is_empty()
            || self.held.len() >= MAX_HELD
        {
            return false;
        }
        let known = |pci: &str| self.gpus.get(pci).is_some_and(|g| g.confirmed);
        if known(&ev.pci_address) {
            return false;
        }
        // An address that does not parse can never join: no reason to wait.
        xid_parser::normalize_pci(&ev.pci_address).is_some_and(|p| !known(&p))
    }

    /// Ends the startup join grace and publishes the held events (joined to
    /// whatever identity NVML reported by now).
    fn end_join_grace(&mut self, why: &str, out: &mut Vec<FaultEvent>) {
        if self.join_grace_over {
            return;
        }
        self.join_grace_over = true;
        if !self.held.is_empty() {
            info!(
                events = self.held.len(),
                why, "Publishing kernel-log faults held for the NVML identity join."
            );
        }
        for (ev, read_at) in std::mem::take(&mut self.held) {
            if let Some(e) = self.accept(ev, read_at, false) {
                out.push(e);
            }
        }
        if let Some(p) = self.kmsg_position_held.take() {
            self.set_kmsg_position(p);
        }
    }

    /// Records the reader's position. Every kernel-log event it covers has
    /// been handled (they precede it in the channel and none is held), so
    /// the state is settled: it may be written.
    fn set_kmsg_position(&mut self, position: KmsgPosition) {
        self.kmsg_unsettled = false;
        if self.kmsg_position.as_ref() != Some(&position) {
            self.kmsg_position = Some(position);
            self.dirty = true;
        }
    }

    /// The kernel-log position the loaded state accounts for (`None`: no
    /// state, an unusable one, or none recorded): the reader resumes after
    /// it in the same boot, and reads the whole ring otherwise.
    pub fn kmsg_position(&self) -> Option<&KmsgPosition> {
        self.kmsg_position.as_ref()
    }

    /// Tells the engine that a kernel-device reader will report its position
    /// ([`Input::KmsgProgress`]): from now on the state is written only at
    /// settled points. Called before any input by the wiring that starts
    /// such a reader.
    pub fn track_kmsg_position(&mut self) {
        self.track_kmsg = true;
    }

    /// [`run_engine`] stores the Unix seconds of each loop pass here (at least
    /// once per tick): a liveness check that sees it stand still knows the
    /// engine is stuck, not just idle.
    pub fn set_heartbeat(&mut self, heartbeat: Arc<std::sync::atomic::AtomicU64>) {
        self.heartbeat = Some(heartbeat);
    }

    /// Ages the NVML samples: a GPU whose latest sample is older than
    /// `max_age` (the wiring uses three poll intervals) is Unknown and does
    /// not validate until a fresh sample arrives.
    pub fn set_sample_max_age(&mut self, max_age: Duration) {
        self.sample_max_age = Some(u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Whether GPU `g`'s latest sample is recent enough to judge it by.
    pub(crate) fn sample_fresh(&self, g: &Gpu, now: u64) -> bool {
        match self.sample_max_age {
            None => true,
            Some(max) => g.sample_time.is_some_and(|t| now.saturating_sub(t) <= max),
        }
    }

    /// Confirmed GPUs whose sample is stale at `now`.
    fn count_stale(&self, now: u64) -> usize {
        if self.sample_max_age.is_none() || self.nvml.ok != Some(true) {
            return 0;
        }
        self.gpus
            .values()
            .filter(|g| g.confirmed && !g.lost && !self.sample_fresh(g, now))
            .count()
    }

    /// Why the state file is unusable or unwritten, if it is.
    pub fn state_problem(&self) -> Option<&str> {
        self.state_problem.as_deref()
    }

    /// Counts coalesced occurrences not yet counted in the registry (one
    /// `record_fault` per fault instead of one per repeat). Runs on every tick,
    /// before each health publication, before a fault is cleared and at shutdown.
    pub(crate) fn flush_fault_counts(&mut self) {
        if !self.unrecorded {
            return;
        }
        self.unrecorded = false;
        let registry = Arc::clone(&self.registry);
        for g in self.gpus.values_mut() {
            let (index, uuid) = if g.confirmed {
                (g.index, g.uuid.as_str())
            } else {
                (None, "")
            };
            for (k, f) in g.faults.iter_mut() {
                f.record_unrecorded(&registry, k, &g.pci, index, uuid);
            }
        }
        for ((pci, k), f) in self.node_faults.iter_mut() {
            f.record_unrecorded(&registry, k, pci, None, "");
        }
    }

    /// The current node health (cached until the state changes).
    pub fn health(&self) -> Arc<NodeHealth> {
        if let Some(h) = self.cache.borrow().as_ref() {
            return Arc::clone(h);
        }
        let h = Arc::new(self.build_health());
        *self.cache.borrow_mut() = Some(Arc::clone(&h));
        h
    }

    /// True when state changed since the last successful [`Engine::persist`].
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// True when the state is settled: when the kernel-log position is
    /// tracked, no kernel-log event beyond the position has been handled and
    /// none is held for the join grace. Only a settled state is written:
    /// the file then holds exactly the faults of the records up to its
    /// position.
    pub fn is_settled(&self) -> bool {
        !self.track_kmsg || (!self.kmsg_unsettled && self.held.is_empty())
    }

    /// When the next state write may happen: `None` when there is nothing
    /// to write (clean, no state directory, or not settled: a later input
    /// settles it), else now or the end of the backoff after a failed write.
    pub fn persist_due(&self) -> Option<Instant> {
        if !self.dirty || self.state_path.is_none() || !self.is_settled() {
            return None;
        }
        Some(self.retry_write_at.unwrap_or_else(Instant::now))
    }

    /// Writes `state_dir/health.json` atomically — faults, history and the
    /// kernel-log position in one write — when the state changed and is
    /// settled (see [`Engine::is_settled`]; an unsettled state stays dirty
    /// and is written at the next settled point). No-op without a state
    /// directory. Every attempt is counted in the registry; a failed write
    /// is retried with jittered exponential backoff (up to 30 s), the state
    /// staying in memory (bounded) meanwhile, and is reported in the health
    /// (`monitor.state_ok`).
    ///
    /// When the state file existed but could neither be read nor moved aside
    /// at startup, it is never overwritten: each skipped write is counted as
    /// a failed write and returned as an error.
    pub fn persist(&mut self) -> Result<(), StateFileError> {
        let Some((path, file)) = self.snapshot_due()? else {
            return Ok(());
        };
        let res = crate::statefile::write_json(&path, &file);
        if res.is_ok() {
            self.dirty = false;
        }
        self.write_finished(&res);
        res
    }

    /// [`Engine::persist`] on the writer thread: the snapshot is handed over
    /// and the engine goes on; the outcome comes back through
    /// [`Engine::background_writes_done`].
    fn persist_in_background(&mut self, writer: &StateWriter) -> Result<(), StateFileError> {
        let Some((path, file)) = self.snapshot_due()? else {
            return Ok(());
        };
        // Changes from here on make it dirty again; a failed write too.
        self.dirty = false;
        writer.submit(path, file);
        Ok(())
    }

    /// Applies the outcomes of the writer thread's finished writes.
    fn background_writes_done(&mut self, writer: &StateWriter) {
        for result in writer.take_done() {
            if let Err(e) = &result {
                self.dirty = true;
                error!(error = %e, "Health state file not written.");
            }
            self.write_finished(&result);
        }
    }

    /// The snapshot to write now, if one is due: the state changed, is
    /// settled, no backoff is running and writing is allowed. Err (counted as
    /// a failed write) when the file must not be overwritten.
    fn snapshot_due(&mut self) -> Result<Option<(PathBuf, persist::StateFile)>, StateFileError> {
        let Some(path) = self.state_path.clone() else {
            self.dirty = false;
            return Ok(None);
        };
        if !self.dirty || !self.is_settled() {
            return Ok(None);
        }
        if self.retry_write_at.is_some_and(|t| Instant::now() < t) {
            return Ok(None);
        }
        if self.read_only {
            self.dirty = false;
            return Ok(None);
        }
        if let Some(why) = &self.persist_blocked {
            // One error per batch of changes, not one per persist interval.
            self.dirty = false;
            self.registry.count_state_write(false);
            return Err(StateFileError::Write {
                path,
                source: std::io::Error::other(format!(
                    "not overwriting it: {why}; health state is kept in memory only until gpuwatch restarts with a readable file"
                )),
            });
        }
        Ok(Some((path, self.to_state_file())))
    }

    /// Counts a finished write and reports or ends a run of failures.
    fn write_finished(&mut self, res: &Result<(), StateFileError>) {
        self.registry.count_state_write(res.is_ok());
        match res {
            Ok(()) => {
                self.retry_write_at = None;
                if self.write_failures > 0 {
                    let path = self.state_path.as_deref().unwrap_or(Path::new(""));
                    info!(failed_attempts = self.write_failures, path = %path.display(), "Health state file written again; nothing was lost.");
                    self.write_failures = 0;
                    self.write_backoff.reset();
                    self.state_problem = None;
                    *self.cache.get_mut() = None;
                }
                self.remove_legacy_cursor();
            }
            Err(e) => {
                self.write_failures = self.write_failures.saturating_add(1);
                let backoff = self.write_backoff.next_delay();
                self.retry_write_at = Some(Instant::now() + backoff);
                self.state_problem = Some(format!(
                    "the health state file cannot be written ({e}); {} failed attempts, retrying in {} ms; the state is kept in memory",
                    self.write_failures,
                    backoff.as_millis()
                ));
                *self.cache.get_mut() = None;
            }
        }
    }

    /// Operator clear: removes the active faults of one GPU (`gpu` = index, UUID or
    /// PCI address) or, with `None`, of every GPU and the node. Recurrence history
    /// is kept. Returns how many faults were cleared.
    pub fn clear(&mut self, gpu: Option<&str>, reason: &str) -> usize {
        self.flush_fault_counts();
        let wanted = gpu.map(|g| {
            let g = g.trim();
            (
                g.to_string(),
                xid_parser::normalize_pci(g).unwrap_or_else(|| g.to_ascii_lowercase()),
            )
        });
        let mut cleared = 0;
        for g in self.gpus.values_mut() {
            if let Some((raw, pci)) = &wanted {
                let by_index = g.confirmed && g.index.is_some_and(|i| i.to_string() == *raw);
                if !(by_index || g.uuid.eq_ignore_ascii_case(raw) || g.pci == *pci) {
                    continue;
                }
            }
            for (key, f) in std::mem::take(&mut g.faults) {
                info!(gpu = %g.describe(), fault = %f.reason, kind = key.kind.short_name(), action = f.action.short_name(), reason, "Operator cleared a fault.");
                cleared += 1;
            }
        }
        if wanted.is_none() {
            for ((pci, key), f) in std::mem::take(&mut self.node_faults) {
                info!(pci = %pci, fault = %f.reason, kind = key.kind.short_name(), action = f.action.short_name(), reason, "Operator cleared a node-level fault.");
                cleared += 1;
            }
        }
        if cleared > 0 {
            self.touch();
        }
        cleared
    }

    /// Marks the health changed (and the persisted state dirty).
    fn touch(&mut self) {
        self.dirty = true;
        self.updated_at = self.clock.now_unix_nanos();
        *self.cache.get_mut() = None;
    }

    pub(crate) fn set_monitor(&mut self, input: MonitorInput, ok: bool, message: String) {
        let m = match input {
            MonitorInput::Kmsg => &mut self.kmsg,
            MonitorInput::Nvml => &mut self.nvml,
        };
        if m.ok == Some(ok) && m.message == message {
            return;
        }
        if m.ok != Some(ok) {
            if ok {
                info!(input = input.as_str(), "Monitoring input is available.");
            } else {
                warn!(input = input.as_str(), message = %message, "Monitoring input is unavailable; GPUs it covers are reported as unknown, not faulty.");
            }
        }
        m.ok = Some(ok);
        m.message = message;
        self.updated_at = self.clock.now_unix_nanos();
        *self.cache.get_mut() = None;
    }

    /// Finds (or creates) the GPU an event belongs to and fills its identity.
    fn join(&mut self, ev: &mut FaultEvent) -> Option<String> {
        let mut pci = (!ev.pci_address.is_empty() && self.gpus.contains_key(&ev.pci_address))
            .then(|| ev.pci_address.clone());
        if pci.is_none() && !ev.gpu_uuid.is_empty() {
            pci = self
                .gpus
                .values()
                .find(|g| g.uuid == ev.gpu_uuid)
                .map(|g| g.pci.clone());
        }
        if pci.is_none()
            && !ev.pci_address.is_empty()
            && is_gpu_kind(ev.kind())
            && self.room_for_unconfirmed_gpu(self.expected_action(ev))
        {
            let mut g = Gpu::new(ev.pci_address.clone());
            g.uuid = ev.gpu_uuid.clone();
            self.gpus.insert(ev.pci_address.clone(), g);
            pci = Some(ev.pci_address.clone());
        }
        let pci = pci?;
        let g = self.gpus.get(&pci)?;
        if ev.pci_address.is_empty() {
            ev.pci_address = pci.clone();
        }
        if g.confirmed {
            if ev.gpu_uuid.is_empty() {
                ev.gpu_uuid = g.uuid.clone();
            }
            if ev.gpu_index.is_none() {
                ev.gpu_index = g.index;
            }
        }
        Some(pci)
    }

    /// The event's action for the capacity decisions: its own once
    /// classified, else the policy's base action for its XID (context rules
    /// come later, in [`Engine::accept`]).
    fn expected_action(&self, ev: &FaultEvent) -> Action {
        match ev.action() {
            Action::Unspecified if ev.kind() == FaultKind::Xid => self.policy.entry(ev.code).action,
            Action::Unspecified => fallback_action(ev).0,
            a => a,
        }
    }

    /// Whether a GPU entry may be created for a kernel-log address NVML has
    /// not reported. At [`MAX_UNCONFIRMED_GPUS`] such entries, the least
    /// severe, least recently seen one whose faults are no more severe than
    /// the incoming event and none needs isolation is evicted (its faults are
    /// logged as dropped); otherwise the event is not attached to a GPU (it
    /// goes the node-level way, where the same bound applies). A
    /// reset/reboot/inspect-class fault is never evicted. A kernel log naming more GPUs than a node can
    /// have is a monitor problem, not that many GPUs.
    fn room_for_unconfirmed_gpu(&mut self, incoming: Action) -> bool {
        let unconfirmed = self.gpus.values().filter(|g| !g.confirmed).count();
        if unconfirmed < MAX_UNCONFIRMED_GPUS {
            return true;
        }
        let worst = |g: &Gpu| {
            g.faults
                .values()
                .map(|f| f.action.rank())
                .max()
                .unwrap_or(0)
        };
        let victim = self
            .gpus
            .values()
            .filter(|g| !g.confirmed && !g.faults.values().any(|f| f.action.needs_isolation()))
            .filter(|g| worst(g) <= incoming.rank())
            .min_by_key(|g| (worst(g), g.faults.values().map(|f| f.last_seen).max()))
            .map(|g| g.pci.clone());
        match victim {
            Some(pci) => {
                if let Some(g) = self.gpus.remove(&pci) {
                    let faults: u64 = g.faults.values().map(|f| f.count).sum();
                    self.over_capacity.note(faults.max(1), &pci);
                    self.touch();
                }
                true
            }
            None => false,
        }
    }

    /// Whether a new node-level fault fits under [`MAX_NODE_FAULTS`]; evicts
    /// the least severe, least recent one that needs no isolation and is no
    /// more severe than the incoming one.
    fn room_for_node_fault(&mut self, incoming: Action) -> bool {
        if self.node_faults.len() < MAX_NODE_FAULTS {
            return true;
        }
        let victim = self
            .node_faults
            .iter()
            .filter(|(_, f)| !f.action.needs_isolation() && f.action.rank() <= incoming.rank())
            .min_by_key(|(_, f)| (f.action.rank(), f.last_seen))
            .map(|(k, _)| k.clone());
        match victim {
            Some(k) => {
                if let Some(f) = self.node_faults.remove(&k) {
                    self.over_capacity.note(f.count.max(1), &k.0);
                    self.touch();
                }
                true
            }
            None => false,
        }
    }

    /// Classifies, applies context rules, dedups and activates one event. Returns
    /// the event when it is to be published.
    ///
    /// Order matters: (1) the same occurrence reported by a second source within
    /// `cross_source_window_ms` is merged before anything is counted; (2) a
    /// plain repeat of an active fault inside the dedup window only bumps
    /// counters (no classification, thresholds, history or registry work; the
    /// registry is updated in bulk by [`Engine::flush_fault_counts`]); (3)
    /// everything else takes the full path.
    fn accept(
        &mut self,
        mut ev: FaultEvent,
        read_at: Option<Instant>,
        level: bool,
    ) -> Option<FaultEvent> {
        let now = self.clock.now_unix_nanos();
        ev.count = ev.count.max(1);
        if !ev.pci_address.is_empty()
            && !self.gpus.contains_key(&ev.pci_address)
            && let Some(p) = xid_parser::normalize_pci(&ev.pci_address)
        {
            ev.pci_address = p;
        }
        let gpu_pci = self.join(&mut ev);
        let key = FaultKey::of(&ev);
        let n = u64::from(ev.count);
        let source = ev.source();
        let ev_time = ev.time_unix_nano.filter(|&t| t > 0).unwrap_or(now);
        let cross_window = self.cfg.cross_source_window_ms.saturating_mul(1_000_000);
        let dedup = self.cfg.dedup_window_secs.saturating_mul(NANOS);
        let remap_xid = derive::is_remap_xid(ev.kind(), ev.code);
        let boot_id = self.boot.boot_id.as_str();
        let mut fast = None;
        if let Some(f) = fault_in(
            &mut self.gpus,
            &mut self.node_faults,
            gpu_pci.as_deref(),
            &ev.pci_address,
            &key,
        ) {
            if f.match_other_source(source, ev_time, cross_window) {
                // One occurrence, two reports (kernel log + NVML event).
                if f.prefers_message_of(source) && !ev.message.is_empty() {
                    f.message = std::mem::take(&mut ev.message);
                    f.message_source = source;
                }
                fast = Some(true);
            } else if !level
                && !remap_xid
                && f.last_boot_id == boot_id
                && ev.action() != Action::Unspecified
                && ev.action().rank() <= f.action.rank()
                && now.saturating_sub(f.last_emitted) < dedup
            {
                f.note_occurrence(source, ev_time);
                f.count = f.count.saturating_add(n);
                f.pending = f.pending.saturating_add(n);
                f.unrecorded = f.unrecorded.saturating_add(n);
                f.last_seen = now;
                if !ev.message.is_empty() && f.message != ev.message {
                    f.message.clone_from(&ev.message);
                    f.message_source = source;
                }
                fast = Some(false);
            }
        }
        if let Some(merged) = fast {
            if merged {
                tracing::debug!(pci = %ev.pci_address, code = ev.code, source = source.short_name(), "Same fault reported by a second source; counted once.");
            } else {
                self.unrecorded = true;
            }
            self.registry
                .count_events(Stage::Engine, Outcome::Coalesced, 1);
            self.touch();
            return None;
        }
        if gpu_pci.is_none()
            && !self
                .node_faults
                .contains_key(&(ev.pci_address.clone(), key.clone()))
            && !self.room_for_node_fault(self.expected_action(&ev))
        {
            // Bounded: a storm of distinct addresses cannot grow the state.
            self.over_capacity.note(n, &ev.pci_address);
            self.registry
                .count_events(Stage::Engine, Outcome::Dropped, 1);
            return None;
        }
        // The full path counts in the registry directly: bring the bulk counts
        // up to date first so the series stay in order.
        self.flush_fault_counts();
        if ev.boot_id.is_empty() {
            ev.boot_id = self.boot.boot_id.clone();
        }

        // Policy classification, then the engine default for kinds it left open.
        if ev.action() == Action::Unspecified {
            self.policy.classify(&mut self.ctx, &mut ev);
        }
        if ev.action() == Action::Unspecified {
            let (action, reason) = fallback_action(&ev);
            ev.classify(action, reason);
        }
        if ev.severity() == gpuwatch_proto::Severity::Unspecified {
            ev.set_severity(ev.action().default_severity());
        }

        let gpu = gpu_pci.as_ref().and_then(|p| self.gpus.get(p));
        let remap = if remap_xid {
            self.remap_context(gpu, &mut ev, now)
        } else {
            RemapCheck::NotApplicable
        };
        let identity = match gpu {
            Some(g) => g.identity(),
            None if ev.pci_address.is_empty() => "node".to_string(),
            None => pci_identity(&ev.pci_address),
        };
        self.apply_threshold(&identity, &mut ev, now);

        let boots_seen = self.record_history(identity, &key, now);
        let mut escalated = false;
        if matches!(ev.action(), Action::ResetGpu | Action::RebootNode) {
            let code = if ev.kind() == FaultKind::Xid {
                ev.code
            } else {
                0
            };
            let needed = self.policy.recurrence_reboots(code);
            if recurred(boots_seen, needed) {
                let reason = format!(
                    "{} seen on this device in {boots_seen} distinct boots, i.e. it recurred after {} reboots (recurrence threshold {needed} reboots): escalated from {} to inspect_hardware; policy: {}",
                    ev.short_reason(),
                    boots_seen - 1,
                    ev.action().short_name(),
                    ev.policy_reason
                );
                ev.classify(Action::InspectHardware, reason);
                escalated = true;
            }
        }
        self.registry.record_fault(&ev);

        let boot_id = self.boot.boot_id.clone();
        let slot = match &gpu_pci {
            Some(p) => self.gpus.get_mut(p).map(|g| &mut g.faults),
            None => None,
        };
        let existing = match slot {
            Some(faults) => faults.get_mut(&key),
            None => self
                .node_faults
                .get_mut(&(ev.pci_address.clone(), key.clone())),
        };
        if let Some(f) = existing {
            // A fault from an earlier boot that recurs in this one is news (it
            // survived the reboot): published, never coalesced.
            let recurs_after_reboot = f.last_boot_id != boot_id;
            f.note_occurrence(source, ev_time);
            f.count = f.count.saturating_add(n);
            f.last_seen = now;
            f.last_boot_id.clone_from(&boot_id);
            f.boots_seen = f.boots_seen.max(boots_seen);
            if !ev.message.is_empty() {
                f.message.clone_from(&ev.message);
                f.message_source = source;
            }
            if level {
                f.level = true;
                f.condition_gone_since = None;
                f.gone_samples = 0;
            }
            let mut more_severe = ev.action().rank() > f.action.rank();
            match remap {
                // A sample at least as new as this XID decides for the whole
                // fault while it waited for NVML (down as well as up).
                RemapCheck::Confirmed if f.awaiting_nvml.is_some() => {
                    f.awaiting_nvml = None;
                    if f.action != ev.action() {
                        info!(pci = %ev.pci_address, gpu_index = ?ev.gpu_index, code = ev.code, from = f.action.short_name(), to = ev.action().short_name(), reason = %ev.policy_reason, "Fault reclassified from NVML's row-remap state.");
                        more_severe = true;
                    }
                }
                RemapCheck::Unconfirmed(t) => {
                    f.awaiting_nvml = Some(f.awaiting_nvml.map_or(t, |w| w.max(t)));
                }
                _ => {}
            }
            if more_severe {
                f.action = ev.action();
                f.severity = ev.severity();
                f.policy_reason = ev.policy_reason.clone();
                f.escalated |= escalated;
            }
            if !more_severe && !recurs_after_reboot && now.saturating_sub(f.last_emitted) < dedup {
                f.pending = f.pending.saturating_add(n);
                self.registry
                    .count_events(Stage::Engine, Outcome::Coalesced, 1);
                self.touch();
                return None;
            }
            ev.count = u32::try_from(f.pending.saturating_add(n)).unwrap_or(u32::MAX);
            f.pending = 0;
            f.last_emitted = now;
        } else {
            let mut f = Fault {
                pci: ev.pci_address.clone(),
                action: ev.action(),
                severity: ev.severity(),
                policy_reason: ev.policy_reason.clone(),
                reason: ev.short_reason(),
                name: ev.name.clone(),
                message: ev.message.clone(),
                message_source: source,
                count: n,
                pending: 0,
                unrecorded: 0,
                recent: VecDeque::new(),
                first_seen: now,
                last_seen: now,
                last_emitted: now,
                boot_id: boot_id.clone(),
                last_boot_id: boot_id,
                boots_seen,
                escalated,
                level,
                condition_gone_since: None,
                gone_samples: 0,
                awaiting_nvml: match remap {
                    RemapCheck::Unconfirmed(t) => Some(t),
                    _ => None,
                },
            };
            f.note_occurrence(source, ev_time);
            let activation = Activation::of(&ev, &f);
            if self.defer_activation_logs {
                self.activations.push(activation);
            } else {
                activation.log();
            }
            match gpu_pci.as_ref().and_then(|p| self.gpus.get_mut(p)) {
                Some(g) => {
                    g.faults.insert(key, f);
                }
                None => {
                    self.node_faults.insert((ev.pci_address.clone(), key), f);
                }
            }
        }
        self.registry
            .count_events(Stage::Engine, Outcome::Emitted, 1);
        if let Some(t) = read_at {
            self.registry.record_latency(t.elapsed());
        }
        self.touch();
        Some(ev)
    }

    /// XID 63/64: NVML's row-remap state decides, but only from a sample at least
    /// as new as the XID (event time, else now). An older sample (or none) must
    /// not downgrade it: the policy action stands, the reason says NVML has not
    /// confirmed yet, and the next sample re-evaluates the active fault.
    fn remap_context(&self, gpu: Option<&Gpu>, ev: &mut FaultEvent, now: u64) -> RemapCheck {
        // An event time after `now` (a skewed or wrong clock) would wait forever.
        let ev_time = ev
            .time_unix_nano
            .filter(|&t| t > 0)
            .map_or(now, |t| t.min(now));
        let latest = gpu.and_then(|g| g.sample.as_ref().zip(g.sample_time));
        match latest {
            Some((s, at)) if at >= ev_time => {
                if derive::row_remap_decision(ev.code, s).is_none() {
                    return RemapCheck::NotApplicable;
                }
                derive::row_remap_context(ev, s);
                RemapCheck::Confirmed
            }
            // A GPU without row remapping: the policy action stands.
            Some((s, _)) if derive::row_remap_decision(ev.code, s).is_none() => {
                RemapCheck::NotApplicable
            }
            stale => {
                derive::row_remap_unconfirmed(ev, stale.is_some());
                RemapCheck::Unconfirmed(ev_time)
            }
        }
    }

    /// Count-within-window thresholds: below the count, a reset/reboot/inspect action
    /// is held at `investigate` (the event is still recorded and counted).
    fn apply_threshold(&mut self, identity: &str, ev: &mut FaultEvent, now: u64) {
        if ev.kind() != FaultKind::Xid {
            return;
        }
        let Some(t) = self.policy.threshold(ev.code) else {
            return;
        };
        if t.count <= 1 {
            return;
        }
        let window = t.window_secs.saturating_mul(NANOS);
        let need = usize::try_from(t.count).unwrap_or(usize::MAX);
        let k = (identity.to_string(), ev.code);
        if !self.thresholds.contains_key(&k) && self.thresholds.len() >= MAX_THRESHOLD_KEYS {
            // Bounded: forget windows that have expired, else the stalest one.
            self.thresholds
                .retain(|_, q| q.back().is_some_and(|&t| now.saturating_sub(t) < window));
            if self.thresholds.len() >= MAX_THRESHOLD_KEYS
                && let Some(stale) = self
                    .thresholds
                    .iter()
                    .min_by_key(|(_, q)| q.back().copied().unwrap_or(0))
                    .map(|(k, _)| k.clone())
            {
                self.thresholds.remove(&stale);
            }
        }
        let q = self.thresholds.entry(k).or_default();
        while q
            .front()
            .is_some_and(|&t0| now.saturating_sub(t0) >= window)
        {
            q.pop_front();
        }
        for _ in 0..ev.count.min(t.count) {
            q.push_back(now);
        }
        while q.len() > need {
            q.pop_front();
        }
        let seen = q.len();
        if seen < need && ev.action().rank() > Action::Investigate.rank() {
            let reason = format!(
                "held at investigate: {seen} of {} occurrences within {} s needed before {} (policy: {})",
                t.count,
                t.window_secs,
                ev.action().short_name(),
                ev.policy_reason
            );
            ev.classify(Action::Investigate, reason);
        }
    }

    /// Records an occurrence in the recurrence history; returns the distinct boots.
    fn record_history(&mut self, identity: String, key: &FaultKey, now: u64) -> u32 {
        let hk = HistoryKey {
            identity,
            key: key.clone(),
        };
        let n = self
            .history
            .entry(hk)
            .or_default()
            .record(&self.boot.boot_id, now);
        if self.history.len() > model::HISTORY_ENTRIES
            && let Some(oldest) = self
                .history
                .iter()
                .min_by_key(|(_, h)| h.last_seen)
                .map(|(k, _)| k.clone())
        {
            self.history.remove(&oldest);
        }
        n
    }
}

/// The active fault an event belongs to, if any.
fn fault_in<'a>(
    gpus: &'a mut BTreeMap<String, Gpu>,
    node_faults: &'a mut BTreeMap<(String, FaultKey), Fault>,
    gpu_pci: Option<&str>,
    pci: &str,
    key: &FaultKey,
) -> Option<&'a mut Fault> {
    match gpu_pci {
        Some(p) => gpus.get_mut(p)?.faults.get_mut(key),
        // Node-level faults are keyed by (PCI address, fault): the lookup needs
        // owned keys, so it is skipped while there are none.
        None if node_faults.is_empty() => None,
        None => node_faults.get_mut(&(pci.to_string(), key.clone())),
    }
}

/// Retries of a failed state write: from the persist interval, doubling up to
/// 30 s, jittered (a fleet whose disks recover together does not retry in step).
fn write_backoff(persist_interval_ms: &u64) -> crate::retry::Backoff {
    crate::retry::Backoff::new(
        Duration::from_millis(*persist_interval_ms),
        Duration::from_secs(30),
    )
}

/// Recurrence escalation: "recurs after N reboots" means seen in N + 1
/// distinct boots (first boot, then after each of the N reboots). `needed` 0
/// disables escalation.
pub(crate) fn recurred(boots_seen: u32, needed: u32) -> bool {
    needed > 0 && boots_seen > needed
}

/// How NVML's row-remap state applied to an XID 63/64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RemapCheck {
    /// Not an XID 63/64, or a GPU without row remapping.
    NotApplicable,
    /// A sample at least as new as the XID decided.
    Confirmed,
    /// No such sample yet; the value is the time a deciding sample must reach.
    Unconfirmed(u64),
}

/// What the "GPU fault became active" log line says, taken when the fault
/// becomes active.
#[derive(Debug)]
struct Activation {
    pci: String,
    gpu_index: Option<u32>,
    gpu_uuid: String,
    kind: FaultKind,
    code: u32,
    action: Action,
    reason: String,
    policy_reason: String,
}

impl Activation {
    fn of(ev: &FaultEvent, f: &Fault) -> Activation {
        Activation {
            pci: ev.pci_address.clone(),
            gpu_index: ev.gpu_index,
            gpu_uuid: ev.gpu_uuid.clone(),
            kind: ev.kind(),
            code: ev.code,
            action: ev.action(),
            reason: f.reason.clone(),
            policy_reason: ev.policy_reason.clone(),
        }
    }

    fn log(&self) {
        let (pci, uuid, kind, code) =
            (&self.pci, &self.gpu_uuid, self.kind.short_name(), self.code);
        let action = self.action.short_name();
        if self.action.needs_isolation() {
            warn!(pci = %pci, gpu_index = ?self.gpu_index, gpu_uuid = %uuid, kind, code, action, reason = %self.reason, policy_reason = %self.policy_reason, "GPU fault became active.");
        } else {
            info!(pci = %pci, gpu_index = ?self.gpu_index, gpu_uuid = %uuid, kind, code, action, reason = %self.reason, "GPU fault became active.");
        }
    }
}

/// How long the shutdown waits for a state write in progress before giving
/// up the final write (the process must end within its stop budget even on a
/// hung disk).
pub const FINAL_WRITE_WAIT: Duration = Duration::from_secs(3);

/// The engine thread loop: receives inputs (with a tick timeout), handles them,
/// sends each returned event to every sink at once, publishes the health to
/// `health_tx` and the registry when it changed (timestamps ignored), persists when
/// dirty (at most once per `persist_interval_ms`). Publishing and persisting wait
/// for a 5 ms pause in the input (at most 100 ms for a publication, one more
/// persist interval for a persist) so that they never hold up the events of a
/// burst. The state file is written by a writer thread of its own (the engine
/// only copies the state): the disk never delays an event. Between inputs the
/// thread sleeps until the next of these is due. Returns on channel
/// disconnect or when `shutdown` is triggered (at once, even in the middle of
/// a wait; inputs already queued are handled first), after a final state
/// write (unless the writer is still stuck in an earlier one after
/// [`FINAL_WRITE_WAIT`]) and flushing the sinks.
pub fn run_engine(
    mut engine: Engine,
    rx: crossbeam_channel::Receiver<Input>,
    sinks: Vec<Arc<dyn EventSink>>,
    health_tx: impl Fn(Arc<NodeHealth>),
    shutdown: Shutdown,
) {
    /// Inputs handled between two health publications.
    const BATCH: usize = 4096;
    /// Health is published and state persisted once the input has paused this
    /// long (a burst of records is handled first), or at the latest
    /// `PUBLISH_EVERY` / one more persist interval later. Building and
    /// comparing `NodeHealth` costs O(active faults) (~3 ms with 2000) and a
    /// persist includes an fsync (0.5-5 ms): done between two inputs, they
    /// delay the next event behind them. Publishing after every input took the
    /// engine thread to ~60 % of a core at 500 events/s.
    const SETTLE: Duration = Duration::from_millis(5);
    /// Longest a health change waits for a pause in the input. Consumers
    /// (Kubernetes writer, local API, metrics) see every change within this.
    const PUBLISH_EVERY: Duration = Duration::from_millis(100);
    let tick = Duration::from_millis(engine.cfg.tick_interval_ms.max(1));
    let persist_every = Duration::from_millis(engine.cfg.persist_interval_ms);
    let writer = if engine.state_path.is_some() && !engine.read_only {
        match StateWriter::spawn() {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(error = %e, "Cannot start the state writer thread; writing the state on the engine thread.");
                None
            }
        }
    } else {
        None
    };
    let persist = |engine: &mut Engine| {
        let res = match &writer {
            Some(w) => engine.persist_in_background(w),
            None => engine.persist(),
        };
        if let Err(e) = res {
            error!(error = %e, "Health state file not written.");
        }
    };
    let registry = Arc::clone(&engine.registry);
    let mut published = engine.health();
    registry.set_health(Arc::clone(&published));
    health_tx(Arc::clone(&published));
    let mut last_tick = Instant::now();
    let mut last_input = Instant::now();
    let last_persist: std::cell::Cell<Option<Instant>> = std::cell::Cell::new(None);
    // First input handled since the last publication (None: nothing to
    // publish); `emitted`: some of those inputs produced events, so the health
    // changed for sure.
    let mut unpublished_since: Option<Instant> = None;
    let mut emitted = false;
    engine.defer_activation_logs = true;
    let dispatch = |engine: &mut Engine, input: Input| -> bool {
        let progress = matches!(input, Input::KmsgProgress(_));
        let events = engine.handle(input);
        for ev in &events {
            for sink in &sinks {
                sink.send(ev);
            }
        }
        for activation in engine.activations.drain(..) {
            activation.log();
        }
        if progress {
            // A settled point inside a burst: write here when a write is
            // due, or a long storm (never pausing) would never be persisted.
            let now = Instant::now();
            let due = last_persist.get().is_none_or(|t| now >= t + persist_every);
            if due && engine.persist_due().is_some_and(|t| now >= t) {
                last_persist.set(Some(now));
                persist(engine);
            }
        }
        !events.is_empty()
    };
    loop {
        if shutdown.is_triggered() {
            // Inputs already queued are handled, not lost.
            for _ in 0..BATCH {
                match rx.try_recv() {
                    Ok(input) => emitted |= dispatch(&mut engine, input),
                    Err(_) => break,
                }
            }
            break;
        }
        if let Some(hb) = &engine.heartbeat {
            // Real time, not the engine's clock: this is about the thread.
            hb.store(
                crate::clock::unix_nanos(std::time::SystemTime::now()) / NANOS,
                Ordering::Relaxed,
            );
        }
        // Next thing due: the tick, a publication, a persist.
        let settled = last_input + SETTLE;
        let publish_due = unpublished_since.map(|t| settled.min(t + PUBLISH_EVERY));
        let persist_due = engine.persist_due().map(|ready| {
            let earliest = last_persist.get().map_or(last_input, |t| t + persist_every);
            earliest
                .max(settled.min(earliest + persist_every))
                .max(ready)
        });
        let due = [Some(last_tick + tick), publish_due, persist_due]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(last_tick + tick);
        let wait = due.saturating_duration_since(Instant::now());
        let received = crossbeam_channel::select! {
            recv(rx) -> input => input.map_err(|_| RecvTimeoutError::Disconnected),
            // Handled at the top of the loop.
            recv(shutdown.receiver()) -> _ => continue,
            default(wait) => Err(RecvTimeoutError::Timeout),
        };
        let disconnected = match received {
            Ok(input) => {
                unpublished_since.get_or_insert_with(Instant::now);
                emitted |= dispatch(&mut engine, input);
                let mut closed = false;
                for _ in 1..BATCH {
                    match rx.try_recv() {
                        Ok(input) => emitted |= dispatch(&mut engine, input),
                        Err(crossbeam_channel::TryRecvError::Empty) => break,
                        Err(crossbeam_channel::TryRecvError::Disconnected) => {
                            closed = true;
                            break;
                        }
                    }
                }
                last_input = Instant::now();
                closed
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        let now = Instant::now();
        if now >= last_tick + tick {
            emitted |= dispatch(&mut engine, Input::Tick);
            last_tick = now;
            unpublished_since.get_or_insert(now);
        }
        if publish_due.is_some_and(|t| now >= t) {
            engine.flush_fault_counts();
            publish(&engine, &mut published, &registry, &health_tx, emitted);
            unpublished_since = None;
            emitted = false;
        }
        if let Some(w) = &writer {
            engine.background_writes_done(w);
        }
        if persist_due.is_some_and(|t| now >= t) {
            last_persist.set(Some(now));
            persist(&mut engine);
        }
        if disconnected {
            break;
        }
    }
    let mut writer_stuck = false;
    if let Some(w) = &writer {
        writer_stuck = !w.wait_idle(FINAL_WRITE_WAIT);
        engine.background_writes_done(w);
    }
    engine.flush_fault_counts();
    publish(&engine, &mut published, &registry, &health_tx, emitted);
    // The final write ignores the backoff: it is the last chance.
    engine.retry_write_at = None;
    if writer_stuck {
        warn!(
            "The state writer is still blocked in an earlier write; no final state write (records after the last written position are read again at the next start)."
        );
    } else if !engine.is_settled() {
        warn!(
            "Kernel-log events beyond the last reported position were handled; keeping the last settled state file (those records are read again at the next start)."
        );
    } else if let Err(e) = engine.persist() {
        warn!(error = %e, "Cannot write the health state file at shutdown.");
    }
    for sink in &sinks {
        sink.flush(Duration::from_secs(2));
    }
    info!("Health engine stopped.");
}

/// Publishes the engine's health when it differs from `published` (timestamps
/// ignored, so an unchanged state is never re-sent). `changed`: events were
/// emitted since the last publication, so the (costly) comparison is skipped.
fn publish(
    engine: &Engine,
    published: &mut Arc<NodeHealth>,
    registry: &Registry,
    health_tx: &dyn Fn(Arc<NodeHealth>),
    changed: bool,
) {
    let current = engine.health();
    if Arc::ptr_eq(&current, published)
        || (!changed && health::same_ignoring_timestamps(&current, published))
    {
        return;
    }
    registry.set_health(Arc::clone(&current));
    health_tx(Arc::clone(&current));
    *published = current;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_parse_and_unknown_keys_are_rejected() {
        let cfg: EngineConfig = toml::from_str("").unwrap();
        assert_eq!(cfg, EngineConfig::default());
        assert_eq!(cfg.dedup_window_secs, 60);
        // Idle GPUs drop to Gen1: only the link width is checked by default.
        assert!(!cfg.pcie_link_gen_check);
        assert!(cfg.validate().is_empty());
        let cfg: EngineConfig = toml::from_str("dedup_window_secs = 5\n").unwrap();
        assert_eq!(cfg.dedup_window_secs, 5);
        let err = toml::from_str::<EngineConfig>("dedup_window = 5\n").unwrap_err();
        assert!(err.to_string().contains("dedup_window"), "{err}");
    }

    #[test]
    fn validate_reports_every_problem() {
        let cfg = EngineConfig {
            dedup_window_secs: 0,
            active_window_secs: 0,
            tick_interval_ms: 1,
            persist_interval_ms: 1,
            inspect_clear_quiet_secs: 40 * 86_400,
            condition_clear_samples: 0,
            cross_source_window_ms: 120_000,
            nvml_join_grace_secs: 3600,
            ..EngineConfig::default()
        };
        let problems = cfg.validate();
        for key in [
            "dedup_window_secs",
            "active_window_secs",
            "tick_interval_ms",
            "persist_interval_ms",
            "inspect_clear_quiet_secs",
            "condition_clear_samples",
            "cross_source_window_ms",
            "nvml_join_grace_secs",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(key)),
                "{key} not in {problems:?}"
            );
        }
        let longer = EngineConfig {
            dedup_window_secs: 7200,
            ..EngineConfig::default()
        };
        assert!(longer.validate()[0].contains("longer than active_window_secs"));
    }
}
