//! End-to-end tests against the REAL `/dev/kmsg`: records are written into
//! the kernel log (as root, `printk_devkmsg=on` while a test runs) and the
//! built `gpuwatch` binary must turn them into events on its stdout sink.
//!
//! Other processes write to the kernel log at the same time, so every test
//! tags its records with its own marker and a PCI domain of its own and
//! counts only those. Tests touching `/dev/kmsg` are serialised by
//! `common::DevKmsg`.

use crate::common;
use crate::common::{DevKmsg, TestAgent, pci_domain, ring, seq_of, wait_until, xid_line};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

fn write_batch(k: &DevKmsg, marker: &str, domain: u16, buses: std::ops::Range<u8>) -> Vec<String> {
    let lines: Vec<String> = buses.map(|b| xid_line(marker, domain, b)).collect();
    for l in &lines {
        k.write(l);
    }
    lines
}

/// Occurrences of `{marker}-{bus}` per bus among the agent's events.
fn counts(agent: &TestAgent, marker: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for ev in agent.events(marker) {
        let msg = ev["message"].as_str().unwrap_or_default();
        let tag = msg
            .split([',', ' '])
            .find(|w| w.contains(marker))
            .map(|w| w.trim_start_matches("name=").to_string())
            .unwrap_or_default();
        *m.entry(tag).or_insert(0) += 1;
    }
    m
}

#[test]
fn xid_written_to_dev_kmsg_becomes_a_classified_event() {
    let k = DevKmsg::acquire();
    let marker = common::marker("basic");
    let dom = pci_domain(&marker);
    let state = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(state.path(), &["--accept-user-facility"]);
    k.write(&xid_line(&marker, dom, 0x3b));
    assert!(
        agent.wait_events(&marker, 1, T),
        "{:#?}",
        agent.stderr.get()
    );
    let ev = &agent.events(&marker)[0];
    assert_eq!(ev["kind"], "xid");
    assert_eq!(ev["code"], 79);
    assert_eq!(ev["source"], "kmsg");
    assert_eq!(ev["pci_address"], format!("{dom:04x}:3b:00.0"));
    assert_eq!(ev["facility"], 1, "userspace writes are facility user");
    assert!(ev["kmsg_seq"].as_u64().is_some());
    assert!(ev["time_unix_nano"].as_u64().unwrap() > 1_600_000_000_000_000_000);
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(ev["boot_id"], boot_id.trim());

    // The local API answers while running.
    let addr = agent.api_addr().expect("API address logged");
    let (code, body) = common::http_get(&addr, "/healthz").unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(wait_until(T, || common::http_get(&addr, "/readyz")
        .map(|r| r.0)
        == Some(200)));
    let (code, body) = common::http_get(&addr, "/v1/health").unwrap();
    assert_eq!(code, 200);
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["node_name"], "e2e-node");

    let (status, _, _) = agent.stop();
    assert_eq!(status, Some(0), "clean exit on SIGTERM");
    drop(k);
}

#[test]
fn user_facility_records_are_ignored_unless_enabled() {
    let k = DevKmsg::acquire();
    let marker = common::marker("facility");
    let dom = pci_domain(&marker);
    let state = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(state.path(), &[]);
    let line = xid_line(&marker, dom, 1);
    k.write(&line);
    let seq = seq_of(&marker).expect("record is in the ring");
    // The cursor passing the record proves the agent read (and skipped) it.
    assert!(
        wait_until(T, || agent.cursor_seq().is_some_and(|s| s >= seq)),
        "cursor never passed seq {seq}: {:?}",
        agent.cursor_seq()
    );
    assert!(
        agent.events(&marker).is_empty(),
        "user-facility record raised a fault"
    );
    let (status, _, _) = agent.stop();
    assert_eq!(status, Some(0));
}

