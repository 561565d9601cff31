//! `ambit control` on the Kubernetes source, end to end: the real binary, `KUBECONFIG` pointing
//! at the scripted API server of `ambit-objects` (real HTTP list/watch and TokenReviews), and
//! real gRPC clients over TLS. Node proxies authenticate with ServiceAccount tokens reviewed by
//! the API server; node authorization uses the pods the control plane watches. No root needed.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use ambit_api::ca::IstioCertificateRequest;
use ambit_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use ambit_api::type_url::ADDRESS;
use ambit_api::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_api::xds::{DeltaDiscoveryRequest, Node};
use ambit_objects::testing::{ScriptedApi, TokenIdentity};
use common::*;
use serde_json::json;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

const ZTUNNEL_TOKEN: &str = "token-of-ztunnel-on-node-a";
const WRONG_AUDIENCE: &str = "token-for-another-audience";

fn pod(ns: &str, name: &str, uid: &str, sa: &str, node: &str, ip: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": uid, "labels": {"app": name}},
        "spec": {"serviceAccountName": sa, "nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}]}})
}

fn token(sa_ns: &str, sa: &str, audiences: &[&str], pod: Option<(&str, &str)>) -> TokenIdentity {
    let mut extra = BTreeMap::new();
    if let Some((name, uid)) = pod {
        extra.insert("authentication.kubernetes.io/pod-name".to_owned(), vec![name.to_owned()]);
        extra.insert("authentication.kubernetes.io/pod-uid".to_owned(), vec![uid.to_owned()]);
    }
    TokenIdentity {
        username: format!("system:serviceaccount:{sa_ns}:{sa}"),
        uid: format!("uid-sa-{sa}"),
        groups: vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{sa_ns}")],
        audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
        extra,
    }
}

fn csr() -> String {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.serialize_request(&key).expect("csr").pem().expect("pem")
}

fn ca_request(token: &str, impersonate: &str) -> tonic::Request<IstioCertificateRequest> {
    let metadata = prost_types::Struct {
        fields: BTreeMap::from([(
            "ImpersonatedIdentity".to_owned(),
            prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(impersonate.to_owned())) },
        )]),
    };
    let mut req = tonic::Request::new(IstioCertificateRequest {
        csr: csr(),
        validity_duration: 3600,
        metadata: Some(metadata),
    });
    req.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
    req
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port")
}

/// `ambit control` on `api` (state in `dir`, `env` added), once ready: the process and its gRPC
/// and readiness ports.
fn start_control(api: &ScriptedApi, dir: &std::path::Path, env: &[(&str, &str)]) -> (ChildGuard, u16, u16) {
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let (grpc, ready) = (free_port(), free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ambit"));
    cmd.args(["control", "--state-dir"])
        .arg(dir.join("state"))
        .arg("--root-ca-dir")
        .arg(dir.join("no-cacerts"))
        .args([
            "--secure-grpc-addr",
            &format!("127.0.0.1:{grpc}"),
            "--grpc-addr",
            "",
            "--monitoring-addr",
            "",
        ])
        .args(["--http-addr", &format!("127.0.0.1:{ready}"), "--debounce-after", "10ms"])
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied());
    let mut control = ChildGuard::spawn("control", cmd);
    let up = wait_for(
        || {
            control.try_wait().is_none()
                && http_get(std::net::SocketAddr::from(([127, 0, 0, 1], ready)), "/ready")
                    .is_ok_and(|(s, _)| s == 200)
        },
        Duration::from_secs(30),
    );
    assert!(up, "ambit control did not become ready on the Kubernetes source:\n{}", control.logs());
    (control, grpc, ready)
}

