//! The reconciler's side of the budget: tells the claimant whether the Node
//! needs a slot, and gates the desired fault taint on the claimant's status.

use super::Need;
use super::budget::Budget;
use super::protocol::Status;
use crate::metrics::KubeMetrics;
use gpuwatch_proto::QuarantineStatus;
use std::sync::Arc;
use tokio::sync::watch;

/// How long a reconcile pass waits for the claimant to answer a new need (a
/// claim is a list and a create: milliseconds, unless the API server is slow).
pub(crate) const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Event reason while the fault taint is deferred.
pub(crate) const DEFERRED_REASON: &str = "QuarantineBudgetExhausted";
/// Event reason when the budget cannot work and fault taints go on without it.
pub(crate) const UNAVAILABLE_REASON: &str = "QuarantineBudgetUnavailable";

/// What the reconciler should do with the fault taint this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TaintGate {
    /// Write the desired fault taint (or its absence).
    AsDesired,
    /// No fault taint: remove it if the Node carries it.
    Withhold,
    /// Leave the fault taint as the Node carries it (no claim answered yet).
    KeepLive,
}

/// A Warning Event to send: the taint was just deferred, or the budget just
/// became unavailable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notice {
    pub reason: &'static str,
    pub message: String,
}

/// The reconciler's handle on the claimant task.
#[derive(Debug)]
pub(crate) struct Link {
    need: watch::Sender<Need>,
    status: watch::Receiver<Status>,
    budget: Budget,
    /// A deferral was announced (Event sent) and has not ended since.
    announced: bool,
    /// What was last announced of the budget's unavailability (`None`: it
    /// was not, or it ended since).
    unavailable_announced: Option<String>,
    metrics: Arc<KubeMetrics>,
}

impl Link {
    pub(crate) fn new(
        need: watch::Sender<Need>,
        status: watch::Receiver<Status>,
        budget: Budget,
        metrics: Arc<KubeMetrics>,
    ) -> Link {
        Link {
            need,
            status,
            budget,
            announced: false,
            unavailable_announced: None,
            metrics,
        }
    }

    /// A receiver that fires when the claimant's status changes.
    pub(crate) fn status_changes(&mut self) -> &mut watch::Receiver<Status> {
        &mut self.status
    }

    /// One reconcile pass: the Node wants a fault taint (`wanted`, with its
    /// value) and carries one (`live`). Tells the claimant, and says what to
    /// do with the taint and whether a deferral Event is due. A need the
    /// claimant has not answered yet is waited for up to [`CLAIM_WAIT`], so
    /// the conditions and the taint of a new fault land in one pass.
    pub(crate) async fn gate(
        &mut self,
        wanted: Option<&str>,
        live: bool,
        node_uid: &str,
    ) -> (TaintGate, Option<Notice>) {
        let need = self.tell(wanted, live, node_uid);
        if need && matches!(*self.status.borrow(), Status::Idle) {
            let answered = self.status.wait_for(|s| !matches!(s, Status::Idle));
            let _ = tokio::time::timeout(CLAIM_WAIT, answered).await;
        }
        let status = self.status.borrow_and_update().clone();
        self.publish(&status);
        // An idle status that predates this need says nothing yet.
        let permits = match (&status, need) {
            (Status::Idle, true) => None,
            (s, _) => s.permits_taint(),
        };
        let gate = match permits {
            Some(true) => TaintGate::AsDesired,
            Some(false) if wanted.is_none() => TaintGate::AsDesired,
            Some(false) => TaintGate::Withhold,
            None => TaintGate::KeepLive,
        };
        let notice = self
            .track_unavailable(&status)
            .or_else(|| self.track(&status, wanted.is_some()));
        (gate, notice)
    }

    /// Tells the claimant whether the Node needs a slot: while it wants the
    /// fault taint or still carries it (a slot is given back only after the
    /// taint is gone). Returns the need.
    pub(crate) fn tell(&self, wanted: Option<&str>, live: bool, node_uid: &str) -> bool {
        let need = wanted.is_some() || live;
        let next = Need {
            slot: need,
            node_uid: node_uid.to_owned(),
            reason: wanted.unwrap_or_default().to_owned(),
        };
        self.need.send_if_modified(|n| {
            let changed = *n != next;
            if changed {
                *n = next;
            }
            changed
        });
        need
    }

