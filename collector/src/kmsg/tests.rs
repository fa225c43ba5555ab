//! Tests of the kernel log source.

use super::reader::{HOLD_WAIT, ReadOn, Reader};
use super::*;
use crate::liveness::{IDLE_HEARTBEAT, Liveness};
use crate::pipeline::{SendStatus, faults};
use crossbeam_channel::{Receiver, Sender, bounded};
use gpuwatch_core::msg::{Input, KmsgPosition, MonitorInput};
use gpuwatch_core::registry::Tally;
use gpuwatch_core::{Registry, Shutdown};
use gpuwatch_proto::{FaultEvent, FaultKind, Source};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xid_parser::Scanner;

fn args(path: &Path, accept_user: bool, registry: Arc<Registry>) -> KmsgSourceArgs {
    KmsgSourceArgs {
        cfg: KmsgSettings {
            path: path.to_path_buf(),
            accept_user_facility: accept_user,
            exit_at_eof: true,
            ..KmsgSettings::default()
        },
        resume: None,
        boot_id: "boot-1".into(),
        policy: Arc::new(xid_parser::Policy::default()),
        registry,
        liveness: Liveness::new(),
        stop_tx: None,
        spent: None,
    }
}

const XID_KERN: &str = "4,10,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";

#[test]
fn replay_file_turns_kern_records_into_events_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("replay.kmsg");
    let text = [
        "6,7,4000000,-;eth0: link up",
        " SUBSYSTEM=net",
        "this is not a kmsg record",
        XID_KERN,
        // Facility user (PRI 12 = 1*8+4): ignored without accept_user_facility.
        "12,11,5000100,-;NVRM: Xid (PCI:0000:5e:00): 79, pid=1, name=x, GPU has fallen off the bus.",
        // Gap: 12..=14 never arrived.
        "6,15,6000000,-;usb 1-1: new device",
        // Last line without a newline is complete at EOF.
        "4,16,7000000,-;NVRM: Xid (PCI:0000:86:00): 13, pid=9, name=app, Graphics SM Warp Exception",
    ]
    .join("\n");
    std::fs::write(&p, text).unwrap();
    let reg = Registry::new();
    let (tx, rx) = bounded(64);
    let a = args(&p, false, reg.clone());
    let liveness = a.liveness.clone();
    let summary = run_source(a, InputContext::new(Shutdown::new(), tx));
    assert!(!liveness.status(0).kmsg_alive, "cleared at exit");
    let inputs: Vec<Input> = rx.try_iter().collect();
    let caught_up = inputs
        .iter()
        .filter(|i| matches!(i, Input::KmsgCaughtUp))
        .count();
    assert_eq!(caught_up, 1, "the engine is told once: {inputs:?}");
    let evs: Vec<FaultEvent> = inputs
        .into_iter()
        .filter_map(|i| match i {
            Input::Fault { event, .. } => Some(event),
            _ => None,
        })
        .collect();
    let got: Vec<(String, u32)> = evs
        .iter()
        .map(|e| (e.pci_address.clone(), e.code))
        .collect();
    assert_eq!(
        got,
        vec![
            ("0000:3b:00.0".to_string(), 79),
            ("0000:86:00.0".to_string(), 13)
        ]
    );
    let ev = &evs[0];
    assert_eq!(ev.kind(), FaultKind::Xid);
    assert_eq!(ev.source(), Source::Kmsg);
    assert_eq!(ev.boot_id, "boot-1");
    assert_eq!(ev.kmsg_seq, Some(10));
    assert_eq!(ev.monotonic_usec, Some(5_000_000));
    let want = boot::wall_time_unix_nanos(boot::boot_time_unix_nanos(), 5_000_000);
    let got = ev.time_unix_nano.expect("wall time set");
    assert!(got.abs_diff(want) < 1_000_000_000, "{got} vs {want}");
    assert_eq!(summary.records, 5);
    assert_eq!(reg.tally(Tally::KmsgRead), 5);
    assert_eq!(reg.tally(Tally::KmsgMalformed), 1);
    // 8, 9 between 7 and 10; 12, 13, 14 between 11 and 15.
    assert_eq!(reg.tally(Tally::KmsgLost), 5);
}

#[test]
fn user_facility_raises_faults_only_when_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("replay.kmsg");
    std::fs::write(
        &p,
        "12,1,100,-;NVRM: Xid (PCI:0000:5e:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
    )
    .unwrap();
    for (accept, want) in [(false, 0), (true, 1)] {
        let (tx, rx) = bounded(8);
        run_source(
            args(&p, accept, Registry::new()),
            InputContext::new(Shutdown::new(), tx),
        );
        assert_eq!(faults(&rx).len(), want, "accept_user_facility={accept}");
    }
}

