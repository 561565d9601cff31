//! Writes the seed corpora of every fuzz target into `<dir>/<target>/` (default `corpus/`):
//! messages encoded by the project's own codecs (ZDS, protobuf, netlink requests, DNS), golden
//! texts of the repository (the README's local config, the redirect crate's rule files), and
//! the examples of the specs. Nothing opaque is checked in; rerun it to regenerate.
//!
//! Usage: `AMBIT_FUZZ_SEEDS=DIR seeds` (run by `scripts/fuzz.sh`). It is built like the
//! targets (cargo-fuzz instruments every binary of this crate, and only libFuzzer provides the
//! instrumentation's symbols), so it is a libFuzzer binary that does its work in the
//! initializer and exits.
#![no_main]

use std::path::{Path, PathBuf};

use ambit_api::security as authz_pb;
use ambit_api::workload as pb;
use hickory_proto::op::{Edns, Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use prost::Message as _;

libfuzzer_sys::fuzz_target!(
    init: if write_all() {
        std::process::exit(0);
    },
    |_data: &[u8]| {}
);

/// Writes every target's seeds; true when done (then the binary exits, never fuzzing).
fn write_all() -> bool {
    let dir = PathBuf::from(std::env::var("AMBIT_FUZZ_SEEDS").unwrap_or_else(|_| "fuzz/corpus".to_owned()));
    let mut total = 0;
    for (target, seeds) in all() {
        let out = dir.join(target);
        std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("cannot create {}: {e}", out.display()));
        for (i, seed) in seeds.iter().enumerate() {
            write(&out.join(format!("seed-{i:03}")), seed);
        }
        total += seeds.len();
    }
    println!("wrote {total} seeds into {}", dir.display());
    true
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// (target, seeds) for every target.
fn all() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![
        ("zds_request", zds_requests()),
        (
            "zds_response",
            vec![
                ambit_zds::encode_ack(&ambit_zds::Ack::Ok),
                ambit_zds::encode_ack(&ambit_zds::Ack::Nack { reason: "netns in use".into() }),
            ],
        ),
        ("zds_hello", vec![ambit_zds::encode_hello()]),
        ("cni_config", texts(&CNI_CONFIGS)),
        ("cni_args", texts(&CNI_ARGS)),
        ("cni_event", texts(&[PLUGIN_EVENT])),
        ("agent_event", texts(&[PLUGIN_EVENT])),
        ("connect_authority", texts(&AUTHORITIES)),
        ("local_config", local_configs()),
        ("proto_address", proto_addresses()),
        ("proto_authorization", proto_authorizations()),
        ("xds_response", xds_responses()),
        ("spiffe_id", texts(&SPIFFE_IDS)),
        ("cert_sans", certificates()),
        ("rtnetlink_reply", ambit_redirect::fuzzing::rtnetlink_seeds()),
        ("nftables_reply", ambit_redirect::fuzzing::nftables_seeds()),
        ("dns_query", dns_queries()),
        ("dns_upstream_reply", dns_replies()),
        ("objects_yaml", texts(&OBJECT_FILES)),
        ("ca_csr", csrs()),
        ("hbone_plaintext", hbone_plaintexts()),
        ("hbone_records", hbone_records()),
    ]
}

/// Records as `ambit_hbone::fuzzing::records` reads them (type, padding, 16-bit length,
/// content): data, a KeyUpdate split over two records, alerts, empty and padded records.
fn hbone_records() -> Vec<Vec<u8>> {
    let rec = |typ: u8, pad: u8, content: &[u8]| {
        let mut v = vec![typ, pad];
        v.extend_from_slice(&(content.len() as u16).to_be_bytes());
        v.extend_from_slice(content);
        v
    };
    vec![
        [rec(23, 0, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), rec(23, 3, b"data")].concat(),
        [rec(22, 0, &[24, 0]), rec(22, 0, &[0, 1, 1]), rec(23, 0, b"after")].concat(),
        [rec(23, 0, b""), rec(21, 0, &[1, 90]), rec(21, 0, &[1, 0])].concat(),
        [rec(22, 0, &[24, 0, 0, 1, 0]), rec(23, 200, b"padded")].concat(),
    ]
}

