//! The memchr-speed prefilter: false for a message no parser accepts.

/// Prefilter: false ⇒ [`parse_message`] returns `None`. True when the message has one
/// of the markers of a message kind: `NVRM`/`NVLink`/`NVLINK` (also `nV…`), `Xid`/`SXid`,
/// `AER`, `nvidia-`/`nvidia:`/`nvidia ` (a driver's prefix: not `nvidia_modprobe` in
/// every AppArmor profile-load line), `nvlink`/`nvswitch`, `[Hardware Error]`, an AER detail `[` (after
/// four spaces or `device `), `PCIe Bus Error`, `Machine Check`/`Machine check`/
/// `machine check`, `temperature`, `mce:`, `EDAC `, the mlx5 NIC driver's
/// `Link up`/`Link down`, `Port module`, `compromised`, `Fatal error`, `done
/// completion`, `command resource`, `the PCIe slot`, `recovery failed`, `PCI reads
/// still`, `synd 0x`, and the transmit watchdog's `NETDEV WATCHDOG`.
///
/// One pass, no allocation: every marker contains one of a few byte pairs (`NV`, `nV`,
/// `nv`, `Xi`, `AE`, `NE`, `[H`, ` [`, `PC`, `Po`, `Ma`, `ma`, `Fa`, `fa`, `mp`, `mc`,
/// `ED`, `Li`, `yn`). Pairs are tested 16 positions at a time with plain comparisons
/// (which the compiler vectorises) into a bit mask; only the positions set in it are
/// checked for the full marker.
pub(crate) fn interesting(msg: &[u8]) -> bool {
    if msg.len() < 2 {
        return false;
    }
    let Some(last) = msg.len().checked_sub(W + 1) else {
        // Shorter than one chunk: zero-padded (no marker pair contains a NUL byte).
        let mut pad = [0u8; W + 1];
        pad[..msg.len()].copy_from_slice(msg);
        return chunk_has_marker(msg, 0, &pad, 0);
    };
    let mut i = 0;
    loop {
        // The last chunk overlaps the one before; `skip` masks the positions done.
        let (start, skip) = if i <= last { (i, 0) } else { (last, i - last) };
        let Some(c) = msg[start..].first_chunk::<{ W + 1 }>() else {
            return false;
        };
        if chunk_has_marker(msg, start, c, skip) {
            return true;
        }
        i += W;
        if start == last || i + 1 >= msg.len() {
            return false;
        }
    }
}

/// Positions tested per chunk by [`interesting`].
const W: usize = 16;

/// True when one of the pair positions `start + skip .. start + W` of `msg` (whose
/// bytes `c` holds, plus one) starts a marker.
#[inline(always)]
fn chunk_has_marker(msg: &[u8], start: usize, c: &[u8; W + 1], skip: usize) -> bool {
    // One byte per position, 1 where a pair starts: plain byte compares over
    // fixed-size arrays, which the compiler turns into 16-lane vector compares.
    let mut m = [0u8; W];
    for k in 0..W {
        m[k] = u8::from(marker_pair(c[k], c[k + 1]));
    }
    let mut hits = u128::from_le_bytes(m) >> (8 * skip);
    while hits != 0 {
        let k = skip + hits.trailing_zeros() as usize / 8;
        if marker_at(msg, start + k) {
            return true;
        }
        hits &= hits - 1;
    }
    false
}

/// True when `a b` is a byte pair that every occurrence of some marker contains
/// (a superset: `Nv` passes too; [`marker_at`] decides). Pairs that share a byte
/// are tested together (`Xi`/`Li`, `Ma`/`ma`/`Fa`/`fa`, `PC`/`Po`, `AE`/`NE`):
/// fewer vector operations per chunk.
#[inline(always)]
fn marker_pair(a: u8, b: u8) -> bool {
    ((a | 0x20 == b'n') & (b | 0x20 == b'v'))
        | ((b == b'i') & ((a == b'X') | (a == b'L')))
        | ((b == b'E') & ((a == b'A') | (a == b'N')))
        | ((a == b'y') & (b == b'n'))
        | ((a == b'[') & (b == b'H'))
        | ((a == b' ') & (b == b'['))
        | ((a == b'P') & ((b == b'C') | (b == b'o')))
        | ((b == b'a') & ((a | 0x20 == b'm') | (a | 0x20 == b'f')))
        | ((a == b'm') & ((b == b'p') | (b == b'c')))
        | ((a == b'E') & (b == b'D'))
}

