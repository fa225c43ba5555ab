//! NVIDIA/Mellanox ConnectX (`mlx5_core`) NIC lines: port link changes, cable and
//! transceiver module events, the firmware health poller's reports, firmware
//! command timeouts, the PCIe slot power warning; and the kernel's transmit
//! watchdog (`NETDEV WATCHDOG`, any driver).
//!
//! Every `mlx5_core` line is printed by the driver for its PCI function, through
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
//! Other `mlx5_core` lines (firmware version, E-Switch, PCIe power reported
//! sufficient, command failures such as the `ACCESS_REG … err(-22)` answers a
//! restricted NIC gives to counter reads, and the PCIe AER detail lines the AER
//! driver prints under the device's driver name) are not NIC events here.
//!
//! The prefilter passes these lines by their own words (`Link up`, `Link down`,
//! `Port module`, `compromised`, `Fatal error`, `temperature` of the temperature
//! warning, `done completion`, `command resource`, `the PCIe slot`, `recovery
//! failed`, `PCI reads still`, `synd 0x`, `NETDEV WATCHDOG`), not by `mlx5_core`:
//! the driver's other lines are common at boot and would all be decoded for
//! nothing.

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
    /// A report of the firmware health poller or its recovery (drivers/net/
    /// ethernet/mellanox/mlx5/core/health.c). Fatal (the firmware stopped
    /// working): `device's health compromised - reached miss count` and `Fatal
    /// error 1 detected` (`poll_health`), the syndrome line of the health buffer
    /// dump that follows them, `synd 0x8: unrecoverable hardware error`
    /// (`print_health_info`), `health recovery failed` and `health recovery flow
    /// aborted, PCI reads still not working` (`mlx5_health_try_recover`,
    /// `mlx5_fw_fatal_reporter_err_work`). Not fatal: the firmware's temperature
    /// warning event (`temp_warn`, events.c): `High temperature on sensors with
    /// bit set 0 1`.
    Health {
        /// The report, without the `function:line:(pid N): ` prefix.
        detail: &'a str,
        /// The NIC's firmware is in its error state: a hardware fault.
        fatal: bool,
    },
    /// A firmware command that never completed (drivers/net/ethernet/mellanox/
    /// mlx5/core/cmd.c): `cmd[0]: ACCESS_REG(0x805) No done completion`
    /// (`wait_func_handle_exec_timeout`, older kernels `cmd_work_handler`) and
    /// `ACCESS_REG(0x805) timeout. Will cause a leak of a command resource`
    /// (`wait_func`). The firmware stopped answering: a hardware fault.
    CmdTimeout {
        /// The command as printed, name and opcode (`ACCESS_REG(0x805)`).
        command: &'a str,
        /// The line, without the `function:line:(pid N): ` prefix.
        detail: &'a str,
    },
    /// `Detected insufficient power on the PCIe slot (27W).` (`mlx5_pcie_event`,
    /// events.c): the slot advertises less power than the card needs; the
    /// firmware throttles or powers ports down.
    SlotPower {
        /// The slot power the firmware read, watts; `None` when not printed.
        watts: Option<u32>,
    },
    /// The kernel's transmit watchdog (`dev_watchdog`, net/sched/sch_generic.c):
    /// a transmit queue of the interface made no progress for the watchdog
    /// timeout and the driver's `ndo_tx_timeout` resets it. Since 6.9
    /// `netdev_crit()`: `mlx5_core 0000:0c:00.0 ens1f0np0: NETDEV WATCHDOG: CPU:
    /// 5: transmit queue 3 timed out 5120 ms`; before, a `WARN_ONCE`:
    /// `NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed out 5120
    /// ms` (without ` 5120 ms` before 5.17).
    TxTimeout {
        /// The network interface (`ens1f0np0`).
        netdev: &'a str,
        /// The driver as printed (`mlx5_core`); `None` when printed empty.
        driver: Option<&'a str>,
        /// The transmit queue.
        queue: u32,
        /// How long the queue was stuck, ms; `None` on kernels that do not print it.
        timeout_ms: Option<u32>,
    },
}

