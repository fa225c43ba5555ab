//! The watch on our own Node: kube-runtime's `watcher` on the one Node
//! (`fieldSelector=metadata.name=<node>`), forwarding every version to the
//! reconciler as a [`Seen`].
//!
//! The watcher lists, then watches from the list's resourceVersion (the
//! store's current one: the Node's own version is the one it last changed at,
//! on a quiet Node older than what the watch cache still holds, and a watch
//! from it would be 410 Gone at once, every time); it resumes a watch the
//! server ended at `timeoutSeconds` from the last version seen, BOOKMARKs
//! included, and lists again after a 410 Gone.
//!
//! Failures are retried after the task's [`ErrorPolicy`] pause (jittered
//! backoff), applied here by not polling the watcher rather than by its
//! `backoff` adapter, which resets after every item (a relist's included)
//! and ignores `Retry-After`: the backoff resets only when the
//! watch shows the Node change, a 429's `Retry-After` is the least wait, and
//! a 410 for the version just listed is not progress but backs off like an
//! error, so a server that keeps answering it is not asked again in a tight
//! loop.

use super::backend::{ApiError, NodeApi};
use super::retry::ErrorPolicy;
use super::settings::ApiSettings;
use futures::StreamExt;
use gpuwatch_core::Shutdown;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A Node version from the watcher.
#[derive(Debug)]
pub(crate) enum Seen {
    /// A watch event: in order, but possibly behind the writer's own writes.
    Event(Node),
    /// A fresh read (list before watch, relist after 410), and when it was
    /// sent: at least as new as anything written before that instant.
    Read(Node, Instant),
}

/// Keeps the watcher on our Node going (module doc) until shutdown or until
/// the reconciler is gone. Returns at once in dry-run mode.
pub(crate) async fn watch_node(
    api: Arc<dyn NodeApi>,
    tx: mpsc::Sender<Seen>,
    settings: ApiSettings,
    shutdown: Shutdown,
) {
    let Some(mut events) = api.watch_node(settings.watch_timeout_secs) else {
        return;
    };
    let mut errors = ErrorPolicy::new(settings.backoff_initial, settings.backoff_max);
    let mut follow = Follow::new(settings.request_timeout);
    loop {
        let next = tokio::select! {
            () = shutdown.triggered() => return,
            next = events.next() => next,
        };
        let step = match next {
            Some(Ok(event)) => follow.event(event, &tx).await,
            Some(Err(e)) => {
                let gone_at_start = matches!(&e, watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 410);
                if gone_at_start {
                    // The watcher would watch from the same version again;
                    // a new one lists first.
                    match api.watch_node(settings.watch_timeout_secs) {
                        Some(fresh) => events = fresh,
                        None => return,
                    }
                }
                follow.failed(e)
            }
            // The watcher's stream does not end.
            None => return,
        };
        let delay = match step {
            WatchStep::Stop => return,
            WatchStep::Next => continue,
            WatchStep::Progress => {
                errors.reset();
                continue;
            }
            WatchStep::Failed(e) => errors.after(&e),
        };
        tokio::select! {
            () = shutdown.triggered() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// What the loop does after one item from the watcher.
enum WatchStep {
    /// Shutdown, or the reconciler is gone.
    Stop,
    /// Poll again.
    Next,
    /// The watch showed the Node change: the backoff starts over.
    Progress,
    /// Poll again after the error policy's pause for this.
    Failed(ApiError),
}

/// The watcher's items as the reconciler hears them.
struct Follow {
    /// When the watcher last started a list (its `Init`, after which it sends
    /// the request): what the list returns is at least as new as that.
    listing_since: Instant,
    /// The list under way found our Node.
    found: bool,
    /// When the last list ended, while no watch event came since.
    listed_at: Option<Instant>,
    /// A 410 sooner than this after a list, with no watch event between, is
    /// for the version just listed (the watch starts right after the list,
    /// and such an answer comes within a request's time).
    at_once: Duration,
}

impl Follow {
    fn new(at_once: Duration) -> Follow {
        Follow {
            listing_since: Instant::now(),
            found: false,
            listed_at: None,
            at_once,
        }
    }

    /// Forwards what the watcher saw of the Node.
    async fn event(&mut self, event: watcher::Event<Node>, tx: &mpsc::Sender<Seen>) -> WatchStep {
        let seen = match event {
            watcher::Event::Init => {
                self.listing_since = Instant::now();
                self.found = false;
                return WatchStep::Next;
            }
            watcher::Event::InitApply(n) => {
                self.found = true;
                Seen::Read(n, self.listing_since)
            }
            watcher::Event::InitDone => {
                if !self.found {
                    tracing::warn!("Own Node not found; watching for it.");
                }
                self.listed_at = Some(Instant::now());
                return WatchStep::Next;
            }
            watcher::Event::Apply(n) => {
                self.listed_at = None;
                if tx.send(Seen::Event(n)).await.is_err() {
                    return WatchStep::Stop;
                }
                return WatchStep::Progress;
            }
            watcher::Event::Delete(_) => {
                tracing::warn!("Own Node was deleted.");
                return WatchStep::Next;
            }
        };
        match tx.send(seen).await {
            Ok(()) => WatchStep::Next,
            Err(_) => WatchStep::Stop,
        }
    }

    /// Says what failed; a 410 not right after a list is progress (the
    /// watcher lists again at once).
    fn failed(&mut self, e: watcher::Error) -> WatchStep {
        let what = match &e {
            watcher::Error::InitialListFailed(_) => {
                "Cannot read the node to start its watch; retrying."
            }
            watcher::Error::WatchStartFailed(_) => "Cannot watch the node; retrying.",
            watcher::Error::WatchError(_) => "Node watch returned an error.",
            watcher::Error::WatchFailed(_) | watcher::Error::NoResourceVersion => {
                "Node watch stream failed."
            }
        };
        let listing = matches!(e, watcher::Error::InitialListFailed(_));
        let e = match e {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => ApiError::from_kube(e),
            watcher::Error::WatchError(s) => ApiError::from_kube(kube::Error::Api(s)),
            e @ watcher::Error::NoResourceVersion => ApiError::Transient(e.to_string()),
        };
        match e {
            ApiError::Gone(m) if !listing => {
                let just_read = self
                    .listed_at
                    .take()
                    .is_some_and(|t| t.elapsed() < self.at_once);
                if just_read {
                    tracing::warn!(message = %m, "Node watch version expired right after reading the node; backing off.");
                    WatchStep::Failed(ApiError::Gone(m))
                } else {
                    tracing::info!(message = %m, "Node watch version expired; reading the node again.");
                    WatchStep::Progress
                }
            }
            e => {
                tracing::warn!(error = %e, "{what}");
                WatchStep::Failed(e)
            }
        }
    }
}
