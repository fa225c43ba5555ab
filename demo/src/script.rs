//! The kernel lines the demo writes, derived from the nvml-sim scenario: one
//! NVRM line per injected XID (at the same time); the NIC flap's
//! `mlx5_core` lines with their port changes; and the scenario and script
//! with every time divided by the demo's speed.

use crate::DemoError;
use crate::nic::{FLAPPING, FLAPS, NetworkTimings, PortChange};
use std::path::Path;

/// A kernel line the demo writes: when, what, and the narration's words for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScriptedLine {
    /// Milliseconds after the agent started.
    pub at_ms: u64,
    /// As the driver prints it, without a priority prefix.
    pub message: String,
    /// What the narration says when it is written.
    pub note: String,
    /// The NIC port change the line reports, written into the demo's sysfs
    /// tree with it; `None` for a GPU line.
    pub port: Option<PortChange>,
}

impl ScriptedLine {
    /// The line's kernel log level: `mlx5_core` link lines are
    /// `netdev_info()` (6); NVRM's XID lines are KERN_WARNING (4, `<4>` in
    /// `dmesg -r` of a real H200 driver).
    pub(crate) fn level(&self) -> u8 {
        if self.port.is_some() { 6 } else { 4 }
    }
}

/// A scenario GPU (index → PCI address).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ScenarioGpu {
    index: u64,
    pci: String,
}

/// The process id of the first injected line; each injection takes the next.
const FIRST_PID: u64 = 31_338;

/// `dddd:bb:dd` (domain, bus, device), as NVRM prints a PCI address: without
/// the function.
pub(crate) fn kernel_pci(pci: &str) -> String {
    let norm = xid_parser::normalize_pci(pci).unwrap_or_else(|| pci.to_ascii_lowercase());
    norm.rsplit_once('.')
        .map_or(norm.clone(), |(a, _)| a.to_string())
}

/// The one PCI address format of the narration, the agent's own
/// (`0000:18:00.0`), whatever the scenario file wrote.
pub(crate) fn display_pci(pci: &str) -> String {
    xid_parser::normalize_pci(pci).unwrap_or_else(|| pci.to_ascii_lowercase())
}

/// The driver's text after `Xid (PCI:…): N, pid=…, name=…, ` for each XID the
/// demo writes.
fn xid_text(xid: u64) -> &'static str {
    match xid {
        79 => "GPU has fallen off the bus.",
        48 => {
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."
        }
        63 => "Row Remapper: New row marked for remapping, reset gpu to activate.",
        64 => "Row Remapper Error: failed to remap row.",
        74 => "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        94 => "Contained: SM (0x1). RST: No, D-RST: No",
        95 => "Uncontained: FBHUB. RST: Yes, D-RST: No",
        119 => {
            "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)."
        }
        _ => "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    }
}

fn xid_line(pci: &str, xid: u64, pid: u64, process: &str) -> String {
    format!(
        "NVRM: Xid (PCI:{}): {xid}, pid={pid}, name={process}, {}",
        kernel_pci(pci),
        xid_text(xid)
    )
}

/// Builds the kernel-line script from a scenario's text: one NVRM Xid line
/// per `[[inject]]` with an `xid` (at the same time), a row-remapper line for
/// an injected `remapped_rows_failure`, and an application fault (XID 13) on
/// another GPU 3 s after the first injection, to show that application faults
/// do not isolate the node.
pub(crate) fn script_from_scenario(text: &str) -> Result<Vec<ScriptedLine>, String> {
    let v: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
    let gpus = scenario_gpus(&v);
    if gpus.is_empty() {
        return Err("the scenario has no [[gpu]] with a pci address".into());
    }
    let injections = v
        .get("inject")
        .and_then(|i| i.as_array())
        .cloned()
        .unwrap_or_default();
    let mut script = Vec::new();
    let mut pid = FIRST_PID;
    for inj in &injections {
        let pci = inj
            .get("gpu")
            .and_then(|x| x.as_integer())
            .and_then(|g| gpus.iter().find(|s| s.index == g as u64));
        if let Some(gpu) = pci {
            script.extend(injection_line(inj, &gpu.pci, pid));
            pid += 1;
        }
    }
    if let Some(line) = application_fault(&script, &gpus) {
        script.push(line);
    }
    script.sort_by_key(|s| s.at_ms);
    Ok(script)
}

/// The scenario's `[[gpu]]` tables that name a PCI address (a missing `index`
/// is the table's position).
fn scenario_gpus(v: &toml::Value) -> Vec<ScenarioGpu> {
    let Some(tables) = v.get("gpu").and_then(|g| g.as_array()) else {
        return Vec::new();
    };
    tables
        .iter()
        .enumerate()
        .filter_map(|(i, g)| {
            Some(ScenarioGpu {
                index: g
                    .get("index")
                    .and_then(|x| x.as_integer())
                    .map_or(i as u64, |x| x as u64),
                pci: g.get("pci")?.as_str()?.to_string(),
            })
        })
        .collect()
}