/// Full marker check for the pair starting at `i` (see [`marker_pair`]).
#[inline(always)]
fn marker_at(msg: &[u8], i: usize) -> bool {
    let at = |i: usize, pat: &[u8]| msg.get(i..i + pat.len()) == Some(pat);
    // The pair's second byte anchors the markers whose pair starts one byte early.
    let j = if matches!(msg[i], b'N' | b'n' | b' ') {
        i + 1
    } else {
        i
    };
    match msg[j] {
        b'V' => {
            j > 0
                && matches!(msg[j - 1], b'N' | b'n')
                && (at(j + 1, b"RM") || at(j + 1, b"Link") || at(j + 1, b"LINK"))
        }
        b'X' => at(j + 1, b"id"),
        b'A' => at(j + 1, b"ER"),
        b'[' => {
            at(j, b"[Hardware Error]")
                || (j >= 4 && &msg[j - 4..j] == b"    ")
                || (j >= 7 && &msg[j - 7..j] == b"device ")
        }
        b'P' => {
            at(j, b"PCIe Bus Error")
                || at(j, b"Port module")
                || at(j, b"PCI reads still")
                || (j >= 4 && at(j - 4, b"the PCIe slot"))
        }
        b'M' => at(j, b"Machine Check") || at(j, b"Machine check"),
        b'v' => {
            j > 0
                && msg[j - 1] == b'n'
                && ((at(j + 1, b"idia") && matches!(msg.get(j + 5), Some(b'-' | b':' | b' ')))
                    || at(j + 1, b"link")
                    || at(j + 1, b"switch"))
        }
        b'm' => {
            at(j, b"mce:")
                || at(j, b"machine check")
                || (j >= 2 && (at(j - 2, b"temperature") || at(j - 2, b"compromised")))
                || (j >= 3 && at(j - 3, b"command resource"))
                || (j >= 7 && at(j - 7, b"done completion"))
        }
        b'E' => at(j, b"EDAC ") || (j >= 1 && at(j - 1, b"NETDEV WATCHDOG")),
        b'L' => at(j, b"Link up") || at(j, b"Link down"),
        b'F' => at(j, b"Fatal error"),
        b'f' => j >= 9 && at(j - 9, b"recovery failed"),
        b'y' => j >= 1 && at(j - 1, b"synd 0x"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefilter_rejects_ordinary_lines() {
        for l in [
            "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
            "EXT4-fs (sda1): mounted filesystem with ordered data mode",
            "systemd[1]: Started Journal Service.",
        ] {
            assert!(!interesting(l.as_bytes()), "{l}");
        }
    }

    /// The mlx5 fault lines and the transmit watchdog pass, whole lines
    /// included, and parse as NIC messages; the answer a restricted NIC gives
    /// the agent's counter reads does not pass.
    #[test]
    fn nic_fault_lines_pass() {
        for l in [
            "mlx5_core 0000:0c:00.0: cmd_work_handler:877:(pid 1234): cmd[0]: ACCESS_REG(0x805) No done completion",
            "mlx5_core 0000:0c:00.0: wait_func:1205:(pid 1234): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource",
            "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 5): Detected insufficient power on the PCIe slot (27W).",
            "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed out 5120 ms",
            "NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed out",
            "mlx5_core 0000:0c:00.0 ens1f0np0: NETDEV WATCHDOG: CPU: 12: transmit queue 3 timed out 5120 ms",
            "mlx5_core 0000:0c:00.0: mlx5_health_try_recover:351:(pid 1234): health recovery failed",
            "mlx5_core 0000:0c:00.0: mlx5_health_try_recover:342:(pid 1234): health recovery flow aborted, PCI reads still not working",
            "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count",
            "mlx5_core 0000:41:00.0: poll_health:739:(pid 0): Fatal error 1 detected",
            "mlx5_core 0000:41:00.0: print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error",
        ] {
            assert!(interesting(l.as_bytes()), "{l}");
            let line = format!("[ 1234.567890] {l}");
            assert!(crate::Scanner::interesting_line(line.as_bytes()), "{l}");
            assert!(
                matches!(crate::parse_message(l), Some(crate::Message::Nic(_))),
                "{l}"
            );
        }
        let refused = "mlx5_core 0000:0c:00.0: mlx5_cmd_out_err:838:(pid 1234): ACCESS_REG(0x805) op_mod(0x1) failed, status bad parameter(0x3), syndrome (0x6e1a5d), err(-22)";
        assert!(!interesting(refused.as_bytes()));
        assert_eq!(crate::parse_message(refused), None);
    }
}
