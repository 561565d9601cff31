//! A scripted Kubernetes API server for tests: plain HTTP/1.1 on a TCP socket, speaking the real
//! list and watch protocol for any kind (resourceVersions, `ADDED`/`MODIFIED`/`DELETED` events,
//! `BOOKMARK`s, `410 Gone` that forces a relist), the `pods/status` merge patch and
//! `TokenReview`s, so the sources (and the agent, and the CA's authenticator) are driven through
//! the real `kube::Client` and a kubeconfig file rather than mocks. The test scripts it: objects
//! come and go, watches expire, lists are held back, a resource and verb can be forbidden (403)
//! or a resource not served at all (404: its CRD is not installed), tokens are known or not.
//!
//! Served: `GET /api/v1/<resource>` and `GET /apis/<group>/<version>/<resource>` (list, or watch
//! with `watch=true`; `fieldSelector=spec.nodeName=…` is honoured), `PATCH
//! /api/v1/namespaces/{ns}/pods/{name}/status` (JSON merge patch; and any kind's `status`), server-side
//! apply of namespaced objects (`PATCH` with `application/apply-patch+yaml`) and `POST
//! /apis/authentication.k8s.io/v1/tokenreviews`. Everything else answers 404. Resources are named
//! as RBAC names them: `pods`, `authorizationpolicies.security.istio.io`
//! ([`crate::kube::resource`]).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

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
    /// `list`, `watch`, `patch` or `create`, as RBAC names the verb.
    pub fn verb(&self) -> &'static str {
        match self.method.as_str() {
            "PATCH" => "patch",
            "POST" => "create",
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
                        async move { Ok::<_, Infallible>(handle(req, st, released).await) }
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

/// The resource and key of an object given by a test.
fn locate(object: &Value) -> (String, String) {
    let (api_version, kind) =
        (object["apiVersion"].as_str().unwrap_or_default(), object["kind"].as_str().unwrap_or_default());
    let Some(k) = Kind::of(api_version, kind) else {
        panic!("the scripted API server does not serve {kind} of {api_version}")
    };
    let m = &object["metadata"];
    (
        crate::kube::resource(k),
        key(m["namespace"].as_str().unwrap_or_default(), m["name"].as_str().unwrap_or_default()),
    )
}

/// The resource a list/watch path names: `/api/v1/pods`, `/apis/<group>/<version>/<plural>`.
fn path_resource(segments: &[&str]) -> Option<String> {
    match segments {
        ["api", "v1", plural] => Some((*plural).to_owned()),
        ["apis", group, _version, plural] => Some(format!("{plural}.{group}")),
        _ => None,
    }
}

/// What a 403 names: the plural and the group of a resource.
fn plural_and_group(resource: &str) -> (&str, &str) {
    resource.split_once('.').unwrap_or((resource, ""))
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
    released: watch::Receiver<bool>,
) -> Response<Body> {
    let seen = Seen {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
        query: req.uri().query().map(parse_query).unwrap_or_default(),
        body: None,
    };
    let lock = |s: &Arc<Mutex<State>>| s.lock().unwrap_or_else(|p| p.into_inner()).seen.push(seen.clone());
    lock(&state);
    let segments: Vec<&str> = seen.path.trim_matches('/').split('/').collect();
    let user = state.lock().unwrap_or_else(|p| p.into_inner()).user.clone();
    match (req.method(), segments.as_slice()) {
        (&Method::POST, ["apis", "authentication.k8s.io", "v1", "tokenreviews"]) => {
            if state.lock().unwrap_or_else(|p| p.into_inner()).forbidden("tokenreviews", "create") {
                return status(
                    403,
                    "Forbidden",
                    &format!(
                        "tokenreviews.authentication.k8s.io is forbidden: User \"{user}\" cannot create resource \"tokenreviews\" in API group \"authentication.k8s.io\" at the cluster scope"
                    ),
                );
            }
            let review = match json_body(req, &state, "the TokenReview").await {
                Ok(v) => v,
                Err(answer) => return answer,
            };
            let token = review["spec"]["token"].as_str().unwrap_or_default();
            let wanted: Vec<String> = review["spec"]["audiences"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            let identity = state.lock().unwrap_or_else(|p| p.into_inner()).tokens.get(token).cloned();
            let review_status = match identity {
                None => {
                    json!({"authenticated": false, "error": "[invalid bearer token, token lookup failed]"})
                }
                Some(id) => {
                    let common: Vec<&String> = if wanted.is_empty() {
                        id.audiences.iter().collect()
                    } else {
                        wanted.iter().filter(|a| id.audiences.contains(a)).collect()
                    };
                    if !wanted.is_empty() && common.is_empty() {
                        json!({"authenticated": false, "error": format!(
                            "[invalid bearer token, token audiences {:?} is invalid for the target audiences {:?}]",
                            id.audiences, wanted)})
                    } else {
                        json!({"authenticated": true, "audiences": common, "user": {
                            "username": id.username, "uid": id.uid, "groups": id.groups, "extra": id.extra}})
                    }
                }
            };
            let mut answer = review;
            answer["status"] = review_status;
            json_response(201, &answer)
        }
        (&Method::GET, segments) if path_resource(segments).is_some() => {
            let resource = path_resource(segments).unwrap_or_default();
            let verb = seen.verb();
            let (forbidden, unserved) = {
                let st = state.lock().unwrap_or_else(|p| p.into_inner());
                (st.forbidden(&resource, verb), st.unserved.contains(&resource))
            };
            if unserved {
                return status(404, "NotFound", "the server could not find the requested resource");
            }
            if forbidden {
                let (plural, group) = plural_and_group(&resource);
                return status(
                    403,
                    "Forbidden",
                    &format!(
                        "{resource} is forbidden: User \"{user}\" cannot {verb} resource \"{plural}\" in API group \"{group}\" at the cluster scope"
                    ),
                );
            }
            let node = seen
                .query
                .get("fieldSelector")
                .and_then(|f| f.strip_prefix("spec.nodeName="))
                .map(str::to_owned);
            if verb == "watch" {
                let from = seen.query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
                watch_response(&state, &resource, from, node)
            } else {
                let mut released = released;
                let _ = released.wait_for(|r| *r).await;
                list_response(&state, &resource, node.as_deref())
            }
        }
        (&Method::PATCH, ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
            merge_status(req, &state, &user, ("pods", "pods", ""), ns, name).await
        }
        (&Method::PATCH, ["apis", group, _version, "namespaces", ns, plural, name, "status"]) => {
            let resource = format!("{plural}.{group}");
            merge_status(req, &state, &user, (&resource, plural, group), ns, name).await
        }
        (&Method::PATCH, ["api", "v1", "namespaces", ns, plural, name]) => {
            let plural = (*plural).to_owned();
            server_side_apply(req, &state, &user, (&plural, &plural, ""), ns, name).await
        }
        (&Method::PATCH, ["apis", group, _version, "namespaces", ns, plural, name]) => {
            let resource = format!("{plural}.{group}");
            server_side_apply(req, &state, &user, (&resource, plural, group), ns, name).await
        }
        _ => status(404, "NotFound", "the server could not find the requested resource"),
    }
}

/// A server-side apply (`application/apply-patch+yaml`, a `fieldManager` required, as the real
/// server requires them): the applied object is stored as given (one manager owns every field
/// here) and kept as the request's body. `patch` is checked, and `create` too when the object is
/// new, as the real server authorizes an apply that creates.
async fn server_side_apply(
    req: Request<Incoming>,
    state: &Arc<Mutex<State>>,
    user: &str,
    (resource, plural, group): (&str, &str, &str),
    ns: &str,
    name: &str,
) -> Response<Body> {
    let apply =
        req.headers().get(http::header::CONTENT_TYPE).is_some_and(|v| v == "application/apply-patch+yaml");
    if !apply {
        return status(415, "UnsupportedMediaType", "only server-side apply is served");
    }
    if !req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv.starts_with("fieldManager="))) {
        return status(400, "BadRequest", "PATCH with apply requires a fieldManager");
    }
    let key = key(ns, name);
    let exists =
        state.lock().unwrap_or_else(|p| p.into_inner()).resource(resource).objects.contains_key(&key);
    for verb in if exists { vec!["patch"] } else { vec!["patch", "create"] } {
        if state.lock().unwrap_or_else(|p| p.into_inner()).forbidden(resource, verb) {
            return status(
                403,
                "Forbidden",
                &format!(
                    "{resource} \"{name}\" is forbidden: User \"{user}\" cannot {verb} resource \"{plural}\" in API group \"{group}\" in the namespace \"{ns}\""
                ),
            );
        }
    }
    let object = match json_body(req, state, "the applied object").await {
        Ok(v) => v,
        Err(answer) => return answer,
    };
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    st.put(resource, key.clone(), object);
    let object = st.resource(resource).objects.get(&key).cloned().unwrap_or_default();
    json_response(200, &object)
}

