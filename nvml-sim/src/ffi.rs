//! The exported NVML C functions.
//!
//! Every function validates its pointer arguments (null → `NVML_ERROR_INVALID_ARGUMENT`),
//! never unwinds across the C boundary (each body runs under `catch_unwind`;
//! a panic becomes `NVML_ERROR_UNKNOWN`), and takes the one global lock only
//! briefly (event waits release it while they sleep).
//!
//! Device handles are the GPU's scenario slot + 1 and event-set handles are
//! set ids, both disguised as pointers: nobody dereferences an NVML handle, and
//! a stale or forged handle is rejected instead of read.
#![allow(non_snake_case)]

use crate::scenario::{Scenario, nvml_bus_id};
use crate::sim::{INVALID_ARGUMENT, NOT_SUPPORTED, Ret, Sim, UNINITIALIZED, UNKNOWN};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::{CStr, CString, OsStr, c_char, c_int, c_uint, c_ulonglong};
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const SUCCESS: Ret = sys::nvmlReturn_enum_NVML_SUCCESS;
const INSUFFICIENT_SIZE: Ret = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const TIMEOUT: Ret = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;

/// Environment variable naming the scenario file.
pub const SCENARIO_ENV: &str = "GPUWATCH_NVML_SIM_SCENARIO";
/// Suffix of the side file next to the loaded library that names the scenario
/// (`libnvml_sim.so.scenario`); it wins over [`SCENARIO_ENV`].
pub const SIDE_FILE_SUFFIX: &str = ".scenario";

/// PCI device id reported for every GPU (H100 SXM5) and subsystem id.
const PCI_DEVICE_ID: c_uint = 0x2330_10DE;
const PCI_SUBSYSTEM_ID: c_uint = 0x16C1_10DE;

struct Global {
    /// Loaded on the first init call (re-tried while it fails).
    sim: Option<Sim>,
    /// Time of the first init call: the timeline's zero.
    t0: Option<Instant>,
}

impl Global {
    fn now_ms(&self) -> u64 {
        self.t0
            .map(|t| u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    /// The driver after applying every injection due now.
    fn sim(&mut self) -> Result<&mut Sim, Ret> {
        let now = self.now_ms();
        let sim = self.sim.as_mut().ok_or(UNINITIALIZED)?;
        if sim.advance(now) > 0 {
            WAKE.notify_all();
        }
        Ok(sim)
    }
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    sim: None,
    t0: None,
});
static WAKE: Condvar = Condvar::new();

fn lock() -> MutexGuard<'static, Global> {
    GLOBAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs a body with no unwinding across the boundary.
fn catch(f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => UNKNOWN,
    }
}

/// Runs the body of the exported function `call`: first any `[[hang]]` on
/// it, then the body, with no unwinding across the boundary.
fn ffi(call: &'static str, f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    catch(|| {
        hang(call)?;
        f()
    })
}

