//! Bounded flapping: a condition that keeps clearing and coming back is held
//! in its problem state instead of toggling forever.
//!
//! Faults that clear and come back again and again — a different fault, or
//! the same fault on another GPU, after every reboot (a node that a repair
//! controller reboots forever because each boot brings a new fault), a link
//! that retrains and drops — would move our conditions on every round, and
//! each move resets a repair controller's timer (Karpenter replaces a node
//! whose `AcceleratedHardwareReady` has been False for ten minutes without a
//! break). The same fault on the same GPU coming back across boots is not
//! this bound's business: the engine's recurrence history escalates it to
//! `inspect_hardware`. This bounds what the conditions show for the rest:
//!
//! - A condition may clear `condition_flap_limit` times within
//!   `condition_flap_window_secs` (default 3 per hour).
//! - A further clear within the window is held: the condition keeps its
//!   problem status and reason, and the fault taint stays, until the fault has
//!   stayed away for a whole window — however often it returned meanwhile.
//! - A held clear shows on the Node: the condition's message says until when
//!   (`held until 2026-12-04T19:03:00Z: cleared 3 times within 60 min; …
//!   (last: <the fault's message>)`, the time the hold ends if the fault stays
//!   away). The message stays the same while held, so a hold costs one write,
//!   and `lastTransitionTime` stays where the problem began. `/v1/health` lists
//!   the hold in `condition_holds`.
//! - Every status change of a condition we write is counted
//!   (`gpuwatch.kube.condition.transitions`), held or not.
//!
//! So a condition that keeps flapping changes status at most twice per clear
//! allowed, then holds until a quiet window has passed.
//!
//! # Where the history lives
//!
//! The case the bound exists for restarts the agent on every round (each
//! reboot is a new process), so a history kept in memory would start empty
//! every time and never engage. It lives in `<state_dir>/kube-conditions.json`
//! (`"version": 1`), owned by the reconciler — the one task that writes the
//! conditions, so the file has one writer. It is written atomically
//! (temporary file, fsync, rename, fsync of the directory) and write-ahead:
//! before a condition change it records is sent to the API server, so after a
//! crash the file never knows less than the Node showed. It is written only
//! when it changed, not on every pass. Its times are wall-clock (unix nanos),
//! since a monotonic clock starts again with every boot; a recorded time later
//! than now (the clock stepped back since) counts as now — no time passed —
//! so a clock that ran ahead before it was corrected holds a condition at most
//! a window longer. Its size is bounded: clears are pruned to the window and
//! at most `condition_flap_limit` are kept per condition, for the writer's two
//! condition types only.
//!
//! A missing file is an empty history. A file that cannot be used (corrupt,
//! unreadable, not a file, another format version) is moved aside
//! (`kube-conditions.<what>-<unix secs>`), the reason is logged at WARN and the
//! bound starts empty; one that cannot even be moved aside is left alone and
//! the history is kept in memory only. Without a state directory (dry runs,
//! tests) the history is in memory only.

use super::desired::{Desired, DesiredCondition, DesiredTaint, FALSE, TRUE, UNKNOWN};
use super::metrics::KubeMetrics;
use gpuwatch_core::clock::unix_nanos;
use gpuwatch_core::statefile::{self, StateFileError};
use gpuwatch_proto::ConditionHold;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// The history's file name in the agent's state directory.
pub(crate) const FILE_NAME: &str = "kube-conditions.json";
/// The history file's format version.
const VERSION: u32 = 1;

/// One condition's history. Times are unix nanos (wall clock).
#[derive(Debug, Default, Clone, PartialEq)]
struct Track {
    /// When it last cleared (problem status to another), within the window,
    /// oldest first; at most `limit`.
    clears: VecDeque<u64>,
    /// The status last written.
    status: Option<&'static str>,
    /// The last problem version, shown while a clear is held.
    last_problem: Option<DesiredCondition>,
    /// Clears are held: the clears allowed in a window were used up, and the
    /// fault has not yet stayed away for a whole window since.
    holding: bool,
    /// While holding: since when the fault has stayed away.
    quiet_since: Option<u64>,
}