#[test]
fn control_plane_on_the_kubernetes_api() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let api = rt.block_on(ScriptedApi::start());
    api.put_namespace("istio-system", &[]);
    api.put_namespace("demo", &[("istio.io/dataplane-mode", "ambient")]);
    api.put(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a",
        "labels": {"topology.kubernetes.io/region": "r1", "topology.kubernetes.io/zone": "z1"}}}));
    api.put_pod(pod("istio-system", "ztunnel-b4x2k", "uid-ztunnel", "ztunnel", "node-a", "10.0.0.2"));
    api.put_pod(pod("demo", "web", "uid-web", "web", "node-a", "10.1.0.5"));
    api.put_pod(pod("demo", "db", "uid-db", "db", "node-b", "10.1.0.6"));
    api.add_token(
        ZTUNNEL_TOKEN,
        token("istio-system", "ztunnel", &["istio-ca"], Some(("ztunnel-b4x2k", "uid-ztunnel"))),
    );
    api.add_token(
        WRONG_AUDIENCE,
        token("istio-system", "ztunnel", &["not-istio-ca"], Some(("ztunnel-b4x2k", "uid-ztunnel"))),
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let (_control, grpc, _) = start_control(&api, dir.path(), &[]);
    let root =
        std::fs::read_to_string(dir.path().join("state/ca/root-cert.pem")).expect("the persisted root");

    rt.block_on(async {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&root))
            .domain_name("istiod.istio-system.svc");
        let channel: Channel = Endpoint::from_shared(format!("https://127.0.0.1:{grpc}"))
            .expect("uri")
            .tls_config(tls)
            .expect("tls")
            .connect()
            .await
            .expect("connect over TLS");
        let mut ca = IstioCertificateServiceClient::new(channel.clone());
        let call = |r| {
            let mut ca = ca.clone();
            async move {
                ca.create_certificate(r)
                    .await
                    .map(|r| r.into_inner().cert_chain.len())
                    .map_err(|s| (s.code(), s.message().to_owned()))
            }
        };
        // The node proxy of node-a may get a certificate for a pod on node-a ...
        assert_eq!(call(ca_request(ZTUNNEL_TOKEN, "spiffe://cluster.local/ns/demo/sa/web")).await, Ok(2));
        // ... not for one that runs on node-b only.
        assert_eq!(
            call(ca_request(ZTUNNEL_TOKEN, "spiffe://cluster.local/ns/demo/sa/db")).await,
            Err((tonic::Code::Unauthenticated, "request impersonation authentication failure".into()))
        );
        // A token for another audience is not accepted.
        assert_eq!(
            call(ca_request(WRONG_AUDIENCE, "spiffe://cluster.local/ns/demo/sa/web")).await,
            Err((tonic::Code::Unauthenticated, "request authenticate failure".into()))
        );
        // The pod moves to node-a: now allowed (node authorization follows the watch).
        api.put_pod(pod("demo", "db", "uid-db", "db", "node-a", "10.1.0.6"));
        let mut allowed = false;
        for _ in 0..50 {
            if call(ca_request(ZTUNNEL_TOKEN, "spiffe://cluster.local/ns/demo/sa/db")).await == Ok(2) {
                allowed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(allowed, "db on node-a is still refused");
        let _ = &mut ca;

        // xDS with the same token: every workload, then a deleted pod's removal.
        let mut meta = prost_types::Struct::default();
        for (k, v) in [("NAMESPACE", "istio-system"), ("SERVICE_ACCOUNT", "ztunnel"), ("NODE_NAME", "node-a")]
        {
            meta.fields.insert(
                k.into(),
                prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(v.into())) },
            );
        }
        let node = Node {
            id: "ztunnel~10.0.0.2~ztunnel-b4x2k.istio-system~istio-system.svc.cluster.local".into(),
            metadata: Some(meta),
            ..Node::default()
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<DeltaDiscoveryRequest>(8);
        tx.send(DeltaDiscoveryRequest {
            node: Some(node),
            type_url: ADDRESS.into(),
            resource_names_subscribe: vec!["*".into()],
            ..DeltaDiscoveryRequest::default()
        })
        .await
        .expect("send");
        let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        req.metadata_mut().insert("authorization", format!("Bearer {ZTUNNEL_TOKEN}").parse().expect("ascii"));
        let mut stream = AggregatedDiscoveryServiceClient::new(channel.clone())
            .delta_aggregated_resources(req)
            .await
            .expect("stream")
            .into_inner();
        let first = stream.message().await.expect("recv").expect("open");
        let mut names: Vec<String> = first.resources.iter().map(|r| r.name.clone()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "Kubernetes//Pod/demo/db",
                "Kubernetes//Pod/demo/web",
                "Kubernetes//Pod/istio-system/ztunnel-b4x2k"
            ]
        );
        tx.send(DeltaDiscoveryRequest {
            type_url: ADDRESS.into(),
            response_nonce: first.nonce.clone(),
            ..Default::default()
        })
        .await
        .expect("ack");
        api.delete_pod("demo", "web");
        let push = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("a push")
            .expect("recv")
            .expect("open");
        assert_eq!(push.removed_resources, ["Kubernetes//Pod/demo/web"]);
        assert!(push.resources.is_empty(), "{push:?}");

        // A stream with the wrong audience's token is refused.
        let (_tx2, rx2) = tokio::sync::mpsc::channel::<DeltaDiscoveryRequest>(1);
        let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx2));
        req.metadata_mut()
            .insert("authorization", format!("Bearer {WRONG_AUDIENCE}").parse().expect("ascii"));
        let refused =
            match AggregatedDiscoveryServiceClient::new(channel).delta_aggregated_resources(req).await {
                Err(s) => (s.code(), s.message().to_owned()),
                Ok(r) => match r.into_inner().message().await {
                    Err(s) => (s.code(), s.message().to_owned()),
                    Ok(m) => panic!("a stream with a token for another audience was served: {m:?}"),
                },
            };
        assert_eq!(refused, (tonic::Code::Unauthenticated, "authentication failure".into()));
    });
    let reviews = api.count("create", "/apis/authentication.k8s.io/v1/tokenreviews");
    assert!(reviews >= 5, "{reviews} token reviews");
}

