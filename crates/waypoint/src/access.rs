//! The access log: one line per HTTP request in the shape of Istio's default access log
//! (Envoy's `%START_TIME% "%METHOD% %PATH% %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_FLAGS%
//! %RESPONSE_CODE_DETAILS% …` text format), logged with target `access` at info, so a
//! denial names the policy that decided it (`rbac_access_denied_matched_policy[ns[<ns>]-policy[<name>]]`,
//! or `[none]` with the ALLOW policies none of which matched) and `POST /logging?level=access:off` (or
//! `RUST_LOG=access=off`) turns it off. Fields the waypoint does not know are `-`, as in Envoy.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, Method, Version};

/// What the request said, taken before it is answered.
pub(crate) struct Seen {
    pub(crate) start: SystemTime,
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) version: Version,
    pub(crate) forwarded_for: Option<String>,
    pub(crate) user_agent: Option<String>,
    pub(crate) request_id: Option<String>,
    pub(crate) authority: Option<String>,
}

impl Seen {
    pub(crate) fn of(method: &Method, uri: &http::Uri, version: Version, headers: &HeaderMap) -> Seen {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        Seen {
            start: SystemTime::now(),
            method: method.clone(),
            path: uri.path_and_query().map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
            version,
            forwarded_for: header("x-forwarded-for"),
            user_agent: header("user-agent"),
            request_id: header("x-request-id"),
            authority: uri.authority().map(|a| a.as_str().to_owned()).or_else(|| header("host")),
        }
    }
}

/// How the request ended.
pub(crate) struct Outcome<'a> {
    pub(crate) status: u16,
    pub(crate) flags: &'a str,
    pub(crate) details: &'a str,
    pub(crate) duration: Duration,
    pub(crate) upstream: Option<IpAddr>,
    pub(crate) cluster: Option<&'a str>,
    pub(crate) local: SocketAddr,
    pub(crate) remote: IpAddr,
}

/// Response code details of a denial: the DENY policy that matched, else `none` (no ALLOW
/// policy matched).
pub(crate) fn denied_details(policy: Option<&str>) -> String {
    match policy.and_then(|p| p.split_once('/')) {
        Some((ns, name)) => format!("rbac_access_denied_matched_policy[ns[{ns}]-policy[{name}]]"),
        None => "rbac_access_denied_matched_policy[none]".to_owned(),
    }
}

/// The line.
pub(crate) fn line(seen: &Seen, out: &Outcome<'_>) -> String {
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
    let version = match seen.version {
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_10 => "HTTP/1.0",
        _ => "HTTP/1.1",
    };
    let mut s = String::with_capacity(256);
    let _ = write!(
        s,
        "[{}] \"{} {} {version}\" {} {} {} - \"-\" - - {} - \"{}\" \"{}\" \"{}\" \"{}\" \"{}\" {} - {} {}:0 - default",
        ambit_identity::rfc3339_millis(seen.start),
        seen.method,
        seen.path,
        out.status,
        out.flags,
        out.details,
        out.duration.as_millis(),
        dash(&seen.forwarded_for),
        dash(&seen.user_agent),
        dash(&seen.request_id),
        dash(&seen.authority),
        out.upstream.map_or_else(|| "-".to_owned(), |a| a.to_string()),
        out.cluster.unwrap_or("-"),
        out.local,
        out.remote,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_names_its_policy_in_envoys_shape() {
        assert_eq!(
            denied_details(Some("shop/deny-delete")),
            "rbac_access_denied_matched_policy[ns[shop]-policy[deny-delete]]"
        );
        assert_eq!(denied_details(None), "rbac_access_denied_matched_policy[none]");
        let mut headers = HeaderMap::new();
        headers.insert("user-agent", "curl/8".parse().expect("value"));
        let uri: http::Uri = "/api/x?y=1".parse().expect("uri");
        let mut seen = Seen::of(&Method::DELETE, &uri, Version::HTTP_11, &headers);
        seen.start = SystemTime::UNIX_EPOCH + Duration::from_millis(1_500);
        let out = Outcome {
            status: 403,
            flags: "RBAC",
            details: &denied_details(Some("shop/deny-delete")),
            duration: Duration::from_millis(2),
            upstream: None,
            cluster: Some("inbound-vip|8080|http|reviews.shop.svc.cluster.local"),
            local: "10.96.0.1:8080".parse().expect("addr"),
            remote: "10.244.1.2".parse().expect("ip"),
        };
        assert_eq!(
            line(&seen, &out),
            "[1970-01-01T00:00:01.500Z] \"DELETE /api/x?y=1 HTTP/1.1\" 403 RBAC \
             rbac_access_denied_matched_policy[ns[shop]-policy[deny-delete]] - \"-\" - - 2 - \"-\" \"curl/8\" \
             \"-\" \"-\" \"-\" inbound-vip|8080|http|reviews.shop.svc.cluster.local - 10.96.0.1:8080 \
             10.244.1.2:0 - default"
        );
    }
}
