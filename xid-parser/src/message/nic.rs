//! NVIDIA/Mellanox ConnectX (`mlx5_core`) NIC lines: port link changes, cable and
//! transceiver module events, and the firmware health poller's reports.
//!
//! Every line is printed by the `mlx5_core` driver for its PCI function, through
//! one of the kernel's device printers:
//!
//! - `netdev_info()` (`__netdev_printk` in net/core/dev.c) for a network interface:
//!   `mlx5_core 0000:1a:00.0 ens1f0np0: Link up` — driver, PCI function, interface
//!   name (followed by ` (unregistering)` while the interface goes away), `: `.
//! - `mlx5_core_info()` (`dev_info()`): `mlx5_core 0000:1a:00.0: Port module event: …`.
//! - `mlx5_core_err()` / `mlx5_core_warn()` (drivers/net/ethernet/mellanox/mlx5/core/
//!   mlx5_core.h), which put `function:line:(pid N): ` first:
//!   `mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count`.
//!
//! Other `mlx5_core` lines (firmware version, E-Switch, PCIe power, command
//! failures, and the PCIe AER detail lines the AER driver prints under the
//! device's driver name) are not NIC events here.
//!
//! The prefilter passes these lines by their own words (`Link up`, `Link down`,
//! `Port module`, `compromised`, `Fatal error`, and `temperature` of the
//! temperature warning), not by `mlx5_core`: the driver's other lines are common
//! at boot and would all be decoded for nothing.

use super::text::leading_u32;

/// A NIC line of the `mlx5_core` driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicMsg<'a> {
    /// The NIC's PCI function as printed (`0000:1a:00.0`); `None` for a line
    /// printed (or saved) without it.
    pub pci: Option<&'a str>,
    /// What happened.
    pub event: NicEvent<'a>,
}

/// What a NIC line reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NicEvent<'a> {
    /// `ens1f0np0: Link up` / `Link down` (`mlx5e_update_carrier`,
    /// drivers/net/ethernet/mellanox/mlx5/core/en_main.c).
    Link {
        /// The network interface (`ens1f0np0`).
        netdev: &'a str,
        /// `Link up` (true) or `Link down`.
        up: bool,
    },
    /// `Port module event: module 0, Cable unplugged` and `Port module
    /// event[error]: module 0, Cable error, High Temperature` (`port_module`,
    /// drivers/net/ethernet/mellanox/mlx5/core/events.c).
    Module {
        /// The module (cage) number.
        module: u32,
        /// The status as the driver prints it (`Cable plugged`, …).
        status: &'a str,
        /// The error text after the status of an error event (`High Temperature`).
        error: Option<&'a str>,
    },
    /// A report of the firmware health poller (`poll_health`, drivers/net/
    /// ethernet/mellanox/mlx5/core/health.c): `device's health compromised -
    /// reached miss count`, `Fatal error 1 detected`; or the firmware's
    /// temperature warning event (`temp_warn`, events.c): `High temperature on
    /// sensors with bit set 0 1`. The recovery lines that follow a fatal error
    /// (`health recovery failed`, …) are not read: the report they follow is the
    /// event, and their words would be prefilter markers that many ordinary lines
    /// hold.
    Health {
        /// The report, without the `function:line:(pid N): ` prefix.
        detail: &'a str,
    },
}

impl NicEvent<'_> {
    /// The `nic_event` attribute: `link_up`, `link_down`, `module`, `health`.
    pub fn as_str(&self) -> &'static str {
        match self {
            NicEvent::Link { up: true, .. } => "link_up",
            NicEvent::Link { up: false, .. } => "link_down",
            NicEvent::Module { .. } => "module",
            NicEvent::Health { .. } => "health",
        }
    }
}

/// The `module_status` attribute for a port module event's status text: the
/// strings of `mlx5_pme_status_to_string` (older kernels: the `mlx5_pme_status`
/// table) → `plugged`, `unplugged`, `error`, `disabled`; anything else
/// (`Unknown status`) → `unknown`.
pub(crate) fn module_status(printed: &str) -> &'static str {
    match printed {
        "Cable plugged" => "plugged",
        "Cable unplugged" => "unplugged",
        "Cable error" => "error",
        "Cable disabled" => "disabled",
        _ => "unknown",
    }
}

