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
//! - NVLink fabric faults (`fabric`, whatever their action): once NVML has
//!   shown the GPU registered and healthy in `condition_clear_samples`
//!   consecutive samples (restarting the fabric manager fixes most of them
//!   without a reboot); while NVML still shows the problem they stay, however
//!   long. A registration that is pending at startup is a fault only after
//!   `fabric_wait_secs` (the fabric manager registers GPUs a while after it
//!   starts); one that was completed in this boot and is pending again is a
//!   fault at once.
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
//! # MIG: a fault contained to one instance
//!
//! A kernel line printed for a MIG GPU instance (`Xid (PCI:… GPU-I:09): …`)
//! carries the instance (`gpu_instance`, and `compute_instance` for
//! `GPU-CI:`). Such a fault is *contained* when the policy asks for no more
//! than restarting the application (`ignore`, `restart_app`,
//! `investigate`): XID 94 (contained ECC error) and the application XIDs
//! (13, 31, 43, 45) by default. A contained fault is that instance's: the
//! event, its log record and the active fault in `/v1/health` name the
//! instance and its MIG device UUID (`mig_uuid`, from the GPU's latest
//! sample), the instance is `degraded` (for `restart_app` / `investigate`),
//! and the sibling instances, the GPU's verdict, the node's verdict, the
//! Node conditions and the taint are what the other faults make them. It
//! clears by the rules above for its action.
//!
//! Every other fault is the GPU's, even when the line names an instance:
//! one that needs a GPU reset, a reboot or an inspection (XID 95
//! uncontained ECC, 79 fallen off the bus, 48 double-bit ECC, a row-remap
//! failure, an uncorrectable ECC rise — NVML reports ECC and row remapping
//! per GPU, never per instance) hits the GPU and every instance on it.
//! A MIG device NVML cannot read makes that instance `unknown` (a monitoring
//! problem), never the GPU.
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

// One fault event: cross-source merge, plain repeat, full path.
mod accept;
// The NVML level conditions (a table) and their present/absent transitions.
mod conditions;
mod config;
// NVML polls: the sample diff against the baseline, lost and gone GPUs.
mod derive;
// The monitoring inputs, the validation, stale samples.
mod monitors;
// `NodeHealth` and the verdicts.
mod health;
// The identity join, its startup grace and the capacity bounds.
mod join;
// Fault identity, active faults, per-GPU state, recurrence history.
mod model;
// The NIC monitor: scans, NIC kernel events, NodeHealth.network.
mod network;
// The pods a fault names, and MIG instance scoping.
mod pods;
// Fault records waiting for a fresher placement listing.
mod placement_wait;
// The state file: its format, loading, and the write schedule.
mod persist;
// The clearing rules (module docs above).
mod recovery;
// The recurrence escalation and `Fault::reclassify`.
mod reclassify;
// XID 63/64 and NVML's row-remap state.
mod remap;
// The engine thread (`run_engine`).
mod run;
// The state-file writer thread.
mod writer;

pub use config::{EngineConfig, EngineSettings};
pub use join::{MAX_NODE_FAULTS, MAX_UNCONFIRMED_GPUS};
pub use persist::{LEGACY_CURSOR_FILE, preset_kmsg_position};
pub use placement_wait::{Ask, PlacementAsks};
pub use run::{FINAL_WRITE_WAIT, run_engine};

use crate::Registry;
use crate::clock::Clock;
use crate::msg::{Input, KmsgPosition, MonitorInput};
use accept::Activation;
use gpuwatch_proto::{FaultEvent, NodeHealth, ShortName, ValidationReport};
use join::JoinGrace;
use model::{Fault, FaultKey, Gpu, History, HistoryKey};
use monitors::Monitors;
use persist::Persistence;
use placement_wait::PlacementWait;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::info;
use xid_parser::{ContextWindow, Policy};

pub(crate) const NANOS: u64 = 1_000_000_000;

/// Seconds → nanoseconds.
pub(crate) fn secs(s: u64) -> u64 {
    s.saturating_mul(NANOS)
}

/// Name of the engine's state file inside `state_dir`.
pub const STATE_FILE: &str = "health.json";

