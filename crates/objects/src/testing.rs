//! A scripted Kubernetes API server for tests: plain HTTP/1.1 on a TCP socket, speaking the real
//! list and watch protocol for any kind (resourceVersions, `ADDED`/`MODIFIED`/`DELETED` events,
//! `BOOKMARK`s, `410 Gone` that forces a relist), the `pods/status` merge patch and
//! `TokenReview`s, so the sources (and the agent, and the CA's authenticator) are driven through
//! the real `kube::Client` and a kubeconfig file rather than mocks. The test scripts it: objects
//! come and go, watches expire, lists are held back, a resource and verb can be forbidden (403)
//! or a resource not served at all (404: its CRD is not installed), tokens are known or not.
//!
//! Served: `GET /api/v1/<resource>` and `GET /apis/<group>/<version>/<resource>`, also under
//! `namespaces/<ns>/` (list, or watch with `watch=true`; `fieldSelector=spec.nodeName=…` and
//! `metadata.name=…` are honoured), `GET` of one object by name, `PATCH
//! /api/v1/namespaces/{ns}/pods/{name}/status` (JSON merge patch; and any kind's `status`), server-side
//! apply of namespaced objects (`PATCH` with `application/apply-patch+yaml`) and `POST
//! /apis/authentication.k8s.io/v1/tokenreviews`. Everything else answers 404. Resources are named
//! as RBAC names them: `pods`, `authorizationpolicies.security.istio.io`
//! ([`crate::kube::resource`]). Besides the kinds Ambit reads it stores DaemonSets
//! (`daemonsets.apps`), which the agent reads to tell an uninstall from an upgrade.

mod serve;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

use crate::Kind;

/// One request the server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// `GET`, `PATCH`, …
    pub method: String,
    /// The path.
    pub path: String,
    /// The decoded query parameters.
    pub query: BTreeMap<String, String>,
    /// The JSON body of a TokenReview, or of a status patch.
    pub body: Option<Value>,
}

impl Seen {
    /// `get`, `list`, `watch`, `patch` or `create`, as RBAC names the verb.
    pub fn verb(&self) -> &'static str {
        let segments: Vec<&str> = self.path.trim_matches('/').split('/').collect();
        match self.method.as_str() {
            "PATCH" => "patch",
            "POST" => "create",
            _ if matches!(serve::target(&segments), Some(serve::Target::Object { .. })) => "get",
            _ if self.query.get("watch").is_some_and(|w| w == "true" || w == "1") => "watch",
            _ => "list",
        }
    }
}

/// The scripted API server; dropping it stops it.
pub struct ScriptedApi {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    release_lists: watch::Sender<bool>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// One resource's objects and history.
struct Resource {
    kind: String,
    api_version: String,
    objects: BTreeMap<String, Value>,
    /// `(resourceVersion, event type, object)`, every change in order.
    log: Vec<(u64, &'static str, Value)>,
    /// Watches from a resourceVersion older than this get `410 Gone`.
    compacted: u64,
    live: broadcast::Sender<Live>,
}

#[derive(Clone, Debug)]
enum Live {
    Event(&'static str, Value),
    Bookmark(u64),
    Expire,
}

struct State {
    rv: u64,
    resources: BTreeMap<String, Resource>,
    forbidden: Vec<(String, String)>,
    unserved: Vec<String>,
    tokens: BTreeMap<String, TokenIdentity>,
    user: String,
    seen: Vec<Seen>,
}

/// Who a scripted token authenticates as, and for which audiences.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenIdentity {
    /// `system:serviceaccount:<ns>:<name>`.
    pub username: String,
    /// The user's uid.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// The token's audiences; a review asking for others is refused, as the API server does.
    pub audiences: Vec<String>,
    /// `extra` (the pod name and uid a bound token carries, e.g.
    /// `authentication.kubernetes.io/pod-name`).
    pub extra: BTreeMap<String, Vec<String>>,
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

impl ScriptedApi {
    /// Listens on `127.0.0.1:0` (on the current tokio runtime).
    pub async fn start() -> ScriptedApi {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        ScriptedApi::start_on(listener)
    }

