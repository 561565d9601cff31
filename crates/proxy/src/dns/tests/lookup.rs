//! Table tests of local resolution: expansions, search-domain CNAMEs, wildcards, headless
//! services, visibility, best match and address-family suppression.

use hickory_proto::op::ResponseCode;

use super::*;

/// What a query should produce.
#[derive(Debug)]
enum Expect {
    /// Authoritative NOERROR with these answers (`owner TYPE rdata`; CNAME first, A/AAAA in any order).
    Answers(&'static [&'static str]),
    /// Not answered locally: forwarded (SERVFAIL here, as there are no upstreams).
    Forwarded,
}

struct Case {
    name: &'static str,
    host: &'static str,
    rtype: RecordType,
    client_ns: &'static str,
    ipv6: bool,
    expect: Expect,
}

const fn case(name: &'static str, host: &'static str, rtype: RecordType, expect: Expect) -> Case {
    Case { name, host, rtype, client_ns: "ns1", ipv6: true, expect }
}

use Expect::{Answers, Forwarded};
use RecordType::{A, AAAA, TXT};

const CASES: &[Case] = &[
    case("shortname", "productpage.", A, Answers(&["productpage. A 9.9.9.9"])),
    case("name.namespace", "productpage.ns1.", A, Answers(&["productpage.ns1. A 9.9.9.9"])),
    case("name.namespace.svc", "productpage.ns1.svc.", A, Answers(&["productpage.ns1.svc. A 9.9.9.9"])),
    case(
        "fqdn",
        "productpage.ns1.svc.cluster.local.",
        A,
        Answers(&["productpage.ns1.svc.cluster.local. A 9.9.9.9"]),
    ),
    case(
        "fqdn AAAA",
        "productpage.ns1.svc.cluster.local.",
        AAAA,
        Answers(&["productpage.ns1.svc.cluster.local. AAAA fd00::9"]),
    ),
    case(
        "mixed case keeps the query's case",
        "ProductPage.NS1.",
        A,
        Answers(&["ProductPage.NS1. A 9.9.9.9"]),
    ),
    case("other namespace shortname is not expanded", "example.", A, Forwarded),
    case("other namespace name.namespace", "example.ns2.", A, Answers(&["example.ns2. A 10.10.10.10"])),
    case(
        "other namespace name.namespace.svc",
        "example.ns2.svc.",
        A,
        Answers(&["example.ns2.svc. A 10.10.10.10"]),
    ),
    case(
        "search domain ns.svc.domain stripped: CNAME to the stripped name",
        "productpage.ns1.ns1.svc.cluster.local.",
        A,
        Answers(&[
            "productpage.ns1.ns1.svc.cluster.local. CNAME productpage.ns1.",
            "productpage.ns1. A 9.9.9.9",
        ]),
    ),
    case(
        "search domain svc.domain stripped",
        "productpage.svc.cluster.local.",
        A,
        Answers(&["productpage.svc.cluster.local. CNAME productpage.", "productpage. A 9.9.9.9"]),
    ),
    case(
        "stripped AAAA",
        "productpage.ns1.ns1.svc.cluster.local.",
        AAAA,
        Answers(&[
            "productpage.ns1.ns1.svc.cluster.local. CNAME productpage.ns1.",
            "productpage.ns1. AAAA fd00::9",
        ]),
    ),
    case("non-k8s mesh host", "www.google.com.", A, Answers(&["www.google.com. A 1.1.1.1"])),
    case(
        "non-k8s mesh host with a search domain",
        "www.google.com.ns1.svc.cluster.local.",
        A,
        Answers(&[
            "www.google.com.ns1.svc.cluster.local. CNAME www.google.com.",
            "www.google.com. A 1.1.1.1",
        ]),
    ),
    case("wildcard", "foo.wild.example.", A, Answers(&["foo.wild.example. A 8.8.8.8"])),
    case("deep wildcard", "a.b.wild.example.", A, Answers(&["a.b.wild.example. A 8.8.8.8"])),
    case(
        "wildcard through a stripped search domain: no CNAME",
        "foo.wild.example.ns1.svc.cluster.local.",
        A,
        Answers(&["foo.wild.example.ns1.svc.cluster.local. A 8.8.8.8"]),
    ),
    case("wildcard does not match its base", "wild.example.", A, Forwarded),
    case(
        "headless: one address per endpoint",
        "headless.ns1.svc.cluster.local.",
        A,
        Answers(&[
            "headless.ns1.svc.cluster.local. A 10.0.0.1",
            "headless.ns1.svc.cluster.local. A 10.0.0.2",
        ]),
    ),
    case("headless shortname", "headless.", A, Answers(&["headless. A 10.0.0.1", "headless. A 10.0.0.2"])),
    case(
        "headless AAAA: only endpoints with an IPv6 address",
        "headless.ns1.svc.cluster.local.",
        AAAA,
        Answers(&["headless.ns1.svc.cluster.local. AAAA fd00::1"]),
    ),
    case("headless outside the cluster domain is forwarded", "external.headless.example.", A, Forwarded),
    case("namespace-visible service hidden from other namespaces", "private.ns2.", A, Forwarded),
    Case {
        client_ns: "ns2",
        ..case(
            "namespace-visible service seen from its namespace",
            "private.",
            A,
            Answers(&["private. A 10.2.2.2"]),
        )
    },
    case("IPV4_ONLY service: A", "v4only.", A, Answers(&["v4only. A 10.4.4.4"])),
    case("IPV4_ONLY service: AAAA suppressed", "v4only.", AAAA, Answers(&[])),
    case("IPV6_ONLY service: A suppressed", "v6only.", A, Answers(&[])),
    case("IPV6_ONLY service: AAAA", "v6only.", AAAA, Answers(&["v6only. AAAA fd00::6"])),
    Case { ipv6: false, ..case("IPv6 disabled: AAAA suppressed", "productpage.", AAAA, Answers(&[])) },
    Case {
        ipv6: false,
        ..case("IPv6 disabled: A still answered", "productpage.", A, Answers(&["productpage. A 9.9.9.9"]))
    },
    case("best match: client namespace", "shared.example.", A, Answers(&["shared.example. A 10.20.0.1"])),
    case("best match: canonical", "shared2.example.", A, Answers(&["shared2.example. A 10.21.0.3"])),
    case(
        "best match: preferred namespace",
        "shared3.example.",
        A,
        Answers(&["shared3.example. A 10.22.0.4"]),
    ),
    case(
        "best match: first (namespace order)",
        "shared4.example.",
        A,
        Answers(&["shared4.example. A 10.23.0.2"]),
    ),
    case("other record types are forwarded", "productpage.ns1.svc.cluster.local.", TXT, Forwarded),
    case("unknown names are forwarded", "nothing.example.", A, Forwarded),
    case("root is forwarded", ".", A, Forwarded),
];

