//! The parser's integration tests, one binary: golden lines from real systems,
//! and the fast paths checked against plain reference implementations.

mod golden;
mod prefilter_reference;
mod proptest_reference;
mod saved_log;
