//! What the agent reports about the node's RDMA ports, as the narration
//! words it: its `nic` records (the `mlx5_core` kernel lines it read, the
//! port status changes its NIC monitor decided), `NodeHealth.network` (the
//! `NetworkProblem` condition), and what the demo waits for when it flaps a
//! port — each statement from the agent's own reports, and a line saying so
//! when the agent did not report one in time.

use crate::health_view::GpuView;
use gpuwatch_proto::{FaultEvent, NetworkHealth, NodeHealth};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The `NetworkProblem` reasons the flap story waits for.
const FLAPPING: &str = "NICPortFlapping";
const HEALTHY: &str = "NICHealthy";

/// The condition as `/v1/health` shows it: `NetworkProblem=True
/// NICPortFlapping`.
pub(crate) fn condition(n: &NetworkHealth) -> String {
    let status = if n.problem { "True" } else { "False" };
    format!("NetworkProblem={status} {}", n.reason)
}

/// `mlx5_2/1 ib2`.
fn port_label(device: &str, port: u32, netdev: &str) -> String {
    if netdev.is_empty() {
        format!("{device}/{port}")
    } else {
        format!("{device}/{port} {netdev}")
    }
}

/// The first report: the ports, their link layers and rates, how many are up,
/// and the condition.
pub(crate) fn first_report(n: &NetworkHealth) -> String {
    if n.ports.is_empty() {
        return format!("no RDMA port found; {}", condition(n));
    }
    let names: Vec<String> = n
        .ports
        .iter()
        .map(|p| port_label(&p.device, p.port, &p.netdev))
        .collect();
    let mut kinds: Vec<String> = n
        .ports
        .iter()
        .map(|p| {
            let layer = match p.link_layer.as_str() {
                "infiniband" => "InfiniBand",
                "ethernet" => "RoCE",
                other => other,
            };
            format!("{layer} {} Gb/s", p.rate_gbps)
        })
        .collect();
    kinds.dedup();
    let up = n.ports.iter().filter(|p| p.status == "up").count();
    let state = if up == n.ports.len() {
        "all up".to_string()
    } else {
        format!("{up} of {} up", n.ports.len())
    };
    format!(
        "{} RDMA ports ({}): {}; {state}; {}",
        n.ports.len(),
        kinds.join(", "),
        names.join(", "),
        condition(n)
    )
}

/// Where a NIC record came from, in plain words.
fn nic_source(source: &str) -> &str {
    match source {
        "kmsg" => "the kernel log",
        "sysfs" => "the sysfs scan",
        other => other,
    }
}

/// One `nic` record in words: a kernel link line (`NICLinkDown on ib2
/// (0000:9b:00.0), from the kernel log`) or a port status change
/// (`NICPortFlapping on mlx5_2/1 ib2: up → flapping, action investigate`).
pub(crate) fn describe_record(ev: &Value) -> String {
    let attr = |k: &str| ev["attributes"][k].as_str().unwrap_or("");
    let reason = serde_json::from_value::<FaultEvent>(ev.clone())
        .map(|e| e.short_reason())
        .unwrap_or_else(|_| "NIC record".to_string());
    let source = nic_source(ev["source"].as_str().unwrap_or(""));
    let pci = ev["pci_address"].as_str().unwrap_or("");
    if attr("nic_status").is_empty() {
        let netdev = match attr("netdev") {
            "" => "a NIC".to_string(),
            n => n.to_string(),
        };
        return format!("{reason} on {netdev} ({pci}), from {source}");
    }
    let port = port_label(
        attr("rdma_device"),
        attr("nic_port").parse().unwrap_or(0),
        attr("netdev"),
    );
    format!(
        "{reason} on {port}, from {source}: {} → {}, action {}",
        attr("nic_status_from"),
        attr("nic_status"),
        ev["action"].as_str().unwrap_or("")
    )
}

/// Something the demo expects the agent to report.
#[derive(Debug, Default)]
struct Expect {
    seen: bool,
    /// Unset until the demo has done what should make the agent report it.
    deadline: Option<Instant>,
    /// Said that it was not reported.
    told: bool,
}

impl Expect {
    fn arm(&mut self, timeout: Duration) {
        if !self.seen {
            self.deadline = Some(Instant::now() + timeout);
        }
    }

