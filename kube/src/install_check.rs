//! `gpuwatch check-install` (what the chart's `helm test` Pod runs, as the
//! agent's service account): proves an install works on its cluster with
//! three checks, each run whatever the others found:
//!
//! 1. **config** — the configuration file loads (the caller checks it and
//!    hands over the verdict; when it does not load, the API checks use the
//!    built-in `[kube]` defaults and their lines say so);
//! 2. **rbac** — one SelfSubjectAccessReview (which every authenticated user
//!    may create, `system:basic-user`) per entry of [`WRITER_REQUESTS`], in
//!    the scope the agent makes it in ([`Scope`]): every denied request is
//!    named;
//! 3. **pods** — the agent's pods (a namespaced list by the DaemonSet's label
//!    selector, which the agent's `list pods` grant allows) become Ready
//!    within the timeout; the ones that do not are named with why; none at
//!    all means no node matched the DaemonSet's node selection, a failure
//!    unless allowed.
//!
//! An API server that cannot be reached is a FAIL line naming why, never a
//! panic.

use super::backend::ApiError;
use super::client::build_client;
use super::settings::KubeSettings;
use super::{ApiRequest, KubeError, Scope, WRITER_REQUESTS, quarantine_namespace};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, ListParams, PostParams};
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

/// Pause between two lists of the agent's pods while some are not Ready.
const POD_POLL: Duration = Duration::from_secs(2);

/// What `gpuwatch check-install` checks.
#[derive(Debug, Clone)]
pub struct InstallCheck {
    /// The configuration file, as the config line names it.
    pub config_file: String,
    /// Why the file did not load (every problem); `None` when it loaded.
    pub config_problem: Option<String>,
    /// The `[kube]` settings the API checks use (API server, Event and
    /// quarantine namespaces): the file's, or the built-in defaults when it
    /// did not load.
    pub settings: KubeSettings,
    /// Namespace of the agent's pods.
    pub namespace: String,
    /// Label selector of the agent's pods (its DaemonSet's).
    pub selector: String,
    /// How long the pods may take to be Ready.
    pub timeout: Duration,
    /// No pod at all passes (no node matches the DaemonSet's node selection
    /// yet); without it, that fails.
    pub allow_no_pods: bool,
}

/// One line of the report: `PASS config: /etc/gpuwatch/gpuwatch.toml`,
/// `FAIL rbac: cannot patch nodes/status (cluster)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckLine {
    /// `config`, `rbac` or `pods`.
    pub check: &'static str,
    /// Whether this line is a pass.
    pub passed: bool,
    /// What was found.
    pub text: String,
}

impl CheckLine {
    fn pass(check: &'static str, text: impl Into<String>) -> CheckLine {
        CheckLine {
            check,
            passed: true,
            text: text.into(),
        }
    }

    fn fail(check: &'static str, text: impl Into<String>) -> CheckLine {
        CheckLine {
            check,
            passed: false,
            text: text.into(),
        }
    }
}

impl fmt::Display for CheckLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed { "PASS" } else { "FAIL" };
        write!(f, "{verdict} {}: {}", self.check, self.text)
    }
}

/// Every line of the three checks, in order; shown with a final verdict line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// One line per finding.
    pub lines: Vec<CheckLine>,
}

impl InstallReport {
    /// Whether every check passed (the command's exit status is 0 only then).
    pub fn passed(&self) -> bool {
        self.lines.iter().all(|l| l.passed)
    }

    /// The checks with at least one FAIL line, in report order.
    pub fn failed_checks(&self) -> Vec<&'static str> {
        let mut failed = Vec::new();
        for l in self.lines.iter().filter(|l| !l.passed) {
            if !failed.contains(&l.check) {
                failed.push(l.check);
            }
        }
        failed
    }

    /// The final line: `check-install: passed` or `check-install: FAILED
    /// (rbac, pods)`.
    pub fn verdict(&self) -> String {
        if self.passed() {
            "check-install: passed".to_owned()
        } else {
            format!(
                "check-install: FAILED ({})",
                self.failed_checks().join(", ")
            )
        }
    }
}

impl fmt::Display for InstallReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in &self.lines {
            writeln!(f, "{l}")?;
        }
        writeln!(f, "{}", self.verdict())
    }
}