impl Track {
    /// A recorded time later than `now` can only come from a clock that
    /// stepped back since: it counts as now (no time passed).
    fn clamp_to(&mut self, now: u64) {
        for t in self.clears.iter_mut().chain(self.quiet_since.as_mut()) {
            *t = (*t).min(now);
        }
    }
}

/// The flap bound of the conditions the writer owns.
#[derive(Debug)]
pub(crate) struct Hysteresis {
    limit: u32,
    window: Duration,
    problem_type: String,
    ready_type: String,
    /// The network condition: like the problem condition, a problem while True.
    network_type: String,
    tracks: BTreeMap<String, Track>,
    /// The fault taint last wanted with a problem condition, kept while the
    /// problem condition is held.
    last_taint: Option<DesiredTaint>,
    /// Where the history is kept (`None`: in memory only).
    path: Option<PathBuf>,
    /// The history as the file last had it (read or written), to write only
    /// what changed.
    saved: Option<HistoryFile>,
    /// The last write failed (logged once until one succeeds again).
    failing: bool,
    /// The holds as last published to the writer's metrics.
    published: Vec<ConditionHold>,
}

impl Hysteresis {
    /// `limit` clears per `window` (0: no bound), with the history kept in
    /// `path` (read now; `None`: in memory only).
    pub(crate) fn new(
        limit: u32,
        window: Duration,
        problem_type: &str,
        ready_type: &str,
        network_type: &str,
        path: Option<PathBuf>,
    ) -> Hysteresis {
        let mut h = Hysteresis {
            limit,
            window,
            problem_type: problem_type.to_owned(),
            ready_type: ready_type.to_owned(),
            network_type: network_type.to_owned(),
            tracks: BTreeMap::new(),
            last_taint: None,
            path: None,
            saved: None,
            failing: false,
            published: Vec::new(),
        };
        if let Some(path) = path {
            h.load(&path);
            h.path = Some(path);
        }
        h
    }

    /// Whether `c` shows a problem: the problem condition True, the readiness
    /// condition False.
    fn is_problem(&self, c: &DesiredCondition) -> bool {
        ((c.type_ == self.problem_type || c.type_ == self.network_type) && c.status == TRUE)
            || (c.type_ == self.ready_type && c.status == FALSE)
    }

    /// Holds clears that come too often and counts every status change.
    /// `now` is the wall clock. `as_live`: the condition types the startup
    /// hold shows as the Node has them (NVML has not reported yet): no news
    /// about the fault, so their history stays as it is.
    pub(crate) fn apply(
        &mut self,
        want: &mut Desired,
        now: SystemTime,
        as_live: &[String],
        metrics: &KubeMetrics,
    ) {
        let now = unix_nanos(now);
        let mut problem_held = false;
        let mut holds = Vec::new();
        for c in &mut want.conditions {
            let problem = self.is_problem(c);
            let (limit, window) = (self.limit, nanos(self.window));
            let is_problem_type = c.type_ == self.problem_type;
            let track = self.tracks.entry(c.type_.clone()).or_default();
            track.clamp_to(now);
            track.clears.retain(|t| now - t < window);
            if as_live.contains(&c.type_) {
                let quiet = track
                    .quiet_since
                    .filter(|_| track.holding && was_problem(track));
                if let Some(quiet) = quiet {
                    // The Node shows the hold as written before the restart.
                    holds.push(ConditionHold {
                        condition: c.type_.clone(),
                        held_until_unix_nano: quiet.saturating_add(window),
                        message: c.message.clone(),
                    });
                    problem_held |= is_problem_type;
                }
            } else if problem {
                track.last_problem = Some(c.clone());
                track.quiet_since = None;
            } else if let Some((shown, until)) = held_version(track, limit, window, now) {
                holds.push(ConditionHold {
                    condition: c.type_.clone(),
                    held_until_unix_nano: until,
                    message: shown.message.clone(),
                });
                *c = shown;
                problem_held |= is_problem_type;
            } else if track.last_problem.is_some() && was_problem(track) {
                track.clears.push_back(now);
                while track.clears.len() > limit as usize {
                    track.clears.pop_front();
                }
                track.quiet_since = None;
            }
            if track.status != Some(c.status) {
                if track.status.is_some() {
                    metrics.count_condition_transition(&c.type_, c.status);
                }
                track.status = Some(c.status);
            }
        }
        if want.fault_taint.is_some() {
            self.last_taint.clone_from(&want.fault_taint);
        } else if problem_held {
            want.fault_taint.clone_from(&self.last_taint);
        }
        if holds != self.published {
            metrics.set_condition_holds(holds.clone());
            self.published = holds;
        }
    }