    /// True once when the deadline passed without the report (`now: None`:
    /// the boot ends, any armed deadline counts as passed).
    fn overdue(&mut self, now: Option<Instant>) -> bool {
        let passed = self
            .deadline
            .is_some_and(|d| now.is_none_or(|now| now >= d));
        if passed && !self.seen && !self.told {
            self.told = true;
            return true;
        }
        false
    }
}

/// A port the demo flaps, and what it waits for the agent to say about it.
#[derive(Debug)]
struct FlapWatch {
    /// `mlx5_2/1`.
    port: String,
    netdev: String,
    /// The GPU verdicts when the flap began, by label.
    verdicts_before: BTreeMap<String, String>,
    link_down: Expect,
    flapping: Expect,
    healthy: Expect,
    /// The quiet window and the report time, to arm `healthy`.
    after_flapping: Duration,
    timeout: Duration,
}

/// The network part of the narration.
#[derive(Debug, Default)]
pub(crate) struct NetworkStory {
    /// The condition last narrated; `None` before the first report of this
    /// agent.
    last: Option<String>,
    monitor_ok: Option<bool>,
    /// `nic` records the agent emitted.
    pub records: usize,
    /// The last condition reported (for the summary).
    pub last_condition: Option<String>,
    watch: Option<FlapWatch>,
}

impl NetworkStory {
    /// A new agent started: its first report is narrated in full.
    pub(crate) fn agent_started(&mut self) {
        self.last = None;
        self.monitor_ok = None;
    }

    /// The demo is about to take `port` (`mlx5_2/1`, netdev `netdev`) down:
    /// the GPU verdicts now are the ones the flap must leave alone, and the
    /// agent should report the link down within `timeout`. The clear is
    /// waited for `quiet + timeout` after the flapping is reported.
    pub(crate) fn flap_begins(
        &mut self,
        port: &str,
        netdev: &str,
        gpus: &[GpuView],
        quiet: Duration,
        timeout: Duration,
    ) {
        let mut watch = FlapWatch {
            port: port.to_string(),
            netdev: netdev.to_string(),
            verdicts_before: gpus
                .iter()
                .map(|g| (g.label(), g.verdict.clone()))
                .collect(),
            link_down: Expect::default(),
            flapping: Expect::default(),
            healthy: Expect::default(),
            after_flapping: quiet + timeout,
            timeout,
        };
        watch.link_down.arm(timeout);
        self.watch = Some(watch);
    }

    /// The flap's last line is written: the agent should report the port
    /// flapping within the timeout.
    pub(crate) fn flap_written(&mut self) {
        if let Some(w) = &mut self.watch {
            w.flapping.arm(w.timeout);
        }
    }

    /// A `nic` record: its line, and whether it is the flapped port's link
    /// going down.
    pub(crate) fn record(&mut self, ev: &Value) -> String {
        self.records += 1;
        if let Some(w) = &mut self.watch
            && ev["attributes"]["nic_event"] == "link_down"
            && ev["attributes"]["netdev"] == w.netdev.as_str()
        {
            w.link_down.seen = true;
        }
        describe_record(ev)
    }

    /// `/v1/health`'s network part: lines (tag, text) for what changed, and,
    /// when the flapped port is reported flapping, whether the GPU verdicts
    /// stayed as they were.
    pub(crate) fn health(
        &mut self,
        h: &NodeHealth,
        gpus: &[GpuView],
    ) -> Vec<(&'static str, String)> {
        let Some(n) = &h.network else {
            return Vec::new();
        };
        if self.last.is_none() && !n.monitor_ok && n.ports.is_empty() {
            // The agent has not read the ports yet.
            return Vec::new();
        }
        let mut out = Vec::new();
        if self.monitor_ok != Some(n.monitor_ok) {
            if !n.monitor_ok {
                out.push((
                    "NETWORK",
                    format!(
                        "the NIC monitor cannot read the ports: {}",
                        n.monitor_message
                    ),
                ));
            }
            self.monitor_ok = Some(n.monitor_ok);
        }
        // The condition's changes, not its message's: a port within its
        // grace changes the message ("3 of 4 ports up") and no condition.
        let now = condition(n);
        match &self.last {
            None => out.push(("NETWORK", first_report(n))),
            Some(last) if *last != now => {
                let text = if n.message.is_empty() {
                    now.clone()
                } else {
                    format!("{now}: {}", n.message)
                };
                out.push(("NETWORK", text));
            }
            Some(_) => {}
        }
        self.last_condition = Some(now.clone());
        self.last = Some(now);
        if let Some(w) = &mut self.watch {
            if !w.flapping.seen && n.problem && n.reason == FLAPPING && n.message.contains(&w.port)
            {
                w.flapping.seen = true;
                w.healthy.arm(w.after_flapping);
                out.push(("", gpus_unaffected(&w.verdicts_before, h, gpus)));
            } else if w.flapping.seen && !w.healthy.seen && !n.problem && n.reason == HEALTHY {
                w.healthy.seen = true;
            }
        }
        out
    }

