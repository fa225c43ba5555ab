//! The monitor's messages: what an SRE reads in a Node Event or
//! `/v1/health` at 3 a.m.

use std::time::{Duration, Instant};

use gpuwatch_proto::FaultEvent;

use super::{DownCause, Port, PortStatus};
use crate::network::{LinkLayer, NetworkSettings};

/// The link layer as people write it.
pub(super) fn layer(l: LinkLayer) -> &'static str {
    match l {
        LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Ethernet => "Ethernet (RoCE)",
        LinkLayer::Efa => "AWS EFA",
        LinkLayer::Unknown => "unknown link layer",
    }
}

/// `5s`, `4m 10s`, `2h 5m`, `3d 4h`.
pub(super) fn duration(d: Duration) -> String {
    let s = d.as_secs();
    let (d_, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (d_, h, m) {
        (0, 0, 0) => format!("{sec}s"),
        (0, 0, _) if sec == 0 => format!("{m}m"),
        (0, 0, _) => format!("{m}m {sec}s"),
        (0, _, 0) => format!("{h}h"),
        (0, _, _) => format!("{h}h {m}m"),
        (_, 0, _) => format!("{d_}d"),
        _ => format!("{d_}d {h}h"),
    }
}

/// `mlx5_0/1 (ib0, InfiniBand, 400 Gb/s)`.
fn label(p: &Port) -> String {
    let r = &p.reading;
    let mut parts = Vec::with_capacity(3);
    if let Some(n) = &r.netdev {
        parts.push(n.clone());
    }
    parts.push(layer(r.link_layer).to_string());
    if let Some(rate) = r.rate_gbps {
        parts.push(format!("{rate} Gb/s"));
    }
    format!("{} ({})", r.id, parts.join(", "))
}

/// `mlx5_0/1 (ib0)`: the short form for lists.
fn short(p: &Port) -> String {
    match &p.reading.netdev {
        Some(n) => format!("{} ({n})", p.reading.id),
        None => p.reading.id.to_string(),
    }
}

/// `state DOWN, phys_state Polling`; for an EFA port, that its driver
/// does not report one.
fn states(p: &Port) -> String {
    if p.efa {
        return "port state not reported: the EFA driver says ACTIVE/LinkUp always".to_string();
    }
    format!(
        "state {}, phys_state {}",
        p.reading.state.as_str(),
        p.reading.phys_state.as_str()
    )
}

/// Flaps in the window, as a sentence to append (empty for none).
fn flaps_sentence(p: &Port, now: Instant, s: &NetworkSettings) -> String {
    if p.flaps_in_window(now, s) == 0 {
        String::new()
    } else {
        format!(" {}.", flaps(p, now, s))
    }
}

/// Why the port is not up, as evidence.
fn down_evidence(p: &Port) -> String {
    match p.down_cause {
        DownCause::Scan => states(p),
        // Once a scan read it not up, its states say more than the line.
        DownCause::KernelLinkDown if !p.reading.is_up() => {
            format!("{}; the kernel reported link down", states(p))
        }
        DownCause::KernelLinkDown => "the kernel reported link down".to_string(),
        DownCause::Unplugged if !p.reading.is_up() => format!(
            "the kernel reported the cable or module unplugged; {}",
            states(p)
        ),
        DownCause::Unplugged => "the kernel reported the cable or module unplugged".to_string(),
        DownCause::Vanished => {
            "its RDMA device disappeared from sysfs: NIC removed, driver unbound or NIC dead"
                .to_string()
        }
    }
}

fn down_for(p: &Port, now: Instant) -> String {
    p.down_since
        .map(|d| duration(now.saturating_duration_since(d)))
        .unwrap_or_else(|| "a while".to_string())
}

fn flaps(p: &Port, now: Instant, s: &NetworkSettings) -> String {
    let n = p.flaps_in_window(now, s);
    format!(
        "{n} flap{} in the last {}",
        if n == 1 { "" } else { "s" },
        duration(s.flap_window)
    )
}

/// `rx_drops rose by 500, over the 100 its rule allowed (burst 100, 1/s)`.
fn breach(p: &Port) -> String {
    match &p.rate_breach {
        Some(b) => format!(
            "{} rose by {}, over the {} its rule allowed (burst {}, {}/s)",
            b.counter, b.increase, b.allowed, b.rule.burst, b.rule.per_second
        ),
        None => "an error counter rose faster than its rule allows".to_string(),
    }
}

/// `present` for an EFA port (all that is known of it), else `up`.
fn up_word(p: &Port) -> &'static str {
    if p.efa { "present" } else { "up" }
}