    /// Sets the gauge and announces an unavailable budget (an ERROR line and a
    /// Warning Event): at its start, and
    /// again when a refusal's words change (the startup access check's
    /// verdict, then the API server's own 403 once a claim was refused). The
    /// Event writer folds both into one Event object on the Node.
    fn track_unavailable(&mut self, status: &Status) -> Option<Notice> {
        let Status::Unavailable { refused, message } = status else {
            self.metrics.publish(|s| s.quarantine_unavailable = false);
            self.unavailable_announced = None;
            return None;
        };
        self.metrics.publish(|s| s.quarantine_unavailable = true);
        let again = match &self.unavailable_announced {
            None => true,
            Some(said) => *refused && said != message,
        };
        if !again {
            return None;
        }
        self.unavailable_announced = Some(message.clone());
        tracing::error!("{message}");
        Some(Notice {
            reason: UNAVAILABLE_REASON,
            message: message.clone(),
        })
    }

    /// Counts and announces the start of a deferral; ends it when the Node
    /// holds a slot or needs none.
    fn track(&mut self, status: &Status, wanted: bool) -> Option<Notice> {
        match status {
            Status::Deferred { slots, holders } if wanted => {
                self.metrics.publish(|s| s.quarantine_deferred = true);
                if self.announced {
                    return None;
                }
                self.announced = true;
                self.metrics.count_quarantine_deferral();
                tracing::warn!(slots, holders = %holders.join(","), "Fault taint deferred: the fleet quarantine budget is spent.");
                Some(Notice {
                    reason: DEFERRED_REASON,
                    message: deferral_message(self.budget, *slots, holders),
                })
            }
            Status::Pending | Status::Deferred { .. } if wanted => None,
            _ => {
                self.metrics.publish(|s| s.quarantine_deferred = false);
                self.announced = false;
                None
            }
        }
    }

    fn publish(&self, status: &Status) {
        let q = status_view(self.budget, status);
        self.metrics.publish(|s| {
            s.quarantine_slots = u64::from(q.slots);
            s.quarantine = Some(q);
        });
    }
}

/// The Event text of a deferral.
fn deferral_message(budget: Budget, slots: u32, holders: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut names = holders[..holders.len().min(SHOWN)].join(", ");
    if holders.len() > SHOWN {
        names.push_str(&format!(" and {} more", holders.len() - SHOWN));
    }
    format!(
        "Fault taint deferred: the fleet quarantine budget ({budget}) is spent, {} of {slots} slots held by {names}. \
         The node's conditions report the fault; the fault taint follows as soon as a slot frees. \
         Many nodes deferred at once point to a common cause (driver or kernel update, a configuration change) rather than failing hardware.",
        holders.len()
    )
}