/// The AuthorizationPolicy `name` in `demo` with `spec` (generation `generation`).
fn policy(name: &str, generation: i64, spec: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": "demo", "generation": generation}, "spec": spec})
}

/// The status patches the control plane sent for policy `name`, without their transition time.
fn status_patches(api: &ScriptedApi, name: &str) -> Vec<serde_json::Value> {
    let path = format!("/apis/security.istio.io/v1/namespaces/demo/authorizationpolicies/{name}/status");
    api.requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path == path)
        .filter_map(|r| r.body)
        .map(|mut b| {
            let first = b.get_mut("status").and_then(|s| s.get_mut("conditions")).and_then(|c| c.get_mut(0));
            if let Some(c) = first.and_then(|c| c.as_object_mut()) {
                let time = c.remove("lastTransitionTime");
                assert!(time.as_ref().and_then(|t| t.as_str()).is_some_and(|t| t.ends_with('Z')), "{time:?}");
            }
            b
        })
        .collect()
}

fn condition(status: &str, reason: &str, message: &str, generation: &str) -> serde_json::Value {
    json!({"status": {"conditions": [{"type": "ZtunnelAccepted", "status": status, "reason": reason,
        "message": message, "observedGeneration": generation}]}})
}

/// istiod's `ZtunnelAccepted` on each AuthorizationPolicy, as the status patch the control plane
/// sends: accepted, accepted with what node proxies cannot enforce, not for node proxies (an
/// AUDIT), none for a waypoint policy; a new generation is written once; the switch turns it off.
#[test]
fn policies_get_istiods_ztunnel_accepted_condition() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let api = rt.block_on(ScriptedApi::start());
    api.put_namespace("istio-system", &[]);
    api.put_namespace("demo", &[("istio.io/dataplane-mode", "ambient")]);
    let principals = json!([{"from": [{"source": {"principals": ["cluster.local/ns/demo/sa/client"]}}]}]);
    api.put(policy("l4", 1, json!({"rules": principals})));
    api.put(policy(
        "l7",
        1,
        json!({"rules": [{"to": [{"operation": {"methods": ["GET"], "paths": ["/a"]}}],
                          "when": [{"key": "request.headers[x-user]", "values": ["a"]}]}]}),
    ));
    api.put(policy("audit", 1, json!({"action": "AUDIT", "rules": principals})));
    api.put(policy("waypoint", 1, json!({"targetRefs": [{"kind": "Gateway", "name": "w"}]})));
    let dir = tempfile::tempdir().expect("tempdir");
    let (control, _, _) = start_control(&api, dir.path(), &[]);
    let all = ["l4", "l7", "audit", "waypoint"];
    let written =
        wait_for(|| all.iter().all(|n| !status_patches(&api, n).is_empty()), Duration::from_secs(10));
    assert!(written, "not every policy got a status:\n{:?}\n{}", api.requests(), control.logs());
    let l7 = "ztunnel does not support HTTP attributes (found: methods, paths, request.headers[x-user]). In \
              ambient mode you must use a waypoint proxy to enforce HTTP rules. Within an ALLOW policy, rules \
              matching HTTP attributes are omitted. This will be more restrictive than requested.";
    assert_eq!(status_patches(&api, "l4"), [condition("True", "Accepted", "attached to ztunnel", "1")]);
    assert_eq!(status_patches(&api, "l7"), [condition("True", "UnsupportedValue", l7, "1")]);
    assert_eq!(
        status_patches(&api, "audit"),
        [condition("False", "UnsupportedValue", "ztunnel does not support the AUDIT action", "1")]
    );
    assert_eq!(status_patches(&api, "waypoint"), [json!({"status": {"conditions": null}})]);
    // The status write comes back as a change of the object; nothing is written again.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(status_patches(&api, "l4").len(), 1, "{:?}", api.requests());

    // The L7 rule is fixed: generation 2 is accepted.
    api.put(policy("l7", 2, json!({"rules": principals})));
    let fixed = wait_for(|| status_patches(&api, "l7").len() == 2, Duration::from_secs(10));
    assert!(fixed, "{:?}", status_patches(&api, "l7"));
    assert_eq!(status_patches(&api, "l7")[1], condition("True", "Accepted", "attached to ztunnel", "2"));
    assert_eq!(
        api.object(ambit_objects::Kind::AuthorizationPolicy, "demo", "l7")
            .map(|o| o["status"]["conditions"][0]["reason"].clone()),
        Some(json!("Accepted"))
    );
    drop(control);

    // AMBIENT_ENABLE_STATUS=false: no status is written.
    let api = rt.block_on(ScriptedApi::start());
    api.put_namespace("demo", &[]);
    api.put(policy("l4", 1, json!({"rules": principals})));
    let dir = tempfile::tempdir().expect("tempdir");
    let (_control, _, _) = start_control(&api, dir.path(), &[("AMBIENT_ENABLE_STATUS", "false")]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(status_patches(&api, "l4"), Vec::<serde_json::Value>::new());
}

