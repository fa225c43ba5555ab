//! The poller: NVML lifecycle (load, init, retry), one `GpuSample` per GPU per
//! interval, and lost-GPU detection.

use super::library::{self, Library};
use super::watchdog::{self, CallWatch, EndGuard, Role, Supervisor};
use super::{Ctx, Identity, NvmlError, NvmlSettings, fault};
use gpuwatch_core::msg::Input;
use gpuwatch_proto::{FaultKind, GpuSample, NvLinkSample, RecoveryAction, Source};
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, NVML_FI_DEV_REMAPPED_COR, NVML_FI_DEV_REMAPPED_FAILURE,
    NVML_FI_DEV_REMAPPED_PENDING, NVML_FI_DEV_REMAPPED_UNC,
};
use nvml_wrapper::{Device, Nvml};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Links probed per GPU (`NVML_NVLINK_MAX_LINKS`).
const NVLINK_MAX_LINKS: u32 = 18;

/// What every NVML call of a poll goes through: the deadline watch, and the
/// counter of failed calls (by NVML function name).
pub(super) struct Calls<'a> {
    pub(super) watch: &'a CallWatch,
    pub(super) count: &'a dyn Fn(&'static str),
}

/// A call on a GPU answered `GPU_IS_LOST`.
#[derive(Debug)]
struct Lost;

/// Makes one NVML call `call` under the deadline and classifies its answer
/// (see [`classify`]).
fn reading<T>(
    calls: &Calls<'_>,
    call: &'static str,
    f: impl FnOnce() -> Result<T, WrapperError>,
) -> Result<Option<T>, Lost> {
    classify(call, calls.watch.call(call, f), calls.count)
}

/// Turns one answer into `Some` / `None` (not supported, or failed and counted),
/// or `Lost`.
fn classify<T>(
    call: &'static str,
    r: Result<T, WrapperError>,
    count: &dyn Fn(&'static str),
) -> Result<Option<T>, Lost> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(WrapperError::GpuLost) => Err(Lost),
        // A symbol the driver does not export is an old driver: not supported.
        Err(WrapperError::NotSupported | WrapperError::FailedToLoadSymbol(_)) => Ok(None),
        Err(e) => {
            count(call);
            tracing::debug!(call, error = %e, "NVML call failed.");
            Ok(None)
        }
    }
}

/// Outcome of reading one enumeration slot.
#[derive(Debug)]
enum GpuRead {
    Sample(Box<GpuSample>),
    /// `GPU_IS_LOST` (identity as far as it was read).
    Lost(Identity),
    /// Some other error made the slot unreadable (counted).
    Failed,
}

/// Result of polling every GPU.
#[derive(Debug, Default)]
pub(super) struct PollResult {
    pub(super) samples: Vec<GpuSample>,
    lost: Vec<Identity>,
    /// Every slot was read or answered `GPU_IS_LOST`, and every sample carries
    /// its UUID and PCI address.
    pub(super) complete: bool,
    /// GPUs `nvmlDeviceGetCount` reported.
    pub(super) count: u32,
    /// The driver's version (`nvmlSystemGetDriverVersion`; empty when the
    /// call failed), also in every sample.
    driver: String,
}

/// Reads every GPU once.
pub(super) fn poll_all(nvml: &Nvml, calls: &Calls<'_>) -> Result<PollResult, NvmlError> {
    let n = calls
        .watch
        .call("nvmlDeviceGetCount_v2", || nvml.device_count())
        .map_err(|source| NvmlError::Enumerate { source })?;
    let mut out = PollResult {
        complete: true,
        count: n,
        ..PollResult::default()
    };
    for i in 0..n {
        match read_gpu(nvml, i, calls) {
            GpuRead::Sample(s) => out.samples.push(*s),
            GpuRead::Lost(id) => out.lost.push(id),
            GpuRead::Failed => out.complete = false,
        }
    }
    out.driver = calls
        .watch
        .call("nvmlSystemGetDriverVersion", || nvml.sys_driver_version())
        .unwrap_or_default();
    for s in &mut out.samples {
        s.driver_version.clone_from(&out.driver);
    }
    Ok(out)
}

