//! CNI specification versions this plugin speaks, and the two result formats they use.

use std::fmt;
use std::str::FromStr;

/// A CNI specification version this plugin accepts in a network configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    /// 0.3.0: first version with the `interfaces`/`ips` result.
    V0_3_0,
    /// 0.3.1: same result format as 0.3.0.
    V0_3_1,
    /// 0.4.0: adds CHECK; same result format as 0.3.x.
    V0_4_0,
    /// 1.0.0: drops `ips[].version`.
    V1_0_0,
    /// 1.1.0: adds GC, STATUS and optional result fields.
    V1_1_0,
}

/// The two result layouts across the supported versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultFormat {
    /// 0.3.0, 0.3.1, 0.4.0: every `ips[]` entry carries `"version": "4"|"6"`.
    Legacy,
    /// 1.0.0, 1.1.0: no `ips[].version`; interfaces may carry `mtu`, `socketPath`, `pciID`.
    Current,
}

/// Error for a version string this plugin does not support.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CNI version {0:?} is not supported (supported: {list})", list = SUPPORTED_LIST)]
pub struct UnsupportedVersion(pub String);

/// Every supported version, oldest first (the order VERSION prints them in).
pub const SUPPORTED: [CniVersion; 5] =
    [CniVersion::V0_3_0, CniVersion::V0_3_1, CniVersion::V0_4_0, CniVersion::V1_0_0, CniVersion::V1_1_0];

const SUPPORTED_LIST: &str = "0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0";

impl CniVersion {
    /// The newest version this plugin implements.
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    /// The version as it appears in JSON, e.g. `"1.0.0"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// The result layout used by this version.
    pub fn result_format(self) -> ResultFormat {
        match self {
            CniVersion::V0_3_0 | CniVersion::V0_3_1 | CniVersion::V0_4_0 => ResultFormat::Legacy,
            CniVersion::V1_0_0 | CniVersion::V1_1_0 => ResultFormat::Current,
        }
    }
}

impl FromStr for CniVersion {
    type Err = UnsupportedVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SUPPORTED.into_iter().find(|v| v.as_str() == s).ok_or_else(|| UnsupportedVersion(s.to_owned()))
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The VERSION command's output: `{"cniVersion": <latest>, "supportedVersions": [...]}`.
pub fn version_info_json() -> String {
    let versions: Vec<&str> = SUPPORTED.iter().map(|v| v.as_str()).collect();
    serde_json::json!({
        "cniVersion": CniVersion::LATEST.as_str(),
        "supportedVersions": versions,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_supported_version_and_rejects_others() {
        for v in SUPPORTED {
            assert_eq!(v.as_str().parse::<CniVersion>(), Ok(v));
        }
        for bad in ["0.1.0", "0.2.0", "1.2.0", "", "1.0", " 1.0.0"] {
            assert!(bad.parse::<CniVersion>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn formats_split_at_one_zero() {
        assert_eq!(CniVersion::V0_4_0.result_format(), ResultFormat::Legacy);
        assert_eq!(CniVersion::V1_0_0.result_format(), ResultFormat::Current);
        assert!(CniVersion::V0_3_1 < CniVersion::V0_4_0);
    }

    #[test]
    fn version_info_lists_all() {
        assert_eq!(
            version_info_json(),
            r#"{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}"#
        );
    }
}
