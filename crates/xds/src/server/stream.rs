//! One stream's requests and pushes: a request applied to the stream's subscriptions (what it
//! asked for, ACKs and NACKs, istiod's rules), names resolved for named subscribers, and the
//! responses built from the current resources.

use std::collections::{HashMap, HashSet};

use ambit_api::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use prost::Message;
use tonic::Status;
use tracing::{debug, warn};

use super::{
    Dirty, Entry, RefusalReason, ServerInner, ServerNack, StreamShared, StreamState, Sub, TypeSet, keep_last,
    lock,
};

/// Responses by type index.
pub(super) type Responses = Vec<(usize, DeltaDiscoveryResponse)>;

pub(super) fn on_request(
    server: &ServerInner,
    shared: &StreamShared,
    req: DeltaDiscoveryRequest,
) -> Result<Responses, Status> {
    let out = handle_request(server, shared, req)?;
    let subscribed: usize = lock(&shared.state).subs.iter().flatten().map(|s| s.names.len()).sum();
    let max_names = server.cfg.max_subscribed_names;
    if subscribed > max_names {
        server.hooks.metrics.refused(RefusalReason::TooManyNames);
        return Err(Status::resource_exhausted(format!(
            "this stream subscribes to {subscribed} names, more than the server's limit of {max_names}"
        )));
    }
    Ok(out)
}

pub(super) fn handle_request(
    server: &ServerInner,
    shared: &StreamShared,
    req: DeltaDiscoveryRequest,
) -> Result<Responses, Status> {
    let resources = &server.resources;
    let mut st = lock(&shared.state);
    let Some(ti) = resources.index(&req.type_url) else {
        warn!(stream = st.id, type_url = %req.type_url, "xDS request for a type this server does not serve; ignored");
        return Ok(Vec::new());
    };
    let StreamState { subs, counter, id, node_name, scope, .. } = &mut *st;
    let node_name = node_name.as_deref();
    let scope = scope.as_deref();
    if let Some(err) = &req.error_detail {
        warn!(stream = *id, type_url = %req.type_url, nonce = %req.response_nonce, "xDS NACK: {}", err.message);
        server.type_metrics[ti].rejected();
        if let Some(sub) = subs[ti].as_mut() {
            keep_last(
                &mut sub.nacks,
                ServerNack { nonce: req.response_nonce.clone(), message: err.message.clone() },
            );
        }
        // Recorded only: the rejected version is not sent again, the next change is.
        return Ok(Vec::new());
    }
    let snap = resources.read();
    let set = &snap.sets[ti];
    let type_url = &resources.inner.types[ti];
    let max_bytes = server.cfg.max_response_bytes;
    let Some(sub) = subs[ti].as_mut() else {
        let mut names: HashSet<String> = req.resource_names_subscribe.iter().cloned().collect();
        names.extend(req.initial_resource_versions.keys().cloned());
        for u in &req.resource_names_unsubscribe {
            names.remove(u);
        }
        let wildcard = names.remove("*") || req.resource_names_subscribe.is_empty();
        let mut sub = Sub {
            wildcard,
            base: snap.version,
            names: HashMap::new(),
            responses: 0,
            in_flight: Vec::new(),
            acked: Vec::new(),
            nacks: Vec::new(),
        };
        let (resources_out, removed) = if wildcard {
            everything(set, &req.initial_resource_versions, scope)
        } else {
            let mut names: Vec<String> = names.into_iter().collect();
            names.extend(set.node_local(node_name, &sub, &names, scope));
            resolve(set, snap.version, &mut sub, &names, &req.initial_resource_versions, scope)
        };
        let parts = response(type_url, snap.version, &mut sub, counter, resources_out, removed, max_bytes);
        subs[ti] = Some(sub);
        return Ok(parts.into_iter().map(|r| (ti, r)).collect());
    };
    // Every part of the last response is current (each is ACKed on its own); anything older
    // is stale.
    if !req.response_nonce.is_empty() && !sub.in_flight.contains(&req.response_nonce) {
        debug!(stream = *id, %type_url, nonce = %req.response_nonce, "stale nonce; request ignored");
        server.type_metrics[ti].expired_nonce();
        return Ok(Vec::new());
    }
    if !req.response_nonce.is_empty() {
        keep_last(&mut sub.acked, req.response_nonce.clone());
    }
    let mut resend_all = false;
    let mut new_names = Vec::new();
    for n in &req.resource_names_subscribe {
        if n == "*" {
            resend_all |= !sub.wildcard;
            sub.wildcard = true;
        } else if sub.wildcard || !sub.names.contains_key(n) {
            new_names.push(n.clone());
        }
    }
    for n in &req.resource_names_unsubscribe {
        if n == "*" {
            sub.wildcard = false;
        } else {
            sub.names.remove(n);
        }
    }
    let none = HashMap::new();
    let (out, removed) = if resend_all {
        sub.base = snap.version;
        everything(set, &none, scope)
    } else if !new_names.is_empty() {
        if !sub.wildcard {
            let local = set.node_local(node_name, sub, &new_names, scope);
            new_names.extend(local);
        }
        resolve(set, snap.version, sub, &new_names, &none, scope)
    } else {
        if req.response_nonce.is_empty() && req.resource_names_unsubscribe.is_empty() {
            debug!(stream = *id, %type_url, "request without nonce changes nothing; ignored");
        }
        return Ok(Vec::new());
    };
    let parts = response(type_url, snap.version, sub, counter, out, removed, max_bytes);
    Ok(parts.into_iter().map(|r| (ti, r)).collect())
}

