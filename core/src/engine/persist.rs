//! The engine's state file, `health.json` (format version 2): active faults,
//! recurrence history and the kernel-log position, written together in one
//! atomic write by the engine thread — the only writer.
//!
//! Own serde structs, not the proto types, so the file format changes only on
//! purpose. Enum values are stored as their short names.
//!
//! Version 1 kept the kernel-log position in a second file,
//! `kmsg-cursor.json`. A version 1 state is read once with that cursor as
//! its position, and replaced (the cursor file is removed after the first
//! version 2 write).
//!
//! A state that is missing, unreadable, corrupt, of a newer version or not a
//! regular file is kept aside (renamed `health.<what>-<unix secs>`), the
//! reason logged and shown in the health (`monitor.state_message`), and the
//! engine starts empty *without a position*: the kernel-log ring is read
//! again from its start, so every fault still in the ring comes back.

use super::Engine;
use super::model::{Baseline, Fault, FaultKey, Gpu, History, HistoryKey};
use super::writer::StateWriter;
use crate::Registry;
use crate::msg::KmsgPosition;
use crate::statefile::{self, StateFileError};
use gpuwatch_proto::{Action, FaultKind, Severity, ShortName, Source};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// Current state-file format version.
pub(crate) const VERSION: u32 = 2;

/// The version 1 kernel-log cursor file, read once for the migration.
pub const LEGACY_CURSOR_FILE: &str = "kmsg-cursor.json";

/// The state file. `H` is the recurrence history: records as read, or the
/// engine's shared entries ([`SharedHistory`]) as written; both are the same
/// JSON.
#[derive(Serialize, Deserialize, Debug, Default)]
pub(crate) struct StateFile<H = Vec<HistoryRecord>> {
    pub version: u32,
    /// Boot the file was written in.
    pub boot_id: String,
    #[serde(default)]
    pub boots: Vec<String>,
    #[serde(default)]
    pub gpus: Vec<GpuRecord>,
    #[serde(default)]
    pub node_faults: Vec<FaultRecord>,
    #[serde(default)]
    pub history: H,
    /// The kernel-log position the faults above account for.
    #[serde(default)]
    pub kmsg: Option<KmsgPosition>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub(crate) struct GpuRecord {
    pub pci_address: String,
    #[serde(default)]
    pub uuid: String,
    #[serde(default)]
    pub confirmed: bool,
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default)]
    pub lost: bool,
    #[serde(default)]
    pub faults: Vec<FaultRecord>,
    #[serde(default)]
    pub baseline: BaselineRecord,
    #[serde(default)]
    pub reset_evidence_unix_nano: Option<u64>,
    #[serde(default)]
    pub reset_evidence: String,
    #[serde(default)]
    pub ecc_rose_unix_nano: Option<u64>,
    #[serde(default)]
    pub validated_unix_nano: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub(crate) struct BaselineRecord {
    pub ecc_volatile_uncorrected: Option<u64>,
    pub remap_pending: Option<bool>,
    pub recovery_pending: Option<bool>,
    pub link_degraded: Option<bool>,
    #[serde(default)]
    pub nvlinks_active: Vec<u32>,
    #[serde(default)]
    pub fabric_completed: bool,
    #[serde(default)]
    pub fabric_pending_unix_nano: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub(crate) struct FaultRecord {
    pub kind: String,
    pub code: u32,
    #[serde(default)]
    pub variant: String,
    #[serde(default)]
    pub pci_address: String,
    pub action: String,
    pub severity: String,
    #[serde(default)]
    pub policy_reason: String,
    pub reason: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub message: String,
    pub count: u64,
    #[serde(default)]
    pub pending: u64,
    pub first_seen_unix_nano: u64,
    pub last_seen_unix_nano: u64,
    pub last_emitted_unix_nano: u64,
    pub boot_id: String,
    pub last_boot_id: String,
    #[serde(default)]
    pub boots_seen: u32,
    #[serde(default)]
    pub escalated: bool,
    #[serde(default)]
    pub level: bool,
    #[serde(default)]
    pub condition_gone_unix_nano: Option<u64>,
    #[serde(default)]
    pub condition_gone_samples: u32,
    /// XID 63/64 waiting for an NVML sample at least this new.
    #[serde(default)]
    pub awaiting_nvml_unix_nano: Option<u64>,
    /// The pods the fault was seen with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<gpuwatch_proto::PodRef>,
}

/// One recurrence history entry in the file. `S` and `B` are its strings and
/// boot list: owned as read, borrowed from the engine's entry as written
/// ([`SharedHistory`]), so both ways have the same fields by construction.
#[derive(Serialize, Deserialize, Debug, Default)]
pub(crate) struct HistoryRecord<S = String, B = Vec<String>> {
    pub identity: S,
    pub kind: S,
    pub code: u32,
    #[serde(default)]
    pub variant: S,
    pub boots: B,
    #[serde(default)]
    pub last_seen_unix_nano: u64,
}

/// The state as handed to the writer thread.
pub(crate) type StateSnapshot = StateFile<SharedHistory>;

/// The engine's recurrence history entries, shared with it (taking them is a
/// reference count each), written as [`HistoryRecord`]s.
#[derive(Debug, Default)]
pub(crate) struct SharedHistory(pub(super) Vec<(Arc<HistoryKey>, Arc<History>)>);

impl Serialize for SharedHistory {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(k, h)| HistoryRecord {
            identity: k.identity.as_str(),
            kind: k.key.kind.short_name(),
            code: k.key.code,
            variant: k.key.variant.as_str(),
            boots: &h.boots,
            last_seen_unix_nano: h.last_seen,
        }))
    }
}

