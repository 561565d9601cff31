//! Mesh name lookup: the candidate names of a query (Kubernetes expansions, search-domain
//! stripping, wildcards), the best visible service for them and its A/AAAA addresses.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use rand::seq::SliceRandom;

use super::{DnsClient, DnsConfig};
use crate::state::{IpFamily, Service, State};

/// Address family asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    /// A records.
    V4,
    /// AAAA records.
    V6,
}

/// Names derived once from the configuration and the client, lower case, as label lists.
#[derive(Debug)]
pub(super) struct Names {
    /// `<domain>`.
    domain: Vec<String>,
    /// `svc.<domain>`.
    svc_domain: Vec<String>,
    /// `<client ns>.svc.<domain>`.
    ns_domain: Vec<String>,
    /// The client's search domains.
    search: Vec<Vec<String>>,
    /// `.svc.<domain>`: headless services must end in this to be answered.
    headless_suffix: String,
}

/// The service a query resolved to.
#[derive(Debug)]
pub(super) struct Found {
    /// The best visible service.
    pub(super) service: Arc<Service>,
    /// When matched through a stripped search domain (and not through a wildcard): how many
    /// leading labels of the query form the stripped name that the answer is a CNAME to.
    pub(super) cname_labels: Option<usize>,
}

/// A name to look up, with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    labels: Vec<String>,
    /// Leading query labels kept when this candidate comes from a stripped search domain.
    stripped: Option<usize>,
}

impl Names {
    /// Precomputes the domain names for `client`.
    pub(super) fn new(cfg: &DnsConfig, client: &DnsClient) -> Names {
        let domain = split(&cfg.cluster_domain);
        let svc_domain: Vec<String> =
            std::iter::once("svc".to_owned()).chain(domain.iter().cloned()).collect();
        let ns_domain: Vec<String> = std::iter::once(client.namespace.to_ascii_lowercase())
            .chain(svc_domain.iter().cloned())
            .collect();
        let search = cfg.search_domains.iter().map(|d| split(d)).filter(|d| !d.is_empty()).collect();
        let headless_suffix = format!(".{}", svc_domain.join("."));
        Names { domain, svc_domain, ns_domain, search, headless_suffix }
    }
}

/// Lower-case labels of a query name; `None` if a label is not text or contains a dot (such a
/// name cannot be a mesh hostname).
pub(super) fn query_labels<'a>(labels: impl Iterator<Item = &'a [u8]>) -> Option<Vec<String>> {
    labels
        .map(|l| {
            let s = std::str::from_utf8(l).ok()?;
            (!s.contains('.')).then(|| s.to_ascii_lowercase())
        })
        .collect()
}

/// The best visible mesh service for a query, trying every candidate name in order.
pub(super) fn find(
    state: &State,
    cfg: &DnsConfig,
    names: &Names,
    client: &DnsClient,
    query: &[String],
) -> Option<Found> {
    for candidate in candidates(names, query) {
        for (hostname, wildcard) in wildcards(&candidate.labels) {
            if let Some(service) = best_service(state, cfg, names, client, &hostname) {
                return Some(Found { service, cname_labels: candidate.stripped.filter(|_| !wildcard) });
            }
        }
    }
    None
}

/// The service's addresses of `family` for `client`, shuffled. Empty when the family is
/// disabled (IPv6 off, or the service's `ip_families` excludes it).
pub(super) fn addresses(
    state: &State,
    cfg: &DnsConfig,
    client: &DnsClient,
    service: &Service,
    family: Family,
) -> Vec<IpAddr> {
    let allowed = match (family, service.ip_families) {
        (Family::V6, _) if !cfg.ipv6_enabled => false,
        (Family::V6, Some(IpFamily::IPv4)) | (Family::V4, Some(IpFamily::IPv6)) => false,
        _ => true,
    };
    if !allowed {
        return Vec::new();
    }
    let of_family = |ip: &IpAddr| match family {
        Family::V4 => ip.is_ipv4(),
        Family::V6 => ip.is_ipv6(),
    };
    let mut out: Vec<IpAddr> = if service.vips.is_empty() {
        // Headless: one address per endpoint workload.
        service
            .endpoints
            .values()
            .filter_map(|ep| state.workload_by_uid(&ep.workload_uid))
            .filter_map(|w| w.workload_ips.iter().copied().find(of_family))
            .collect()
    } else {
        service
            .vips
            .iter()
            .filter(|v| v.network == client.network)
            .map(|v| v.address)
            .filter(of_family)
            .collect()
    };
    out.shuffle(&mut rand::rng());
    out
}