/// `gpuwatch scan --format text` of `input` (plus `extra` flags): its stdout.
fn scan_text(input: &str, extra: &[&str]) -> String {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args(["scan", "--format", "text"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start gpuwatch scan");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write scan input");
    let out = child.wait_with_output().expect("gpuwatch scan");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the README tells a user who wrote user-facility records into the
/// kernel log (the demo with `--kmsg`, these tests): `dmesg -x` and `dmesg -S
/// -r` keep the facility (`dmesg -r` from `/dev/kmsg` does not before
/// util-linux 2.39.4, and plain `dmesg` never does), and `gpuwatch scan` of
/// their output skips the record. The record is read back by its marker, so
/// whatever else the ring holds does not matter.
#[test]
fn dmesg_x_and_syslog_raw_keep_the_facility_and_scan_skips_the_record() {
    let k = DevKmsg::acquire();
    let marker = common::marker("readback");
    let line = xid_line(&marker, pci_domain(&marker), 0x5e);
    // `<4>` written from userspace: facility user, level warning (PRI 12).
    k.write(&line);
    for (args, facility) in [(&["-x"][..], "user  :warn  : ["), (&["-S", "-r"], "<12>[")] {
        let out = Command::new("dmesg")
            .args(args)
            .output()
            .expect("run dmesg (util-linux)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "dmesg {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours: Vec<&str> = text.lines().filter(|l| l.contains(&marker)).collect();
        assert_eq!(ours.len(), 1, "dmesg {args:?}: {ours:#?}");
        assert!(
            ours[0].starts_with(facility) && ours[0].ends_with(&line),
            "dmesg {args:?} does not show the user facility: {}",
            ours[0]
        );
        let input = format!("{}\n", ours[0]);
        let skipped = scan_text(&input, &[]);
        assert!(
            skipped.contains("1 non-kernel lines skipped")
                && skipped.contains("No GPU faults found."),
            "dmesg {args:?} | gpuwatch scan:\n{skipped}"
        );
        // The same line is a fault once user-facility lines are accepted: it
        // was skipped for its facility, not because it did not parse.
        let accepted = scan_text(&input, &["--accept-user-facility"]);
        assert!(
            accepted.contains("reboot_node") && accepted.contains(&marker),
            "dmesg {args:?} | gpuwatch scan --accept-user-facility:\n{accepted}"
        );
    }
}

/// The `count` of the active fault on `pci` in a `/v1/health` answer.
fn active_count(body: &str, pci: &str) -> Option<u64> {
    let health: serde_json::Value = serde_json::from_str(body).ok()?;
    health["gpus"]
        .as_array()?
        .iter()
        .filter(|g| g["pci_address"] == pci)
        .flat_map(|g| g["active_faults"].as_array().cloned().unwrap_or_default())
        .find_map(|f| f["count"].as_u64())
}

/// `GET /v1/health` from `addr` until `pred` holds for its body; the body.
fn wait_health(addr: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let mut body = String::new();
    assert!(
        wait_until(T, || {
            body = common::http_get(addr, "/v1/health")
                .map(|r| r.1)
                .unwrap_or_default();
            pred(&body)
        }),
        "the health never showed {what}: {body}"
    );
    body
}

/// The sequence number of the newest record in the ring naming `marker`.
fn newest_seq(marker: &str) -> u64 {
    ring()
        .into_iter()
        .filter(|(_, m)| m.contains(marker))
        .map(|(seq, _)| seq)
        .max()
        .expect("the records are in the ring")
}

/// The resume test's event counts per tag before and after the `kill -9`:
/// buses 0 to 14 raised once in all, the repeated fault (bus 0xee) raised
/// before the kill and not again after it, nothing replayed.
fn assert_each_raised_once(
    marker: &str,
    before: &BTreeMap<String, usize>,
    after: &BTreeMap<String, usize>,
) {
    let mut total = before.clone();
    for (k, v) in after {
        *total.entry(k.clone()).or_insert(0) += v;
    }
    let tag = |b: u8| format!("{marker}-{b}");
    for bus in 0..15u8 {
        assert_eq!(total.get(&tag(bus)), Some(&1), "{}: {total:?}", tag(bus));
    }
    assert_eq!(before.get(&tag(0xee)), Some(&1), "{before:?}");
    assert_eq!(after.get(&tag(0xee)), None, "not re-raised: {after:?}");
    assert_eq!(before.len(), 6, "{before:?}");
    assert_eq!(after.len(), 10, "nothing replayed: {after:?}");
}

/// Every record is processed exactly once across a `kill -9` that lands
/// right after the engine persisted the events, including repeats of one
/// active fault (its count equals the records written).
#[test]
fn resume_after_kill_9_processes_every_record_exactly_once() {
    let k = DevKmsg::acquire();
    let marker = common::marker("resume");
    let dom = pci_domain(&marker);
    let repeat_pci = format!("{dom:04x}:ee:00.0");
    let state = tempfile::tempdir().unwrap();
    let conf = crash_config(state.path());
    let conf = conf.to_str().unwrap();
    let args = ["--accept-user-facility", "--config", conf];
    let repeat = |n: usize| {
        for _ in 0..n {
            k.write(&xid_line(&marker, dom, 0xee));
        }
    };

    let a = TestAgent::start(state.path(), &args);
    write_batch(&k, &marker, dom, 0..5);
    repeat(3);
    assert!(a.wait_events(&marker, 6, T), "{:#?}", a.stderr.get());
    let health = state.path().join("health.json");
    let last_pci = format!("{dom:04x}:04:00.0");
    assert!(
        wait_until(T, || std::fs::read_to_string(&health).is_ok_and(|h| {
            h.contains(&last_pci) && h.contains(&repeat_pci)
        })),
        "events never persisted"
    );
    // The position is written with the faults (one state file).
    let last = seq_of(&format!("{marker}-238")).max(seq_of(&format!("{marker}-4")));
    let last = last.unwrap();
    // Until the position is saved past them, a restart reads these records
    // again (the state stays exact; stdout would repeat them).
    assert!(
        wait_until(T, || a.cursor_seq().is_some_and(|s| s >= last)),
        "position never saved past seq {last}: {:?}",
        a.cursor_seq()
    );
    let before = counts(&a, &marker);
    a.kill9();

    // Written while the agent is down: must be read after the restart.
    write_batch(&k, &marker, dom, 5..10);
    repeat(2);
    let b = TestAgent::start(state.path(), &args);
    write_batch(&k, &marker, dom, 10..15);
    repeat(1);
    assert!(b.wait_events(&marker, 10, T), "{:#?}", b.stderr.get());
    let addr = b.api_addr().expect("API address logged");
    wait_health(&addr, "the repeats counted", |body| {
        active_count(body, &repeat_pci).is_some_and(|c| c >= 6)
    });
    // Every record is read and the position saved past the newest: a
    // duplicate would have been counted by then.
    let newest = newest_seq(&marker);
    assert!(
        wait_until(T, || b.cursor_seq().is_some_and(|s| s >= newest)),
        "position never saved past seq {newest}: {:?}",
        b.cursor_seq()
    );
    let after = counts(&b, &marker);
    let body = common::http_get(&addr, "/v1/health").unwrap().1;
    assert_eq!(
        active_count(&body, &repeat_pci),
        Some(6),
        "each repeat counted once: {body}"
    );
    assert_each_raised_once(&marker, &before, &after);
    let (status, _, _) = b.stop();
    assert_eq!(status, Some(0));
}

#[test]
fn new_boot_replays_the_whole_ring() {
    let k = DevKmsg::acquire();
    let marker = common::marker("newboot");
    let dom = pci_domain(&marker);
    let dir = tempfile::tempdir().unwrap();
    let boot_file = dir.path().join("boot_id");
    std::fs::write(&boot_file, format!("{marker}-boot-a\n")).unwrap();
    let boot_arg = boot_file.to_str().unwrap().to_string();
    let state_a = dir.path().join("state-a");
    // This test's own records, by their kernel text: the boot id carries the
    // marker too, so a bare marker would also match every replayed record of
    // whatever else the ring holds.
    let mine = format!("name={marker}-");

    let a = TestAgent::start(
        &state_a,
        &["--accept-user-facility", "--boot-id-path", &boot_arg],
    );
    write_batch(&k, &marker, dom, 0..3);
    assert!(a.wait_events(&mine, 3, T));
    assert_eq!(a.events(&mine)[0]["boot_id"], format!("{marker}-boot-a"));
    let (status, _, _) = a.stop();
    assert_eq!(status, Some(0));
    let state = std::fs::read_to_string(state_a.join("health.json")).unwrap();
    let saved: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert_eq!(
        saved["kmsg"]["boot_id"],
        format!("{marker}-boot-a"),
        "{state}"
    );

    // The same state (position included), and the boot id changed: the ring
    // is read from its oldest record (the faults recur in the new boot and
    // are published again).
    let state_b = dir.path().join("state-b");
    std::fs::create_dir_all(&state_b).unwrap();
    std::fs::write(state_b.join("health.json"), &state).unwrap();
    std::fs::write(&boot_file, format!("{marker}-boot-b\n")).unwrap();
    let b = TestAgent::start(
        &state_b,
        &["--accept-user-facility", "--boot-id-path", &boot_arg],
    );
    assert!(b.wait_events(&mine, 3, T), "{:#?}", b.stderr.get());
    assert!(
        b.events(&mine)
            .iter()
            .all(|e| e["boot_id"] == format!("{marker}-boot-b"))
    );
    let (status, _, b_log) = b.stop();
    assert_eq!(status, Some(0));
    let b_log = b_log.get();

    // Control: a state whose position is of this boot → nothing replayed.
    let state_c = dir.path().join("state-c");
    std::fs::create_dir_all(&state_c).unwrap();
    std::fs::copy(state_b.join("health.json"), state_c.join("health.json")).unwrap();
    let c = TestAgent::start(
        &state_c,
        &["--accept-user-facility", "--boot-id-path", &boot_arg],
    );
    k.write(&xid_line(&marker, dom, 9));
    assert!(c.wait_events(&format!("{marker}-9"), 1, T));
    // The state b wrote is usable whatever else the ring held.
    assert!(
        c.stderr.matching("unusable").is_empty(),
        "{:#?}",
        c.stderr.get()
    );
    assert_eq!(
        c.events(&mine).len(),
        1,
        "only the new record: {:#?}\nb: {b_log:#?}",
        c.events(&mine)
    );
    drop(c);
}

#[test]
fn ring_overrun_is_counted_as_lost_and_reading_continues() {
    let k = DevKmsg::acquire();
    let marker = common::marker("overrun");
    let dom = pci_domain(&marker);
    let state = tempfile::tempdir().unwrap();
    let a = TestAgent::start(state.path(), &["--accept-user-facility", "--prometheus"]);
    k.write(&xid_line(&marker, dom, 0));
    assert!(a.wait_events(&marker, 1, T));

    a.signal(nix::sys::signal::Signal::SIGSTOP);
    k.write(&xid_line(&marker, dom, 1));
    let lost_seq = seq_of(&format!("{marker}-1")).unwrap();
    // Write filler until the stopped reader's next record is gone from the
    // ring (adaptive: only as much as this kernel's ring size needs).
    let filler = format!("gpuwatch e2e overrun filler {marker} {}", "x".repeat(160));
    let mut written = 0usize;
    while common::ring().first().is_some_and(|(s, _)| *s <= lost_seq) {
        assert!(written < 200_000, "ring never wrapped");
        k.write_many(std::iter::repeat_n(filler.as_str(), 256));
        written += 256;
    }
    k.write(&xid_line(&marker, dom, 2));
    a.signal(nix::sys::signal::Signal::SIGCONT);

    assert!(
        a.wait_events(&format!("{marker}-2"), 1, T),
        "{:#?}",
        a.stderr.get()
    );
    assert!(
        a.events(&format!("{marker}-1")).is_empty(),
        "overwritten record cannot be seen"
    );
    let lost: u64 = a
        .logs("Kernel log records were lost.")
        .iter()
        .filter_map(|l| l["lost"].as_u64())
        .sum();
    assert!(lost >= 1, "lost records counted: {:#?}", a.stderr.get());
    // The same count is exported on /metrics.
    let addr = a.api_addr().expect("API address logged");
    let (code, body) = common::http_get(&addr, "/metrics").unwrap();
    assert_eq!(code, 200, "{body}");
    let exported: f64 = body
        .lines()
        .find(|l| l.starts_with("gpuwatch_kmsg_records_lost_total"))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no lost counter in {body}"));
    assert!(exported >= lost as f64, "{exported} < {lost}");
    let (status, _, _) = a.stop();
    assert_eq!(status, Some(0));
}

/// A fault must survive a `kill -9` that lands right after
/// the agent reported it: either the engine's `health.json` holds it or the
/// kmsg cursor is still before its record (read again). Before the fix the
/// cursor could be saved past a record whose fault was in neither file.
#[test]
fn a_fault_reported_just_before_kill_9_is_known_after_the_restart() {
    let k = DevKmsg::acquire();
    let marker = common::marker("kill9");
    let dom = pci_domain(&marker);
    let pci = format!("{dom:04x}:3b:00.0");
    let state = tempfile::tempdir().unwrap();
    let a = TestAgent::start(state.path(), &["--accept-user-facility"]);
    let addr = a.api_addr().expect("API address logged");
    assert!(wait_until(T, || common::http_get(&addr, "/readyz")
        .map(|r| r.0)
        == Some(200)));
    k.write(&xid_line(&marker, dom, 0x3b));
    let seq = seq_of(&marker).expect("record is in the ring");
    assert!(a.wait_events(&marker, 1, T), "{:#?}", a.stderr.get());
    a.kill9();

    let b = TestAgent::start(state.path(), &["--accept-user-facility"]);
    let addr = b.api_addr().expect("API address logged");
    let mut body = String::new();
    assert!(
        wait_until(T, || {
            body = common::http_get(&addr, "/v1/health")
                .map(|r| r.1)
                .unwrap_or_default();
            body.contains(&pci)
        }),
        "fault on {pci} (seq {seq}) lost after kill -9: {body}\n{:#?}",
        b.stderr.get()
    );
    let (status, _, _) = b.stop();
    assert_eq!(status, Some(0));
    drop(k);
}

/// `dir/gpuwatch.toml` for the crash tests: the state persisted every
/// 100 ms and the kmsg position every 10 ms, so kills land during writes.
fn crash_config(dir: &std::path::Path) -> std::path::PathBuf {
    let conf = dir.join("gpuwatch.toml");
    std::fs::write(
        &conf,
        "[engine]\npersist_interval_ms = 100\n[kmsg]\ncursor_interval_ms = 10\n",
    )
    .unwrap();
    conf
}

/// A xorshift64 generator seeded from the clock, and its seed (printed: a
/// failure names it). `next(n)` is below `n`.
fn clock_seeded_rng() -> (u64, impl FnMut(u64) -> u64) {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("crash test seed {seed}");
    let mut rng = seed | 1;
    let next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    (seed, next)
}

/// `gpuwatch run` on `state` with `conf`, output discarded: no reader
/// threads for a process killed moments later.
fn spawn_unread(state: &std::path::Path, conf: &std::path::Path) -> std::process::Child {
    use std::process::{Command, Stdio};
    Command::new(env!("CARGO_BIN_EXE_gpuwatch"))
        .args([
            "run",
            "--sink",
            "stdout",
            "--no-nvml",
            "--log-format",
            "json",
        ])
        .args(["--api-listen", "127.0.0.1:0", "--node-name", "e2e-node"])
        .arg("--state-dir")
        .arg(state)
        .args(["--accept-user-facility", "--config"])
        .arg(conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start gpuwatch")
}

/// Record `i` of the crash test: an XID 13 of pid `i` on GPU `i % gpus`
/// (buses 0x20 on) of domain `dom`.
fn crash_line(marker: &str, dom: u16, gpus: usize, i: usize) -> String {
    let bus = 0x20 + (i % gpus) as u8;
    format!(
        "NVRM: Xid (PCI:{dom:04x}:{bus:02x}:00): 13, pid={i}, name={marker}, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Misaligned Address"
    )
}

/// The state file `health`, if a killed agent left one, parses and has the
/// current version.
fn assert_state_readable(health: &std::path::Path, kill: usize) {
    if let Ok(text) = std::fs::read_to_string(health) {
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("state unreadable after kill {kill}: {e}\n{text}"));
        assert_eq!(v["version"], 2);
    }
}

/// The fault counts per GPU of PCI domain `dom` in the state file `health`.
fn fault_counts(health: &std::path::Path, dom: u16) -> BTreeMap<String, u64> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(health).unwrap()).unwrap();
    let mut per_gpu = BTreeMap::new();
    for g in v["gpus"].as_array().unwrap() {
        let pci = g["pci_address"].as_str().unwrap_or_default();
        if !pci.starts_with(&format!("{dom:04x}:")) {
            continue;
        }
        let n: u64 = g["faults"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["count"].as_u64().unwrap())
            .sum();
        per_gpu.insert(pci.to_string(), n);
    }
    per_gpu
}

/// Crash exactness: fault records written while the agent is `kill -9`'d at
/// 50 random moments (some during a state write: it persists every 100 ms)
/// and restarted on the same state directory. The state is readable after
/// every kill, and at the end the fault counts equal the records written
/// exactly: nothing counted twice, nothing skipped.
#[test]
fn kill_9_at_random_moments_neither_loses_nor_double_counts() {
    const RECORDS: usize = 300;
    const GPUS: usize = 3;
    const KILLS: usize = 50;
    let k = DevKmsg::acquire();
    let marker = common::marker("crash");
    let dom = pci_domain(&marker);
    let state = tempfile::tempdir().unwrap();
    let conf = crash_config(state.path());
    let (seed, mut next) = clock_seeded_rng();
    let line = |i: usize| crash_line(&marker, dom, GPUS, i);
    let health = state.path().join("health.json");
    let mut written = 0usize;
    for kill in 0..KILLS {
        let mut child = spawn_unread(state.path(), &conf);
        // A few records while it runs, then the kill at a random moment.
        let batch = (RECORDS - written).min(RECORDS / KILLS + next(4) as usize);
        let wait_ms = next(400);
        let split = next(wait_ms + 1);
        std::thread::sleep(Duration::from_millis(split));
        for _ in 0..batch {
            k.write(&line(written));
            written += 1;
        }
        std::thread::sleep(Duration::from_millis(wait_ms - split));
        let _ = child.kill();
        let _ = child.wait();
        assert_state_readable(&health, kill);
    }
    while written < RECORDS {
        k.write(&line(written));
        written += 1;
    }
    // A last run reads what is left, then stops cleanly.
    let a = TestAgent::start(
        state.path(),
        &["--accept-user-facility", "--config", conf.to_str().unwrap()],
    );
    let last =
        seq_of(&format!("pid={}, name={marker}", RECORDS - 1)).expect("last record in the ring");
    assert!(
        wait_until(T, || a.cursor_seq().is_some_and(|s| s >= last)),
        "the last record never reached the state"
    );
    let (status, _, _) = a.stop();
    assert_eq!(status, Some(0));
    let per_gpu = fault_counts(&health, dom);
    let expected = (RECORDS / GPUS) as u64;
    assert_eq!(per_gpu.len(), GPUS, "{per_gpu:?}");
    for (pci, n) in &per_gpu {
        assert_eq!(
            *n, expected,
            "{pci}: counted {n} of {expected} (seed {seed}): {per_gpu:?}"
        );
    }
}

/// A `sleep` child: a live process whose pid the attribution tests name.
/// Killed and reaped when dropped, also when an assertion fails first.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn spawn() -> Sleeper {
        Sleeper(Command::new("sleep").arg("60").spawn().unwrap())
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// The cgroup path `/proc/<pid>/cgroup` gives `pid`: the unified (v2) entry,
/// else the first hierarchy's path under cgroup v1.
fn cgroup_of(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .or_else(|| text.lines().next().and_then(|l| l.splitn(3, ':').nth(2)))
        .unwrap()
        .trim()
        .to_owned()
}

/// Puts `pid` under the proc root `root` as a process in a pod: its real
/// `stat` (the start time the agent checks against pid reuse) and `cgroup`
/// as the given cgroup file.
fn fake_proc_entry(root: &std::path::Path, pid: u32, cgroup: &str) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(format!("/proc/{pid}/stat"), dir.join("stat")).unwrap();
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
}

/// The cgroup file of a containerd container under kubelet's systemd cgroup
/// driver (cgroup v2): the pod UID with `_` for `-` in the slice name.
fn systemd_containerd_cgroup(uid: &str, cid: &str) -> String {
    format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{cid}.scope\n",
        uid.replace('-', "_")
    )
}