/// Blocks the calling thread while a `[[hang]]` on `call` is on, without
/// holding the global lock (other calls go on, as they do when one caller is
/// stuck in the driver); then fails with the hang's error, if it has one.
fn hang(call: &'static str) -> Result<(), Ret> {
    let (h, t0) = {
        let mut g = lock();
        let now = g.now_ms();
        let t0 = g.t0;
        match (g.sim.as_mut(), t0) {
            (Some(sim), Some(t0)) => match sim.hang(call, now) {
                Some(h) => (h, t0),
                None => return Ok(()),
            },
            _ => return Ok(()),
        }
    };
    match h.until_ms {
        Some(ms) => {
            let until = t0 + Duration::from_millis(ms);
            loop {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                std::thread::sleep(until - now);
            }
        }
        // A hang that never ends: the caller stays here until the process exits.
        None => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
    }
    match h.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn with_sim<T>(f: impl FnOnce(&mut Sim) -> Result<T, Ret>) -> Result<T, Ret> {
    let mut g = lock();
    f(g.sim()?)
}

fn non_null<T>(p: *const T) -> Result<(), Ret> {
    if p.is_null() {
        Err(INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

/// Writes `v` through an out-pointer after checking it.
///
/// # Safety
/// `p` must be null or valid for a write of `T` (NVML's contract with callers).
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), Ret> {
    non_null(p)?;
    // SAFETY: non-null checked above; validity is the caller's NVML contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Copies `s` and a NUL into a caller buffer of `len` bytes.
///
/// # Safety
/// `buf` must be null or valid for `len` bytes of writes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    non_null(buf)?;
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: buf is non-null and, per the caller's contract, holds `len` bytes;
    // we write s.len() + 1 <= len bytes; the regions cannot overlap (s is ours).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

fn handle_of(slot: usize) -> sys::nvmlDevice_t {
    std::ptr::without_provenance_mut(slot + 1)
}

/// A GPU handle is `slot + 1`; a MIG device handle also carries its index
/// above [`MIG_SHIFT`]. A GPU call on a MIG handle is `INVALID_ARGUMENT`.
const MIG_SHIFT: u32 = 16;

fn slot_of(device: sys::nvmlDevice_t) -> Result<usize, Ret> {
    let addr = device.addr();
    if addr >> MIG_SHIFT != 0 {
        return Err(INVALID_ARGUMENT);
    }
    addr.checked_sub(1).ok_or(INVALID_ARGUMENT)
}

fn mig_handle_of(slot: usize, index: usize) -> sys::nvmlDevice_t {
    std::ptr::without_provenance_mut(((index + 1) << MIG_SHIFT) | (slot + 1))
}

/// The (GPU slot, MIG device index) of a MIG device handle.
fn mig_of(device: sys::nvmlDevice_t) -> Result<(usize, usize), Ret> {
    let addr = device.addr();
    let index = (addr >> MIG_SHIFT).checked_sub(1).ok_or(INVALID_ARGUMENT)?;
    let slot = (addr & ((1 << MIG_SHIFT) - 1))
        .checked_sub(1)
        .ok_or(INVALID_ARGUMENT)?;
    Ok((slot, index))
}

/// The MIG device a MIG handle names (its GPU must answer, in MIG mode; a
/// device whose MIG configuration is gone is `INVALID_ARGUMENT`, as a stale
/// handle is), with its GPU's memory in MiB. A `failing` device answers
/// `UNKNOWN`.
fn mig_device(device: sys::nvmlDevice_t) -> Result<(crate::scenario::MigDeviceSpec, u64), Ret> {
    let (slot, index) = mig_of(device)?;
    let (mig, mib) = read(handle_of(slot), "mig", |s| (s.mig.clone(), s.memory_mib))?;
    if !mig.enabled {
        return Err(INVALID_ARGUMENT);
    }
    let d = mig.devices.get(index).cloned().ok_or(INVALID_ARGUMENT)?;
    if d.failing {
        return Err(UNKNOWN);
    }
    Ok((d, mib))
}

fn set_id(set: sys::nvmlEventSet_t) -> Result<u64, Ret> {
    match u64::try_from(set.addr()) {
        Ok(0) | Err(_) => Err(INVALID_ARGUMENT),
        Ok(id) => Ok(id),
    }
}

/// Reads one state value of a GPU for a named reading.
fn read<T>(
    device: sys::nvmlDevice_t,
    reading: &str,
    f: impl FnOnce(&crate::scenario::GpuState) -> T,
) -> Result<T, Ret> {
    let slot = slot_of(device)?;
    with_sim(|s| s.reading(slot, reading).map(f))
}

/// The path this library was loaded from.
fn own_path() -> Option<PathBuf> {
    // SAFETY: Dl_info is plain data; all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = nvmlInit_v2 as unsafe extern "C" fn() -> Ret as *const libc::c_void;
    // SAFETY: dladdr only reads the loader's tables for an address inside this object.
    let rc = unsafe { libc::dladdr(addr, &mut info) };
    if rc == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader while we are loaded.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(OsStr::from_bytes(name.to_bytes())))
}

/// Keeps this library mapped for the life of the process (like the real
/// driver's state, the timeline and init counts survive `dlclose`).
fn pin(path: &std::path::Path) {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: c is a valid C string; RTLD_NOLOAD only takes another reference to
    // an object that is already loaded (us) and RTLD_NODELETE marks it resident.
    // The handle is deliberately never closed.
    unsafe {
        libc::dlopen(
            c.as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        );
    }
}

/// Where the scenario comes from: the side file next to the library, else the env.
fn scenario_path() -> Result<PathBuf, String> {
    if let Some(lib) = own_path() {
        pin(&lib);
        let mut side = lib.into_os_string();
        side.push(SIDE_FILE_SUFFIX);
        let side = PathBuf::from(side);
        if let Ok(text) = std::fs::read_to_string(&side) {
            let p = text.trim();
            if p.is_empty() {
                return Err(format!("side file {} is empty", side.display()));
            }
            return Ok(PathBuf::from(p));
        }
    }
    match std::env::var_os(SCENARIO_ENV) {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err(format!(
            "no scenario: set {SCENARIO_ENV} to a scenario file"
        )),
    }
}

fn do_init(call: &'static str) -> Result<(), Ret> {
    {
        let mut g = lock();
        if g.t0.is_none() {
            g.t0 = Some(Instant::now());
        }
        if g.sim.is_none() {
            let loaded =
                scenario_path().and_then(|p| Scenario::load(&p).map_err(|e| e.to_string()));
            match loaded {
                Ok(s) => g.sim = Some(Sim::new(s)),
                Err(msg) => {
                    eprintln!("nvml-sim: {msg}");
                    return Err(UNKNOWN);
                }
            }
        }
    }
    // After loading, so a hang on init applies from the very first call.
    hang(call)?;
    let mut g = lock();
    let now = g.now_ms();
    let sim = g.sim.as_mut().ok_or(UNKNOWN)?;
    sim.advance(now);
    sim.init(now)
}

/// Loads the scenario on first use (see the crate docs) and initialises.
///
/// # Safety
/// None beyond NVML's: callable from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    catch(|| do_init("nvmlInit_v2"))
}

/// Same as [`nvmlInit_v2`]; the flags are accepted and ignored.
///
/// # Safety
/// None beyond NVML's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    catch(|| do_init("nvmlInitWithFlags"))
}

/// Releases one init reference.
///
/// # Safety
/// None beyond NVML's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    let r = ffi("nvmlShutdown", || with_sim(|s| s.shutdown()));
    WAKE.notify_all();
    r
}