/// Candidate names in order: the query, its Kubernetes expansions, then for each search domain
/// it ends with the stripped name and its expansions. Duplicates are dropped.
fn candidates(names: &Names, query: &[String]) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut seen: HashSet<Vec<String>> = HashSet::new();
    let mut add = |labels: Vec<String>, stripped: Option<usize>| {
        if seen.insert(labels.clone()) {
            out.push(Candidate { labels, stripped });
        }
    };
    add(query.to_vec(), None);
    for e in expansions(names, query) {
        add(e, None);
    }
    for domain in &names.search {
        let Some(stripped) = trim_domain(query, domain) else {
            continue;
        };
        let kept = Some(stripped.len());
        add(stripped.to_vec(), kept);
        for e in expansions(names, stripped) {
            add(e, kept);
        }
    }
    out
}

/// The candidate names of `query`, joined, in order (for tests).
#[cfg(test)]
pub(super) fn candidates_for_test(names: &Names, query: &[String]) -> Vec<String> {
    candidates(names, query).into_iter().map(|c| c.labels.join(".")).collect()
}

/// The Kubernetes FQDNs a short name may stand for.
fn expansions(names: &Names, labels: &[String]) -> Vec<Vec<String>> {
    let with = |suffix: &[String]| -> Vec<String> { labels.iter().chain(suffix).cloned().collect() };
    let ends_in_svc = labels.last().is_some_and(|l| l == "svc");
    match labels.len() {
        1 => vec![with(&names.ns_domain)],
        2 => vec![with(&names.svc_domain), with(&names.ns_domain)],
        3 if ends_in_svc => vec![with(&names.domain), with(&names.svc_domain)],
        3 => vec![with(&names.svc_domain)],
        4 if ends_in_svc => vec![with(&names.domain)],
        _ => Vec::new(),
    }
}

/// `name` without the trailing `domain`, if it ends with it and keeps at least one label.
fn trim_domain<'a>(name: &'a [String], domain: &[String]) -> Option<&'a [String]> {
    if name.len() > domain.len() && name.ends_with(domain) {
        Some(&name[..name.len() - domain.len()])
    } else {
        None
    }
}

/// The hostname itself, then successive leading-label wildcards (`a.b.c`, `*.b.c`, `*.c`),
/// each flagged whether it is a wildcard.
fn wildcards(labels: &[String]) -> Vec<(String, bool)> {
    let mut out = vec![(labels.join("."), false)];
    for start in 1..labels.len() {
        out.push((format!("*.{}", labels[start..].join(".")), true));
    }
    out
}

/// The best service named `hostname` that has VIPs (or is a Kubernetes headless service) and is
/// visible to the client: client namespace, then canonical, then preferred namespace, then first.
fn best_service(
    state: &State,
    cfg: &DnsConfig,
    names: &Names,
    client: &DnsClient,
    hostname: &str,
) -> Option<Arc<Service>> {
    let preferred = cfg.preferred_namespace.as_deref();
    let mut best: Option<(Rank, &Arc<Service>)> = None;
    let eligible = state.services_with_hostname(hostname).iter().filter(|s| {
        (!s.vips.is_empty() || s.hostname.ends_with(&names.headless_suffix))
            && s.visible_to(&client.namespace)
    });
    for s in eligible {
        let key = (s.namespace == client.namespace, s.canonical, preferred == Some(s.namespace.as_str()));
        if best.as_ref().is_none_or(|(k, _)| key > *k) {
            best = Some((key, s));
        }
    }
    best.map(|(_, s)| s.clone())
}

/// Preference of a service: (client namespace, canonical, preferred namespace).
type Rank = (bool, bool, bool);

/// Lower-case labels of a configured domain (`cluster.local.` → `["cluster", "local"]`).
fn split(domain: &str) -> Vec<String> {
    domain.trim_end_matches('.').split('.').filter(|l| !l.is_empty()).map(str::to_ascii_lowercase).collect()
}
