//! The narrated timeline: what the agent reports (events on stdout, its JSON
//! log, `/v1/health`) turned into tagged lines of at most 120 characters.

use crate::health_view::{GpuView, clear_rule, gpu_change, gpu_views, node_line, sample_problems};
use crate::network_view::NetworkStory;
use crate::script::display_pci;
use gpuwatch_proto::{NodeHealth, ShortName};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Instant;

/// "GPU 6" out of the engine's "GPU 6 (GPU-…, 0000:ba:00.0)".
fn short_gpu(described: &str) -> &str {
    described.split(" (").next().unwrap_or(described)
}

pub(crate) fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// Where an event came from, in plain words (the schema's `source` values).
fn source_words(source: &str) -> &str {
    match source {
        "kmsg" => "the kernel log",
        "nvml_event" => "an NVML event",
        "nvml_poll" => "NVML polling",
        "log_file" => "a log file",
        "validation" => "device validation",
        other => other,
    }
}

fn describe_event(ev: &Value) -> String {
    let code = ev["code"].as_u64().unwrap_or(0);
    let what = match str_of(ev, "kind") {
        "xid" => format!("XID {code}"),
        "" => "fault".to_string(),
        k => k.replace('_', " "),
    };
    let gpu = match ev["gpu_index"].as_u64() {
        Some(i) => format!("GPU {i} ({})", display_pci(str_of(ev, "pci_address"))),
        None if !str_of(ev, "pci_address").is_empty() => {
            format!("the GPU at {}", display_pci(str_of(ev, "pci_address")))
        }
        None => "the node".to_string(),
    };
    let source = source_words(str_of(ev, "source"));
    match ev["attributes"]["reclassified_from"].as_str() {
        Some(from) => format!(
            "{what} on {gpu}, from {source}: {from} → {} ({})",
            str_of(ev, "action"),
            str_of(ev, "policy_reason")
        ),
        None => format!(
            "{what} on {gpu}, from {source}: {} → action {} ({})",
            str_of(ev, "name"),
            str_of(ev, "action"),
            str_of(ev, "policy_reason")
        ),
    }
}

/// Turns what the agent reports into the timeline.
pub(crate) struct Narrator {
    pub t0: Instant,
    pub last_node: String,
    pub gpus: BTreeMap<String, GpuView>,
    /// GPUs NVML enumerated (the node's GPU count), once it answered.
    pub gpu_count: Option<usize>,
    pub events: usize,
    /// Faults per final action: a reclassification moves its fault.
    pub by_action: BTreeMap<String, usize>,
    pub last_health: Option<NodeHealth>,
    /// The node's RDMA ports: the agent's `nic` records and `NetworkProblem`.
    pub net: NetworkStory,
}

/// Narration lines are at most this long.
pub(crate) const LINE_WIDTH: usize = 120;
/// `[ 12.3s] DETECTED  `: time and tag before the text.
const PREFIX_WIDTH: usize = 19;

