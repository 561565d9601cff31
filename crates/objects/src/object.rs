//! One object of any kind Ambit reads, its kind, and its key.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::Resource;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::gateway::{Gateway, GatewayClass};
use crate::istio::{AuthorizationPolicy, PeerAuthentication, ServiceEntry, WorkloadEntry};
use crate::route::{GrpcRoute, HttpRoute, ReferenceGrant};
use crate::strict::{self, Decoding, FieldError};

macro_rules! kinds {
    ($($variant:ident($ty:ty)),+ $(,)?) => {
        /// The kinds Ambit reads.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Kind {
            $(
                #[doc = concat!("`", stringify!($variant), "`")]
                $variant,
            )+
        }

        /// One object; shared, since sources and indices hold the same object.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Object {
            $(
                #[doc = concat!("A ", stringify!($variant), ".")]
                $variant(Arc<$ty>),
            )+
        }

        impl Kind {
            /// Every kind, in a fixed order.
            pub const ALL: &'static [Kind] = &[$(Kind::$variant),+];

            /// `apiVersion` (`group/version`, or `v1` for the core group).
            pub fn api_version(self) -> &'static str {
                match self {
                    $(Kind::$variant => <$ty as Resource>::API_VERSION,)+
                }
            }

            /// `kind`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$variant => <$ty as Resource>::KIND,)+
                }
            }

            /// The API group (empty for the core group).
            pub fn group(self) -> &'static str {
                match self {
                    $(Kind::$variant => <$ty as Resource>::GROUP,)+
                }
            }

            /// The kind named by `apiVersion` and `kind`, if Ambit reads it. Besides each kind's
            /// own version, the older versions the API server still serves with the same schema
            /// are accepted (`security.istio.io/v1beta1`, `networking.istio.io/v1beta1` and
            /// `v1alpha3`, `gateway.networking.k8s.io/v1beta1`), so existing YAML reads as is.
            pub fn of(api_version: &str, kind: &str) -> Option<Kind> {
                $(
                    if kind == <$ty as Resource>::KIND
                        && (api_version == <$ty as Resource>::API_VERSION
                            || older_version(<$ty as Resource>::GROUP, api_version))
                    {
                        return Some(Kind::$variant);
                    }
                )+
                None
            }
        }

        impl Object {
            /// Its kind.
            pub fn kind(&self) -> Kind {
                match self {
                    $(Object::$variant(_) => Kind::$variant,)+
                }
            }

            /// Its metadata.
            pub fn metadata(&self) -> &ObjectMeta {
                match self {
                    $(Object::$variant(o) => k8s_openapi::Metadata::metadata(&**o),)+
                }
            }

            /// Parses a JSON value (one Kubernetes object) by its `apiVersion` and `kind`,
            /// leniently: [`Object::decode`] with [`Decoding::Lenient`].
            pub fn from_value(value: serde_json::Value) -> Result<Object, ObjectError> {
                Object::decode(value, Decoding::Lenient)
            }

            /// Parses a JSON value (one Kubernetes object, from the API or from YAML) by its
            /// `apiVersion` and `kind`. [`Decoding::Strict`] (files) refuses unknown fields and
            /// unsupported enum values, naming the field ([`ObjectError::Field`]);
            /// [`Decoding::Lenient`] ignores them, as objects the API server validated are read.
            ///
            /// A cluster-scoped object's `metadata.namespace` is dropped, as the API server
            /// drops it: the object is the same object with or without it.
            pub fn decode(mut value: serde_json::Value, decoding: Decoding) -> Result<Object, ObjectError> {
                let api_version = value.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default();
                let kind_name = value.get("kind").and_then(|v| v.as_str()).unwrap_or_default();
                let Some(kind) = Kind::of(api_version, kind_name) else {
                    return Err(ObjectError::UnknownKind {
                        api_version: api_version.to_owned(),
                        kind: kind_name.to_owned(),
                    });
                };
                if !kind.is_namespaced()
                    && let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut())
                {
                    meta.remove("namespace");
                }
                let object = match (kind, decoding) {
                    $((Kind::$variant, Decoding::Lenient) => Object::$variant(Arc::new(
                        serde_json::from_value::<$ty>(value)
                            .map_err(|source| ObjectError::Decode { kind, source })?,
                    )),
                    (Kind::$variant, Decoding::Strict) => {
                        let object = Object::$variant(Arc::new(
                            strict::decode::<$ty>(&value, decoding)
                                .map_err(|error| ObjectError::field(kind, &value, error))?,
                        ));
                        object.check_enums().map_err(|error| ObjectError::field(kind, &value, error))?;
                        object
                    })+
                };
                object.check()?;
                Ok(object)
            }
        }

        $(
            impl From<$ty> for Object {
                fn from(o: $ty) -> Object {
                    Object::$variant(Arc::new(o))
                }
            }
        )+
    };
}

