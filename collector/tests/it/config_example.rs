//! The shipped example configuration parses into the typed structs, passes
//! validation, and states every default (it must not drift from the code).

use gpuwatch::config::Config;
use std::path::Path;

fn example() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/gpuwatch.example.toml")
}

#[test]
fn example_config_parses_and_validates() {
    let mut cfg = Config::load(&example()).expect("example config loads");
    cfg.node_name = "example-node".into();
    cfg.validate().expect("example config is valid");
}

#[test]
fn example_config_states_the_defaults() {
    let cfg = Config::load(&example()).unwrap();
    let d = Config::defaults();
    assert_eq!(cfg.state_dir, d.state_dir);
    assert_eq!(cfg.kmsg, d.kmsg);
    assert_eq!(cfg.nvml, d.nvml);
    assert_eq!(cfg.api, d.api);
    assert_eq!(cfg.sinks, d.sinks);
    assert_eq!(cfg.log, d.log);
    assert_eq!(cfg.otlp, d.otlp);
    assert_eq!(
        format!("{:?}", cfg.kube),
        format!("{:?}", d.kube),
        "[kube] defaults"
    );
    assert_eq!(
        format!("{:?}", cfg.engine),
        format!("{:?}", d.engine),
        "[engine] defaults"
    );
    assert_eq!(
        format!("{:?}", cfg.validation),
        format!("{:?}", d.validation),
        "[validation] defaults"
    );
}

#[test]
fn every_section_rejects_unknown_keys() {
    for section in [
        "kmsg",
        "nvml",
        "engine",
        "policy",
        "api",
        "sinks",
        "log",
        "otlp",
        "kube",
        "validation",
    ] {
        let text = format!("[{section}]\nno_such_option = 1\n");
        let err = Config::parse(Path::new("x.toml"), &text).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("{section}.no_such_option")),
            "[{section}]: {msg}"
        );
    }
}
