//! CNI error objects: the numeric codes of the CNI specification and the JSON printed on failure.

use serde::Serialize;

use crate::version::CniVersion;

/// Error codes defined by the CNI specification (1.1) that this plugin returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// 1: the configuration's `cniVersion` is not supported (or forbids the command).
    IncompatibleVersion,
    /// 2: a configuration field is not supported.
    UnsupportedField,
    /// 3: the container is unknown or does not exist.
    UnknownContainer,
    /// 4: a required `CNI_*` environment variable is missing or invalid.
    InvalidEnvironment,
    /// 5: reading stdin or writing stdout failed.
    Io,
    /// 6: stdin (or `prevResult`) could not be decoded.
    Decoding,
    /// 7: the network configuration is well-formed JSON but invalid.
    InvalidNetworkConfig,
    /// 8: the network namespace is invalid (e.g. the plugin's own).
    InvalidNetns,
    /// 11: transient failure; the runtime should retry later.
    TryAgainLater,
    /// 50: STATUS: the plugin cannot serve ADD requests now.
    PluginNotAvailable,
    /// 999: anything else, including the node agent refusing the pod.
    Internal,
}

impl ErrorCode {
    /// The number printed in the `code` field.
    pub fn number(self) -> u32 {
        match self {
            ErrorCode::IncompatibleVersion => 1,
            ErrorCode::UnsupportedField => 2,
            ErrorCode::UnknownContainer => 3,
            ErrorCode::InvalidEnvironment => 4,
            ErrorCode::Io => 5,
            ErrorCode::Decoding => 6,
            ErrorCode::InvalidNetworkConfig => 7,
            ErrorCode::InvalidNetns => 8,
            ErrorCode::TryAgainLater => 11,
            ErrorCode::PluginNotAvailable => 50,
            ErrorCode::Internal => 999,
        }
    }
}

/// A failed command: printed on stdout as the CNI error object, exit status 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg} (CNI error {code})", code = .code.number())]
pub struct CniError {
    /// The CNI error code.
    pub code: ErrorCode,
    /// One-line, operator-actionable summary.
    pub msg: String,
    /// Underlying cause; empty when there is nothing to add.
    pub details: String,
    /// The configuration's version once known; the error object reports it.
    pub version: Option<CniVersion>,
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: &'a str,
    code: u32,
    msg: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    details: &'a str,
}

impl CniError {
    /// An error with a code and message and no details.
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        CniError { code, msg: msg.into(), details: String::new(), version: None }
    }

    /// Sets the details (the underlying cause).
    #[must_use]
    pub fn details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Records the configuration's version unless one is already set.
    #[must_use]
    pub fn in_version(mut self, version: CniVersion) -> Self {
        self.version.get_or_insert(version);
        self
    }

    /// The CNI error object: `{"cniVersion","code","msg"[,"details"]}`.
    ///
    /// `cniVersion` is the configuration's version when it was understood, else the latest
    /// supported one; `details` is left out when empty (as libcni does).
    pub fn to_json(&self) -> String {
        let json = ErrorJson {
            cni_version: self.version.unwrap_or(CniVersion::LATEST).as_str(),
            code: self.code.number(),
            msg: &self.msg,
            details: &self.details,
        };
        // Serializing a struct of strings and an integer cannot fail; keep a valid object anyway.
        serde_json::to_string(&json).unwrap_or_else(|_| {
            format!(
                r#"{{"cniVersion":"{}","code":999,"msg":"ambit-cni could not encode its error"}}"#,
                CniVersion::LATEST
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_shape() {
        let e = CniError::new(ErrorCode::TryAgainLater, "agent \"down\"")
            .details("connection refused")
            .in_version(CniVersion::V1_0_0);
        assert_eq!(
            e.to_json(),
            r#"{"cniVersion":"1.0.0","code":11,"msg":"agent \"down\"","details":"connection refused"}"#
        );
        let e = CniError::new(ErrorCode::Decoding, "bad");
        assert_eq!(e.to_json(), r#"{"cniVersion":"1.1.0","code":6,"msg":"bad"}"#);
    }

    #[test]
    fn first_version_wins() {
        let e = CniError::new(ErrorCode::Internal, "x")
            .in_version(CniVersion::V0_3_1)
            .in_version(CniVersion::V1_1_0);
        assert_eq!(e.version, Some(CniVersion::V0_3_1));
    }
}