fn parse<T: ShortName>(what: &str, v: &str) -> Result<T, String> {
    T::from_short_name(v).ok_or_else(|| format!("unknown {what} {v:?}"))
}

fn fault_to_record(key: &FaultKey, f: &Fault) -> FaultRecord {
    FaultRecord {
        kind: key.kind.short_name().into(),
        code: key.code,
        variant: key.variant.clone(),
        pci_address: f.pci.clone(),
        action: f.action.short_name().into(),
        severity: f.severity.short_name().into(),
        policy_reason: f.policy_reason.clone(),
        reason: f.reason.clone(),
        name: f.name.clone(),
        message: f.message.clone(),
        count: f.count,
        pending: f.pending,
        first_seen_unix_nano: f.first_seen,
        last_seen_unix_nano: f.last_seen,
        last_emitted_unix_nano: f.last_emitted,
        boot_id: f.boot_id.clone(),
        last_boot_id: f.last_boot_id.clone(),
        boots_seen: f.boots_seen,
        escalated: f.escalated,
        level: f.level,
        condition_gone_unix_nano: f.condition_gone_since,
        condition_gone_samples: f.gone_samples,
        awaiting_nvml_unix_nano: f.awaiting_nvml,
        pods: f.pods.clone(),
    }
}

fn fault_from_record(r: FaultRecord) -> Result<(FaultKey, Fault), String> {
    let kind: FaultKind = parse("fault kind", &r.kind)?;
    let action: Action = parse("action", &r.action)?;
    let severity: Severity = parse("severity", &r.severity)?;
    if r.count == 0 {
        return Err(format!("fault {} has count 0", r.reason));
    }
    Ok((
        FaultKey {
            kind,
            code: r.code,
            variant: r.variant,
        },
        Fault {
            pci: r.pci_address,
            action,
            severity,
            policy_reason: r.policy_reason,
            reason: r.reason,
            name: r.name,
            message: r.message,
            message_source: Source::Unspecified,
            count: r.count,
            pending: r.pending,
            unrecorded: 0,
            recent: std::collections::VecDeque::new(),
            first_seen: r.first_seen_unix_nano,
            last_seen: r.last_seen_unix_nano,
            last_emitted: r.last_emitted_unix_nano,
            boot_id: r.boot_id,
            last_boot_id: r.last_boot_id,
            boots_seen: r.boots_seen,
            escalated: r.escalated,
            level: r.level,
            condition_gone_since: r.condition_gone_unix_nano,
            gone_samples: r.condition_gone_samples,
            awaiting_nvml: r.awaiting_nvml_unix_nano,
            pods: r.pods,
        },
    ))
}

/// Moves a state that cannot be used aside (a file or whatever else is at
/// the path) as `health.<what>-<unix secs>`; a read-only reader (`gpuwatch
/// validate` beside a running agent) leaves it where it is.
fn keep_aside(path: &Path, what: &str, reason: String, read_only: bool) -> StateFileError {
    if read_only {
        return StateFileError::Read {
            path: path.to_path_buf(),
            source: std::io::Error::other(reason),
        };
    }
    statefile::keep_aside(path, what, reason)
}