fn hw_what(p: &Port) -> &str {
    p.hw_fault
        .as_ref()
        .map_or("hardware fault", |h| h.what.as_str())
}

/// A problem port, for `NetworkHealth.message`.
pub(super) fn problem(p: &Port, now: Instant, s: &NetworkSettings) -> String {
    match p.status {
        PortStatus::HardwareFault => format!("{}: {}", short(p), hw_what(p)),
        PortStatus::Down => format!(
            "{} {} down for {}",
            short(p),
            layer(p.reading.link_layer),
            down_for(p, now)
        ),
        PortStatus::Flapping => format!(
            "{} {} flapping: {}",
            short(p),
            layer(p.reading.link_layer),
            flaps(p, now, s)
        ),
        PortStatus::Degraded => format!(
            "{} {} at {} Gb/s, below {} Gb/s",
            short(p),
            layer(p.reading.link_layer),
            p.reading.rate_gbps.unwrap_or(0.0),
            s.min_rate_gbps.unwrap_or(0.0)
        ),
        PortStatus::ErrorRate => format!(
            "{} {} error rate: {}",
            short(p),
            layer(p.reading.link_layer),
            breach(p)
        ),
        _ => format!("{} {}", short(p), p.status.as_str()),
    }
}

/// One port's status in words, for `NicPortHealth.message`.
pub(super) fn port(p: &Port, now: Instant, s: &NetworkSettings) -> String {
    match p.status {
        PortStatus::Up if p.flaps_in_window(now, s) == 0 => "up".to_string(),
        PortStatus::Up => format!("up; {}", flaps(p, now, s)),
        PortStatus::GoingDown => format!(
            "not up for {} ({}); down if not back within {}",
            down_for(p, now),
            down_evidence(p),
            duration(s.down_grace)
        ),
        PortStatus::Down => format!("down for {} ({})", down_for(p, now), down_evidence(p)),
        PortStatus::Flapping => format!(
            "flapping: {}; clears after {} without a flap",
            flaps(p, now, s),
            duration(s.flap_quiet)
        ),
        PortStatus::Degraded => format!(
            "up at {} Gb/s, below the {} Gb/s minimum",
            p.reading.rate_gbps.unwrap_or(0.0),
            s.min_rate_gbps.unwrap_or(0.0)
        ),
        PortStatus::HardwareFault => format!(
            "{}; clears after {} without another",
            hw_what(p),
            duration(s.flap_quiet)
        ),
        PortStatus::NeverUp => format!(
            "not up since the agent started ({}): information, not a problem",
            states(p)
        ),
        PortStatus::Ignored => format!("on the ignore list ({})", states(p)),
        PortStatus::ErrorRate => format!(
            "error rate: {}; clears after {} without another",
            breach(p),
            duration(s.flap_quiet)
        ),
        PortStatus::StateUnreported => format!(
            "present; {}: judged by its presence and its error-counter rates ({})",
            states(p),
            ruled_counters(p, s)
        ),
    }
}

/// Which of the port's counters have an error-rate rule, in words.
fn ruled_counters(p: &Port, s: &NetworkSettings) -> String {
    let ruled: Vec<&str> = p
        .counters
        .iter()
        .filter(|(n, c)| c.known() && s.error_rate.contains_key(*n))
        .map(|(n, _)| n.as_str())
        .collect();
    if ruled.is_empty() {
        "none readable: presence only".to_string()
    } else {
        format!("{} counters with a rule: {}", ruled.len(), ruled.join(", "))
    }
}

