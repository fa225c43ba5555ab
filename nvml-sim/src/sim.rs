//! The simulated driver: GPU states, the injection timeline, init/refcount
//! rules and event sets. Pure (no clock, no FFI): callers pass the time in
//! milliseconds since the first `nvmlInit`, so the timeline is unit-tested
//! without sleeping.

use crate::scenario::{GpuSpec, GpuState, Scenario, error_code};
use nvml_wrapper_sys::bindings as sys;
use std::collections::{BTreeMap, VecDeque};

/// An NVML return code (`nvmlReturn_t`).
pub type Ret = sys::nvmlReturn_t;

/// `NVML_ERROR_UNINITIALIZED`.
pub(crate) const UNINITIALIZED: Ret = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub(crate) const INVALID_ARGUMENT: Ret = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
/// `NVML_ERROR_NOT_SUPPORTED`.
pub(crate) const NOT_SUPPORTED: Ret = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
/// `NVML_ERROR_GPU_IS_LOST`.
pub(crate) const GPU_IS_LOST: Ret = sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
/// `NVML_ERROR_UNKNOWN`.
pub(crate) const UNKNOWN: Ret = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// `nvmlEventTypeSingleBitEccError`.
pub const EVENT_SBE: u64 = sys::nvmlEventTypeSingleBitEccError as u64;
/// `nvmlEventTypeDoubleBitEccError`.
pub const EVENT_DBE: u64 = sys::nvmlEventTypeDoubleBitEccError as u64;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = sys::nvmlEventTypeXidCriticalError as u64;
/// `nvmlEventTypeClock`.
pub const EVENT_CLOCK: u64 = sys::nvmlEventTypeClock as u64;
/// Event types every simulated GPU supports (unless `not_supported` has `events`).
pub const SUPPORTED_EVENTS: u64 = EVENT_SBE | EVENT_DBE | EVENT_XID | EVENT_CLOCK;

/// An event as `nvmlEventSetWait` delivers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The GPU (scenario slot).
    pub slot: usize,
    /// `nvmlEventType*` bit.
    pub event_type: u64,
    /// XID code for XID events, the new reasons bitmask for clock events, 0 otherwise.
    pub data: u64,
}

#[derive(Debug, Default)]
struct EventSet {
    /// (slot, registered event mask).
    regs: Vec<(usize, u64)>,
    queue: VecDeque<Event>,
}

/// Bound on undelivered events per set (oldest dropped beyond it, like a driver ring).
const QUEUE_LIMIT: usize = 4096;

/// A call that must block before it runs (a `[[hang]]` is on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hang {
    /// Until when, in ms after the first init; `None`: forever.
    pub until_ms: Option<u64>,
    /// Then fail with this code instead of answering.
    pub error: Option<Ret>,
}

/// Progress of one `[[hang]]`.
#[derive(Debug, Default, Clone)]
struct HangProgress {
    /// Matching calls that entered before the hang started.
    entered: u32,
    /// When the hang started (ms after the first init).
    started_ms: Option<u64>,
}

/// A GPU's energy counter: what it read at `since_ms`, and from then on the
/// GPU's power draw (constant until the next injection) integrated over time.
#[derive(Debug, Clone, Copy)]
struct EnergyMeter {
    /// Microjoules at `since_ms` (mW × ms = µJ, so the integral is exact).
    uj: u64,
    since_ms: u64,
}

impl EnergyMeter {
    fn starting(mj: u64, at_ms: u64) -> EnergyMeter {
        EnergyMeter {
            uj: mj.saturating_mul(1000),
            since_ms: at_ms,
        }
    }

    /// Microjoules at `now_ms` while the GPU draws `power_mw`.
    fn at(self, now_ms: u64, power_mw: u32) -> u64 {
        let dt = now_ms.saturating_sub(self.since_ms);
        self.uj
            .saturating_add(u64::from(power_mw).saturating_mul(dt))
    }
}

/// The simulated driver: the GPUs' current readings, the injections still to
/// come, event sets, init reference count and hangs. The FFI layer holds one
/// behind a lock.
#[derive(Debug)]
pub struct Sim {
    scenario: Scenario,
    states: Vec<GpuState>,
    /// Each GPU's energy counter, by slot.
    energy: Vec<EnergyMeter>,
    /// Slots in enumeration order (by configured index).
    order: Vec<usize>,
    next_injection: usize,
    sets: BTreeMap<u64, EventSet>,
    next_set: u64,
    init_calls: u32,
    count_calls: u32,
    refcount: u32,
    hangs: Vec<HangProgress>,
}