    /// When a held clear may happen (the earliest), to look again then: the
    /// wall-clock time left from `now`, on the tokio clock.
    pub(crate) fn deadline(&self, now: SystemTime) -> Option<Instant> {
        let now = unix_nanos(now);
        let window = nanos(self.window);
        self.tracks
            .values()
            .filter_map(|t| t.quiet_since)
            .map(|q| q.min(now).saturating_add(window))
            .min()
            .map(|end| Instant::now() + Duration::from_nanos(end.saturating_sub(now)))
    }

    /// Writes the history when it changed since the file last had it (call
    /// after [`Hysteresis::apply`], before what it wants is sent). A failed
    /// write is logged and tried again at the next call; the conditions are
    /// written regardless.
    pub(crate) async fn save(&mut self) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let file = self.to_file();
        if self.saved.as_ref() == Some(&file) {
            return;
        }
        let result = match serde_json::to_vec_pretty(&file) {
            Ok(bytes) => {
                let at = path.clone();
                tokio::task::spawn_blocking(move || statefile::write_atomic(&at, &bytes))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
            }
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(()) => {
                if std::mem::take(&mut self.failing) {
                    tracing::info!(path = %path.display(), "Condition flap history written again.");
                }
                self.saved = Some(file);
            }
            Err(error) if !self.failing => {
                self.failing = true;
                tracing::warn!(path = %path.display(), %error, "Cannot write the condition flap history; it is kept in memory and written again at the next change (a restart meanwhile forgets the recent clears).");
            }
            Err(error) => {
                tracing::debug!(path = %path.display(), %error, "Condition flap history still cannot be written.");
            }
        }
    }

    /// The history as the file keeps it.
    fn to_file(&self) -> HistoryFile {
        HistoryFile {
            version: VERSION,
            conditions: self
                .tracks
                .iter()
                .map(|(type_, t)| (type_.clone(), TrackRecord::from(t)))
                .collect(),
            fault_taint: self.last_taint.as_ref().map(TaintRecord::from),
        }
    }

    /// Reads the history from `path` (see the module docs for a file that
    /// cannot be used).
    fn load(&mut self, path: &Path) {
        let file = match read_history(path) {
            Ok(Some(file)) => file,
            Ok(None) => {
                tracing::info!(path = %path.display(), "No condition flap history yet; the flap bound starts empty.");
                return;
            }
            Err(e) => return self.unusable(e),
        };
        if let Err(reason) = self.restore(&file) {
            self.tracks.clear();
            self.last_taint = None;
            return self.unusable(statefile::keep_aside(path, "corrupt", reason));
        }
        tracing::info!(
            path = %path.display(),
            holding = ?self.tracks.iter().filter(|(_, t)| t.holding).map(|(c, _)| c).collect::<Vec<_>>(),
            "Condition flap history read."
        );
        self.saved = Some(file);
    }

    /// A history file that cannot be used: start empty. One moved aside is
    /// replaced at the next write; one still in place is never overwritten.
    fn unusable(&mut self, e: StateFileError) {
        match e {
            StateFileError::Corrupt { .. } => {
                tracing::warn!(error = %e, "Condition flap history is unusable; kept it aside, the flap bound starts empty.");
            }
            StateFileError::Read { .. } | StateFileError::Write { .. } => {
                tracing::warn!(error = %e, "Condition flap history cannot be read or moved aside; the flap bound starts empty and is kept in memory only, leaving the file untouched.");
                self.saved = None;
                self.path = None;
            }
        }
    }

    /// Takes over a history read from the file: the writer's two condition
    /// types, at most `limit` clears each. `Err`: the file says something
    /// that cannot be (a status that is none).
    fn restore(&mut self, file: &HistoryFile) -> Result<(), String> {
        for (type_, r) in &file.conditions {
            if *type_ != self.problem_type
                && *type_ != self.ready_type
                && *type_ != self.network_type
            {
                continue;
            }
            let mut clears: Vec<u64> = r.clears_unix_nano.clone();
            clears.sort_unstable();
            let keep = clears.len().saturating_sub(self.limit as usize);
            let track = Track {
                clears: clears.into_iter().skip(keep).collect(),
                status: r.status.as_deref().map(known_status).transpose()?,
                last_problem: r
                    .last_problem
                    .as_ref()
                    .map(|p| {
                        Ok::<_, String>(DesiredCondition {
                            type_: type_.clone(),
                            status: known_status(&p.status)?,
                            reason: p.reason.clone(),
                            message: p.message.clone(),
                        })
                    })
                    .transpose()?,
                holding: r.holding,
                quiet_since: r.quiet_since_unix_nano,
            };
            self.tracks.insert(type_.clone(), track);
        }
        self.last_taint = file.fault_taint.as_ref().map(|t| DesiredTaint {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
        });
        Ok(())
    }
}