#[test]
fn fifo_is_read_until_the_writer_closes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("kmsg.fifo");
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (tx, rx) = bounded(64);
    let a = args(&p, false, Registry::new());
    let reader = std::thread::spawn(move || run_source(a, InputContext::new(Shutdown::new(), tx)));
    // Opening for write blocks until the reader has opened the FIFO.
    let mut w = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    use std::io::Write;
    for i in 0..100u32 {
        writeln!(w, "6,{i},{i},-;filler line {i}").unwrap();
    }
    writeln!(w, "{XID_KERN}").unwrap();
    drop(w);
    let summary = reader.join().unwrap();
    assert_eq!(summary.records, 101);
    assert_eq!(faults(&rx).len(), 1);
}

/// A followed regular file (no `exit_at_eof`) that ends in the middle of
/// a line: the part is kept until the rest is appended, not processed as
/// a record of its own (which cut the message and made the rest malformed).
#[test]
fn a_followed_file_ending_mid_line_waits_for_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("growing.kmsg");
    let (head, tail) = XID_KERN.split_at(XID_KERN.find("GPU has").unwrap());
    std::fs::write(&p, format!("6,9,4000000,-;eth0: link up\n{head}")).unwrap();
    let reg = Registry::new();
    let mut a = args(&p, false, reg.clone());
    a.cfg.exit_at_eof = false;
    let shutdown = Shutdown::new();
    let (tx, rx) = bounded(8);
    let ctx = InputContext::new(shutdown.clone(), tx);
    let h = std::thread::spawn(move || run_source(a, ctx));
    // Caught up = the reader hit the end of the file once.
    wait_caught_up(&rx);
    assert_eq!(reg.tally(Tally::KmsgRead), 1);
    let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    use std::io::Write;
    writeln!(f, "{tail}").unwrap();
    drop(f);
    let event = loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Input::Fault { event, .. }) => break event,
            Ok(_) => {}
            Err(e) => panic!("no fault event: {e}"),
        }
    };
    shutdown.trigger();
    h.join().unwrap();
    assert_eq!((event.code, event.kmsg_seq), (79, Some(10)));
    assert!(
        event.message.ends_with("GPU has fallen off the bus."),
        "{}",
        event.message
    );
    assert_eq!(reg.tally(Tally::KmsgRead), 2);
    assert_eq!(reg.tally(Tally::KmsgMalformed), 0);
}

#[test]
fn full_engine_channel_coalesces_instead_of_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("storm.kmsg");
    let mut text = String::new();
    for i in 0..50 {
        text.push_str(&format!(
            "4,{i},{},-;NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=app, MMU Fault: ENGINE GRAPHICS\n",
            i * 1000
        ));
    }
    std::fs::write(&p, text).unwrap();
    let reg = Registry::new();
    // Room for one event; nobody drains until the source ends.
    let (tx, rx) = bounded(1);
    let drain_rx = rx.clone();
    let handle = std::thread::spawn({
        let a = args(&p, false, reg.clone());
        move || run_source(a, InputContext::new(Shutdown::new(), tx))
    });
    // The source must finish by itself (it never blocks on the channel)
    // apart from the final bounded drain, which this receiver serves.
    let mut got = Vec::new();
    while let Ok(i) = drain_rx.recv_timeout(Duration::from_secs(10)) {
        got.push(i);
    }
    handle.join().unwrap();
    let total: u32 = got
        .iter()
        .filter_map(|i| match i {
            Input::Fault { event, .. } => Some(event.count.max(1)),
            _ => None,
        })
        .sum();
    assert_eq!(total, 50, "every occurrence accounted for");
    assert_eq!(
        reg.events(
            gpuwatch_core::Stage::Parser,
            gpuwatch_core::Outcome::Dropped
        ),
        0
    );
}

/// A reader that treats its input as the kernel device, without opening
/// anything: records are fed to `process`.
fn device_reader(tx: Sender<Input>, registry: Arc<Registry>) -> Reader {
    let a = args(Path::new("/nonexistent/kmsg"), true, registry);
    let mut r = Reader::new(a, InputContext::new(Shutdown::new(), tx));
    r.device = true;
    r.drain_timeout = Duration::from_millis(10);
    r
}