/// Reads and decodes the state file: `None` when there is none. Whatever
/// cannot be used (not a regular file, unreadable, corrupt) is kept aside.
fn read_state(path: &Path, read_only: bool) -> Result<Option<StateFile>, StateFileError> {
    if let Ok(m) = std::fs::symlink_metadata(path)
        && !m.is_file()
    {
        let reason = format!("{} is not a regular file", path.display());
        return Err(keep_aside(path, "not-a-file", reason, read_only));
    }
    let bytes = match statefile::read(path) {
        Ok(bytes) => bytes,
        Err(StateFileError::Read { source, .. }) => {
            let reason = format!("cannot be read: {source}");
            return Err(keep_aside(path, "unreadable", reason, read_only));
        }
        Err(other) => return Err(other),
    };
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    match serde_json::from_slice::<StateFile>(&bytes) {
        Ok(f) => Ok(Some(f)),
        Err(e) => Err(keep_aside(path, "corrupt", e.to_string(), read_only)),
    }
}

/// The state file's side of the engine: where the file is and whether it
/// may be written, the kernel-log position the state accounts for and
/// whether the state is settled there, and the schedule of writes (the
/// backoff after failures). The engine's faults and history go into the
/// snapshot ([`Engine::to_state_file`]); everything else about the file is
/// here.
#[derive(Debug)]
pub(super) struct Persistence {
    /// `state_dir/health.json`; `None`: the engine runs without a state file.
    path: Option<PathBuf>,
    /// Reads the state file but never writes, renames or removes anything.
    read_only: bool,
    /// Why the state file must not be written (it exists but could not be read
    /// at startup; overwriting it would lose its faults and history).
    blocked: Option<String>,
    /// State changed since the last successful write.
    dirty: bool,
    /// Why the state file is not usable or not written (startup problem or
    /// the latest write error); shown in the health's monitor status.
    problem: Option<String>,
    /// The kernel-log position the state accounts for (see
    /// [`Input::KmsgProgress`](crate::msg::Input::KmsgProgress)); persisted
    /// with the faults in one write.
    kmsg_position: Option<KmsgPosition>,
    /// The engine tracks the kernel-log position (a device reader feeds it):
    /// the state is then only written at a settled point.
    track_kmsg: bool,
    /// A kernel-log fault was handled after the last position: the state
    /// holds effects of records beyond `kmsg_position`, so writing it now
    /// would count them twice after a crash.
    kmsg_unsettled: bool,
    /// A version 1 cursor file is to be removed after the next write.
    legacy_cursor_pending: bool,
    /// Consecutive failed writes (the health reports them; a successful
    /// write logs that the run of failures ended).
    write_failures: u32,
    /// Delays between retries of a failed write.
    write_backoff: crate::retry::Backoff,
    /// No write is attempted before this time (backoff after failures).
    retry_write_at: Option<Instant>,
}

impl Persistence {
    /// The state file at `path` (`None`: no state file), written at most
    /// once per `persist_interval` after a failed write.
    pub(super) fn new(path: Option<PathBuf>, persist_interval: Duration) -> Persistence {
        Persistence {
            path,
            read_only: false,
            blocked: None,
            dirty: false,
            problem: None,
            kmsg_position: None,
            track_kmsg: false,
            kmsg_unsettled: false,
            legacy_cursor_pending: false,
            write_failures: 0,
            write_backoff: write_backoff(persist_interval),
            retry_write_at: None,
        }
    }

    /// From now on the state file is the one at `path`, only read: a
    /// problem with it is reported, not moved aside, and nothing is ever
    /// written.
    pub(super) fn read_only_at(&mut self, path: PathBuf) {
        self.path = Some(path);
        self.read_only = true;
    }

    /// Whether this engine writes a state file at all.
    pub(super) fn writes(&self) -> bool {
        self.path.is_some() && !self.read_only
    }