/// One of the statuses a condition can have.
fn known_status(s: &str) -> Result<&'static str, String> {
    [TRUE, FALSE, UNKNOWN]
        .into_iter()
        .find(|k| *k == s)
        .ok_or_else(|| format!("{s:?} is not a condition status"))
}

/// Whether the status last written was the problem status.
fn was_problem(track: &Track) -> bool {
    track
        .last_problem
        .as_ref()
        .is_some_and(|p| track.status == Some(p.status))
}

/// The condition to show instead of a clear, while the clear is held, and
/// when the hold ends: the clears allowed in the window are used up, and the
/// fault has not stayed away for a whole window yet.
fn held_version(
    track: &mut Track,
    limit: u32,
    window: u64,
    now: u64,
) -> Option<(DesiredCondition, u64)> {
    if limit == 0 || !was_problem(track) {
        return None;
    }
    let used = u32::try_from(track.clears.len()).unwrap_or(u32::MAX);
    track.holding |= used >= limit;
    if !track.holding {
        return None;
    }
    let quiet = *track.quiet_since.get_or_insert(now);
    if now - quiet >= window {
        track.holding = false;
        track.quiet_since = None;
        return None;
    }
    let until = quiet.saturating_add(window);
    let mut held = track.last_problem.clone()?;
    // Only the fixed parts (the bound, the hold's end, the problem's own
    // message): the same text on every pass while held.
    held.message = format!(
        "held until {}: cleared {} within {}; clears then unless the fault returns (last: {})",
        rfc3339(until),
        times(limit),
        minutes(Duration::from_nanos(window)),
        held.message
    );
    Some((held, until))
}

fn times(n: u32) -> String {
    if n == 1 {
        "once".to_owned()
    } else {
        format!("{n} times")
    }
}

fn minutes(d: Duration) -> String {
    let m = d.as_secs() / 60;
    if m >= 1 && d.as_secs().is_multiple_of(60) {
        format!("{m} min")
    } else {
        format!("{} s", d.as_secs())
    }
}

/// A unix-nanos time as RFC 3339 UTC, rounded up to the second (the hold
/// has ended by then).
fn rfc3339(unix_nanos: u64) -> String {
    let secs = unix_nanos.div_ceil(1_000_000_000);
    i64::try_from(secs)
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .map_or_else(|| format!("{secs} s after the epoch"), |t| t.to_string())
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Reads the history file: `None` when there is none. Whatever cannot be
/// used (not a regular file, unreadable, corrupt, another format version) is
/// moved aside.
fn read_history(path: &Path) -> Result<Option<HistoryFile>, StateFileError> {
    if let Ok(m) = std::fs::symlink_metadata(path)
        && !m.is_file()
    {
        let reason = format!("{} is not a regular file", path.display());
        return Err(statefile::keep_aside(path, "not-a-file", reason));
    }
    let bytes = match statefile::read(path) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(None),
        Err(StateFileError::Read { source, .. }) => {
            let reason = format!("cannot be read: {source}");
            return Err(statefile::keep_aside(path, "unreadable", reason));
        }
        Err(other) => return Err(other),
    };
    /// Just the version, read first: another version may be shaped otherwise.
    #[derive(Deserialize)]
    struct Versioned {
        version: u32,
    }
    let version = match serde_json::from_slice::<Versioned>(&bytes) {
        Ok(v) => v.version,
        Err(e) => return Err(statefile::keep_aside(path, "corrupt", e.to_string())),
    };
    if version != VERSION {
        let newer = version > VERSION;
        let reason = format!(
            "format version {version} (this gpuwatch reads {VERSION}{})",
            if newer {
                "; written by a newer gpuwatch"
            } else {
                ""
            }
        );
        let what = if newer { "newer" } else { "unsupported" };
        return Err(statefile::keep_aside(path, what, reason));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| statefile::keep_aside(path, "corrupt", e.to_string()))
}

