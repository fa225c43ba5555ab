//! The event thread: XID critical errors, ECC events and thermal clock events
//! from `nvmlEventSetWait`.

use super::{Ctx, Identity, fault};
use gpuwatch_core::msg::Input;
use gpuwatch_proto::{FaultEvent, FaultKind, Source};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::{EventSet, Nvml};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The event types gpuwatch watches.
fn wanted() -> EventTypes {
    EventTypes::CRITICAL_XID_ERROR
        | EventTypes::SINGLE_BIT_ECC_ERROR
        | EventTypes::DOUBLE_BIT_ECC_ERROR
        | EventTypes::CLOCK_CHANGE
}

/// Clock-event reasons that mean thermal or power-brake slowdown.
fn thermal_reasons() -> ThrottleReasons {
    ThrottleReasons::SW_THERMAL_SLOWDOWN
        | ThrottleReasons::HW_THERMAL_SLOWDOWN
        | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN
}

/// The worker body: waits for the poller's NVML handle, watches events with it
/// until the handle is replaced, repeats until shutdown or abandonment. One
/// `nvmlEventSetWait` blocks at most `wait` (less than the call deadline).
pub(super) fn run(ctx: &Ctx, retry: Duration, wait: Duration) {
    let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
    let mut seen_gen = 0;
    loop {
        let next = {
            let mut s = ctx.shared.lock();
            // Wait for the poller to publish (or replace) the handle. The
            // signal is checked under the lock the shutdown hook (see
            // `start`) takes to notify, so the notification cannot be missed.
            loop {
                if ctx.stopping() {
                    return;
                }
                if s.nvml_gen != seen_gen {
                    break;
                }
                s = ctx
                    .shared
                    .changed
                    .wait(s)
                    .unwrap_or_else(|e| e.into_inner());
            }
            seen_gen = s.nvml_gen;
            s.nvml.as_ref().and_then(std::sync::Weak::upgrade)
        };
        let Some(nvml) = next else { continue };
        let nvml_gen = seen_gen;
        let mut session = Session {
            ctx,
            nvml: &nvml,
            ids: HashMap::new(),
            thermal: HashMap::new(),
            wait_ms,
        };
        let go_on = session.run(nvml_gen, retry);
        // This may be the last handle: its drop calls nvmlShutdown.
        ctx.watch.call("nvmlShutdown", || drop(nvml));
        if !go_on {
            return;
        }
    }
}

struct Session<'a> {
    ctx: &'a Ctx,
    nvml: &'a Arc<Nvml>,
    /// Identity of every registered GPU, by UUID.
    ids: HashMap<String, Identity>,
    /// Whether a thermal slowdown is active per UUID (report only the start).
    thermal: HashMap<String, bool>,
    /// How long one event wait blocks.
    wait_ms: u32,
}

impl<'a> Session<'a> {
    /// Watches events until the NVML handle changes (→ true) or shutdown (→ false).
    fn run(&mut self, nvml_gen: u64, retry: Duration) -> bool {
        let mut gpus_gen = self.ctx.shared.lock().gpus_gen;
        let mut set = match self.build() {
            Some(s) => s,
            None => return self.ctx.sleep(retry),
        };
        loop {
            if self.ctx.stopping() {
                return false;
            }
            let (now_nvml_gen, now_gpus_gen) = {
                let s = self.ctx.shared.lock();
                (s.nvml_gen, s.gpus_gen)
            };
            if now_nvml_gen != nvml_gen {
                self.drain(&set);
                self.free(set);
                return true;
            }
            if now_gpus_gen != gpus_gen {
                // The GPU set changed: register again, then drain the old set so
                // nothing delivered in between is lost.
                gpus_gen = now_gpus_gen;
                if let Some(new_set) = self.build() {
                    self.drain(&set);
                    self.free(std::mem::replace(&mut set, new_set));
                }
            }
            let waited = self
                .ctx
                .watch
                .call("nvmlEventSetWait_v2", || set.wait(self.wait_ms));
            // An event that arrived is delivered even at shutdown; an
            // abandoned worker's late event is refused by `Ctx::send`.
            match waited {
                Ok(data) => {
                    if !self.handle(data) {
                        return false;
                    }
                }
                Err(WrapperError::Timeout) => {}
                Err(WrapperError::GpuLost) => {
                    // The poller reports the lost GPU; do not spin.
                    if !self
                        .ctx
                        .sleep(Duration::from_millis(u64::from(self.wait_ms)))
                    {
                        return false;
                    }
                }
                Err(e) => {
                    self.ctx.registry.count_nvml_error("nvmlEventSetWait_v2");
                    tracing::warn!(error = %e, "NVML event wait failed; registering again.");
                    if !self.ctx.sleep(retry) {
                        return false;
                    }
                    match self.build() {
                        Some(s) => self.free(std::mem::replace(&mut set, s)),
                        None => {
                            self.free(set);
                            return self.ctx.sleep(retry);
                        }
                    }
                }
            }
        }
    }

