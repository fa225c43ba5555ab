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
    let conf = state.path().join("gpuwatch.toml");
    std::fs::write(
        &conf,
        "[engine]\npersist_interval_ms = 100\n[kmsg]\ncursor_interval_ms = 10\n",
    )
    .unwrap();
    let conf = conf.to_str().unwrap().to_string();
    let args = ["--accept-user-facility", "--config", conf.as_str()];
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
    let mut body = String::new();
    assert!(
        wait_until(T, || {
            body = common::http_get(&addr, "/v1/health")
                .map(|r| r.1)
                .unwrap_or_default();
            active_count(&body, &repeat_pci).is_some_and(|c| c >= 6)
        }),
        "repeats never counted: {body}"
    );
    // Every record is read and the position saved past the newest: a
    // duplicate would have been counted by then.
    let newest = ring()
        .into_iter()
        .filter(|(_, m)| m.contains(&marker))
        .map(|(seq, _)| seq)
        .max()
        .expect("the records are in the ring");
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

    let mut total = before.clone();
    for (k, v) in &after {
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

/// Crash exactness: fault records written while the agent is `kill -9`'d at
/// 50 random moments (some during a state write: it persists every 100 ms)
/// and restarted on the same state directory. The state is readable after
/// every kill, and at the end the fault counts equal the records written
/// exactly: nothing counted twice, nothing skipped.
#[test]
fn kill_9_at_random_moments_neither_loses_nor_double_counts() {
    use std::process::{Command, Stdio};
    const RECORDS: usize = 300;
    const GPUS: usize = 3;
    const KILLS: usize = 50;
    let k = DevKmsg::acquire();
    let marker = common::marker("crash");
    let dom = pci_domain(&marker);
    let state = tempfile::tempdir().unwrap();
    let conf = state.path().join("gpuwatch.toml");
    std::fs::write(
        &conf,
        "[engine]\npersist_interval_ms = 100\n[kmsg]\ncursor_interval_ms = 10\n",
    )
    .unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("crash test seed {seed}");
    let mut rng = seed | 1;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let start = || {
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
            .arg(state.path())
            .args(["--accept-user-facility", "--config"])
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start gpuwatch")
    };
    let line = |i: usize| {
        let bus = 0x20 + (i % GPUS) as u8;
        format!(
            "NVRM: Xid (PCI:{dom:04x}:{bus:02x}:00): 13, pid={i}, name={marker}, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Misaligned Address"
        )
    };
    let health = state.path().join("health.json");
    let mut written = 0usize;
    for kill in 0..KILLS {
        let mut child = start();
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
        if let Ok(text) = std::fs::read_to_string(&health) {
            let v: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("state unreadable after kill {kill}: {e}\n{text}"));
            assert_eq!(v["version"], 2);
        }
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
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&health).unwrap()).unwrap();
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
    let expected = (RECORDS / GPUS) as u64;
    assert_eq!(per_gpu.len(), GPUS, "{per_gpu:?}");
    for (pci, n) in &per_gpu {
        assert_eq!(
            *n, expected,
            "{pci}: counted {n} of {expected} (seed {seed}): {per_gpu:?}"
        );
    }
}