/// The cgroup file of a container under kubelet's cgroupfs driver, cgroup v1
/// layout: one line per hierarchy.
fn cgroupfs_v1_cgroup(uid: &str, cid: &str) -> String {
    format!(
        "12:memory:/kubepods/besteffort/pod{uid}/{cid}\n11:cpu,cpuacct:/kubepods/besteffort/pod{uid}/{cid}\n1:name=systemd:/kubepods/besteffort/pod{uid}/{cid}\n"
    )
}

/// XID 13 as the driver prints it, for `pid` with process name
/// `{marker}-{tag}`. One GPU (`bus`) per line: repeats of one fault on one
/// GPU are coalesced.
fn xid13_of(marker: &str, dom: u16, pid: u32, tag: &str, bus: u8) -> String {
    format!(
        "NVRM: Xid (PCI:{dom:04x}:{bus:02x}:00): 13, pid={pid}, name={marker}-{tag}, Graphics Exception"
    )
}

/// XID 31 (an MMU fault in the process's context) with the driver's fault text.
fn xid31_of(marker: &str, dom: u16, pid: u32, tag: &str, bus: u8) -> String {
    format!(
        "NVRM: Xid (PCI:{dom:04x}:{bus:02x}:00): 31, pid={pid}, name={marker}-{tag}, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_a0000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
    )
}

