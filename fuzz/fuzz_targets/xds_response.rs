//! A delta xDS response as the proxy's xDS client receives it: every `Address` resource decoded
//! and converted into one `Delta` with the response's removals, applied to an empty state and
//! then again to its result (replacements, re-staging, removals of what exists).
#![no_main]

use ambit_proxy::fuzzing::{Delta, State};
use prost::Message;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(response) = ambit_api::xds::DeltaDiscoveryResponse::decode(data) else { return };
    let mut delta = Delta::default();
    for r in &response.resources {
        let Some(any) = &r.resource else { continue };
        if let Ok(pb) = ambit_api::workload::Address::decode(any.value.as_slice()) {
            let _ = delta.add_address(&r.name, pb);
        }
    }
    delta.removed_addresses = response.removed_resources;
    let (first, _) = State::new(None).apply(delta.clone());
    let (second, _) = first.apply(delta);
    let _ = second.dump();
});