    /// Serves on `listener` (created, for example, inside another network namespace); must be
    /// called within a tokio runtime.
    pub fn start_on(listener: std::net::TcpListener) -> ScriptedApi {
        listener.set_nonblocking(true).unwrap_or_else(|e| panic!("nonblocking: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("local_addr: {e}"));
        let listener =
            tokio::net::TcpListener::from_std(listener).unwrap_or_else(|e| panic!("listener: {e}"));
        let state = Arc::new(Mutex::new(State {
            rv: 100,
            resources: BTreeMap::new(),
            forbidden: Vec::new(),
            unserved: Vec::new(),
            tokens: BTreeMap::new(),
            user: "system:serviceaccount:ambit-system:ambit-agent".to_owned(),
            seen: Vec::new(),
        }));
        let (release_lists, lists_released) = watch::channel(true);
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
                    _ = &mut stopped => return,
                };
                let (st, released) = (st.clone(), lists_released.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (st, released) = (st.clone(), released.clone());
                        async move { Ok::<_, Infallible>(serve::handle(req, st, released).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        ScriptedApi { addr, state, release_lists, _stop: stop }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig that points at this server (no TLS, a dummy bearer token).
    pub fn write_kubeconfig(&self, path: &Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: scripted\n  cluster:\n    server: {}\n\
             users:\n- name: agent\n  user:\n    token: scripted-token\ncontexts:\n- name: scripted\n  \
             context:\n    cluster: scripted\n    user: agent\n    namespace: default\ncurrent-context: scripted\n",
            self.url()
        );
        std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// A `kube::Client` built from a kubeconfig file for this server, the way `ambit agent`
    /// builds one from `KUBECONFIG`.
    pub async fn client(&self, kubeconfig: &Path) -> kube::Client {
        self.write_kubeconfig(kubeconfig);
        let kc =
            kube::config::Kubeconfig::read_from(kubeconfig).unwrap_or_else(|e| panic!("kubeconfig: {e}"));
        let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap_or_else(|e| panic!("kube config: {e}"));
        kube::Client::try_from(cfg).unwrap_or_else(|e| panic!("kube client: {e}"))
    }

    /// Creates or replaces an object of any kind Ambit reads (an `ADDED` or `MODIFIED` event);
    /// its `metadata.resourceVersion` is set here.
    pub fn put(&self, object: Value) {
        let (resource, key) = locate(&object);
        self.lock().put(&resource, key, object);
    }

    /// Deletes an object with a `DELETED` event.
    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) {
        self.lock().delete(&crate::kube::resource(kind), &key(namespace, name), true);
    }

    /// Deletes an object of any resource the server stores (`daemonsets.apps`) with a `DELETED`
    /// event.
    pub fn delete_from(&self, resource: &str, namespace: &str, name: &str) {
        self.lock().delete(resource, &key(namespace, name), true);
    }

    /// Deletes an object without any event, as if the event was lost while no watch was open:
    /// only a relist shows it gone.
    pub fn delete_silently(&self, kind: Kind, namespace: &str, name: &str) {
        self.lock().delete(&crate::kube::resource(kind), &key(namespace, name), false);
    }

    /// The stored object.
    pub fn object(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        let mut st = self.lock();
        st.resource(&crate::kube::resource(kind)).objects.get(&key(namespace, name)).cloned()
    }

    /// Creates or replaces a namespace (an `ADDED` or `MODIFIED` event).
    pub fn put_namespace(&self, name: &str, labels: &[(&str, &str)]) {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        self.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "uid": format!("ns-{name}"), "labels": labels}}));
    }

    /// Creates or replaces a pod (an `ADDED` or `MODIFIED` event).
    pub fn put_pod(&self, pod: Value) {
        self.put(pod);
    }

    /// Deletes a pod with a `DELETED` event.
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        self.delete(Kind::Pod, namespace, name);
    }

    /// Deletes a pod without any event (see [`ScriptedApi::delete_silently`]).
    pub fn delete_pod_silently(&self, namespace: &str, name: &str) {
        self.delete_silently(Kind::Pod, namespace, name);
    }

    /// The stored pod object.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.object(Kind::Pod, namespace, name)
    }

    /// Makes `token` authenticate as `identity` in TokenReviews.
    pub fn add_token(&self, token: &str, identity: TokenIdentity) {
        self.lock().tokens.insert(token.to_owned(), identity);
    }

    /// Makes `token` unknown again.
    pub fn revoke_token(&self, token: &str) {
        self.lock().tokens.remove(token);
    }

    /// The user named in 403 messages (default: the agent's service account).
    pub fn set_user(&self, user: &str) {
        self.lock().user = user.to_owned();
    }

    /// Answers `404` to every request on `resource` (its CRD is not installed) until
    /// [`ScriptedApi::serve`].
    pub fn unserve(&self, resource: &str) {
        self.lock().unserved.push(resource.to_owned());
    }

    /// Serves `resource` again.
    pub fn serve(&self, resource: &str) {
        self.lock().unserved.retain(|r| r != resource);
    }