impl NicEvent<'_> {
    /// The `nic_event` attribute: `link_up`, `link_down`, `module`, `health`
    /// (firmware health reports and firmware command timeouts: the network
    /// monitor takes both as a hardware fault of the NIC's ports),
    /// `slot_power`, `tx_timeout`.
    pub fn as_str(&self) -> &'static str {
        match self {
            NicEvent::Link { up: true, .. } => "link_up",
            NicEvent::Link { up: false, .. } => "link_down",
            NicEvent::Module { .. } => "module",
            NicEvent::Health { .. } | NicEvent::CmdTimeout { .. } => "health",
            NicEvent::SlotPower { .. } => "slot_power",
            NicEvent::TxTimeout { .. } => "tx_timeout",
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
    if let Some(w) = find!(msg, "NETDEV WATCHDOG: ") {
        return parse_watchdog(&msg[..w], &msg[w + "NETDEV WATCHDOG: ".len()..]);
    }
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
        || body == "health recovery failed"
        || body == "health recovery flow aborted, PCI reads still not working"
        || is_syndrome(body)
    {
        NicEvent::Health {
            detail: body,
            fatal: true,
        }
    } else if body.starts_with("High temperature on sensors") {
        NicEvent::Health {
            detail: body,
            fatal: false,
        }
    } else if let Some(p) = body.strip_prefix("Detected insufficient power on the PCIe slot") {
        NicEvent::SlotPower {
            watts: slot_watts(p)?,
        }
    } else if let Some(command) = command_timed_out(body) {
        NicEvent::CmdTimeout {
            command,
            detail: body,
        }
    } else {
        return None;
    };
    Some(NicMsg { pci, event })
}

/// `synd 0x8: unrecoverable hardware error`: the syndrome line of
/// `print_health_info` (health.c), `synd 0x%x: %s` with a `hsynd_str` text.
fn is_syndrome(body: &str) -> bool {
    let Some(r) = body.strip_prefix("synd 0x") else {
        return false;
    };
    let Some((hex, text)) = r.split_once(": ") else {
        return false;
    };
    !hex.is_empty()
        && hex.len() <= 2
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && !text.trim().is_empty()
}

/// The text after `Detected insufficient power on the PCIe slot`: ` (27W).`
/// → `Some(Some(27))`; `.` or nothing → `Some(None)`; anything else → `None`.
fn slot_watts(p: &str) -> Option<Option<u32>> {
    let p = p.strip_suffix('.').unwrap_or(p);
    if p.is_empty() {
        return Some(None);
    }
    let (watts, rest) = leading_u32(p.strip_prefix(" (")?)?;
    (rest == "W)").then_some(Some(watts))
}

/// The command of a firmware command timeout line (cmd.c): `cmd[0]:
/// ACCESS_REG(0x805) No done completion` or `ACCESS_REG(0x805) timeout. Will
/// cause a leak of a command resource` → `ACCESS_REG(0x805)`. `None` for other
/// lines, the command failures (`… failed, status bad parameter(0x3), …`)
/// among them.
fn command_timed_out(body: &str) -> Option<&str> {
    let command = if let Some(head) = body.strip_suffix(" No done completion") {
        // `cmd[%d]: ` names the command slot (an entry without one prints -22).
        match head.strip_prefix("cmd[") {
            Some(r) => {
                let (slot, command) = r.split_once("]: ")?;
                let slot = slot.strip_prefix('-').unwrap_or(slot);
                if slot.is_empty() || !slot.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                command
            }
            None => head,
        }
    } else {
        body.strip_suffix(" timeout. Will cause a leak of a command resource")?
    };
    // `mlx5_command_str(op)` then `(0x%x)`: one word, the opcode in hex.
    let (name, op) = command.split_once("(0x")?;
    let op = op.strip_suffix(')')?;
    let named = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    (named && !op.is_empty() && op.bytes().all(|b| b.is_ascii_hexdigit())).then_some(command)
}