/// Parses an `mlx5_core` line; `None` for any other line, and for the
/// driver's lines that are not NIC events.
pub(super) fn parse_nic(msg: &str) -> Option<NicMsg<'_>> {
    let i = find!(msg, "mlx5_core")?;
    // The driver name starts the message (or a word of it, in a line a parser
    // could not strip): not `foo_mlx5_core`.
    if i > 0 && !msg.as_bytes()[i - 1].is_ascii_whitespace() {
        return None;
    }
    let rest = &msg[i + "mlx5_core".len()..];
    let (pci, netdev, body) = if let Some(r) = rest.strip_prefix(' ') {
        // `mlx5_core <pci>: body` or `mlx5_core <pci> <netdev>: body`.
        let end = r.find(' ')?;
        let (word, after) = (&r[..end], &r[end + 1..]);
        let (pci, own_line) = match word.strip_suffix(':') {
            Some(pci) => (pci, true),
            None => (word, false),
        };
        if !crate::pci::is_pci(pci) || !pci.contains('.') {
            return None;
        }
        if own_line {
            (Some(pci), None, after)
        } else {
            let colon = after.find(": ")?;
            // `ens1f0np0 (unregistering)`: the name is the first word.
            let netdev = after[..colon].split(' ').next().unwrap_or("");
            (Some(pci), Some(netdev), &after[colon + 2..])
        }
    } else {
        // `mlx5_core: body` (a line printed or saved without the device).
        (None, None, rest.strip_prefix(": ")?)
    };
    let body = strip_function_prefix(body).trim_end();
    let event = if let Some(netdev) = netdev {
        let up = match body {
            "Link up" => true,
            "Link down" => false,
            _ => return None,
        };
        if netdev.is_empty() || netdev.starts_with('(') {
            // `(unnamed net_device)`: no interface to name.
            NicEvent::Link { netdev: "", up }
        } else {
            NicEvent::Link { netdev, up }
        }
    } else if let Some(m) = body.strip_prefix("Port module event") {
        parse_module(m)?
    } else if body.starts_with("device's health compromised")
        || (body.starts_with("Fatal error ") && body.ends_with(" detected"))
        || body.starts_with("High temperature on sensors")
    {
        NicEvent::Health { detail: body }
    } else {
        return None;
    };
    Some(NicMsg { pci, event })
}

/// `[error]: module 0, Cable error, High Temperature` / `: module 1, Cable
/// unplugged` (the text after `Port module event`).
fn parse_module(m: &str) -> Option<NicEvent<'_>> {
    // `[error]` on error events; any other tag in brackets is taken the same way.
    let m = match m.strip_prefix('[') {
        Some(t) => &t[t.find(']')? + 1..],
        None => m,
    };
    let m = m.strip_prefix(": module ")?;
    let (module, m) = leading_u32(m)?;
    let m = m.strip_prefix(", ")?;
    // No status text holds `, `: what follows the first one is the error.
    let (status, error) = match m.split_once(", ") {
        Some((s, e)) => (s, Some(e.trim()).filter(|e| !e.is_empty())),
        None => (m, None),
    };
    let status = status.trim();
    if status.is_empty() {
        return None;
    }
    Some(NicEvent::Module {
        module,
        status,
        error,
    })
}