/// A static description of a return code.
///
/// # Safety
/// None: the returned pointer is a static NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt Request Issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        20 => c"Insufficient Memory",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// Writes the scenario's driver version.
///
/// # Safety
/// `version` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    ffi("nvmlSystemGetDriverVersion", || {
        let v = with_sim(|s| s.driver_version().map(str::to_owned))?;
        // SAFETY: forwarded caller contract.
        unsafe { put_str(version, length, &v) }
    })
}

/// Writes the NVML library version (`12.<driver version>`).
///
/// # Safety
/// `version` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    ffi("nvmlSystemGetNVMLVersion", || {
        let v = with_sim(|s| s.driver_version().map(|v| format!("12.{v}")))?;
        // SAFETY: forwarded caller contract.
        unsafe { put_str(version, length, &v) }
    })
}

/// Number of GPUs not removed.
///
/// # Safety
/// `deviceCount` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> Ret {
    ffi("nvmlDeviceGetCount_v2", || {
        non_null(deviceCount)?;
        let n = with_sim(|s| s.device_count())?;
        // SAFETY: forwarded caller contract.
        unsafe { put(deviceCount, n) }
    })
}

/// Handle of the GPU at an enumeration position.
///
/// # Safety
/// `device` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    ffi("nvmlDeviceGetHandleByIndex_v2", || {
        non_null(device)?;
        let slot = with_sim(|s| s.handle_by_index(index))?;
        // SAFETY: forwarded caller contract.
        unsafe { put(device, handle_of(slot)) }
    })
}

/// Handle of the GPU with a UUID.
///
/// # Safety
/// `uuid` must be null or a NUL-terminated string; `device` null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    ffi("nvmlDeviceGetHandleByUUID", || {
        non_null(uuid)?;
        non_null(device)?;
        // SAFETY: non-null; NUL termination is the caller's contract.
        let wanted = unsafe { CStr::from_ptr(uuid) }.to_bytes().to_vec();
        let slot = with_sim(|s| {
            let slot = s
                .scenario()
                .gpu
                .iter()
                .position(|g| g.uuid.as_bytes().eq_ignore_ascii_case(&wanted))
                .ok_or(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND)?;
            s.gpu(slot)?;
            Ok(slot)
        })?;
        // SAFETY: forwarded caller contract.
        unsafe { put(device, handle_of(slot)) }
    })
}

/// The GPU's UUID.
///
/// # Safety
/// `uuid` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: sys::nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    ffi("nvmlDeviceGetUUID", || {
        non_null(uuid)?;
        if mig_of(device).is_ok() {
            let v = mig_device(device)?.0.uuid;
            // SAFETY: forwarded caller contract.
            return unsafe { put_str(uuid, length, &v) };
        }
        let slot = slot_of(device)?;
        let v = with_sim(|s| s.gpu(slot).map(|(g, _)| g.uuid.clone()))?;
        // SAFETY: forwarded caller contract.
        unsafe { put_str(uuid, length, &v) }
    })
}

/// The GPU's product name.
///
/// # Safety
/// `name` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: sys::nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    ffi("nvmlDeviceGetName", || {
        non_null(name)?;
        let slot = slot_of(device)?;
        let v = with_sim(|s| s.gpu(slot).map(|(g, _)| g.name.clone()))?;
        // SAFETY: forwarded caller contract.
        unsafe { put_str(name, length, &v) }
    })
}

/// The GPU's serial number (`NOT_SUPPORTED` when the scenario has none).
///
/// # Safety
/// `serial` must be null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: sys::nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> Ret {
    ffi("nvmlDeviceGetSerial", || {
        non_null(serial)?;
        let slot = slot_of(device)?;
        let v = with_sim(|s| s.gpu(slot).map(|(g, _)| g.serial.clone()))?;
        if v.is_empty() {
            return Err(NOT_SUPPORTED);
        }
        // SAFETY: forwarded caller contract.
        unsafe { put_str(serial, length, &v) }
    })
}

fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

/// PCI information (bus id in NVML's `00000000:3B:00.0` form).
///
/// # Safety
/// `pci` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: sys::nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    ffi("nvmlDeviceGetPciInfo_v3", || {
        non_null(pci)?;
        let slot = slot_of(device)?;
        let raw = with_sim(|s| s.gpu(slot).map(|(g, _)| g.pci.clone()))?;
        let bus_id = nvml_bus_id(&raw).ok_or(UNKNOWN)?;
        let hex = |r: std::ops::Range<usize>| {
            bus_id
                .get(r)
                .and_then(|h| c_uint::from_str_radix(h, 16).ok())
                .ok_or(UNKNOWN)
        };
        let (domain, bus, dev) = (hex(0..8)?, hex(9..11)?, hex(12..14)?);
        let info = sys::nvmlPciInfo_t {
            busIdLegacy: c_array(&bus_id[4..]),
            domain,
            bus,
            device: dev,
            pciDeviceId: PCI_DEVICE_ID,
            pciSubSystemId: PCI_SUBSYSTEM_ID,
            busId: c_array(&bus_id),
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(pci, info) }
    })
}

/// The GPU's enumeration position.
///
/// # Safety
/// `index` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: sys::nvmlDevice_t, index: *mut c_uint) -> Ret {
    ffi("nvmlDeviceGetIndex", || {
        non_null(index)?;
        let slot = slot_of(device)?;
        let i = with_sim(|s| s.enumeration_index(slot))?;
        // SAFETY: forwarded caller contract.
        unsafe { put(index, i) }
    })
}