/// The transmit watchdog line, split at `NETDEV WATCHDOG: ` into what comes
/// before it (`head`) and after it (`rest`); see [`NicEvent::TxTimeout`].
fn parse_watchdog<'a>(head: &'a str, rest: &'a str) -> Option<NicMsg<'a>> {
    if let Some(r) = rest.strip_prefix("CPU: ") {
        // netdev_crit(): `<driver> <pci> <netdev>: ` before, `%d: ` after `CPU: `.
        let (_, r) = leading_u32(r)?;
        let (queue, timeout_ms) = transmit_queue(r.strip_prefix(": ")?)?;
        let mut words = head.trim_end().strip_suffix(':')?.split(' ');
        let driver = words.next().filter(|w| !w.is_empty())?;
        let pci = words.next().filter(|w| crate::pci::is_pci(w))?;
        let netdev = words
            .next()
            .filter(|w| !w.is_empty() && !w.starts_with('('))?;
        return Some(NicMsg {
            pci: Some(pci),
            event: NicEvent::TxTimeout {
                netdev,
                driver: Some(driver),
                queue,
                timeout_ms,
            },
        });
    }
    // WARN_ONCE(): `%s (%s): transmit queue %u timed out[ %u ms]`, name and driver.
    let (named, r) = rest.split_once("): ")?;
    let (netdev, driver) = named.split_once(" (")?;
    if netdev.is_empty() || netdev.contains(' ') || driver.contains(' ') {
        return None;
    }
    let (queue, timeout_ms) = transmit_queue(r)?;
    Some(NicMsg {
        pci: None,
        event: NicEvent::TxTimeout {
            netdev,
            driver: Some(driver).filter(|d| !d.is_empty()),
            queue,
            timeout_ms,
        },
    })
}

