//! Benchmark support (fixtures generation).
