//! The Gateway API kinds that configure waypoints: `gateway.networking.k8s.io/v1` HTTPRoute and
//! GRPCRoute, and `v1beta1` ReferenceGrant (what allows a route to name a backend in another
//! namespace), reduced to the fields `ambit control` translates.
//!
//! Optional fields whose absence means something other than their empty value (a parentRef's
//! `group`, absent: `gateway.networking.k8s.io`; present and empty: the core group) are
//! `Option`s. Enum-like fields stay strings; files must hold one of the constants below (as the
//! Gateway API's CRD schemas require), checked by [`crate::Object`]'s strict decoding.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::istio::custom_kind;
use crate::strict::{FieldError, FieldPath, Step};

/// `matches[].path.type` (absent: `PathPrefix`).
pub const PATH_MATCH_TYPES: &[&str] = &["Exact", "PathPrefix", "RegularExpression"];
/// `matches[].headers[].type` and `queryParams[].type` (absent: `Exact`).
pub const VALUE_MATCH_TYPES: &[&str] = &["Exact", "RegularExpression"];
/// `matches[].method` of an HTTPRoute.
pub const METHODS: &[&str] =
    &["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];
/// `filters[].type` of an HTTPRoute.
pub const HTTP_FILTER_TYPES: &[&str] = &[
    "RequestHeaderModifier",
    "ResponseHeaderModifier",
    "RequestMirror",
    "RequestRedirect",
    "URLRewrite",
    "ExtensionRef",
];
/// `filters[].type` of a GRPCRoute.
pub const GRPC_FILTER_TYPES: &[&str] =
    &["RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "ExtensionRef"];
/// `matches[].method.type` of a GRPCRoute (absent: `Exact`).
pub const GRPC_METHOD_MATCH_TYPES: &[&str] = &["Exact", "RegularExpression"];
/// `urlRewrite.path.type` and `requestRedirect.path.type`.
pub const PATH_MODIFIER_TYPES: &[&str] = &["ReplaceFullPath", "ReplacePrefixMatch"];

/// `gateway.networking.k8s.io/v1` HTTPRoute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HttpRoute {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The route.
    pub spec: HttpRouteSpec,
}
custom_kind!(HttpRoute, "gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes");

/// `HTTPRoute.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteSpec {
    /// What the route attaches to (for waypoints: a Service, or the waypoint's Gateway).
    pub parent_refs: Vec<ParentReference>,
    /// Host names the route answers (empty: any).
    pub hostnames: Vec<String>,
    /// Rules.
    pub rules: Vec<HttpRouteRule>,
}

/// `spec.parentRefs[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ParentReference {
    /// API group (absent: `gateway.networking.k8s.io`; `""`: the core group, for a Service).
    pub group: Option<String>,
    /// Kind (absent: `Gateway`).
    pub kind: Option<String>,
    /// Namespace (absent: the route's).
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// A listener of a Gateway, or a port name of a Service.
    pub section_name: Option<String>,
    /// A port of the parent.
    pub port: Option<u16>,
}

/// `spec.rules[]` of an HTTPRoute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteRule {
    /// The rule's name.
    pub name: Option<String>,
    /// OR-ed matches (empty: a `/` prefix).
    pub matches: Vec<HttpRouteMatch>,
    /// Filters applied to every request the rule takes.
    pub filters: Vec<HttpRouteFilter>,
    /// Where requests go.
    pub backend_refs: Vec<BackendRef>,
    /// Timeouts.
    pub timeouts: Option<HttpRouteTimeouts>,
    /// Retries (Gateway API experimental; Istio's waypoints honour it).
    pub retry: Option<HttpRouteRetry>,
}

/// `rules[].matches[]` of an HTTPRoute.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteMatch {
    /// The path (absent: a `/` prefix).
    pub path: Option<HttpPathMatch>,
    /// Headers, all of which must match.
    pub headers: Vec<ValueMatch>,
    /// Query parameters, all of which must match.
    pub query_params: Vec<ValueMatch>,
    /// The method.
    pub method: Option<String>,
}

/// `matches[].path`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpPathMatch {
    /// `Exact`, `PathPrefix` (absent) or `RegularExpression`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The value (absent: `/`).
    pub value: Option<String>,
}

/// `matches[].headers[]` and `matches[].queryParams[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ValueMatch {
    /// `Exact` (absent) or `RegularExpression`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Header name (case-insensitive) or query parameter name (exact).
    pub name: String,
    /// The value.
    pub value: String,
}