/// A transition to `p.status` from `from`, for a Node Event.
pub(super) fn transition(p: &Port, from: PortStatus, now: Instant, s: &NetworkSettings) -> String {
    let who = label(p);
    let fl = flaps(p, now, s);
    let more = flaps_sentence(p, now, s);
    match p.status {
        PortStatus::GoingDown => format!(
            "{who} is not up ({}); reported down if not back within {}.{more}",
            down_evidence(p),
            duration(s.down_grace)
        ),
        PortStatus::Down => format!(
            "{who} is down for {} ({}): RDMA traffic over it has stopped; jobs using it hang \
             or fail over.{more}",
            down_for(p, now),
            down_evidence(p)
        ),
        PortStatus::Flapping => format!(
            "{who} is flapping: {fl} (threshold {}); jobs over it stall at every flap. \
             Check the cable, transceiver and switch port. Clears after {} without a flap.",
            s.flap_threshold,
            duration(s.flap_quiet)
        ),
        PortStatus::Degraded => format!(
            "{who} is up below the {} Gb/s minimum: a lane, cable or transceiver is degraded.",
            s.min_rate_gbps.unwrap_or(0.0)
        ),
        PortStatus::HardwareFault => format!(
            "{who}: NIC hardware fault: {}. Check the NIC, its PCIe slot, cable and \
             transceiver. Clears after {} without another.",
            hw_what(p),
            duration(s.flap_quiet)
        ),
        PortStatus::ErrorRate => format!(
            "{who}: error rate: {}. Jobs over it retransmit, stall or fail; check the NIC, \
             the fabric path and the remote peers. Clears after {} without another.",
            breach(p),
            duration(s.flap_quiet)
        ),
        PortStatus::NeverUp => {
            let expected = match p.reading.link_layer {
                LinkLayer::InfiniBand => s.expected_infiniband,
                LinkLayer::Ethernet => s.expected_ethernet,
                LinkLayer::Efa => s.expected_efa,
                LinkLayer::Unknown => None,
            };
            match expected {
                Some(n) => format!(
                    "{who} has not been up since the agent started ({}); it counts against \
                     the {n} expected {} ports.",
                    states(p),
                    layer(p.reading.link_layer)
                ),
                None => format!(
                    "{who} has not been up since the agent started ({}). Information only: no \
                     expected port count is set for it; set [network] expected_ports to have \
                     such ports reported, or ignore it.",
                    states(p)
                ),
            }
        }
        PortStatus::Up | PortStatus::StateUnreported => match from {
            PortStatus::GoingDown if p.returned => format!(
                "{who} is back {} after {}, within the grace: counted as a flap. {fl}.",
                up_word(p),
                p.last_outage.map(duration).unwrap_or_default()
            ),
            PortStatus::GoingDown | PortStatus::NeverUp => {
                format!("{who} is {}.", up_word(p))
            }
            PortStatus::Down => format!(
                "{who} is {} again after {} away (counted as a flap). {fl}.",
                up_word(p),
                p.last_outage
                    .map(duration)
                    .unwrap_or_else(|| "a while".into())
            ),
            PortStatus::ErrorRate => format!(
                "{who}: the error rate is back within its rules: no breach for {}.",
                duration(s.flap_quiet)
            ),
            PortStatus::Flapping => format!(
                "{who} is no longer flapping: no flap for {}.",
                duration(s.flap_quiet)
            ),
            PortStatus::HardwareFault => format!(
                "{who}: the NIC hardware fault cleared: none for {}.",
                duration(s.flap_quiet)
            ),
            PortStatus::Degraded => format!("{who} is back at its rate."),
            PortStatus::Up | PortStatus::Ignored | PortStatus::StateUnreported => {
                format!("{who} is {}.", up_word(p))
            }
        },
        PortStatus::Ignored => format!("{who} is ignored."),
    }
}

/// Too few ports of a link layer up: `7 of 8 expected InfiniBand ports up
/// (not up: mlx5_7/1 (ib7))`, naming the ports not up that the message does
/// not name already as problems.
pub(super) fn expected(l: LinkLayer, up: usize, expected: u32, not_up: &[&Port]) -> String {
    let mut m = if l == LinkLayer::Efa {
        format!("{up} of {expected} expected AWS EFA devices present")
    } else {
        format!("{up} of {expected} expected {} ports up", layer(l))
    };
    let names: Vec<String> = not_up
        .iter()
        .filter(|p| !p.status.is_problem())
        .map(|p| short(p))
        .collect();
    if !names.is_empty() {
        let what = if l == LinkLayer::Efa {
            "gone"
        } else {
            "not up"
        };
        m.push_str(&format!(" ({what}: {})", join_capped(&names, 300)));
    }
    m
}