/// Waits until the agent printed an event for every `{marker}-{tag}` process.
fn wait_tagged_events(agent: &TestAgent, marker: &str, tags: &[&str]) {
    assert!(
        wait_until(T, || {
            let evs = agent.events(marker);
            tags.iter().all(|t| {
                evs.iter()
                    .any(|e| e["process"].as_str().is_some_and(|p| p.ends_with(t)))
            })
        }),
        "no event for each of {tags:?}: {:#?}",
        agent.stderr.get()
    );
}

/// A line naming a pid is attributed from `<proc_root>/<pid>/cgroup` when it
/// is read from the real `/dev/kmsg`: a live process outside any pod (this
/// suite's `sleep`) is said to be so, with its cgroup; a pid whose process
/// is gone says that.
#[test]
fn a_faulting_pid_outside_any_pod_or_gone_is_said_not_to_be_in_one() {
    let k = DevKmsg::acquire();
    let marker = common::marker("nopod");
    let dom = pci_domain(&marker);
    let sleeper = Sleeper::spawn();
    let live = sleeper.pid();
    let mut done = Command::new("true").spawn().unwrap();
    let gone = done.id();
    done.wait().unwrap();
    let state = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(state.path(), &["--accept-user-facility"]);
    k.write(&xid13_of(&marker, dom, live, "live", 0x3b));
    k.write(&xid13_of(&marker, dom, gone, "gone", 0x3c));
    assert!(
        agent.wait_events(&marker, 2, T),
        "{:#?}",
        agent.stderr.get()
    );
    let ev = by_tag_in(&agent, &marker, "live");
    assert_eq!(ev["attributes"]["pod_attribution"], "not_in_pod", "{ev}");
    assert_eq!(ev["attributes"]["process.cgroup"], cgroup_of(live).as_str());
    assert!(ev["attributes"].get("k8s.pod.uid").is_none());
    let ev = by_tag_in(&agent, &marker, "gone");
    // `pid_reused` only if the system handed the pid out again in between.
    assert!(
        matches!(
            ev["attributes"]["pod_attribution"].as_str(),
            Some("process_exited" | "pid_reused")
        ),
        "{ev}"
    );
    agent.stop();
    drop(k);
}

