//! `CNI_ARGS`: `;`-separated `KEY=VALUE` pairs, parsed with libcni's `LoadArgs` rules.
//!
//! Known keys are the Kubernetes ones container runtimes send. An unknown key is an error unless
//! the string also carries `IgnoreUnknown=1` (kubelet, containerd and CRI-O always send it).

use std::str::FromStr;

/// The Kubernetes pod identity carried in `CNI_ARGS`; empty values read as absent.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct K8sArgs {
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID` (parsed, not used).
    pub pod_infra_container_id: Option<String>,
    /// `K8S_POD_UID` (parsed, not used: the agent looks pods up by namespace and name).
    pub pod_uid: Option<String>,
    /// `IgnoreUnknown`: whether unknown keys were allowed.
    pub ignore_unknown: bool,
}

/// Why `CNI_ARGS` could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A segment is not exactly one `KEY=VALUE`.
    #[error("CNI_ARGS has an invalid pair {0:?}; expected KEY=VALUE pairs separated by ';'")]
    InvalidPair(String),
    /// `IgnoreUnknown` has a value that is not a boolean.
    #[error("CNI_ARGS has IgnoreUnknown={0:?}; expected 1, 0, true or false")]
    InvalidBool(String),
    /// Unknown keys without `IgnoreUnknown=1`.
    #[error("CNI_ARGS has unknown keys {0:?}; the runtime must send IgnoreUnknown=1 to allow them")]
    UnknownKeys(Vec<String>),
}

impl FromStr for K8sArgs {
    type Err = ArgsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut args = K8sArgs::default();
        if s.is_empty() {
            return Ok(args);
        }
        let mut unknown = Vec::new();
        for pair in s.split(';') {
            // libcni splits on every '=' and requires exactly two parts.
            let mut parts = pair.split('=');
            let (Some(key), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(ArgsError::InvalidPair(pair.to_owned()));
            };
            let value = (!value.is_empty()).then(|| value.to_owned());
            match key {
                "K8S_POD_NAME" => args.pod_name = value,
                "K8S_POD_NAMESPACE" => args.pod_namespace = value,
                "K8S_POD_INFRA_CONTAINER_ID" => args.pod_infra_container_id = value,
                "K8S_POD_UID" => args.pod_uid = value,
                "IgnoreUnknown" => args.ignore_unknown = parse_bool(value.as_deref())?,
                _ => unknown.push(pair.to_owned()),
            }
        }
        if !unknown.is_empty() && !args.ignore_unknown {
            return Err(ArgsError::UnknownKeys(unknown));
        }
        Ok(args)
    }
}

/// libcni's `UnmarshallableBool`: `1`/`true` and `0`/`false`, case-insensitive.
fn parse_bool(value: Option<&str>) -> Result<bool, ArgsError> {
    let v = value.unwrap_or_default();
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(ArgsError::InvalidBool(v.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn kubelet_style_args() {
        let a: K8sArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web-0;\
                          K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=863b91d4;FOO=bar"
            .parse()
            .expect("valid");
        assert_eq!(
            a,
            K8sArgs {
                pod_name: some("web-0"),
                pod_namespace: some("demo"),
                pod_infra_container_id: some("abc123"),
                pod_uid: some("863b91d4"),
                ignore_unknown: true,
            }
        );
    }

    #[test]
    fn ignore_unknown_may_come_last_and_in_any_case() {
        let a: K8sArgs = "FOO=bar;K8S_POD_NAME=x;IgnoreUnknown=TRUE".parse().expect("valid");
        assert_eq!(a.pod_name, some("x"));
    }

    #[test]
    fn table_of_outcomes() {
        let cases: &[(&str, Result<(), ArgsError>)] = &[
            ("", Ok(())),
            ("K8S_POD_NAME=", Ok(())),
            ("K8S_POD_NAME=a;K8S_POD_NAMESPACE=b", Ok(())),
            ("IgnoreUnknown=0", Ok(())),
            ("FOO=bar", Err(ArgsError::UnknownKeys(vec!["FOO=bar".into()]))),
            ("FOO=bar;IgnoreUnknown=0", Err(ArgsError::UnknownKeys(vec!["FOO=bar".into()]))),
            ("K8S_POD_NAME", Err(ArgsError::InvalidPair("K8S_POD_NAME".into()))),
            ("A=b=c", Err(ArgsError::InvalidPair("A=b=c".into()))),
            ("K8S_POD_NAME=a;", Err(ArgsError::InvalidPair(String::new()))),
            ("IgnoreUnknown=yes", Err(ArgsError::InvalidBool("yes".into()))),
        ];
        for (input, want) in cases {
            let got = input.parse::<K8sArgs>().map(|_| ());
            assert_eq!(&got, want, "{input:?}");
        }
    }

    #[test]
    fn empty_values_are_absent() {
        let a: K8sArgs = "K8S_POD_NAME=;K8S_POD_NAMESPACE=ns".parse().expect("valid");
        assert_eq!(a.pod_name, None);
        assert_eq!(a.pod_namespace, some("ns"));
    }
}
