//! The drift check shared by the generated tables (XID catalog, NVLink5 decode
//! table): the checked-in Rust file is exactly what its generator makes of the
//! CSV beside it; with the regenerate variable set, the file is rewritten.

use std::path::PathBuf;

/// Compares (or, with `regenerate_var` set, rewrites) `data/<out>` against
/// `generate(data/<csv>)`; `how` says how to regenerate.
pub(crate) fn check_generated<E: std::fmt::Debug>(
    csv: &str,
    out: &str,
    regenerate_var: &str,
    how: &str,
    generate: impl Fn(&str) -> Result<String, E>,
) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data");
    let text = std::fs::read_to_string(dir.join(csv)).unwrap();
    let generated = generate(&text).unwrap();
    let path = dir.join(out);
    if std::env::var_os(regenerate_var).is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap();
    assert!(checked_in == generated, "data/{out} is stale; run {how}");
}