/// A JSON merge patch of an object's `status` (`resource` as the server keys it, its plural and
/// group as a 403 names them); the patch is kept as the request's body.
async fn merge_status(
    req: Request<Incoming>,
    state: &Arc<Mutex<State>>,
    user: &str,
    (resource, plural, group): (&str, &str, &str),
    ns: &str,
    name: &str,
) -> Response<Body> {
    if state.lock().unwrap_or_else(|p| p.into_inner()).forbidden(&format!("{resource}/status"), "patch") {
        return status(
            403,
            "Forbidden",
            &format!(
                "{resource} \"{name}\" is forbidden: User \"{user}\" cannot patch resource \"{plural}/status\" in API group \"{group}\" in the namespace \"{ns}\""
            ),
        );
    }
    let key = format!("{ns}/{name}");
    let patch = match json_body(req, state, "the patch").await {
        Ok(v) => v,
        Err(answer) => return answer,
    };
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut object) = st.resource(resource).objects.get(&key).cloned() else {
        return status(404, "NotFound", &format!("{resource} \"{name}\" not found"));
    };
    merge(&mut object, &patch);
    st.put(resource, key.clone(), object);
    let object = st.resource(resource).objects.get(&key).cloned().unwrap_or_default();
    json_response(200, &object)
}

