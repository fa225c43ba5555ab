//! Health-engine integration tests: one binary, one module per behaviour.

mod bounds;
mod contracts_doc;
mod dedup;
mod fabric;
mod join;
mod monitor_and_inputs;
mod network;
mod pods;
mod recovery;
mod remap;
mod run;
mod state;
mod threshold;
mod verdict;

use gpuwatch_test_support::engine as support;