/// A server's view (first byte even) and a client's (odd) of a whole HBONE exchange, built with
/// the proxy's own frame writers and header encoder; the second byte sizes the pieces.
fn hbone_plaintexts() -> Vec<Vec<u8>> {
    use ambit_hbone::fuzzing::Encoder;
    use ambit_hbone::fuzzing::frame::{self, Reason, setting};
    let mut headers = http::HeaderMap::new();
    headers.insert("baggage", http::HeaderValue::from_static("k8s.namespace.name=default"));
    let mut server = frame::PREFACE.to_vec();
    frame::settings(&mut server, &[(setting::INITIAL_WINDOW_SIZE, 1 << 20), (setting::MAX_FRAME_SIZE, 1 << 20)]);
    frame::window_update(&mut server, 0, 1 << 20);
    let mut block = Vec::new();
    Encoder::default().connect(&mut block, "10.244.7.2:8080", &headers);
    frame::headers(&mut server, 1, &block, false, 16_384);
    let mut data = vec![0u8; 9];
    frame::Head { len: 5, kind: 0, flags: 0, stream: 1 }.encode(&mut data);
    data.extend_from_slice(b"hello");
    server.extend_from_slice(&data);
    frame::window_update(&mut server, 1, 100);
    frame::ping(&mut server, *b"12345678", false);
    frame::data_end(&mut server, 1);
    frame::rst_stream(&mut server, 1, Reason::CANCEL);
    frame::goaway(&mut server, 0, Reason::NO_ERROR);
    let mut client = Vec::new();
    frame::settings(&mut client, &[(setting::MAX_CONCURRENT_STREAMS, 100)]);
    frame::settings_ack(&mut client);
    let mut block = Vec::new();
    let mut enc = Encoder::default();
    enc.response(&mut block, 200, &headers);
    frame::headers(&mut client, 1, &block, false, 16);
    client.extend_from_slice(&data);
    let mut trailers = Vec::new();
    enc.response(&mut trailers, 503, &http::HeaderMap::new());
    frame::headers(&mut client, 3, &trailers, true, 16_384);
    frame::goaway(&mut client, 3, Reason::ENHANCE_YOUR_CALM);
    let with = |role: u8, step: u8, body: &[u8]| [&[role, step][..], body].concat();
    vec![
        with(0, 255, &server),
        with(0, 7, &server),
        with(1, 255, &client),
        with(1, 3, &client),
    ]
}

