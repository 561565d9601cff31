//! Property tests: `answer` never panics, and always answers a decodable query.

use proptest::prelude::*;

use super::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn answer_never_panics_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        tcp in any::<bool>(),
    ) {
        let rt = runtime();
        let proxy = rt.block_on(async { proxy_with(MESH, config("ns1"), "ns1") });
        let protocol = if tcp { Protocol::Tcp } else { Protocol::Udp };
        if let Some(out) = rt.block_on(proxy.answer(&bytes, protocol)) {
            // Whatever comes back is a DNS message with the query's id.
            let m = Message::from_vec(&out).unwrap();
            prop_assert_eq!(&m.metadata.id.to_be_bytes()[..], &bytes[..2]);
        }
    }

    #[test]
    fn answer_never_panics_on_mutated_queries(
        name in "[a-z*]{1,8}(\\.[a-z0-9*-]{1,8}){0,6}\\.?",
        qtype in any::<u16>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    ) {
        let rt = runtime();
        let proxy = rt.block_on(async { proxy_with(MESH, config("ns1"), "ns1") });
        let Ok(n) = Name::from_ascii(&name) else { return Ok(()) };
        let mut bytes = query(&n.to_ascii(), RecordType::from(qtype), Some(1232)).to_vec().unwrap();
        if flips.is_empty() {
            // An unmodified query always gets an answer.
            prop_assert!(rt.block_on(proxy.answer(&bytes, Protocol::Udp)).is_some());
        }
        for (i, b) in flips {
            let i = i.index(bytes.len());
            bytes[i] ^= b;
        }
        let _ = rt.block_on(proxy.answer(&bytes, Protocol::Udp));
    }
}