/// Splits `text` at spaces into lines of at most `width` characters, the
/// first after nothing, the others after `indent`. A word longer than a line
/// is cut.
pub(crate) fn wrap(text: &str, width: usize, indent: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    let mut cur_len = 0usize;
    for word in text.split(' ') {
        let avail = width
            - if lines.is_empty() {
                0
            } else {
                indent.chars().count()
            };
        let wlen = word.chars().count();
        if cur_len > 0 && cur_len + 1 + wlen > avail {
            lines.push(std::mem::take(&mut cur));
            cur_len = 0;
        }
        let avail = width
            - if lines.is_empty() {
                0
            } else {
                indent.chars().count()
            };
        let mut word: String = word.to_string();
        while word.chars().count() > avail && cur_len == 0 {
            let head: String = word.chars().take(avail).collect();
            word = word.chars().skip(avail).collect();
            lines.push(head);
        }
        if cur_len > 0 {
            cur.push(' ');
            cur_len += 1;
        }
        cur_len += word.chars().count();
        cur.push_str(&word);
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    for l in lines.iter_mut().skip(1) {
        l.insert_str(0, indent);
    }
    lines
}

impl Narrator {
    pub(crate) fn new() -> Narrator {
        Narrator {
            t0: Instant::now(),
            last_node: String::new(),
            gpus: BTreeMap::new(),
            gpu_count: None,
            events: 0,
            by_action: BTreeMap::new(),
            last_health: None,
            net: NetworkStory::default(),
        }
    }

    pub(crate) fn say(&self, tag: &str, text: &str) {
        let prefix = format!("[{:5.1}s] {tag:<9} ", self.t0.elapsed().as_secs_f64());
        let indent = " ".repeat(PREFIX_WIDTH);
        let body = wrap(text, LINE_WIDTH - PREFIX_WIDTH, "");
        for (i, line) in body.iter().enumerate() {
            let lead = if i == 0 {
                prefix.as_str()
            } else {
                indent.as_str()
            };
            println!("{lead}{line}");
        }
    }

    pub(crate) fn event(&mut self, ev: &Value) {
        if str_of(ev, "kind") == "nic" {
            // Network records: never GPU faults, not counted with them.
            let line = self.net.record(ev);
            self.say("NIC", &line);
            return;
        }
        let action = str_of(ev, "action").to_string();
        let tag = match ev["attributes"]["reclassified_from"].as_str() {
            Some(from) => {
                // The same fault, now with another action: counted once, by
                // its final action.
                if let Some(c) = self.by_action.get_mut(from) {
                    *c -= 1;
                    if *c == 0 {
                        self.by_action.remove(from);
                    }
                }
                *self.by_action.entry(action).or_default() += 1;
                "RECLASS"
            }
            None => {
                self.events += 1;
                *self.by_action.entry(action).or_default() += 1;
                "DETECTED"
            }
        };
        self.say(tag, &describe_event(ev));
    }

    /// "GPU 6" for the engine's "GPU 6 (GPU-…, 0000:ba:00.0)"; where the
    /// engine has no confirmed index yet ("GPU ? (0000:ba:00.0)"), the index
    /// this narration last saw at that address, else the address.
    fn gpu_label(&self, described: &str) -> String {
        let short = short_gpu(described);
        if short != "GPU ?" {
            return short.to_string();
        }
        let pci = described
            .rsplit([',', '('])
            .next()
            .unwrap_or_default()
            .trim()
            .trim_end_matches(')');
        let pci = display_pci(pci);
        match self.gpus.get(&pci).and_then(|g| g.index) {
            Some(i) => format!("GPU {i}"),
            None => format!("the GPU at {pci}"),
        }
    }

    /// "summary" text of the faults by final action.
    pub(crate) fn actions_summary(&self) -> String {
        if self.by_action.is_empty() {
            return "none".to_string();
        }
        self.by_action
            .iter()
            .map(|(a, c)| format!("{c} {a}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(crate) fn log(&mut self, v: &Value) {
        let msg = str_of(v, "message");
        match msg {
            "Fault cleared." | "Node-level fault cleared." => {
                let who = if msg == "Fault cleared." {
                    self.gpu_label(str_of(v, "gpu"))
                } else {
                    format!("node device {}", display_pci(str_of(v, "pci")))
                };
                self.say(
                    "CLEARED",
                    &format!(
                        "{who} {} ({}): {}",
                        str_of(v, "fault"),
                        str_of(v, "action"),
                        str_of(v, "reason")
                    ),
                );
            }
            "Observed evidence of a GPU reset." => self.say(
                "EVIDENCE",
                &format!(
                    "{}: {} (reset evidence)",
                    self.gpu_label(str_of(v, "gpu")),
                    str_of(v, "evidence")
                ),
            ),
            m if m.starts_with("Restored health state") => self.say(
                "RESTORED",
                &format!(
                    "{} active fault(s) from the state file: {m}",
                    v["active_faults"].as_u64().unwrap_or(0)
                ),
            ),
            // Narrated through the events and the GPU verdicts.
            "GPU fault became active."
            | "Fault reclassified from NVML's row-remap state."
            | "NVML lost a GPU."
            | "GPU is missing from the NVML enumeration." => {}
            _ if v["level"] == "WARN" || v["level"] == "ERROR" => {
                self.say(&format!("agent {}", str_of(v, "level")), msg);
            }
            _ => {}
        }
    }

    pub(crate) fn health(&mut self, h: NodeHealth) {
        let nvml_reported = h.input_up("nvml");
        for mut g in gpu_views(&h) {
            let prev = self.gpus.get(&g.pci);
            if !nvml_reported && !g.answering {
                // Restarted agent before its first NVML sample: the GPU's
                // state is not known yet, keep the last one narrated.
                continue;
            }
            if g.index.is_none() {
                g.index = prev.and_then(|p| p.index);
            }
            if let Some(line) = gpu_change(prev, &g) {
                self.say("", &line);
            }
            self.gpus.insert(g.pci.clone(), g);
        }
        if nvml_reported {
            self.gpu_count = Some(h.gpus.len());
        }
        let node = node_line(&h, self.gpu_count);
        if node != self.last_node {
            self.say("NODE", &node);
            if !h.message.is_empty() {
                self.say("", &h.message);
            }
            self.last_node = node;
        }
        let gpus: Vec<GpuView> = self.gpus.values().cloned().collect();
        for (tag, line) in self.net.health(&h, &gpus) {
            self.say(tag, &line);
        }
        self.last_health = Some(h);
    }

    /// GPUs that are not healthy at the end, with what keeps them so.
    pub(crate) fn explain_remaining(&self) {
        let Some(h) = &self.last_health else {
            return;
        };
        for g in &h.gpus {
            let verdict = g.verdict().short_name();
            if verdict == "healthy" {
                continue;
            }
            let label = g
                .index
                .map_or_else(|| g.pci_address.clone(), |i| i.to_string());
            let action = g.action().short_name();
            let faults: Vec<String> = g
                .active_faults
                .iter()
                .map(|f| format!("{} ({})", f.reason, f.action().short_name()))
                .collect();
            let problems = sample_problems(g.sample.as_ref());
            let why = if problems.is_empty() {
                "NVML reports nothing wrong now".to_string()
            } else {
                format!(
                    "NVML in this boot reports {}, so the GPU does not validate",
                    problems.join(", ")
                )
            };
            self.say(
                "STAYS",
                &format!(
                    "GPU {label} {verdict} ({action}): {}; {why}; {}.",
                    faults.join(", "),
                    clear_rule(action)
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclassification_events_name_both_actions() {
        let ev = serde_json::json!({
            "kind": "xid", "code": 64, "gpu_index": 5, "pci_address": "0000:ab:00.0",
            "source": "nvml_poll", "action": "inspect_hardware", "name": "x",
            "policy_reason": "Re-evaluated", "attributes": {"reclassified_from": "reset_gpu"}
        });
        assert_eq!(
            describe_event(&ev),
            "XID 64 on GPU 5 (0000:ab:00.0), from NVML polling: reset_gpu → inspect_hardware \
             (Re-evaluated)"
        );
        assert_eq!(short_gpu("GPU 6 (GPU-1, 0000:ba:00.0)"), "GPU 6");
    }

    #[test]
    fn summary_counts_the_final_action_of_a_reclassified_fault() {
        let mut n = Narrator::new();
        n.event(
            &serde_json::json!({"kind": "xid", "code": 64, "gpu_index": 5,
            "pci_address": "0000:ab:00.0", "source": "kmsg", "action": "reset_gpu"}),
        );
        n.event(
            &serde_json::json!({"kind": "xid", "code": 13, "gpu_index": 1,
            "pci_address": "0000:2a:00.0", "source": "kmsg", "action": "restart_app"}),
        );
        n.event(
            &serde_json::json!({"kind": "xid", "code": 64, "gpu_index": 5,
            "pci_address": "0000:ab:00.0", "source": "nvml_poll", "action": "inspect_hardware",
            "attributes": {"reclassified_from": "reset_gpu"}}),
        );
        assert_eq!(n.events, 2, "a reclassification is the same fault");
        assert_eq!(n.actions_summary(), "1 inspect_hardware, 1 restart_app");
    }

    #[test]
    fn wrap_keeps_lines_within_the_width() {
        let text = "NVRM: Xid (PCI:0000:18:00): 48, pid=31338, name=train.py, An uncorrectable \
                    double bit error (DBE) has been detected on GPU in the framebuffer at \
                    partition 0, subpartition 0.";
        let lines = wrap(text, 60, "    ");
        assert!(lines.len() > 2, "{lines:#?}");
        assert!(lines.iter().all(|l| l.chars().count() <= 60), "{lines:#?}");
        assert!(lines[1..].iter().all(|l| l.starts_with("    ")));
        let words: Vec<&str> = lines.iter().flat_map(|l| l.split_whitespace()).collect();
        assert_eq!(words.join(" "), text, "nothing lost or reordered");
        assert_eq!(wrap("short", 60, "  "), ["short"]);
        assert!(wrap(&"x".repeat(130), 50, "").iter().all(|l| l.len() <= 50));
    }

    #[test]
    fn unconfirmed_gpu_is_named_by_its_last_index_or_address() {
        let mut n = Narrator::new();
        assert_eq!(n.gpu_label("GPU 6 (GPU-1, 0000:ba:00.0)"), "GPU 6");
        assert_eq!(
            n.gpu_label("GPU ? (0000:3a:00.0)"),
            "the GPU at 0000:3a:00.0"
        );
        n.gpus.insert(
            "0000:3a:00.0".into(),
            GpuView {
                pci: "0000:3a:00.0".into(),
                index: Some(2),
                verdict: "healthy".into(),
                action: String::new(),
                faults: Vec::new(),
                answering: true,
            },
        );
        assert_eq!(n.gpu_label("GPU ? (00000000:3A:00.0)"), "GPU 2");
        assert_eq!(display_pci("00000000:3A:00.0"), "0000:3a:00.0");
        assert_eq!(source_words("kmsg"), "the kernel log");
    }
}