fn read_gpu(nvml: &Nvml, i: u32, calls: &Calls<'_>) -> GpuRead {
    let dev = match calls
        .watch
        .call("nvmlDeviceGetHandleByIndex_v2", || nvml.device_by_index(i))
    {
        Ok(d) => d,
        Err(WrapperError::GpuLost) => {
            return GpuRead::Lost(Identity {
                index: Some(i),
                ..Identity::default()
            });
        }
        Err(e) => {
            (calls.count)("nvmlDeviceGetHandleByIndex_v2");
            tracing::warn!(gpu = i, error = %e, "NVML cannot open the GPU.");
            return GpuRead::Failed;
        }
    };
    let mut id = Identity {
        index: Some(i),
        ..Identity::default()
    };
    match sample(&dev, &mut id, calls) {
        Ok(s) => GpuRead::Sample(Box::new(s)),
        Err(Lost) => GpuRead::Lost(id),
    }
}

/// Reads one GPU; fills `id` as the identity becomes known (for a lost report).
fn sample(dev: &Device<'_>, id: &mut Identity, c: &Calls<'_>) -> Result<GpuSample, Lost> {
    if let Some(index) = reading(c, "nvmlDeviceGetIndex", || dev.index())? {
        id.index = Some(index);
    }
    id.uuid = reading(c, "nvmlDeviceGetUUID", || dev.uuid())?.unwrap_or_default();
    id.pci = reading(c, "nvmlDeviceGetPciInfo_v3", || dev.pci_info())?
        .and_then(|p| xid_parser::normalize_pci(&p.bus_id))
        .unwrap_or_default();
    let mut s = GpuSample {
        index: id.index.unwrap_or_default(),
        uuid: id.uuid.clone(),
        pci_address: id.pci.clone(),
        name: reading(c, "nvmlDeviceGetName", || dev.name())?.unwrap_or_default(),
        time_unix_nano: Some(gpuwatch_core::clock::unix_nanos(
            std::time::SystemTime::now(),
        )),
        ..GpuSample::default()
    };
    s.temperature_c = reading(c, "nvmlDeviceGetTemperature", || {
        dev.temperature(TemperatureSensor::Gpu)
    })?;
    s.slowdown_temperature_c = reading(c, "nvmlDeviceGetTemperatureThreshold", || {
        dev.temperature_threshold(TemperatureThreshold::Slowdown)
    })?;
    s.shutdown_temperature_c = reading(c, "nvmlDeviceGetTemperatureThreshold", || {
        dev.temperature_threshold(TemperatureThreshold::Shutdown)
    })?;
    s.power_mw = reading(c, "nvmlDeviceGetPowerUsage", || dev.power_usage())?;
    s.power_limit_mw = reading(c, "nvmlDeviceGetEnforcedPowerLimit", || {
        dev.enforced_power_limit()
    })?;
    s.clock_event_reasons = reading(c, "nvmlDeviceGetCurrentClocksThrottleReasons", || {
        dev.current_throttle_reasons()
    })?
    .map(|r| r.bits());
    let ecc = |e, k| {
        reading(c, "nvmlDeviceGetTotalEccErrors", || {
            dev.total_ecc_errors(e, k)
        })
    };
    s.ecc_volatile_corrected = ecc(MemoryError::Corrected, EccCounter::Volatile)?;
    s.ecc_volatile_uncorrected = ecc(MemoryError::Uncorrected, EccCounter::Volatile)?;
    s.ecc_aggregate_corrected = ecc(MemoryError::Corrected, EccCounter::Aggregate)?;
    s.ecc_aggregate_uncorrected = ecc(MemoryError::Uncorrected, EccCounter::Aggregate)?;
    let pages = |cause| reading(c, "nvmlDeviceGetRetiredPages", || dev.retired_pages(cause));
    s.retired_pages_sbe =
        pages(RetirementCause::MultipleSingleBitEccErrors)?.map(|p| p.len() as u64);
    s.retired_pages_dbe = pages(RetirementCause::DoubleBitEccError)?.map(|p| p.len() as u64);
    s.retired_pages_pending = reading(c, "nvmlDeviceGetRetiredPagesPendingStatus", || {
        dev.are_pages_pending_retired()
    })?;
    s.pcie_link_gen = reading(c, "nvmlDeviceGetCurrPcieLinkGeneration", || {
        dev.current_pcie_link_gen()
    })?;
    s.pcie_link_gen_max = reading(c, "nvmlDeviceGetMaxPcieLinkGeneration", || {
        dev.max_pcie_link_gen()
    })?;
    s.pcie_link_width = reading(c, "nvmlDeviceGetCurrPcieLinkWidth", || {
        dev.current_pcie_link_width()
    })?;
    s.pcie_link_width_max = reading(c, "nvmlDeviceGetMaxPcieLinkWidth", || {
        dev.max_pcie_link_width()
    })?;
    s.pcie_replay_counter = reading(c, "nvmlDeviceGetPcieReplayCounter", || {
        dev.pcie_replay_counter()
    })?
    .map(u64::from);
    s.persistence_mode = reading(c, "nvmlDeviceGetPersistenceMode", || {
        dev.is_in_persistent_mode()
    })?;
    s.vbios_version =
        reading(c, "nvmlDeviceGetVbiosVersion", || dev.vbios_version())?.unwrap_or_default();
    // NOT_SUPPORTED on boards whose infoROM has no serial: left empty, so the
    // exports leave the attribute out.
    s.serial = reading(c, "nvmlDeviceGetSerial", || dev.serial())?.unwrap_or_default();
    // Millijoules since the driver was loaded; NOT_SUPPORTED before Volta.
    s.energy_mj = reading(c, "nvmlDeviceGetTotalEnergyConsumption", || {
        dev.total_energy_consumption()
    })?;
    fields(dev, &mut s, c)?;
    s.nvlinks = nvlinks(dev, c)?;
    s.fabric = reading(c, super::fabric::CALL, || super::fabric::read(dev))?;
    let mode = reading(c, "nvmlDeviceGetMigMode", || super::mig::mode(dev))?;
    s.mig_enabled = mode.map(|m| m.0);
    s.mig_pending = mode.map(|m| m.1);
    if s.mig_enabled == Some(true) {
        s.mig_devices =
            reading(c, super::mig::CALL, || super::mig::devices(dev, c.count))?.unwrap_or_default();
    }
    Ok(s)
}