/// Under a proc root whose cgroup file is kubelet's (systemd driver,
/// containerd), the event of a pid from the real `/dev/kmsg` carries the pod
/// UID and container id; with no pod listing it says the pod is known by UID
/// only.
#[test]
fn a_faulting_pid_in_a_kubelet_cgroup_is_attributed_to_its_pod_uid_and_container() {
    let k = DevKmsg::acquire();
    let marker = common::marker("poduid");
    let dom = pci_domain(&marker);
    let sleeper = Sleeper::spawn();
    let uid = "1f2e3d4c-5b6a-4789-8abc-def012345678";
    let cid = "4f1c0e8b6a2d9c7e5b3a1f0e9d8c7b6a5f4e3d2c1b0a99887766554433221100";
    let fake = tempfile::tempdir().unwrap();
    fake_proc_entry(
        fake.path(),
        sleeper.pid(),
        &systemd_containerd_cgroup(uid, cid),
    );
    let state = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(
        state.path(),
        &[
            "--accept-user-facility",
            "--proc-root",
            fake.path().to_str().unwrap(),
        ],
    );
    k.write(&xid13_of(&marker, dom, sleeper.pid(), "pod", 0x3d));
    wait_tagged_events(&agent, &marker, &["pod"]);
    let ev = by_tag_in(&agent, &marker, "pod");
    assert_eq!(ev["pods"][0]["uid"], uid, "{ev}");
    assert_eq!(ev["pods"][0]["container_id"], cid);
    assert_eq!(ev["pods"][0]["role"], "caused");
    // No pod listing in this run: the pod is known by UID only, and says so.
    assert!(
        ev["attributes"]["pod_placement"]
            .as_str()
            .is_some_and(|n| n.contains("pod UID only")),
        "{ev}"
    );
    agent.stop();
    drop(k);
}