kinds! {
    Namespace(Namespace),
    Node(Node),
    Pod(Pod),
    Service(Service),
    EndpointSlice(EndpointSlice),
    ServiceEntry(ServiceEntry),
    WorkloadEntry(WorkloadEntry),
    AuthorizationPolicy(AuthorizationPolicy),
    PeerAuthentication(PeerAuthentication),
    Gateway(Gateway),
    GatewayClass(GatewayClass),
    HttpRoute(HttpRoute),
    GrpcRoute(GrpcRoute),
    ReferenceGrant(ReferenceGrant),
}

/// Whether `api_version` is an older version of `group` served with the same schema.
fn older_version(group: &str, api_version: &str) -> bool {
    let Some((g, v)) = api_version.split_once('/') else { return false };
    g == group
        && match group {
            "security.istio.io" => v == "v1beta1",
            // ReferenceGrant's own version is v1beta1; newer Gateway API releases also serve v1.
            "gateway.networking.k8s.io" => v == "v1beta1" || v == "v1",
            "networking.istio.io" => v == "v1beta1" || v == "v1alpha3",
            _ => false,
        }
}

impl Kind {
    /// Whether objects of this kind live in a namespace.
    pub fn is_namespaced(self) -> bool {
        !matches!(self, Kind::Namespace | Kind::Node | Kind::GatewayClass)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Names one object: kind, namespace (empty for cluster-scoped kinds) and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// The kind.
    pub kind: Kind,
    /// The namespace (empty for cluster-scoped kinds).
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// A key.
    pub fn new(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> ObjectKey {
        ObjectKey { kind, namespace: namespace.into(), name: name.into() }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

impl Object {
    /// Its key.
    pub fn key(&self) -> ObjectKey {
        let m = self.metadata();
        ObjectKey {
            kind: self.kind(),
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
        }
    }

    /// The enum-like strings the CRD schemas restrict (see [`crate::istio`] and
    /// [`crate::gateway`]'s constants): the first value outside its enumeration.
    fn check_enums(&self) -> Result<(), FieldError> {
        use crate::gateway::ROUTE_NAMESPACES_FROM;
        use crate::istio::{ACTIONS, LOCATIONS, MTLS_MODES, RESOLUTIONS};
        match self {
            Object::AuthorizationPolicy(ap) => {
                strict::check_enum(&["spec", "action"], &ap.spec.action, ACTIONS)
            }
            Object::PeerAuthentication(pa) => {
                if let Some(m) = &pa.spec.mtls {
                    strict::check_enum(&["spec", "mtls", "mode"], &m.mode, MTLS_MODES)?;
                }
                for (port, m) in &pa.spec.port_level_mtls {
                    let port = port.to_string();
                    strict::check_enum(&["spec", "portLevelMtls", &port, "mode"], &m.mode, MTLS_MODES)?;
                }
                Ok(())
            }
            Object::ServiceEntry(se) => {
                strict::check_enum(&["spec", "location"], &se.spec.location, LOCATIONS)?;
                strict::check_enum(&["spec", "resolution"], &se.spec.resolution, RESOLUTIONS)
            }
            Object::Gateway(gw) => {
                for (i, l) in gw.spec.listeners.iter().enumerate() {
                    if let Some(n) = l.allowed_routes.as_ref().and_then(|a| a.namespaces.as_ref())
                        && !n.from.is_empty()
                        && !ROUTE_NAMESPACES_FROM.contains(&n.from.as_str())
                    {
                        let mut path = strict::FieldPath::keys(&["spec", "listeners"]);
                        path.0.push(strict::Step::Index(i));
                        path.0.extend(
                            ["allowedRoutes", "namespaces", "from"].map(|k| strict::Step::Key(k.to_owned())),
                        );
                        let value = n.from.clone();
                        return Err(FieldError::Unsupported {
                            path,
                            value,
                            supported: ROUTE_NAMESPACES_FROM,
                        });
                    }
                }
                Ok(())
            }
            Object::HttpRoute(r) => crate::route::check_http(r),
            Object::GrpcRoute(r) => crate::route::check_grpc(r),
            _ => Ok(()),
        }
    }

    /// A namespaced object needs a namespace, every object a name.
    fn check(&self) -> Result<(), ObjectError> {
        let m = self.metadata();
        let kind = self.kind();
        if m.name.as_deref().unwrap_or_default().is_empty() {
            return Err(ObjectError::Missing { kind, field: "metadata.name" });
        }
        if kind.is_namespaced() && m.namespace.as_deref().unwrap_or_default().is_empty() {
            return Err(ObjectError::Missing { kind, field: "metadata.namespace" });
        }
        Ok(())
    }
}

impl ObjectError {
    /// A field error of the object `value` of `kind` (named by its metadata where it has one).
    pub fn field(kind: Kind, value: &serde_json::Value, error: FieldError) -> ObjectError {
        ObjectError::Field { kind, what: describe(kind.name(), value), error }
    }
}

/// `Kind namespace/name`, `Kind name` or `Kind`, from an object's metadata as written.
pub fn describe(kind: &str, value: &serde_json::Value) -> String {
    let text = |key: &str| value.get("metadata").and_then(|m| m.get(key)).and_then(|v| v.as_str());
    match (text("namespace").filter(|n| !n.is_empty()), text("name").filter(|n| !n.is_empty())) {
        (Some(ns), Some(name)) => format!("{kind} {ns}/{name}"),
        (None, Some(name)) => format!("{kind} {name}"),
        _ => kind.to_owned(),
    }
}

/// Why a value is not a usable object.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// A kind Ambit does not read (sources skip these).
    #[error("kind {kind} of {api_version} is not one Ambit reads")]
    UnknownKind {
        /// The value's `apiVersion`.
        api_version: String,
        /// The value's `kind`.
        kind: String,
    },
    /// The value does not have the kind's shape.
    #[error("not a valid {kind}: {source}")]
    Decode {
        /// The kind.
        kind: Kind,
        /// The decoder's error.
        source: serde_json::Error,
    },
    /// A field of a strictly decoded object is unknown, of the wrong type or unsupported.
    #[error("{what}: {error}")]
    Field {
        /// The kind.
        kind: Kind,
        /// The object as far as it is named: `Deployment demo/web`, `Namespace demo`, `Pod`.
        what: String,
        /// The field and what is wrong with it.
        error: FieldError,
    },
    /// A required field is empty.
    #[error("{kind} has no {field}")]
    Missing {
        /// The kind.
        kind: Kind,
        /// The missing field.
        field: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_cluster_scoped_object_has_no_namespace_even_when_one_is_written() {
        // Found by the objects_yaml fuzz target: a Namespace with metadata.namespace.
        let o = Object::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "strict", "namespace": "demo"},
        }))
        .expect("a Namespace");
        assert_eq!(o.key(), ObjectKey::new(Kind::Namespace, "", "strict"));
        assert_eq!(o.metadata().namespace, None);
    }