/// `transmit queue 3 timed out 5120 ms` → `(3, Some(5120))`; `transmit queue 3
/// timed out` → `(3, None)`.
fn transmit_queue(r: &str) -> Option<(u32, Option<u32>)> {
    let (queue, r) = leading_u32(r.strip_prefix("transmit queue ")?)?;
    let r = r.trim_end().strip_prefix(" timed out")?;
    if r.is_empty() {
        return Some((queue, None));
    }
    let (ms, r) = leading_u32(r.strip_prefix(' ')?)?;
    (r == " ms").then_some((queue, Some(ms)))
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
                    fatal: true,
                },
            ),
            // 4.x health.c printed it with dev_err(): no prefix.
            (
                "mlx5_core 0000:41:00.0: device's health compromised - reached miss count",
                Some("0000:41:00.0"),
                NicEvent::Health {
                    detail: "device's health compromised - reached miss count",
                    fatal: true,
                },
            ),
            // health.c `poll_health`: mlx5_core_err(dev, "Fatal error %u detected\n").
            (
                "mlx5_core 0000:41:00.0: poll_health:739:(pid 0): Fatal error 1 detected",
                Some("0000:41:00.0"),
                NicEvent::Health {
                    detail: "Fatal error 1 detected",
                    fatal: true,
                },
            ),
            // events.c `temp_warn`: mlx5_core_warn(events->dev, "High temperature on
            // sensors with bit set %llx %llx", …) (`%#llx` since 6.10).
            (
                "mlx5_core 0000:41:00.1: temp_warn:170:(pid 0): High temperature on sensors with bit set 0 1",
                Some("0000:41:00.1"),
                NicEvent::Health {
                    detail: "High temperature on sensors with bit set 0 1",
                    fatal: false,
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
            // Recovery steps that are no fault of their own (health.c).
            "mlx5_core 0000:41:00.0: mlx5_health_try_recover:336:(pid 1234): starting health recovery flow",
            "mlx5_core 0000:41:00.0: mlx5_health_try_recover:345:(pid 1234): health recovery succeeded",
            // The command failure a restricted NIC answers the agent's counter
            // reads with (cmd.c `mlx5_cmd_out_err`): not a timeout.
            "mlx5_core 0000:0c:00.0: mlx5_cmd_out_err:838:(pid 1234): ACCESS_REG(0x805) op_mod(0x1) failed, status bad parameter(0x3), syndrome (0x6e1a5d), err(-22)",
            // A late completion and a recovered timeout (cmd.c): the command finished.
            "mlx5_core 0000:56:00.0: mlx5_cmd_comp_handler:1709:(pid 0): Command completion arrived after timeout (entry idx = 0).",
            "mlx5_core 0000:56:00.0: wait_func_handle_exec_timeout:1120:(pid 5): cmd[0]: ACCESS_REG(0x805) recovered after timeout",
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

    fn fatal(detail: &str) -> NicEvent<'_> {
        NicEvent::Health {
            detail,
            fatal: true,
        }
    }

    /// The lines an NCCL hang over a NIC starts from: firmware command timeouts,
    /// the firmware's fatal health reports, the slot power warning and the
    /// transmit watchdog, each with the kernel code that prints it.
    #[test]
    fn nic_fault_line_shapes() {
        let pci = Some("0000:0c:00.0");
        let cases: &[(&str, Option<&str>, NicEvent<'_>)] = &[
            // cmd.c `wait_func_handle_exec_timeout`: mlx5_core_warn(dev, "cmd[%d]:
            // %s(0x%x) No done completion\n", …).
            (
                "mlx5_core 0000:0c:00.0: wait_func_handle_exec_timeout:1159:(pid 72061): cmd[0]: ACCESS_REG(0x805) No done completion",
                pci,
                NicEvent::CmdTimeout {
                    command: "ACCESS_REG(0x805)",
                    detail: "cmd[0]: ACCESS_REG(0x805) No done completion",
                },
            ),
            // The same text from `cmd_work_handler` of older kernels.
            (
                "mlx5_core 0000:0c:00.0: cmd_work_handler:877:(pid 1234): cmd[0]: ACCESS_REG(0x805) No done completion",
                pci,
                NicEvent::CmdTimeout {
                    command: "ACCESS_REG(0x805)",
                    detail: "cmd[0]: ACCESS_REG(0x805) No done completion",
                },
            ),
            // An entry that had no slot yet prints its index as -22.
            (
                "mlx5_core 0000:06:00.0: wait_func_handle_exec_timeout:1128:(pid 185911): cmd[-22]: CREATE_UCTX(0xa04) No done completion",
                Some("0000:06:00.0"),
                NicEvent::CmdTimeout {
                    command: "CREATE_UCTX(0xa04)",
                    detail: "cmd[-22]: CREATE_UCTX(0xa04) No done completion",
                },
            ),
            // cmd.c `wait_func`: mlx5_core_warn(dev, "%s(0x%x) timeout. Will cause
            // a leak of a command resource\n", …).
            (
                "mlx5_core 0000:0c:00.0: wait_func:1205:(pid 1234): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource",
                pci,
                NicEvent::CmdTimeout {
                    command: "ACCESS_REG(0x805)",
                    detail: "ACCESS_REG(0x805) timeout. Will cause a leak of a command resource",
                },
            ),
            // events.c `mlx5_pcie_event`: mlx5_core_warn_rl(dev, "Detected
            // insufficient power on the PCIe slot (%uW).\n", pci_power).
            (
                "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 5): Detected insufficient power on the PCIe slot (27W).",
                pci,
                NicEvent::SlotPower { watts: Some(27) },
            ),
            (
                "mlx5_core 0000:0c:00.0: Detected insufficient power on the PCIe slot.",
                pci,
                NicEvent::SlotPower { watts: None },
            ),
            // health.c `mlx5_health_try_recover` and `mlx5_fw_fatal_reporter_err_work`:
            // mlx5_core_err(dev, "health recovery failed\n").
            (
                "mlx5_core 0000:0c:00.0: mlx5_health_try_recover:351:(pid 1234): health recovery failed",
                pci,
                fatal("health recovery failed"),
            ),
            (
                "mlx5_core 0000:0c:00.0: mlx5_fw_fatal_reporter_err_work:679:(pid 1234): health recovery failed",
                pci,
                fatal("health recovery failed"),
            ),
            // health.c `mlx5_health_try_recover`: the PCI function never came back.
            (
                "mlx5_core 0000:0c:00.0: mlx5_health_try_recover:342:(pid 1234): health recovery flow aborted, PCI reads still not working",
                pci,
                fatal("health recovery flow aborted, PCI reads still not working"),
            ),
            // health.c `print_health_info`: "synd 0x%x: %s\n" with `hsynd_str`.
            (
                "mlx5_core 0000:41:00.0: print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error",
                Some("0000:41:00.0"),
                fatal("synd 0x8: unrecoverable hardware error"),
            ),
            (
                "mlx5_core 0000:61:00.0: print_health_info:520:(pid 0): synd 0x10: High temperature",
                Some("0000:61:00.0"),
                fatal("synd 0x10: High temperature"),
            ),
            // 4.x printed the dump with dev_err(): no prefix.
            (
                "mlx5_core 0000:41:00.0: synd 0x1: firmware internal error",
                Some("0000:41:00.0"),
                fatal("synd 0x1: firmware internal error"),
            ),
            // sch_generic.c `dev_watchdog` since 6.9: netdev_crit(dev, "NETDEV
            // WATCHDOG: CPU: %d: transmit queue %u timed out %u ms\n", …).
            (
                "mlx5_core 0000:0c:00.0 ens1f0np0: NETDEV WATCHDOG: CPU: 12: transmit queue 3 timed out 5120 ms",
                pci,
                NicEvent::TxTimeout {
                    netdev: "ens1f0np0",
                    driver: Some("mlx5_core"),
                    queue: 3,
                    timeout_ms: Some(5120),
                },
            ),
            // 5.17-6.8: WARN_ONCE(1, "NETDEV WATCHDOG: %s (%s): transmit queue %u
            // timed out %u ms\n", dev->name, netdev_drivername(dev), …).
            (
                "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed out 5120 ms",
                None,
                NicEvent::TxTimeout {
                    netdev: "ens1f0np0",
                    driver: Some("mlx5_core"),
                    queue: 3,
                    timeout_ms: Some(5120),
                },
            ),
            // Before 5.17: no duration.
            (
                "NETDEV WATCHDOG: ib0 (mlx5_core): transmit queue 12 timed out",
                None,
                NicEvent::TxTimeout {
                    netdev: "ib0",
                    driver: Some("mlx5_core"),
                    queue: 12,
                    timeout_ms: None,
                },
            ),
            // Any driver's interface; a driver name the kernel could not tell.
            (
                "NETDEV WATCHDOG: eth0 (): transmit queue 0 timed out 5000 ms",
                None,
                NicEvent::TxTimeout {
                    netdev: "eth0",
                    driver: None,
                    queue: 0,
                    timeout_ms: Some(5000),
                },
            ),
            (
                "ixgbe 0000:01:00.1 eno2: NETDEV WATCHDOG: CPU: 0: transmit queue 7 timed out 10240 ms\r",
                Some("0000:01:00.1"),
                NicEvent::TxTimeout {
                    netdev: "eno2",
                    driver: Some("ixgbe"),
                    queue: 7,
                    timeout_ms: Some(10240),
                },
            ),
        ];
        for (line, pci, event) in cases {
            assert_eq!(
                parse_nic(line),
                Some(NicMsg {
                    pci: *pci,
                    event: *event
                }),
                "{line}"
            );
        }
    }

    /// Lines close to the fault shapes that are not them, and the shapes cut
    /// short or garbled: no event, and no panic.
    #[test]
    fn near_misses_and_garbled_fault_lines_are_not_events() {
        for line in [
            "mlx5_core 0000:0c:00.0: cmd[0]: ACCESS_REG(0x805) No done",
            "mlx5_core 0000:0c:00.0: cmd[0]: ACCESS_REG(0x805) No done completion yet",
            "mlx5_core 0000:0c:00.0: cmd[x]: ACCESS_REG(0x805) No done completion",
            "mlx5_core 0000:0c:00.0: cmd[]: ACCESS_REG(0x805) No done completion",
            "mlx5_core 0000:0c:00.0: cmd[0: ACCESS_REG(0x805) No done completion",
            "mlx5_core 0000:0c:00.0: cmd[0]: ACCESS_REG No done completion",
            "mlx5_core 0000:0c:00.0: cmd[0]: ACCESS REG(0x805) No done completion",
            "mlx5_core 0000:0c:00.0: cmd[0]: ACCESS_REG(0xzz) No done completion",
            "mlx5_core 0000:0c:00.0: cmd[0]: (0x805) No done completion",
            "mlx5_core 0000:0c:00.0: No done completion",
            "mlx5_core 0000:0c:00.0: wait_func:1205:(pid 1234): ACCESS_REG(0x805) timeout. Will cause a leak",
            "mlx5_core 0000:0c:00.0: wait_func:1205:(pid 1234):  timeout. Will cause a leak of a command resource",
            "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 5): Detected insufficient power on the PCIe slot (27",
            "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 5): Detected insufficient power on the PCIe slot (W).",
            "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 5): Detected insufficient power on the PCIe slot (27W) twice.",
            "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 0): PCIe slot power capability was not advertised.",
            "mlx5_core 0000:0c:00.0: health recovery failed twice",
            "mlx5_core 0000:0c:00.0: health recovery flow aborted",
            "mlx5_core 0000:0c:00.0: synd 0x: unrecoverable hardware error",
            "mlx5_core 0000:0c:00.0: synd 0x8: ",
            "mlx5_core 0000:0c:00.0: synd 0x8 unrecoverable hardware error",
            "mlx5_core 0000:0c:00.0: synd 0x123: unrecoverable hardware error",
            "mlx5_core 0000:0c:00.0: ext_synd 0x8f1e",
            // Another driver's timeouts are no mlx5 command timeouts.
            "nvme nvme0: cmd[0]: ACCESS_REG(0x805) No done completion",
            "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed",
            "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue x timed out",
            "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed out soon",
            "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed out 5120",
            "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed out 5120 ms!",
            "NETDEV WATCHDOG: ens1f0np0: transmit queue 3 timed out 5120 ms",
            "NETDEV WATCHDOG:  (mlx5_core): transmit queue 3 timed out 5120 ms",
            "NETDEV WATCHDOG: ",
            "NETDEV WATCHDOG: CPU: 12: transmit queue 3 timed out 5120 ms",
            "mlx5_core 0000:0c:00.0 ens1f0np0: NETDEV WATCHDOG: CPU: x: transmit queue 3 timed out 5120 ms",
            "mlx5_core ens1f0np0: NETDEV WATCHDOG: CPU: 1: transmit queue 3 timed out 5120 ms",
            "mlx5_core 0000:0c:00.0: NETDEV WATCHDOG: CPU: 1: transmit queue 3 timed out 5120 ms",
            "mlx5_core 0000:0c:00.0 (unnamed net_device) (uninitialized): NETDEV WATCHDOG: CPU: 1: transmit queue 3 timed out 5120 ms",
        ] {
            assert_eq!(parse_nic(line), None, "{line}");
        }
        // Every cut of every shape: an event or none, never a panic.
        for line in [
            "mlx5_core 0000:0c:00.0: wait_func_handle_exec_timeout:1159:(pid 72061): cmd[0]: ACCESS_REG(0x805) No done completion",
            "mlx5_core 0000:0c:00.0: wait_func:1205:(pid 1234): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource",
            "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 5): Detected insufficient power on the PCIe slot (27W).",
            "mlx5_core 0000:0c:00.0: mlx5_health_try_recover:342:(pid 1234): health recovery flow aborted, PCI reads still not working",
            "mlx5_core 0000:41:00.0: print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error",
            "mlx5_core 0000:0c:00.0 ens1f0np0: NETDEV WATCHDOG: CPU: 12: transmit queue 3 timed out 5120 ms",
            "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed out 5120 ms",
        ] {
            for end in 0..=line.len() {
                let cut = &line[..end];
                let got = parse_nic(cut);
                if end == line.len() {
                    assert!(got.is_some(), "{cut}");
                }
                // Garbled: a byte replaced in the middle.
                let mut garbled = cut.as_bytes().to_vec();
                if let Some(b) = garbled.get_mut(end / 2) {
                    *b = b'\xff';
                }
                let garbled = String::from_utf8_lossy(&garbled);
                let _ = parse_nic(&garbled);
            }
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