    /// What the agent has not reported by its deadline, once each; `now:
    /// None` at the end of the boot (every armed deadline has passed).
    pub(crate) fn overdue(&mut self, now: Option<Instant>) -> Vec<String> {
        let Some(w) = &mut self.watch else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let secs = w.timeout.as_secs_f64();
        if w.link_down.overdue(now) {
            out.push(format!(
                "the agent reported no link down of {} within {secs:.1} s of the first Link down",
                w.netdev
            ));
        }
        if w.flapping.overdue(now) {
            out.push(format!(
                "the agent reported no {FLAPPING} naming {} within {secs:.1} s of the last flap",
                w.port
            ));
        }
        if w.healthy.overdue(now) {
            out.push(format!(
                "the agent did not report {HEALTHY} within {:.1} s of {FLAPPING} (the quiet \
                 window and {secs:.1} s)",
                w.after_flapping.as_secs_f64()
            ));
        }
        out
    }
}

/// Whether the GPUs heard of the network problem: their verdicts now against
/// those when the flap began, and any network fault among the GPU and node
/// faults.
fn gpus_unaffected(before: &BTreeMap<String, String>, h: &NodeHealth, gpus: &[GpuView]) -> String {
    let changed: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let was = before.get(&g.label())?;
            (*was != g.verdict).then(|| format!("{} {was} → {}", g.label(), g.verdict))
        })
        .collect();
    let nic_faults = h
        .gpus
        .iter()
        .flat_map(|g| &g.active_faults)
        .chain(&h.node_faults)
        .filter(|f| f.reason.starts_with("NIC"))
        .count();
    let verdicts = if changed.is_empty() {
        format!(
            "GPUs unaffected: all {} GPU verdicts as before the flap",
            gpus.len()
        )
    } else {
        format!(
            "GPU verdicts changed since the flap began: {}",
            changed.join(", ")
        )
    };
    let faults = if nic_faults == 0 {
        "no network fault on a GPU or the node".to_string()
    } else {
        format!("{nic_faults} network fault(s) among the GPU and node faults")
    };
    format!("{verdicts}; {faults}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(v: Value) -> NodeHealth {
        serde_json::from_value(v).expect("a NodeHealth")
    }

    fn ports(status: &str) -> Value {
        serde_json::json!([
            {"device": "mlx5_0", "port": 1, "link_layer": "infiniband", "netdev": "ib0",
             "rate_gbps": 400.0, "status": "up"},
            {"device": "mlx5_2", "port": 1, "link_layer": "infiniband", "netdev": "ib2",
             "rate_gbps": 400.0, "status": status}
        ])
    }

    fn gpu(verdict: &str) -> GpuView {
        GpuView {
            pci: "0000:9a:00.0".into(),
            index: Some(4),
            verdict: verdict.into(),
            action: String::new(),
            faults: Vec::new(),
            answering: true,
        }
    }

    #[test]
    fn records_are_named_by_the_agents_reason() {
        let line = serde_json::json!({
            "kind": "nic", "source": "kmsg", "pci_address": "0000:9b:00.0",
            "attributes": {"nic_event": "link_down", "netdev": "ib2"}
        });
        assert_eq!(
            describe_record(&line),
            "NICLinkDown on ib2 (0000:9b:00.0), from the kernel log"
        );
        let change = serde_json::json!({
            "kind": "nic", "source": "kmsg", "action": "investigate",
            "attributes": {"nic_reason": "NICPortFlapping", "nic_status": "flapping",
                           "nic_status_from": "up", "rdma_device": "mlx5_2",
                           "nic_port": "1", "netdev": "ib2"}
        });
        assert_eq!(
            describe_record(&change),
            "NICPortFlapping on mlx5_2/1 ib2, from the kernel log: up → flapping, action \
             investigate"
        );
    }

    #[test]
    fn flap_story_follows_the_condition_and_says_what_is_missing() {
        let mut s = NetworkStory::default();
        let unread = health(serde_json::json!({
            "network": {"problem": false, "reason": "NICHealthy", "monitor_ok": false,
                        "monitor_message": "no NIC scan yet"}
        }));
        assert!(s.health(&unread, &[]).is_empty(), "nothing read yet");
        let healthy = health(serde_json::json!({
            "network": {"problem": false, "reason": "NICHealthy", "monitor_ok": true,
                        "ports": ports("up")}
        }));
        let lines = s.health(&healthy, &[gpu("healthy")]);
        assert_eq!(
            lines[0].1,
            "2 RDMA ports (InfiniBand 400 Gb/s): mlx5_0/1 ib0, mlx5_2/1 ib2; all up; \
             NetworkProblem=False NICHealthy"
        );
        assert!(s.health(&healthy, &[gpu("healthy")]).is_empty());
        let going_down = health(serde_json::json!({
            "network": {"problem": false, "reason": "NICHealthy", "monitor_ok": true,
                        "message": "1 of 2 ports up", "ports": ports("going_down")}
        }));
        assert!(
            s.health(&going_down, &[gpu("healthy")]).is_empty(),
            "the same condition"
        );

        let t = Duration::from_secs(60);
        s.flap_begins("mlx5_2/1", "ib2", &[gpu("healthy")], t, t);
        s.record(&serde_json::json!({
            "kind": "nic", "attributes": {"nic_event": "link_down", "netdev": "ib2"}
        }));
        s.flap_written();
        let flapping = health(serde_json::json!({
            "network": {"problem": true, "reason": "NICPortFlapping", "monitor_ok": true,
                        "message": "mlx5_2/1 (ib2) InfiniBand flapping: 3 flaps in 1m",
                        "ports": ports("flapping")}
        }));
        let lines = s.health(&flapping, &[gpu("healthy")]);
        assert_eq!(
            lines[0].1,
            "NetworkProblem=True NICPortFlapping: mlx5_2/1 (ib2) InfiniBand flapping: 3 flaps \
             in 1m"
        );
        assert_eq!(
            lines[1].1,
            "GPUs unaffected: all 1 GPU verdicts as before the flap; no network fault on a GPU \
             or the node"
        );
        // Nothing is overdue yet; at the end of the boot, the clear that never
        // came is named.
        assert!(s.overdue(Some(Instant::now())).is_empty());
        let missing = s.overdue(None);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(
            missing[0].contains("did not report NICHealthy"),
            "{missing:?}"
        );
        assert!(s.overdue(None).is_empty(), "said once");
    }

    #[test]
    fn an_unreported_flap_is_said_and_changed_verdicts_are_named() {
        let mut s = NetworkStory::default();
        s.flap_begins(
            "mlx5_2/1",
            "ib2",
            &[gpu("healthy")],
            Duration::ZERO,
            Duration::ZERO,
        );
        s.flap_written();
        let missing = s.overdue(Some(Instant::now() + Duration::from_millis(1)));
        assert_eq!(missing.len(), 2, "{missing:?}");
        assert!(missing[0].contains("no link down of ib2"));
        assert!(missing[1].contains("no NICPortFlapping naming mlx5_2/1"));

        let before: BTreeMap<String, String> =
            [("GPU 4".to_string(), "healthy".to_string())].into();
        let h = health(serde_json::json!({}));
        assert_eq!(
            gpus_unaffected(&before, &h, &[gpu("degraded")]),
            "GPU verdicts changed since the flap began: GPU 4 healthy → degraded; no network \
             fault on a GPU or the node"
        );
    }
}