fn record(seq: u64, fault: bool) -> String {
    if fault {
        format!(
            "4,{seq},{},-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
            seq * 1000
        )
    } else {
        format!("6,{seq},{},-;usb 1-1: new device {seq}\n", seq * 1000)
    }
}

/// What reached the engine channel: `Some(seq)` per fault event (its
/// `kmsg_seq`), `None` per position report with its sequence number.
fn drained(rx: &Receiver<Input>) -> Vec<(char, u64)> {
    rx.try_iter()
        .filter_map(|i| match i {
            Input::Fault { event, .. } => Some(('F', event.kmsg_seq.unwrap_or(0))),
            Input::KmsgProgress(p) => Some(('P', p.last_seq)),
            _ => None,
        })
        .collect()
}

/// The fault event a reader makes of an XID 31 record, made new or, when
/// `spent` is given, from that event handed back by the engine; and whether
/// the reader took the spent event.
fn xid_event(spent: Option<FaultEvent>) -> (FaultEvent, bool) {
    let (tx, rx) = bounded(64);
    let mut r = device_reader(tx, Registry::new());
    if let Some(ev) = spent {
        let (back, spent_rx) = gpuwatch_core::msg::spent_events();
        back.send(ev).unwrap();
        r.spent = Some(spent_rx);
    }
    let xid31 = "4,1,1000,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=4194305, name=x, Ch 00000008, intr 00000000.\n";
    r.process(xid31.as_bytes(), None);
    r.process(record(2, false).as_bytes(), None);
    r.finish();
    let mut events = rx.try_iter().filter_map(|i| match i {
        Input::Fault { event, .. } => Some(event),
        _ => None,
    });
    let ev = events.next().expect("one event");
    assert!(events.next().is_none());
    let taken = r.spent.as_ref().is_some_and(|s| s.is_empty());
    (ev, taken)
}

