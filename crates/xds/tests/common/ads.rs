//! A server under test and a scripted client: the raw tonic client stub sends each request and
//! the test reads each response.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ambit_api::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_api::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ambit_xds::resource_version;
use ambit_xds::server::{AdsServer, Authenticate, Changes, Hooks, Resources, ServerConfig, ServerResource};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};

use super::*;

pub struct Server {
    pub resources: Resources,
    pub ads: AdsServer,
    pub url: String,
    _task: tokio::task::JoinHandle<()>,
}

pub async fn start(cfg: ServerConfig, auth: Option<Arc<dyn Authenticate>>) -> Server {
    start_with(cfg, Hooks { authenticate: auth, ..Hooks::default() }).await
}

pub async fn start_with(cfg: ServerConfig, hooks: Hooks) -> Server {
    let resources = Resources::new([A, B]);
    let ads = AdsServer::new(resources.clone(), cfg, hooks);
    let (addr, task) = serve(ads.clone()).await;
    Server { resources, ads, url: format!("http://{addr}"), _task: task }
}

pub fn fast() -> ServerConfig {
    ServerConfig {
        debounce_after: Duration::from_millis(20),
        debounce_max: Duration::from_secs(1),
        ..Default::default()
    }
}

pub fn r(name: &str, payload: &str) -> ServerResource {
    ServerResource {
        name: name.into(),
        aliases: vec![],
        resource: any(A, payload.as_bytes()),
        also: vec![],
        node: None,
    }
}

pub fn version(payload: &str) -> String {
    resource_version(&any(A, payload.as_bytes()))
}

pub fn upsert(type_url: &str, rs: Vec<ServerResource>) -> Changes {
    Changes { type_url: type_url.into(), upserts: rs, removals: vec![] }
}

pub fn remove(type_url: &str, names: &[&str]) -> Changes {
    Changes { type_url: type_url.into(), upserts: vec![], removals: strings(names) }
}

pub struct Client {
    pub tx: mpsc::Sender<DeltaDiscoveryRequest>,
    pub rx: Streaming<DeltaDiscoveryResponse>,
}

impl Client {
    pub async fn open(url: &str, token: Option<&str>) -> Result<Self, Status> {
        let mut stub = AggregatedDiscoveryServiceClient::connect(url.to_owned())
            .await
            .expect("connect")
            .max_decoding_message_size(64 << 20);
        let (tx, rx) = mpsc::channel(16);
        let mut req = Request::new(ReceiverStream::new(rx));
        if let Some(t) = token {
            req.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        // Tonic waits for the response headers; the server sends them after its handler returns.
        let rx = stub.delta_aggregated_resources(req).await?.into_inner();
        Ok(Self { tx, rx })
    }

    pub async fn send(&self, r: DeltaDiscoveryRequest) {
        self.tx.send(r).await.expect("stream open");
    }

    pub async fn recv(&mut self) -> DeltaDiscoveryResponse {
        match timeout(WAIT, self.rx.message()).await {
            Ok(Ok(Some(r))) => r,
            other => panic!("expected a response, got {other:?}"),
        }
    }

    pub async fn recv_err(&mut self) -> Status {
        match timeout(WAIT, self.rx.message()).await {
            Ok(Err(s)) => s,
            other => panic!("expected the stream to fail, got {other:?}"),
        }
    }

    /// Asserts nothing arrives for `ms` milliseconds.
    pub async fn quiet(&mut self, ms: u64) {
        if let Ok(r) = timeout(Duration::from_millis(ms), self.rx.message()).await {
            panic!("expected no response, got {r:?}");
        }
    }

    pub async fn ack(&self, resp: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest { response_nonce: resp.nonce.clone(), ..req(&resp.type_url) }).await;
    }

    pub async fn wildcard(&self, type_url: &str, initial: &[(&str, &str)]) {
        self.send(DeltaDiscoveryRequest {
            node: Some(node("ztunnel~10.0.0.1~p.ns~ns.svc.cluster.local")),
            initial_resource_versions: initial
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..req(type_url)
        })
        .await;
    }
}

/// name → (version, payload) of a response's resources.
pub fn contents(resp: &DeltaDiscoveryResponse) -> BTreeMap<String, (String, String)> {
    resp.resources
        .iter()
        .map(|r| {
            let payload = String::from_utf8_lossy(&r.resource.as_ref().unwrap().value).into_owned();
            (r.name.clone(), (r.version.clone(), payload))
        })
        .collect()
}

pub fn names(resp: &DeltaDiscoveryResponse) -> Vec<String> {
    contents(resp).into_keys().collect()
}

/// Pushes received (with their content) until `quiet_ms` pass without one.
pub async fn drain(c: &mut Client, quiet_ms: u64) -> Vec<DeltaDiscoveryResponse> {
    let mut out = Vec::new();
    while let Ok(Some(Ok(Some(p)))) = timeout(Duration::from_millis(quiet_ms), c.rx.message()).await.map(Some)
    {
        c.ack(&p).await;
        out.push(p);
    }
    out
}