/// The kernel line of one `[[inject]]` on the GPU at `pci`: its XID, or XID 64
/// for a row-remap failure without one; none for the other injections (NVML
/// readings only).
fn injection_line(inj: &toml::Value, pci: &str, pid: u64) -> Option<ScriptedLine> {
    let at_ms = inj.get("at_ms").and_then(|x| x.as_integer()).unwrap_or(0) as u64;
    let note = inj.get("note").and_then(|n| n.as_str()).unwrap_or("");
    let (xid, default_note) = match inj.get("xid").and_then(|x| x.as_integer()) {
        Some(xid) => (
            xid as u64,
            format!("kernel reports XID {xid} on {}", display_pci(pci)),
        ),
        None if inj.get("xid").is_none()
            && inj.get("remapped_rows_failure").and_then(|x| x.as_bool()) == Some(true) =>
        {
            (64, format!("row remapping fails on {}", display_pci(pci)))
        }
        None => return None,
    };
    Some(ScriptedLine {
        at_ms,
        message: xid_line(pci, xid, pid, "train.py"),
        note: if note.is_empty() {
            default_note
        } else {
            note.to_string()
        },
        port: None,
    })
}

/// An application crash (XID 13) on a GPU other than the first injection's,
/// 3 s after the earliest injection.
fn application_fault(script: &[ScriptedLine], gpus: &[ScenarioGpu]) -> Option<ScriptedLine> {
    let first = script.iter().map(|s| s.at_ms).min()?;
    let first_line = script.first().map(|s| s.message.as_str()).unwrap_or("");
    let other = gpus
        .iter()
        .find(|g| !first_line.contains(&kernel_pci(&g.pci)))?;
    Some(ScriptedLine {
        at_ms: first + 3000,
        message: xid_line(&other.pci, 13, 4711, "notebook.py"),
        note: format!(
            "an application crashes on {} (XID 13)",
            display_pci(&other.pci)
        ),
        port: None,
    })
}

/// The flap as script lines from `start_ms` (after the agent started), every
/// time divided by `speed`: down, up, [`FLAPS`] times, each a port change in
/// the tree and the `mlx5_core` line the driver prints for it (`crate::nic`).
pub(crate) fn flap_script(start_ms: u64, speed: u32, t: &NetworkTimings) -> Vec<ScriptedLine> {
    let start = start_ms / u64::from(speed.max(1));
    let half = t.half_flap.as_millis() as u64;
    (0..2 * FLAPS)
        .map(|i| {
            let up = i % 2 == 1;
            let change = PortChange { nic: FLAPPING, up };
            let (word, state) = if up {
                ("up", "4: ACTIVE / 5: LinkUp")
            } else {
                ("down", "1: DOWN / 2: Polling")
            };
            ScriptedLine {
                at_ms: start + u64::from(i) * half,
                message: format!(
                    "mlx5_core {} {}: Link {word}",
                    FLAPPING.pci, FLAPPING.netdev
                ),
                note: format!(
                    "{} link {word} ({} {state} in sysfs, flap {} of {FLAPS})",
                    FLAPPING.netdev,
                    change.port_name(),
                    i / 2 + 1
                ),
                port: Some(change),
            }
        })
        .collect()
}

/// The time of the scenario's last injection.
pub(crate) fn last_inject_ms(text: &str) -> u64 {
    toml::from_str::<toml::Value>(text)
        .ok()
        .and_then(|v| {
            v.get("inject")?.as_array().map(|a| {
                a.iter()
                    .filter_map(|i| i.get("at_ms")?.as_integer())
                    .max()
                    .unwrap_or(0) as u64
            })
        })
        .unwrap_or(0)
}

/// The scenario with every time divided by `speed` (`[[inject]] at_ms`,
/// `[driver] init_fail_until_ms`).
pub(crate) fn scale_scenario(text: &str, speed: u32) -> Result<String, String> {
    let mut v: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
    if speed <= 1 {
        return Ok(text.to_string());
    }
    let scale = |x: &mut toml::Value| {
        if let Some(ms) = x.as_integer() {
            *x = toml::Value::Integer(ms / i64::from(speed));
        }
    };
    if let Some(injects) = v.get_mut("inject").and_then(|i| i.as_array_mut()) {
        for inj in injects {
            if let Some(at) = inj.get_mut("at_ms") {
                scale(at);
            }
        }
    }
    if let Some(until) = v
        .get_mut("driver")
        .and_then(|d| d.get_mut("init_fail_until_ms"))
    {
        scale(until);
    }
    toml::to_string(&v).map_err(|e| e.to_string())
}