#[tokio::test]
async fn resolution_table() {
    for c in CASES {
        let mut cfg = config(c.client_ns);
        cfg.ipv6_enabled = c.ipv6;
        let proxy = proxy_with(MESH, cfg, c.client_ns);
        let m = ask(&proxy, c.host, c.rtype).await;
        let ctx = format!("case {:?} ({} {})", c.name, c.host, c.rtype);
        assert_eq!(m.metadata.id, 0x1234, "{ctx}");
        assert_eq!(m.queries.len(), 1, "{ctx}");
        assert!(m.metadata.recursion_available, "{ctx}");
        assert!(m.metadata.recursion_desired, "{ctx}");
        match c.expect {
            Forwarded => {
                assert_eq!(m.metadata.response_code, ResponseCode::ServFail, "{ctx}");
                assert!(!m.metadata.authoritative, "{ctx}");
            }
            Answers(want) => {
                assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{ctx}");
                assert!(m.metadata.authoritative, "{ctx}");
                let got = rendered(&m);
                let (mut got_sorted, mut want_sorted) = (got.clone(), want.to_vec());
                got_sorted.sort();
                want_sorted.sort();
                assert_eq!(got_sorted, want_sorted, "{ctx}");
                if want.first().is_some_and(|w| w.contains(" CNAME ")) {
                    assert_eq!(got[0], want[0], "{ctx}: CNAME must come first");
                }
                assert!(m.answers.iter().all(|r| r.ttl == TTL_SECONDS), "{ctx}");
            }
        }
    }
}

#[tokio::test]
async fn vips_on_other_networks_are_not_returned() {
    let mut c = client("ns1");
    c.network = "nw2".to_owned();
    let proxy =
        DnsProxy::new(store(MESH), Arc::new(config("ns1")), c, Arc::new(LocalSockets), DnsMetrics::default());
    let m = ask(&proxy, "productpage.", RecordType::A).await;
    assert_eq!(rendered(&m), vec!["productpage. A 9.9.9.10"]);
}

#[tokio::test]
async fn without_search_domains_nothing_is_stripped() {
    let mut cfg = config("ns1");
    cfg.search_domains.clear();
    let proxy = proxy_with(MESH, cfg, "ns1");
    let m = ask(&proxy, "productpage.ns1.ns1.svc.cluster.local.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
}

#[tokio::test]
async fn answers_are_shuffled() {
    let yaml = headless_mesh(16);
    let proxy = proxy_with(&yaml, config("ns1"), "ns1");
    let mut orders = std::collections::HashSet::new();
    for _ in 0..20 {
        let q = query("big.ns1.svc.cluster.local.", RecordType::A, None);
        orders.insert(rendered(&ask_msg(&proxy, &q, Protocol::Tcp).await));
    }
    assert!(orders.len() > 1, "20 answers of 16 records all came in one order");
    assert!(orders.iter().all(|o| o.len() == 16));
}

#[test]
fn candidate_names() {
    let names = crate::dns::lookup::Names::new(&config("ns1"), &client("ns1"));
    let labels =
        |s: &str| -> Vec<String> { s.split('.').filter(|l| !l.is_empty()).map(str::to_owned).collect() };
    let cases: &[(&str, &[&str])] = &[
        ("name", &["name", "name.ns1.svc.cluster.local"]),
        ("name.ns2", &["name.ns2", "name.ns2.svc.cluster.local", "name.ns2.ns1.svc.cluster.local"]),
        ("name.ns2.svc", &["name.ns2.svc", "name.ns2.svc.cluster.local", "name.ns2.svc.svc.cluster.local"]),
        ("name.ns2.other", &["name.ns2.other", "name.ns2.other.svc.cluster.local"]),
        ("pod.sub.ns.svc", &["pod.sub.ns.svc", "pod.sub.ns.svc.cluster.local"]),
        ("pod.sub.ns.other", &["pod.sub.ns.other"]),
        (
            "a.ns1.svc.cluster.local",
            &[
                "a.ns1.svc.cluster.local",
                // Stripped by ns1.svc.cluster.local; its expansion repeats the query.
                "a",
                // Stripped by svc.cluster.local, with its new expansion.
                "a.ns1",
                "a.ns1.ns1.svc.cluster.local",
                // Stripped by cluster.local, with its new expansion.
                "a.ns1.svc",
                "a.ns1.svc.svc.cluster.local",
            ],
        ),
    ];
    for (host, want) in cases {
        let got: Vec<String> = crate::dns::lookup::candidates_for_test(&names, &labels(host));
        assert_eq!(got, *want, "host {host}");
    }
}