/// A line naming a pid is attributed from `<proc_root>/<pid>/cgroup` when it
/// is read from the real `/dev/kmsg`: a live process outside any pod (this
/// suite's `sleep`) is said to be so, with its cgroup; a pid whose process
/// is gone says that; and under a proc root whose cgroup file is kubelet's
/// (systemd driver, containerd) the event carries the pod UID and container id.
/// With an API server serving the pods, the events and OTLP records carry the
/// pods' names, also for a pod that started while the watch lagged (the
/// record waits for the fresh list the engine asks for).
#[test]
fn a_faulting_pid_is_attributed_to_its_pod_or_said_not_to_be_in_one() {
    let k = DevKmsg::acquire();
    let marker = common::marker("pidpod");
    let dom = pci_domain(&marker);
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let live = sleeper.id();
    let mut done = Command::new("true").spawn().unwrap();
    let gone = done.id();
    done.wait().unwrap();
    let own_cgroup = std::fs::read_to_string(format!("/proc/{live}/cgroup")).unwrap();
    let own_cgroup = own_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .or_else(|| {
            own_cgroup
                .lines()
                .next()
                .and_then(|l| l.splitn(3, ':').nth(2))
        })
        .unwrap()
        .trim()
        .to_owned();
    // A proc root where the sleeper is in a pod: its real stat (start time),
    // and the cgroup file kubelet's systemd driver gives a containerd container.
    let fake = tempfile::tempdir().unwrap();
    let dir = fake.path().join(live.to_string());
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(format!("/proc/{live}/stat"), dir.join("stat")).unwrap();
    let uid = "1f2e3d4c-5b6a-4789-8abc-def012345678";
    let cid = "4f1c0e8b6a2d9c7e5b3a1f0e9d8c7b6a5f4e3d2c1b0a99887766554433221100";
    std::fs::write(
        dir.join("cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{cid}.scope\n",
            uid.replace('-', "_")
        ),
    )
    .unwrap();
    // One GPU each: repeats of one fault on one GPU are coalesced. XID 13 as
    // the driver prints it, and XID 31 (an MMU fault in the process's
    // context) with the driver's fault text.
    let line = |pid: u32, tag: &str, bus: u8| {
        format!(
            "NVRM: Xid (PCI:{dom:04x}:{bus:02x}:00): 13, pid={pid}, name={marker}-{tag}, Graphics Exception"
        )
    };
    let mmu_fault = |pid: u32, tag: &str, bus: u8| {
        format!(
            "NVRM: Xid (PCI:{dom:04x}:{bus:02x}:00): 31, pid={pid}, name={marker}-{tag}, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_a0000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
        )
    };

    let state = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(state.path(), &["--accept-user-facility"]);
    k.write(&line(live, "live", 0x3b));
    k.write(&line(gone, "gone", 0x3c));
    assert!(
        agent.wait_events(&marker, 2, T),
        "{:#?}",
        agent.stderr.get()
    );
    let by_tag = |tag: &str| by_tag_in(&agent, &marker, tag);
    let ev = by_tag("live");
    assert_eq!(ev["attributes"]["pod_attribution"], "not_in_pod", "{ev}");
    assert_eq!(ev["attributes"]["process.cgroup"], own_cgroup.as_str());
    assert!(ev["attributes"].get("k8s.pod.uid").is_none());
    let ev = by_tag("gone");
    // `pid_reused` only if the system handed the pid out again in between.
    assert!(
        matches!(
            ev["attributes"]["pod_attribution"].as_str(),
            Some("process_exited" | "pid_reused")
        ),
        "{ev}"
    );
    agent.stop();

    let state = tempfile::tempdir().unwrap();
    let proc_root = fake.path().to_str().unwrap();
    let agent = TestAgent::start(
        state.path(),
        &["--accept-user-facility", "--proc-root", proc_root],
    );
    k.write(&line(live, "pod", 0x3d));
    assert!(
        wait_until(T, || agent
            .events(&marker)
            .iter()
            .any(|e| e["process"].as_str().is_some_and(|p| p.ends_with("pod")))),
        "{:#?}",
        agent.stderr.get()
    );
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

    // With an API server that serves the pod: its name, namespace and
    // container name on the event, and a Warning Event on the Pod. A second
    // live process is in a pod under the cgroupfs driver's cgroup v1 layout.
    let mut sleeper2 = Command::new("sleep").arg("60").spawn().unwrap();
    let live2 = sleeper2.id();
    let dir2 = fake.path().join(live2.to_string());
    std::fs::create_dir(&dir2).unwrap();
    std::fs::copy(format!("/proc/{live2}/stat"), dir2.join("stat")).unwrap();
    let uid2 = "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d";
    let cid2 = "9e8d7c6b5a49";
    std::fs::write(
        dir2.join("cgroup"),
        format!(
            "12:memory:/kubepods/besteffort/pod{uid2}/{cid2}\n11:cpu,cpuacct:/kubepods/besteffort/pod{uid2}/{cid2}\n1:name=systemd:/kubepods/besteffort/pod{uid2}/{cid2}\n"
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let node: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "e2e-node"}})).unwrap();
    let api = rt.block_on(gpuwatch_test_support::kube::ApiDouble::start(node));
    let pod = |name: &str, ns: &str, uid: &str, container: &str, id: &str| {
        serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "spec": {"nodeName": "e2e-node", "containers": [{"name": container}]},
            "status": {"containerStatuses": [{"name": container, "containerID": format!("containerd://{id}"), "image": "i", "imageID": "", "ready": true, "restartCount": 0}]},
        }))
        .unwrap()
    };
    api.put_pod(&pod("trainer-0", "ml", uid, "main", cid));
    let cfg_dir = tempfile::tempdir().unwrap();
    let config = cfg_dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[kube]\nenabled = true\napi_server_url = \"{}\"\nbackoff_initial_ms = 50\nbackoff_max_ms = 400\nrequest_timeout_secs = 2\nnormal_event_spread_secs = 0\n[otlp]\nexport_interval_secs = 1\n",
            api.url
        ),
    )
    .unwrap();
    // A real collector receives the OTLP log records.
    let rotel = gpuwatch_test_support::telemetry::Rotel::start();
    let otlp = format!("http://127.0.0.1:{}", rotel.grpc_port);
    let state = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(
        state.path(),
        &[
            "--accept-user-facility",
            "--proc-root",
            proc_root,
            "--config",
            config.to_str().unwrap(),
            "--otlp-endpoint",
            &otlp,
        ],
    );
    // The listing is in before the faults are written. batch-7 starts just
    // before its fault, while the watch lags behind the API server: its
    // record waits for the fresh list the engine asks for.
    assert!(
        wait_until(T, || api.pod_watchers() == 1),
        "{:#?}",
        agent.stderr.get()
    );
    api.lag_pod_watches(true);
    api.put_pod(&pod("batch-7", "jobs", uid2, "worker", cid2));
    k.write(&mmu_fault(live, "named", 0x3e));
    k.write(&line(live2, "cgroupfs", 0x3f));
    assert!(
        wait_until(T, || {
            let evs = agent.events(&marker);
            ["named", "cgroupfs"].iter().all(|t| {
                evs.iter()
                    .any(|e| e["process"].as_str().is_some_and(|p| p.ends_with(t)))
            })
        }),
        "{:#?}",
        agent.stderr.get()
    );
    let ev = by_tag_in(&agent, &marker, "named");
    let p = &ev["pods"][0];
    assert_eq!(
        (&p["uid"], &p["name"], &p["namespace"], &p["container"]),
        (
            &serde_json::json!(uid),
            &serde_json::json!("trainer-0"),
            &serde_json::json!("ml"),
            &serde_json::json!("main")
        ),
        "{ev}"
    );
    let ev = by_tag_in(&agent, &marker, "cgroupfs");
    let p = &ev["pods"][0];
    assert_eq!(
        (&p["uid"], &p["name"], &p["namespace"], &p["container"]),
        (
            &serde_json::json!(uid2),
            &serde_json::json!("batch-7"),
            &serde_json::json!("jobs"),
            &serde_json::json!("worker")
        ),
        "{ev}"
    );
    // The OTLP log record of each goes out under its pod's resource (the
    // semantic conventions' names, what a collector's `k8sattributes`
    // associates by), beside the agent's identity and the Node's uid the
    // writer read.
    let record = |r: &gpuwatch_test_support::telemetry::Received, tag: &str| {
        r.logs
            .iter()
            .find(|l| {
                l.attrs
                    .get("process.executable.name")
                    .is_some_and(|p| p.contains(&format!("{marker}-{tag}")))
            })
            .cloned()
    };
    let got = rotel.wait_for(T, "the two pod faults' log records", |r| {
        record(r, "named").is_some() && record(r, "cgroupfs").is_some()
    });
    for (tag, uid, name, ns, container) in [
        ("named", uid, "trainer-0", "ml", "main"),
        ("cgroupfs", uid2, "batch-7", "jobs", "worker"),
    ] {
        let resource = record(&got, tag).unwrap().resource;
        for (key, want) in [
            ("k8s.pod.uid", uid),
            ("k8s.pod.name", name),
            ("k8s.namespace.name", ns),
            ("k8s.container.name", container),
            ("k8s.node.name", "e2e-node"),
            ("k8s.node.uid", "node-uid-1"),
            ("service.instance.id", "e2e-node"),
        ] {
            assert_eq!(
                resource.get(key),
                Some(&format!("Str({want})")),
                "{tag}: {key} should be {want}: {resource:#?}"
            );
        }
    }
    // The metrics: the node's resource with the Node's uid, no pod.
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
    // This agent reads the ring from its start, so the earlier phase's
    // XID 13 of the same pid is attributed to trainer-0 too (its own Event):
    // each Event is found by the process tag its message names.
    let pod_event = |ns: &str, tag: &str| {
        api.events().into_iter().find(|e| {
            e.involved_object.kind.as_deref() == Some("Pod")
                && e.metadata.namespace.as_deref() == Some(ns)
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.contains(&format!("{marker}-{tag} ")))
        })
    };
    assert!(
        wait_until(T, || pod_event("ml", "named").is_some()
            && pod_event("jobs", "cgroupfs").is_some()),
        "{:?}\n{:#?}",
        api.events(),
        agent.stderr.get()
    );
    let e = pod_event("ml", "named").unwrap();
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.involved_object.name.as_deref(), Some("trainer-0"));
    assert_eq!(e.involved_object.uid.as_deref(), Some(uid));
    assert!(
        e.message
            .as_deref()
            .is_some_and(|m| m.contains("in container main hit XID 31")
                && m.contains("GPU memory page fault")
                && m.contains("The GPU itself is fine")),
        "{e:?}"
    );
    let e = pod_event("jobs", "cgroupfs").unwrap();
    assert_eq!(e.involved_object.name.as_deref(), Some("batch-7"));
    assert!(
        e.message
            .as_deref()
            .is_some_and(|m| m.contains("in container worker hit XID 13")),
        "{e:?}"
    );
    agent.stop();
    api.stop();
    drop(rt);
    sleeper.kill().ok();
    sleeper.wait().ok();
    sleeper2.kill().ok();
    sleeper2.wait().ok();
    drop(k);
}

fn by_tag_in(agent: &TestAgent, marker: &str, tag: &str) -> serde_json::Value {
    agent
        .events(marker)
        .into_iter()
        .find(|e| e["process"].as_str().is_some_and(|p| p.ends_with(tag)))
        .unwrap_or_else(|| panic!("no event for {tag}"))
}