/// Reads a scenario file: its text with times scaled by `speed`, and its
/// kernel-line script on the same timeline.
pub(crate) fn read_scenario(
    path: &Path,
    speed: u32,
) -> Result<(String, Vec<ScriptedLine>), DemoError> {
    let err = |message: String| DemoError::Scenario {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let mut script = script_from_scenario(&text).map_err(err)?;
    for l in &mut script {
        l.at_ms /= u64::from(speed);
    }
    let scaled = scale_scenario(&text, speed).map_err(err)?;
    Ok((scaled, script))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCENARIO: &str = r#"
description = "t"
[[gpu]]
index = 0
uuid = "GPU-a"
pci = "00000000:1B:00.0"
[[gpu]]
index = 1
uuid = "GPU-b"
pci = "0000:2c:00.0"
[[inject]]
at_ms = 5000
gpu = 1
xid = 79
lost = true
note = "GPU 1 falls off the bus"
[[inject]]
at_ms = 10000
gpu = 0
remapped_rows_failure = true
"#;

    #[test]
    fn script_mirrors_scenario_injections_as_kernel_lines() {
        let s = script_from_scenario(SCENARIO).unwrap();
        let msgs: Vec<(u64, &str)> = s.iter().map(|l| (l.at_ms, l.message.as_str())).collect();
        assert_eq!(msgs.len(), 3, "{msgs:#?}");
        assert_eq!(msgs[0].0, 5000);
        assert!(
            msgs[0]
                .1
                .starts_with("NVRM: Xid (PCI:0000:2c:00): 79, pid="),
            "{}",
            msgs[0].1
        );
        assert_eq!(s[0].note, "GPU 1 falls off the bus");
        // Application fault on the other GPU 3 s after the first injection.
        assert_eq!(msgs[1].0, 8000);
        assert!(msgs[1].1.contains("(PCI:0000:1b:00): 13,"), "{}", msgs[1].1);
        assert_eq!(msgs[2].0, 10000);
        assert!(msgs[2].1.contains("(PCI:0000:1b:00): 64,"), "{}", msgs[2].1);
        assert_eq!(last_inject_ms(SCENARIO), 10000);
    }

    #[test]
    fn speed_scales_scenario_and_script_times() {
        let scaled = scale_scenario(SCENARIO, 4).unwrap();
        assert_eq!(last_inject_ms(&scaled), 2500);
        let v: toml::Value = toml::from_str(&scaled).unwrap();
        assert_eq!(v["inject"][0]["at_ms"].as_integer(), Some(1250));
        assert_eq!(
            v["inject"][0]["note"].as_str(),
            Some("GPU 1 falls off the bus")
        );
        assert_eq!(v["gpu"][1]["pci"].as_str(), Some("0000:2c:00.0"));
        assert_eq!(scale_scenario(SCENARIO, 1).unwrap(), SCENARIO);
        assert!(scale_scenario("[[inject]\n", 2).is_err());
    }

    #[test]
    fn shipped_scenarios_build_scripts() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-sim/scenarios");
        let first = std::fs::read_to_string(dir.join("demo.toml")).unwrap();
        let script = script_from_scenario(&first).unwrap();
        let xids: Vec<&str> = script
            .iter()
            .filter_map(|l| l.message.split("): ").nth(1)?.split(',').next())
            .collect();
        assert_eq!(xids, ["79", "13", "64"]);
        let after = std::fs::read_to_string(dir.join("demo-after-reboot.toml")).unwrap();
        assert!(script_from_scenario(&after).unwrap().is_empty());
        assert!(after.contains("remapped_rows_failure = true"));
    }

    #[test]
    fn flap_alternates_down_and_up_in_tree_and_kernel_line() {
        let t = crate::nic::timings(1);
        let script = flap_script(31_000, 1, &t);
        assert_eq!(script.len(), 6);
        assert_eq!(script[0].at_ms, 31_000);
        assert_eq!(script[5].at_ms, 33_000);
        assert_eq!(script[0].message, "mlx5_core 0000:9b:00.0 ib2: Link down");
        assert_eq!(script[1].message, "mlx5_core 0000:9b:00.0 ib2: Link up");
        let ups: Vec<bool> = script
            .iter()
            .map(|l| l.port.as_ref().is_some_and(|p| p.up))
            .collect();
        assert_eq!(ups, [false, true, false, true, false, true]);
        // The agent's line parser reads them as this port's link lines.
        match xid_parser::parse_message(&script[0].message) {
            Some(xid_parser::Message::Nic(m)) => {
                assert_eq!(m.pci, Some("0000:9b:00.0"));
                assert_eq!(
                    m.event,
                    xid_parser::NicEvent::Link {
                        netdev: "ib2",
                        up: false
                    }
                );
            }
            other => panic!("not a NIC line: {other:?}"),
        }
        // Faster: the same order, the halves never shorter than two polls.
        let fast = crate::nic::timings(4);
        assert_eq!(fast.poll_interval_ms, 100);
        assert_eq!(fast.half_flap, std::time::Duration::from_millis(200));
        assert!(fast.flap_quiet_secs >= 1 && fast.down_grace_secs >= 1);
        assert_eq!(flap_script(31_000, 4, &fast)[0].at_ms, 7_750);
    }

    #[test]
    fn scenario_without_gpus_is_an_error() {
        assert!(script_from_scenario("description = \"x\"\n").is_err());
        assert!(script_from_scenario("not toml [").is_err());
    }
}