/// `poll_health:852:(pid 0): text` → `text`: the prefix `mlx5_core_err()` and
/// `mlx5_core_warn()` print (function, line, pid). Text without one is returned
/// as it is.
fn strip_function_prefix(body: &str) -> &str {
    let b = body.as_bytes();
    let Some(colon) = b.iter().position(|&c| c == b':') else {
        return body;
    };
    let function = &b[..colon];
    if function.is_empty()
        || !function
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'_')
    {
        return body;
    }
    let Some((_, r)) = leading_u32(&body[colon + 1..]) else {
        return body;
    };
    let Some(r) = r.strip_prefix(":(pid ") else {
        return body;
    };
    let Some((_, r)) = leading_u32(r) else {
        return body;
    };
    r.strip_prefix("): ").unwrap_or(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(netdev: &str, up: bool) -> NicEvent<'_> {
        NicEvent::Link { netdev, up }
    }

    fn module<'a>(module: u32, status: &'a str, error: Option<&'a str>) -> NicEvent<'a> {
        NicEvent::Module {
            module,
            status,
            error,
        }
    }

    /// The line shapes, each with the kernel code that prints it.
    #[test]
    fn nic_line_shapes() {
        let cases: &[(&str, Option<&str>, NicEvent<'_>)] = &[
            // en_main.c `mlx5e_update_carrier`: netdev_info(priv->netdev, "Link up\n").
            (
                "mlx5_core 0000:1a:00.0 ens1f0np0: Link up",
                Some("0000:1a:00.0"),
                link("ens1f0np0", true),
            ),
            // The same, "Link down\n".
            (
                "mlx5_core 0000:1a:00.0 ens1f0np0: Link down",
                Some("0000:1a:00.0"),
                link("ens1f0np0", false),
            ),
            // `__netdev_printk` adds netdev_reg_state() after the name.
            (
                "mlx5_core 0000:1a:00.1 ens1f1np1 (unregistering): Link down",
                Some("0000:1a:00.1"),
                link("ens1f1np1", false),
            ),
            // netdev_name() of an interface not registered yet.
            (
                "mlx5_core 0000:1a:00.0 (unnamed net_device) (uninitialized): Link down",
                Some("0000:1a:00.0"),
                link("", false),
            ),
            // A trailing CR of a saved log.
            (
                "mlx5_core 0000:1A:00.0 enp1s0f0np0: Link up\r",
                Some("0000:1A:00.0"),
                link("enp1s0f0np0", true),
            ),
            // events.c `port_module`, mlx5_core_info(): "Port module event: module %u, %s\n".
            (
                "mlx5_core 0000:63:00.1: Port module event: module 1, Cable unplugged",
                Some("0000:63:00.1"),
                module(1, "Cable unplugged", None),
            ),
            (
                "mlx5_core 0000:63:00.1: Port module event: module 1, Cable plugged",
                Some("0000:63:00.1"),
                module(1, "Cable plugged", None),
            ),
            // events.c `port_module` since 5.x, mlx5_core_err(): "Port module
            // event[error]: module %u, %s, %s\n" behind `port_module:LINE:(pid N): `.
            (
                "mlx5_core 0000:5c:00.0: port_module:1103:(pid 0): Port module event[error]: module 0, Cable error, High Temperature",
                Some("0000:5c:00.0"),
                module(0, "Cable error", Some("High Temperature")),
            ),
            // 5.0-5.x events.c printed errors with mlx5_core_info(): no prefix.
            (
                "mlx5_core 0000:5c:00.0: Port module event[error]: module 0, Cable error, Bus stuck(I2C or data shorted)",
                Some("0000:5c:00.0"),
                module(0, "Cable error", Some("Bus stuck(I2C or data shorted)")),
            ),
            // 4.x port.c `mlx5_port_module_event`.
            (
                "mlx5_core 0000:5e:00.0: mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, Power budget exceeded",
                Some("0000:5e:00.0"),
                module(0, "Cable error", Some("Power budget exceeded")),
            ),
            // `mlx5_pme_error_to_string`'s longest text.
            (
                "mlx5_core 0000:5c:00.0: port_module:1103:(pid 0): Port module event[error]: module 3, Cable error, One or more network ports have been powered down due to insufficient/unadvertised power on the PCIe slot",
                Some("0000:5c:00.0"),
                module(
                    3,
                    "Cable error",
                    Some(
                        "One or more network ports have been powered down due to insufficient/unadvertised power on the PCIe slot",
                    ),
                ),
            ),
            (
                "mlx5_core 0000:5c:00.0: Port module event: module 2, Cable disabled",
                Some("0000:5c:00.0"),
                module(2, "Cable disabled", None),
            ),
            // A copy without the device.
            (
                "mlx5_core: Port module event[error]: module 0, Cable error, High Temperature",
                None,
                module(0, "Cable error", Some("High Temperature")),
            ),
            // health.c `poll_health`: mlx5_core_err(dev, "device's health compromised - reached miss count\n").
            (
                "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count",
                Some("0000:41:00.0"),
                NicEvent::Health {
                    detail: "device's health compromised - reached miss count",
                },
            ),
            // 4.x health.c printed it with dev_err(): no prefix.
            (
                "mlx5_core 0000:41:00.0: device's health compromised - reached miss count",
                Some("0000:41:00.0"),
                NicEvent::Health {
                    detail: "device's health compromised - reached miss count",
                },
            ),
            // health.c `poll_health`: mlx5_core_err(dev, "Fatal error %u detected\n").
            (
                "mlx5_core 0000:41:00.0: poll_health:739:(pid 0): Fatal error 1 detected",
                Some("0000:41:00.0"),
                NicEvent::Health {
                    detail: "Fatal error 1 detected",
                },
            ),
            // events.c `temp_warn`: mlx5_core_warn(events->dev, "High temperature on
            // sensors with bit set %llx %llx", …) (`%#llx` since 6.10).
            (
                "mlx5_core 0000:41:00.1: temp_warn:170:(pid 0): High temperature on sensors with bit set 0 1",
                Some("0000:41:00.1"),
                NicEvent::Health {
                    detail: "High temperature on sensors with bit set 0 1",
                },
            ),
        ];
        for (line, pci, event) in cases {
            let got = parse_nic(line);
            assert_eq!(
                got,
                Some(NicMsg {
                    pci: *pci,
                    event: *event
                }),
                "{line}"
            );
        }
    }

    /// Other `mlx5_core` lines, and lines of other drivers, are no NIC events.
    #[test]
    fn other_lines_are_not_nic_events() {
        for line in [
            "mlx5_core 0000:1a:00.0: firmware version: 28.39.1002",
            "mlx5_core 0000:1a:00.0: E-Switch: Total vports 10, per vport: max uc(128) max mc(2048)",
            "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 0): PCIe slot advertised sufficient power (75W).",
            "mlx5_core 0000:1a:00.0: Port module event[error]: module 0",
            "mlx5_core 0000:1a:00.0: Port module event: module x, Cable plugged",
            "mlx5_core 0000:1a:00.0: Port module event: module 0, ",
            "mlx5_core 0000:1a:00.0 ens1f0np0: renamed from eth0",
            "mlx5_core 0000:1a:00.0 ens1f0np0: Link up somewhere",
            "mlx5_core 0000:1a:00.0: Link down",
            "mlx5_core 0000:1a:00.0: poll_health:739:(pid 0): Fatal error",
            "mlx5_core 0000:41:00.0: print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error",
            "mlx5_core 0000:61:00.0: print_health_info:520:(pid 0): synd 0x10: High temperature",
            "mlx5_core 0000:41:00.0: mlx5_fw_fatal_reporter_err_work:679:(pid 1234): health recovery failed",
            "mlx5_core 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
            "mlx5_core 0000:3b:00.0: AER: aer_status: 0x00000001, aer_mask: 0x00000000",
            "mlx5_core ens1f0np0: Link down",
            "mlx5_core",
            "mlx5_core:",
            "xmlx5_core 0000:1a:00.0 ens1f0np0: Link down",
            "r8169 0000:06:00.0 eth0: link down",
            "mlx4_en: eth0: Link Down",
        ] {
            assert_eq!(parse_nic(line), None, "{line}");
        }
    }

    #[test]
    fn module_status_names() {
        for (printed, status) in [
            ("Cable plugged", "plugged"),
            ("Cable unplugged", "unplugged"),
            ("Cable error", "error"),
            ("Cable disabled", "disabled"),
            ("Unknown status", "unknown"),
        ] {
            assert_eq!(module_status(printed), status);
        }
    }

    #[test]
    fn function_prefix_is_stripped_only_when_whole() {
        for (body, want) in [
            ("poll_health:852:(pid 0): text", "text"),
            ("f:1:(pid 22): a: b", "a: b"),
            ("Port module event: module 0", "Port module event: module 0"),
            ("poll_health:852: text", "poll_health:852: text"),
            ("poll_health:x:(pid 0): text", "poll_health:x:(pid 0): text"),
            ("a b:1:(pid 0): text", "a b:1:(pid 0): text"),
            (":1:(pid 0): text", ":1:(pid 0): text"),
        ] {
            assert_eq!(strip_function_prefix(body), want, "{body}");
        }
    }
}