/// Core temperature (sensor 0 only).
///
/// # Safety
/// `temp` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: sys::nvmlDevice_t,
    sensorType: c_uint,
    temp: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetTemperature", || {
        non_null(temp)?;
        if sensorType != sys::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(INVALID_ARGUMENT);
        }
        let v = read(device, "temperature", |s| s.temperature_c)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(temp, v) }
    })
}

/// Shutdown (0) and slowdown (1) thresholds; others are not supported.
///
/// # Safety
/// `temp` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: sys::nvmlDevice_t,
    thresholdType: c_uint,
    temp: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetTemperatureThreshold", || {
        non_null(temp)?;
        let v = read(device, "temperature_threshold", |s| match thresholdType {
            sys::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => {
                Ok(s.shutdown_temperature_c)
            }
            sys::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => {
                Ok(s.slowdown_temperature_c)
            }
            _ => Err(NOT_SUPPORTED),
        })??;
        // SAFETY: forwarded caller contract.
        unsafe { put(temp, v) }
    })
}

macro_rules! u32_reading {
    ($(#[$doc:meta])* $fn:ident, $reading:literal, $field:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The out-pointer must be null or valid for a write.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $fn(device: sys::nvmlDevice_t, out: *mut c_uint) -> Ret {
            ffi(stringify!($fn), || {
                non_null(out)?;
                let v = read(device, $reading, |s| s.$field)?;
                // SAFETY: forwarded caller contract.
                unsafe { put(out, v) }
            })
        }
    };
}

u32_reading!(
    /// Power draw, mW.
    nvmlDeviceGetPowerUsage, "power", power_mw
);
u32_reading!(
    /// Enforced power limit, mW.
    nvmlDeviceGetEnforcedPowerLimit, "power_limit", power_limit_mw
);
u32_reading!(
    /// Current PCIe link generation.
    nvmlDeviceGetCurrPcieLinkGeneration, "pcie_link", pcie_link_gen
);
u32_reading!(
    /// Maximum PCIe link generation.
    nvmlDeviceGetMaxPcieLinkGeneration, "pcie_link", pcie_link_gen_max
);
u32_reading!(
    /// Current PCIe link width.
    nvmlDeviceGetCurrPcieLinkWidth, "pcie_link", pcie_link_width
);
u32_reading!(
    /// Maximum PCIe link width.
    nvmlDeviceGetMaxPcieLinkWidth, "pcie_link", pcie_link_width_max
);
u32_reading!(
    /// PCIe replay counter.
    nvmlDeviceGetPcieReplayCounter, "pcie_replay_counter", pcie_replay_counter
);

fn clock_reasons(device: sys::nvmlDevice_t, out: *mut c_ulonglong) -> Result<(), Ret> {
    non_null(out)?;
    let v = read(device, "clock_event_reasons", |s| s.clock_event_reasons)?;
    // SAFETY: non-null checked; validity is the caller's contract (both callers are
    // unsafe extern fns that document it).
    unsafe { put(out, v) }
}

/// Clock-event (throttle) reasons bitmask.
///
/// # Safety
/// `reasons` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: sys::nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetCurrentClocksThrottleReasons", || {
        clock_reasons(device, reasons)
    })
}

/// Clock-event reasons bitmask (newer name of the throttle reasons).
///
/// # Safety
/// `reasons` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: sys::nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetCurrentClocksEventReasons", || {
        clock_reasons(device, reasons)
    })
}

/// Total ECC errors: error type 0 corrected / 1 uncorrected, counter 0 volatile / 1 aggregate.
///
/// # Safety
/// `eccCounts` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: sys::nvmlDevice_t,
    errorType: c_uint,
    counterType: c_uint,
    eccCounts: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetTotalEccErrors", || {
        non_null(eccCounts)?;
        let v = read(device, "ecc", |s| match (errorType, counterType) {
            (0, 0) => Ok(s.ecc_volatile_corrected),
            (1, 0) => Ok(s.ecc_volatile_uncorrected),
            (0, 1) => Ok(s.ecc_aggregate_corrected),
            (1, 1) => Ok(s.ecc_aggregate_uncorrected),
            _ => Err(INVALID_ARGUMENT),
        })??;
        // SAFETY: forwarded caller contract.
        unsafe { put(eccCounts, v) }
    })
}

fn retired_pages(
    device: sys::nvmlDevice_t,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Result<(), Ret> {
    non_null(count)?;
    let n = read(device, "retired_pages", |s| match cause {
        0 => Ok(s.retired_pages_sbe),
        1 => Ok(s.retired_pages_dbe),
        _ => Err(INVALID_ARGUMENT),
    })??;
    // SAFETY: count is non-null; the caller guarantees it is readable and writable.
    let room = unsafe { count.read() };
    // SAFETY: as above.
    unsafe { count.write(n) };
    if room < n {
        return Err(INSUFFICIENT_SIZE);
    }
    if n > 0 {
        non_null(addresses)?;
    }
    for i in 0..n as usize {
        let page = 0x4_0000 + (cause as u64) * 0x1000_0000 + i as u64 * 0x10;
        // SAFETY: the caller provides room for `room >= n` addresses (NVML contract).
        unsafe { addresses.add(i).write(page) };
        if !timestamps.is_null() {
            // SAFETY: as above, for the optional timestamp array.
            unsafe { timestamps.add(i).write(1_700_000_000 + i as u64) };
        }
    }
    Ok(())
}

/// Retired page addresses for a cause (0 multiple SBE, 1 DBE); count query with a small buffer.
///
/// # Safety
/// `pageCount` must be null or valid; `addresses` valid for `*pageCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: sys::nvmlDevice_t,
    cause: c_uint,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetRetiredPages", || {
        retired_pages(device, cause, pageCount, addresses, std::ptr::null_mut())
    })
}