/// Remapped rows (fields 142..=145) and the GPU recovery action (field 230),
/// in one `nvmlDeviceGetFieldValues` call.
fn fields(dev: &Device<'_>, s: &mut GpuSample, c: &Calls<'_>) -> Result<(), Lost> {
    const CALL: &str = "nvmlDeviceGetFieldValues";
    let ids = [
        NVML_FI_DEV_REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_UNC,
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_FAILURE,
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    ];
    let ids_wrapped: Vec<FieldId> = ids.iter().map(|&i| FieldId(i)).collect();
    let Some(values) = reading(c, CALL, || dev.field_values_for(&ids_wrapped))? else {
        return Ok(());
    };
    let mut got: [Option<u64>; 5] = [None; 5];
    for (slot, v) in got.iter_mut().zip(values) {
        let v = match v {
            Ok(sample) => sample.value,
            Err(e) => Err(e),
        };
        *slot = classify(CALL, v, c.count)?.and_then(|v| match v {
            SampleValue::U32(x) => Some(u64::from(x)),
            SampleValue::U64(x) => Some(x),
            SampleValue::I64(x) => u64::try_from(x).ok(),
            SampleValue::F64(_) => None,
        });
    }
    let u32_of = |v: Option<u64>| v.map(|x| u32::try_from(x).unwrap_or(u32::MAX));
    s.remapped_rows_correctable = u32_of(got[0]);
    s.remapped_rows_uncorrectable = u32_of(got[1]);
    s.remapped_rows_pending = got[2].map(|x| x != 0);
    s.remapped_rows_failure = got[3].map(|x| x != 0);
    if let Some(raw) = got[4] {
        match RecoveryAction::from_nvml(raw) {
            Some(a) => s.set_recovery_action(a),
            None => {
                tracing::debug!(value = raw, "Unknown NVML GPU recovery action value.");
            }
        }
    }
    Ok(())
}

