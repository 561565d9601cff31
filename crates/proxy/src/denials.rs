//! The last connections the proxy denied by policy, with the policy and the time, for people
//! asking "why was my connection denied?" (`/debug/denials` on the admin port; `ambit status`
//! and `ambit inspect` read it). Bounded: the newest [`KEPT`] are kept.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use serde::Serialize;

use crate::authz::{Action, Authorization, DenyReason};
use crate::metrics::ConnectionInfo;

/// How many denials are kept.
pub const KEPT: usize = 100;

/// One denied connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Denial {
    /// When (RFC 3339, UTC, seconds).
    pub time: String,
    /// The client's address.
    pub src_addr: String,
    /// The client's identity (empty: plaintext).
    pub src_identity: String,
    /// The client's workload `namespace/name`, if known.
    pub src_workload: String,
    /// The address the client asked for.
    pub dst_addr: String,
    /// The destination workload `namespace/name`.
    pub dst_workload: String,
    /// Why, as ztunnel words it (`explicitly denied by: ns/name`, `allow policies exist, but
    /// none allowed`).
    pub reason: String,
    /// The policies that decided: the DENY policy that matched, or every enforced ALLOW policy
    /// of the destination (none of which allowed the connection), as `namespace/name`.
    pub policies: Vec<String>,
}

/// The recent denials, shared by every listener of the process.
#[derive(Clone, Default)]
pub struct Denials(Arc<Mutex<VecDeque<Denial>>>);

impl Denials {
    /// Records one denial of `info`'s connection, decided by `policies` for `reason`.
    pub fn record<'a>(
        &self,
        info: &ConnectionInfo,
        reason: &DenyReason,
        policies: impl IntoIterator<Item = &'a Authorization>,
    ) {
        let deciding = match reason {
            DenyReason::ExplicitDeny(key) => vec![key.clone()],
            DenyReason::NoAllowMatch => policies
                .into_iter()
                .filter(|p| p.action == Action::Allow && !p.dry_run)
                .map(Authorization::key)
                .collect(),
        };
        let workload = |w: Option<&crate::state::Workload>| {
            w.map(|w| format!("{}/{}", w.namespace, w.name)).unwrap_or_default()
        };
        let denial = Denial {
            time: ambit_identity::rfc3339(SystemTime::now()),
            src_addr: info.src_addr.to_string(),
            src_identity: info.src_identity.as_ref().map(ToString::to_string).unwrap_or_default(),
            src_workload: workload(info.src_workload.as_deref()),
            dst_addr: info.hbone_addr.unwrap_or(info.dst_addr).to_string(),
            dst_workload: workload(info.dst_workload.as_deref()),
            reason: reason.to_string(),
            policies: deciding,
        };
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back(denial);
    }

    /// The kept denials, oldest first.
    pub fn list(&self) -> Vec<Denial> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_are_kept() {
        let d = Denials::default();
        let info = ConnectionInfo {
            reporter: crate::metrics::Reporter::destination,
            src_addr: "10.0.0.1:40000".parse().expect("addr"),
            src_workload: None,
            src_identity: None,
            dst_addr: "10.0.0.2:80".parse().expect("addr"),
            hbone_addr: None,
            dst_service: None,
            dst_workload: None,
            dst_identity: None,
            mtls: false,
        };
        for i in 0..KEPT + 5 {
            d.record(&info, &DenyReason::ExplicitDeny(format!("demo/p{i}")), []);
        }
        let list = d.list();
        assert_eq!(list.len(), KEPT);
        assert_eq!(list[0].policies, ["demo/p5"]);
        assert_eq!(list[KEPT - 1].reason, format!("explicitly denied by: demo/p{}", KEPT + 4));
    }
}
