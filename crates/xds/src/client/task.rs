//! The client's connection loop: connect, initial requests, responses, ACK/NACK, backoff.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use ambit_api::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Status};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{
    ClientConfig, ConnectionState, Connector, Handler, MAX_PENDING_DEMANDS, MetadataSource, Nack, Rejection,
    Shared, Subscription, Update,
};
use crate::{TerminationReason, XdsMetrics};

/// A NACK's `error_detail.message` stops growing past this many bytes.
const MAX_NACK_MESSAGE: usize = 16 * 1024;

/// Requests queued for the stream beyond the initial ones (ACKs, demands).
const REQUEST_QUEUE: usize = 16;

/// How a stream ended and what that does to the backoff.
struct Ended {
    reason: TerminationReason,
    double: bool,
    message: String,
}

/// One subscribed type's state in the task.
struct TypeState {
    type_url: String,
    subscription: Subscription,
    /// Every name held, with the version the server sent (rejected ones are not held).
    held: HashMap<String, String>,
    /// Names demanded but not yet answered.
    pending: BTreeSet<String>,
    acked: bool,
}

pub(super) struct Task {
    cfg: ClientConfig,
    connector: Connector,
    metadata: MetadataSource,
    handlers: HashMap<String, Arc<dyn Handler>>,
    metrics: XdsMetrics,
    shared: Arc<Shared>,
    types: Vec<TypeState>,
    warned: HashSet<String>,
    /// Held by the task itself, so even a task dropped before its first poll stops the handle.
    _stop: StopGuard,
}

/// Wakes waiting demand callers with `Stopped` when the task ends or is dropped.
struct StopGuard(Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        let mut d = self.0.demands();
        d.stopped = true;
        d.waiters.clear();
        d.waiting = 0;
    }
}

impl Task {
    pub(super) fn new(
        cfg: ClientConfig,
        connector: Connector,
        metadata: MetadataSource,
        handlers: HashMap<String, Arc<dyn Handler>>,
        metrics: XdsMetrics,
        shared: Arc<Shared>,
    ) -> Self {
        let types = cfg
            .subscriptions
            .iter()
            .map(|(url, sub)| TypeState {
                type_url: url.clone(),
                subscription: sub.clone(),
                held: HashMap::new(),
                pending: BTreeSet::new(),
                acked: false,
            })
            .collect();
        let _stop = StopGuard(shared.clone());
        Self { cfg, connector, metadata, handlers, metrics, shared, types, warned: HashSet::new(), _stop }
    }

