//! The watch on our own Node: list, then watch from the version read,
//! forwarding every version to the reconciler as a [`Seen`].

use super::backend::{ApiError, NodeApi, NodeWatch};
use super::retry::Backoff;
use super::settings::ApiSettings;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::WatchEvent;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
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

/// Reads the Node afresh (the list of list-then-watch), forwards it and returns
/// its resourceVersion to watch from.
async fn relist(backend: &dyn NodeApi, tx: &mpsc::Sender<Seen>) -> Result<String, ApiError> {
    let sent = Instant::now();
    let (n, rv) = backend.read_node_to_watch().await?;
    let _ = tx.send(Seen::Read(n, sent)).await;
    Ok(rv)
}

/// Keeps a watch on our Node open, forwarding every version to the reconciler.
///
/// List, then watch from the version read. What the API server does that this
/// follows: a watch ends when the server's `timeoutSeconds` runs out (the
/// stream just closes) and is resumed from the last version seen; BOOKMARK
/// events only move that version; a version the server no longer has answers
/// 410 Gone (as an ERROR event with reason `Expired`, or as the response),
/// after which the Node is read again and watched from the version read. A 410
/// for the version just read is not progress: it backs off like an error, so a
/// server that keeps answering it is not asked again in a tight loop.
pub(crate) async fn watch_node(
    backend: Arc<dyn NodeApi>,
    tx: mpsc::Sender<Seen>,
    api: ApiSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    if backend.is_dry_run() {
        return;
    }
    let mut backoff = Backoff::new(api.backoff_initial, api.backoff_max);
    let mut rv: Option<String> = None;
    // The version in `rv` came from a read, and no watch event moved it since.
    let mut just_read = false;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let mut progressed = false;
        let mut wait = Duration::ZERO;
        let expired = |m: &str, just_read: bool| {
            if just_read {
                tracing::warn!(message = %m, "Node watch version expired right after reading the node; backing off.");
            } else {
                tracing::info!(message = %m, "Node watch version expired; reading the node again.");
            }
            !just_read
        };
        match &rv {
            None => match relist(&*backend, &tx).await {
                // Watched at once; the backoff is kept until the watch shows
                // progress (a 410 right after the read keeps growing it).
                Ok(v) => {
                    rv = Some(v);
                    just_read = true;
                    continue;
                }
                Err(e) => {
                    wait = e.retry_after();
                    tracing::warn!(error = %e, "Cannot read the node to start its watch; retrying.");
                }
            },
            Some(from) => match backend.watch_node(from, api.watch_timeout_secs).await {
                Ok(None) => return,
                Ok(Some(stream)) => {
                    let (end, moved) = follow(stream, &tx, &mut rv, &mut shutdown).await;
                    if moved {
                        just_read = false;
                        progressed = true;
                    }
                    match end {
                        WatchEnd::Stop => return,
                        WatchEnd::Resume => {}
                        WatchEnd::Expired(m) => {
                            progressed |= expired(&m, just_read);
                            rv = None;
                        }
                    }
                }
                Err(ApiError::Gone(m)) => {
                    progressed = expired(&m, just_read);
                    rv = None;
                }
                Err(e) => {
                    wait = e.retry_after();
                    tracing::warn!(error = %e, "Cannot watch the node; retrying.");
                }
            },
        }
        if progressed {
            backoff.reset();
            continue;
        }
        let delay = backoff.next_delay().max(wait);
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// How one watch stream ended.
enum WatchEnd {
    /// Shutdown, or the reconciler is gone.
    Stop,
    /// Closed by the server at its timeout, or failed: watched again from the
    /// last version seen.
    Resume,
    /// 410 Expired: the version is gone; the Node must be read again.
    Expired(String),
}

/// Forwards one watch stream's Nodes to the reconciler, moving `rv` with every
/// event and bookmark, until the stream ends; true with it when an event or
/// bookmark moved the version.
async fn follow(
    mut stream: NodeWatch,
    tx: &mpsc::Sender<Seen>,
    rv: &mut Option<String>,
    shutdown: &mut watch::Receiver<bool>,
) -> (WatchEnd, bool) {
    let mut moved = false;
    loop {
        let item = tokio::select! {
            _ = shutdown.changed() => return (WatchEnd::Stop, moved),
            item = stream.next() => item,
        };
        match item {
            // The server closed the watch at its timeout: resume from the last
            // version (the server replays since).
            None => return (WatchEnd::Resume, moved),
            Some(Ok(WatchEvent::Added(n) | WatchEvent::Modified(n))) => {
                moved = true;
                if let Some(v) = &n.metadata.resource_version {
                    *rv = Some(v.clone());
                }
                if tx.send(Seen::Event(n)).await.is_err() {
                    return (WatchEnd::Stop, moved);
                }
            }
            Some(Ok(WatchEvent::Deleted(_))) => {
                tracing::warn!("Own Node was deleted.");
            }
            Some(Ok(WatchEvent::Bookmark(b))) => {
                moved = true;
                *rv = Some(b.metadata.resource_version);
            }
            Some(Ok(WatchEvent::Error(s))) if s.code == 410 => {
                return (WatchEnd::Expired(s.message), moved);
            }
            Some(Ok(WatchEvent::Error(s))) => {
                tracing::warn!(code = s.code, message = %s.message, "Node watch returned an error.");
                return (WatchEnd::Resume, moved);
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "Node watch stream failed.");
                return (WatchEnd::Resume, moved);
            }
        }
    }
}
