//! `gpuwatch check-install` through the real binary against the API-server
//! double (`[kube] api_server_url`, or a kubeconfig when the config does
//! not load): its output lines and exit codes for a working install, denied
//! requests with a crash-looping pod, no pods (with and without
//! `--allow-no-pods`), a config that does not load and an API server that
//! cannot be reached.

use crate::kube_common::ApiDouble;
use crate::kube_support::node;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Output;

const NS: &str = "gpuwatch";
const SELECTOR: &str = "app.kubernetes.io/name=gpuwatch";

/// The double serving one test, its runtime and a directory for the files.
struct Rig {
    /// The double (dropped before the runtime that serves it).
    api: ApiDouble,
    dir: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
}

impl Rig {
    fn new() -> Rig {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let api = rt.block_on(ApiDouble::start(node(vec![])));
        Rig {
            api,
            dir: tempfile::tempdir().expect("temporary directory"),
            _rt: rt,
        }
    }

    /// A config file with `kube` as its `[kube]` section.
    fn config(&self, kube: &str) -> PathBuf {
        let path = self.dir.path().join("gpuwatch.toml");
        std::fs::write(&path, format!("[kube]\n{kube}\n")).expect("write config");
        path
    }

    /// A config whose `[kube]` reaches the double, Events and Leases in
    /// their own namespaces.
    fn good_config(&self) -> PathBuf {
        self.config(&format!(
            "api_server_url = \"{}\"\nrequest_timeout_secs = 2\nevent_namespace = \"gpu-events\"\nquarantine_namespace = \"gpu-quarantine\"",
            self.api.url
        ))
    }

    fn put_pod(&self, name: &str, status: serde_json::Value) {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS, "labels": {"app.kubernetes.io/name": "gpuwatch"}},
            "spec": {"nodeName": format!("node-{name}"), "containers": [{"name": "gpuwatch"}]},
            "status": status,
        }))
        .expect("pod");
        self.api.put_pod(&pod);
    }

    /// Runs `gpuwatch check-install --config <config> --namespace gpuwatch
    /// --selector ...` with `extra` flags and `env` (a kubeconfig; none by
    /// default, so nothing of this machine's is read); the runtime's worker
    /// serves the double meanwhile.
    fn run(&self, config: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Output {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gpuwatch"));
        cmd.args(["check-install", "--config"])
            .arg(config)
            .args(["--namespace", NS, "--selector", SELECTOR])
            .args(extra)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", self.dir.path().join("no-kubeconfig"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run gpuwatch check-install")
    }
}

