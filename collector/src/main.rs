//! The `gpuwatch` binary (being written).
fn main() {}