/// Why an API check could not be made.
#[derive(Debug, thiserror::Error)]
enum CheckError {
    /// No client: no credentials, a bad `api_server_url`.
    #[error("no Kubernetes client: {}", chain(.0))]
    Client(#[source] KubeError),
    /// A SelfSubjectAccessReview went unanswered or was refused.
    #[error("cannot ask the API server whether it may {request}: {source}")]
    Review {
        /// The request asked about, as the lines name it.
        request: String,
        /// What the API (or the connection) said.
        #[source]
        source: ApiError,
    },
    /// The pod list went unanswered or was refused.
    #[error("cannot list the pods in namespace {namespace} ({selector}): {source}")]
    List {
        /// The namespace listed.
        namespace: String,
        /// The label selector.
        selector: String,
        /// What the API (or the connection) said.
        #[source]
        source: ApiError,
    },
}

/// `e` and its sources, `: `-separated; a source whose text is already
/// shown (many errors quote their source) is left out.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// Awaits an API call for at most `timeout`. An answer of the API server is
/// classified as the writer classifies it; a failure to get one keeps its
/// whole cause (`client error (Connect): tcp connect error: Connection
/// refused`), which is what the person running the check needs.
async fn call<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e @ kube::Error::Api(_))) => Err(ApiError::from_kube(e)),
        Ok(Err(e)) => Err(ApiError::Transient(chain(&e))),
        Err(_) => Err(ApiError::Transient(format!(
            "no answer within {}s",
            timeout.as_secs_f64()
        ))),
    }
}

/// Runs the three checks of `check` (module doc). Never fails: what could
/// not be checked is a FAIL line.
pub async fn check_install(check: &InstallCheck) -> InstallReport {
    let mut lines = vec![match &check.config_problem {
        None => CheckLine::pass("config", &check.config_file),
        Some(problem) => CheckLine::fail("config", one_line(problem)),
    }];
    match build_client(&check.settings.api).await {
        Ok(client) => {
            lines.extend(access(&client, check).await);
            lines.extend(pods(&client, check).await);
        }
        Err(e) => {
            let e = CheckError::Client(e).to_string();
            lines.push(CheckLine::fail("rbac", format!("{e}{}", fallback(check))));
            lines.push(CheckLine::fail("pods", e));
        }
    }
    InstallReport { lines }
}

/// A multi-line text (a config file's problems) on one line: `; ` between
/// lines, a space after a line that introduces the next (ends in `:`).
fn one_line(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
        }
        out.push_str(line);
    }
    out
}

/// What the RBAC lines add when the scopes are the defaults.
fn fallback(check: &InstallCheck) -> &'static str {
    if check.config_problem.is_some() {
        " [the config did not load: default [kube] scopes]"
    } else {
        ""
    }
}

/// `leases.coordination.k8s.io`, `nodes/status`: how kubectl names a resource.
fn qualified(r: &ApiRequest) -> String {
    if r.group.is_empty() {
        r.resource.to_owned()
    } else {
        let (base, sub) = r.resource.split_once('/').unwrap_or((r.resource, ""));
        let sub = if sub.is_empty() {
            String::new()
        } else {
            format!("/{sub}")
        };
        format!("{base}.{}{sub}", r.group)
    }
}

/// The scope text of a line: `cluster` or `namespace NS`.
fn scope_text(namespace: Option<&str>) -> String {
    namespace.map_or_else(|| "cluster".to_owned(), |ns| format!("namespace {ns}"))
}

/// The RBAC check: one access review per request the agent makes.
async fn access(client: &kube::Client, check: &InstallCheck) -> Vec<CheckLine> {
    let settings = &check.settings;
    let events = settings.events.namespace.clone();
    let leases = quarantine_namespace(settings, Some(client));
    let mut lines = Vec::new();
    // Allowed requests by scope, for the pass line.
    let mut allowed: Vec<(String, Vec<String>)> = Vec::new();
    for r in &WRITER_REQUESTS {
        let namespace = match r.scope {
            Scope::Cluster => None,
            Scope::EventNamespace => Some(events.as_str()),
            Scope::QuarantineNamespace => Some(leases.as_str()),
        };
        let scope = scope_text(namespace);
        let what = format!("{} {}", r.verb, qualified(r));
        match review(client, settings.api.request_timeout, r, namespace).await {
            Ok(Decision { allowed: true, .. }) => {
                match allowed.iter_mut().find(|(s, _)| *s == scope) {
                    Some((_, resources)) => {
                        if !resources.contains(&qualified(r)) {
                            resources.push(qualified(r));
                        }
                    }
                    None => allowed.push((scope, vec![qualified(r)])),
                }
            }
            Ok(Decision { reason, .. }) => {
                let reason = if reason.is_empty() {
                    String::new()
                } else {
                    format!(": {reason}")
                };
                lines.push(CheckLine::fail(
                    "rbac",
                    format!("cannot {what} ({scope}){reason}{}", fallback(check)),
                ));
            }
            Err(source) => {
                // The server does not answer reviews: asking the others would
                // only repeat it.
                let e = CheckError::Review {
                    request: format!("{what} ({scope})"),
                    source,
                };
                lines.push(CheckLine::fail("rbac", format!("{e}{}", fallback(check))));
                return lines;
            }
        }
    }
    if lines.is_empty() {
        let scopes: Vec<String> = allowed
            .iter()
            .map(|(scope, resources)| format!("{scope}: {}", resources.join(", ")))
            .collect();
        lines.push(CheckLine::pass(
            "rbac",
            format!(
                "all {} requests the agent makes are allowed ({}){}",
                WRITER_REQUESTS.len(),
                scopes.join("; "),
                fallback(check)
            ),
        ));
    }
    lines
}

