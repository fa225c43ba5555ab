//! A simulated NVML (`libnvidia-ml.so`) for testing and demos.
//!
//! Built as a `cdylib` (`libnvml_sim.so`), it exports the NVML C functions that
//! gpuwatch calls through nvml-wrapper, and answers them from a TOML *scenario*:
//! simulated GPUs with identities and readings, plus injections timed in
//! milliseconds after the first `nvmlInit` call (XID / ECC / clock events, counters
//! rising, row remap pending or failed, PCIe downtraining, thermal slowdown,
//! NVLink down, NVLink fabric registration and health, lost or removed GPUs,
//! recovery action, init failures, recoveries)
//! and calls that hang (block inside the library for a while, or forever).
//!
//! The scenario is read on the first init call from the side file
//! `<library path>.scenario` (one line: the scenario path), or else from the file
//! named by `GPUWATCH_NVML_SIM_SCENARIO`. The full format is in
//! `nvml-sim/README.md`; in short:
//!
//! ```
//! use nvml_sim::{Scenario, Sim};
//!
//! let scenario = Scenario::parse(r#"
//!     [driver]
//!     init_error = "driver_not_loaded"
//!     init_fail_count = 1
//!
//!     [[gpu]]
//!     uuid = "GPU-11111111-2222-3333-4444-555555555555"
//!     pci = "00000000:3B:00.0"
//!
//!     [[inject]]
//!     at_ms = 100
//!     gpu = 0
//!     remapped_rows_pending = true
//! "#, "<doc>").unwrap();
//!
//! let mut sim = Sim::new(scenario);
//! assert!(sim.init(0).is_err());                 // first init: driver not loaded
//! sim.init(10).unwrap();
//! sim.advance(100);                              // the injection is due
//! assert!(sim.reading(0, "remapped_rows").unwrap().remapped_rows_pending);
//! ```
//!
//! The Rust API ([`Scenario`], [`Sim`]) is the pure core (no clock, no FFI) and is
//! what the unit tests exercise; the exported C functions live in a private module
//! and add pointer validation, the global lock and real time.
#![warn(unreachable_pub)]
#![deny(missing_docs)]

// The C entry points are found by their symbol names (`no_mangle`), which
// the Rust path does not reach: they stay `pub` as the C API they are.
#[allow(unreachable_pub)]
mod ffi;
mod scenario;
mod sim;

pub use ffi::{SCENARIO_ENV, SIDE_FILE_SUFFIX};
pub use scenario::{
    CALLS, DriverSpec, ERROR_NAMES, FABRIC_STATES, FabricSpec, GpuSpec, GpuState, HangSpec,
    Injection, READINGS, Scenario, ScenarioError, error_code, nvml_bus_id,
};
pub use sim::{
    EVENT_CLOCK, EVENT_DBE, EVENT_SBE, EVENT_XID, Event, Hang, Ret, SUPPORTED_EVENTS, Sim,
};