fn ready() -> serde_json::Value {
    json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn diag(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Everything works: three PASS lines, the verdict, exit 0.
#[test]
fn check_install_passes_a_working_install() {
    let rig = Rig::new();
    rig.put_pod("gpuwatch-a", ready());
    rig.put_pod("gpuwatch-b", ready());
    let config = rig.good_config();
    let out = rig.run(&config, &["--timeout", "5"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", diag(&out));
    assert_eq!(
        stdout(&out),
        format!(
            "PASS config: {}\n\
             PASS rbac: all 21 requests the agent makes are allowed (cluster: nodes, nodes/status, pods, resourceslices.resource.k8s.io, devicetaintrules.resource.k8s.io; namespace gpu-events: events; namespace gpu-quarantine: leases.coordination.k8s.io)\n\
             PASS pods: 2 gpuwatch pod(s) in namespace {NS} matching {SELECTOR} are Ready\n\
             check-install: passed\n",
            config.display()
        )
    );
    rig.api.assert_requests_declared();
}

/// A denied request and a crash-looping pod: each named, exit 1.
#[test]
fn check_install_names_denied_requests_and_unready_pods() {
    let rig = Rig::new();
    rig.put_pod("gpuwatch-a", ready());
    rig.put_pod(
        "gpuwatch-b",
        json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [{"name": "gpuwatch", "ready": false, "restartCount": 3, "image": "gpuwatch", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}],
        }),
    );
    rig.api.forbid("patch", "nodes/status");
    rig.api.forbid_in("create", "leases", "gpu-quarantine");
    let config = rig.good_config();
    let out = rig.run(&config, &["--timeout", "1"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", diag(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[1..],
        [
            "FAIL rbac: cannot patch nodes/status (cluster)",
            "FAIL rbac: cannot create leases.coordination.k8s.io (namespace gpu-quarantine)",
            "FAIL pods: 1 of 2 gpuwatch pod(s) in namespace gpuwatch matching app.kubernetes.io/name=gpuwatch not Ready after 1s",
            "FAIL pods: gpuwatch-b on node node-gpuwatch-b: container gpuwatch waiting: CrashLoopBackOff (last exit: OOMKilled, exit code 137)",
            "check-install: FAILED (rbac, pods)",
        ],
        "{}",
        diag(&out)
    );
    assert!(lines[0].starts_with("PASS config: "));
}

/// No pod matches: the "no node matched" text; exit 1, or 0 with
/// `--allow-no-pods`.
#[test]
fn check_install_without_pods_fails_unless_allowed() {
    let rig = Rig::new();
    let config = rig.good_config();
    let text = format!(
        "no gpuwatch pod in {NS} matches {SELECTOR}: no node matched the DaemonSet's node affinity; `kubectl -n {NS} get ds` shows DESIRED 0"
    );
    let out = rig.run(&config, &["--timeout", "0"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", diag(&out));
    assert!(
        stdout(&out).contains(&format!(
            "\nFAIL pods: {text}\ncheck-install: FAILED (pods)\n"
        )),
        "{}",
        diag(&out)
    );
    let out = rig.run(&config, &["--timeout", "0", "--allow-no-pods"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", diag(&out));
    assert!(
        stdout(&out).contains(&format!(
            "\nPASS pods: {text} (allowed by --allow-no-pods)\ncheck-install: passed\n"
        )),
        "{}",
        diag(&out)
    );
}

/// A config that does not load: FAIL config naming its problems; the API
/// checks still run, through the kubeconfig, in the default scopes (Leases
/// in the kubeconfig context's namespace, as the agent would use), and say
/// so; exit 1.
#[test]
fn check_install_with_a_bad_config_fails_it_and_checks_rbac_with_defaults() {
    let rig = Rig::new();
    rig.put_pod("gpuwatch-a", ready());
    let config = rig.config("event_namespace = \"Not_A_Namespace\"\nbogus = 1");
    let kubeconfig = rig.dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {}\ncontexts:\n- name: double\n  context:\n    cluster: double\n    user: test\n    namespace: from-kubeconfig\ncurrent-context: double\nusers:\n- name: test\n  user: {{}}\n",
            rig.api.url
        ),
    )
    .expect("write kubeconfig");
    rig.api.forbid_in("delete", "leases", "from-kubeconfig");
    let out = rig.run(&config, &["--timeout", "5"], &[("KUBECONFIG", &kubeconfig)]);
    assert_eq!(out.status.code(), Some(1), "{}", diag(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{}", diag(&out));
    let shown = config.display().to_string();
    assert!(
        lines[0].starts_with(&format!(
            "FAIL config: {shown}: 2 configuration problem(s): "
        )),
        "{}",
        lines[0]
    );
    for problem in ["key `kube.bogus`: unknown field", "\"Not_A_Namespace\""] {
        assert!(lines[0].contains(problem), "{problem} not in {}", lines[0]);
    }
    assert_eq!(
        lines[1..],
        [
            "FAIL rbac: cannot delete leases.coordination.k8s.io (namespace from-kubeconfig) [the config did not load: default [kube] scopes]",
            "PASS pods: 1 gpuwatch pod(s) in namespace gpuwatch matching app.kubernetes.io/name=gpuwatch are Ready",
            "check-install: FAILED (config, rbac)",
        ]
    );
}

/// Nothing listens at `api_server_url`: a FAIL line per API check naming
/// the refused connection, exit 1, no panic.
#[test]
fn check_install_against_an_unreachable_api_server_fails_cleanly() {
    let rig = Rig::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let config = rig.config(&format!(
        "api_server_url = \"http://127.0.0.1:{port}\"\nrequest_timeout_secs = 2"
    ));
    let out = rig.run(&config, &["--timeout", "1"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", diag(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{}", diag(&out));
    assert!(
        lines[1].starts_with(
            "FAIL rbac: cannot ask the API server whether it may get nodes (cluster): "
        ) && lines[1].contains("Connection refused"),
        "{}",
        diag(&out)
    );
    assert!(
        lines[2].starts_with(&format!(
            "FAIL pods: cannot list the pods in namespace {NS} ({SELECTOR}): "
        )) && lines[2].contains("Connection refused"),
        "{}",
        diag(&out)
    );
    assert_eq!(lines[3], "check-install: FAILED (rbac, pods)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
