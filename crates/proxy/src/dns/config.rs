//! DNS proxy configuration: cluster domain, upstream resolvers and search domains.

use std::net::{IpAddr, SocketAddr};

/// The standard DNS port upstream resolvers listen on.
const DNS_PORT: u16 = 53;

/// What the DNS proxy needs to know besides the mesh state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsConfig {
    /// Cluster DNS domain (`CLUSTER_DOMAIN`, e.g. `cluster.local`).
    pub cluster_domain: String,
    /// Whether AAAA answers may be given (`IPV6_ENABLED`).
    pub ipv6_enabled: bool,
    /// Tie-break namespace when several services share a hostname (`PREFERED_SERVICE_NAMESPACE`).
    pub preferred_namespace: Option<String>,
    /// Resolvers that non-mesh queries are forwarded to, tried in order.
    pub upstreams: Vec<SocketAddr>,
    /// The client's search list: a query ending in one of these is also tried without it
    /// ("stripped") and answered with a CNAME to the stripped name.
    pub search_domains: Vec<String>,
}

impl DnsConfig {
    /// nameservers + search from resolv.conf text (missing/garbled lines skipped)
    ///
    /// `search` and `domain` lines replace each other (the last one wins, as in glibc);
    /// nameservers keep their order. The preferred namespace is left unset.
    pub fn from_resolv_conf(text: &str, cluster_domain: &str, ipv6_enabled: bool) -> DnsConfig {
        let mut upstreams = Vec::new();
        let mut search_domains = Vec::new();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or_default();
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    // A scoped IPv6 address (`fe80::1%eth0`) does not parse and is skipped.
                    if let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok()) {
                        upstreams.push(SocketAddr::new(ip, DNS_PORT));
                    }
                }
                Some("search") => {
                    search_domains = words.map(str::to_owned).collect();
                }
                Some("domain") => {
                    search_domains = words.next().map(str::to_owned).into_iter().collect();
                }
                _ => {}
            }
        }
        DnsConfig {
            cluster_domain: cluster_domain.to_owned(),
            ipv6_enabled,
            preferred_namespace: None,
            upstreams,
            search_domains,
        }
    }

    /// The search list Kubernetes gives a pod in `namespace` (`<ns>.svc.<domain>`,
    /// `svc.<domain>`, `<domain>`), for in-pod proxies whose pods' resolv.conf is not read.
    pub fn pod_search_domains(namespace: &str, cluster_domain: &str) -> Vec<String> {
        let domain = cluster_domain.trim_end_matches('.');
        vec![format!("{namespace}.svc.{domain}"), format!("svc.{domain}"), domain.to_owned()]
    }
}