    /// Frees an event set (`nvmlEventSetFree`, under the deadline).
    fn free(&self, set: EventSet<'a>) {
        self.ctx.watch.call("nvmlEventSetFree", || drop(set));
    }

    /// Delivers whatever is already queued in a set that is about to be dropped.
    fn drain(&mut self, set: &EventSet<'a>) {
        while let Ok(data) = self.ctx.watch.call("nvmlEventSetWait_v2", || set.wait(0)) {
            if !self.handle(data) {
                return;
            }
        }
    }

    /// Creates an event set with every GPU's supported wanted events registered.
    fn build(&mut self) -> Option<EventSet<'a>> {
        let nvml: &'a Nvml = self.nvml;
        let w = &self.ctx.watch;
        let count = match w.call("nvmlDeviceGetCount_v2", || nvml.device_count()) {
            Ok(n) => n,
            Err(e) => {
                self.ctx.registry.count_nvml_error("nvmlDeviceGetCount_v2");
                tracing::warn!(error = %e, "NVML cannot enumerate GPUs for events.");
                return None;
            }
        };
        // Registration failures free the set (nvml-wrapper), so on a failure the
        // set is rebuilt without the GPU that failed.
        let mut skip: Vec<u32> = Vec::new();
        'attempt: loop {
            let mut set = match w.call("nvmlEventSetCreate", || nvml.create_event_set()) {
                Ok(s) => s,
                Err(e) => {
                    self.ctx.registry.count_nvml_error("nvmlEventSetCreate");
                    tracing::warn!(error = %e, "NVML cannot create an event set.");
                    return None;
                }
            };
            self.ids.clear();
            for i in 0..count {
                if skip.contains(&i) {
                    continue;
                }
                let Ok(dev) = w.call("nvmlDeviceGetHandleByIndex_v2", || nvml.device_by_index(i))
                else {
                    continue; // lost or unreadable: the poller reports it
                };
                let types = match w.call("nvmlDeviceGetSupportedEventTypes", || {
                    dev.supported_event_types()
                }) {
                    Ok(t) => t & wanted(),
                    Err(WrapperError::NotSupported | WrapperError::GpuLost) => continue,
                    Err(e) => {
                        self.ctx
                            .registry
                            .count_nvml_error("nvmlDeviceGetSupportedEventTypes");
                        tracing::debug!(gpu = i, error = %e, "NVML cannot list supported events.");
                        continue;
                    }
                };
                if types.is_empty() {
                    continue;
                }
                let id = Identity {
                    index: w
                        .call("nvmlDeviceGetIndex", || dev.index())
                        .ok()
                        .or(Some(i)),
                    uuid: w
                        .call("nvmlDeviceGetUUID", || dev.uuid())
                        .unwrap_or_default(),
                    pci: w
                        .call("nvmlDeviceGetPciInfo_v3", || dev.pci_info())
                        .ok()
                        .and_then(|p| xid_parser::normalize_pci(&p.bus_id))
                        .unwrap_or_default(),
                };
                match w.call("nvmlDeviceRegisterEvents", || {
                    dev.register_events(types, set)
                }) {
                    Ok(s) => {
                        set = s;
                        self.ids.insert(id.uuid.clone(), id);
                    }
                    Err(e) => {
                        if !matches!(e.error, WrapperError::NotSupported | WrapperError::GpuLost) {
                            self.ctx
                                .registry
                                .count_nvml_error("nvmlDeviceRegisterEvents");
                            tracing::warn!(gpu = i, error = %e, "NVML cannot register GPU events.");
                        }
                        skip.push(i);
                        continue 'attempt;
                    }
                }
            }
            tracing::debug!(gpus = self.ids.len(), "NVML events registered.");
            return Some(set);
        }
    }

    /// Turns one event into faults and sends them. False when the thread should stop.
    fn handle(&mut self, data: EventData<'_>) -> bool {
        let read_at = Instant::now();
        let uuid = self
            .ctx
            .watch
            .call("nvmlDeviceGetUUID", || data.device.uuid())
            .unwrap_or_default();
        let id = self.ids.get(&uuid).cloned().unwrap_or(Identity {
            uuid: uuid.clone(),
            ..Identity::default()
        });
        let t = data.event_type;
        let mut out: Vec<FaultEvent> = Vec::new();
        if t.contains(EventTypes::CRITICAL_XID_ERROR) {
            out.push(xid_fault(&id, data.event_data.as_ref()));
        }
        out.extend(ecc_faults(&id, t));
        if t.contains(EventTypes::CLOCK_CHANGE) {
            out.extend(self.thermal_fault(&id, &data));
        }
        for event in out {
            tracing::info!(
                kind = event.kind().as_str_name(),
                code = event.code,
                gpu = ?event.gpu_index,
                uuid = %event.gpu_uuid,
                "NVML event."
            );
            if !self.ctx.send(Input::Fault { event, read_at }) {
                return false;
            }
        }
        true
    }

    /// The fault of a clock event that starts a thermal (or power-brake)
    /// slowdown; none while one is already reported for the GPU, or when
    /// the clocks slowed for another reason.
    fn thermal_fault(&mut self, id: &Identity, data: &EventData<'_>) -> Option<FaultEvent> {
        let w = &self.ctx.watch;
        let reasons = match w.call("nvmlDeviceGetCurrentClocksThrottleReasons", || {
            data.device.current_throttle_reasons()
        }) {
            Ok(reasons) => reasons,
            Err(WrapperError::NotSupported | WrapperError::GpuLost) => return None,
            Err(e) => {
                self.ctx
                    .registry
                    .count_nvml_error("nvmlDeviceGetCurrentClocksThrottleReasons");
                tracing::debug!(error = %e, "NVML cannot read clock-event reasons.");
                return None;
            }
        };
        let hot = reasons.intersects(thermal_reasons());
        let was = self.thermal.insert(id.uuid.clone(), hot).unwrap_or(false);
        if !hot || was {
            return None;
        }
        let mut ev = fault(
            FaultKind::Thermal,
            0,
            id,
            Source::NvmlEvent,
            "Thermal slowdown",
            format!(
                "NVML clock event: clocks slowed down ({:?}).",
                reasons & thermal_reasons()
            ),
        );
        if let Ok(temp) = w.call("nvmlDeviceGetTemperature", || {
            data.device.temperature(TemperatureSensor::Gpu)
        }) {
            ev.attributes
                .insert("temperature_c".into(), temp.to_string());
        }
        Some(ev)
    }
}

