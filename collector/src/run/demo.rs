//! `gpuwatch demo`: a narrated run of the real agent on this machine.
//!
//! It starts `gpuwatch run` as a child process reading the REAL `/dev/kmsg`
//! (with `accept_user_facility`, the stdout JSON sink, the nvml-sim library
//! driven by a scenario, a temporary state directory, the Kubernetes writer
//! in dry-run), writes scripted NVIDIA kernel lines into `/dev/kmsg` at the
//! times the scenario injects its XIDs, and prints a timeline a person can
//! follow: detection → classification → node verdict (polled from
//! `/v1/health`). Needs root: it sets `printk_devkmsg=on` while it runs (the
//! default `ratelimit` drops all but 10 writes per open) and restores it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PRINTK_DEVKMSG: &str = "/proc/sys/kernel/printk_devkmsg";

/// Flags of `gpuwatch demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// nvml-sim scenario (GPUs and timed faults).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "nvml-sim/scenarios/demo.toml"
    )]
    pub scenario: PathBuf,
    /// How long to run; 0: until 10 s after the scenario's last injection (at least 20 s).
    #[arg(long, default_value_t = 0)]
    pub duration_secs: u64,
    /// Kernel log to write to and read from.
    #[arg(long, value_name = "PATH", default_value = "/dev/kmsg")]
    pub kmsg_path: PathBuf,
}

/// Errors of the demo.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The scenario could not be read or parsed.
    #[error("cannot use scenario {path}: {message}")]
    Scenario {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// Setting up the machine failed (root needed for /dev/kmsg writes).
    #[error("{what}: {source} (the demo needs root: it writes /dev/kmsg)")]
    Setup {
        /// What failed.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The agent did not start or failed.
    #[error("the agent failed: {0}")]
    Agent(String),
}

/// One scripted kernel line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedLine {
    /// Milliseconds after the agent started.
    pub at_ms: u64,
    /// The kernel message.
    pub message: String,
    /// What the narration says when it is written.
    pub note: String,
}

/// A scenario GPU (index → PCI address).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SimGpu {
    index: u64,
    pci: String,
}

fn kernel_pci(pci: &str) -> String {
    // NVRM prints `dddd:bb:dd` (domain, bus, device) without the function.
    let norm = xid_parser::normalize_pci(pci).unwrap_or_else(|| pci.to_ascii_lowercase());
    norm.rsplit_once('.')
        .map_or(norm.clone(), |(a, _)| a.to_string())
}

fn xid_text(xid: u64) -> &'static str {
    match xid {
        79 => "GPU has fallen off the bus.",
        48 => {
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."
        }
        63 => "Row Remapper: New row marked for remapping, reset gpu to activate.",
        64 => "Row Remapper Error: failed to remap row.",
        74 => "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        94 => "Contained: SM (0x1). RST: No, D-RST: No",
        95 => "Uncontained: FBHUB. RST: Yes, D-RST: No",
        119 => {
            "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)."
        }
        _ => "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    }
}