/// An access review's answer.
struct Decision {
    allowed: bool,
    /// The authorizer's reason (RBAC gives none for a request no rule
    /// allows), or its evaluation error.
    reason: String,
}

/// One SelfSubjectAccessReview of `r` in `namespace` (`None`: the cluster
/// scope). The resource and its subresource go apart, as the authorizer
/// takes them.
async fn review(
    client: &kube::Client,
    timeout: Duration,
    r: &ApiRequest,
    namespace: Option<&str>,
) -> Result<Decision, ApiError> {
    let (resource, subresource) = match r.resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(sub.to_owned())),
        None => (r.resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(r.verb.to_owned()),
                group: Some(r.group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                namespace: namespace.map(str::to_owned),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = call(timeout, api.create(&PostParams::default(), &review)).await?;
    let status = answer.status.unwrap_or_default();
    let reason = match (status.reason, status.evaluation_error) {
        (Some(r), Some(e)) if !r.is_empty() && !e.is_empty() => format!("{r} ({e})"),
        (Some(r), _) if !r.is_empty() => r,
        (_, Some(e)) => e,
        _ => String::new(),
    };
    Ok(Decision {
        allowed: status.allowed,
        reason,
    })
}

/// Whether another list could answer differently: a refusal (403, 404, a
/// bad selector) will not change within the timeout.
fn worth_retrying(e: &ApiError) -> bool {
    !matches!(
        e,
        ApiError::Forbidden(_) | ApiError::NotFound(_) | ApiError::Rejected(_)
    )
}

/// The pods check: lists the agent's pods until every one is Ready or the
/// timeout passes, then names the ones that are not (or says there are none).
async fn pods(client: &kube::Client, check: &InstallCheck) -> Vec<CheckLine> {
    let (ns, sel) = (&check.namespace, &check.selector);
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = ListParams::default().labels(sel);
    let deadline = Instant::now() + check.timeout;
    loop {
        let listed = call(check.settings.api.request_timeout, api.list(&params)).await;
        let now = Instant::now();
        match listed {
            Ok(list) => {
                let pods = list.items;
                let waiting: Vec<(&Pod, String)> = pods
                    .iter()
                    .filter_map(|p| not_ready(p).map(|why| (p, why)))
                    .collect();
                if !pods.is_empty() && waiting.is_empty() {
                    return vec![CheckLine::pass(
                        "pods",
                        format!(
                            "{} gpuwatch pod(s) in namespace {ns} matching {sel} are Ready",
                            pods.len()
                        ),
                    )];
                }
                if now >= deadline {
                    return if pods.is_empty() {
                        vec![no_pods(check)]
                    } else {
                        unready_lines(check, pods.len(), &waiting)
                    };
                }
            }
            Err(source) if !worth_retrying(&source) || now >= deadline => {
                let e = CheckError::List {
                    namespace: ns.clone(),
                    selector: sel.clone(),
                    source,
                };
                return vec![CheckLine::fail("pods", e.to_string())];
            }
            Err(e) => tracing::debug!(error = %e, "Listing the gpuwatch pods failed; retrying."),
        }
        tokio::time::sleep(POD_POLL.min(deadline.saturating_duration_since(now))).await;
    }
}

/// The agent's container in its pod, standalone and beside dcgm-exporter.
const AGENT_CONTAINER: &str = "gpuwatch";

/// No pod matches: no node matched the DaemonSet's node selection (the test
/// Pod may not read DaemonSets, so it points at the command that shows it).
fn no_pods(check: &InstallCheck) -> CheckLine {
    let (ns, sel) = (&check.namespace, &check.selector);
    let text = format!(
        "no gpuwatch pod in {ns} matches {sel}: no node matched the DaemonSet's node affinity; `kubectl -n {ns} get ds` shows DESIRED 0"
    );
    if check.allow_no_pods {
        CheckLine::pass("pods", format!("{text} (allowed by --allow-no-pods)"))
    } else {
        CheckLine::fail("pods", text)
    }
}

/// One line with the count, then one per pod that is not Ready.
fn unready_lines(check: &InstallCheck, total: usize, waiting: &[(&Pod, String)]) -> Vec<CheckLine> {
    let mut lines = vec![CheckLine::fail(
        "pods",
        format!(
            "{} of {total} gpuwatch pod(s) in namespace {} matching {} not Ready after {:?}",
            waiting.len(),
            check.namespace,
            check.selector,
            check.timeout
        ),
    )];
    for (pod, why) in waiting {
        let name = pod.metadata.name.as_deref().unwrap_or("?");
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .map_or_else(String::new, |n| format!(" on node {n}"));
        lines.push(CheckLine::fail("pods", format!("{name}{node}: {why}")));
    }
    lines
}

/// Why `pod` is not Ready; `None` when it is (its `Ready` condition is True
/// and it is not being deleted). The most telling first: not scheduled, a
/// container (init containers first) waiting or stopped, a running container
/// not ready, the Ready condition's message, the phase.
fn not_ready(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("terminating".to_owned());
    }
    // Beside dcgm-exporter the selector picks the GPU Operator's pods, which are Ready
    // with or without the sidecar: a pod without gpuwatch's container runs no agent.
    let has_agent = pod
        .spec
        .as_ref()
        .is_some_and(|s| s.containers.iter().any(|c| c.name == AGENT_CONTAINER));
    if !has_agent {
        return Some(format!(
            "no {AGENT_CONTAINER} container (beside dcgm-exporter: the partial DaemonSet is not applied to this pod)"
        ));
    }
    let status = pod.status.as_ref();
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let condition = |t: &str| conditions.iter().find(|c| c.type_ == t);
    if condition("Ready").is_some_and(|c| c.status == "True") {
        return None;
    }
    if let Some(c) = condition("PodScheduled").filter(|c| c.status == "False") {
        return Some(format!(
            "not scheduled: {}{}",
            c.reason.as_deref().unwrap_or("Unschedulable"),
            c.message
                .as_deref()
                .map_or_else(String::new, |m| format!(" ({m})"))
        ));
    }
    let init = status
        .and_then(|s| s.init_container_statuses.as_deref())
        .unwrap_or(&[]);
    let main = status
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or(&[]);
    let stuck = init
        .iter()
        .filter(|c| !init_done(c))
        .map(|c| ("init container", c))
        .chain(main.iter().filter(|c| !c.ready).map(|c| ("container", c)));
    for (kind, c) in stuck {
        if let Some(why) = container_state(c) {
            return Some(format!("{kind} {} {why}", c.name));
        }
    }
    if let Some(c) = condition("Ready") {
        let reason = c.reason.as_deref().unwrap_or("NotReady");
        return Some(match c.message.as_deref() {
            Some(m) if !m.is_empty() => format!("{reason}: {m}"),
            _ => reason.to_owned(),
        });
    }
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Unknown");
    Some(format!("no Ready condition yet (phase {phase})"))
}