/// Nothing wrong: how many ports are up, and the never-up ones; the AWS EFA
/// devices present, and what they are judged by (never their port state).
pub(super) fn healthy<'a>(ports: impl Iterator<Item = &'a Port>, s: &NetworkSettings) -> String {
    let (mut ib, mut eth, mut other, mut ignored) = (0, 0, 0, 0);
    let (mut efa, mut efa_blind) = (0, 0);
    let mut never = Vec::new();
    let mut total = 0;
    for p in ports {
        if p.ignored {
            ignored += 1;
            continue;
        }
        if p.efa {
            if p.up {
                efa += 1;
                let ruled = p
                    .counters
                    .iter()
                    .any(|(n, c)| c.known() && s.error_rate.contains_key(n));
                if !ruled {
                    efa_blind += 1;
                }
            }
            continue;
        }
        total += 1;
        if p.status == PortStatus::NeverUp {
            never.push(short(p));
        }
        if p.up {
            match p.reading.link_layer {
                LinkLayer::InfiniBand => ib += 1,
                LinkLayer::Ethernet => eth += 1,
                LinkLayer::Efa | LinkLayer::Unknown => other += 1,
            }
        }
    }
    if total == 0 && efa == 0 && ignored == 0 {
        return "No RDMA ports found.".to_string();
    }
    let mut parts = Vec::new();
    if total > 0 {
        let mut m = format!("{} of {total} ports up", ib + eth + other);
        let by: Vec<String> = [
            (ib, "InfiniBand"),
            (eth, "Ethernet (RoCE)"),
            (other, "unknown"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, l)| format!("{n} {l}"))
        .collect();
        if !by.is_empty() {
            m.push_str(&format!(" ({})", by.join(", ")));
        }
        parts.push(m);
    }
    if efa > 0 {
        let mut m = format!(
            "{efa} AWS EFA device{} present, no error-rate breach (their port state is not \
             evidence: the EFA driver reports ACTIVE/LinkUp always; judged by presence and \
             error-counter rates",
            if efa == 1 { "" } else { "s" }
        );
        if efa_blind > 0 {
            m.push_str(&format!(
                "; {efa_blind} without a readable counter that has a rule: presence only"
            ));
        }
        m.push(')');
        parts.push(m);
    }
    let mut m = parts.join("; ");
    if ignored > 0 {
        m.push_str(&format!("; {ignored} ignored"));
    }
    if !never.is_empty() {
        m.push_str(&format!(
            "; not up since the agent started: {}",
            join_capped(&never, 400)
        ));
    }
    m.push('.');
    m
}

/// Joins with `; ` up to about `cap` bytes; the rest is counted.
pub(super) fn join_capped(items: &[String], cap: usize) -> String {
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        let sep = if out.is_empty() { "" } else { "; " };
        if !out.is_empty() && out.len() + sep.len() + item.len() > cap {
            out.push_str(&format!("; and {} more", items.len() - i));
            return out;
        }
        out.push_str(sep);
        out.push_str(item);
    }
    out
}

/// The first line of a kernel message, at most 160 characters.
fn line(ev: &FaultEvent) -> String {
    let first = ev.message.lines().next().unwrap_or("").trim();
    match first.char_indices().nth(160) {
        Some((i, _)) => format!("{}…", &first[..i]),
        None => first.to_string(),
    }
}

/// An uncorrectable PCIe AER at the NIC.
pub(super) fn aer(ev: &FaultEvent, severity: &str) -> String {
    let kind = match severity {
        "uncorrected_fatal" => "fatal",
        _ => "uncorrectable",
    };
    match ev.attributes.get("aer_type") {
        Some(t) => format!("{kind} PCIe error ({t}) at {}", ev.pci_address),
        None => format!("{kind} PCIe error at {}", ev.pci_address),
    }
}

/// A module (cable or transceiver) error.
pub(super) fn module(ev: &FaultEvent) -> String {
    let detail = ev
        .attributes
        .get("module_error")
        .or_else(|| ev.attributes.get("module_status"))
        .cloned()
        .unwrap_or_else(|| line(ev));
    format!("cable/transceiver module error: {detail}")
}

/// A NIC firmware health event.
pub(super) fn nic_health(ev: &FaultEvent) -> String {
    match ev.attributes.get("health_detail") {
        Some(d) => format!("NIC health event: {d}"),
        None => format!("NIC health event: {}", line(ev)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_short() {
        for (secs, want) in [
            (5, "5s"),
            (60, "1m"),
            (250, "4m 10s"),
            (3600, "1h"),
            (7500, "2h 5m"),
            (86_400, "1d"),
            (100_800, "1d 4h"),
        ] {
            assert_eq!(duration(Duration::from_secs(secs)), want);
        }
    }

    #[test]
    fn join_caps_and_counts_the_rest() {
        let items: Vec<String> = (0..100).map(|i| format!("mlx5_{i}/1 (ib{i})")).collect();
        let m = join_capped(&items, 100);
        assert!(m.len() < 130, "{m}");
        assert!(m.ends_with("more"), "{m}");
        assert_eq!(
            join_capped(&items[..2], 100),
            "mlx5_0/1 (ib0); mlx5_1/1 (ib1)"
        );
    }
}