/// `rules[].filters[]` (and `backendRefs[].filters[]`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteFilter {
    /// Which filter ([`HTTP_FILTER_TYPES`]).
    #[serde(rename = "type")]
    pub kind: String,
    /// With `RequestHeaderModifier`.
    pub request_header_modifier: Option<HeaderModifier>,
    /// With `ResponseHeaderModifier`.
    pub response_header_modifier: Option<HeaderModifier>,
    /// With `URLRewrite`.
    pub url_rewrite: Option<UrlRewrite>,
    /// With `RequestRedirect`.
    pub request_redirect: Option<RequestRedirect>,
    /// With `RequestMirror`.
    pub request_mirror: Option<RequestMirror>,
    /// With `ExtensionRef` (not supported by waypoints; kept so it can be reported).
    pub extension_ref: Option<serde_json::Value>,
}

/// `requestHeaderModifier` / `responseHeaderModifier`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HeaderModifier {
    /// Headers set (replacing).
    pub set: Vec<HttpHeader>,
    /// Headers added.
    pub add: Vec<HttpHeader>,
    /// Header names removed.
    pub remove: Vec<String>,
}

/// A header name and value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HttpHeader {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// `urlRewrite`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct UrlRewrite {
    /// The new host.
    pub hostname: Option<String>,
    /// The new path.
    pub path: Option<PathModifier>,
}

/// `urlRewrite.path` / `requestRedirect.path`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`.
    #[serde(rename = "type")]
    pub kind: String,
    /// With `ReplaceFullPath`.
    pub replace_full_path: Option<String>,
    /// With `ReplacePrefixMatch`.
    pub replace_prefix_match: Option<String>,
}

/// `requestRedirect`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RequestRedirect {
    /// `http` or `https`.
    pub scheme: Option<String>,
    /// The new host.
    pub hostname: Option<String>,
    /// The new path.
    pub path: Option<PathModifier>,
    /// The new port.
    pub port: Option<u16>,
    /// 301 or 302 (absent: 302).
    pub status_code: Option<u16>,
}

/// `requestMirror`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RequestMirror {
    /// Where copies go.
    pub backend_ref: BackendRef,
    /// The share of requests copied, 0–100 (absent: all).
    pub percent: Option<u32>,
    /// The share as a fraction (`denominator` absent: 100).
    pub fraction: Option<Fraction>,
}

/// `requestMirror.fraction`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Fraction {
    /// Numerator.
    pub numerator: u32,
    /// Denominator (absent: 100).
    pub denominator: Option<u32>,
}

/// `rules[].backendRefs[]` (and a mirror's `backendRef`, without weight and filters).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BackendRef {
    /// API group (absent or `""`: the core group).
    pub group: Option<String>,
    /// Kind (absent: `Service`).
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace (absent: the route's; another needs a ReferenceGrant).
    pub namespace: Option<String>,
    /// The Service port.
    pub port: Option<u16>,
    /// Relative weight (absent: 1).
    pub weight: Option<u32>,
    /// Filters for requests to this backend only.
    pub filters: Vec<HttpRouteFilter>,
}

/// `rules[].timeouts`, Gateway API durations (`10s`, `500ms`, `1h2m`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteTimeouts {
    /// The whole request, retries included.
    pub request: Option<String>,
    /// One attempt.
    pub backend_request: Option<String>,
}

/// `rules[].retry`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteRetry {
    /// Retries after the first attempt.
    pub attempts: Option<u32>,
    /// Wait between attempts (a Gateway API duration).
    pub backoff: Option<String>,
    /// Statuses retried.
    pub codes: Vec<u16>,
}

/// `gateway.networking.k8s.io/v1` GRPCRoute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GrpcRoute {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The route.
    pub spec: GrpcRouteSpec,
}
custom_kind!(GrpcRoute, "gateway.networking.k8s.io", "v1", "GRPCRoute", "grpcroutes");

/// `GRPCRoute.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcRouteSpec {
    /// What the route attaches to.
    pub parent_refs: Vec<ParentReference>,
    /// Host names the route answers (empty: any).
    pub hostnames: Vec<String>,
    /// Rules.
    pub rules: Vec<GrpcRouteRule>,
}

/// `spec.rules[]` of a GRPCRoute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcRouteRule {
    /// The rule's name.
    pub name: Option<String>,
    /// OR-ed matches (empty: every request).
    pub matches: Vec<GrpcRouteMatch>,
    /// Filters ([`GRPC_FILTER_TYPES`]).
    pub filters: Vec<HttpRouteFilter>,
    /// Where requests go.
    pub backend_refs: Vec<BackendRef>,
}

/// `rules[].matches[]` of a GRPCRoute.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcRouteMatch {
    /// The gRPC method.
    pub method: Option<GrpcMethodMatch>,
    /// Headers, all of which must match.
    pub headers: Vec<ValueMatch>,
}

/// `matches[].method` of a GRPCRoute.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcMethodMatch {
    /// `Exact` (absent) or `RegularExpression`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The fully qualified service (`pkg.Service`; absent: any).
    pub service: Option<String>,
    /// The method (absent: any).
    pub method: Option<String>,
}