    /// The state changed: it is to be written.
    pub(super) fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    pub(super) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Why the state file is unusable or unwritten, if it is.
    pub(super) fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }

    /// The state file as it is on disk, ready to restore: `None` when there
    /// is none or it cannot be used (logged, kept aside, and the reason
    /// kept for the health; see the module docs).
    pub(super) fn open(&mut self) -> Option<StateFile> {
        let path = self.path.clone()?;
        let file = match read_state(&path, self.read_only) {
            Ok(Some(f)) => f,
            Ok(None) => {
                self.no_state_file(&path);
                return None;
            }
            Err(e) => {
                self.unusable(e);
                return None;
            }
        };
        match self.check_version(&path, file) {
            Ok(f) => Some(f),
            Err(e) => {
                self.unusable(e);
                None
            }
        }
    }

    /// The opened file was restored: the state accounts for its position.
    pub(super) fn restored(&mut self, position: Option<KmsgPosition>) {
        self.kmsg_position = position;
    }

    /// The opened file did not restore (`reason`): it is kept aside as
    /// corrupt and the engine starts fresh.
    pub(super) fn restore_failed(&mut self, reason: String) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let e = keep_aside(&path, "corrupt", reason, self.read_only);
        self.unusable(e);
    }

    /// A file of this version as is; a version 1 file with the position of
    /// its cursor file (migrated at the next write); any other version is
    /// kept aside.
    fn check_version(
        &mut self,
        path: &Path,
        mut f: StateFile,
    ) -> Result<StateFile, StateFileError> {
        if f.version == VERSION {
            return Ok(f);
        }
        if f.version == 1 {
            f.kmsg = self.legacy_cursor();
            self.legacy_cursor_pending = true;
            self.dirty = true;
            info!(path = %path.display(), position = ?f.kmsg, "Migrating the version 1 health state and kernel log cursor to one version 2 state file.");
            return Ok(f);
        }
        let newer = f.version > VERSION;
        let reason = format!(
            "format version {} (this gpuwatch reads {VERSION}{})",
            f.version,
            if newer {
                "; written by a newer gpuwatch"
            } else {
                ""
            }
        );
        let what = if newer { "newer" } else { "unsupported" };
        Err(keep_aside(path, what, reason, self.read_only))
    }

    /// No state file yet: a fresh start. A version 1 cursor without its
    /// faults would skip them, so it is ignored (and removed at the first
    /// write).
    fn no_state_file(&mut self, path: &Path) {
        if self.legacy_cursor().is_some() {
            self.legacy_cursor_pending = true;
            self.dirty = true;
            warn!(
                "A version 1 kernel log cursor exists without its health state; ignoring it and reading the whole ring."
            );
        }
        info!(path = %path.display(), "No health state file yet; starting with fresh state.");
    }

    /// The version 1 cursor file's position, if there is a readable one.
    fn legacy_cursor(&self) -> Option<KmsgPosition> {
        let dir = self.path.as_deref()?.parent()?;
        let bytes = std::fs::read(dir.join(LEGACY_CURSOR_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// A state that cannot be used. It was moved aside: start fresh, without
    /// a kernel-log position (the whole ring is read again), and write a new
    /// one. One that could not even be moved aside is still there, possibly
    /// intact: never overwrite it; run without persistence (every skipped
    /// write is counted and logged). Either way the reason is kept for the
    /// health's monitor status.
    fn unusable(&mut self, e: StateFileError) {
        self.kmsg_position = None;
        match e {
            StateFileError::Corrupt { .. } => {
                warn!(error = %e, "Health state file is unusable; kept it aside, starting with fresh state and reading the whole kernel log ring again.");
                self.problem = Some(format!(
                    "{e}; every fault still in the kernel log ring is read again"
                ));
                self.dirty = true;
            }
            StateFileError::Read { .. } | StateFileError::Write { .. } => {
                error!(error = %e, "Health state file cannot be read or moved aside; starting with fresh state in memory and leaving the file untouched (state is not persisted until gpuwatch restarts with a usable file).");
                self.blocked = Some(format!("the state file could not be read at startup ({e})"));
                self.problem = Some(format!(
                    "{e}; state is kept in memory only and the whole kernel log ring is read again"
                ));
                self.dirty = true;
            }
        }
    }

    /// Removes the version 1 cursor file once a version 2 state holds the
    /// position (after the first successful write).
    fn remove_legacy_cursor(&mut self) {
        if !self.legacy_cursor_pending {
            return;
        }
        self.legacy_cursor_pending = false;
        if let Some(dir) = self.path.as_deref().and_then(Path::parent) {
            let legacy = dir.join(LEGACY_CURSOR_FILE);
            match std::fs::remove_file(&legacy) {
                Ok(()) => {
                    info!(path = %legacy.display(), "Removed the version 1 kernel log cursor; the position now lives in the state file.");
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(path = %legacy.display(), error = %e, "Cannot remove the version 1 kernel log cursor; it is no longer read.");
                }
            }
        }
    }

    /// Records the reader's position: every kernel-log event it covers has
    /// been handled, so the state is settled there.
    pub(super) fn set_kmsg_position(&mut self, position: KmsgPosition) {
        self.kmsg_unsettled = false;
        if self.kmsg_position.as_ref() != Some(&position) {
            self.kmsg_position = Some(position);
            self.dirty = true;
        }
    }

    pub(super) fn kmsg_position(&self) -> Option<&KmsgPosition> {
        self.kmsg_position.as_ref()
    }

    /// A kernel-device reader reports its position: the state is written
    /// only at settled points from now on.
    pub(super) fn track_kmsg(&mut self) {
        self.track_kmsg = true;
    }

    /// A kernel-log fault was handled: while the position is tracked, the
    /// state is unsettled until the next position.
    pub(super) fn kmsg_event_handled(&mut self) {
        if self.track_kmsg {
            self.kmsg_unsettled = true;
        }
    }

    /// True when the state may be written now (see [`Engine::is_settled`]);
    /// `nothing_held`: no kernel-log event waits for the join grace and no
    /// record for placement.
    pub(super) fn is_settled(&self, nothing_held: bool) -> bool {
        !self.track_kmsg || (!self.kmsg_unsettled && nothing_held)
    }

    /// When the next write may happen (see [`Engine::persist_due`]).
    pub(super) fn due(&self, settled: bool) -> Option<Instant> {
        if !self.dirty || self.path.is_none() || !settled {
            return None;
        }
        Some(self.retry_write_at.unwrap_or_else(Instant::now))
    }

    /// Where to write a snapshot now, if one is due: the state changed, is
    /// settled, no backoff is running and writing is allowed. Err (counted as
    /// a failed write) when the file must not be overwritten.
    pub(super) fn write_due(
        &mut self,
        settled: bool,
        registry: &Registry,
    ) -> Result<Option<PathBuf>, StateFileError> {
        let Some(path) = self.path.clone() else {
            self.dirty = false;
            return Ok(None);
        };
        if !self.dirty || !settled {
            return Ok(None);
        }
        if self.retry_write_at.is_some_and(|t| Instant::now() < t) {
            return Ok(None);
        }
        if self.read_only {
            self.dirty = false;
            return Ok(None);
        }
        if let Some(why) = &self.blocked {
            // One error per batch of changes, not one per persist interval.
            self.dirty = false;
            registry.count_state_write(false);
            return Err(StateFileError::Write {
                path,
                source: std::io::Error::other(format!(
                    "not overwriting it: {why}; health state is kept in memory only until gpuwatch restarts with a readable file"
                )),
            });
        }
        Ok(Some(path))
    }

    /// The snapshot went to the disk (or to the writer thread): changes from
    /// here on make the state dirty again.
    pub(super) fn written(&mut self) {
        self.dirty = false;
    }

    /// The next write ignores the backoff (the final write at shutdown).
    pub(super) fn end_backoff(&mut self) {
        self.retry_write_at = None;
    }

    /// Counts a finished write and reports or ends a run of failures; true
    /// when that changed what the health says about the state file.
    pub(super) fn write_finished(
        &mut self,
        res: &Result<(), StateFileError>,
        registry: &Registry,
    ) -> bool {
        registry.count_state_write(res.is_ok());
        match res {
            Ok(()) => {
                self.retry_write_at = None;
                let ended = self.write_failures > 0;
                if ended {
                    let path = self.path.as_deref().unwrap_or(Path::new(""));
                    info!(failed_attempts = self.write_failures, path = %path.display(), "Health state file written again; nothing was lost.");
                    self.write_failures = 0;
                    self.write_backoff.reset();
                    self.problem = None;
                }
                self.remove_legacy_cursor();
                ended
            }
            Err(e) => {
                self.write_failures = self.write_failures.saturating_add(1);
                let backoff = self.write_backoff.next_delay();
                self.retry_write_at = Some(Instant::now() + backoff);
                self.problem = Some(format!(
                    "the health state file cannot be written ({e}); {} failed attempts, retrying in {} ms; the state is kept in memory",
                    self.write_failures,
                    backoff.as_millis()
                ));
                true
            }
        }
    }
}

/// The engine's state in and out of the file.
impl Engine {
    pub(super) fn to_state_file(&self) -> StateSnapshot {
        StateFile {
            version: VERSION,
            boot_id: self.boot.boot_id.clone(),
            boots: self.boots.iter().cloned().collect(),
            gpus: self
                .gpus
                .values()
                .map(|g| GpuRecord {
                    pci_address: g.pci.clone(),
                    uuid: g.uuid.clone(),
                    confirmed: g.confirmed,
                    index: g.index,
                    lost: g.lost,
                    faults: g
                        .faults
                        .iter()
                        .map(|(k, f)| fault_to_record(k, f))
                        .collect(),
                    baseline: BaselineRecord {
                        ecc_volatile_uncorrected: g.baseline.ecc_volatile_uncorrected,
                        remap_pending: g.baseline.remap_pending,
                        recovery_pending: g.baseline.recovery_pending,
                        link_degraded: g.baseline.link_degraded,
                        nvlinks_active: g.baseline.nvlinks_active.iter().copied().collect(),
                        fabric_completed: g.baseline.fabric_completed,
                        fabric_pending_unix_nano: g.baseline.fabric_pending_since,
                    },
                    reset_evidence_unix_nano: g.reset_evidence.as_ref().map(|e| e.0),
                    reset_evidence: g
                        .reset_evidence
                        .as_ref()
                        .map(|e| e.1.clone())
                        .unwrap_or_default(),
                    ecc_rose_unix_nano: g.ecc_rose_at,
                    validated_unix_nano: g.validated_at,
                })
                .collect(),
            node_faults: self
                .node_faults
                .iter()
                .map(|((_, k), f)| fault_to_record(k, f))
                .collect(),
            history: SharedHistory(
                self.history
                    .iter()
                    .map(|(k, h)| (Arc::clone(k), Arc::clone(h)))
                    .collect(),
            ),
            kmsg: self.persist.kmsg_position().cloned(),
        }
    }

    /// Loads the state file (see [`Engine::new`] and the module docs).
    pub(super) fn load(&mut self) {
        let Some(file) = self.persist.open() else {
            return;
        };
        let position = file.kmsg.clone();
        if let Err(reason) = self.restore(file) {
            self.gpus.clear();
            self.node_faults.clear();
            self.history.clear();
            self.boots.clear();
            return self.persist.restore_failed(reason);
        }
        self.persist.restored(position);
    }

    fn restore(&mut self, file: StateFile) -> Result<(), String> {
        let same_boot = file.boot_id == self.boot.boot_id;
        self.boots = file.boots.into_iter().collect();
        let mut active = 0usize;
        for r in file.gpus {
            let Some(pci) = super::model::gpu_key(&r.pci_address) else {
                return Err("a GPU record without a PCI address".to_owned());
            };
            let mut g = Gpu::new(pci.clone());
            g.uuid = r.uuid;
            for fr in r.faults {
                let (k, f) = fault_from_record(fr)?;
                g.faults.insert(k, Box::new(f));
            }
            active += g.faults.len();
            if same_boot {
                g.confirmed = r.confirmed;
                g.index = r.index;
                g.lost = r.lost;
                g.baseline = Baseline {
                    ecc_volatile_uncorrected: r.baseline.ecc_volatile_uncorrected,
                    remap_pending: r.baseline.remap_pending,
                    recovery_pending: r.baseline.recovery_pending,
                    link_degraded: r.baseline.link_degraded,
                    nvlinks_active: r.baseline.nvlinks_active.into_iter().collect(),
                    fabric_completed: r.baseline.fabric_completed,
                    fabric_pending_since: r.baseline.fabric_pending_unix_nano,
                };
                g.reset_evidence = r.reset_evidence_unix_nano.map(|t| (t, r.reset_evidence));
                g.ecc_rose_at = r.ecc_rose_unix_nano;
                g.validated_at = r.validated_unix_nano;
            } else {
                // A new boot: identity and index must be confirmed by NVML again;
                // NVML conditions are re-read, counters start over.
                g.index = r.index;
            }
            self.gpus.insert(pci, g);
        }
        for fr in file.node_faults {
            let (k, f) = fault_from_record(fr)?;
            self.node_faults.insert((f.pci.clone(), k), f);
            active += 1;
        }
        for h in file.history {
            let key = FaultKey {
                kind: parse("fault kind", &h.kind)?,
                code: h.code,
                variant: h.variant,
            };
            let mut entry = History {
                boots: h.boots.into_iter().collect(),
                last_seen: h.last_seen_unix_nano,
            };
            while entry.boots.len() > super::model::HISTORY_BOOTS {
                entry.boots.pop_front();
            }
            self.history.insert(
                Arc::new(HistoryKey {
                    identity: h.identity,
                    key,
                }),
                Arc::new(entry),
            );
        }
        if same_boot {
            info!(active_faults = active, boot_id = %self.boot.boot_id, "Restored health state of this boot.");
        } else {
            info!(active_faults = active, previous_boot = %file.boot_id, boot_id = %self.boot.boot_id, "Restored health state from an earlier boot; reboot-class faults clear once the GPUs validate.");
            self.persist.mark_dirty();
        }
        Ok(())
    }
}

/// Writing the state: settled points, the schedule, the writer thread.
impl Engine {
    /// Records the reader's position. Every kernel-log event it covers has
    /// been handled (they precede it in the channel and none is held), so
    /// the state is settled: it may be written.
    pub(super) fn set_kmsg_position(&mut self, position: KmsgPosition) {
        self.persist.set_kmsg_position(position);
    }

    /// The kernel-log position the loaded state accounts for (`None`: no
    /// state, an unusable one, or none recorded): the reader resumes after
    /// it in the same boot, and reads the whole ring otherwise.
    pub fn kmsg_position(&self) -> Option<&KmsgPosition> {
        self.persist.kmsg_position()
    }

    /// Tells the engine that a kernel-device reader will report its position
    /// ([`Input::KmsgProgress`](crate::msg::Input::KmsgProgress)): from now
    /// on the state is written only at settled points. Called before any
    /// input by the wiring that starts such a reader.
    pub fn track_kmsg_position(&mut self) {
        self.persist.track_kmsg();
    }

    /// True when the state is settled: when the kernel-log position is
    /// tracked, no kernel-log event beyond the position has been handled and
    /// none is held for the join grace, and no published record waits for
    /// placement. Only a settled state is written:
    /// the file then holds exactly the faults of the records up to its
    /// position.
    pub fn is_settled(&self) -> bool {
        self.persist
            .is_settled(self.grace.nothing_held() && self.wait.is_empty())
    }

    /// When the next state write may happen: `None` when there is nothing
    /// to write (clean, no state directory, or not settled: a later input
    /// settles it), else now or the end of the backoff after a failed write.
    pub fn persist_due(&self) -> Option<Instant> {
        self.persist.due(self.is_settled())
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
        let settled = self.is_settled();
        let Some(path) = self.persist.write_due(settled, &self.registry)? else {
            return Ok(());
        };
        let res = crate::statefile::write_json(&path, &self.to_state_file());
        if res.is_ok() {
            self.persist.written();
        }
        self.write_finished(&res);
        res
    }

    /// [`Engine::persist`] on the writer thread: the snapshot is handed over
    /// and the engine goes on; the outcome comes back through
    /// [`Engine::background_writes_done`].
    pub(super) fn persist_in_background(
        &mut self,
        writer: &StateWriter<StateSnapshot>,
    ) -> Result<(), StateFileError> {
        let settled = self.is_settled();
        let Some(path) = self.persist.write_due(settled, &self.registry)? else {
            return Ok(());
        };
        // Changes from here on make it dirty again; a failed write too.
        self.persist.written();
        writer.submit(path, self.to_state_file());
        Ok(())
    }

    /// Applies the outcomes of the writer thread's finished writes.
    pub(super) fn background_writes_done(&mut self, writer: &StateWriter<StateSnapshot>) {
        for result in writer.take_done() {
            if let Err(e) = &result {
                self.persist.mark_dirty();
                error!(error = %e, "Health state file not written.");
            }
            self.write_finished(&result);
        }
    }

    /// Counts a finished write; the health shows a run of failures and its
    /// end.
    fn write_finished(&mut self, res: &Result<(), StateFileError>) {
        if self.persist.write_finished(res, &self.registry) {
            *self.cache.get_mut() = None;
        }
    }
}

/// Retries of a failed state write: from the persist interval, doubling up to
/// 30 s, jittered (a fleet whose disks recover together does not retry in step).
fn write_backoff(persist_interval: Duration) -> crate::retry::Backoff {
    crate::retry::Backoff::new(persist_interval, Duration::from_secs(30))
}

/// Sets the kernel-log position of the state in `state_dir` (creating a
/// state with only a position when there is none), keeping everything else.
/// For tools that start an agent at the ring's current end on purpose (the
/// demo); the agent itself never moves its position without its faults.
pub fn preset_kmsg_position(
    state_dir: &Path,
    position: KmsgPosition,
) -> Result<(), StateFileError> {
    let path = state_dir.join(super::STATE_FILE);
    let mut value = match statefile::read(&path)? {
        Some(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| {
            StateFileError::Write {
                path: path.clone(),
                source: std::io::Error::other(format!("existing state does not decode: {e}")),
            }
        })?,
        None => serde_json::json!({ "version": VERSION, "boot_id": position.boot_id }),
    };
    if value.get("version").and_then(serde_json::Value::as_u64) != Some(u64::from(VERSION)) {
        return Err(StateFileError::Write {
            path,
            source: std::io::Error::other(format!(
                "existing state is not format version {VERSION}"
            )),
        });
    }
    value["kmsg"] = serde_json::to_value(&position).map_err(|e| StateFileError::Write {
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    statefile::write_json(&path, &value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position(seq: u64) -> KmsgPosition {
        KmsgPosition {
            boot_id: "boot-a".into(),
            last_seq: seq,
        }
    }

    #[test]
    fn a_failed_write_backs_off_and_the_next_success_ends_the_run() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the state directory should be: every write fails.
        std::fs::write(dir.path().join("state"), b"").unwrap();
        let path = dir.path().join("state").join(super::super::STATE_FILE);
        let registry = Registry::new();
        let mut p = Persistence::new(Some(path.clone()), Duration::from_secs(1));
        assert_eq!(p.due(true), None, "nothing changed");
        p.mark_dirty();
        assert!(p.due(true).is_some());
        let to = p.write_due(true, &registry).unwrap().unwrap();
        let res = crate::statefile::write_json(&to, &<StateFile>::default());
        assert!(res.is_err(), "the directory is a file");
        assert!(p.write_finished(&res, &registry), "the health shows it");
        let problem = p.problem().unwrap();
        assert!(problem.contains("1 failed attempts"), "{problem}");
        assert!(p.due(true).unwrap() > Instant::now(), "backing off");
        assert_eq!(p.write_due(true, &registry).unwrap(), None);
        std::fs::remove_file(dir.path().join("state")).unwrap();
        p.end_backoff();
        let to = p.write_due(true, &registry).unwrap().unwrap();
        let res = crate::statefile::write_json(&to, &<StateFile>::default());
        assert!(res.is_ok());
        p.written();
        assert!(
            p.write_finished(&res, &registry),
            "the run of failures ended"
        );
        assert_eq!(p.problem(), None);
        assert_eq!(p.due(true), None);
        assert_eq!(registry.state_writes(), (1, 1));
    }

    #[test]
    fn a_tracked_position_settles_the_state_and_only_a_new_one_dirties_it() {
        let mut p = Persistence::new(
            Some(PathBuf::from("/nonexistent/health.json")),
            Duration::from_secs(1),
        );
        p.kmsg_event_handled();
        assert!(p.is_settled(true), "untracked: always settled");
        p.track_kmsg();
        assert!(p.is_settled(true));
        assert!(!p.is_settled(false), "events held for the join grace");
        p.kmsg_event_handled();
        assert!(!p.is_settled(true));
        p.set_kmsg_position(position(7));
        assert!(p.is_settled(true) && p.is_dirty());
        assert_eq!(p.kmsg_position(), Some(&position(7)));
        p.written();
        p.set_kmsg_position(position(7));
        assert!(!p.is_dirty(), "the same position changes nothing");
        // Not settled: never due, however dirty.
        p.kmsg_event_handled();
        p.mark_dirty();
        assert_eq!(p.due(p.is_settled(true)), None);
    }

    #[test]
    fn a_file_that_could_not_be_read_is_never_overwritten() {
        let registry = Registry::new();
        let path = PathBuf::from("/nonexistent/health.json");
        let mut p = Persistence::new(Some(path.clone()), Duration::from_secs(1));
        p.unusable(StateFileError::Read {
            path,
            source: std::io::Error::other("EIO"),
        });
        assert!(p.problem().unwrap().contains("kept in memory only"));
        let err = p.write_due(true, &registry).unwrap_err();
        assert!(err.to_string().contains("not overwriting it"), "{err}");
        assert_eq!(registry.state_writes(), (0, 1), "counted as a failed write");
        // One error per batch of changes.
        assert_eq!(p.write_due(true, &registry).unwrap(), None);
        p.mark_dirty();
        assert!(p.write_due(true, &registry).is_err());
    }

    #[test]
    fn a_read_only_state_is_read_but_never_written_or_moved() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(super::super::STATE_FILE);
        std::fs::write(&path, b"{ not json").unwrap();
        let mut p = Persistence::new(None, Duration::from_secs(1));
        p.read_only_at(path.clone());
        assert!(!p.writes());
        assert!(p.open().is_none());
        assert!(p.problem().is_some());
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"{ not json",
            "left in place"
        );
        assert!(p.is_dirty());
        assert_eq!(p.write_due(true, &Registry::new()).unwrap(), None);
        assert!(!p.is_dirty());
    }

    #[test]
    fn a_corrupt_state_is_kept_aside_and_read_again_from_no_position() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(super::super::STATE_FILE);
        std::fs::write(&path, b"{ not json").unwrap();
        let mut p = Persistence::new(Some(path.clone()), Duration::from_secs(1));
        assert!(p.writes());
        assert!(p.open().is_none());
        assert!(!path.exists(), "moved aside");
        let problem = p.problem().unwrap();
        assert!(problem.contains("read again"), "{problem}");
        assert_eq!(p.kmsg_position(), None);
        assert!(p.write_due(true, &Registry::new()).unwrap().is_some());
    }
}