/// Builds the kernel-line script from a scenario's text: one NVRM Xid line
/// per `[[inject]]` with an `xid` (at the same time), a row-remapper line for
/// an injected `remapped_rows_failure`, and an application fault (XID 13) on
/// another GPU 3 s after the first injection, to show that application faults
/// do not isolate the node.
pub fn script_from_scenario(text: &str) -> Result<Vec<ScriptedLine>, String> {
    let v: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
    let gpus: Vec<SimGpu> = v
        .get("gpu")
        .and_then(|g| g.as_array())
        .map(|a| {
            a.iter()
                .enumerate()
                .filter_map(|(i, g)| {
                    Some(SimGpu {
                        index: g
                            .get("index")
                            .and_then(|x| x.as_integer())
                            .map_or(i as u64, |x| x as u64),
                        pci: g.get("pci")?.as_str()?.to_string(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    if gpus.is_empty() {
        return Err("the scenario has no [[gpu]] with a pci address".into());
    }
    let pci_of = |idx: u64| gpus.iter().find(|g| g.index == idx).map(|g| g.pci.clone());
    let mut script = Vec::new();
    let mut pid = 31_337;
    for inj in v
        .get("inject")
        .and_then(|i| i.as_array())
        .cloned()
        .unwrap_or_default()
    {
        let at_ms = inj.get("at_ms").and_then(|x| x.as_integer()).unwrap_or(0) as u64;
        let Some(pci) = inj
            .get("gpu")
            .and_then(|x| x.as_integer())
            .and_then(|g| pci_of(g as u64))
        else {
            continue;
        };
        let note = inj
            .get("note")
            .and_then(|n| n.as_str())
            .unwrap_or("")
            .to_string();
        pid += 1;
        if let Some(xid) = inj.get("xid").and_then(|x| x.as_integer()) {
            let xid = xid as u64;
            script.push(ScriptedLine {
                at_ms,
                message: format!(
                    "NVRM: Xid (PCI:{}): {xid}, pid={pid}, name=train.py, {}",
                    kernel_pci(&pci),
                    xid_text(xid)
                ),
                note: if note.is_empty() {
                    format!("kernel reports XID {xid} on {pci}")
                } else {
                    note.clone()
                },
            });
        }
        if inj.get("xid").is_none()
            && inj.get("remapped_rows_failure").and_then(|x| x.as_bool()) == Some(true)
        {
            script.push(ScriptedLine {
                at_ms,
                message: format!(
                    "NVRM: Xid (PCI:{}): 64, pid={pid}, name=train.py, {}",
                    kernel_pci(&pci),
                    xid_text(64)
                ),
                note: if note.is_empty() {
                    format!("row remapping fails on {pci}")
                } else {
                    note.clone()
                },
            });
        }
    }
    if let Some(first) = script.iter().map(|s| s.at_ms).min() {
        let lost_pci = script
            .first()
            .map(|s| s.message.clone())
            .unwrap_or_default();
        if let Some(other) = gpus
            .iter()
            .find(|g| !lost_pci.contains(&kernel_pci(&g.pci)))
        {
            script.push(ScriptedLine {
                at_ms: first + 3000,
                message: format!(
                    "NVRM: Xid (PCI:{}): 13, pid=4711, name=notebook.py, {}",
                    kernel_pci(&other.pci),
                    xid_text(13)
                ),
                note: format!("an application crashes on {} (XID 13)", other.pci),
            });
        }
    }
    script.sort_by_key(|s| s.at_ms);
    Ok(script)
}

fn last_inject_ms(text: &str) -> u64 {
    toml::from_str::<toml::Value>(text)
        .ok()
        .and_then(|v| {
            v.get("inject")?.as_array().map(|a| {
                a.iter()
                    .filter_map(|i| i.get("at_ms")?.as_integer())
                    .max()
                    .unwrap_or(0) as u64
            })
        })
        .unwrap_or(0)
}

/// Sequence number of the newest record in a kmsg device.
fn last_kmsg_seq(path: &Path) -> Option<u64> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    let mut last = None;
    loop {
        match f.read(&mut buf) {
            Ok(n) if n > 0 => {
                if let Ok(rec) = xid_parser::parse_kmsg_record(&buf[..n]) {
                    last = Some(rec.seq);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            _ => return last,
        }
    }
}

/// Restores `printk_devkmsg` on drop.
struct PrintkGuard(Option<String>);

impl Drop for PrintkGuard {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(PRINTK_DEVKMSG, format!("{old}\n"));
        }
    }
}

/// Kills the agent on drop (error paths).
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn stamp(t0: Instant) -> String {
    format!("[{:5.1}s]", t0.elapsed().as_secs_f64())
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split("\r\n\r\n").nth(1).map(str::to_string)
}

fn describe_event(ev: &serde_json::Value) -> String {
    let s = |k: &str| ev[k].as_str().unwrap_or("").to_string();
    let code = ev["code"].as_u64().unwrap_or(0);
    let what = match s("kind").as_str() {
        "xid" => format!("XID {code}"),
        "" => "fault".to_string(),
        k => k.replace('_', " "),
    };
    let gpu = match ev["gpu_index"].as_u64() {
        Some(i) => format!("GPU {i} ({})", s("pci_address")),
        None if !s("pci_address").is_empty() => format!("GPU {}", s("pci_address")),
        None => "the node".to_string(),
    };
    format!(
        "{what} on {gpu} from {}: {} → action {} ({})",
        s("source"),
        s("name"),
        s("action"),
        s("policy_reason")
    )
}

/// Runs the demo.
pub fn run(args: &DemoArgs) -> Result<(), DemoError> {
    let scenario_text =
        std::fs::read_to_string(&args.scenario).map_err(|e| DemoError::Scenario {
            path: args.scenario.clone(),
            message: e.to_string(),
        })?;
    let script = script_from_scenario(&scenario_text).map_err(|message| DemoError::Scenario {
        path: args.scenario.clone(),
        message,
    })?;
    let duration = if args.duration_secs > 0 {
        Duration::from_secs(args.duration_secs)
    } else {
        Duration::from_millis((last_inject_ms(&scenario_text) + 10_000).max(20_000))
    };
    let is_dev = args.kmsg_path == Path::new("/dev/kmsg");
    let _printk = if is_dev {
        let old = std::fs::read_to_string(PRINTK_DEVKMSG).map_err(|source| DemoError::Setup {
            what: format!("cannot read {PRINTK_DEVKMSG}"),
            source,
        })?;
        std::fs::write(PRINTK_DEVKMSG, "on\n").map_err(|source| DemoError::Setup {
            what: format!("cannot set {PRINTK_DEVKMSG}=on"),
            source,
        })?;
        PrintkGuard(Some(old.trim().to_string()))
    } else {
        PrintkGuard(None)
    };
    let mut kmsg = std::fs::OpenOptions::new()
        .append(true)
        .open(&args.kmsg_path)
        .map_err(|source| DemoError::Setup {
            what: format!("cannot open {} for writing", args.kmsg_path.display()),
            source,
        })?;
    let state = std::env::temp_dir().join(format!("gpuwatch-demo-{}", std::process::id()));
    std::fs::create_dir_all(&state).map_err(|source| DemoError::Setup {
        what: format!("cannot create {}", state.display()),
        source,
    })?;

    // Start the agent at the kernel log's current end so records from before
    // the demo do not crowd the timeline (in production a new boot reads the
    // whole ring): a cursor for this boot at the last sequence number.
    if is_dev
        && let Some(last_seq) = last_kmsg_seq(&args.kmsg_path)
        && let Ok(boot_id) = crate::boot::read_boot_id(Path::new(crate::boot::BOOT_ID_PATH))
    {
        let cursor = crate::kmsg::KmsgCursor { boot_id, last_seq };
        if let Err(e) = crate::statefile::write_json(&state.join(crate::kmsg::CURSOR_FILE), &cursor)
        {
            println!("cannot pre-set the kernel log cursor ({e}); the agent reads the whole ring");
        }
    }

    // Ctrl-C / SIGTERM: stop early, still restore printk_devkmsg.
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| DemoError::Setup {
            what: "cannot start the signal runtime".into(),
            source,
        })?;
    {
        let stop = stop.clone();
        let _guard = rt.enter();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|source| DemoError::Setup {
                what: "cannot install signal handlers".into(),
                source,
            })?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|source| DemoError::Setup {
                what: "cannot install signal handlers".into(),
                source,
            })?;
        std::thread::spawn(move || {
            rt.block_on(async {
                tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            });
            stop.store(true, Ordering::Relaxed);
        });
    }

    let exe = std::env::current_exe().map_err(|source| DemoError::Setup {
        what: "cannot find the gpuwatch executable".into(),
        source,
    })?;
    println!(
        "gpuwatch demo — real kernel log ({}), simulated GPUs ({})",
        args.kmsg_path.display(),
        args.scenario.display()
    );
    println!(
        "state dir {}; running for {} s; Ctrl-C stops early.\n",
        state.display(),
        duration.as_secs()
    );
    let mut child = Command::new(exe)
        .args([
            "run",
            "--accept-user-facility",
            "--sink",
            "stdout",
            "--kube-dry-run",
        ])
        .args([
            "--api-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--node-name",
            "demo-node",
        ])
        .arg("--kmsg-path")
        .arg(&args.kmsg_path)
        .arg("--nvml-sim")
        .arg(&args.scenario)
        .arg("--state-dir")
        .arg(&state)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| DemoError::Agent(e.to_string()))?;
    let (ev_tx, ev_rx) = mpsc::channel::<serde_json::Value>();
    let (log_tx, log_rx) = mpsc::channel::<serde_json::Value>();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&l) {
                    let _ = ev_tx.send(v);
                }
            }
        });
    }
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&l) {
                    let _ = log_tx.send(v);
                }
            }
        });
    }
    let mut child = ChildGuard(Some(child));
    let t0 = Instant::now();

    // Wait for the API address.
    let mut api = None;
    while api.is_none() && t0.elapsed() < Duration::from_secs(20) {
        match log_rx.recv_timeout(Duration::from_millis(200)) {
            Ok(v) if v["message"] == "API listening." => {
                api = v["addr"].as_str().map(str::to_string);
            }
            Ok(v) if v["level"] == "ERROR" => {
                println!(
                    "{} agent: {}",
                    stamp(t0),
                    v["message"].as_str().unwrap_or("")
                );
            }
            _ => {}
        }
        if let Some(Ok(Some(st))) = child.0.as_mut().map(|c| c.try_wait()) {
            return Err(DemoError::Agent(format!("exited early with {st}")));
        }
    }
    let api = api.ok_or_else(|| DemoError::Agent("did not report its API address".into()))?;
    println!("{} agent started (API http://{api}/v1/health)", stamp(t0));

    let mut next = 0usize;
    let mut last_verdict = String::new();
    let mut last_poll = Instant::now() - Duration::from_secs(1);
    let mut events = 0usize;
    let mut by_action: BTreeMap<String, usize> = BTreeMap::new();
    let mut pid_seen = false;
    while t0.elapsed() < duration && !stop.load(Ordering::Relaxed) {
        while next < script.len() && t0.elapsed() >= Duration::from_millis(script[next].at_ms) {
            let line = &script[next];
            println!("{} INJECT    {}", stamp(t0), line.note);
            println!("{}           /dev/kmsg ← {}", stamp(t0), line.message);
            if let Err(e) = kmsg.write_all(format!("<3>{}\n", line.message).as_bytes()) {
                println!("{} cannot write the kernel log: {e}", stamp(t0));
            }
            next += 1;
        }
        while let Ok(ev) = ev_rx.try_recv() {
            events += 1;
            *by_action
                .entry(ev["action"].as_str().unwrap_or("?").to_string())
                .or_default() += 1;
            println!("{} DETECTED  {}", stamp(t0), describe_event(&ev));
        }
        while let Ok(v) = log_rx.try_recv() {
            if v["level"] == "WARN" || v["level"] == "ERROR" {
                println!(
                    "{} agent {}: {}",
                    stamp(t0),
                    v["level"].as_str().unwrap_or(""),
                    v["message"].as_str().unwrap_or("")
                );
            }
        }
        if last_poll.elapsed() >= Duration::from_millis(500) {
            last_poll = Instant::now();
            if let Some(body) = http_get(&api, "/v1/health")
                && let Ok(h) = serde_json::from_str::<serde_json::Value>(&body)
            {
                let verdict = format!(
                    "verdict={} action={} reason={} ({} GPUs)",
                    h["verdict"].as_str().unwrap_or("?"),
                    h["action"].as_str().unwrap_or("none"),
                    h["reason"].as_str().unwrap_or(""),
                    h["gpus"].as_array().map_or(0, |g| g.len())
                );
                if verdict != last_verdict {
                    println!("{} NODE      {verdict}", stamp(t0));
                    if let Some(m) = h["message"].as_str().filter(|m| !m.is_empty()) {
                        println!("{}           {m}", stamp(t0));
                    }
                    last_verdict = verdict;
                }
                pid_seen = true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    // Stop the agent cleanly.
    let mut status = None;
    if let Some(c) = child.0.as_mut() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                status = Some(st);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if status.is_some() {
        child.0 = None;
    }
    while let Ok(ev) = ev_rx.try_recv() {
        events += 1;
        *by_action
            .entry(ev["action"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
        println!("{} DETECTED  {}", stamp(t0), describe_event(&ev));
    }
    let _ = std::fs::remove_dir_all(&state);
    println!("\nSummary after {:.0} s:", t0.elapsed().as_secs_f64());
    println!("  fault events: {events} ({by_action:?})");
    println!(
        "  final node state: {}",
        if pid_seen {
            last_verdict.as_str()
        } else {
            "API never answered"
        }
    );
    println!(
        "  agent exit: {}",
        status.map_or("killed (did not stop within 15 s)".to_string(), |s| s
            .to_string())
    );
    println!("  printk_devkmsg restored; nothing was written to any cluster.");
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(DemoError::Agent(format!("exited with {s}"))),
        None => Err(DemoError::Agent("did not stop on SIGTERM".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCENARIO: &str = r#"
description = "t"
[[gpu]]
index = 0
uuid = "GPU-a"
pci = "00000000:1B:00.0"
[[gpu]]
index = 1
uuid = "GPU-b"
pci = "0000:2c:00.0"
[[inject]]
at_ms = 5000
gpu = 1
xid = 79
lost = true
note = "GPU 1 falls off the bus"
[[inject]]
at_ms = 10000
gpu = 0
remapped_rows_failure = true
"#;

    #[test]
    fn script_mirrors_scenario_injections_as_kernel_lines() {
        let s = script_from_scenario(SCENARIO).unwrap();
        let msgs: Vec<(u64, &str)> = s.iter().map(|l| (l.at_ms, l.message.as_str())).collect();
        assert_eq!(msgs.len(), 3, "{msgs:#?}");
        assert_eq!(msgs[0].0, 5000);
        assert!(
            msgs[0]
                .1
                .starts_with("NVRM: Xid (PCI:0000:2c:00): 79, pid="),
            "{}",
            msgs[0].1
        );
        assert_eq!(s[0].note, "GPU 1 falls off the bus");
        // Application fault on the other GPU 3 s after the first injection.
        assert_eq!(msgs[1].0, 8000);
        assert!(msgs[1].1.contains("(PCI:0000:1b:00): 13,"), "{}", msgs[1].1);
        assert_eq!(msgs[2].0, 10000);
        assert!(msgs[2].1.contains("(PCI:0000:1b:00): 64,"), "{}", msgs[2].1);
        assert_eq!(last_inject_ms(SCENARIO), 10000);
    }

    #[test]
    fn scenario_without_gpus_is_an_error() {
        assert!(script_from_scenario("description = \"x\"\n").is_err());
        assert!(script_from_scenario("not toml [").is_err());
    }
}
