//! The shipped example configuration parses into the typed structs, passes
//! validation, names every section and key of the configuration, and states
//! every default (it must not drift from the code).

use gpuwatch::{Config, Overrides};
use std::path::Path;

fn example() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/gpuwatch.example.toml")
}

fn example_text() -> String {
    std::fs::read_to_string(example()).expect("the example configuration")
}

#[test]
fn example_config_parses_and_validates() {
    let node = Overrides {
        node_name: Some("example-node".into()),
        ..Overrides::default()
    };
    let cfg = gpuwatch::resolve(Some(&example()), &node).expect("example config loads");
    cfg.validate().expect("example config is valid");
}

/// Every value the example writes is the default: the example parsed equals
/// an empty file parsed (both without the node name filled in), section by
/// section.
#[test]
fn example_config_states_the_defaults() {
    let path = Path::new("gpuwatch.example.toml");
    let written = Config::parse(path, &example_text()).expect("example parses");
    let defaults = Config::parse(path, "").expect("an empty file parses");
    let written = format!("{written:#?}");
    let defaults = format!("{defaults:#?}");
    let differs: Vec<(&str, &str)> = written
        .lines()
        .zip(defaults.lines())
        .filter(|(w, d)| w != d)
        .collect();
    assert!(
        differs.is_empty() && written.lines().count() == defaults.lines().count(),
        "the example's values differ from the defaults (example, default): {differs:#?}"
    );
}

/// The keys of the table at `path` (dotted; empty: the top level) when it is
/// a struct with named keys, from the `unknown field` error every section's
/// `deny_unknown_fields` gives for a key it does not know (serde names the
/// keys it expects there); `None` for a value that is not such a table (a
/// scalar, a list, or a map that takes any key).
fn struct_keys(path: &str) -> Option<Vec<String>> {
    let text = if path.is_empty() {
        "no_such_option = 1\n".to_owned()
    } else {
        format!("[{path}]\nno_such_option = 1\n")
    };
    let err = Config::parse(Path::new("probe.toml"), &text)
        .err()?
        .to_string();
    let (_, expected) = err.split_once("unknown field `no_such_option`")?;
    let expected = expected.lines().next().unwrap_or_default();
    if expected.contains("there are no fields") {
        return Some(Vec::new());
    }
    // "expected one of `a`, `b`" or "expected `a`": every quoted name.
    Some(
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// Every key path of the configuration, found by walking [`struct_keys`]
/// from the top level down: `node_name`, `kmsg.path`, `otlp.tls.ca_file`...
fn every_key(path: &str, out: &mut Vec<String>) {
    let keys = struct_keys(path).unwrap_or_else(|| panic!("[{path}] is not a table of keys"));
    assert!(
        !keys.is_empty() || !path.is_empty(),
        "no top-level keys found"
    );
    for key in keys {
        let full = if path.is_empty() {
            key
        } else {
            format!("{path}.{key}")
        };
        out.push(full.clone());
        if struct_keys(&full).is_some() {
            every_key(&full, out);
        }
    }
}

/// Whether the example writes `path` (a value or a table), or names it in a
/// commented-out line of its table (`# library_path = "..."`, for a key
/// whose default is "unset") or a commented-out table header
/// (`# [policy.xid."31"]`).
fn example_names(example: &toml::Table, text: &str, path: &str) -> bool {
    let mut parts: Vec<&str> = path.split('.').collect();
    let mut table = example;
    let key = parts.pop().expect("a key");
    let mut present = true;
    for part in &parts {
        match table.get(*part).and_then(toml::Value::as_table) {
            Some(t) => table = t,
            None => present = false,
        }
    }
    if present && table.contains_key(key) {
        return true;
    }
    let section = parts.join(".");
    let (exact, below) = (format!("[{path}]"), format!("[{path}."));
    if text.lines().any(|l| {
        let l = l.trim_start_matches(['#', ' ']);
        l.starts_with(&exact) || l.starts_with(&below)
    }) {
        return true;
    }
    // A commented-out `key = ...` line inside the section's own table.
    let mut inside = section.is_empty();
    for line in text.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[') {
            inside = header.trim_end_matches(']') == section;
            continue;
        }
        if inside
            && let Some(commented) = line.strip_prefix('#')
            && commented
                .trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        {
            return true;
        }
    }
    false
}

/// An option the example leaves out is one an operator never learns of: every
/// section and key of the configuration (found by asking the configuration's
/// own schema, not from a list here) is written in the example, or named in
/// a commented-out line of its section when it has no default value.
#[test]
fn example_config_names_every_section_and_key() {
    let text = example_text();
    let example: toml::Table = toml::from_str(&text).expect("example parses");
    let mut keys = Vec::new();
    every_key("", &mut keys);
    for probe in ["kmsg.path", "network.expected_ports", "otlp.tls.ca_file"] {
        assert!(keys.iter().any(|k| k == probe), "{probe} in {keys:?}");
    }
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| !example_names(&example, &text, k))
        .collect();
    assert!(
        missing.is_empty(),
        "keys missing from config/gpuwatch.example.toml: {missing:?}"
    );
}

/// The walk above finds a key that is missing (it would pass for a walk
/// that finds nothing, or an example check that accepts anything).
#[test]
fn a_key_left_out_of_the_example_is_found() {
    let text = example_text();
    let without: String = text
        .lines()
        .filter(|l| !l.starts_with("poll_interval_secs") && !l.contains("[otlp.tls]"))
        .map(|l| format!("{l}\n"))
        .collect();
    let example: toml::Table = toml::from_str(&without).expect("still parses");
    assert!(!example_names(
        &example,
        &without,
        "nvml.poll_interval_secs"
    ));
    assert!(!example_names(&example, &without, "otlp.tls"));
    assert!(example_names(&example, &without, "nvml.library_path"));
    assert!(example_names(&example, &without, "policy.xid"));
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
