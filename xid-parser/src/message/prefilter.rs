//! The memchr-speed prefilter: false for a message no parser accepts.

/// Prefilter: false ⇒ [`parse_message`] returns `None`. True when the message has one
/// of the markers of a message kind: `NVRM`/`NVLink`/`NVLINK` (also `nV…`), `Xid`/`SXid`,
/// `AER`, `nvidia-`/`nvidia:`/`nvidia ` (a driver's prefix: not `nvidia_modprobe` in
/// every AppArmor profile-load line), `nvlink`/`nvswitch`, `[Hardware Error]`, an AER detail `[` (after
/// four spaces or `device `), `PCIe Bus Error`, `Machine Check`/`Machine check`/
/// `machine check`, `temperature`, `mce:`, `EDAC `, and the mlx5 NIC driver's
/// `Link up`/`Link down`, `Port module`, `compromised`, `Fatal error`.
///
/// One pass, no allocation: every marker contains one of a few byte pairs (`NV`, `nV`,
/// `nv`, `Xi`, `AE`, `[H`, ` [`, `PC`, `Po`, `Ma`, `mp`, `mc`, `ma`, `ED`, `Li`,
/// `Fa`). Pairs are tested 16 positions at a time with plain comparisons (which the
/// compiler vectorises) into a bit mask; only the positions set in it are checked for
/// the full marker.
pub fn interesting(msg: &[u8]) -> bool {
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
/// are tested together (`Xi`/`Li`, `Ma`/`ma`/`Fa`, `PC`/`Po`): fewer vector
/// operations per chunk.
#[inline(always)]
fn marker_pair(a: u8, b: u8) -> bool {
    ((a | 0x20 == b'n') & (b | 0x20 == b'v'))
        | ((b == b'i') & ((a == b'X') | (a == b'L')))
        | ((a == b'A') & (b == b'E'))
        | ((a == b'[') & (b == b'H'))
        | ((a == b' ') & (b == b'['))
        | ((a == b'P') & ((b == b'C') | (b == b'o')))
        | ((b == b'a') & ((a | 0x20 == b'm') | (a == b'F')))
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
        b'P' => at(j, b"PCIe Bus Error") || at(j, b"Port module"),
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
        }
        b'E' => at(j, b"EDAC "),
        b'L' => at(j, b"Link up") || at(j, b"Link down"),
        b'F' => at(j, b"Fatal error"),
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
}
