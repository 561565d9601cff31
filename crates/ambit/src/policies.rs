//! The policy reports of objects on this host (the desired folder, a file being applied),
//! from the control plane's own evaluation ([`ambit_control::translate::explain`]).

use ambit_cluster::desired::SYSTEM_NAMESPACE;
use ambit_control::translate::explain::{self, PolicyReport};
use ambit_objects::Object;
use serde_json::Value;

/// The report of each AuthorizationPolicy and PeerAuthentication among `values`, in order
/// (values that do not decode are skipped: the desired-folder check reports them).
pub fn reports<'a>(values: impl IntoIterator<Item = &'a Value>) -> Vec<PolicyReport> {
    values
        .into_iter()
        .filter_map(|v| match Object::from_value(v.clone()) {
            Ok(Object::AuthorizationPolicy(ap)) => Some(explain::authorization_policy(SYSTEM_NAMESPACE, &ap)),
            Ok(Object::PeerAuthentication(pa)) => Some(explain::peer_authentication(SYSTEM_NAMESPACE, &pa)),
            _ => None,
        })
        .collect()
}

/// Prints each warning of `values`' policies on standard error, as kubectl prints a server's
/// warnings (`Warning: …`).
pub fn print_warnings<'a>(values: impl IntoIterator<Item = &'a Value>) {
    for r in reports(values) {
        for line in r.warning_lines() {
            eprintln!("Warning: {line}");
        }
    }
}