impl Sim {
    /// A driver in the scenario's initial state, not initialised.
    pub fn new(scenario: Scenario) -> Sim {
        let states: Vec<GpuState> = scenario.gpu.iter().map(GpuSpec::initial_state).collect();
        let energy = states
            .iter()
            .map(|s| EnergyMeter::starting(s.energy_mj, 0))
            .collect();
        let mut order: Vec<usize> = (0..scenario.gpu.len()).collect();
        order.sort_by_key(|&slot| scenario.gpu[slot].index);
        let scenario_hangs = scenario.hang.len();
        Sim {
            scenario,
            states,
            energy,
            order,
            next_injection: 0,
            sets: BTreeMap::new(),
            next_set: 1,
            init_calls: 0,
            count_calls: 0,
            refcount: 0,
            hangs: vec![HangProgress::default(); scenario_hangs],
        }
    }

    /// The scenario the driver was built from (its initial state, not the
    /// current readings).
    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    /// Applies every injection due at `now_ms`; returns how many events were queued.
    pub fn advance(&mut self, now_ms: u64) -> usize {
        let mut queued = 0;
        while let Some(inj) = self.scenario.inject.get(self.next_injection) {
            if inj.at_ms > now_ms {
                break;
            }
            let inj = inj.clone();
            self.next_injection += 1;
            let Some(slot) = self
                .scenario
                .gpu
                .iter()
                .position(|g| g.index == Some(inj.gpu))
            else {
                continue; // validated away; never panics
            };
            let before = self.states[slot].clock_event_reasons;
            // The energy counted up to the injection at the power drawn until
            // then; an injected `energy_mj` restarts the count there.
            let meter = &mut self.energy[slot];
            *meter = EnergyMeter {
                uj: meter.at(inj.at_ms, self.states[slot].power_mw),
                since_ms: inj.at_ms,
            };
            inj.apply(&mut self.states[slot]);
            if let Some(mj) = inj.energy_mj {
                self.energy[slot] = EnergyMeter::starting(mj, inj.at_ms);
            }
            let after = self.states[slot].clock_event_reasons;
            let mut events = Vec::new();
            if let Some(xid) = inj.xid {
                events.push((EVENT_XID, xid));
            }
            match inj.ecc_event.as_deref() {
                Some("sbe") => events.push((EVENT_SBE, 0)),
                Some("dbe") => events.push((EVENT_DBE, 0)),
                _ => {}
            }
            if before != after {
                events.push((EVENT_CLOCK, after));
            }
            let st = &self.states[slot];
            if st.lost || st.removed || st.not_supported.iter().any(|r| r == "events") {
                continue;
            }
            for (event_type, data) in events {
                for set in self.sets.values_mut() {
                    if set
                        .regs
                        .iter()
                        .any(|&(s, mask)| s == slot && mask & event_type != 0)
                    {
                        if set.queue.len() >= QUEUE_LIMIT {
                            set.queue.pop_front();
                        }
                        set.queue.push_back(Event {
                            slot,
                            event_type,
                            data,
                        });
                        queued += 1;
                    }
                }
            }
        }
        queued
    }