/// State and error counters of every NVLink the GPU has.
fn nvlinks(dev: &Device<'_>, c: &Calls<'_>) -> Result<Vec<NvLinkSample>, Lost> {
    let mut out = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        let l = dev.link_wrapper_for(link);
        let active = match c.watch.call("nvmlDeviceGetNvLinkState", || l.is_active()) {
            Ok(a) => a,
            Err(WrapperError::GpuLost) => return Err(Lost),
            // Past the last link.
            Err(WrapperError::InvalidArg) => break,
            // No NVLink, or this link is absent / disabled.
            Err(WrapperError::NotSupported | WrapperError::FailedToLoadSymbol(_)) => continue,
            Err(e) => {
                (c.count)("nvmlDeviceGetNvLinkState");
                tracing::debug!(link, error = %e, "NVML cannot read the NVLink state.");
                continue;
            }
        };
        let counter = |k| reading(c, "nvmlDeviceGetNvLinkErrorCounter", || l.error_counter(k));
        out.push(NvLinkSample {
            link,
            active: Some(active),
            replay_errors: counter(ErrorCounter::DlReplay)?,
            recovery_errors: counter(ErrorCounter::DlRecovery)?,
            crc_flit_errors: counter(ErrorCounter::DlCrcFlit)?,
            crc_data_errors: counter(ErrorCounter::DlCrcData)?,
        });
    }
    Ok(out)
}

/// Remembers which GPUs were seen, to report each disappearance once.
#[derive(Debug, Default)]
pub(super) struct LostTracker {
    /// Every GPU seen, by UUID.
    known: BTreeMap<String, Identity>,
    /// Keys (UUID, or `index:N` when the UUID is unknown) reported lost and not back.
    lost: BTreeSet<String>,
    /// UUIDs present in the previous poll (`None` before the first).
    last_present: Option<BTreeSet<String>>,
}

/// What one poll changed.
#[derive(Debug, Default)]
pub(super) struct LostUpdate {
    /// GPUs newly lost: identity and description.
    pub(super) newly_lost: Vec<(Identity, String)>,
    /// GPUs back after being reported lost.
    pub(super) back: Vec<Identity>,
    /// The set of answering GPUs differs from the previous poll.
    pub(super) changed: bool,
}

impl LostTracker {
    /// Completes the identity of samples whose identity calls failed from the
    /// GPUs seen before (UUID by PCI address, PCI address by UUID, both by
    /// index), so one failed `nvmlDeviceGetPciInfo` or `nvmlDeviceGetUUID` never
    /// makes a GPU look absent. A sample whose UUID or PCI address stays
    /// unknown makes the poll incomplete (no GPU may be declared missing from it).
    pub(super) fn fill_identity(&self, r: &mut PollResult) {
        for s in &mut r.samples {
            if s.uuid.is_empty()
                && !s.pci_address.is_empty()
                && let Some(k) = self.known.values().find(|k| k.pci == s.pci_address)
            {
                s.uuid.clone_from(&k.uuid);
            }
            if s.pci_address.is_empty()
                && !s.uuid.is_empty()
                && let Some(k) = self.known.get(&s.uuid)
            {
                s.pci_address.clone_from(&k.pci);
            }
            if s.uuid.is_empty() && s.pci_address.is_empty() {
                let mut same_index = self.known.values().filter(|k| k.index == Some(s.index));
                if let (Some(k), None) = (same_index.next(), same_index.next()) {
                    s.uuid.clone_from(&k.uuid);
                    s.pci_address.clone_from(&k.pci);
                }
            }
            if s.uuid.is_empty() || s.pci_address.is_empty() {
                tracing::warn!(gpu = s.index, uuid = %s.uuid, pci = %s.pci_address, "NVML did not report the GPU's full identity; this poll cannot tell which GPUs are missing.");
                r.complete = false;
            }
        }
    }