/// The history file. Own structs, so the format changes only on purpose.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct HistoryFile {
    version: u32,
    /// By condition type.
    #[serde(default)]
    conditions: BTreeMap<String, TrackRecord>,
    /// The fault taint kept with a held problem condition.
    #[serde(default)]
    fault_taint: Option<TaintRecord>,
}

/// One condition's history as the file keeps it (see [`Track`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TrackRecord {
    #[serde(default)]
    clears_unix_nano: Vec<u64>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    last_problem: Option<ConditionRecord>,
    #[serde(default)]
    holding: bool,
    #[serde(default)]
    quiet_since_unix_nano: Option<u64>,
}

impl From<&Track> for TrackRecord {
    fn from(t: &Track) -> TrackRecord {
        TrackRecord {
            clears_unix_nano: t.clears.iter().copied().collect(),
            status: t.status.map(str::to_owned),
            last_problem: t.last_problem.as_ref().map(|p| ConditionRecord {
                status: p.status.to_owned(),
                reason: p.reason.clone(),
                message: p.message.clone(),
            }),
            holding: t.holding,
            quiet_since_unix_nano: t.quiet_since,
        }
    }
}

/// The last problem version of a condition (its type is the record's key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ConditionRecord {
    status: String,
    reason: String,
    message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TaintRecord {
    key: String,
    value: String,
    effect: String,
}

impl From<&DesiredTaint> for TaintRecord {
    fn from(t: &DesiredTaint) -> TaintRecord {
        TaintRecord {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "GPUProblem";
    const R: &str = "AcceleratedHardwareReady";
    const N: &str = "NetworkProblem";
    const MIN: Duration = Duration::from_secs(60);

    /// The tests' wall clock starts at 2027-01-15T08:00:00Z.
    fn t0() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    fn want(problem: bool) -> Desired {
        let c = |type_: &str, status, reason: &str| DesiredCondition {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message: format!("{reason} message"),
        };
        Desired {
            conditions: if problem {
                vec![
                    c(R, FALSE, "HardwareReplacementRequired"),
                    c(P, TRUE, "HardwareReplacementRequired"),
                ]
            } else {
                vec![c(R, TRUE, "GPUsHealthy"), c(P, FALSE, "NoGPUProblem")]
            },
            fault_taint: problem.then(|| DesiredTaint {
                key: "gpuwatch.io/unhealthy".into(),
                value: "inspect_hardware".into(),
                effect: "NoSchedule".into(),
            }),
        }
    }

    fn condition<'a>(d: &'a Desired, t: &str) -> &'a DesiredCondition {
        d.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    fn status(d: &Desired, t: &str) -> &'static str {
        condition(d, t).status
    }

    /// What the writer does in a pass: apply the bound at `at`, then write
    /// the history ahead of the Node.
    async fn pass(
        h: &mut Hysteresis,
        problem: bool,
        at: SystemTime,
        metrics: &KubeMetrics,
    ) -> Desired {
        let mut d = want(problem);
        h.apply(&mut d, at, &[], metrics);
        h.save().await;
        d
    }

    fn in_dir(dir: &tempfile::TempDir, limit: u32, window: Duration) -> Hysteresis {
        Hysteresis::new(limit, window, P, R, N, Some(dir.path().join(FILE_NAME)))
    }