/// The fault of a critical XID event (code 999 when NVML does not say which).
fn xid_fault(id: &Identity, xid: Option<&XidError>) -> FaultEvent {
    let (code, what) = match xid {
        Some(&XidError::Value(v)) => (
            u32::try_from(v).unwrap_or(u32::MAX),
            format!("NVML XID critical error event: Xid {v}."),
        ),
        Some(&XidError::Unknown) | None => (
            999,
            "NVML XID critical error event with an unknown XID.".to_string(),
        ),
    };
    fault(FaultKind::Xid, code, id, Source::NvmlEvent, "", what)
}

/// The faults of the ECC bits in event type `t`, double-bit first.
fn ecc_faults(id: &Identity, t: EventTypes) -> Vec<FaultEvent> {
    [
        (
            EventTypes::DOUBLE_BIT_ECC_ERROR,
            "dbe",
            "Double-bit ECC error",
        ),
        (
            EventTypes::SINGLE_BIT_ECC_ERROR,
            "sbe",
            "Single-bit ECC error",
        ),
    ]
    .into_iter()
    .filter(|(bit, _, _)| t.contains(*bit))
    .map(|(_, ty, name)| {
        let mut ev = fault(
            FaultKind::Ecc,
            0,
            id,
            Source::NvmlEvent,
            name,
            format!("NVML {name} event."),
        );
        ev.attributes.insert("ecc_type".into(), ty.into());
        ev
    })
    .collect()
}