/// Retired page addresses and timestamps.
///
/// # Safety
/// `pageCount` must be null or valid; the arrays valid for `*pageCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: sys::nvmlDevice_t,
    cause: c_uint,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetRetiredPages_v2", || {
        retired_pages(device, cause, pageCount, addresses, timestamps)
    })
}

/// Whether a page retirement waits for a reboot.
///
/// # Safety
/// `isPending` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: sys::nvmlDevice_t,
    isPending: *mut sys::nvmlEnableState_t,
) -> Ret {
    ffi("nvmlDeviceGetRetiredPagesPendingStatus", || {
        non_null(isPending)?;
        let v = read(device, "retired_pages", |s| s.retired_pages_pending)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(isPending, c_uint::from(v)) }
    })
}

/// Remapped rows: correctable, uncorrectable, pending, failure.
///
/// # Safety
/// Each out-pointer must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: sys::nvmlDevice_t,
    corrRows: *mut c_uint,
    uncRows: *mut c_uint,
    isPending: *mut c_uint,
    failureOccurred: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetRemappedRows", || {
        for p in [corrRows, uncRows, isPending, failureOccurred] {
            non_null(p)?;
        }
        let (c, u, p, f) = read(device, "remapped_rows", |s| {
            (
                s.remapped_rows_correctable,
                s.remapped_rows_uncorrectable,
                s.remapped_rows_pending,
                s.remapped_rows_failure,
            )
        })?;
        // SAFETY: all four checked non-null; validity is the caller's contract.
        unsafe {
            put(corrRows, c)?;
            put(uncRows, u)?;
            put(isPending, c_uint::from(p))?;
            put(failureOccurred, c_uint::from(f))
        }
    })
}

fn nvlink<T>(
    device: sys::nvmlDevice_t,
    link: c_uint,
    f: impl FnOnce(&crate::scenario::GpuState) -> Result<T, Ret>,
) -> Result<T, Ret> {
    read(device, "nvlink", |s| {
        if link >= s.nvlink_count {
            return Err(INVALID_ARGUMENT);
        }
        f(s)
    })?
}

/// NVLink state of one link (1 active, 0 down).
///
/// # Safety
/// `isActive` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: sys::nvmlDevice_t,
    link: c_uint,
    isActive: *mut sys::nvmlEnableState_t,
) -> Ret {
    ffi("nvmlDeviceGetNvLinkState", || {
        non_null(isActive)?;
        let v = nvlink(device, link, |s| Ok(!s.nvlink_down.contains(&link)))?;
        // SAFETY: forwarded caller contract.
        unsafe { put(isActive, c_uint::from(v)) }
    })
}

/// NVLink error counter (0 replay, 1 recovery, 2 CRC flit, 3 CRC data) of one link.
///
/// # Safety
/// `counterValue` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: sys::nvmlDevice_t,
    link: c_uint,
    counter: c_uint,
    counterValue: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetNvLinkErrorCounter", || {
        non_null(counterValue)?;
        let v = nvlink(device, link, |s| match counter {
            0 => Ok(s.nvlink_replay_errors),
            1 => Ok(s.nvlink_recovery_errors),
            2 => Ok(s.nvlink_crc_flit_errors),
            3 => Ok(s.nvlink_crc_data_errors),
            _ => Err(NOT_SUPPORTED),
        })?;
        // SAFETY: forwarded caller contract.
        unsafe { put(counterValue, v) }
    })
}

/// Persistence mode (1 enabled).
///
/// # Safety
/// `mode` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: sys::nvmlDevice_t,
    mode: *mut sys::nvmlEnableState_t,
) -> Ret {
    ffi("nvmlDeviceGetPersistenceMode", || {
        non_null(mode)?;
        let v = read(device, "persistence_mode", |s| s.persistence_mode)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(mode, c_uint::from(v)) }
    })
}

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 2)`: the struct's size with the
/// version in the top byte, as nvml.h builds it.
const FABRIC_INFO_V2: c_uint =
    std::mem::size_of::<sys::nvmlGpuFabricInfo_v2_t>() as c_uint | (2 << 24);
/// `NVML_STRUCT_VERSION(GpuFabricInfo, 3)` (adds `healthSummary`).
const FABRIC_INFO_V3: c_uint =
    std::mem::size_of::<sys::nvmlGpuFabricInfo_v3_t>() as c_uint | (3 << 24);
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`: a versioned struct of a version
/// the library does not know.
const VERSION_MISMATCH: Ret = sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

/// The GPU's fabric registration, the first NVML call for it (no health mask).
///
/// # Safety
/// `info` must be null or valid for a write of `nvmlGpuFabricInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: sys::nvmlDevice_t,
    info: *mut sys::nvmlGpuFabricInfo_t,
) -> Ret {
    ffi("nvmlDeviceGetGpuFabricInfo", || {
        non_null(info)?;
        let f = read(device, "fabric", |s| s.fabric.clone())?;
        let v = sys::nvmlGpuFabricInfo_t {
            clusterUuid: f.cluster_uuid_bytes(),
            status: f.status_code(),
            cliqueId: f.clique_id,
            state: f.state_value(),
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(info, v) }
    })
}