/// An event the engine emitted and handed back is refilled from scratch:
/// nothing of the earlier fault (its GPU, pods, classification, attributes)
/// carries over to the next.
#[test]
fn an_event_made_from_a_spent_one_carries_nothing_over() {
    let mut stale = FaultEvent {
        code: 79,
        pci_address: "0000:86:00.0".into(),
        gpu_index: Some(3),
        gpu_uuid: "GPU-stale".into(),
        pid: Some(77),
        process: "stale".into(),
        message: "stale message".into(),
        kmsg_seq: Some(9),
        monotonic_usec: Some(9),
        time_unix_nano: Some(9),
        facility: Some(1),
        level: Some(0),
        policy_reason: "stale reason".into(),
        boot_id: "boot-stale".into(),
        count: 99,
        name: "stale name".into(),
        pods: vec![gpuwatch_proto::PodRef {
            name: "stale-pod".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    stale.attributes.insert("stale".into(), "1".into());
    stale.set_action(gpuwatch_proto::Action::RebootNode);
    stale.set_severity(gpuwatch_proto::Severity::Critical);
    stale.set_source(gpuwatch_proto::Source::NvmlEvent);
    let (mut new, _) = xid_event(None);
    let (mut refilled, taken) = xid_event(Some(stale));
    assert!(taken, "the reader took the spent event");
    // Each reader takes the boot's wall-clock time when it starts: the
    // record's time differs by the microseconds between the two.
    assert!(refilled.time_unix_nano.is_some());
    (new.time_unix_nano, refilled.time_unix_nano) = (None, None);
    assert_eq!(refilled, new);
    assert_eq!(new.code, 31);
}

/// The position travels in the channel after the events of the records
/// it covers, and only when nothing is held: the engine's state then
/// holds exactly the faults of the records up to it.
#[test]
fn position_follows_the_events_it_covers() {
    let (tx, rx) = bounded(64);
    let mut r = device_reader(tx, Registry::new());
    for seq in 1..=3 {
        r.process(record(seq, false).as_bytes(), None);
    }
    r.report_position().unwrap();
    assert_eq!(drained(&rx), vec![('P', 3)], "no fault: the position moves");
    for seq in 4..=8 {
        r.process(record(seq, seq == 5 || seq == 7).as_bytes(), None);
    }
    r.report_position().unwrap();
    assert_eq!(drained(&rx), vec![('F', 5), ('F', 7), ('P', 8)]);
    r.report_position().unwrap();
    assert_eq!(drained(&rx), vec![], "unchanged: not reported again");
}

/// A fault held for room in the engine channel keeps the position from
/// being reported until it is delivered.
#[test]
fn no_position_while_an_event_is_held_for_room() {
    let (tx, rx) = bounded(1);
    tx.send(Input::Tick).unwrap(); // the engine channel is full
    let mut r = device_reader(tx, Registry::new());
    for seq in 1..=5 {
        let rec = record(seq, seq == 3);
        assert!(matches!(r.process(rec.as_bytes(), None), ReadOn::Continue));
    }
    assert_eq!(r.sender.pending(), 1, "the fault of seq 3 is held");
    assert_eq!(r.exact_position(), None);
    assert!(matches!(rx.try_recv(), Ok(Input::Tick)));
    assert_eq!(r.sender.flush(), SendStatus::Accepted);
    assert_eq!(r.exact_position(), Some(5));
    r.report_position().unwrap();
    // Room for one at a time: the fault went with the flush, the
    // position waits for the next report.
    assert_eq!(drained(&rx), vec![('F', 3)]);
    r.report_position().unwrap();
    assert_eq!(drained(&rx), vec![('P', 5)]);
}

/// At shutdown the final position is reported only when every event was
/// delivered; otherwise the records are read again at the next start.
#[test]
fn finish_reports_the_position_only_after_delivering_everything() {
    let reg = Registry::new();
    let (tx, rx) = bounded(1);
    tx.send(Input::Tick).unwrap(); // full; nobody drains
    let mut r = device_reader(tx, reg.clone());
    for seq in 10..=14 {
        r.process(record(seq, seq == 12).as_bytes(), None);
    }
    r.finish();
    assert!(matches!(rx.try_recv(), Ok(Input::Tick)));
    assert_eq!(drained(&rx), vec![], "nothing delivered, no position");
    assert_eq!(
        reg.events(
            gpuwatch_core::Stage::Parser,
            gpuwatch_core::Outcome::Dropped
        ),
        1
    );

    let (tx, rx2) = bounded(8);
    let mut r = device_reader(tx, Registry::new());
    for seq in 10..=14 {
        r.process(record(seq, seq == 12).as_bytes(), None);
    }
    r.finish();
    assert_eq!(drained(&rx2), vec![('F', 12), ('P', 14)]);
}

#[test]
fn an_implausible_sequence_jump_is_not_counted_as_lost_records() {
    let reg = Registry::new();
    let (tx, _rx) = bounded(8);
    let mut r = device_reader(tx, reg.clone());
    r.process(record(1, false).as_bytes(), None);
    r.process(record(5, false).as_bytes(), None);
    assert_eq!(reg.tally(Tally::KmsgLost), 3);
    r.process(record(u64::MAX / 1000, false).as_bytes(), None);
    assert_eq!(reg.tally(Tally::KmsgLost), 3);
}

/// A replay (file or FIFO) has no position: nothing to resume after.
#[test]
fn a_replay_reports_no_position() {
    let (tx, rx) = bounded(8);
    let mut r = device_reader(tx, Registry::new());
    r.device = false;
    r.process(record(1, true).as_bytes(), None);
    r.report_position().unwrap();
    r.finish();
    assert_eq!(drained(&rx), vec![('F', 1)]);
}

/// The engine's position is where a device reader of the same boot
/// resumes; another boot's position is ignored.
#[test]
fn resumes_after_the_position_of_the_same_boot_only() {
    let mk = |boot: &str| {
        let (tx, _rx) = bounded::<Input>(8);
        let mut a = args(Path::new("/dev/kmsg"), true, Registry::new());
        a.resume = Some(KmsgPosition {
            boot_id: boot.into(),
            last_seq: 41,
        });
        Reader::new(a, InputContext::new(Shutdown::new(), tx)).last_seq
    };
    assert_eq!(mk("boot-1"), Some(41));
    assert_eq!(mk("another-boot"), None);
}

/// After a reopen the device starts at the oldest record again; records
/// already read must be skipped, not only those before the startup
/// position.
#[test]
fn reopen_after_a_read_error_skips_records_already_read() {
    let (tx, rx) = bounded(64);
    let mut r = device_reader(tx, Registry::new());
    for seq in 1..=3 {
        r.process(record(seq, seq == 2).as_bytes(), None);
    }
    // The reopened device replays the ring from its oldest record.
    for seq in 1..=4 {
        r.process(record(seq, seq == 2 || seq == 4).as_bytes(), None);
    }
    assert_eq!(r.summary.records, 4, "each record processed once");
    let seqs: Vec<Option<u64>> = faults(&rx).iter().map(|e| e.kmsg_seq).collect();
    assert_eq!(seqs, vec![Some(2), Some(4)]);
}

#[test]
fn a_marker_hidden_by_an_escape_still_reaches_the_scanner() {
    // `\x4e` is `N`, `\x58` is `X`: escaped, the record has no fault marker.
    let line = r"4,1,100,-;\x4eVRM: \x58id (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.";
    assert!(!Scanner::interesting(line.as_bytes()));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("escaped.kmsg");
    std::fs::write(&p, format!("{line}\n")).unwrap();
    let (tx, rx) = bounded(8);
    run_source(
        args(&p, false, Registry::new()),
        InputContext::new(Shutdown::new(), tx),
    );
    let evs = faults(&rx);
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].code, 79);
}

#[test]
fn unreadable_input_is_reported_until_it_can_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = args(&dir.path().join("missing"), false, Registry::new());
    a.cfg.retry_interval = Duration::from_secs(1);
    let shutdown = Shutdown::new();
    let (tx, rx) = bounded(8);
    let ctx = InputContext::new(shutdown.clone(), tx);
    let h = std::thread::spawn(move || run_source(a, ctx));
    let status = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a monitor status");
    assert!(
        matches!(&status, Input::MonitorStatus { input: MonitorInput::Kmsg, ok: false, message } if message.contains("missing")),
        "{status:?}"
    );

    // The input appears: it is reported readable, read, and caught up.
    let tmp = dir.path().join("tmp");
    std::fs::write(&tmp, format!("{XID_KERN}\n")).unwrap();
    std::fs::rename(&tmp, dir.path().join("missing")).unwrap();
    // Failures reported before the rename are dropped: what follows the
    // first "readable" is what the engine is told once the input is back.
    let (mut seen, mut readable) = (std::collections::BTreeSet::new(), false);
    while !(seen.contains("fault") && seen.contains("caught up")) {
        let Ok(i) = rx.recv_timeout(Duration::from_secs(10)) else {
            panic!("not read: {seen:?}");
        };
        match i {
            Input::MonitorStatus { ok: true, .. } => readable = true,
            Input::Fault { .. } if readable => _ = seen.insert("fault"),
            Input::KmsgCaughtUp if readable => _ = seen.insert("caught up"),
            other => assert!(!readable, "{other:?} after the input came back"),
        }
    }
    shutdown.trigger();
    h.join().unwrap();
    drop(rx);
}

