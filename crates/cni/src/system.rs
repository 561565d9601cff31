//! The node's own pods: the node agent's and the node proxy's DaemonSet pods, which must start
//! whether or not an agent runs (a crashed or upgrading agent's replacement, and the proxy that
//! enrolled pods need, would otherwise wait for an agent that cannot start without them).
//!
//! The plugin sees only what `CNI_ARGS` carries (pod namespace, name and UID) and has no API
//! client, so it cannot check a pod's labels or service account. What it can check is what the
//! DaemonSet controller makes every pod's name from: the pod's `metadata.generateName`
//! (`<daemonset>-`) followed by exactly five characters of Kubernetes' name generator. The node
//! agent learns the `generateName` of its own pod and of the proxy's pods from the pod objects
//! themselves (its own by `POD_NAME`, the proxy's by their labels) and its installer writes them
//! into the plugin's config as `system_pods`:
//!
//! ```json
//! "system_pods": [
//!   {"role": "agent", "namespace": "ambit-system", "generateName": "ambit-agent-"},
//!   {"role": "proxy", "namespace": "ambit-system", "generateName": "ambit-proxy-"}
//! ]
//! ```
//!
//! The agent never enrolls these pods either, so both sides agree on what they are.

use serde::{Deserialize, Serialize};

/// What a system pod is; only used in messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SystemRole {
    /// The node agent (`ambit agent`).
    Agent,
    /// The node proxy (`ambit proxy`, or ztunnel).
    Proxy,
}

/// The pods one DaemonSet creates: its namespace and its pods' `generateName`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemPod {
    /// What the pods are.
    pub role: SystemRole,
    /// The DaemonSet's namespace.
    pub namespace: String,
    /// The pods' `metadata.generateName` (the DaemonSet's name and a `-`).
    pub generate_name: String,
}

/// Longest base the API server keeps before the random suffix (`maxGeneratedNameLength`).
const MAX_GENERATED_BASE: usize = 63 - GENERATED_SUFFIX;
/// Length of the random suffix.
const GENERATED_SUFFIX: usize = 5;
/// The characters of the suffix (`k8s.io/apimachinery/pkg/util/rand`: no vowels, no 0/1/3).
const GENERATED_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl SystemPod {
    /// Whether `namespace/name` is a pod the API server named from this `generateName`.
    pub fn matches(&self, namespace: &str, name: &str) -> bool {
        if self.generate_name.is_empty() || namespace != self.namespace {
            return false;
        }
        let base = truncate(&self.generate_name, MAX_GENERATED_BASE);
        name.strip_prefix(base).is_some_and(|suffix| {
            suffix.len() == GENERATED_SUFFIX && suffix.bytes().all(|b| GENERATED_ALPHABET.contains(&b))
        })
    }

    /// Why the entry cannot be used, if it cannot.
    pub fn problem(&self) -> Option<&'static str> {
        if self.namespace.is_empty() {
            Some("namespace is empty")
        } else if self.generate_name.is_empty() {
            Some("generateName is empty (it would match any five-character pod name)")
        } else {
            None
        }
    }
}

impl std::fmt::Display for SystemRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SystemRole::Agent => "node agent",
            SystemRole::Proxy => "node proxy",
        })
    }
}

/// The first `max` bytes of `s`, cut back to a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(ns: &str, generate_name: &str) -> SystemPod {
        SystemPod { role: SystemRole::Agent, namespace: ns.into(), generate_name: generate_name.into() }
    }

    #[test]
    fn only_names_the_generator_made() {
        let s = agent("ambit-system", "ambit-agent-");
        assert!(s.matches("ambit-system", "ambit-agent-x7k2p"));
        assert!(s.matches("ambit-system", "ambit-agent-bbbbb"));
        for (ns, name) in [
            ("demo", "ambit-agent-x7k2p"),            // other namespace
            ("ambit-system", "ambit-agent-x7k2"),     // four characters
            ("ambit-system", "ambit-agent-x7k2pq"),   // six
            ("ambit-system", "ambit-agent-x7k2a"),    // a vowel: never generated
            ("ambit-system", "ambit-agent-evil-pod"), // a name someone chose
            ("ambit-system", "ambit-agent-X7K2P"),    // upper case
            ("ambit-system", "ambit-proxy-x7k2p"),    // another DaemonSet
        ] {
            assert!(!s.matches(ns, name), "{ns}/{name}");
        }
        assert!(!agent("ambit-system", "").matches("ambit-system", "x7k2p"), "empty base");
        assert!(agent("ambit-system", "").problem().is_some());
        assert!(agent("", "a-").problem().is_some());
        assert!(s.problem().is_none());
    }

    #[test]
    fn long_bases_are_cut_like_the_api_server_does() {
        let long = format!("{}-", "d".repeat(70));
        let s = agent("ns", &long);
        let name = format!("{}x7k2p", &long[..58]);
        assert!(s.matches("ns", &name));
        assert!(!s.matches("ns", &format!("{long}x7k2p")));
    }

    proptest::proptest! {
        /// Matching never panics (names and bases of any characters, multi-byte too), and a
        /// match is always the base plus five generator characters.
        #[test]
        fn matching_never_panics(base in "\\PC{0,70}", name in "\\PC{0,80}") {
            let s = agent("ns", &base);
            if s.matches("ns", &name) {
                proptest::prop_assert!(name.len() >= GENERATED_SUFFIX);
                let suffix = &name.as_bytes()[name.len() - GENERATED_SUFFIX..];
                proptest::prop_assert!(suffix.iter().all(|b| GENERATED_ALPHABET.contains(b)));
            }
        }
    }

    #[test]
    fn wire_form() {
        let s = agent("ambit-system", "ambit-agent-");
        let json = serde_json::to_string(&s).expect("json");
        assert_eq!(json, r#"{"role":"agent","namespace":"ambit-system","generateName":"ambit-agent-"}"#);
        assert_eq!(serde_json::from_str::<SystemPod>(&json).expect("parse"), s);
    }
}