/// The GPU's fabric registration with its health (`nvmlGpuFabricInfo_v2_t`
/// or `_v3_t`, by the `version` the caller set; any other version is
/// `ARGUMENT_VERSION_MISMATCH`, as NVML answers it).
///
/// # Safety
/// `info` must be null or point to a struct of the version in its `version`
/// field, valid for reads and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: sys::nvmlDevice_t,
    info: *mut sys::nvmlGpuFabricInfoV_t,
) -> Ret {
    ffi("nvmlDeviceGetGpuFabricInfoV", || {
        non_null(info)?;
        // SAFETY: non-null; `version` is the first field of every version.
        let version = unsafe { std::ptr::addr_of!((*info).version).read() };
        if version != FABRIC_INFO_V2 && version != FABRIC_INFO_V3 {
            return Err(VERSION_MISMATCH);
        }
        let f = read(device, "fabric", |s| s.fabric.clone())?;
        let v2 = sys::nvmlGpuFabricInfo_v2_t {
            version,
            clusterUuid: f.cluster_uuid_bytes(),
            status: f.status_code(),
            cliqueId: f.clique_id,
            state: f.state_value(),
            healthMask: f.health_mask,
        };
        if version == FABRIC_INFO_V3 {
            let v3 = sys::nvmlGpuFabricInfo_v3_t {
                version,
                clusterUuid: v2.clusterUuid,
                status: v2.status,
                cliqueId: v2.cliqueId,
                state: v2.state,
                healthMask: v2.healthMask,
                healthSummary: f.health_summary,
            };
            // SAFETY: the caller's struct is v3 (its version says so).
            unsafe { put(info, v3) }
        } else {
            // SAFETY: the caller's struct is v2: only its fields are written
            // (v2 is v3's prefix).
            unsafe { put(info.cast::<sys::nvmlGpuFabricInfo_v2_t>(), v2) }
        }
    })
}

/// Field ids the simulator answers (from nvml.h).
const FI_PCIE_REPLAY_COUNTER: c_uint = sys::field_id::NVML_FI_DEV_PCIE_REPLAY_COUNTER;
const FI_REMAPPED_COR: c_uint = sys::field_id::NVML_FI_DEV_REMAPPED_COR;
const FI_REMAPPED_UNC: c_uint = sys::field_id::NVML_FI_DEV_REMAPPED_UNC;
const FI_REMAPPED_PENDING: c_uint = sys::field_id::NVML_FI_DEV_REMAPPED_PENDING;
const FI_REMAPPED_FAILURE: c_uint = sys::field_id::NVML_FI_DEV_REMAPPED_FAILURE;
const FI_GPU_RECOVERY_ACTION: c_uint = sys::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;

/// Field values: remapped rows (142..=145), GPU recovery action (230), PCIe
/// replay counter (94); any other field is `NOT_SUPPORTED` in its own slot.
///
/// # Safety
/// `values` must be null or valid for `valuesCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: sys::nvmlDevice_t,
    valuesCount: c_int,
    values: *mut sys::nvmlFieldValue_t,
) -> Ret {
    ffi("nvmlDeviceGetFieldValues", || {
        non_null(values)?;
        let n = usize::try_from(valuesCount).map_err(|_| INVALID_ARGUMENT)?;
        let slot = slot_of(device)?;
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        // SAFETY: non-null; the caller provides `valuesCount` initialised entries.
        let fields = unsafe { std::slice::from_raw_parts_mut(values, n) };
        with_sim(|s| {
            s.gpu(slot)?;
            for f in fields.iter_mut() {
                let (reading, value): (&str, fn(&crate::scenario::GpuState) -> u32) = match f
                    .fieldId
                {
                    FI_REMAPPED_COR => ("remapped_rows", |s| s.remapped_rows_correctable),
                    FI_REMAPPED_UNC => ("remapped_rows", |s| s.remapped_rows_uncorrectable),
                    FI_REMAPPED_PENDING => {
                        ("remapped_rows", |s| u32::from(s.remapped_rows_pending))
                    }
                    FI_REMAPPED_FAILURE => {
                        ("remapped_rows", |s| u32::from(s.remapped_rows_failure))
                    }
                    FI_GPU_RECOVERY_ACTION => ("recovery_action", |s| s.recovery_action),
                    FI_PCIE_REPLAY_COUNTER => ("pcie_replay_counter", |s| s.pcie_replay_counter),
                    _ => ("", |_| 0),
                };
                f.timestamp = now_us;
                f.latencyUsec = 0;
                f.valueType = sys::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                let r = if reading.is_empty() {
                    Err(NOT_SUPPORTED)
                } else {
                    s.reading(slot, reading).map(value)
                };
                match r {
                    Ok(v) => {
                        f.nvmlReturn = SUCCESS;
                        f.value = sys::nvmlValue_t { uiVal: v };
                    }
                    Err(e) => f.nvmlReturn = e,
                }
            }
            Ok(())
        })
    })
}