    pub(super) fn update(&mut self, r: &PollResult) -> LostUpdate {
        let mut up = LostUpdate::default();
        let present: BTreeSet<String> = r
            .samples
            .iter()
            .filter(|s| !s.uuid.is_empty())
            .map(|s| s.uuid.clone())
            .collect();
        for l in &r.lost {
            let id = if !l.uuid.is_empty() {
                self.known
                    .get(&l.uuid)
                    .cloned()
                    .unwrap_or_else(|| l.clone())
            } else {
                self.known
                    .values()
                    .find(|k| k.index == l.index && !present.contains(&k.uuid))
                    .cloned()
                    .unwrap_or_else(|| l.clone())
            };
            let key = key_of(&id);
            if self.lost.insert(key) {
                let what = format!(
                    "NVML reports GPU {} ({}, {}) is lost (GPU_IS_LOST).",
                    id.index.map_or("?".to_string(), |i| i.to_string()),
                    or_unknown(&id.uuid),
                    or_unknown(&id.pci),
                );
                up.newly_lost.push((id, what));
            }
        }
        // An empty enumeration is a monitor problem (driver unloaded, GPUs
        // hidden from the container), never "every GPU vanished".
        if r.complete && r.count > 0 {
            let visible = r.samples.len() + r.lost.len();
            for (uuid, id) in &self.known {
                if !present.contains(uuid) && !self.lost.contains(uuid) {
                    self.lost.insert(uuid.clone());
                    let what = format!(
                        "GPU {} ({}, {}) vanished from NVML enumeration ({} GPUs visible, was {}).",
                        id.index.map_or("?".to_string(), |i| i.to_string()),
                        uuid,
                        or_unknown(&id.pci),
                        visible,
                        self.last_present.as_ref().map_or(0, BTreeSet::len),
                    );
                    up.newly_lost.push((id.clone(), what));
                }
            }
        }
        for s in &r.samples {
            let id = Identity {
                index: Some(s.index),
                uuid: s.uuid.clone(),
                pci: s.pci_address.clone(),
            };
            let index_key = format!("index:{}", s.index);
            let was_lost = self.lost.remove(&s.uuid) | self.lost.remove(&index_key);
            if was_lost {
                up.back.push(id.clone());
            }
            if !s.uuid.is_empty() {
                self.known.insert(s.uuid.clone(), id);
            }
        }
        up.changed = self.last_present.as_ref().is_some_and(|p| *p != present);
        self.last_present = Some(present);
        up
    }
}

fn key_of(id: &Identity) -> String {
    if id.uuid.is_empty() {
        format!("index:{}", id.index.unwrap_or(u32::MAX))
    } else {
        id.uuid.clone()
    }
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "unknown" } else { s }
}

/// Runs the poller source: resolves the library (file work, no NVML call),
/// then supervises poller workers (see the `watchdog` module) until shutdown.
pub(super) fn supervise(cfg: NvmlSettings, ctx: Ctx) {
    let mut retry = watchdog::retry_backoff(cfg.retry_interval);
    let lib = loop {
        if ctx.stopping() {
            return;
        }
        match Library::choose(&cfg) {
            Ok(l) => break l,
            Err(e) => {
                ctx.registry.count_nvml_error(e.call());
                let delay = retry.next().unwrap_or(cfg.retry_interval);
                if !ctx.report_poll(false, e.to_string()) || !ctx.sleep(delay) {
                    return;
                }
            }
        }
    };
    let path = lib.path().to_path_buf();
    // Survives worker restarts: a GPU lost before a hang is not reported again.
    let tracker = Arc::new(Mutex::new(LostTracker::default()));
    let sup = Supervisor {
        role: Role::Poller,
        ctx: ctx.clone(),
        deadline: cfg.call_timeout,
        retry: cfg.retry_interval,
    };
    sup.run(|wctx| {
        let poller = Poller {
            cfg: cfg.clone(),
            ctx: wctx,
            path: path.clone(),
            tracker: tracker.clone(),
        };
        std::thread::Builder::new()
            .name("nvml-poll-call".into())
            .spawn(move || {
                let _end = EndGuard(poller.ctx.watch.clone());
                poller.run();
            })
            .map(drop)
    });
    // The event source stops watching with this poller's handle.
    ctx.shared.publish(&ctx.watch, None);
    drop(lib);
}

/// A poller worker: initialises NVML and polls until shutdown, abandonment,
/// or an enumeration failure (then it initialises again).
#[derive(Debug)]
struct Poller {
    cfg: NvmlSettings,
    ctx: Ctx,
    path: PathBuf,
    tracker: Arc<Mutex<LostTracker>>,
}

