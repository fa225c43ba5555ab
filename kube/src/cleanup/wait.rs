//! Waiting for the agents' pods to be gone before the cleanup starts: an
//! agent still terminating (its grace period runs after `helm uninstall`
//! deleted the DaemonSet) would put back what the cleanup removed.

use crate::backend::{ApiError, timed};
use gpuwatch_core::names::is_dns_label;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use std::time::Duration;
use tokio::time::Instant;

/// Which pods to wait for, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodWait {
    /// The pods' namespace.
    pub namespace: String,
    /// Label selector of the pods (as `kubectl get pods -l` takes it).
    pub selector: String,
    /// How long to wait at most; the cleanup starts then, pods or not.
    pub timeout: Duration,
    /// Pause between two lists.
    pub poll: Duration,
}

/// Pause between two pod lists of a wait given on the command line.
const DEFAULT_POLL: Duration = Duration::from_secs(2);

impl PodWait {
    /// Reads `NAMESPACE/LABELSELECTOR` (`gpuwatch/app.kubernetes.io/name=gpuwatch`:
    /// the namespace ends at the first `/`, since a namespace has none).
    pub fn parse(spec: &str, timeout: Duration) -> Result<PodWait, String> {
        let Some((namespace, selector)) = spec.split_once('/') else {
            return Err(format!(
                "{spec:?} is not NAMESPACE/LABELSELECTOR (e.g. gpuwatch/app.kubernetes.io/name=gpuwatch)"
            ));
        };
        if !is_dns_label(namespace) {
            return Err(format!(
                "{namespace:?} in {spec:?} is not a namespace name (lowercase letters, digits and '-', at most 63, starting and ending with a letter or digit)"
            ));
        }
        if selector.trim().is_empty() {
            return Err(format!(
                "{spec:?} has no label selector after the namespace: waiting for every pod of {namespace:?} is not what an uninstall means"
            ));
        }
        Ok(PodWait {
            namespace: namespace.to_owned(),
            selector: selector.to_owned(),
            timeout,
            poll: DEFAULT_POLL,
        })
    }
}

/// How the wait ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOutcome {
    /// No pod matched (any more), after this long.
    Gone(Duration),
    /// The timeout passed with these pods (`namespace/name`) still listed,
    /// or, when the last lists failed, with `error` (transient: the pods may
    /// or may not be gone).
    TimedOut {
        /// The pods the last successful list showed.
        pods: Vec<String>,
        /// The last list's failure, when it failed.
        error: Option<String>,
    },
    /// Listing the pods failed for good (403: the hook's role does not
    /// grant `list pods`; 400: a bad selector): not waited.
    Failed(String),
}

/// Lists the pods `wait` names every `wait.poll` until none is left or
/// `wait.timeout` passed (no request outlives it: each is cut at the
/// deadline). A transient failure of a list is retried at the next poll.
pub(crate) async fn wait_for_pods(
    client: kube::Client,
    wait: &PodWait,
    request_timeout: Duration,
) -> WaitOutcome {
    let pods: Api<Pod> = Api::namespaced(client, &wait.namespace);
    let lp = ListParams::default().labels(&wait.selector);
    let start = Instant::now();
    let deadline = start + wait.timeout;
    let mut last: Vec<String> = Vec::new();
    let mut error: Option<String> = None;
    tracing::info!(
        namespace = %wait.namespace,
        selector = %wait.selector,
        timeout_s = wait.timeout.as_secs_f64(),
        "Waiting for the agents' pods to be gone."
    );
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match timed(left.min(request_timeout), pods.list_metadata(&lp)).await {
            Ok(list) if list.items.is_empty() => {
                let waited = start.elapsed();
                tracing::info!(
                    waited_s = waited.as_secs_f64(),
                    "No agent pod left; cleaning up."
                );
                return WaitOutcome::Gone(waited);
            }
            Ok(list) => {
                error = None;
                last = list
                    .items
                    .iter()
                    .map(|p| {
                        let ns = p.metadata.namespace.as_deref().unwrap_or(&wait.namespace);
                        format!("{ns}/{}", p.metadata.name.as_deref().unwrap_or_default())
                    })
                    .collect();
                tracing::info!(pods = %names(&last), "Agent pods still there; waiting.");
            }
            Err(e) if e.is_transient() => {
                tracing::info!(error = %e, "Listing the agent pods failed; trying again.");
                error = Some(e.to_string());
            }
            Err(e) => {
                let reason = listing_failed(&wait.namespace, &e);
                tracing::warn!("{reason}; cleaning up without waiting.");
                return WaitOutcome::Failed(reason);
            }
        }
        tokio::time::sleep_until((Instant::now() + wait.poll).min(deadline)).await;
    }
    match &error {
        Some(e) => tracing::warn!(
            timeout_s = wait.timeout.as_secs_f64(),
            error = %e,
            pods = %names(&last),
            "Could not tell whether the agent pods are gone before the timeout; cleaning up anyway: an agent still running may put its taints and conditions back."
        ),
        None => tracing::warn!(
            timeout_s = wait.timeout.as_secs_f64(),
            pods = %names(&last),
            "Agent pods still there at the timeout; cleaning up anyway: an agent still running may put its taints and conditions back."
        ),
    }
    WaitOutcome::TimedOut { pods: last, error }
}

fn listing_failed(namespace: &str, e: &ApiError) -> String {
    format!("listing the agent pods in namespace {namespace:?} failed: {e}")
}

/// The first pods of `all` for a log line (a whole fleet's would be 5,000).
fn names(all: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut s = all
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if all.len() > SHOWN {
        s.push_str(&format!(" and {} more", all.len() - SHOWN));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_a_namespace_then_a_selector() {
        let w = PodWait::parse(
            "gpuwatch/app.kubernetes.io/name=gpuwatch",
            Duration::from_secs(120),
        )
        .unwrap();
        assert_eq!(w.namespace, "gpuwatch");
        assert_eq!(w.selector, "app.kubernetes.io/name=gpuwatch");
        assert_eq!(w.poll, DEFAULT_POLL);
        for (bad, says) in [
            ("gpuwatch", "not NAMESPACE/LABELSELECTOR"),
            ("/app=gpuwatch", "not a namespace name"),
            ("GPUWatch/app=gpuwatch", "not a namespace name"),
            ("-x/app=gpuwatch", "not a namespace name"),
            ("gpuwatch/", "no label selector"),
            ("gpuwatch/  ", "no label selector"),
        ] {
            let e = PodWait::parse(bad, Duration::from_secs(1)).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_long_pod_list_is_cut_in_the_log() {
        let all: Vec<String> = (0..12).map(|i| format!("gpuwatch/agent-{i}")).collect();
        let s = names(&all);
        assert!(s.starts_with("gpuwatch/agent-0, "), "{s}");
        assert!(s.ends_with("gpuwatch/agent-9 and 2 more"), "{s}");
        assert_eq!(names(&all[..1]), "gpuwatch/agent-0");
    }
}