/// A pod on the double's node `e2e-node` with one running container.
fn listed_pod(
    name: &str,
    ns: &str,
    uid: &str,
    container: &str,
    id: &str,
) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"nodeName": "e2e-node", "containers": [{"name": container}]},
        "status": {"containerStatuses": [{"name": container, "containerID": format!("containerd://{id}"), "image": "i", "imageID": "", "ready": true, "restartCount": 0}]},
    }))
    .unwrap()
}

/// What the attribution test expects of one faulting process: its process
/// tag and the pod it runs in.
struct InPod {
    tag: &'static str,
    uid: &'static str,
    name: &'static str,
    namespace: &'static str,
    container: &'static str,
}

/// The event of `want.tag` names its pod's UID, name, namespace and container.
fn assert_event_names_pod(agent: &TestAgent, marker: &str, want: &InPod) {
    let ev = by_tag_in(agent, marker, want.tag);
    let p = &ev["pods"][0];
    assert_eq!(
        (&p["uid"], &p["name"], &p["namespace"], &p["container"]),
        (
            &serde_json::json!(want.uid),
            &serde_json::json!(want.name),
            &serde_json::json!(want.namespace),
            &serde_json::json!(want.container)
        ),
        "{ev}"
    );
}

/// The OTLP log record of `{marker}-{tag}`'s fault, if the collector has it.
fn otlp_record(
    r: &gpuwatch_test_support::telemetry::Received,
    marker: &str,
    tag: &str,
) -> Option<gpuwatch_test_support::telemetry::Log> {
    r.logs
        .iter()
        .find(|l| {
            l.attrs
                .get("process.executable.name")
                .is_some_and(|p| p.contains(&format!("{marker}-{tag}")))
        })
        .cloned()
}