/// Receives (at most 10 s) until the reader tells the engine it has read
/// its input to the end once; what it sent before is dropped.
fn wait_caught_up(rx: &Receiver<Input>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Input::KmsgCaughtUp) => return,
            Ok(_) => {}
            Err(e) => panic!("never caught up: {e}"),
        }
    }
}

/// Triggers `shutdown` and asserts the reader thread ends within 10 s:
/// well below its idle wait (30 s) and the retry wait below (a minute), and
/// far more than a loaded machine needs to wake it.
fn stops_at_once(shutdown: &Shutdown, h: std::thread::JoinHandle<KmsgSummary>) {
    // Let the reader settle into its wait.
    std::thread::sleep(Duration::from_millis(200));
    assert!(!h.is_finished(), "the reader ended by itself");
    shutdown.trigger();
    gpuwatch_core::join_by(h, Instant::now() + Duration::from_secs(10))
        .expect("the reader kept waiting after shutdown")
        .unwrap();
}

/// Idle at the end of a followed file (waiting for it to be written):
/// shutdown ends the wait at once, and the idle reader has kept its
/// liveness heartbeat.
#[test]
fn an_idle_reader_of_a_followed_file_stops_at_once_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("idle.kmsg");
    std::fs::write(&p, "6,1,100,-;eth0: link up\n").unwrap();
    let mut a = args(&p, false, Registry::new());
    a.cfg.exit_at_eof = false;
    let (liveness, shutdown) = (a.liveness.clone(), Shutdown::new());
    let (tx, rx) = bounded(8);
    let ctx = InputContext::new(shutdown.clone(), tx);
    let h = std::thread::spawn(move || run_source(a, ctx));
    wait_caught_up(&rx);
    stops_at_once(&shutdown, h);
    assert!(liveness.status(0).kmsg_heartbeat_unix_secs > 0);
}

