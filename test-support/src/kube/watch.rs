//! Watch streams, for any resource kind: the open watchers of one kind and the
//! streamed response (JSON lines, one watch event each, ended by the server at
//! `timeoutSeconds`).

use axum::body::{Body, Bytes};
use axum::response::Response;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::mpsc;

struct Watcher {
    tx: mpsc::UnboundedSender<Value>,
    bookmarks: bool,
    /// The watch's field selector (kinds that filter their events by it).
    selector: String,
}

/// The open watches of one resource kind.
#[derive(Default)]
pub(super) struct Watchers(Vec<Watcher>);

impl Watchers {
    /// A new watch; BOOKMARK events only when the client asked for them
    /// (`allowWatchBookmarks`).
    pub(super) fn add(&mut self, tx: mpsc::UnboundedSender<Value>, q: &BTreeMap<String, String>) {
        self.add_selected(tx, q, "");
    }

    /// A new watch with its field selector, for [`Watchers::send_if`].
    pub(super) fn add_selected(
        &mut self,
        tx: mpsc::UnboundedSender<Value>,
        q: &BTreeMap<String, String>,
        selector: &str,
    ) {
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
        self.0.push(Watcher {
            tx,
            bookmarks,
            selector: selector.to_owned(),
        });
    }

    /// Sends a watch event to the open watches whose selector `matches`.
    pub(super) fn send_if(&mut self, ev: &Value, matches: impl Fn(&str) -> bool) {
        self.0
            .retain(|w| !matches(&w.selector) || w.tx.send(ev.clone()).is_ok());
    }

    /// Sends a watch event to every open watch; closed ones are dropped.
    pub(super) fn send(&mut self, ev: &Value) {
        self.0.retain(|w| w.tx.send(ev.clone()).is_ok());
    }

    /// Sends a BOOKMARK event to the watches that asked for bookmarks.
    pub(super) fn bookmark(&mut self, ev: &Value) {
        self.0
            .retain(|w| !w.bookmarks || w.tx.send(ev.clone()).is_ok());
    }

    /// Ends every open watch, after a last event when there is one (an ERROR).
    pub(super) fn end_all(&mut self, last: Option<&Value>) {
        for w in self.0.drain(..) {
            if let Some(ev) = last {
                let _ = w.tx.send(ev.clone());
            }
        }
    }

    /// How many watches are still open.
    pub(super) fn open(&mut self) -> usize {
        self.0.retain(|w| !w.tx.is_closed());
        self.0.len()
    }
}

/// The 200 response streaming what `rx` receives until `timeoutSeconds` (30
/// minutes when not given). The server ends the watch at `timeoutSeconds` by
/// closing the body (apiserver `pkg/endpoints/handlers/watch.go`,
/// `serveWatch`).
pub(super) fn response(
    rx: mpsc::UnboundedReceiver<Value>,
    q: &BTreeMap<String, String>,
) -> Response {
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let deadline = tokio::time::Instant::now() + timeout;
    let stream = futures::stream::unfold(rx, move |mut rx| async move {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(v)) => Some((
                Ok::<_, std::convert::Infallible>(Bytes::from(format!("{v}\n"))),
                rx,
            )),
            _ => None,
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .expect("static response parts")
}
