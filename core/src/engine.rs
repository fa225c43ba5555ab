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
mod recovery;

use crate::clock::Clock;
use crate::msg::{Input, MonitorInput};
use crate::statefile::StateFileError;
use crate::{EventSink, Outcome, Registry, Stage};
use derive::secs;
use gpuwatch_proto::{Action, FaultEvent, FaultKind, NodeHealth, ShortName, ValidationReport};
use model::{
    Fault, FaultKey, Gpu, History, HistoryKey, fallback_action, is_gpu_kind, pci_identity,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Where the persisted kernel-log event count is published (see
    /// [`Engine::set_kmsg_ack`]).
    kmsg_ack: Option<Arc<AtomicU64>>,
    /// Kernel-log fault events handled by [`run_engine`] so far.
    kmsg_handled: u64,
    /// Kernel-log events handled before the oldest one now in `held` (held
    /// for the join grace: in memory only, not in the state file).
    kmsg_held_from: Option<u64>,
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
            kmsg_ack: None,
            kmsg_handled: 0,
            kmsg_held_from: None,
        };
        engine.load();
        if engine.boots.back() != Some(&engine.boot.boot_id) {
            engine.boots.push_back(engine.boot.boot_id.clone());
            while engine.boots.len() > model::HISTORY_BOOTS {
                engine.boots.pop_front();
            }
            engine.dirty = true;
        }
        engine
    }

    /// Applies one input; returns the events to publish (classified, joined to GPU
    /// identity, coalesced: a repeat inside the dedup window of an active fault bumps
    /// its count and is not returned again).
    pub fn handle(&mut self, input: Input) -> Vec<FaultEvent> {
        match input {
            Input::Fault { event, read_at } => {
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

    /// Writes `state_dir/health.json` atomically when the state changed (no-op
    /// without a state directory). Every write is counted in the registry.
    ///
    /// When the state file existed but could not be read at startup, it is never
    /// overwritten: each skipped write is counted as a failed write and returned
    /// as an error (the state keeps running in memory).
    pub fn persist(&mut self) -> Result<(), StateFileError> {
        let covered = self.kmsg_persistable();
        let Some(path) = self.state_path.clone() else {
            self.dirty = false;
            self.publish_kmsg_ack(covered);
            return Ok(());
        };
        if !self.dirty {
            if self.persist_blocked.is_none() {
                self.publish_kmsg_ack(covered);
            }
            return Ok(());
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
        let file = self.to_state_file();
        let res = crate::statefile::write_json(&path, &file);
        self.registry.count_state_write(res.is_ok());
        if res.is_ok() {
            self.dirty = false;
            self.publish_kmsg_ack(covered);
        }
        res
    }

    /// Acknowledgements for the kmsg source's cursor: after every successful
    /// [`Engine::persist`] (at once without a state directory, and whenever
    /// the state is clean), `ack` holds how many kernel-log fault events
    /// (`source = kmsg`, counted in channel order by [`run_engine`]) the
    /// persisted state contains. Events held for the NVML join grace are in
    /// memory only: the count stops before the oldest of them. The count is
    /// per process, like the source's; see [`crate::kmsg::spawn_acked`].
    pub fn set_kmsg_ack(&mut self, ack: Arc<AtomicU64>) {
        self.kmsg_ack = Some(ack);
    }

    /// Kernel-log events whose effects the state (as it is now) holds.
    fn kmsg_persistable(&self) -> u64 {
        self.kmsg_held_from
            .map_or(self.kmsg_handled, |h| h.min(self.kmsg_handled))
    }

    fn publish_kmsg_ack(&self, covered: u64) {
        if let Some(ack) = &self.kmsg_ack {
            ack.fetch_max(covered, Ordering::AcqRel);
        }
    }

    /// Handles one input for [`run_engine`], keeping the kernel-log event
    /// count of the acknowledgements.
    fn handle_counted(&mut self, input: Input) -> Vec<FaultEvent> {
        let is_kmsg = matches!(&input, Input::Fault { event, .. } if event.source() == gpuwatch_proto::Source::Kmsg);
        let held_before = self.held.len();
        let events = self.handle(input);
        if is_kmsg {
            if self.held.len() > held_before && self.kmsg_held_from.is_none() {
                self.kmsg_held_from = Some(self.kmsg_handled);
            }
            self.kmsg_handled += 1;
        }
        if self.held.is_empty() {
            self.kmsg_held_from = None;
        }
        if self.state_path.is_none() || (!self.dirty && self.persist_blocked.is_none()) {
            // Nothing more to write: what was handled is as safe as it gets.
            self.publish_kmsg_ack(self.kmsg_persistable());
        }
        events
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
        if pci.is_none() && !ev.pci_address.is_empty() && is_gpu_kind(ev.kind()) {
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
            log_new_fault(&ev, &f);
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
        let q = self
            .thresholds
            .entry((identity.to_string(), ev.code))
            .or_default();
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

fn log_new_fault(ev: &FaultEvent, f: &Fault) {
    let action = ev.action().short_name();
    if ev.action().needs_isolation() {
        warn!(pci = %ev.pci_address, gpu_index = ?ev.gpu_index, gpu_uuid = %ev.gpu_uuid, kind = ev.kind().short_name(), code = ev.code, action, reason = %f.reason, policy_reason = %ev.policy_reason, "GPU fault became active.");
    } else {
        info!(pci = %ev.pci_address, gpu_index = ?ev.gpu_index, gpu_uuid = %ev.gpu_uuid, kind = ev.kind().short_name(), code = ev.code, action, reason = %f.reason, "GPU fault became active.");
    }
}

/// The engine thread loop: receives inputs (with a tick timeout), handles them,
/// sends each returned event to every sink at once, publishes the health to
/// `health_tx` and the registry when it changed (timestamps ignored), persists when
/// dirty (at most once per `persist_interval_ms`). Publishing and persisting wait
/// for a 5 ms pause in the input (at most 100 ms for a publication, one more
/// persist interval for a persist) so that they never hold up the events of a
/// burst. Returns on channel disconnect or `shutdown`, after flushing the state
/// file and the sinks.
pub fn run_engine(
    mut engine: Engine,
    rx: crossbeam_channel::Receiver<Input>,
    sinks: Vec<Arc<dyn EventSink>>,
    health_tx: impl Fn(Arc<NodeHealth>),
    shutdown: Arc<AtomicBool>,
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
    let registry = Arc::clone(&engine.registry);
    let mut published = engine.health();
    registry.set_health(Arc::clone(&published));
    health_tx(Arc::clone(&published));
    let mut last_tick = Instant::now();
    let mut last_input = Instant::now();
    let mut last_persist: Option<Instant> = None;
    // First input handled since the last publication (None: nothing to
    // publish); `emitted`: some of those inputs produced events, so the health
    // changed for sure.
    let mut unpublished_since: Option<Instant> = None;
    let mut emitted = false;
    let dispatch = |engine: &mut Engine, input: Input| -> bool {
        let events = engine.handle_counted(input);
        for ev in &events {
            for sink in &sinks {
                sink.send(ev);
            }
        }
        !events.is_empty()
    };
    loop {
        if shutdown.load(Ordering::Relaxed) {
            // Inputs already queued are handled, not lost.
            for _ in 0..BATCH {
                match rx.try_recv() {
                    Ok(input) => emitted |= dispatch(&mut engine, input),
                    Err(_) => break,
                }
            }
            break;
        }
        // Next thing due: the tick, a publication, a persist.
        let settled = last_input + SETTLE;
        let publish_due = unpublished_since.map(|t| settled.min(t + PUBLISH_EVERY));
        let persist_due = engine.is_dirty().then(|| {
            let earliest = last_persist.map_or(last_input, |t| t + persist_every);
            earliest.max(settled.min(earliest + persist_every))
        });
        let due = [Some(last_tick + tick), publish_due, persist_due]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(last_tick + tick);
        let disconnected = match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
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
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => false,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => true,
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
        if persist_due.is_some_and(|t| now >= t) {
            last_persist = Some(now);
            if let Err(e) = engine.persist() {
                error!(error = %e, "Health state file not written.");
            }
        }
        if disconnected {
            break;
        }
    }
    engine.flush_fault_counts();
    publish(&engine, &mut published, &registry, &health_tx, emitted);
    if let Err(e) = engine.persist() {
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
