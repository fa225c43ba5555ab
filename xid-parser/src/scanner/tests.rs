//! Tests of the scanner: borrowed and one-step readings agree with the
//! general one, recycled events are indistinguishable.

use super::*;

/// Borrowed events (an XID line decided straight from its text) equal the owned
/// ones line for line: identity (UUID, serial attribute), channel, ECC type, a
/// context rule's attribute, XID 79, and the held/assembled events in between.
#[test]
fn borrowed_events_equal_owned_ones() {
    let lines = [
        "NVRM: GPU at PCI:0000:3b:00: GPU-6b1a2c3d-0000-1111-2222-333344445555",
        "NVRM: GPU Board Serial Number: 1653723052734",
        "NVRM: Xid (PCI:0000:3b:00): 31, pid=626486, name=pt_main_thread, Ch 00000008, intr 0",
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE (0x1)",
        "NVRM: Xid (PCI:0000:3b:00): 63, pid=1, name=x, ECC page retirement",
        "NVRM: Xid (PCI:0000:3b:00): 45, pid=2, name=y, Ch 00000010",
        "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception",
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=python, Ch 00000001",
        "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
        "NVRM: Xid (PCI:0000:3b:00): 94, pid=4142, name=python, Contained: SM (0x1)",
        "NVRM: Xid (PCI:...): 13, pid=1, name=x, edited",
        "mlx5_core 0000:1a:00.0 ens1f0np0: Link down",
        "mlx5_core 0000:5c:00.0: port_module:1103:(pid 0): Port module event[error]: module 0, Cable error, High Temperature",
    ];
    let policy = Arc::new(Policy::default());
    let (mut owner, mut viewer) = (Scanner::new(Arc::clone(&policy)), Scanner::new(policy));
    let (mut owned, mut viewed) = (Vec::new(), Vec::new());
    let mut contexts = 0;
    for (i, l) in lines.iter().enumerate() {
        let meta = RecordMeta {
            seq: Some(i as u64),
            monotonic_usec: Some(1_000_000 + 100 * i as u64),
            facility: Some(0),
            level: Some(3),
            ..Default::default()
        };
        owner.push(meta, l, &mut owned);
        viewer.push_view(meta, l, &mut |ev| {
            contexts += usize::from(ev.attr("context").is_some());
            viewed.push(ev.to_event());
        });
        assert_eq!(viewed, owned, "{l}");
    }
    owner.finish(&mut owned);
    viewer.finish_view(&mut |ev| viewed.push(ev.to_event()));
    assert_eq!(viewed, owned);
    assert!(contexts >= 2, "{contexts}");
    let with = |k: &str| {
        owned
            .iter()
            .filter(|e| e.attributes.contains_key(k))
            .count()
    };
    assert!(with("gpu_serial") >= 5 && with("channel") >= 3 && with("ecc_type") >= 1);
}

/// The stamps and messages the one-step reading of the kernel's XID line must
/// take or leave to the general path: the kernel's own widths and the shapes
/// next to them (wider seconds, caller ids, `host kernel:` tags, `dmesg -x`
/// prefixes, CRLF, NUL bytes, invalid UTF-8), and messages that hold events
/// back (GSP dumps, XIDs waiting for their other lines, fallen-off reports)
/// or end them (an AER summary, NIC lines).
const STAMPS: &[&str] = &[
    "[ 1234.567890] ",
    "[12345.678901] ",
    "[    5.000001] ",
    "[1234567.000001] ",
    "[ 1234.56789] ",
    "[ 1234.567890] [ T291] ",
    "[ 1234.567890]  ",
    "[ 1234.567890] gpu-node kernel: ",
    "kern  :err   : [ 1234.567890] ",
    "<3>[ 1234.567890] ",
    "[ 12a4.567890] ",
    "",
];
const MESSAGES: &[&str] = &[
    "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception",
    "NVRM: Xid (PCI:0000:86:00): 31, pid=626486, name=pt_main_thread, Ch 00000008, intr 0",
    "NVRM: Xid (PCI:0000:3b:00): 48, DBE (0x1)",
    "NVRM: Xid (PCI:0000:3b:00): 119, Timeout after 6s of waiting for RPC response",
    "NVRM: GPU at PCI:0000:3b:00: GPU-6b1a2c3d-0000-1111-2222-333344445555",
    "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: The NVIDIA GPU 0000:92:00.0",
    "NVRM: (PCI ID: 10de:2335) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
    "NVRM: Xid (PCI:0000:92:00): 79, pid=1, name=x, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:...): 13, pid=1, name=x, edited",
    "NVRM: Xid (PCI:0000:3b:00): -5, pid=1, name=x, negative",
    "NVRM: Xid (PCI:0000:3b:00) 13, no colon",
    "NVRM: Xid (garbage",
    "NVRM: Xid (PCI:0000:3b:00): 94, pid=4142, name=python, Contained: SM (0x1)\r",
    "NVRM: Xid (PCI:0000:3b:00): 43, pid=\u{0}1, name=x, Ch 00000008",
    "NVRM: Xid (PCI:0000:3b:00): 43, pid=1, name=caf\u{e9}, Ch 00000008",
    "NVRM: Xid(PCI:0000:3b:00): 43, no blank",
    "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x24:0x65:1426)",
    "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
    "mlx5_core 0000:1a:00.0 ens1f0np0: Link down",
    "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count",
];

