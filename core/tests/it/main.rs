//! Health-engine integration tests: one binary, one module per behaviour.

mod bounds;
mod dedup;
mod join;
mod monitor_and_inputs;
mod recovery;
mod remap;
mod run;
mod state;
mod support;
mod threshold;
mod verdict;