fn texts(items: &[&str]) -> Vec<Vec<u8>> {
    items.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn zds_requests() -> Vec<Vec<u8>> {
    let info = ambit_zds::WorkloadInfo {
        name: "web-0".into(),
        namespace: "default".into(),
        service_account: "web".into(),
    };
    let mut out = vec![ambit_zds::encode_snapshot_sent()];
    out.extend(ambit_zds::encode_add("cluster1//v1/Pod/default/web-0", &info));
    out.extend(ambit_zds::encode_keep("cluster1//v1/Pod/default/web-0"));
    out.extend(ambit_zds::encode_del("cluster1//v1/Pod/default/web-0"));
    // An Add without WorkloadInfo (hand-encoded: the codec cannot produce it).
    out.push([&[0x0a, 0x0c, 0x0a, 0x0a][..], b"uid-noinfo"].concat());
    out
}

/// Network configurations as a runtime passes them: the CNI spec's examples with Ambit's keys,
/// with and without a `prevResult`, for each supported `cniVersion`.
const CNI_CONFIGS: [&str; 4] = [
    r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"ambit-cni","cni_agent_run_dir":"/var/run/ambit","exclude_namespaces":["kube-system"],"pod_namespace":"ambit-system","agent_timeout_ms":10000,"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"0a:58:0a:f4:07:02","sandbox":"/var/run/netns/cni-1"}],"ips":[{"address":"10.244.7.2/24","gateway":"10.244.7.1","interface":0},{"address":"fd00:244:7::2/64","interface":0}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}}"#,
    r#"{"cniVersion":"0.3.1","name":"mynet","type":"ambit-cni","prevResult":{"cniVersion":"0.3.1","interfaces":[{"name":"eth0"}],"ips":[{"version":"4","address":"10.1.0.5/16","gateway":"10.1.0.1","interface":0}]}}"#,
    r#"{"cniVersion":"0.4.0","name":"mynet","type":"ambit-cni"}"#,
    r#"{"cniVersion":"1.1.0","name":"mynet","type":"ambit-cni","system_pods":[{"role":"agent","namespace":"ambit-system","generateName":"ambit-agent-"},{"role":"proxy","namespace":"ambit-system","generateName":"ztunnel-"}],"prevResult":{"cniVersion":"1.1.0","ips":[]}}"#,
];

const CNI_ARGS: [&str; 3] = [
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=0a1b2c;K8S_POD_UID=6f3e",
    "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-5d78c9869d-abcde",
    "IgnoreUnknown=true",
];

/// The body istio-cni's plugin posts to `/cmdadd`.
const PLUGIN_EVENT: &str = r#"{"Netns":"/var/run/netns/cni-6f3e","PodName":"web-0","PodNamespace":"default","IPs":[{"Address":"10.244.7.2/24","Gateway":"10.244.7.1"},{"Address":"fd00:244:7::2/64"}]}"#;

const AUTHORITIES: [&str; 8] = [
    "10.244.7.2:8080",
    "[fd00:244:7::2]:8080",
    "[fe80::1%eth0]:8080",
    "echo.default.svc.cluster.local:80",
    "headless.default.svc.cluster.local:80",
    "echo.default.svc.cluster.local:008080",
    "10.244.7.2:0",
    "host",
];

const SPIFFE_IDS: [&str; 4] = [
    "spiffe://cluster.local/ns/default/sa/web",
    "spiffe://td/ns/a/sa/b/c",
    "spiffe:///ns//sa/",
    "http://cluster.local/ns/default/sa/web",
];

/// The README's local-config example, the fuzz fixture's mesh, and the smallest files.
fn local_configs() -> Vec<Vec<u8>> {
    let readme = include_str!("../../../README.md");
    let mut out = Vec::new();
    if let Some(start) = readme.find("<<'YAML'") {
        let body = &readme[start..];
        let body = body.get(body.find('\n').map_or(0, |i| i + 1)..).unwrap_or_default();
        if let Some(end) = body.find("\nYAML") {
            out.push(body[..end].as_bytes().to_vec());
        }
    }
    assert!(!out.is_empty(), "README.md no longer has its local-config example (<<'YAML' … YAML)");
    out.push(ambit_fuzz::MESH.as_bytes().to_vec());
    out.extend(texts(&[
        "{}",
        "workloads: []\n",
        "workloads:\n- uid: a\n  workloadIps: [\"10.0.0.1\", \"10.0.0.1\"]\n",
    ]));
    out
}

fn proto_addresses() -> Vec<Vec<u8>> {
    let workload = pb::Workload {
        uid: "cluster1//v1/Pod/default/web-0".into(),
        name: "web-0".into(),
        namespace: "default".into(),
        addresses: vec![vec![10, 244, 7, 3], vec![0xfd, 0, 2, 0x44, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3]],
        service_account: "web".into(),
        trust_domain: "cluster.local".into(),
        tunnel_protocol: pb::TunnelProtocol::Hbone as i32,
        node: "node1".into(),
        services: [(
            "default/echo.default.svc.cluster.local".to_owned(),
            pb::PortList {
                ports: vec![pb::Port { service_port: 80, target_port: 8080, ..Default::default() }],
            },
        )]
        .into(),
        authorization_policies: vec!["default/only-client".into()],
        ..Default::default()
    };
    let service = pb::Service {
        name: "echo".into(),
        namespace: "default".into(),
        hostname: "echo.default.svc.cluster.local".into(),
        addresses: vec![pb::NetworkAddress {
            network: String::new(),
            address: vec![10, 96, 77, 10],
            length: None,
        }],
        ports: vec![pb::Port { service_port: 80, target_port: 8080, ..Default::default() }],
        ..Default::default()
    };
    [pb::address::Type::Workload(workload), pb::address::Type::Service(service)]
        .into_iter()
        .map(|t| pb::Address { r#type: Some(t) }.encode_to_vec())
        .collect()
}

/// The seed addresses as one delta response, and a second one removing the workload.
fn xds_responses() -> Vec<Vec<u8>> {
    use ambit_api::xds::{DeltaDiscoveryResponse, Resource};
    let resources = proto_addresses()
        .into_iter()
        .zip(["cluster1//v1/Pod/default/web-0", "default/echo.default.svc.cluster.local"])
        .map(|(value, name)| Resource {
            name: name.to_owned(),
            version: "1".to_owned(),
            resource: Some(prost_types::Any {
                type_url: ambit_api::type_url::ADDRESS.to_owned(),
                value,
            }),
            ..Default::default()
        })
        .collect();
    let add = DeltaDiscoveryResponse {
        type_url: ambit_api::type_url::ADDRESS.to_owned(),
        nonce: "n1".to_owned(),
        resources,
        ..Default::default()
    };
    let remove = DeltaDiscoveryResponse {
        type_url: ambit_api::type_url::ADDRESS.to_owned(),
        nonce: "n2".to_owned(),
        removed_resources: vec!["cluster1//v1/Pod/default/web-0".to_owned()],
        ..Default::default()
    };
    vec![add.encode_to_vec(), remove.encode_to_vec()]
}

fn proto_authorizations() -> Vec<Vec<u8>> {
    let exact = |s: &str| authz_pb::StringMatch {
        match_type: Some(authz_pb::string_match::MatchType::Exact(s.to_owned())),
    };
    let allow = authz_pb::Authorization {
        name: "only-client".into(),
        namespace: "default".into(),
        scope: authz_pb::Scope::Namespace as i32,
        action: authz_pb::Action::Allow as i32,
        rules: vec![authz_pb::Rule {
            clauses: vec![authz_pb::Clause {
                matches: vec![authz_pb::Match {
                    principals: vec![exact("cluster.local/ns/default/sa/client")],
                    source_ips: vec![authz_pb::Address { address: vec![10, 0, 0, 0], length: 8 }],
                    destination_ports: vec![8080],
                    ..Default::default()
                }],
            }],
        }],
        ..Default::default()
    };
    let deny = authz_pb::Authorization {
        name: "deny-9090".into(),
        namespace: "default".into(),
        scope: authz_pb::Scope::WorkloadSelector as i32,
        action: authz_pb::Action::Deny as i32,
        rules: vec![authz_pb::Rule {
            clauses: vec![authz_pb::Clause {
                matches: vec![authz_pb::Match { not_destination_ports: vec![9090], ..Default::default() }],
            }],
        }],
        ..Default::default()
    };
    vec![allow.encode_to_vec(), deny.encode_to_vec()]
}

/// Leaf certificates as a peer could present them: one SPIFFE URI SAN (what the CA issues),
/// two URI SANs from different trust domains plus a DNS SAN, and none.
fn certificates() -> Vec<Vec<u8>> {
    let sans: [&[&str]; 3] = [
        &["spiffe://cluster.local/ns/default/sa/web"],
        &["spiffe://cluster.local/ns/default/sa/web", "spiffe://evil.example/ns/default/sa/web"],
        &[],
    ];
    sans.iter()
        .map(|uris| {
            let mut params = rcgen::CertificateParams::new(vec!["web.default.svc".to_owned()])
                .unwrap_or_else(|e| panic!("cert params: {e}"));
            for uri in *uris {
                let uri = rcgen::string::Ia5String::try_from(*uri).unwrap_or_else(|e| panic!("uri: {e}"));
                params.subject_alt_names.push(rcgen::SanType::URI(uri));
            }
            let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("key: {e}"));
            params.self_signed(&key).unwrap_or_else(|e| panic!("self-signed: {e}")).der().to_vec()
        })
        .collect()
}

fn query(name: &str, rtype: RecordType, edns: bool) -> Message {
    let mut m = Message::query();
    m.metadata.id = 0x1234;
    m.metadata.recursion_desired = true;
    if let Ok(name) = Name::from_ascii(name) {
        m.add_query(Query::query(name, rtype));
    }
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
    }
    m
}

/// Queries a pod sends: mesh names (A, AAAA; short and FQDN), a forwarded name, other types;
/// each as UDP (first byte 0) and TCP (first byte 1).
fn dns_queries() -> Vec<Vec<u8>> {
    let queries = [
        query("echo.default.svc.cluster.local.", RecordType::A, false),
        query("echo.default.svc.cluster.local.", RecordType::AAAA, true),
        query("echo.", RecordType::A, false),
        query("headless.default.svc.cluster.local.", RecordType::A, false),
        query("example.test.", RecordType::A, true),
        query("echo.default.svc.cluster.local.", RecordType::TXT, false),
    ];
    let mut out = Vec::new();
    for q in &queries {
        let bytes = q.to_vec().unwrap_or_else(|e| panic!("encode query: {e}"));
        for pick in [0u8, 1] {
            out.push([&[pick][..], &bytes].concat());
        }
    }
    out
}

/// Upstream answers to `example.test. A`: a success, a truncated one, a refusal.
fn dns_replies() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (code, truncated, answer) in [
        (ResponseCode::NoError, false, true),
        (ResponseCode::NoError, true, false),
        (ResponseCode::Refused, false, false),
    ] {
        let mut m = query("example.test.", RecordType::A, false);
        m.metadata.message_type = MessageType::Response;
        m.metadata.response_code = code;
        m.metadata.truncation = truncated;
        if answer && let Ok(name) = Name::from_ascii("example.test.") {
            m.add_answer(Record::from_rdata(name, 60, RData::A(A::new(192, 0, 2, 55))));
        }
        out.push(m.to_vec().unwrap_or_else(|e| panic!("encode reply: {e}")));
    }
    out
}