/// The objects applied (server-side apply) under `path`, in order.
fn applied(api: &ScriptedApi, path: &str) -> Vec<serde_json::Value> {
    api.requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path == path)
        .filter(|r| r.query.get("fieldManager").map(String::as_str) == Some("ambit-control"))
        .filter_map(|r| r.body)
        .collect()
}

/// istiod's gateway controller, for waypoints: an `istio-waypoint` Gateway gets its mesh root
/// ConfigMap, ServiceAccount, Service and Deployment by server-side apply (owned by the
/// Gateway, running the configured image against the control plane), then its address and
/// `Programmed`; while RBAC refuses, the control plane says so and tries again; without an image
/// the Gateway says nothing was deployed.
#[test]
fn waypoint_gateways_are_deployed_as_istiods_gateway_controller_deploys_them() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let api = rt.block_on(ScriptedApi::start());
    api.put_namespace("istio-system", &[]);
    api.put_namespace("shop", &[("istio.io/dataplane-mode", "ambient")]);
    let gateway = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "shop", "uid": "uid-gw", "generation": 1},
        "spec": {"gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}});
    api.put(gateway.clone());
    api.forbid("deployments.apps", "create");
    let dir = tempfile::tempdir().expect("tempdir");
    let image = "registry.example/ambit:1.2.3";
    let (control, _, _) = start_control(&api, dir.path(), &[("AMBIT_WAYPOINT_IMAGE", image)]);
    let deployment = "/apis/apps/v1/namespaces/shop/deployments/waypoint";
    let refused = "cannot deploy the waypoint (ApiError: deployments.apps \"waypoint\" is forbidden: User";
    let said = wait_for(|| control.logs().contains(refused), Duration::from_secs(10));
    assert!(said, "the refusal was not logged:\n{}", control.logs());
    assert!(
        api.object(ambit_objects::Kind::Gateway, "shop", "waypoint").is_some_and(|g| g["status"].is_null())
    );

    // RBAC fixed: deployed within the retry interval (5 s).
    api.allow("deployments.apps", "create");
    let deployed = wait_for(|| !applied(&api, deployment).is_empty(), Duration::from_secs(10));
    assert!(deployed, "no Deployment applied:\n{:?}\n{}", api.requests(), control.logs());
    let d = applied(&api, deployment).remove(0);
    let owner = json!([{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "name": "waypoint", "uid": "uid-gw"}]);
    assert_eq!(d["metadata"]["ownerReferences"], owner, "{d}");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!((c["image"].as_str(), &c["command"]), (Some(image), &json!(["ambit", "waypoint"])), "{c}");
    let xds = c["env"].as_array().and_then(|e| e.iter().find(|e| e["name"] == "XDS_ADDRESS")).cloned();
    assert_eq!(xds, Some(json!({"name": "XDS_ADDRESS", "value": "ambit-control.istio-system.svc:15012"})));
    for (path, kind) in [
        ("/api/v1/namespaces/shop/serviceaccounts/waypoint", "ServiceAccount"),
        ("/api/v1/namespaces/shop/services/waypoint", "Service"),
    ] {
        // Applied before the refused Deployment, and again on the retry.
        let o = applied(&api, path).pop().unwrap_or_else(|| panic!("{path} was not applied"));
        assert_eq!((o["kind"].as_str(), &o["metadata"]["ownerReferences"]), (Some(kind), &owner));
    }
    // The root the waypoint trusts is the control plane's own.
    let root = applied(&api, "/api/v1/namespaces/shop/configmaps/istio-ca-root-cert");
    assert!(!root.is_empty(), "the root ConfigMap was not applied");
    let ours =
        std::fs::read_to_string(dir.path().join("state/ca/root-cert.pem")).expect("the control plane's root");
    assert!(ours.contains("BEGIN CERTIFICATE"), "{ours}");
    assert!(root.iter().all(|r| r["data"]["root-cert.pem"] == ours.as_str()), "{root:?}");
    // The Gateway's status: its Service's hostname, Accepted and Programmed.
    let programmed = wait_for(
        || {
            api.object(ambit_objects::Kind::Gateway, "shop", "waypoint")
                .is_some_and(|g| g["status"]["conditions"][1]["status"] == "True")
        },
        Duration::from_secs(10),
    );
    assert!(programmed, "{:?}", api.object(ambit_objects::Kind::Gateway, "shop", "waypoint"));
    let g = api.object(ambit_objects::Kind::Gateway, "shop", "waypoint").expect("gateway");
    assert_eq!(
        g["status"]["addresses"],
        json!([{"type": "Hostname", "value": "waypoint.shop.svc.cluster.local"}])
    );
    assert_eq!(g["status"]["conditions"][0]["type"], "Accepted");
    assert_eq!(g["status"]["conditions"][1]["observedGeneration"], 1);
    // The status write comes back as a change; nothing is applied again. A new generation is.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(applied(&api, deployment).len(), 1, "{:?}", api.requests());
    let mut changed = gateway.clone();
    changed["metadata"]["generation"] = json!(2);
    api.put(changed);
    let again = wait_for(|| applied(&api, deployment).len() == 2, Duration::from_secs(10));
    assert!(again, "generation 2 was not applied:\n{}", control.logs());
    drop(control);

    // Without an image nothing is deployed, and the Gateway says why.
    let api = rt.block_on(ScriptedApi::start());
    api.put_namespace("shop", &[]);
    api.put(gateway);
    let dir = tempfile::tempdir().expect("tempdir");
    let (control, _, _) = start_control(&api, dir.path(), &[]);
    let said = wait_for(
        || {
            api.object(ambit_objects::Kind::Gateway, "shop", "waypoint")
                .is_some_and(|g| g["status"]["conditions"][1]["reason"] == "Invalid")
        },
        Duration::from_secs(10),
    );
    assert!(said, "{:?}\n{}", api.object(ambit_objects::Kind::Gateway, "shop", "waypoint"), control.logs());
    let g = api.object(ambit_objects::Kind::Gateway, "shop", "waypoint").expect("gateway");
    assert_eq!(
        g["status"]["conditions"][1]["message"],
        "ambit control has no waypoint image (--waypoint-image, AMBIT_WAYPOINT_IMAGE): no waypoint was deployed"
    );
    assert!(applied(&api, deployment).is_empty());
    let warned = control.wait_for_log(
        "no --waypoint-image (AMBIT_WAYPOINT_IMAGE): waypoint Gateways are not deployed",
        Duration::from_secs(5),
    );
    assert!(warned, "{}", control.logs());
}
