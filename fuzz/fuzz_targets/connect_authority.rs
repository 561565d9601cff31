//! The `:authority` of an inbound HBONE CONNECT: parsed as the proxy does, then checked against
//! the destination pod as the inbound path does. An accepted authority prints as itself.
#![no_main]

use std::net::IpAddr;

use ambit_proxy::fuzzing::Authority;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(authority) = text.parse::<Authority>() else { return };
    assert_eq!(authority.to_string().parse::<Authority>().ok().as_ref(), Some(&authority));
    let state = ambit_fuzz::mesh();
    let Some(local) = state.workload_by_uid("cluster1//v1/Pod/default/a") else { return };
    let _ = state.inbound_upstream(&local, IpAddr::from([10, 244, 7, 2]), &authority);
});