impl Poller {
    fn fail(&self, e: &NvmlError, retry: &mut impl Iterator<Item = std::time::Duration>) -> bool {
        self.ctx.registry.count_nvml_error(e.call());
        let delay = retry.next().unwrap_or(self.cfg.retry_interval);
        self.ctx.report_poll(false, e.to_string()) && self.ctx.sleep(delay)
    }

    fn run(self) {
        let mut retry = watchdog::retry_backoff(self.cfg.retry_interval);
        while !self.ctx.stopping() {
            let nvml = match library::init(&self.path, &self.ctx.watch) {
                Ok(n) => Arc::new(n),
                Err(e) => {
                    if !self.fail(&e, &mut retry) {
                        break;
                    }
                    continue;
                }
            };
            tracing::debug!(library = %self.path.display(), "NVML initialised.");
            let go_on = self.session(&nvml, &mut retry);
            // Dropping the last handle calls nvmlShutdown, which may hang too.
            self.ctx.watch.call("nvmlShutdown", || drop(nvml));
            if !go_on {
                break;
            }
        }
    }

    /// Polls with one NVML handle until enumeration fails (→ true: initialise
    /// again) or the thread should stop (→ false).
    fn session(
        &self,
        nvml: &Arc<Nvml>,
        retry: &mut impl Iterator<Item = std::time::Duration>,
    ) -> bool {
        let mut published = false;
        let registry = self.ctx.registry.clone();
        let count = move |call: &'static str| registry.count_nvml_error(call);
        let calls = Calls {
            watch: &self.ctx.watch,
            count: &count,
        };
        loop {
            let mut result = match poll_all(nvml, &calls) {
                Ok(r) => r,
                Err(e) => {
                    self.ctx.shared.publish(&self.ctx.watch, None);
                    return self.fail(&e, retry);
                }
            };
            if self.ctx.stopping() {
                return false;
            }
            let driver = result.driver.clone();
            if result.count == 0 {
                // Zero GPUs: the driver or the container's device list is
                // broken; GPU health is unknown, no GPU is "lost".
                let status = format!(
                    "NVML {driver} enumerates no GPUs (driver not loaded or GPUs not visible to gpuwatch)"
                );
                if !self.ctx.report_poll(false, status) || !self.ctx.sleep(self.cfg.poll_interval) {
                    return false;
                }
                continue;
            }
            let status = format!(
                "NVML {driver}: {} GPUs, {} answering",
                result.count,
                result.samples.len()
            );
            if !self.ctx.report_poll(true, status) {
                return false;
            }
            let up = {
                let mut tracker = self.tracker.lock().unwrap_or_else(|e| e.into_inner());
                tracker.fill_identity(&mut result);
                tracker.update(&result)
            };
            for (id, what) in up.newly_lost {
                tracing::warn!(gpu = ?id.index, uuid = %id.uuid, pci = %id.pci, "NVML lost a GPU.");
                let ev = fault(
                    FaultKind::GpuLost,
                    0,
                    &id,
                    Source::NvmlPoll,
                    "GPU lost",
                    what,
                );
                if !self.ctx.send(Input::Fault {
                    event: ev,
                    read_at: std::time::Instant::now(),
                }) {
                    return false;
                }
            }
            for id in up.back {
                tracing::info!(gpu = ?id.index, uuid = %id.uuid, pci = %id.pci, "A lost GPU answers NVML again.");
            }
            if !published {
                self.ctx
                    .shared
                    .publish(&self.ctx.watch, Some(Arc::downgrade(nvml)));
                published = true;
            } else if up.changed {
                self.ctx.shared.gpus_changed();
            }
            if !self.ctx.send_samples(result.samples, result.complete) {
                return false;
            }
            if !self.ctx.sleep(self.cfg.poll_interval) {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(index: u32, uuid: &str) -> GpuSample {
        GpuSample {
            index,
            uuid: uuid.into(),
            pci_address: format!("0000:{:02x}:00.0", 0x10 + index),
            ..GpuSample::default()
        }
    }

    fn poll(samples: Vec<GpuSample>, lost: Vec<Identity>, complete: bool) -> PollResult {
        PollResult {
            count: (samples.len() + lost.len()) as u32,
            samples,
            lost,
            complete,
            driver: String::new(),
        }
    }

    #[test]
    fn vanished_gpu_is_reported_once_and_cleared_when_back() {
        let mut t = LostTracker::default();
        let up = t.update(&poll(
            vec![sample(0, "GPU-a"), sample(1, "GPU-b")],
            vec![],
            true,
        ));
        assert!(up.newly_lost.is_empty() && !up.changed);
        let up = t.update(&poll(vec![sample(0, "GPU-a")], vec![], true));
        assert_eq!(up.newly_lost.len(), 1);
        assert_eq!(up.newly_lost[0].0.uuid, "GPU-b");
        assert_eq!(up.newly_lost[0].0.pci, "0000:11:00.0");
        assert!(up.changed);
        let up = t.update(&poll(vec![sample(0, "GPU-a")], vec![], true));
        assert!(up.newly_lost.is_empty(), "reported twice");
        let up = t.update(&poll(
            vec![sample(0, "GPU-a"), sample(1, "GPU-b")],
            vec![],
            true,
        ));
        assert_eq!(up.back.len(), 1);
        assert!(up.changed);
    }

    #[test]
    fn gpu_is_lost_by_index_takes_the_known_identity() {
        let mut t = LostTracker::default();
        t.update(&poll(
            vec![sample(0, "GPU-a"), sample(1, "GPU-b")],
            vec![],
            true,
        ));
        let lost = Identity {
            index: Some(1),
            ..Identity::default()
        };
        let up = t.update(&poll(vec![sample(0, "GPU-a")], vec![lost], true));
        assert_eq!(up.newly_lost.len(), 1, "one report, not lost + vanished");
        assert_eq!(up.newly_lost[0].0.uuid, "GPU-b");
        assert!(up.newly_lost[0].1.contains("GPU_IS_LOST"));
    }

    /// Regression: a failed `nvmlDeviceGetPciInfo` sent a sample with
    /// an empty PCI address, which the engine skipped and then declared lost.
    #[test]
    fn failed_identity_calls_are_filled_from_earlier_polls() {
        let mut t = LostTracker::default();
        t.update(&poll(
            vec![sample(0, "GPU-a"), sample(1, "GPU-b")],
            vec![],
            true,
        ));
        let mut no_pci = sample(1, "GPU-b");
        no_pci.pci_address.clear();
        let mut no_uuid = sample(0, "");
        no_uuid.uuid.clear();
        let mut r = poll(vec![no_uuid, no_pci], vec![], true);
        t.fill_identity(&mut r);
        assert!(r.complete);
        assert_eq!(r.samples[0].uuid, "GPU-a");
        assert_eq!(r.samples[1].pci_address, "0000:11:00.0");
        assert!(t.update(&r).newly_lost.is_empty());
        // Neither identity call answered and the index is unknown: the poll
        // cannot say which GPU this is, so it is incomplete.
        let mut blank = sample(7, "");
        blank.pci_address.clear();
        let mut r = poll(vec![sample(0, "GPU-a"), blank], vec![], true);
        t.fill_identity(&mut r);
        assert!(!r.complete);
        assert!(t.update(&r).newly_lost.is_empty(), "GPU-b not claimed lost");
    }

    /// Regression: NVML seeing zero GPUs made every GPU lost.
    #[test]
    fn zero_gpus_is_not_every_gpu_vanished() {
        let mut t = LostTracker::default();
        t.update(&poll(
            vec![sample(0, "GPU-a"), sample(1, "GPU-b")],
            vec![],
            true,
        ));
        let up = t.update(&poll(vec![], vec![], true));
        assert!(up.newly_lost.is_empty());
    }

    #[test]
    fn incomplete_enumeration_never_claims_a_gpu_vanished() {
        let mut t = LostTracker::default();
        t.update(&poll(
            vec![sample(0, "GPU-a"), sample(1, "GPU-b")],
            vec![],
            true,
        ));
        let up = t.update(&poll(vec![sample(0, "GPU-a")], vec![], false));
        assert!(up.newly_lost.is_empty());
    }
}