/// `/v1/health.quarantine` for `status`.
pub(crate) fn status_view(budget: Budget, status: &Status) -> QuarantineStatus {
    let mut q = QuarantineStatus {
        budget: budget.to_string(),
        ..QuarantineStatus::default()
    };
    match status {
        Status::Off => {
            q.state = "off".into();
            q.message = "no quarantine budget: the fault taint is not bounded".into();
        }
        Status::Idle => {
            q.state = "idle".into();
            q.message = "no fault taint wanted; no slot held".into();
        }
        Status::Pending => {
            q.state = "pending".into();
            q.message = "claiming a slot; the fault taint is left as it is until then".into();
        }
        Status::Held { slot, slots } => {
            q.state = "held".into();
            q.slot = Some(*slot);
            q.slots = slots.unwrap_or(0);
            q.message = match slots {
                Some(n) => format!("slot {slot} of {n} held: the fault taint may stay"),
                None => format!("slot {slot} held: the fault taint may stay"),
            };
        }
        Status::Deferred { slots, holders } => {
            q.state = "deferred".into();
            q.slots = *slots;
            q.holders.clone_from(holders);
            q.message = format!("taint deferred: budget {} of {slots} held", holders.len());
        }
        Status::Unavailable { refused, message } => {
            q.state = if *refused {
                "unavailable_refused"
            } else {
                "unavailable_no_answer"
            }
            .into();
            q.message.clone_from(message);
        }
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link() -> (
        Link,
        watch::Receiver<Need>,
        watch::Sender<Status>,
        Arc<KubeMetrics>,
    ) {
        let (need_tx, need_rx) = watch::channel(Need::default());
        let (status_tx, status_rx) = watch::channel(Status::Idle);
        let metrics = KubeMetrics::new();
        let l = Link::new(
            need_tx,
            status_rx,
            Budget::parse("10%").unwrap(),
            metrics.clone(),
        );
        (l, need_rx, status_tx, metrics)
    }

    #[tokio::test(start_paused = true)]
    async fn a_taint_on_the_node_is_kept_until_the_claimant_answers() {
        let (mut l, need, _status, _) = link();
        // A restarted agent: the Node carries the taint, the claimant has not
        // stepped yet.
        let (gate, _) = l.gate(Some("inspect_hardware"), true, "uid-1").await;
        assert_eq!(gate, TaintGate::KeepLive);
        assert!(need.borrow().slot);
        assert_eq!(need.borrow().reason, "inspect_hardware");
        assert_eq!(need.borrow().node_uid, "uid-1");
    }

    #[tokio::test]
    async fn a_held_slot_lets_the_taint_be_written() {
        let (mut l, _need, status, metrics) = link();
        status.send_replace(Status::Held {
            slot: 3,
            slots: Some(10),
        });
        assert_eq!(
            l.gate(Some("reset_gpu"), false, "u").await.0,
            TaintGate::AsDesired
        );
        let q = metrics.quarantine().unwrap();
        assert_eq!(q.state, "held");
        assert_eq!(q.slot, Some(3));
        assert_eq!(q.message, "slot 3 of 10 held: the fault taint may stay");
    }

    #[tokio::test]
    async fn a_deferral_withholds_the_taint_and_is_announced_once() {
        let (mut l, _need, status, metrics) = link();
        let holders: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
        status.send_replace(Status::Deferred {
            slots: 10,
            holders: holders.clone(),
        });
        let (gate, d) = l.gate(Some("inspect_hardware"), true, "u").await;
        assert_eq!(gate, TaintGate::Withhold);
        let msg = d.expect("announced").message;
        assert!(msg.contains("10 of 10 slots held by n0, n1"), "{msg}");
        assert!(msg.contains("(10%)"), "{msg}");
        assert!(metrics.status().quarantine_deferred);
        assert_eq!(metrics.quarantine_deferrals(), 1);
        assert_eq!(
            metrics.quarantine().unwrap().message,
            "taint deferred: budget 10 of 10 held"
        );
        // The next passes of the same deferral send nothing.
        assert_eq!(l.gate(Some("inspect_hardware"), false, "u").await.1, None);
        assert_eq!(metrics.quarantine_deferrals(), 1);
        // Once held, the deferral ends; a later one is announced again.
        status.send_replace(Status::Held {
            slot: 1,
            slots: Some(10),
        });
        l.gate(Some("inspect_hardware"), false, "u").await;
        assert!(!metrics.status().quarantine_deferred);
        status.send_replace(Status::Deferred { slots: 10, holders });
        assert!(
            l.gate(Some("inspect_hardware"), false, "u")
                .await
                .1
                .is_some()
        );
        assert_eq!(metrics.quarantine_deferrals(), 2);
    }

    #[tokio::test]
    async fn removing_a_taint_is_never_withheld() {
        let (mut l, need, status, _) = link();
        status.send_replace(Status::Deferred {
            slots: 10,
            holders: vec![],
        });
        // Faults cleared while the Node still carries the taint: remove it.
        assert_eq!(l.gate(None, true, "u").await.0, TaintGate::AsDesired);
        assert!(
            need.borrow().slot,
            "the slot is needed until the taint is gone"
        );
        assert_eq!(l.gate(None, false, "u").await.0, TaintGate::AsDesired);
        assert!(!need.borrow().slot);
    }

    #[tokio::test]
    async fn an_unavailable_budget_lets_the_taint_through_and_says_so_once() {
        let (mut l, _need, status, metrics) = link();
        status.send_replace(Status::Unavailable {
            refused: true,
            message: "Quarantine budget unavailable: forbidden".into(),
        });
        let (gate, notice) = l.gate(Some("inspect_hardware"), false, "u").await;
        assert_eq!(gate, TaintGate::AsDesired, "fails open");
        let n = notice.expect("announced");
        assert_eq!(n.reason, UNAVAILABLE_REASON);
        assert!(n.message.contains("forbidden"), "{}", n.message);
        assert!(metrics.status().quarantine_unavailable);
        let q = metrics.quarantine().unwrap();
        assert_eq!(q.state, "unavailable_refused");
        // Announced once while the words stay the same, whatever the Node
        // needs; again when the API server's own refusal replaces them.
        assert_eq!(l.gate(None, true, "u").await.1, None);
        status.send_replace(Status::Unavailable {
            refused: true,
            message: "Quarantine budget unavailable: 403 Forbidden".into(),
        });
        let again = l.gate(Some("inspect_hardware"), true, "u").await.1;
        assert!(again.is_some_and(|n| n.message.contains("403")));
        assert_eq!(l.gate(Some("inspect_hardware"), true, "u").await.1, None);
        status.send_replace(Status::Held {
            slot: 0,
            slots: Some(10),
        });
        l.gate(Some("inspect_hardware"), true, "u").await;
        assert!(!metrics.status().quarantine_unavailable);
    }

    #[test]
    fn an_off_budget_says_so() {
        let q = status_view(Budget::Off, &Status::Off);
        assert_eq!((q.state.as_str(), q.budget.as_str()), ("off", "off"));
    }
}