/// Files of a local-mode folder: each kind Ambit reads, several documents, a List.
const OBJECT_FILES: [&str; 4] = [
    "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n  labels:\n    istio.io/dataplane-mode: ambient\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: demo\n  uid: 7d3c\n  labels:\n    app: web\nspec:\n  nodeName: node\n  serviceAccountName: web\n  containers:\n  - name: app\n    ports:\n    - name: http\n      containerPort: 8080\nstatus:\n  phase: Running\n  podIP: 10.1.0.5\n  podIPs:\n  - ip: 10.1.0.5\n  conditions:\n  - type: Ready\n    status: \"True\"\n",
    "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: demo\nspec:\n  selector:\n    app: web\n  clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.10, fd00::10]\n  ipFamilies: [IPv4, IPv6]\n  ports:\n  - name: http\n    port: 80\n    targetPort: http\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-abc\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: web\naddressType: IPv4\nendpoints:\n- addresses: [10.1.0.9]\nports:\n- name: http\n  port: 8080\n",
    "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: allow\n  namespace: demo\nspec:\n  selector:\n    matchLabels:\n      app: web\n  action: ALLOW\n  rules:\n  - from:\n    - source:\n        principals: [cluster.local/ns/demo/sa/client]\n        ipBlocks: [10.0.0.0/8]\n    to:\n    - operation:\n        ports: [\"8080\"]\n    when:\n    - key: destination.port\n      values: [\"8080\"]\n---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n  name: strict\n  namespace: demo\nspec:\n  selector:\n    matchLabels:\n      app: web\n  mtls:\n    mode: STRICT\n  portLevelMtls:\n    9090:\n      mode: DISABLE\n",
    "apiVersion: v1\nkind: List\nitems:\n- apiVersion: networking.istio.io/v1\n  kind: ServiceEntry\n  metadata:\n    name: ext\n    namespace: demo\n  spec:\n    hosts: [a.example.com]\n    addresses: [240.240.0.1/32]\n    resolution: STATIC\n    ports:\n    - number: 80\n      name: http\n      protocol: HTTP\n    endpoints:\n    - address: 2.3.4.5\n- apiVersion: networking.istio.io/v1\n  kind: WorkloadEntry\n  metadata:\n    name: vm\n    namespace: demo\n  spec:\n    address: 1.2.3.4\n    ports:\n      http: 8180\n- apiVersion: gateway.networking.k8s.io/v1\n  kind: Gateway\n  metadata:\n    name: waypoint\n    namespace: demo\n  spec:\n    gatewayClassName: istio-waypoint\n    listeners:\n    - name: mesh\n      port: 15008\n      protocol: HBONE\n  status:\n    addresses:\n    - type: Hostname\n      value: waypoint.demo.svc.cluster.local\n",
];

/// CSRs as node proxies send them: ECDSA P-256 and P-384, RSA 2048, with a SPIFFE URI SAN.
fn csrs() -> Vec<Vec<u8>> {
    let algs: [&'static rcgen::SignatureAlgorithm; 3] =
        [&rcgen::PKCS_ECDSA_P256_SHA256, &rcgen::PKCS_ECDSA_P384_SHA384, &rcgen::PKCS_RSA_SHA256];
    algs.iter()
        .filter_map(|alg| {
            let key = rcgen::KeyPair::generate_for(alg).ok()?;
            let mut params = rcgen::CertificateParams::default();
            params.distinguished_name = rcgen::DistinguishedName::new();
            let uri = "spiffe://cluster.local/ns/demo/sa/web".try_into().ok()?;
            params.subject_alt_names = vec![rcgen::SanType::URI(uri)];
            Some(params.serialize_request(&key).ok()?.pem().ok()?.into_bytes())
        })
        .collect()
}