/// Idle in `poll(2)` on an input with nothing to read (a FIFO with a
/// writer attached, polled like `/dev/kmsg`): shutdown wakes the poll.
#[test]
fn an_idle_reader_in_poll_stops_at_once_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("kmsg.fifo");
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut a = args(&p, false, Registry::new());
    a.cfg.exit_at_eof = false;
    let shutdown = Shutdown::new();
    let (tx, rx) = bounded(8);
    let ctx = InputContext::new(shutdown.clone(), tx);
    let h = std::thread::spawn(move || run_source(a, ctx));
    let mut w = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    use std::io::Write;
    writeln!(w, "6,1,100,-;eth0: link up").unwrap();
    wait_caught_up(&rx);
    stops_at_once(&shutdown, h);
    drop(w);
}

/// Waiting a minute to retry an input that cannot be opened: shutdown
/// ends the wait at once.
#[test]
fn a_reader_waiting_to_retry_stops_at_once_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = args(&dir.path().join("missing"), false, Registry::new());
    a.cfg.retry_interval = Duration::from_secs(60);
    let shutdown = Shutdown::new();
    let (tx, rx) = bounded(8);
    let ctx = InputContext::new(shutdown.clone(), tx);
    let h = std::thread::spawn(move || run_source(a, ctx));
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(10)),
        Ok(Input::MonitorStatus { ok: false, .. })
    ));
    stops_at_once(&shutdown, h);
}

/// A followed input is read as soon as it is written, file or FIFO
/// without a writer yet: the reader waits for the write (inotify), not
/// for a timer (it would wait 30 s for its heartbeat).
#[test]
fn a_followed_input_is_read_as_soon_as_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("followed.kmsg");
    std::fs::write(&file, "").unwrap();
    let fifo = dir.path().join("followed.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for p in [file, fifo] {
        let mut a = args(&p, false, Registry::new());
        a.cfg.exit_at_eof = false;
        let shutdown = Shutdown::new();
        let (tx, rx) = bounded(8);
        let ctx = InputContext::new(shutdown.clone(), tx);
        let h = std::thread::spawn(move || run_source(a, ctx));
        if p.ends_with("followed.kmsg") {
            wait_caught_up(&rx);
        }
        // Let the reader settle into its wait.
        std::thread::sleep(Duration::from_millis(200));
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        use std::io::Write;
        writeln!(f, "{XID_KERN}").unwrap();
        let t0 = Instant::now();
        let got = loop {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(Input::Fault { event, .. }) => break event.code,
                Ok(_) => {}
                Err(e) => panic!("{}: no fault event: {e}", p.display()),
            }
        };
        assert_eq!(got, 79);
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{}: read {:?} after the write",
            p.display(),
            t0.elapsed()
        );
        shutdown.trigger();
        h.join().unwrap();
        drop(f);
    }
}

/// Idle, the reader wakes only for its heartbeat, often enough that a
/// late wake-up never makes `/healthz` call it stuck; held events keep
/// the short waits.
#[test]
fn idle_waits_are_bounded_by_the_heartbeat() {
    use crate::liveness::PROGRESS_DEADLINE;
    assert!(IDLE_HEARTBEAT * 2 < PROGRESS_DEADLINE);
    let (tx, _rx) = bounded(1);
    let mut r = device_reader(tx, Registry::new());
    assert_eq!(r.idle_wait(), IDLE_HEARTBEAT);
    // A GSP RPC timeout is held for the history dump that follows it: its
    // window must expire on time.
    let line = "4,1,100,-;NVRM: Xid (PCI:0000:3b:00): 119, pid=1, name=x, Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).";
    let _ = r.process(line.as_bytes(), None);
    assert!(r.scanner.has_pending());
    assert_eq!(r.idle_wait(), HOLD_WAIT);
}

#[test]
fn config_validation_names_keys() {
    let bad = KmsgConfig {
        path: PathBuf::new(),
        cursor_interval_ms: 0,
        retry_interval_secs: 0,
        ..KmsgConfig::default()
    };
    let p = bad.resolve().unwrap_err();
    let keys: Vec<&str> = p.iter().map(|m| m.split(':').next().unwrap()).collect();
    assert_eq!(
        keys,
        ["path", "cursor_interval_ms", "retry_interval_secs"],
        "{p:?}"
    );
    let s = KmsgConfig::default().resolve().unwrap();
    assert_eq!(s, KmsgSettings::default());
    assert_eq!(s.cursor_interval, Duration::from_secs(1));
    assert_eq!(s.retry_interval, Duration::from_secs(5));
    assert_eq!(s.path, PathBuf::from(KMSG_PATH));
}
