//! Helpers for the binary-level OTLP tests (`otlp_e2e.rs`): the real
//! `gpuwatch run` child process with the nvml-sim library and a kernel-log
//! FIFO, its local HTTP API (`/healthz`, `/metrics`), a parser for the
//! Prometheus text it serves, and the rotel collector helpers shared with the
//! sinks crate's tests (`gpuwatch_test_support::telemetry`: start rotel on
//! loopback ports, parse its detailed debug log, find `promtool`).
#![allow(dead_code)]

pub(crate) use gpuwatch_test_support::telemetry as rotel;

use crate::common::{Lines, nvml_sim_lib, wait_timeout};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

pub(crate) use crate::common::{data, http_get, wait_until};

/// The host name gpuwatch puts in `host.name`.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// A FIFO of kmsg-format records that `gpuwatch run --kmsg-path` reads. The
/// test holds it open read-write, so writes never block and the agent never
/// sees the end of the input; each record is one `write(2)` below `PIPE_BUF`,
/// so the agent never reads half a record.
pub(crate) struct KmsgFifo {
    /// Path of the FIFO.
    pub path: PathBuf,
    file: std::fs::File,
    next_seq: u64,
}

impl KmsgFifo {
    /// Creates the FIFO `kmsg.fifo` in `dir`.
    pub(crate) fn create(dir: &Path) -> KmsgFifo {
        let path = dir.join("kmsg.fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        // O_RDWR on a FIFO opens at once on Linux (no reader needed yet).
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open the FIFO read-write");
        KmsgFifo {
            path,
            file,
            next_seq: 5000,
        }
    }

    /// Writes one kern-facility record at `level` (`PRI = level`); returns
    /// its sequence number. The monotonic timestamp is `seq` milliseconds.
    pub(crate) fn write(&mut self, level: u8, message: &str) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let record = format!("{level},{seq},{},-;{message}\n", seq * 1000);
        assert!(record.len() < 4096, "record longer than PIPE_BUF");
        self.file.write_all(record.as_bytes()).expect("write FIFO");
        seq
    }
}

/// A running `gpuwatch run` (killed on drop).
pub(crate) struct OtlpAgent {
    child: Child,
    /// stderr (JSON logs).
    pub stderr: Lines,
    /// The local API address (`127.0.0.1:port`).
    pub api: String,
}

impl OtlpAgent {
    /// Starts `gpuwatch run --log-format json --api-listen 127.0.0.1:0 ARGS`
    /// with the nvml-sim library, and waits until it serves its API.
    pub(crate) fn start<I, S>(args: I) -> OtlpAgent
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let extra: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let mut cmd = crate::common::run_command(
            &["--log-format", "json", "--api-listen", "127.0.0.1:0"],
            &[],
        );
        cmd.args(extra)
            .env("GPUWATCH_NVML_SIM_LIB", nvml_sim_lib())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start gpuwatch");
        let stderr = Lines::default();
        stderr.spawn_reader(child.stderr.take().expect("stderr piped"));
        let mut agent = OtlpAgent {
            child,
            stderr,
            api: String::new(),
        };
        let started = wait_until(Duration::from_secs(20), || {
            agent.exited().is_none() && !agent.stderr.logs("gpuwatch started.").is_empty()
        });
        assert!(
            started,
            "gpuwatch did not start (exit {:?}):\n{}",
            agent.exited(),
            agent.stderr.tail(40)
        );
        agent.api = agent
            .stderr
            .logs("API listening.")
            .first()
            .and_then(|v| v["addr"].as_str().map(str::to_owned))
            .expect("API address logged");
        agent
    }

    /// The exit code if the process has ended.
    pub(crate) fn exited(&mut self) -> Option<Option<i32>> {
        self.child.try_wait().ok().flatten().map(|s| s.code())
    }

    /// GET `path` on the local API: (status, body).
    pub(crate) fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(&self.api, path)
    }

    /// Scrapes `/metrics`; panics unless it answers 200.
    pub(crate) fn scrape(&self) -> String {
        match self.get("/metrics") {
            Some((200, body)) => body,
            other => panic!(
                "/metrics answered {other:?}; agent log:\n{}",
                self.stderr.tail(40)
            ),
        }
    }

    /// Polls `/metrics` until `pred` holds on the parsed samples.
    pub(crate) fn wait_metrics(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Exposition) -> bool,
    ) -> Exposition {
        let mut last = Exposition::default();
        let ok = wait_until(timeout, || {
            last = Exposition::parse(&self.scrape());
            pred(&last)
        });
        assert!(
            ok,
            "timed out waiting for {what} on /metrics; agent log:\n{}",
            self.stderr.tail(40)
        );
        last
    }

    /// SIGTERM, then waits (up to 20 s) for the exit code.
    pub(crate) fn stop(mut self) -> Option<i32> {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("signal gpuwatch");
        wait_timeout(&mut self.child, Duration::from_secs(20))
    }
}

impl Drop for OtlpAgent {
    fn drop(&mut self) {
        // A test that failed midway must not leave the agent running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One sample of a Prometheus text exposition.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sample {
    /// Metric name (with `_bucket`/`_sum`/`_count` for histogram series).
    pub name: String,
    /// Labels, values unescaped.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// A parsed Prometheus text exposition (format 0.0.4).
#[derive(Clone, Debug, Default)]
pub(crate) struct Exposition {
    /// `# TYPE` lines: family name → type.
    pub families: BTreeMap<String, String>,
    /// Samples in order.
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// Parses the text; lines that do not parse are a test failure.
    pub(crate) fn parse(text: &str) -> Exposition {
        let mut e = Exposition::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest.split_once(' ').expect("TYPE line");
                e.families.insert(name.to_owned(), ty.trim().to_owned());
            } else if !line.starts_with('#') {
                e.samples
                    .push(parse_sample(line).unwrap_or_else(|| panic!("bad sample: {line}")));
            }
        }
        e
    }

    /// Samples named `name` whose labels include every `(key, value)`.
    pub(crate) fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The value of the one sample matching, if exactly one matches.
    pub(crate) fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        match self.find(name, labels).as_slice() {
            [one] => Some(one.value),
            _ => None,
        }
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let mut key = String::new();
        let end;
        loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => {
                    end = i + 1;
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                other => key.push(other),
            }
        }
        rest = &r[end..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// What rotel received, with metrics taken only from complete exports: the
/// debug log is read line by line, so the newest export may still be half
/// printed; it is left out (log records are taken from the whole output).
pub(crate) fn received_complete(collector: &rotel::Rotel) -> rotel::Received {
    let out = collector.output();
    let mut r = rotel::parse(&out);
    let cut = out.rfind("ResourceMetrics #0").unwrap_or(0);
    r.metrics = rotel::parse(&out[..cut]).metrics;
    r
}

/// Polls [`received_complete`] until `pred` holds, or panics after `timeout`.
pub(crate) fn wait_received(
    collector: &rotel::Rotel,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&rotel::Received) -> bool,
) -> rotel::Received {
    let deadline = Instant::now() + timeout;
    loop {
        let r = received_complete(collector);
        if pred(&r) {
            return r;
        }
        if Instant::now() > deadline {
            let out = collector.output();
            let start = out.len().saturating_sub(4000);
            let start = (start..out.len())
                .find(|i| out.is_char_boundary(*i))
                .unwrap_or(out.len());
            panic!(
                "timed out waiting for {what}; rotel output tail:\n{}",
                &out[start..]
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