/// The OTLP log record of each pod fault goes out under its pod's resource
/// (the semantic conventions' names, what a collector's `k8sattributes`
/// associates by), beside the agent's identity and the Node's uid the writer
/// read.
fn assert_records_carry_pod_resources(
    rotel: &gpuwatch_test_support::telemetry::Rotel,
    marker: &str,
    pods: &[InPod],
) {
    let got = rotel.wait_for(T, "the pod faults' log records", |r| {
        pods.iter().all(|p| otlp_record(r, marker, p.tag).is_some())
    });
    for p in pods {
        let resource = otlp_record(&got, marker, p.tag).unwrap().resource;
        for (key, want) in [
            ("k8s.pod.uid", p.uid),
            ("k8s.pod.name", p.name),
            ("k8s.namespace.name", p.namespace),
            ("k8s.container.name", p.container),
            ("k8s.node.name", "e2e-node"),
            ("k8s.node.uid", "node-uid-1"),
            ("service.instance.id", "e2e-node"),
        ] {
            assert_eq!(
                resource.get(key),
                Some(&format!("Str({want})")),
                "{}: {key} should be {want}: {resource:#?}",
                p.tag
            );
        }
    }
}

/// The metrics go out under the node's resource with the Node's uid, no pod.
fn assert_metrics_carry_no_pod(rotel: &gpuwatch_test_support::telemetry::Rotel) {
    let got = rotel.wait_for(T, "a metric export with the Node's uid", |r| {
        r.metric("gpuwatch.kube.writes").is_some_and(|m| {
            m.resource.get("k8s.node.uid").map(String::as_str) == Some("Str(node-uid-1)")
        })
    });
    let resource = &got.metric("gpuwatch.kube.writes").unwrap().resource;
    assert!(
        resource.keys().all(|k| !k.starts_with("k8s.pod.")),
        "{resource:#?}"
    );
}

/// The Event on a Pod in `ns` whose message names process `{marker}-{tag}`.
fn pod_event(
    api: &gpuwatch_test_support::kube::ApiDouble,
    marker: &str,
    ns: &str,
    tag: &str,
) -> Option<k8s_openapi::api::core::v1::Event> {
    api.events().into_iter().find(|e| {
        e.involved_object.kind.as_deref() == Some("Pod")
            && e.metadata.namespace.as_deref() == Some(ns)
            && e.message
                .as_deref()
                .is_some_and(|m| m.contains(&format!("{marker}-{tag} ")))
    })
}

/// Warning Events on the two Pods name the container and the fault, in the
/// words a pod owner reads.
fn assert_pod_warnings(
    api: &gpuwatch_test_support::kube::ApiDouble,
    agent: &TestAgent,
    marker: &str,
) {
    // This agent reads the ring from its start, so earlier records of the
    // same pids may be attributed too (their own Events): each Event is
    // found by the process tag its message names.
    assert!(
        wait_until(T, || pod_event(api, marker, "ml", "named").is_some()
            && pod_event(api, marker, "jobs", "cgroupfs").is_some()),
        "{:?}\n{:#?}",
        api.events(),
        agent.stderr.get()
    );
    let e = pod_event(api, marker, "ml", "named").unwrap();
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.involved_object.name.as_deref(), Some("trainer-0"));
    assert_eq!(
        e.involved_object.uid.as_deref(),
        Some("1f2e3d4c-5b6a-4789-8abc-def012345678")
    );
    assert!(
        e.message
            .as_deref()
            .is_some_and(|m| m.contains("in container main hit XID 31")
                && m.contains("GPU memory page fault")
                && m.contains("The GPU itself is fine")),
        "{e:?}"
    );
    let e = pod_event(api, marker, "jobs", "cgroupfs").unwrap();
    assert_eq!(e.involved_object.name.as_deref(), Some("batch-7"));
    assert!(
        e.message
            .as_deref()
            .is_some_and(|m| m.contains("in container worker hit XID 13")),
        "{e:?}"
    );
}