    #[test]
    fn parses_by_api_version_and_kind() {
        let o = Object::from_value(json!({
            "apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"mtls": {"mode": "STRICT"}, "portLevelMtls": {"9090": {"mode": "DISABLE"}}},
        }))
        .expect("parses");
        assert_eq!(o.key(), ObjectKey::new(Kind::PeerAuthentication, "ns", "p"));
        let Object::PeerAuthentication(pa) = o else { panic!("kind") };
        assert_eq!(pa.spec.port_level_mtls[&9090].mode, "DISABLE");
    }

    #[test]
    fn the_kubernetes_api_path_stays_lenient() {
        // What a newer Istio adds, and values the API server's schema let through, still read.
        let value = json!({
            "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"action": "deny", "rulez": [], "newField": {"x": 1}},
        });
        let Object::AuthorizationPolicy(ap) = Object::from_value(value.clone()).expect("lenient") else {
            panic!("kind")
        };
        assert_eq!(ap.spec.action, "deny");
        let e = Object::decode(value, Decoding::Strict).expect_err("strict");
        assert_eq!(
            e.to_string(),
            r#"AuthorizationPolicy ns/p: unknown field "spec.newField""#,
            "the first unknown field in key order"
        );
    }

    #[test]
    fn strict_errors_name_the_object_as_far_as_it_is_named() {
        let e = Object::decode(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n", "labels": "x"}}),
            Decoding::Strict,
        )
        .expect_err("labels");
        assert_eq!(
            e.to_string(),
            r#"Namespace n: metadata.labels: invalid type: string "x", expected a map"#
        );
        let e = Object::decode(json!({"apiVersion": "v1", "kind": "Pod", "metadata": 3}), Decoding::Strict)
            .expect_err("metadata");
        assert_eq!(e.to_string(), "Pod: metadata: invalid type: integer `3`, expected ObjectMeta");
        // `null` is absent, not unknown.
        let ok = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n", "bogus": null}});
        Object::decode(ok, Decoding::Strict).expect("a null is no field");
    }

    #[test]
    fn refuses_unknown_kinds_and_missing_names() {
        let e = Object::from_value(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService"}))
            .expect_err("unknown");
        assert_eq!(e.to_string(), "kind VirtualService of networking.istio.io/v1 is not one Ambit reads");
        let e = Object::from_value(json!({"apiVersion": "v2", "kind": "Pod"})).expect_err("unknown version");
        assert_eq!(e.to_string(), "kind Pod of v2 is not one Ambit reads");
        let old = json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "ServiceEntry",
            "metadata": {"name": "se", "namespace": "ns"}, "spec": {"hosts": ["a.example.com"]}});
        assert_eq!(Object::from_value(old).expect("older version").kind(), Kind::ServiceEntry);
        let e = Object::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}))
            .expect_err("no namespace");
        assert_eq!(e.to_string(), "Pod has no metadata.namespace");
        let e = Object::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {}}))
            .expect_err("no name");
        assert_eq!(e.to_string(), "Namespace has no metadata.name");
    }
}

/// One change a source reports: an object added or replaced, or one removed.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Added, or replaced by this version.
    Upsert(Object),
    /// Removed.
    Delete(ObjectKey),
}

impl Change {
    /// The key of the object that changed.
    pub fn key(&self) -> ObjectKey {
        match self {
            Change::Upsert(o) => o.key(),
            Change::Delete(k) => k.clone(),
        }
    }
}