/// Event types the GPU supports.
///
/// # Safety
/// `eventTypes` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: sys::nvmlDevice_t,
    eventTypes: *mut c_ulonglong,
) -> Ret {
    ffi("nvmlDeviceGetSupportedEventTypes", || {
        non_null(eventTypes)?;
        let slot = slot_of(device)?;
        let v = with_sim(|s| s.supported_events(slot))?;
        // SAFETY: forwarded caller contract.
        unsafe { put(eventTypes, v) }
    })
}

/// Creates an event set.
///
/// # Safety
/// `set` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut sys::nvmlEventSet_t) -> Ret {
    ffi("nvmlEventSetCreate", || {
        non_null(set)?;
        let id = with_sim(|s| s.event_set_create())?;
        let addr = usize::try_from(id).map_err(|_| UNKNOWN)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(set, std::ptr::without_provenance_mut(addr)) }
    })
}

/// Registers event types of a GPU in a set.
///
/// # Safety
/// None beyond NVML's (handles are checked, never dereferenced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: sys::nvmlDevice_t,
    eventTypes: c_ulonglong,
    set: sys::nvmlEventSet_t,
) -> Ret {
    ffi("nvmlDeviceRegisterEvents", || {
        let slot = slot_of(device)?;
        let id = set_id(set)?;
        with_sim(|s| s.register(id, slot, eventTypes))
    })
}

/// Waits up to `timeoutms` for the next event of the set.
///
/// # Safety
/// `data` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: sys::nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    timeoutms: c_uint,
) -> Ret {
    ffi("nvmlEventSetWait_v2", || {
        non_null(data)?;
        let id = set_id(set)?;
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeoutms));
        let mut g = lock();
        loop {
            let t0 = g.t0;
            let sim = g.sim()?;
            if let Some(ev) = sim.pop_event(id)? {
                let out = sys::nvmlEventData_t {
                    device: handle_of(ev.slot),
                    eventType: ev.event_type,
                    eventData: ev.data,
                    gpuInstanceId: 0,
                    computeInstanceId: 0,
                };
                // SAFETY: forwarded caller contract.
                return unsafe { put(data, out) };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TIMEOUT);
            }
            let mut sleep = deadline - now;
            if let (Some(t0), Some(due)) = (t0, sim.next_due_ms()) {
                let due_at = t0 + Duration::from_millis(due);
                sleep = sleep.min(due_at.saturating_duration_since(now));
            }
            g = WAKE
                .wait_timeout(g, sleep.max(Duration::from_millis(1)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    })
}

/// Frees an event set (waiters on it return `INVALID_ARGUMENT`).
///
/// # Safety
/// None beyond NVML's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: sys::nvmlEventSet_t) -> Ret {
    let r = ffi("nvmlEventSetFree", || {
        let id = set_id(set)?;
        let mut g = lock();
        let sim = g.sim.as_mut().ok_or(UNINITIALIZED)?;
        if !sim.has_set(id) {
            return Err(INVALID_ARGUMENT);
        }
        sim.event_set_free(id)
    });
    WAKE.notify_all();
    r
}

/// MIG mode: current and pending (`[gpu.mig] pending`, else the current
/// mode). A GPU without MIG support is told with `not_supported = ["mig"]`.
///
/// # Safety
/// `current` and `pending` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: sys::nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetMigMode", || {
        non_null(pending)?;
        let (on, next) = read(device, "mig", |s| (s.mig.enabled, s.mig.pending_mode()))?;
        // SAFETY: forwarded caller contract.
        unsafe {
            put(current, c_uint::from(on))?;
            put(pending, c_uint::from(next))
        }
    })
}

/// The most MIG devices the GPU can hold (NVML answers this whether or not
/// MIG is on).
///
/// # Safety
/// `count` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: sys::nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetMaxMigDeviceCount", || {
        read(device, "mig", |_| ())?;
        // SAFETY: forwarded caller contract.
        unsafe { put(count, crate::scenario::MAX_MIG_DEVICES as c_uint) }
    })
}

/// The MIG device at `index`: `NOT_FOUND` for an index with no device,
/// `INVALID_ARGUMENT` while MIG is off (`nvml.h`).
///
/// # Safety
/// `mig` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: sys::nvmlDevice_t,
    index: c_uint,
    mig: *mut sys::nvmlDevice_t,
) -> Ret {
    ffi("nvmlDeviceGetMigDeviceHandleByIndex", || {
        non_null(mig)?;
        let slot = slot_of(device)?;
        let state = read(device, "mig", |s| s.mig.clone())?;
        let i = index as usize;
        if !state.enabled || i >= crate::scenario::MAX_MIG_DEVICES {
            return Err(INVALID_ARGUMENT);
        }
        if i >= state.devices.len() {
            return Err(sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND);
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(mig, mig_handle_of(slot, i)) }
    })
}

/// A MIG device's GPU instance id (`INVALID_ARGUMENT` for a GPU handle).
///
/// # Safety
/// `id` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: sys::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetGpuInstanceId", || {
        let (d, _) = mig_device(device)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(id, d.gpu_instance) }
    })
}

/// A MIG device's compute instance id (`INVALID_ARGUMENT` for a GPU handle).
///
/// # Safety
/// `id` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: sys::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    ffi("nvmlDeviceGetComputeInstanceId", || {
        let (d, _) = mig_device(device)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(id, d.compute_instance) }
    })
}