    /// A fault that comes back after every (simulated) reboot, a minute of
    /// fault and a minute clear each round, for two hours: the conditions
    /// move a bounded number of times, the metric counts each move.
    #[tokio::test]
    async fn a_fault_returning_after_every_reboot_moves_the_conditions_a_bounded_number_of_times() {
        let metrics = KubeMetrics::new();
        let mut h = Hysteresis::new(3, Duration::from_secs(3600), P, R, N, None);
        let mut shown = Vec::new();
        let mut now = t0();
        for round in 0..60 {
            for problem in [true, false] {
                let d = pass(&mut h, problem, now, &metrics).await;
                shown.push((round, problem, status(&d, P), d.fault_taint.is_some()));
                now += MIN;
            }
        }
        let moves = shown.windows(2).filter(|w| w[0].2 != w[1].2).count();
        // Three clears allowed, then held for good while the fault keeps
        // coming back: 3 clears and 3 returns.
        assert_eq!(moves, 6, "{shown:?}");
        // While held, the taint stays with the problem condition.
        assert!(shown[10..].iter().all(|s| s.2 == TRUE && s.3), "{shown:?}");
        let counted: u64 = [TRUE, FALSE, UNKNOWN]
            .iter()
            .flat_map(|s| [P, R].map(|t| metrics.condition_transitions(t, s)))
            .sum();
        assert_eq!(counted, 12, "each move of both conditions is counted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_condition_says_until_when_and_clears_after_a_quiet_window() {
        let metrics = KubeMetrics::new();
        let window = Duration::from_secs(600);
        let mut h = Hysteresis::new(1, window, P, R, N, None);
        let mut now = t0();
        for problem in [true, false, true] {
            pass(&mut h, problem, now, &metrics).await;
            now += Duration::from_secs(10);
        }
        // The second clear within the window is held, until a window after
        // it (08:00:30 + 10 min)...
        let d = pass(&mut h, false, now, &metrics).await;
        assert_eq!(status(&d, P), TRUE);
        assert_eq!(condition(&d, P).reason, "HardwareReplacementRequired");
        assert_eq!(
            condition(&d, P).message,
            "held until 2027-01-15T08:10:30Z: cleared once within 10 min; clears then unless \
             the fault returns (last: HardwareReplacementRequired message)"
        );
        // Both conditions are held (the readiness condition was False).
        let holds = metrics.condition_holds();
        let types: Vec<&str> = holds.iter().map(|h| h.condition.as_str()).collect();
        assert_eq!(types, [R, P]);
        for hold in &holds {
            assert_eq!(hold.held_until_unix_nano, unix_nanos(now + window));
            assert_eq!(hold.message, condition(&d, &hold.condition).message);
        }
        // ...with the same message on every pass meanwhile (no write per pass).
        let later = pass(&mut h, false, now + Duration::from_secs(300), &metrics).await;
        assert_eq!(later, d);
        // The writer wakes when the wall clock says the window is over.
        let left = Duration::from_secs(300);
        assert_eq!(
            h.deadline(now + Duration::from_secs(300)),
            Some(Instant::now() + left)
        );
        let d = pass(
            &mut h,
            false,
            now + window - Duration::from_secs(1),
            &metrics,
        )
        .await;
        assert_eq!(status(&d, P), TRUE);
        let d = pass(&mut h, false, now + window, &metrics).await;
        assert_eq!(status(&d, P), FALSE);
        assert!(d.fault_taint.is_none());
        assert_eq!(h.deadline(now + window), None);
        assert!(metrics.condition_holds().is_empty());
    }

    #[tokio::test]
    async fn no_limit_means_no_hold() {
        let metrics = KubeMetrics::new();
        let mut h = Hysteresis::new(0, Duration::from_secs(3600), P, R, N, None);
        for i in 0..20 {
            let d = pass(&mut h, i % 2 == 0, t0() + i * MIN, &metrics).await;
            assert_eq!(status(&d, P), if i % 2 == 0 { TRUE } else { FALSE });
        }
        assert!(h.tracks.values().all(|t| t.clears.is_empty()));
    }

    /// Every round a new process (the history read from the same file): a
    /// fault, then a clean health. Three clears, the fourth held, and a clean
    /// boot after that still holds, until the window has passed.
    #[tokio::test]
    async fn the_bound_holds_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let window = Duration::from_secs(3600);
        let mut shown = Vec::new();
        let mut now = t0();
        for _boot in 0..4 {
            let metrics = KubeMetrics::new();
            let mut h = in_dir(&dir, 3, window);
            for problem in [true, false] {
                let d = pass(&mut h, problem, now, &metrics).await;
                shown.push(status(&d, P));
                now += MIN;
            }
        }
        assert_eq!(
            shown,
            [TRUE, FALSE, TRUE, FALSE, TRUE, FALSE, TRUE, TRUE],
            "three clears, the fourth held"
        );
        let held_since = now - MIN;
        let file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(FILE_NAME)).unwrap()).unwrap();
        assert_eq!(file["version"], 1);
        assert_eq!(file["conditions"][P]["holding"], true);
        assert_eq!(file["fault_taint"]["value"], "inspect_hardware");
        // A clean boot: still held, the taint kept, the same message.
        let metrics = KubeMetrics::new();
        let mut h = in_dir(&dir, 3, window);
        let d = pass(&mut h, false, now + MIN, &metrics).await;
        assert_eq!(status(&d, P), TRUE);
        assert!(
            condition(&d, P)
                .message
                .starts_with("held until 2027-01-15T09:07:00Z: cleared 3 times within 60 min"),
            "{d:?}"
        );
        assert_eq!(
            d.fault_taint.as_ref().map(|t| t.value.as_str()),
            Some("inspect_hardware")
        );
        // The status is the one written before: no transition in this process.
        assert_eq!(metrics.condition_transitions(P, TRUE), 0);
        drop(h);
        // A clean boot once the fault has stayed away a whole window.
        let metrics = KubeMetrics::new();
        let mut h = in_dir(&dir, 3, window);
        let d = pass(&mut h, false, held_since + window, &metrics).await;
        assert_eq!(status(&d, P), FALSE);
        assert!(d.fault_taint.is_none());
        assert_eq!(metrics.condition_transitions(P, FALSE), 1);
    }

    /// The startup hold shows a condition as the Node has it until NVML
    /// reports: no news about the fault. A held clear stays held (the same
    /// end), a problem shown before is still one whose clear counts.
    #[tokio::test]
    async fn conditions_shown_as_live_leave_the_history_alone() {
        let dir = tempfile::tempdir().unwrap();
        let window = Duration::from_secs(3600);
        let metrics = KubeMetrics::new();
        let mut h = in_dir(&dir, 1, window);
        pass(&mut h, true, t0(), &metrics).await;
        pass(&mut h, false, t0() + MIN, &metrics).await;
        pass(&mut h, true, t0() + 2 * MIN, &metrics).await;
        let held = pass(&mut h, false, t0() + 3 * MIN, &metrics).await;
        assert_eq!(status(&held, P), TRUE);
        drop(h);
        // Restart: the Node's (held) conditions are shown as they are.
        let mut h = in_dir(&dir, 1, window);
        let mut live = held.clone();
        live.fault_taint = None;
        let types = [P.to_owned(), R.to_owned()];
        h.apply(&mut live, t0() + 4 * MIN, &types, &metrics);
        h.save().await;
        assert_eq!(
            live.fault_taint, held.fault_taint,
            "the taint stays while held"
        );
        let holds = metrics.condition_holds();
        assert_eq!(holds.len(), 2, "{holds:?}");
        let until = unix_nanos(t0() + 63 * MIN);
        assert!(holds.iter().all(|h| h.held_until_unix_nano == until));
        let d = pass(&mut h, false, t0() + 5 * MIN, &metrics).await;
        assert_eq!(d, held, "the same hold, ending a window after it began");
        // Not holding: a problem shown as live is still the last status
        // written, so the clear after it counts (and the next one is held).
        let dir = tempfile::tempdir().unwrap();
        let mut h = in_dir(&dir, 1, window);
        let problem = pass(&mut h, true, t0(), &metrics).await;
        drop(h);
        let mut h = in_dir(&dir, 1, window);
        let mut live = problem.clone();
        h.apply(&mut live, t0() + MIN, &types, &metrics);
        assert_eq!(
            status(&pass(&mut h, false, t0() + 2 * MIN, &metrics).await, P),
            FALSE
        );
        pass(&mut h, true, t0() + 3 * MIN, &metrics).await;
        assert_eq!(
            status(&pass(&mut h, false, t0() + 4 * MIN, &metrics).await, P),
            TRUE
        );
    }

    /// A clock stepped back: the times recorded "in the future" count as
    /// now, so the hold lasts a whole window from the step, not longer.
    #[tokio::test]
    async fn a_clock_that_steps_back_counts_as_no_time_passed() {
        let metrics = KubeMetrics::new();
        let window = Duration::from_secs(600);
        let mut h = Hysteresis::new(1, window, P, R, N, None);
        for (i, problem) in [true, false, true, false].into_iter().enumerate() {
            pass(
                &mut h,
                problem,
                t0() + u32::try_from(i).unwrap() * MIN,
                &metrics,
            )
            .await;
        }
        let stepped = t0() - Duration::from_secs(3600);
        let d = pass(&mut h, false, stepped, &metrics).await;
        assert_eq!(status(&d, P), TRUE, "no time passed");
        assert!(
            condition(&d, P)
                .message
                .starts_with("held until 2027-01-15T07:10:00Z"),
            "{d:?}"
        );
        let d = pass(
            &mut h,
            false,
            stepped + window - Duration::from_secs(1),
            &metrics,
        )
        .await;
        assert_eq!(status(&d, P), TRUE);
        let d = pass(&mut h, false, stepped + window, &metrics).await;
        assert_eq!(status(&d, P), FALSE);
        // The clear recorded before the step counted from the step, so it is
        // pruned a window after it; the hold's end is a clear of its own.
        let clears: Vec<u64> = h.tracks[P].clears.iter().copied().collect();
        assert_eq!(clears, [unix_nanos(stepped + window)]);
    }

    #[tokio::test]
    async fn the_history_is_written_only_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let metrics = KubeMetrics::new();
        let mut h = in_dir(&dir, 3, Duration::from_secs(3600));
        pass(&mut h, true, t0(), &metrics).await;
        assert!(path.exists(), "written before the Node is");
        std::fs::remove_file(&path).unwrap();
        pass(&mut h, true, t0() + MIN, &metrics).await;
        assert!(!path.exists(), "nothing changed: nothing written");
        pass(&mut h, false, t0() + 2 * MIN, &metrics).await;
        let file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let clears = &file["conditions"][P]["clears_unix_nano"];
        assert_eq!(clears.as_array().map(Vec::len), Some(1), "{file}");
    }

    #[tokio::test]
    async fn at_most_limit_clears_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = KubeMetrics::new();
        let mut h = in_dir(&dir, 3, Duration::from_secs(3600));
        for i in 0..6 {
            pass(&mut h, i % 2 == 0, t0() + i * MIN, &metrics).await;
        }
        assert_eq!(h.tracks[P].clears.len(), 3);
        drop(h);
        // A lower limit after a restart keeps the newest.
        let mut h = in_dir(&dir, 2, Duration::from_secs(3600));
        let newest = h.tracks[P].clears.clone();
        assert_eq!(newest.len(), 2);
        assert_eq!(newest.back().copied(), Some(unix_nanos(t0() + 5 * MIN)));
        pass(&mut h, false, t0() + 6 * MIN, &metrics).await;
        let file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(FILE_NAME)).unwrap()).unwrap();
        assert_eq!(
            file["conditions"][P]["clears_unix_nano"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
    }

    /// A corrupt file and one of a newer format are kept aside, and the
    /// bound starts empty (the next clear is allowed).
    #[tokio::test]
    async fn an_unusable_history_is_kept_aside_and_the_bound_starts_empty() {
        for (content, what) in [
            (&b"{\"version\": 1, \"conditions\": "[..], "corrupt"),
            (&b"{\"version\": 2, \"conditions\": []}"[..], "newer"),
            (
                &br#"{"version": 1, "conditions": {"GPUProblem": {"status": "Maybe"}}}"#[..],
                "corrupt",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(FILE_NAME);
            std::fs::write(&path, content).unwrap();
            let metrics = KubeMetrics::new();
            let mut h = in_dir(&dir, 1, Duration::from_secs(3600));
            let aside: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(aside.len(), 1, "{aside:?}");
            assert!(
                aside[0].starts_with(&format!("kube-conditions.{what}-")),
                "{aside:?}"
            );
            assert_eq!(std::fs::read(dir.path().join(&aside[0])).unwrap(), content);
            pass(&mut h, true, t0(), &metrics).await;
            let d = pass(&mut h, false, t0() + MIN, &metrics).await;
            assert_eq!(status(&d, P), FALSE, "{what}: the first clear is allowed");
            assert!(path.exists(), "a fresh history replaces it");
        }
    }
}