/// The boot the engine runs in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootInfo {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// Wall-clock time of the boot, Unix epoch nanoseconds (0 when unknown).
    pub boot_time_unix_nano: u64,
}

/// The health engine. See the module documentation for the rules.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineSettings,
    policy: Arc<Policy>,
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
    /// Recurrence history. Keys and entries are shared with the state
    /// snapshots handed to the writer thread: taking one costs a reference
    /// count per entry, not a copy of the strings (a copy of the 4096
    /// entries took the engine thread milliseconds, during which inputs
    /// waited); an entry changed while a snapshot holds it is copied then
    /// ([`Arc::make_mut`]).
    history: BTreeMap<Arc<HistoryKey>, Arc<History>>,
    /// Boots the engine ran in (most recent last, bounded).
    boots: VecDeque<String>,
    /// Count-within-window occurrences by (device identity, XID).
    thresholds: HashMap<(String, u32), VecDeque<u64>>,
    /// Some fault has coalesced occurrences not yet counted in the registry.
    unrecorded: bool,
    /// When this boot started (node-level quiet periods count from here).
    boot_start: u64,
    /// Time of the last health change.
    updated_at: u64,
    cache: RefCell<Option<Arc<NodeHealth>>>,
    /// Where [`run_engine`] records its progress (Unix seconds of the latest
    /// loop pass), for the liveness check.
    heartbeat: Option<Arc<Heartbeat>>,
    /// Log activations after the events went to the sinks
    /// ([`run_engine`]): a log line (formatting, a write to stderr) must not
    /// delay the event it reports.
    defer_activation_logs: bool,
    /// Activations not logged yet (only while deferred; logged after every
    /// input).
    activations: Vec<Activation>,
    /// The node's pods and their devices, for naming a fault's pods.
    placement: crate::placement::Placement,
    /// Published records waiting for a fresher placement listing (and the
    /// kernel-log position behind them).
    wait: PlacementWait,
    /// The state file, the kernel-log position it accounts for, the writes.
    persist: Persistence,
    /// The startup join grace: the kernel-log faults (and position) held
    /// for NVML's identities; what the capacity bounds dropped.
    grace: JoinGrace,
    /// Eviction candidates among the unconfirmed GPUs.
    evictions: join::Evictions,
    /// Where [`run_engine`] hands the events back once the sinks took them
    /// ([`crate::msg::spent_events`]).
    spent: Option<crate::msg::SpentSender>,
    /// The monitoring inputs, the validation, stale samples.
    monitors: Monitors,
    /// The NIC monitor, when `[network]` is on ([`Engine::set_network`]).
    network: Option<Box<network::Network>>,
}