/// Every resource of the type the stream may see except those the client already holds at the
/// same version, and the names the client reported that no longer exist (for it).
pub(super) fn everything(
    set: &TypeSet,
    initial: &HashMap<String, String>,
    scope: Option<&str>,
) -> (Vec<Resource>, Vec<String>) {
    let out = set
        .by_name
        .iter()
        .filter(|(name, e)| initial.get(*name) != Some(&e.version) && set.visible(name, scope))
        .map(|(_, e)| wire(e, false))
        .collect();
    let mut removed: Vec<String> =
        initial.keys().filter(|n| !set.by_name.contains_key(*n) || !set.visible(n, scope)).cloned().collect();
    removed.sort();
    (out, removed)
}

/// Looks `names` up by name or alias for a named/on-demand subscriber: what is found is sent
/// with its aliases and its `also` names, and joins the subscription; what is not is echoed as
/// removed.
pub(super) fn resolve(
    set: &TypeSet,
    version: u64,
    sub: &mut Sub,
    names: &[String],
    initial: &HashMap<String, String>,
    scope: Option<&str>,
) -> (Vec<Resource>, Vec<String>) {
    let mut send: Vec<&str> = Vec::new();
    let mut removed = Vec::new();
    for name in names {
        if !sub.wildcard {
            sub.names.insert(name.clone(), version);
        }
        let real = if set.by_name.contains_key(name) {
            Some(name.as_str())
        } else {
            set.by_alias.get(name).map(String::as_str)
        }
        .filter(|real| set.visible(real, scope));
        match real {
            Some(real) => {
                send.push(real);
                if let Some(e) = set.by_name.get(real) {
                    send.extend(e.res.also.iter().map(String::as_str));
                }
            }
            None => removed.push(name.clone()),
        }
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for name in send {
        let Some(e) = set.by_name.get(name) else { continue };
        if !set.visible(name, scope) || !seen.insert(name) {
            continue;
        }
        if !sub.wildcard {
            sub.names.insert(name.to_owned(), version);
        }
        if initial.get(name) != Some(&e.version) {
            out.push(wire(e, true));
        }
    }
    (out, removed)
}

/// The changed names a stream's subscription covers, one response per type that has any.
pub(super) fn push(server: &ServerInner, shared: &StreamShared, dirty: &Dirty) -> Responses {
    let resources = &server.resources;
    let snap = resources.read();
    let mut st = lock(&shared.state);
    let StreamState { subs, counter, node_name, scope, .. } = &mut *st;
    let node_name = node_name.as_deref();
    let scope = scope.as_deref();
    let mut out = Vec::new();
    for (ti, changed) in dirty.iter().enumerate() {
        let Some(Some(sub)) = subs.get_mut(ti) else { continue };
        if changed.is_empty() {
            continue;
        }
        let set = &snap.sets[ti];
        let (resources_out, removed) = if sub.wildcard {
            let mut removed = Vec::new();
            let mut res = Vec::new();
            for (name, _) in changed.iter().filter(|(n, v)| **v > sub.base && set.visible(n, scope)) {
                match set.by_name.get(name) {
                    Some(e) => res.push(wire(e, false)),
                    None => removed.push(name.clone()),
                }
            }
            (res, removed)
        } else {
            // Only names whose change is newer than what this stream was last sent, and
            // resources on the stream's node it does not hold yet (they join it).
            let covered: Vec<String> = changed
                .iter()
                .filter(|(n, v)| match sub.names.get(*n) {
                    Some(sent) => *v > sent,
                    None => set.is_on(n, node_name),
                })
                .map(|(n, _)| n.clone())
                .collect();
            let (res, mut removed) = resolve(set, snap.version, sub, &covered, &HashMap::new(), scope);
            removed.retain(|n| !set.by_alias.contains_key(n));
            (res, removed)
        };
        if resources_out.is_empty() && removed.is_empty() {
            continue;
        }
        let type_url = &resources.inner.types[ti];
        let max_bytes = server.cfg.max_response_bytes;
        let parts = response(type_url, snap.version, sub, counter, resources_out, removed, max_bytes);
        out.extend(parts.into_iter().map(|r| (ti, r)));
    }
    out
}

pub(super) fn wire(e: &Entry, aliases: bool) -> Resource {
    Resource {
        name: e.res.name.clone(),
        aliases: if aliases { e.res.aliases.clone() } else { Vec::new() },
        version: e.version.clone(),
        resource: Some(e.res.resource.clone()),
        ..Default::default()
    }
}

/// What a part's header (type URL, nonce, version) and one field's tag and length may take,
/// on top of what [`ServerConfig::max_response_bytes`](super::ServerConfig) counts.
const HEADER_BYTES: usize = 4096;
const FIELD_BYTES: usize = 16;

/// The response that sends `resources` and `removed`: one message, or, when it would be larger
/// than `max_bytes`, several parts ([`crate::parts`]) with the removals after every resource.
/// Each gets its own nonce; all of them are the stream's current nonces for the type.
pub(super) fn response(
    type_url: &str,
    version: u64,
    sub: &mut Sub,
    counter: &mut u64,
    resources: Vec<Resource>,
    mut removed: Vec<String>,
    max_bytes: usize,
) -> Vec<DeltaDiscoveryResponse> {
    // Removals in a stable order (names come out of hash sets).
    removed.sort();
    let sizes = resources
        .iter()
        .map(|r| r.encoded_len() + FIELD_BYTES)
        .chain(removed.iter().map(|n| n.len() + FIELD_BYTES));
    let starts = crate::parts::split(sizes, max_bytes.saturating_sub(HEADER_BYTES));
    let (total, held) = (resources.len() + removed.len(), resources.len());
    let count = starts.len() + 1;
    let (mut resources, mut removed) = (resources.into_iter(), removed.into_iter());
    let version_info = version.to_string();
    sub.in_flight.clear();
    let mut out = Vec::with_capacity(count);
    let mut from = 0;
    for (i, to) in starts.into_iter().chain([total]).enumerate() {
        let sent = to.min(held).saturating_sub(from.min(held));
        let resources = resources.by_ref().take(sent).collect();
        let removed_resources = removed.by_ref().take(to - from - sent).collect();
        from = to;
        *counter += 1;
        let nonce = format!("{version}-{counter}-{:016x}", rand::random::<u64>());
        sub.in_flight.push(nonce.clone());
        sub.responses += 1;
        out.push(DeltaDiscoveryResponse {
            system_version_info: match count {
                1 => version_info.clone(),
                _ => crate::parts::version(&version_info, i + 1, count),
            },
            resources,
            type_url: type_url.to_owned(),
            removed_resources,
            nonce,
        });
    }
    out
}