    /// Sends a `BOOKMARK` with the current resourceVersion to the open watches of `resource`.
    pub fn bookmark(&self, resource: &str) {
        let mut st = self.lock();
        st.rv += 1;
        let rv = st.rv;
        let _ = st.resource(resource).live.send(Live::Bookmark(rv));
    }

    /// Ends every open watch of `resource` with a `410 Gone` (resourceVersion too old) and makes
    /// any later watch from an older resourceVersion get one too: the client must relist.
    pub fn expire_watches(&self, resource: &str) {
        let mut st = self.lock();
        st.rv += 1;
        let rv = st.rv;
        let r = st.resource(resource);
        r.compacted = rv;
        let _ = r.live.send(Live::Expire);
    }

    /// Answers `403 Forbidden` to `verb` (`list`, `watch`, `patch`, `create`) on `resource`
    /// (`pods`, `namespaces`, `pods/status`, `tokenreviews`, `gateways.gateway.networking.k8s.io`)
    /// from now on.
    pub fn forbid(&self, resource: &str, verb: &str) {
        self.lock().forbidden.push((resource.to_owned(), verb.to_owned()));
    }

    /// Stops answering `403` to `verb` on `resource`.
    pub fn allow(&self, resource: &str, verb: &str) {
        self.lock().forbidden.retain(|(r, v)| !(r == resource && v == verb));
    }

    /// Holds list responses (`true`) or releases them (`false`).
    pub fn hold_lists(&self, hold: bool) {
        self.release_lists.send_replace(!hold);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// Requests with this verb on this path.
    pub fn count(&self, verb: &str, path: &str) -> usize {
        self.lock().seen.iter().filter(|s| s.verb() == verb && s.path == path).count()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Resource {
    fn new(resource: &str) -> Resource {
        let (kind, api_version) = Kind::ALL
            .iter()
            .find(|k| crate::kube::resource(**k) == resource)
            .map(|k| (k.name().to_owned(), k.api_version().to_owned()))
            .or_else(|| {
                OTHER_KINDS.iter().find(|o| o.0 == resource).map(|o| (o.1.to_owned(), o.2.to_owned()))
            })
            .unwrap_or_else(|| ("Unknown".to_owned(), "v1".to_owned()));
        Resource {
            kind,
            api_version,
            objects: BTreeMap::new(),
            log: Vec::new(),
            compacted: 0,
            live: broadcast::channel(1024).0,
        }
    }

    fn record(&mut self, rv: u64, kind: &'static str, obj: Value) {
        self.log.push((rv, kind, obj.clone()));
        let _ = self.live.send(Live::Event(kind, obj));
    }
}

impl State {
    fn resource(&mut self, name: &str) -> &mut Resource {
        self.resources.entry(name.to_owned()).or_insert_with(|| Resource::new(name))
    }

    fn put(&mut self, resource: &str, key: String, mut obj: Value) {
        self.rv += 1;
        let rv = self.rv;
        obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let r = self.resource(resource);
        let kind = if r.objects.insert(key, obj.clone()).is_some() { "MODIFIED" } else { "ADDED" };
        r.record(rv, kind, obj);
    }

    fn delete(&mut self, resource: &str, key: &str, announce: bool) {
        self.rv += 1;
        let rv = self.rv;
        let r = self.resource(resource);
        if let Some(mut obj) = r.objects.remove(key)
            && announce
        {
            obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
            r.record(rv, "DELETED", obj);
        }
    }

    fn forbidden(&self, resource: &str, verb: &str) -> bool {
        self.forbidden.iter().any(|(r, v)| r == resource && v == verb)
    }
}

/// `namespace/name`, or `name` for cluster-scoped objects.
fn key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() { name.to_owned() } else { format!("{namespace}/{name}") }
}

/// Kinds the server stores that are not [`Kind`]s: `(resource, kind, apiVersion)`.
const OTHER_KINDS: &[(&str, &str, &str)] = &[("daemonsets.apps", "DaemonSet", "apps/v1")];

/// The resource and key of an object given by a test.
fn locate(object: &Value) -> (String, String) {
    let (api_version, kind) =
        (object["apiVersion"].as_str().unwrap_or_default(), object["kind"].as_str().unwrap_or_default());
    let resource = match Kind::of(api_version, kind) {
        Some(k) => crate::kube::resource(k),
        None => match OTHER_KINDS.iter().find(|o| (o.1, o.2) == (kind, api_version)) {
            Some(o) => o.0.to_owned(),
            None => panic!("the scripted API server does not serve {kind} of {api_version}"),
        },
    };
    let m = &object["metadata"];
    (resource, key(m["namespace"].as_str().unwrap_or_default(), m["name"].as_str().unwrap_or_default()))
}