/// A request's JSON body, kept as the body of the request last seen; else the 400 to answer.
async fn json_body(
    req: Request<Incoming>,
    state: &Arc<Mutex<State>>,
    what: &str,
) -> Result<Value, Response<Body>> {
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Err(status(400, "BadRequest", "unreadable body")),
    };
    let Ok(value) = serde_json::from_slice::<Value>(&body) else {
        return Err(status(400, "BadRequest", &format!("{what} is not JSON")));
    };
    if let Some(s) = state.lock().unwrap_or_else(|p| p.into_inner()).seen.last_mut() {
        s.body = Some(value.clone());
    }
    Ok(value)
}

fn list_response(state: &Arc<Mutex<State>>, resource: &str, node: Option<&str>) -> Response<Body> {
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    let rv = st.rv;
    let r = st.resource(resource);
    let items: Vec<&Value> = r.objects.values().filter(|o| on_node(o, node)).collect();
    let list = json!({
        "apiVersion": r.api_version,
        "kind": format!("{}List", r.kind),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    });
    json_response(200, &list)
}

fn watch_response(
    state: &Arc<Mutex<State>>,
    resource: &str,
    from: u64,
    node: Option<String>,
) -> Response<Body> {
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": format!("too old resource version: {from}"), "reason": "Expired", "code": 410}});
    let line = |v: &Value| Bytes::from(format!("{v}\n"));
    let (mut live, kind, api_version) = {
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        let r = st.resource(resource);
        if from < r.compacted {
            let _ = tx.send(line(&gone));
            drop(tx);
            return stream_response(rx);
        }
        for (rv, kind, obj) in &r.log {
            if *rv > from && on_node(obj, node.as_deref()) {
                let _ = tx.send(line(&json!({"type": kind, "object": obj})));
            }
        }
        (r.live.subscribe(), r.kind.clone(), r.api_version.clone())
    };
    tokio::spawn(async move {
        loop {
            let item = match live.recv().await {
                Ok(item) => item,
                Err(broadcast::error::RecvError::Lagged(_)) => Live::Expire,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let sent = match item {
                Live::Event(kind, obj) if on_node(&obj, node.as_deref()) => {
                    tx.send(line(&json!({"type": kind, "object": obj})))
                }
                Live::Event(..) => Ok(()),
                Live::Bookmark(rv) => tx.send(line(&json!({"type": "BOOKMARK", "object": {
                    "kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": rv.to_string()}}}))),
                Live::Expire => {
                    let _ = tx.send(line(&gone));
                    return;
                }
            };
            if sent.is_err() {
                return;
            }
        }
    });
    stream_response(rx)
}

fn stream_response(rx: mpsc::UnboundedReceiver<Bytes>) -> Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(chunk)), rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(stream.boxed()).boxed_unsync())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed_unsync()))
}

fn on_node(obj: &Value, node: Option<&str>) -> bool {
    node.is_none_or(|n| obj["spec"]["nodeName"].as_str() == Some(n))
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    json_response(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}),
    )
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed_unsync())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed_unsync()))
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in patch {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%' && i + 2 < b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()))
            .flatten();
        match (hex, b[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, other) => {
                out.push(other);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