    /// Whether a call to `call` entering at `now_ms` must block (see
    /// [`crate::HangSpec`]); counts the call towards `after_calls`. Of several
    /// hangs that are on, the one that lasts longest decides how long; the
    /// first with an `error` decides the error.
    pub fn hang(&mut self, call: &str, now_ms: u64) -> Option<Hang> {
        let mut out: Option<Hang> = None;
        for (spec, progress) in self.scenario.hang.iter().zip(self.hangs.iter_mut()) {
            if spec.call != "*" && spec.call != call {
                continue;
            }
            let start = match progress.started_ms {
                Some(t) => t,
                None if now_ms >= spec.at_ms && progress.entered >= spec.after_calls => {
                    progress.started_ms = Some(now_ms);
                    now_ms
                }
                None => {
                    progress.entered = progress.entered.saturating_add(1);
                    continue;
                }
            };
            let until_ms = spec.duration_ms.map(|d| start.saturating_add(d));
            if until_ms.is_some_and(|u| now_ms >= u) {
                continue; // over
            }
            let error = spec.error.as_deref().and_then(error_code);
            out = Some(match out {
                None => Hang { until_ms, error },
                Some(h) => Hang {
                    until_ms: match (h.until_ms, until_ms) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    },
                    error: h.error.or(error),
                },
            });
        }
        out
    }

    /// When the next injection is due (ms since first init), if any.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.scenario
            .inject
            .get(self.next_injection)
            .map(|i| i.at_ms)
    }

    /// `nvmlInit*`: fails as the scenario's `[driver]` says, else takes a reference.
    pub fn init(&mut self, now_ms: u64) -> Result<(), Ret> {
        self.init_calls = self.init_calls.saturating_add(1);
        let d = &self.scenario.driver;
        if let Some(code) = d.init_error.as_deref().and_then(error_code) {
            let fails = match (d.init_fail_count, d.init_fail_until_ms) {
                (Some(n), _) => self.init_calls <= n,
                (None, Some(until)) => now_ms < until,
                (None, None) => true,
            };
            if fails {
                return Err(code);
            }
        }
        self.refcount = self.refcount.saturating_add(1);
        Ok(())
    }

    /// `nvmlShutdown`: drops a reference.
    pub fn shutdown(&mut self) -> Result<(), Ret> {
        if self.refcount == 0 {
            return Err(UNINITIALIZED);
        }
        self.refcount -= 1;
        Ok(())
    }

    fn check_init(&self) -> Result<(), Ret> {
        if self.refcount == 0 {
            Err(UNINITIALIZED)
        } else {
            Ok(())
        }
    }

    /// `nvmlDeviceGetCount_v2`: GPUs not removed.
    pub fn device_count(&mut self) -> Result<u32, Ret> {
        self.check_init()?;
        self.count_calls = self.count_calls.saturating_add(1);
        let d = &self.scenario.driver;
        if let Some(code) = d.count_error.as_deref().and_then(error_code) {
            let fails = match d.count_fail_count {
                Some(n) => self.count_calls <= n,
                None => true,
            };
            if fails {
                return Err(code);
            }
        }
        let n = self
            .order
            .iter()
            .filter(|&&s| !self.states[s].removed)
            .count();
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// `nvmlDeviceGetHandleByIndex_v2`: the slot at enumeration position `index`.
    pub fn handle_by_index(&self, index: u32) -> Result<usize, Ret> {
        self.check_init()?;
        let slot = self
            .order
            .iter()
            .copied()
            .filter(|&s| !self.states[s].removed)
            .nth(index as usize)
            .ok_or(INVALID_ARGUMENT)?;
        if self.states[slot].lost {
            return Err(GPU_IS_LOST);
        }
        Ok(slot)
    }

    /// Identity and state of a GPU that answers (not lost, not removed).
    pub fn gpu(&self, slot: usize) -> Result<(&GpuSpec, &GpuState), Ret> {
        self.check_init()?;
        let spec = self.scenario.gpu.get(slot).ok_or(INVALID_ARGUMENT)?;
        let st = &self.states[slot];
        if st.lost || st.removed {
            return Err(GPU_IS_LOST);
        }
        Ok((spec, st))
    }

    /// State of a GPU for one reading of [`crate::scenario::READINGS`]:
    /// `NOT_SUPPORTED` / `UNKNOWN` when the scenario says so.
    pub fn reading(&self, slot: usize, reading: &str) -> Result<&GpuState, Ret> {
        let (_, st) = self.gpu(slot)?;
        if st.not_supported.iter().any(|r| r == reading) {
            return Err(NOT_SUPPORTED);
        }
        if st.failing.iter().any(|r| r == reading) {
            return Err(UNKNOWN);
        }
        Ok(st)
    }

    /// `nvmlDeviceGetIndex`: enumeration position of the slot.
    pub fn enumeration_index(&self, slot: usize) -> Result<u32, Ret> {
        self.gpu(slot)?;
        let pos = self
            .order
            .iter()
            .copied()
            .filter(|&s| !self.states[s].removed)
            .position(|s| s == slot)
            .ok_or(GPU_IS_LOST)?;
        u32::try_from(pos).map_err(|_| UNKNOWN)
    }

    /// `nvmlDeviceGetTotalEnergyConsumption` at `now_ms`: millijoules since
    /// the driver was loaded (the scenario's time zero, or the last injected
    /// `energy_mj`); `NOT_SUPPORTED` where the scenario says so, as on GPUs
    /// before Volta (nvml.h: "For Volta or newer fully supported devices").
    pub fn total_energy_mj(&self, slot: usize, now_ms: u64) -> Result<u64, Ret> {
        let st = self.reading(slot, "energy")?;
        Ok(self.energy[slot].at(now_ms, st.power_mw) / 1000)
    }

    /// `nvmlEventSetCreate`: a new set id (never 0).
    pub fn event_set_create(&mut self) -> Result<u64, Ret> {
        self.check_init()?;
        let id = self.next_set;
        self.next_set += 1;
        self.sets.insert(id, EventSet::default());
        Ok(id)
    }

    /// Event types a GPU supports.
    pub fn supported_events(&self, slot: usize) -> Result<u64, Ret> {
        self.reading(slot, "events")?;
        Ok(SUPPORTED_EVENTS)
    }

    /// `nvmlDeviceRegisterEvents`.
    pub fn register(&mut self, set: u64, slot: usize, mask: u64) -> Result<(), Ret> {
        let supported = self.supported_events(slot)?;
        if mask & !supported != 0 {
            return Err(NOT_SUPPORTED);
        }
        let set = self.sets.get_mut(&set).ok_or(INVALID_ARGUMENT)?;
        match set.regs.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, m)) => *m |= mask,
            None => set.regs.push((slot, mask)),
        }
        Ok(())
    }

    /// Takes the oldest undelivered event of a set.
    pub fn pop_event(&mut self, set: u64) -> Result<Option<Event>, Ret> {
        self.check_init()?;
        let set = self.sets.get_mut(&set).ok_or(INVALID_ARGUMENT)?;
        Ok(set.queue.pop_front())
    }

    /// Whether `set` was created and not yet freed (the FFI answers
    /// `NVML_ERROR_INVALID_ARGUMENT` for any other handle).
    pub fn has_set(&self, set: u64) -> bool {
        self.sets.contains_key(&set)
    }

    /// `nvmlEventSetFree`.
    pub fn event_set_free(&mut self, set: u64) -> Result<(), Ret> {
        self.sets.remove(&set).map(|_| ()).ok_or(INVALID_ARGUMENT)
    }

    /// `nvmlSystemGetDriverVersion`.
    pub fn driver_version(&self) -> Result<&str, Ret> {
        self.check_init()?;
        Ok(&self.scenario.driver.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_gpus(extra: &str) -> Sim {
        let text = format!(
            r#"
            [[gpu]]
            uuid = "GPU-00000000-0000-0000-0000-000000000000"
            pci = "0000:1b:00.0"
            [[gpu]]
            uuid = "GPU-11111111-1111-1111-1111-111111111111"
            pci = "0000:3b:00.0"
            {extra}
            "#
        );
        Sim::new(Scenario::parse(&text, "<t>").unwrap())
    }

    /// The energy counter integrates the power draw between injections and
    /// restarts where an injection sets it (a driver reload).
    #[test]
    fn energy_integrates_power_and_restarts_when_set() {
        let mut sim = two_gpus(
            "power_mw = 100000\nenergy_mj = 5000\n\
             [[inject]]\nat_ms = 1000\ngpu = 1\npower_mw = 300000\n\
             [[inject]]\nat_ms = 3000\ngpu = 1\nenergy_mj = 0\n",
        );
        sim.init(0).unwrap();
        // GPU 0 draws the default 72 W from 0 mJ.
        assert_eq!(sim.total_energy_mj(0, 500), Ok(36_000));
        // GPU 1: 5 J, then 100 W for 1 s, then 300 W.
        assert_eq!(sim.total_energy_mj(1, 0), Ok(5_000));
        sim.advance(1000);
        assert_eq!(sim.total_energy_mj(1, 1000), Ok(105_000));
        assert_eq!(sim.total_energy_mj(1, 2000), Ok(405_000));
        sim.advance(3500);
        assert_eq!(sim.total_energy_mj(1, 3500), Ok(150_000));
    }

    #[test]
    fn energy_not_supported_before_volta() {
        let mut sim = two_gpus("not_supported = [\"energy\"]");
        sim.init(0).unwrap();
        assert_eq!(sim.total_energy_mj(0, 10), Ok(720));
        assert_eq!(sim.total_energy_mj(1, 10), Err(NOT_SUPPORTED));
    }

    #[test]
    fn calls_before_init_are_uninitialized() {
        let mut sim = two_gpus("");
        assert_eq!(sim.device_count(), Err(UNINITIALIZED));
        sim.init(0).unwrap();
        assert_eq!(sim.device_count(), Ok(2));
        sim.shutdown().unwrap();
        assert_eq!(sim.handle_by_index(0), Err(UNINITIALIZED));
        assert_eq!(sim.shutdown(), Err(UNINITIALIZED));
    }

    #[test]
    fn init_fails_for_the_first_n_calls() {
        let mut sim = two_gpus("[driver]\ninit_error = \"driver_not_loaded\"\ninit_fail_count = 2");
        assert_eq!(sim.init(0), Err(9));
        assert_eq!(sim.init(10), Err(9));
        assert_eq!(sim.init(20), Ok(()));
    }

    #[test]
    fn init_fails_until_a_time() {
        let mut sim =
            two_gpus("[driver]\ninit_error = \"driver_not_loaded\"\ninit_fail_until_ms = 100");
        assert_eq!(sim.init(0), Err(9));
        assert_eq!(sim.init(99), Err(9));
        assert_eq!(sim.init(100), Ok(()));
    }

    #[test]
    fn init_fails_forever_without_a_bound() {
        let mut sim = two_gpus("[driver]\ninit_error = \"no_permission\"");
        for t in [0, 1_000, 1_000_000] {
            assert_eq!(sim.init(t), Err(4));
        }
    }

    #[test]
    fn injections_apply_when_due_and_not_before() {
        let mut sim = two_gpus(
            "[[inject]]\nat_ms = 50\ngpu = 1\nremapped_rows_pending = true\n\
             [[inject]]\nat_ms = 90\ngpu = 1\nremapped_rows_pending = false",
        );
        sim.init(0).unwrap();
        assert_eq!(sim.next_due_ms(), Some(50));
        sim.advance(49);
        assert!(
            !sim.reading(1, "remapped_rows")
                .unwrap()
                .remapped_rows_pending
        );
        sim.advance(50);
        assert!(
            sim.reading(1, "remapped_rows")
                .unwrap()
                .remapped_rows_pending
        );
        assert!(
            !sim.reading(0, "remapped_rows")
                .unwrap()
                .remapped_rows_pending
        );
        sim.advance(1000);
        assert!(
            !sim.reading(1, "remapped_rows")
                .unwrap()
                .remapped_rows_pending
        );
        assert_eq!(sim.next_due_ms(), None);
    }

    #[test]
    fn events_reach_only_sets_registered_for_the_gpu_and_type() {
        let mut sim = two_gpus(
            "[[inject]]\nat_ms = 10\ngpu = 1\nxid = 79\n\
             [[inject]]\nat_ms = 20\ngpu = 0\nxid = 13\n\
             [[inject]]\nat_ms = 30\ngpu = 1\necc_event = \"dbe\"\n\
             [[inject]]\nat_ms = 40\ngpu = 1\nclock_event_reasons = 0x40",
        );
        sim.init(0).unwrap();
        let set = sim.event_set_create().unwrap();
        sim.register(set, 1, EVENT_XID | EVENT_CLOCK).unwrap();
        assert_eq!(sim.advance(100), 2);
        assert_eq!(
            sim.pop_event(set).unwrap(),
            Some(Event {
                slot: 1,
                event_type: EVENT_XID,
                data: 79
            })
        );
        assert_eq!(
            sim.pop_event(set).unwrap(),
            Some(Event {
                slot: 1,
                event_type: EVENT_CLOCK,
                data: 0x40
            })
        );
        assert_eq!(sim.pop_event(set).unwrap(), None);
        sim.event_set_free(set).unwrap();
        assert_eq!(sim.pop_event(set), Err(INVALID_ARGUMENT));
    }

    #[test]
    fn lost_gpu_answers_gpu_is_lost_but_still_counts() {
        let mut sim = two_gpus(
            "[[inject]]\nat_ms = 10\ngpu = 0\nlost = true\n\
             [[inject]]\nat_ms = 20\ngpu = 0\nlost = false",
        );
        sim.init(0).unwrap();
        sim.advance(10);
        assert_eq!(sim.device_count(), Ok(2));
        assert_eq!(sim.handle_by_index(0), Err(GPU_IS_LOST));
        assert_eq!(sim.reading(0, "temperature").map(|_| ()), Err(GPU_IS_LOST));
        sim.advance(20);
        assert_eq!(sim.handle_by_index(0), Ok(0));
    }

    #[test]
    fn removed_gpu_drops_the_count_and_shifts_indexes() {
        let mut sim = two_gpus("[[inject]]\nat_ms = 10\ngpu = 0\nremoved = true");
        sim.init(0).unwrap();
        sim.advance(10);
        assert_eq!(sim.device_count(), Ok(1));
        assert_eq!(sim.handle_by_index(0), Ok(1));
        assert_eq!(sim.enumeration_index(1), Ok(0));
        assert_eq!(sim.handle_by_index(1), Err(INVALID_ARGUMENT));
        assert_eq!(sim.gpu(0).map(|_| ()), Err(GPU_IS_LOST));
    }

    #[test]
    fn not_supported_and_failing_readings() {
        let mut sim = two_gpus("not_supported = [\"retired_pages\"]\nfailing = [\"power\"]");
        sim.init(0).unwrap();
        assert_eq!(
            sim.reading(1, "retired_pages").map(|_| ()),
            Err(NOT_SUPPORTED)
        );
        assert_eq!(sim.reading(1, "power").map(|_| ()), Err(UNKNOWN));
        assert!(sim.reading(0, "power").is_ok());
    }

    #[test]
    fn hang_starts_after_time_and_calls_then_ends() {
        let mut sim = two_gpus(
            "[[hang]]\ncall = \"nvmlDeviceGetTemperature\"\nat_ms = 100\n\
             after_calls = 2\nduration_ms = 500",
        );
        // Other calls never hang and do not count.
        assert_eq!(sim.hang("nvmlDeviceGetPowerUsage", 200), None);
        // Two matching calls answer normally (one before at_ms counts too)...
        assert_eq!(sim.hang("nvmlDeviceGetTemperature", 50), None);
        assert_eq!(sim.hang("nvmlDeviceGetTemperature", 100), None);
        // ... the third, at or after at_ms, starts the hang.
        let h = Hang {
            until_ms: Some(700),
            error: None,
        };
        assert_eq!(sim.hang("nvmlDeviceGetTemperature", 200), Some(h));
        // A call entering while the hang is on waits for the same end.
        assert_eq!(sim.hang("nvmlDeviceGetTemperature", 699), Some(h));
        // Over, and it does not start again.
        assert_eq!(sim.hang("nvmlDeviceGetTemperature", 700), None);
        assert_eq!(sim.hang("nvmlDeviceGetTemperature", 5_000), None);
    }

    #[test]
    fn hang_on_every_call_forever_with_an_error() {
        let mut sim = two_gpus(
            "[[hang]]\ncall = \"*\"\nat_ms = 10\nerror = \"timeout\"\n\
             [[hang]]\ncall = \"nvmlDeviceGetCount_v2\"\nduration_ms = 30",
        );
        // At t=0 only the count hang is on (30 ms, no error).
        assert_eq!(
            sim.hang("nvmlDeviceGetCount_v2", 0),
            Some(Hang {
                until_ms: Some(30),
                error: None
            })
        );
        assert_eq!(sim.hang("nvmlInit_v2", 0), None);
        // From 10 ms every call hangs forever and then fails with TIMEOUT; the
        // count hang overlaps: forever wins.
        let forever = Hang {
            until_ms: None,
            error: Some(10),
        };
        assert_eq!(sim.hang("nvmlInit_v2", 10), Some(forever));
        assert_eq!(sim.hang("nvmlDeviceGetCount_v2", 20), Some(forever));
        assert_eq!(sim.hang("nvmlEventSetWait_v2", 1_000_000), Some(forever));
    }

    #[test]
    fn unsupported_event_registration_is_refused() {
        let mut sim = two_gpus("not_supported = [\"events\"]");
        sim.init(0).unwrap();
        let set = sim.event_set_create().unwrap();
        assert_eq!(sim.register(set, 1, EVENT_XID), Err(NOT_SUPPORTED));
        assert_eq!(sim.register(set, 0, 1 << 20), Err(NOT_SUPPORTED));
        assert_eq!(sim.register(set, 0, EVENT_XID), Ok(()));
    }
}