/// Feeds `lines` the reader's way (the one-step path first, else the general
/// one) and the general way only; both scanners' events must be equal after
/// every line. Returns how many lines took the one-step path.
fn one_step_agrees(lines: &[Vec<u8>]) -> usize {
    let policy = Arc::new(Policy::default());
    let (mut fast, mut general) = (Scanner::new(Arc::clone(&policy)), Scanner::new(policy));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut taken = 0;
    for l in lines {
        let one_step = fast.push_kernel_xid_line(l, &mut |ev| a.push(ev.to_event()));
        if one_step {
            taken += 1;
        } else {
            let p = crate::parse_line(l);
            fast.push_view(p.meta(), &p.message, &mut |ev| a.push(ev.to_event()));
        }
        let p = crate::parse_line(l);
        general.push_view(p.meta(), &p.message, &mut |ev| b.push(ev.to_event()));
        assert_eq!(
            a,
            b,
            "{:?} (one step: {one_step})",
            String::from_utf8_lossy(l)
        );
    }
    fast.finish_view(&mut |ev| a.push(ev.to_event()));
    general.finish_view(&mut |ev| b.push(ev.to_event()));
    assert_eq!(a, b);
    taken
}

fn line(stamp: &str, message: &str, invalid_utf8: bool) -> Vec<u8> {
    let mut l = format!("{stamp}{message}").into_bytes();
    if invalid_utf8 {
        l.insert(l.len().min(40), 0xff);
    }
    l.push(b'\n');
    l
}

/// Every stamp with every message, in order (so that each message meets the
/// state the ones before left), valid and invalid UTF-8.
#[test]
fn kernel_xid_lines_in_one_step_are_the_general_reading() {
    let mut lines = Vec::new();
    for bad in [false, true] {
        for stamp in STAMPS {
            for message in MESSAGES {
                lines.push(line(stamp, message, bad));
            }
        }
    }
    let taken = one_step_agrees(&lines);
    // The kernel's widths of the XID lines not held back take the one step.
    assert!(taken >= 30, "{taken}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
    /// Any order of those lines: held events, preludes and waiting reports
    /// start and end anywhere.
    #[test]
    fn kernel_xid_lines_in_one_step_in_any_order(picks in proptest::collection::vec(
        (0..STAMPS.len(), 0..MESSAGES.len(), proptest::bool::weighted(0.05)),
        1..40,
    )) {
        let lines: Vec<Vec<u8>> = picks
            .iter()
            .map(|&(s, m, bad)| line(STAMPS[s], MESSAGES[m], bad))
            .collect();
        one_step_agrees(&lines);
    }
}

/// Events from a scanner whose reader recycles every event equal those of one
/// whose reader keeps them, line for line.
#[test]
fn recycled_events_are_indistinguishable() {
    let lines = [
        "NVRM: Xid (PCI:0000:86:00): 31, pid=626486, name=pt_main_thread, Ch 00000008, intr 0",
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception",
        "NVRM: Xid (PCI:0000:3b:00): 48, DBE (0x1)",
        "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
        "NVRM: Xid (PCI:...): 13, pid=1, name=x, edited",
        "NVRM: Xid (PCI:0000:3b:00): 94, pid=4142, name=python, Contained: SM (0x1)",
        "mlx5_core 0000:63:00.1: Port module event: module 1, Cable unplugged",
    ];
    let policy = Arc::new(Policy::default());
    let (mut keep, mut reuse) = (Scanner::new(Arc::clone(&policy)), Scanner::new(policy));
    let (mut kept, mut out) = (Vec::new(), Vec::new());
    for round in 0..3u64 {
        for (i, l) in lines.iter().enumerate() {
            let meta = RecordMeta {
                seq: Some(round * 10 + i as u64),
                monotonic_usec: Some(1_000_000 * (round * 10 + i as u64)),
                ..Default::default()
            };
            let before = kept.len();
            keep.push(meta, l, &mut kept);
            reuse.push(meta, l, &mut out);
            assert_eq!(out, kept[before..], "{l}");
            for ev in out.drain(..) {
                reuse.recycle(ev);
            }
        }
    }
    let before = kept.len();
    keep.finish(&mut kept);
    reuse.finish(&mut out);
    assert_eq!(out, kept[before..]);
    assert!(kept.len() > 15, "{}", kept.len());
}