    pub(super) async fn run(mut self) {
        let initial = self.cfg.backoff.initial;
        let mut backoff = initial;
        loop {
            self.shared.status().connection.state = ConnectionState::Connecting;
            let (ended, got_response) = self.stream().await;
            self.metrics.terminated(ended.reason);
            if got_response {
                // A stream that worked starts the doubling afresh.
                backoff = initial;
            }
            let wait = if ended.double {
                backoff = (backoff * 2).min(self.cfg.backoff.max);
                backoff
            } else {
                backoff = initial;
                initial
            };
            let wait = wait.mul_f64(rand::random_range(0.5..=1.0));
            warn!(
                server = %self.cfg.server,
                reason = ?ended.reason,
                retry_in = ?wait,
                "xDS stream ended: {}",
                ended.message
            );
            {
                let mut st = self.shared.status();
                st.connection.state = ConnectionState::Backoff { reason: ended.reason, retry_in: wait };
                st.connection.last_error = Some(ended.message);
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// Runs one stream until it ends; says whether any response arrived.
    async fn stream(&mut self) -> (Ended, bool) {
        let channel = match (self.connector)().await {
            Ok(c) => c,
            Err(e) => {
                return (
                    Ended {
                        reason: TerminationReason::ConnectionError,
                        double: true,
                        message: format!("cannot connect to the xDS server {}: {e}", self.cfg.server),
                    },
                    false,
                );
            }
        };
        let metadata = match (self.metadata)() {
            Ok(m) => m,
            Err(e) => {
                return (
                    Ended {
                        reason: TerminationReason::ConnectionError,
                        double: true,
                        message: format!("cannot build the xDS stream's metadata (token, headers): {e}"),
                    },
                    false,
                );
            }
        };
        self.take_demands();
        let (tx, rx) = mpsc::channel(self.types.len() + REQUEST_QUEUE);
        for ts in &self.types {
            // The queue was sized for these, and the receiver is alive.
            let _ = tx.try_send(initial_request(&self.cfg, ts));
        }
        let mut responses = match super::wire::open(channel, rx, metadata, self.cfg.max_message_bytes).await {
            Ok(r) => r,
            Err(status) => {
                return (
                    Ended {
                        reason: TerminationReason::ConnectionError,
                        double: true,
                        message: open_refused(&self.cfg.server, &status),
                    },
                    false,
                );
            }
        };
        {
            let mut st = self.shared.status();
            st.connection.state = ConnectionState::Connected;
            st.connection.connects += 1;
        }
        info!(server = %self.cfg.server, "xDS stream open");
        let shared = self.shared.clone();
        let mut got_response = false;
        loop {
            tokio::select! {
                msg = responses.message() => match msg {
                    Ok(Some(resp)) => {
                        got_response = true;
                        self.on_response(resp, &tx).await;
                    }
                    Ok(None) => {
                        let message = "the server ended the stream".to_owned();
                        return (Ended { reason: TerminationReason::Complete, double: false, message }, got_response);
                    }
                    Err(status) => return (classify(&status, self.cfg.max_message_bytes), got_response),
                },
                () = shared.demand_wake.notified() => {
                    for req in self.take_demands() {
                        // A dead stream shows up as an error on `responses`; the names stay
                        // pending and go out with the next connect.
                        let _ = tx.send(req).await;
                    }
                }
            }
        }
    }

    /// Moves new demands into the types' pending sets; returns the subscribe requests to send.
    fn take_demands(&mut self) -> Vec<DeltaDiscoveryRequest> {
        let outbox = std::mem::take(&mut self.shared.demands().outbox);
        let mut by_type: Vec<Vec<String>> = vec![Vec::new(); self.types.len()];
        let mut already = Vec::new();
        for (url, name) in outbox {
            let Some(i) = self.types.iter().position(|t| t.type_url == url) else { continue };
            let ts = &mut self.types[i];
            if ts.held.contains_key(&name) {
                already.push((url, name));
                continue;
            }
            // Unanswered names are re-requested on every reconnect; past the cap a demand is
            // still sent on the live stream but not remembered for the next one.
            if ts.pending.len() < MAX_PENDING_DEMANDS {
                ts.pending.insert(name.clone());
            }
            by_type[i].push(name);
        }
        if !already.is_empty() {
            let mut d = self.shared.demands();
            for (url, name) in already {
                d.resolve(&url, &name);
            }
        }
        self.types
            .iter()
            .zip(by_type)
            .filter(|(_, names)| !names.is_empty())
            .map(|(ts, names)| DeltaDiscoveryRequest {
                type_url: ts.type_url.clone(),
                resource_names_subscribe: names,
                ..Default::default()
            })
            .collect()
    }

    async fn on_response(&mut self, resp: DeltaDiscoveryResponse, tx: &mpsc::Sender<DeltaDiscoveryRequest>) {
        let DeltaDiscoveryResponse { system_version_info, resources, type_url, removed_resources, nonce } =
            resp;
        let bytes = resources.iter().filter_map(|r| r.resource.as_ref()).map(|a| a.value.len() as u64).sum();
        self.metrics.message(&type_url, bytes);
        debug!(%type_url, %nonce, resources = resources.len(), removed = removed_resources.len(), "xDS response");

        let idx = self.types.iter().position(|t| t.type_url == type_url);
        let handler = self.handlers.get(&type_url).cloned();
        let (Some(idx), Some(handler)) = (idx, handler) else {
            if self.warned.insert(type_url.clone()) {
                warn!(%type_url, "xDS response for a type this client has no handler for; acknowledged and ignored");
            }
            if let Some(i) = idx {
                self.record(i, &system_version_info, &nonce, None);
            }
            let _ = tx.send(ack(type_url, nonce, None)).await;
            return;
        };

        let mut received = Vec::with_capacity(resources.len());
        let mut updates = Vec::with_capacity(resources.len());
        let mut rejections = Vec::new();
        for r in resources {
            received.push((r.name.clone(), r.version.clone(), r.aliases.clone()));
            match r.resource {
                Some(resource) => {
                    updates.push(Update { name: r.name, version: r.version, aliases: r.aliases, resource })
                }
                None => rejections.push(Rejection { name: r.name, reason: "resource has no payload".into() }),
            }
        }
        rejections.extend(handler.apply(updates, removed_resources.clone()).await);

        let rejected: HashSet<&str> = rejections.iter().map(|r| r.name.as_str()).collect();
        let ts = &mut self.types[idx];
        for (name, version, aliases) in &received {
            ts.pending.remove(name);
            for a in aliases {
                ts.pending.remove(a);
            }
            if rejected.contains(name.as_str()) {
                // Not known, so a reconnect does not report it and the server sends it again.
                ts.held.remove(name);
            } else {
                ts.held.insert(name.clone(), version.clone());
            }
        }
        for name in &removed_resources {
            ts.held.remove(name);
            ts.pending.remove(name);
        }
        drop(rejected);

        {
            let mut d = self.shared.demands();
            for (name, _, aliases) in &received {
                d.resolve(&type_url, name);
                for a in aliases {
                    d.resolve(&type_url, a);
                }
            }
            for name in &removed_resources {
                d.resolve(&type_url, name);
            }
        }

        let detail = (!rejections.is_empty()).then(|| nack_message(&rejections));
        if let Some(message) = &detail {
            warn!(%type_url, %nonce, "xDS NACK: {message}");
        }
        self.record(idx, &system_version_info, &nonce, detail.as_deref());
        let _ = tx.send(ack(type_url, nonce, detail)).await;
    }

    /// Records an ACK (or NACK) of a response in the status and the sync state.
    fn record(&mut self, idx: usize, version: &str, nonce: &str, nack: Option<&str>) {
        let ts = &mut self.types[idx];
        let mut st = self.shared.status();
        if let Some(t) = st.types.get_mut(idx) {
            t.system_version_info = version.to_owned();
            t.last_nonce = nonce.to_owned();
            t.resources = ts.held.len();
            match nack {
                Some(message) => {
                    t.nacks += 1;
                    t.last_nack = Some(Nack {
                        nonce: nonce.to_owned(),
                        message: message.to_owned(),
                        at: SystemTime::now(),
                    });
                }
                None => t.acks += 1,
            }
        }
        drop(st);
        // A part that more parts of the same response follow does not complete the sync: the
        // state is not whole until the last part is in.
        if nack.is_none() && !crate::parts::more_follow(version) {
            ts.acked = true;
            let synced = self.types.iter().all(|t| t.acked || t.subscription == Subscription::OnDemand);
            if synced && !*self.shared.synced.borrow() {
                info!(server = %self.cfg.server, "xDS initial sync complete");
                self.shared.synced.send_replace(true);
            }
        }
    }
}

fn initial_request(cfg: &ClientConfig, ts: &TypeState) -> DeltaDiscoveryRequest {
    let mut versions = ts.held.clone();
    for name in &ts.pending {
        versions.entry(name.clone()).or_default();
    }
    let star = || vec!["*".to_owned()];
    let (subscribe, unsubscribe) = match &ts.subscription {
        Subscription::Wildcard => (Vec::new(), Vec::new()),
        Subscription::Named(names) if !names.is_empty() => (names.iter().cloned().collect(), Vec::new()),
        // An empty subscribe list means wildcard, so "nothing yet" is the `*`/`*` pair.
        Subscription::OnDemand | Subscription::Named(_) => (star(), star()),
    };
    DeltaDiscoveryRequest {
        node: Some(cfg.node.clone()),
        type_url: ts.type_url.clone(),
        resource_names_subscribe: subscribe,
        resource_names_unsubscribe: unsubscribe,
        initial_resource_versions: versions,
        ..Default::default()
    }
}

fn ack(type_url: String, nonce: String, nack: Option<String>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url,
        response_nonce: nonce,
        error_detail: nack.map(|message| Status { code: 0, message, details: Vec::new() }),
        ..Default::default()
    }
}

/// `"<name>: <reason>"` joined by `"; "`, cut off (with a count) past [`MAX_NACK_MESSAGE`].
fn nack_message(rejections: &[Rejection]) -> String {
    let mut out = String::new();
    for (i, r) in rejections.iter().enumerate() {
        if out.len() >= MAX_NACK_MESSAGE {
            out.push_str(&format!("; and {} more", rejections.len() - i));
            break;
        }
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(&r.name);
        out.push_str(": ");
        out.push_str(&r.reason);
    }
    out
}

fn open_refused(server: &str, status: &tonic::Status) -> String {
    let hint = match status.code() {
        tonic::Code::Unauthenticated => {
            "; the server refused our credentials (check the token the proxy sends)"
        }
        tonic::Code::PermissionDenied => "; the server does not let this identity read its configuration",
        _ => "",
    };
    format!("the xDS server {server} refused the stream: {:?}: {}{hint}", status.code(), status.message())
}

/// Maps a stream's final status onto ztunnel's reasons and waits.
fn classify(status: &tonic::Status, limit: usize) -> Ended {
    use tonic::Code;
    let msg = status.message();
    let reconnect = match status.code() {
        Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => true,
        Code::Unavailable => msg.contains("transport is closing") || msg.contains("received prior goaway"),
        _ => false,
    };
    let message = if status.code() == Code::OutOfRange {
        format!("a response exceeded the {limit}-byte limit or could not be decoded: {msg}")
    } else {
        format!("{:?}: {msg}", status.code())
    };
    if reconnect {
        Ended { reason: TerminationReason::Reconnect, double: false, message }
    } else {
        Ended { reason: TerminationReason::Error, double: true, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nack_message_joins_and_caps() {
        let r = |n: &str| Rejection { name: n.into(), reason: "bad".into() };
        assert_eq!(nack_message(&[r("a"), r("b")]), "a: bad; b: bad");
        let many: Vec<_> = (0..10_000).map(|i| r(&format!("name-{i}"))).collect();
        let m = nack_message(&many);
        assert!(m.len() < MAX_NACK_MESSAGE + 64, "{}", m.len());
        assert!(m.ends_with(" more"), "{m}");
    }

    #[test]
    fn classify_follows_ztunnel() {
        let c = |code, msg: &str| {
            let e = classify(&tonic::Status::new(code, msg), 1);
            (e.reason, e.double)
        };
        use tonic::Code;
        assert_eq!(c(Code::Unknown, "x"), (TerminationReason::Reconnect, false));
        assert_eq!(c(Code::Cancelled, "x"), (TerminationReason::Reconnect, false));
        assert_eq!(c(Code::DeadlineExceeded, "x"), (TerminationReason::Reconnect, false));
        assert_eq!(c(Code::Unavailable, "transport is closing"), (TerminationReason::Reconnect, false));
        assert_eq!(c(Code::Unavailable, "received prior goaway: x"), (TerminationReason::Reconnect, false));
        assert_eq!(c(Code::Unavailable, "other"), (TerminationReason::Error, true));
        assert_eq!(c(Code::Internal, "x"), (TerminationReason::Error, true));
    }
}
