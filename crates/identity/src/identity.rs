//! SPIFFE workload identities: `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.

use std::fmt;
use std::str::FromStr;

/// A workload's SPIFFE identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    /// Trust domain, e.g. `cluster.local`.
    pub trust_domain: String,
    /// Kubernetes namespace.
    pub namespace: String,
    /// Kubernetes service account.
    pub service_account: String,
}

/// Why a string is not a SPIFFE workload identity.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    /// The scheme is not `spiffe://`.
    #[error("identity {0:?} does not start with spiffe://")]
    Scheme(String),
    /// The path is not `td/ns/<ns>/sa/<sa>`.
    #[error("identity {0:?} is not of the form spiffe://<trust domain>/ns/<namespace>/sa/<service account>")]
    Shape(String),
}

impl Identity {
    /// Builds an identity from its three parts.
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Self {
        Identity {
            trust_domain: trust_domain.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        }
    }
}

impl FromStr for Identity {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s.strip_prefix("spiffe://").ok_or_else(|| IdentityError::Scheme(s.to_owned()))?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [td, "ns", ns, "sa", sa] if !td.is_empty() && !ns.is_empty() && !sa.is_empty() => {
                Ok(Identity::new(td, ns, sa))
            }
            _ => Err(IdentityError::Shape(s.to_owned())),
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spiffe://{}/ns/{}/sa/{}", self.trust_domain, self.namespace, self.service_account)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let s = "spiffe://cluster.local/ns/default/sa/web";
        let id: Identity = s.parse().expect("valid");
        assert_eq!(id, Identity::new("cluster.local", "default", "web"));
        assert_eq!(id.to_string(), s);
    }

    #[test]
    fn rejects_bad_shapes() {
        for bad in [
            "http://cluster.local/ns/a/sa/b",
            "spiffe://cluster.local/ns/a/sa",
            "spiffe://cluster.local/ns/a/sa/b/c",
            "spiffe://cluster.local/x/a/sa/b",
            "spiffe:///ns/a/sa/b",
            "spiffe://td/ns//sa/b",
            "",
        ] {
            assert!(bad.parse::<Identity>().is_err(), "{bad} accepted");
        }
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics_and_accepted_ids_round_trip(s in "\\PC*") {
            if let Ok(id) = s.parse::<Identity>() {
                proptest::prop_assert_eq!(id.to_string(), s);
            }
        }

        /// SPIFFE-shaped strings whose parts may be empty or hold a `/`: accepted exactly when
        /// every part is non-empty and has no `/`, with those parts; otherwise a `Shape` error.
        #[test]
        fn spiffe_shaped_strings_parse(td in "[a-z./-]{0,6}", ns in "[a-z/]{0,4}", sa in "[a-z/]{0,4}") {
            let s = format!("spiffe://{td}/ns/{ns}/sa/{sa}");
            let valid = [&td, &ns, &sa].iter().all(|p| !p.is_empty() && !p.contains('/'));
            match s.parse::<Identity>() {
                Ok(id) => {
                    proptest::prop_assert!(valid, "{s} accepted as {id:?}");
                    proptest::prop_assert_eq!(&id, &Identity::new(&td, &ns, &sa));
                    proptest::prop_assert_eq!(id.to_string(), s);
                }
                Err(e) => {
                    proptest::prop_assert!(!valid, "{s} refused: {e}");
                    proptest::prop_assert_eq!(e, IdentityError::Shape(s.clone()));
                }
            }
        }

        #[test]
        fn built_ids_round_trip(
            td in "[a-z0-9.-]{1,20}",
            ns in "[a-z0-9-]{1,20}",
            sa in "[a-z0-9.-]{1,20}",
        ) {
            let id = Identity::new(&td, &ns, &sa);
            let parsed: Identity = id.to_string().parse().expect("valid");
            proptest::prop_assert_eq!(parsed, id);
        }
    }
}