impl Engine {
    /// Creates the engine and loads `state_dir/health.json` when there is one. A
    /// corrupt or unreadable file is logged, kept aside, and the engine starts fresh.
    pub fn new(
        cfg: EngineSettings,
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
        let persist = Persistence::new(state_dir.map(|d| d.join(STATE_FILE)), cfg.persist_interval);
        let mut engine = Engine {
            cfg,
            policy,
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
            unrecorded: false,
            boot_start,
            updated_at: now,
            cache: RefCell::new(None),
            heartbeat: None,
            defer_activation_logs: false,
            activations: Vec::new(),
            placement: crate::placement::Placement::default(),
            wait: PlacementWait::default(),
            persist,
            grace: JoinGrace::new(now),
            evictions: join::Evictions::default(),
            spent: None,
            monitors: Monitors::default(),
            network: None,
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
        cfg: EngineSettings,
        policy: Arc<Policy>,
        state_dir: PathBuf,
        boot: BootInfo,
        node_name: String,
        registry: Arc<Registry>,
        clock: Arc<dyn Clock>,
    ) -> Engine {
        let mut engine = Engine::new(cfg, policy, None, boot, node_name, registry, clock);
        engine.persist.read_only_at(state_dir.join(STATE_FILE));
        engine.load();
        engine.note_boot();
        engine
    }

    fn note_boot(&mut self) {
        let engine = self;
        if engine.boots.back() != Some(&engine.boot.boot_id) {
            engine.boots.push_back(engine.boot.boot_id.clone());
            while engine.boots.len() > model::HISTORY_BOOTS {
                engine.boots.pop_front();
            }
            engine.persist.mark_dirty();
        }
    }

    /// Applies one input; returns the events to publish (classified, joined to GPU
    /// identity, coalesced: a repeat inside the dedup window of an active fault bumps
    /// its count and is not returned again). Each kind of input has one method.
    pub fn handle(&mut self, input: Input) -> Vec<FaultEvent> {
        let mut out = self.handle_one(input);
        self.release_waiting(false, &mut out);
        out
    }

    fn handle_one(&mut self, input: Input) -> Vec<FaultEvent> {
        if !matches!(input, Input::Fault { .. }) {
            // Any other input may confirm, add or drop GPUs.
            self.evictions.clear();
        }
        match input {
            Input::Fault { event, read_at } => self.on_fault(event, read_at),
            Input::Samples { samples, complete } => self.on_samples(samples, complete),
            Input::MonitorStatus { input, ok, message } => {
                self.on_monitor_status(input, ok, message)
            }
            Input::Validation(report) => {
                self.set_validation(report);
                Vec::new()
            }
            Input::KmsgCaughtUp => {
                self.on_kmsg_caught_up();
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
                self.on_kmsg_progress(position);
                Vec::new()
            }
            Input::Placement(update) => {
                self.placement.apply(update);
                Vec::new()
            }
            Input::Network(scan) => self.on_network_scan(scan),
            Input::Tick => self.on_tick(),
        }
    }

    /// A fault event from a source: held for the NVML join grace when its
    /// GPU has no identity yet, else accepted.
    fn on_fault(&mut self, event: FaultEvent, read_at: Instant) -> Vec<FaultEvent> {
        if event.source() == gpuwatch_proto::Source::Kmsg {
            self.persist.kmsg_event_handled();
        }
        if let Some(records) = self.network_records(&event) {
            let mut out = vec![event];
            out.extend(records);
            return out;
        }
        if self.should_hold(&event) {
            self.grace.hold(event, read_at);
            return Vec::new();
        }
        self.accept(event, Some(read_at), false)
            .into_iter()
            .collect()
    }

    /// A monitoring input's status (the NIC poller's goes to the NIC
    /// monitor: it covers only the network); NVML reporting itself unavailable ends
    /// the join grace (no NVML identity is coming: what waited for it is
    /// published).
    fn on_monitor_status(
        &mut self,
        input: MonitorInput,
        ok: bool,
        message: String,
    ) -> Vec<FaultEvent> {
        match input {
            MonitorInput::Network => {
                self.set_monitor(input, ok, message.clone());
                return self.on_network_stall((!ok).then_some(message));
            }
            MonitorInput::PodResources | MonitorInput::PodListing => {
                self.on_placement_stall(input, ok, message);
                return Vec::new();
            }
            MonitorInput::Kmsg | MonitorInput::Nvml | MonitorInput::KubeWriter => {}
        }
        self.set_monitor(input, ok, message);
        let mut out = Vec::new();
        if input == MonitorInput::Nvml && !ok {
            self.end_join_grace("NVML is unavailable", &mut out);
        }
        out
    }

    /// A placement source that stalled keeps its last listing, with a note
    /// that it may be stale (as when the source itself reports an error);
    /// when it moves again the note goes, unless the source replaced it
    /// with its own meanwhile.
    fn on_placement_stall(&mut self, input: MonitorInput, ok: bool, message: String) {
        let pods = input == MonitorInput::PodListing;
        let note = |m: &str| format!("the {} source is stuck: {m}", input.as_str());
        if ok {
            if let Some(previous) = self.monitors.part_message(input) {
                self.placement.clear_note(pods, &note(previous));
            }
        } else {
            self.placement.apply(if pods {
                crate::placement::PlacementUpdate::PodsUnavailable(note(&message))
            } else {
                crate::placement::PlacementUpdate::DevicesUnavailable(note(&message))
            });
        }
        self.set_monitor(input, ok, message);
    }

    fn on_kmsg_caught_up(&mut self) {
        if self.monitors.caught_up() {
            self.updated_at = self.clock.now_unix_nanos();
            *self.cache.get_mut() = None;
        }
    }

    /// The reader's position; it applies once no event is held for the join
    /// grace (the held events precede it).
    fn on_kmsg_progress(&mut self, position: KmsgPosition) {
        self.persist.track_kmsg();
        if let Some(position) = self.grace.position(position) {
            self.apply_kmsg_position(position);
        }
    }

    /// A position no join-grace event waits for: it applies once no record
    /// waits for placement either.
    fn apply_kmsg_position(&mut self, position: KmsgPosition) {
        if let Some(position) = self.wait.position(position) {
            self.set_kmsg_position(position);
        }
    }

    /// The periodic tick: the end of the join grace, the bulk fault counts,
    /// the recovery rules, and the samples that went stale.
    fn on_tick(&mut self) -> Vec<FaultEvent> {
        let now = self.clock.now_unix_nanos();
        let mut out = Vec::new();
        if self.grace.expired(now, self.cfg.nvml_join_grace_ns) {
            self.end_join_grace("the NVML join grace passed", &mut out);
        }
        self.flush_fault_counts();
        self.evaluate_recovery(now);
        if self.monitors.update_stale(self.count_stale(now)) {
            self.updated_at = now;
            *self.cache.get_mut() = None;
        }
        out.extend(self.network_tick());
        out
    }

    /// Stores a validation report ([`Monitors::set_validation`]); a new
    /// result changes the health.
    fn set_validation(&mut self, report: ValidationReport) {
        if self.monitors.set_validation(report) {
            self.touch();
        }
    }

    /// The placement sources the engine may ask for a fresh listing when a
    /// published record's pods could be named by one (`placement_wait_ms`).
    /// Called by the wiring before any input.
    pub fn set_placement_asks(&mut self, asks: PlacementAsks) {
        self.wait.set_asks(asks);
    }

    /// [`run_engine`] stores the Unix seconds of each loop pass here (at least
    /// once per tick): a liveness check that sees it stand still knows the
    /// engine is stuck, not just idle.
    pub fn set_heartbeat(&mut self, heartbeat: Arc<Heartbeat>) {
        self.heartbeat = Some(heartbeat);
    }

    /// Ages the NVML samples: a GPU whose latest sample is older than
    /// `max_age` (the wiring uses three poll intervals) is Unknown and does
    /// not validate until a fresh sample arrives.
    pub fn set_sample_max_age(&mut self, max_age: Duration) {
        self.monitors.set_sample_max_age(max_age);
    }

    /// Confirmed GPUs whose sample is stale at `now`.
    fn count_stale(&self, now: u64) -> usize {
        self.monitors.count_stale(self.gpus.values(), now)
    }

    /// Why the state file is unusable or unwritten, if it is.
    pub fn state_problem(&self) -> Option<&str> {
        self.persist.problem()
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
        self.persist.is_dirty()
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

    /// Hands the events [`run_engine`] emitted back to their source once
    /// every sink took them, for reuse.
    pub fn return_spent_events(&mut self, to: crate::msg::SpentSender) {
        self.spent = Some(to);
    }

    /// Marks the health changed (and the persisted state dirty).
    fn touch(&mut self) {
        self.persist.mark_dirty();
        self.updated_at = self.clock.now_unix_nanos();
        *self.cache.get_mut() = None;
    }

    pub(crate) fn set_monitor(&mut self, input: MonitorInput, ok: bool, message: String) {
        if self.monitors.set(input, ok, message) {
            self.updated_at = self.clock.now_unix_nanos();
            *self.cache.get_mut() = None;
        }
    }
}

/// When a thread last went round its loop, Unix seconds (0 before the
/// first pass): the thread beats, a liveness check reads. A check that sees
/// it stand still knows the thread is stuck, not just idle.
#[derive(Debug, Default)]
pub struct Heartbeat(std::sync::atomic::AtomicU64);

impl Heartbeat {
    /// Records a pass at `unix_secs`.
    pub fn beat(&self, unix_secs: u64) {
        self.0
            .store(unix_secs, std::sync::atomic::Ordering::Relaxed);
    }

    /// The Unix seconds of the latest pass (0: none yet).
    pub fn last(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}