/// An init container that ran to completion.
fn init_done(c: &ContainerStatus) -> bool {
    c.state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0)
}

/// What a container that is not ready is doing: `waiting: CrashLoopBackOff
/// (last exit: Error, exit code 1)`, `terminated: OOMKilled (exit code
/// 137)`, `running, not ready (its readiness probe fails)`.
fn container_state(c: &ContainerStatus) -> Option<String> {
    let state = c.state.as_ref()?;
    if let Some(w) = &state.waiting {
        let reason = w.reason.as_deref().unwrap_or("Waiting");
        let last = c
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| {
                format!(
                    " (last exit: {}, exit code {})",
                    t.reason.as_deref().unwrap_or("terminated"),
                    t.exit_code
                )
            });
        let detail = match (last, w.message.as_deref()) {
            (Some(last), _) => last,
            (None, Some(m)) if !m.is_empty() => format!(": {m}"),
            _ => String::new(),
        };
        return Some(format!("waiting: {reason}{detail}"));
    }
    if let Some(t) = &state.terminated {
        return Some(format!(
            "terminated: {} (exit code {})",
            t.reason.as_deref().unwrap_or("Terminated"),
            t.exit_code
        ));
    }
    state
        .running
        .as_ref()
        .map(|_| "running, not ready (its readiness probe fails)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "gpuwatch-x", "namespace": "gpuwatch"},
            "spec": {"nodeName": "gpu-1", "containers": [{"name": "gpuwatch"}]},
            "status": status,
        }))
        .expect("pod")
    }

    /// A Ready pod that runs no gpuwatch container (a dcgm-exporter pod the sidecar was
    /// never applied to) runs no agent.
    #[test]
    fn a_ready_pod_without_the_agent_container_is_not_an_agent() {
        let mut p = pod(json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }));
        if let Some(spec) = p.spec.as_mut() {
            spec.containers[0].name = "nvidia-dcgm-exporter".into();
        }
        assert_eq!(
            not_ready(&p).as_deref(),
            Some(
                "no gpuwatch container (beside dcgm-exporter: the partial DaemonSet is not applied to this pod)"
            )
        );
    }

    /// The reasons kubectl shows in its STATUS column, each worded here.
    #[test]
    fn a_pod_that_is_not_ready_says_why() {
        assert_eq!(
            not_ready(&pod(json!({
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
            }))),
            None
        );
        let crash = pod(json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                "message": "containers with unready status: [gpuwatch]"}],
            "containerStatuses": [{"name": "gpuwatch", "ready": false, "restartCount": 4, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s restarting failed container"}},
                "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}],
        }));
        assert_eq!(
            not_ready(&crash).as_deref(),
            Some("container gpuwatch waiting: CrashLoopBackOff (last exit: Error, exit code 1)")
        );
        let creating = pod(json!({
            "phase": "Pending",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [{"name": "gpuwatch", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ContainerCreating"}}}],
        }));
        assert_eq!(
            not_ready(&creating).as_deref(),
            Some("container gpuwatch waiting: ContainerCreating")
        );
        let init = pod(json!({
            "phase": "Pending",
            "initContainerStatuses": [{"name": "validate", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"terminated": {"reason": "Error", "exitCode": 1}}}],
            "containerStatuses": [{"name": "gpuwatch", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "PodInitializing"}}}],
        }));
        assert_eq!(
            not_ready(&init).as_deref(),
            Some("init container validate terminated: Error (exit code 1)")
        );
        let probe = pod(json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [{"name": "gpuwatch", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"running": {}}}],
        }));
        assert_eq!(
            not_ready(&probe).as_deref(),
            Some("container gpuwatch running, not ready (its readiness probe fails)")
        );
        let unschedulable = pod(json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient memory."}],
        }));
        assert_eq!(
            not_ready(&unschedulable).as_deref(),
            Some("not scheduled: Unschedulable (0/3 nodes are available: 3 Insufficient memory.)")
        );
        let gated = pod(json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady",
                "message": "corresponding condition of pod readiness gate \"x\" does not exist."}],
            "containerStatuses": [{"name": "gpuwatch", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"running": {}}}],
        }));
        assert_eq!(
            not_ready(&gated).as_deref(),
            Some(
                "ReadinessGatesNotReady: corresponding condition of pod readiness gate \"x\" does not exist."
            )
        );
        assert_eq!(
            not_ready(&pod(json!({"phase": "Pending"}))).as_deref(),
            Some("no Ready condition yet (phase Pending)")
        );
    }

    #[test]
    fn lines_name_resources_as_kubectl_does() {
        let status = WRITER_REQUESTS
            .iter()
            .find(|r| r.resource == "nodes/status")
            .expect("patch nodes/status is declared");
        assert_eq!(qualified(status), "nodes/status");
        let lease = WRITER_REQUESTS
            .iter()
            .find(|r| r.resource == "leases")
            .expect("leases are declared");
        assert_eq!(qualified(lease), "leases.coordination.k8s.io");
        assert_eq!(scope_text(None), "cluster");
        assert_eq!(scope_text(Some("gpuwatch")), "namespace gpuwatch");
        assert_eq!(
            one_line("a.toml: 2 problems:\n  a.toml:1:1: x\n  a.toml:2:1: y\n"),
            "a.toml: 2 problems: a.toml:1:1: x; a.toml:2:1: y"
        );
    }
}