/// `gateway.networking.k8s.io/v1beta1` ReferenceGrant: lets objects of the `from` namespaces
/// refer to objects of this one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReferenceGrant {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The grant.
    pub spec: ReferenceGrantSpec,
}
custom_kind!(ReferenceGrant, "gateway.networking.k8s.io", "v1beta1", "ReferenceGrant", "referencegrants");

/// `ReferenceGrant.spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    /// Who may refer.
    pub from: Vec<ReferenceGrantFrom>,
    /// To what in this namespace.
    pub to: Vec<ReferenceGrantTo>,
}

/// `spec.from[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReferenceGrantFrom {
    /// API group of the referring kind.
    pub group: String,
    /// The referring kind (`HTTPRoute`, `GRPCRoute`).
    pub kind: String,
    /// The referring objects' namespace.
    pub namespace: String,
}

/// `spec.to[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReferenceGrantTo {
    /// API group of the kind referred to (`""` for Services).
    pub group: String,
    /// The kind referred to.
    pub kind: String,
    /// One object (absent: all of the kind).
    pub name: Option<String>,
}

/// A field path under `spec.rules[i]`.
fn rule_path(i: usize, rest: &[Step]) -> FieldPath {
    let mut path = FieldPath::keys(&["spec", "rules"]);
    path.0.push(Step::Index(i));
    path.0.extend(rest.iter().cloned());
    path
}

fn key(k: &str) -> Step {
    Step::Key(k.to_owned())
}

/// `value` (absent counts as allowed) must be one of `supported`.
fn check(path: FieldPath, value: Option<&str>, supported: &'static [&'static str]) -> Result<(), FieldError> {
    match value {
        Some(v) if !v.is_empty() && !supported.contains(&v) => {
            Err(FieldError::Unsupported { path, value: v.to_owned(), supported })
        }
        _ => Ok(()),
    }
}

fn check_filters(
    filters: &[HttpRouteFilter],
    at: &dyn Fn(usize) -> Vec<Step>,
    rule: usize,
    supported: &'static [&'static str],
) -> Result<(), FieldError> {
    for (f, filter) in filters.iter().enumerate() {
        let mut steps = at(f);
        steps.push(key("type"));
        check(rule_path(rule, &steps), Some(&filter.kind), supported)?;
        let modifiers = [
            ("urlRewrite", filter.url_rewrite.as_ref().and_then(|r| r.path.as_ref())),
            ("requestRedirect", filter.request_redirect.as_ref().and_then(|r| r.path.as_ref())),
        ];
        for (name, path) in modifiers {
            if let Some(p) = path {
                let mut steps = at(f);
                steps.extend([key(name), key("path"), key("type")]);
                check(rule_path(rule, &steps), Some(&p.kind), PATH_MODIFIER_TYPES)?;
            }
        }
    }
    Ok(())
}

/// The enum-like strings of an HTTPRoute ([`PATH_MATCH_TYPES`], [`VALUE_MATCH_TYPES`],
/// [`METHODS`], [`HTTP_FILTER_TYPES`], [`PATH_MODIFIER_TYPES`]): the first value outside its
/// enumeration.
pub(crate) fn check_http(route: &HttpRoute) -> Result<(), FieldError> {
    for (r, rule) in route.spec.rules.iter().enumerate() {
        for (m, mat) in rule.matches.iter().enumerate() {
            let at = |rest: &[&str]| {
                let mut steps = vec![key("matches"), Step::Index(m)];
                steps.extend(rest.iter().map(|k| key(k)));
                steps
            };
            if let Some(p) = &mat.path {
                check(rule_path(r, &at(&["path", "type"])), p.kind.as_deref(), PATH_MATCH_TYPES)?;
            }
            for (field, list) in [("headers", &mat.headers), ("queryParams", &mat.query_params)] {
                for (h, v) in list.iter().enumerate() {
                    let mut steps = at(&[field]);
                    steps.extend([Step::Index(h), key("type")]);
                    check(rule_path(r, &steps), v.kind.as_deref(), VALUE_MATCH_TYPES)?;
                }
            }
            check(rule_path(r, &at(&["method"])), mat.method.as_deref(), METHODS)?;
        }
        check_filters(&rule.filters, &|f: usize| vec![key("filters"), Step::Index(f)], r, HTTP_FILTER_TYPES)?;
        for (b, backend) in rule.backend_refs.iter().enumerate() {
            let at = |f: usize| vec![key("backendRefs"), Step::Index(b), key("filters"), Step::Index(f)];
            check_filters(&backend.filters, &at, r, HTTP_FILTER_TYPES)?;
        }
    }
    Ok(())
}

