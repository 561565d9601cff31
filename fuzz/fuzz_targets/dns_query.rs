//! A DNS query from a pod to its DNS proxy; the first byte picks UDP or TCP. Every reply is a
//! DNS message.
#![no_main]

use ambit_proxy::fuzzing::DnsProtocol;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&pick, query)) = data.split_first() else { return };
    let protocol = if pick & 1 == 0 { DnsProtocol::Udp } else { DnsProtocol::Tcp };
    let reply = ambit_fuzz::runtime().block_on(ambit_fuzz::dns_proxy().answer(query, protocol));
    if let Some(reply) = reply {
        assert!(hickory_proto::op::Message::from_vec(&reply).is_ok(), "reply is not a DNS message");
    }
});
