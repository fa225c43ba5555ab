//! The shipped example configuration parses into the typed structs, passes
//! validation, and states every default (it must not drift from the code).

use gpuwatch::Config;
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
    assert_eq!(cfg.network, d.network, "[network] defaults");
    assert_eq!(
        format!("{:?}", cfg.kubelet),
        format!("{:?}", d.kubelet),
        "[kubelet] defaults"
    );
}

/// `[network]` is typed with serde both ways: every key it has is written out in the
/// example (an option the example leaves out is one an operator never learns of).
#[test]
fn example_config_names_every_network_key() {
    let text = std::fs::read_to_string(example()).expect("example");
    let example: toml::Table = toml::from_str(&text).expect("example parses");
    let written = example
        .get("network")
        .and_then(toml::Value::as_table)
        .expect("[network] in the example");
    let defaults = toml::Value::try_from(gpuwatch_core::network::NetworkConfig::default())
        .expect("[network] serialises");
    let defaults = defaults.as_table().expect("a table");
    let missing: Vec<&String> = defaults
        .keys()
        .filter(|k| !written.contains_key(*k))
        .collect();
    assert!(
        missing.is_empty(),
        "[network] keys missing from the example: {missing:?}"
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
        "kubelet",
        "network",
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