/// The enum-like strings of a GRPCRoute ([`GRPC_METHOD_MATCH_TYPES`], [`VALUE_MATCH_TYPES`],
/// [`GRPC_FILTER_TYPES`]).
pub(crate) fn check_grpc(route: &GrpcRoute) -> Result<(), FieldError> {
    for (r, rule) in route.spec.rules.iter().enumerate() {
        for (m, mat) in rule.matches.iter().enumerate() {
            if let Some(method) = &mat.method {
                let steps = [key("matches"), Step::Index(m), key("method"), key("type")];
                check(rule_path(r, &steps), method.kind.as_deref(), GRPC_METHOD_MATCH_TYPES)?;
            }
            for (h, v) in mat.headers.iter().enumerate() {
                let steps = [key("matches"), Step::Index(m), key("headers"), Step::Index(h), key("type")];
                check(rule_path(r, &steps), v.kind.as_deref(), VALUE_MATCH_TYPES)?;
            }
        }
        check_filters(&rule.filters, &|f: usize| vec![key("filters"), Step::Index(f)], r, GRPC_FILTER_TYPES)?;
        for (b, backend) in rule.backend_refs.iter().enumerate() {
            let at = |f: usize| vec![key("backendRefs"), Step::Index(b), key("filters"), Step::Index(f)];
            check_filters(&backend.filters, &at, r, GRPC_FILTER_TYPES)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Decoding, Kind, Object};

    fn route(rules: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "a", "port": 80}], "rules": rules},
        })
    }

    #[test]
    fn an_http_route_reads_with_its_optional_fields_kept_apart_from_empty_ones() {
        let v = route(json!([{
            "matches": [{"path": {"type": "PathPrefix", "value": "/a"}, "headers": [{"name": "x", "value": "1"}]}],
            "backendRefs": [{"name": "a", "port": 80, "weight": 90}, {"name": "b", "port": 80}],
            "timeouts": {"request": "10s"},
            "retry": {"attempts": 2, "backoff": "100ms", "codes": [503]},
        }]));
        let Object::HttpRoute(r) = Object::decode(v, Decoding::Strict).expect("strict") else {
            panic!("kind")
        };
        let parent = &r.spec.parent_refs[0];
        assert_eq!(
            (parent.group.as_deref(), parent.kind.as_deref(), parent.port),
            (Some(""), Some("Service"), Some(80))
        );
        let rule = &r.spec.rules[0];
        assert_eq!(rule.backend_refs[1].weight, None, "absent, which means 1");
        assert_eq!(rule.retry.as_ref().map(|r| r.codes.clone()), Some(vec![503]));
    }

    #[test]
    fn files_with_a_typo_or_an_unknown_value_are_refused_naming_the_field() {
        let e = Object::decode(route(json!([{"backendRef": [{"name": "a"}]}])), Decoding::Strict)
            .expect_err("typo");
        assert_eq!(
            e.to_string(),
            r#"HTTPRoute ns/r: unknown field "spec.rules[0].backendRef" (did you mean "backendRefs"?)"#
        );
        let v = route(json!([{"matches": [{"path": {"type": "Prefix", "value": "/"}}]}]));
        let e = Object::decode(v, Decoding::Strict).expect_err("enum");
        assert_eq!(
            e.to_string(),
            r#"HTTPRoute ns/r: spec.rules[0].matches[0].path.type: Unsupported value: "Prefix": supported values: "Exact", "PathPrefix", "RegularExpression""#
        );
        let v =
            route(json!([{"filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "Full"}}}]}]));
        let e = Object::decode(v, Decoding::Strict).expect_err("modifier");
        assert_eq!(
            e.to_string(),
            r#"HTTPRoute ns/r: spec.rules[0].filters[0].urlRewrite.path.type: Unsupported value: "Full": supported values: "ReplaceFullPath", "ReplacePrefixMatch""#
        );
    }

    #[test]
    fn grpc_routes_and_reference_grants_read_by_their_versions() {
        let v = json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"rules": [{"matches": [{"method": {"type": "Regex", "service": "a.B"}}]}]},
        });
        let e = Object::decode(v, Decoding::Strict).expect_err("enum");
        assert_eq!(
            e.to_string(),
            r#"GRPCRoute ns/g: spec.rules[0].matches[0].method.type: Unsupported value: "Regex": supported values: "Exact", "RegularExpression""#
        );
        for version in ["v1beta1", "v1"] {
            let v = json!({
                "apiVersion": format!("gateway.networking.k8s.io/{version}"), "kind": "ReferenceGrant",
                "metadata": {"name": "g", "namespace": "other"},
                "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "ns"}],
                         "to": [{"group": "", "kind": "Service"}]},
            });
            assert_eq!(Object::decode(v, Decoding::Strict).expect("grant").kind(), Kind::ReferenceGrant);
        }
    }
}
