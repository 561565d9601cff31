//! Inbound HBONE (§4.3 steps 3-4): the CONNECT authority, destination validation, upstream.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use super::State;
use super::model::{Destination, Service, Workload};

/// A CONNECT `:authority`: `ip:port` (IPv6 bracketed) or `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Authority {
    /// A socket address.
    Addr(SocketAddr),
    /// A service hostname and service port.
    Host(String, u16),
}

/// Why a `:authority` is not `ip:port` or `host:port` with a canonical port (decimal, 1-65535,
/// no sign and no leading zero). Holds at most [`MAX_SHOWN_AUTHORITY`] bytes of the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no valid authority pseudo header: {0:?} (want ip:port, [ipv6]:port or host:port, the port in \
     decimal without leading zeros)"
)]
pub struct AuthorityError(String);

/// How much of a bad authority an [`AuthorityError`] quotes (the rest is counted, not kept).
pub const MAX_SHOWN_AUTHORITY: usize = 256;

/// Why an inbound CONNECT cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InboundError {
    /// The authority IP is not this connection's destination and no waypoint rule allows it.
    #[error("ip mismatch: {0} != {1}")]
    IpMismatch(IpAddr, IpAddr),
    /// No service has the authority hostname.
    #[error("no service or workload for hostname: {0}")]
    NoHostname(String),
    /// The service exists but the port has no target port for this workload.
    #[error("requested service {0}:{1} found, but cannot resolve port")]
    NoPortForService(String, u16),
}

impl InboundError {
    /// The HTTP status to answer with (§3.5).
    #[cfg(test)]
    pub fn http_status(&self) -> u16 {
        match self {
            InboundError::IpMismatch(..) => 400,
            InboundError::NoHostname(_) | InboundError::NoPortForService(..) => 503,
        }
    }
}

impl FromStr for Authority {
    type Err = AuthorityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || AuthorityError(crate::metrics::clip(s, MAX_SHOWN_AUTHORITY).into_owned());
        // One spelling per port: `:008080` or `:+80` would name 8080 or 80 too, and whatever
        // compares authorities as text (logs, waypoints, policies on the far side) would differ.
        let (host, port) = s.rsplit_once(':').ok_or_else(err)?;
        let port = canonical_port(port).ok_or_else(err)?;
        if let Ok(addr) = s.parse::<SocketAddr>() {
            return Ok(Authority::Addr(addr));
        }
        if !is_hostname(host) {
            return Err(err());
        }
        Ok(Authority::Host(host.to_owned(), port))
    }
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Authority::Addr(a) => a.fmt(f),
            Authority::Host(h, p) => write!(f, "{h}:{p}"),
        }
    }
}

impl Authority {
    /// The port.
    #[cfg(test)]
    pub fn port(&self) -> u16 {
        match self {
            Authority::Addr(a) => a.port(),
            Authority::Host(_, p) => *p,
        }
    }
}

impl State {
    /// Inbound (§4.3): validate a CONNECT authority against the connection's destination IP and find the upstream.
    pub fn inbound_upstream(
        &self,
        local: &Workload,
        conn_dst: IpAddr,
        authority: &Authority,
    ) -> Result<SocketAddr, InboundError> {
        let port = match authority {
            Authority::Addr(a) => {
                if a.ip() != conn_dst
                    && local.application_tunnel.is_none()
                    && !self.is_waypoint_for(local, conn_dst, a.ip())
                {
                    return Err(InboundError::IpMismatch(conn_dst, a.ip()));
                }
                a.port()
            }
            Authority::Host(host, svc_port) => {
                let svc = self
                    .service_by_hostname(host, &local.namespace)
                    .ok_or_else(|| InboundError::NoHostname(host.clone()))?;
                let endpoint_port =
                    svc.endpoints.get(&local.uid).and_then(|ep| ep.port.get(svc_port)).copied();
                match endpoint_port.or_else(|| svc.ports.get(svc_port).copied()) {
                    Some(p) if p != 0 => p,
                    _ => return Err(InboundError::NoPortForService(host.clone(), *svc_port)),
                }
            }
        };
        let port = local.app_tunnel_port().unwrap_or(port);
        Ok(SocketAddr::new(conn_dst, port))
    }

    /// Best guess of the destination service for inbound telemetry (§7.1): service of the workload whose target port equals `port`.
    pub fn guess_service(&self, w: &Workload, port: u16) -> Option<Arc<Service>> {
        w.services.iter().find_map(|(key, ports)| {
            let (ns, host) = key.split_once('/')?;
            let svc = self.service_by_name(ns, host)?;
            let matches = ports.values().any(|p| *p == port)
                || svc.ports.values().any(|p| *p == port)
                || svc.endpoints.get(&w.uid).is_some_and(|ep| ep.port.values().any(|p| *p == port));
            matches.then_some(svc)
        })
    }

    /// "Waypoint sandwich": whether the service or workload at `target` uses `local` as its
    /// waypoint (a service waypoint listing `local` as endpoint, or a workload waypoint whose
    /// IPs include `conn_dst`).
    fn is_waypoint_for(&self, local: &Workload, conn_dst: IpAddr, target: IpAddr) -> bool {
        let network = local.network.as_str();
        let gw = match self.lookup_vip(network, target, None) {
            Some(svc) => svc.waypoint.clone(),
            None => match self.workload_by_addr(network, target) {
                Some(w) => w.waypoint.clone(),
                None => return false,
            },
        };
        let Some(gw) = gw else {
            return false;
        };
        let (svc, wl) = match &gw.destination {
            Destination::Address(na) => match self.lookup_vip(&na.network, na.address, None) {
                Some(svc) => (Some(svc), None),
                None => (None, self.workload_by_addr(&na.network, na.address)),
            },
            Destination::Hostname(nh) => match self.service_by_name(&nh.namespace, &nh.hostname) {
                Some(svc) => (Some(svc), None),
                None => (None, self.workload_by_hostname(&nh.namespace, &nh.hostname)),
            },
        };
        match (svc, wl) {
            (Some(svc), _) => svc.endpoints.contains_key(&local.uid),
            (None, Some(w)) => w.workload_ips.contains(&conn_dst),
            (None, None) => false,
        }
    }
}

/// A port in its one decimal spelling: 1-65535, digits only, no leading zero.
fn canonical_port(port: &str) -> Option<u16> {
    let digits = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    if !digits || port.starts_with('0') {
        return None;
    }
    port.parse().ok()
}

/// DNS-style host: labels of letters, digits, `-` and `_`, separated by dots.
fn is_hostname(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}