/// `dir/gpuwatch.toml` with the writer on the double at `api_url` (short
/// backoffs, Normal Events unspread) and OTLP exported every second.
fn kube_otlp_config(dir: &std::path::Path, api_url: &str) -> std::path::PathBuf {
    let config = dir.join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[kube]\nenabled = true\napi_server_url = \"{api_url}\"\nbackoff_initial_ms = 50\nbackoff_max_ms = 400\nrequest_timeout_secs = 2\nnormal_event_spread_secs = 0\n[otlp]\nexport_interval_secs = 1\n"
        ),
    )
    .unwrap();
    config
}

/// With an API server serving the pods, a fault of a pid read from the real
/// `/dev/kmsg` names its pod's name, namespace and container on the event,
/// under the pod's resource on the OTLP log record, and in a Warning Event on
/// the Pod: for a containerd container under the systemd driver, and for a
/// pod under the cgroupfs driver's cgroup v1 layout that started while the
/// watch lagged (its record waits for the fresh list the engine asks for).
#[test]
fn a_faulting_pid_in_a_listed_pod_is_named_on_its_event_record_and_pod_event() {
    let k = DevKmsg::acquire();
    let marker = common::marker("pidpod");
    let dom = pci_domain(&marker);
    let trainer = InPod {
        tag: "named",
        uid: "1f2e3d4c-5b6a-4789-8abc-def012345678",
        name: "trainer-0",
        namespace: "ml",
        container: "main",
    };
    let batch = InPod {
        tag: "cgroupfs",
        uid: "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d",
        name: "batch-7",
        namespace: "jobs",
        container: "worker",
    };
    let (cid, cid2) = (
        "4f1c0e8b6a2d9c7e5b3a1f0e9d8c7b6a5f4e3d2c1b0a99887766554433221100",
        "9e8d7c6b5a49",
    );
    let (sleeper, sleeper2) = (Sleeper::spawn(), Sleeper::spawn());
    let fake = tempfile::tempdir().unwrap();
    let cgroup = systemd_containerd_cgroup(trainer.uid, cid);
    fake_proc_entry(fake.path(), sleeper.pid(), &cgroup);
    fake_proc_entry(
        fake.path(),
        sleeper2.pid(),
        &cgroupfs_v1_cgroup(batch.uid, cid2),
    );
    let (rt, api) = crate::kube_support::bare_api_double("e2e-node");
    let pod = |p: &InPod, cid: &str| listed_pod(p.name, p.namespace, p.uid, p.container, cid);
    api.put_pod(&pod(&trainer, cid));
    let state = tempfile::tempdir().unwrap();
    let config = kube_otlp_config(state.path(), &api.url);
    // A real collector receives the OTLP log records.
    let rotel = gpuwatch_test_support::telemetry::Rotel::start();
    let otlp = format!("http://127.0.0.1:{}", rotel.grpc_port);
    let agent = TestAgent::start(
        state.path(),
        &[
            "--accept-user-facility",
            "--proc-root",
            fake.path().to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--otlp-endpoint",
            &otlp,
        ],
    );
    // The listing is in before the faults are written. batch-7 starts just
    // before its fault, while the watch lags behind the API server.
    assert!(
        wait_until(T, || api.pod_watchers() == 1),
        "{:#?}",
        agent.stderr.get()
    );
    api.lag_pod_watches(true);
    api.put_pod(&pod(&batch, cid2));
    k.write(&xid31_of(&marker, dom, sleeper.pid(), trainer.tag, 0x3e));
    k.write(&xid13_of(&marker, dom, sleeper2.pid(), batch.tag, 0x3f));
    wait_tagged_events(&agent, &marker, &[trainer.tag, batch.tag]);
    assert_event_names_pod(&agent, &marker, &trainer);
    assert_event_names_pod(&agent, &marker, &batch);
    assert_records_carry_pod_resources(&rotel, &marker, &[trainer, batch]);
    assert_metrics_carry_no_pod(&rotel);
    assert_pod_warnings(&api, &agent, &marker);
    agent.stop();
    api.stop();
    drop(rt);
    drop(k);
}

fn by_tag_in(agent: &TestAgent, marker: &str, tag: &str) -> serde_json::Value {
    agent
        .events(marker)
        .into_iter()
        .find(|e| e["process"].as_str().is_some_and(|p| p.ends_with(tag)))
        .unwrap_or_else(|| panic!("no event for {tag}"))
}
