//! The one-pass prefilter (`Scanner::interesting`) gives exactly the answer of the
//! original five-pass memchr prefilter (kept below as the reference), and the
//! whole-line check (`Scanner::interesting_line`) never rejects a line whose decoded
//! message passes the prefilter, in every saved-log format; the whole-buffer search
//! (`MarkerFinder`) finds a marker in exactly the lines `interesting_line` accepts.

use proptest::prelude::*;
use xid_parser::{MarkerFinder, Scanner, parse_line};

/// The original prefilter (three memchr passes for rare bytes, one for `v`, two
/// memmem searches), in behaviour; `nvidia` counts only as a driver prefix
/// (followed by `-`, `:` or a blank); plus the mlx5 NIC driver's markers.
fn reference(msg: &[u8]) -> bool {
    let at = |i: usize, pat: &[u8]| msg.get(i..i + pat.len()) == Some(pat);
    for i in memchr::memchr3_iter(b'V', b'X', b'A', msg) {
        let hit = match msg[i] {
            b'V' => {
                i > 0
                    && (msg[i - 1] == b'N' || msg[i - 1] == b'n')
                    && (at(i + 1, b"RM") || at(i + 1, b"Link") || at(i + 1, b"LINK"))
            }
            b'X' => at(i + 1, b"id"),
            _ => at(i + 1, b"ER"),
        };
        if hit {
            return true;
        }
    }
    for i in memchr::memchr3_iter(b'[', b'P', b'M', msg) {
        let hit = match msg[i] {
            b'[' => {
                at(i, b"[Hardware Error]")
                    || (i >= 4 && &msg[i - 4..i] == b"    ")
                    || (i >= 7 && &msg[i - 7..i] == b"device ")
            }
            b'P' => at(i, b"PCIe Bus Error"),
            _ => at(i, b"Machine Check") || at(i, b"Machine check"),
        };
        if hit {
            return true;
        }
    }
    for i in memchr::memchr_iter(b'v', msg) {
        if i > 0
            && msg[i - 1] == b'n'
            && ((at(i + 1, b"idia") && matches!(msg.get(i + 5), Some(b'-' | b':' | b' ')))
                || at(i + 1, b"link")
                || at(i + 1, b"switch"))
        {
            return true;
        }
    }
    memchr::memmem::find(msg, b"temperature").is_some()
        || memchr::memmem::find(msg, b"mce:").is_some()
        || memchr::memmem::find(msg, b"machine check").is_some()
        || memchr::memmem::find(msg, b"EDAC ").is_some()
        || [
            &b"Link up"[..],
            b"Link down",
            b"Port module",
            b"compromised",
            b"Fatal error",
            b"done completion",
            b"command resource",
            b"the PCIe slot",
            b"recovery failed",
            b"PCI reads still",
            b"synd 0x",
            b"NETDEV WATCHDOG",
        ]
        .iter()
        .any(|m| memchr::memmem::find(msg, m).is_some())
}

/// Markers, their near misses and their pieces, so random messages hit every
/// branch and every 16-byte chunk boundary.
const PIECES: &[&str] = &[
    "NVRM",
    "nVRM",
    "NVLink",
    "NVLINK",
    "nVLink",
    "NVRm",
    "NV",
    "VRM",
    "N",
    "n",
    "V",
    "Xid",
    "SXid",
    "Xi",
    "X",
    "id",
    "AER",
    "AE",
    "A",
    "ER",
    "[Hardware Error]",
    "[Hardware",
    "[H",
    "    [",
    "   [",
    "device [",
    "device",
    "[",
    " ",
    "PCIe Bus Error",
    "PCIe Bus",
    "PC",
    "Machine Check",
    "Machine check",
    "Machine",
    "Ma",
    "M",
    "nvidia",
    "nvidia-",
    "nvidia:",
    "nvidia ",
    "nvidia_",
    "nvlink",
    "nvswitch",
    "nvme",
    "nv",
    "v",
    "temperature",
    "temperatur",
    "emperature",
    "mce:",
    "mce",
    "machine check",
    "machine chec",
    "EDAC ",
    "EDAC",
    "ED",
    "Link up",
    "Link down",
    "Link Up",
    "Link",
    "Li",
    "Port module",
    "Port modul",
    "Port",
    "Po",
    "compromised",
    "ompromised",
    "comp",
    "Fatal error",
    "Fatal erro",
    "Fa",
    "done completion",
    "done complet",
    "No done",
    "command resource",
    "ommand resource",
    "command",
    "ma",
    "the PCIe slot",
    "he PCIe slot",
    "PCIe slot",
    "recovery failed",
    "ecovery failed",
    "failed",
    "fa",
    "f",
    "PCI reads still",
    "PCI reads",
    "synd 0x",
    "ynd 0x",
    "synd",
    "yn",
    "y",
    "NETDEV WATCHDOG",
    "ETDEV WATCHDOG",
    "NETDEV",
    "NE",
    "E",
    "L",
    "F",
    "mp",
    "mc",
    "m",
    "e",
    "usb 1-1: new device",
    "\u{e9}",
    "\\x0a",
    "#012",
];

