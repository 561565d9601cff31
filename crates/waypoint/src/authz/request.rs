//! The attributes of one HTTP request that policies read.

use std::net::IpAddr;

use http::HeaderMap;

/// One HTTP request as the authorization engine sees it.
///
/// `source_principal` is the peer's verified SPIFFE id (`spiffe://td/ns/NS/sa/SA`), `None` for a
/// peer without one; the source namespace is read from it, as Istio does.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// `:method`, as received (matched case-sensitively).
    pub method: &'a str,
    /// `:authority` (HTTP/1.1 `Host`), port included when the client sent one.
    pub authority: &'a str,
    /// `:path` as received, query included; normalized before matching.
    pub path: &'a str,
    /// The request headers (names are lower-case in `HeaderMap`).
    pub headers: &'a HeaderMap,
    /// The peer's SPIFFE id, with `spiffe://`.
    pub source_principal: Option<&'a str>,
    /// The downstream peer's address (`source.ip`, `ipBlocks`).
    pub source_ip: IpAddr,
    /// The original client's address (`remote.ip`, `remoteIpBlocks`); see [`remote_ip`].
    pub remote_ip: IpAddr,
    /// The destination workload's address.
    pub destination_ip: IpAddr,
    /// The destination port.
    pub destination_port: u16,
    /// The TLS server name the client asked for, if any.
    pub sni: Option<&'a str>,
}

impl Request<'_> {
    /// The namespace in the source principal (`…/ns/NS/…`), if there is one.
    pub fn source_namespace(&self) -> Option<&str> {
        let principal = self.source_principal?;
        let (_, rest) = principal.split_once("/ns/")?;
        Some(rest.split('/').next().unwrap_or(rest))
    }

    /// All values of a header joined with `,`, as Envoy's `getAllOfHeaderAsString` does before
    /// matching; `None` when the header is absent.
    pub fn header(&self, name: &http::HeaderName) -> Option<String> {
        let mut values = self.headers.get_all(name).iter();
        let first = values.next()?;
        let mut joined = String::from_utf8_lossy(first.as_bytes()).into_owned();
        for value in values {
            joined.push(',');
            joined.push_str(&String::from_utf8_lossy(value.as_bytes()));
        }
        Some(joined)
    }
}

/// The original client's address, as Envoy computes it with `use_remote_address: true` and
/// `xff_num_trusted_hops` = Istio's `numTrustedProxies`: with 0 (the default) the downstream
/// address; with N > 0 the Nth address from the right of `X-Forwarded-For` (all its headers'
/// values, comma-separated), falling back to the downstream address when there are fewer than N
/// or that one is not an IP address.
pub fn remote_ip(downstream: IpAddr, headers: &HeaderMap, num_trusted_proxies: u32) -> IpAddr {
    let Ok(n) = usize::try_from(num_trusted_proxies) else {
        return downstream;
    };
    if n == 0 {
        return downstream;
    }
    let mut entries = Vec::new();
    for value in headers.get_all("x-forwarded-for").iter() {
        // An unreadable value would shift the positions: trust none of the header then.
        let Ok(text) = value.to_str() else {
            return downstream;
        };
        entries.extend(text.split(',').map(str::trim));
    }
    entries.len().checked_sub(n).and_then(|index| entries[index].parse().ok()).unwrap_or(downstream)
}