/// A MIG device's slices and memory. nvml.h: "This API currently only
/// supports MIG device handles" — a GPU handle is `NOT_SUPPORTED`.
///
/// # Safety
/// `attrs` must be null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: sys::nvmlDevice_t,
    attrs: *mut sys::nvmlDeviceAttributes_t,
) -> Ret {
    ffi("nvmlDeviceGetAttributes_v2", || {
        non_null(attrs)?;
        if mig_of(device).is_err() {
            slot_of(device)?;
            return Err(NOT_SUPPORTED);
        }
        let (d, mib) = mig_device(device)?;
        let a = d.attributes(mib).ok_or(UNKNOWN)?;
        // SM and engine counts are not simulated (0): only the slices and
        // the memory name the profile.
        let v = sys::nvmlDeviceAttributes_t {
            multiprocessorCount: 0,
            sharedCopyEngineCount: 0,
            sharedDecoderCount: 0,
            sharedEncoderCount: 0,
            sharedJpegCount: 0,
            sharedOfaCount: 0,
            gpuInstanceSliceCount: a.gpu_slices,
            computeInstanceSliceCount: a.compute_slices,
            memorySizeMB: a.memory_mib,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(attrs, v) }
    })
}

/// `NVML_STRUCT_VERSION(Memory, 2)`.
const MEMORY_V2: c_uint = std::mem::size_of::<sys::nvmlMemory_v2_t>() as c_uint | (2 << 24);

/// The GPU's framebuffer memory: `memory_mib` in all, none of it used
/// (nothing runs on a simulated GPU). Any `version` but 2 is
/// `ARGUMENT_VERSION_MISMATCH`, as NVML answers it.
///
/// # Safety
/// `memory` must be null or point to an `nvmlMemory_v2_t`, valid for reads
/// and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: sys::nvmlDevice_t,
    memory: *mut sys::nvmlMemory_v2_t,
) -> Ret {
    ffi("nvmlDeviceGetMemoryInfo_v2", || {
        non_null(memory)?;
        // SAFETY: non-null; `version` is the first field.
        let version = unsafe { std::ptr::addr_of!((*memory).version).read() };
        if version != MEMORY_V2 {
            return Err(VERSION_MISMATCH);
        }
        let total = read(device, "memory", |s| s.memory_mib)? * 1024 * 1024;
        let v = sys::nvmlMemory_v2_t {
            version,
            total,
            reserved: 0,
            free: total,
            used: 0,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(memory, v) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_pointers_are_invalid_arguments_not_crashes() {
        // SAFETY: null out-pointers are exactly what is being tested; the
        // functions must reject them before touching anything.
        unsafe {
            assert_eq!(
                nvmlDeviceGetCount_v2(std::ptr::null_mut()),
                INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetUUID(handle_of(0), std::ptr::null_mut(), 80),
                INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlEventSetWait_v2(std::ptr::null_mut(), std::ptr::null_mut(), 0),
                INVALID_ARGUMENT
            );
            let mut h: sys::nvmlDevice_t = std::ptr::null_mut();
            // Not initialised in this process: a clean error, not a crash.
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(0, &mut h), UNINITIALIZED);
        }
    }

    #[test]
    fn short_string_buffer_is_insufficient_size() {
        let mut buf = [1 as c_char; 4];
        // SAFETY: buf is valid for 4 bytes.
        let r = unsafe { put_str(buf.as_mut_ptr(), 4, "GPU-0") };
        assert_eq!(r, Err(INSUFFICIENT_SIZE));
        // SAFETY: as above.
        unsafe { put_str(buf.as_mut_ptr(), 4, "abc") }.unwrap();
        assert_eq!(buf, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
    }

    /// `CALLS` (what a `[[hang]]` may name) is every function this file
    /// exports except `nvmlErrorString`, and every export checks for hangs.
    #[test]
    fn hang_call_names_are_exactly_the_exports() {
        let src = include_str!("ffi.rs")
            .split("#[cfg(test)]")
            .next()
            .expect("the non-test part");
        let mut exported: Vec<&str> = src
            .split("pub unsafe extern \"C\" fn ")
            .skip(1)
            .filter_map(|rest| rest.split('(').next())
            .filter(|name| *name != "$fn" && *name != "nvmlErrorString")
            .collect();
        // The u32_reading! macro's instances.
        for inst in src.split("u32_reading!(").skip(1) {
            let name = inst
                .lines()
                .find(|l| l.trim_start().starts_with("nvml"))
                .and_then(|l| l.trim().split(',').next())
                .expect("macro instance names a function");
            exported.push(name);
        }
        exported.sort_unstable();
        let mut calls = crate::CALLS.to_vec();
        calls.sort_unstable();
        assert_eq!(exported, calls);
    }

    #[test]
    fn mig_handles_round_trip_and_are_not_gpu_handles() {
        let h = mig_handle_of(3, 6);
        assert_eq!(mig_of(h), Ok((3, 6)));
        assert_eq!(
            slot_of(h),
            Err(INVALID_ARGUMENT),
            "a GPU call on a MIG handle"
        );
        assert_eq!(mig_of(handle_of(3)), Err(INVALID_ARGUMENT));
    }

    #[test]
    fn handles_round_trip_and_null_is_rejected() {
        assert_eq!(slot_of(handle_of(5)), Ok(5));
        assert_eq!(slot_of(std::ptr::null_mut()), Err(INVALID_ARGUMENT));
        assert_eq!(set_id(std::ptr::null_mut()), Err(INVALID_ARGUMENT));
    }
}