fn message() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(PIECES).prop_map(|p| p.as_bytes().to_vec()),
            1 => "[ -~]{0,20}".prop_map(String::into_bytes),
            1 => prop::collection::vec(any::<u8>(), 0..4),
        ],
        0..12,
    )
    .prop_map(|parts| parts.concat())
}

fn prefix() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        (0u64..100_000, 0u64..1_000_000).prop_map(|(s, u)| format!("[{s:>5}.{u:06}] ")),
        Just("[  123.4][ T291] ".to_owned()),
        Just("<3>[    5.000001] ".to_owned()),
        Just("[Mon Mar  3 12:00:00 2025] ".to_owned()),
        Just("[  +0.000123] ".to_owned()),
        Just("Mar  3 12:00:00 node kernel: ".to_owned()),
        Just("Mar 03 12:00:00.123456 nvidia-node kernel: [ 12.5] ".to_owned()),
        Just("2025-03-03T12:00:00.5+00:00 node kernel: [ 12.5] ".to_owned()),
        Just("2025-03-03T12:00:00,123456+00:00 ".to_owned()),
        (0u64..1000).prop_map(|q| format!("3,{q},{q}000,-;")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn one_pass_prefilter_equals_the_reference(msg in message()) {
        prop_assert_eq!(Scanner::interesting(&msg), reference(&msg), "{:?}", String::from_utf8_lossy(&msg));
    }

    #[test]
    fn buffer_search_marks_exactly_the_interesting_lines(
        lines in prop::collection::vec((prefix(), message()), 1..8)
    ) {
        let finder = MarkerFinder::new();
        let mut buf = Vec::new();
        let mut want = Vec::new();
        for (pre, msg) in &lines {
            let start = buf.len();
            buf.extend_from_slice(pre.as_bytes());
            buf.extend(msg.iter().map(|&b| if b == b'\n' { b' ' } else { b }));
            want.push(Scanner::interesting_line(&buf[start..]));
            buf.push(b'\n');
        }
        // Lines holding a marker, found hit by hit from the buffer's start.
        let mut got = vec![false; lines.len()];
        let mut from = 0;
        while let Some(hit) = finder.find(&buf, from) {
            let line = buf[..hit].iter().filter(|&&b| b == b'\n').count();
            got[line] = true;
            from = hit + memchr::memchr(b'\n', &buf[hit..]).map_or(buf.len(), |i| i + 1);
        }
        prop_assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&buf));
    }

    #[test]
    fn whole_line_check_never_rejects_an_interesting_message(pre in prefix(), msg in message()) {
        let mut line = pre.into_bytes();
        line.extend_from_slice(&msg);
        let decoded = parse_line(&line);
        if Scanner::interesting(decoded.message.as_bytes()) {
            prop_assert!(
                Scanner::interesting_line(&line),
                "line {:?} rejected, message {:?}",
                String::from_utf8_lossy(&line),
                decoded.message
            );
        }
    }
}

#[test]
fn markers_across_chunk_boundaries() {
    for marker in [
        "NVRM:",
        "nvidia-",
        "nvidia:",
        "nvidia ",
        "Xid",
        "AER",
        "    [",
        "device [",
        "mce:",
        "temperature",
        "machine check",
        "EDAC ",
        "Link up",
        "Link down",
        "Port module",
        "compromised",
        "Fatal error",
        "done completion",
        "command resource",
        "the PCIe slot",
        "recovery failed",
        "PCI reads still",
        "synd 0x",
        "NETDEV WATCHDOG",
    ] {
        for pad in 0..40 {
            let msg = format!("{}{marker}{}", "x".repeat(pad), "y".repeat(pad % 7));
            assert!(Scanner::interesting(msg.as_bytes()), "{msg:?}");
            assert!(reference(msg.as_bytes()), "{msg:?}");
        }
    }
    for noise in [
        "usb 1-1.4: new high-speed USB device number 7 using xhci_hcd",
        "nvme0n1: p1 p2",
        "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 0): PCIe slot advertised sufficient power (75W).",
        "mlx5_core 0000:1a:00.0: firmware version: 28.39.1002",
        // The answer of a restricted NIC to the agent's own counter reads.
        "mlx5_core 0000:0c:00.0: mlx5_cmd_out_err:838:(pid 1234): ACCESS_REG(0x805) op_mod(0x1) failed, status bad parameter(0x3), syndrome (0x6e1a5d), err(-22)",
    ] {
        assert!(!Scanner::interesting(noise.as_bytes()), "{noise:?}");
        assert!(!Scanner::interesting_line(
            format!("[    1.000000] {noise}").as_bytes()
        ));
    }
}
