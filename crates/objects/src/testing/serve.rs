//! The server's side of [`super::ScriptedApi`]: each request routed, authorized as the test
//! scripted it, and answered from the shared state.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use super::{Body, Live, Seen, State, key};

/// What a `GET` path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// A collection (list or watch), in one namespace or all.
    Collection { resource: String, namespace: Option<String> },
    /// One object by name (`namespace` empty for cluster-scoped ones).
    Object { resource: String, namespace: String, name: String },
}

/// The target of a `GET` path: `/api/v1/[namespaces/<ns>/]<plural>[/<name>]`,
/// `/apis/<group>/<version>/[namespaces/<ns>/]<plural>[/<name>]`.
pub(super) fn target(segments: &[&str]) -> Option<Target> {
    let (group, rest) = match segments {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let resource =
        |plural: &str| if group.is_empty() { plural.to_owned() } else { format!("{plural}.{group}") };
    Some(match rest {
        [plural] => Target::Collection { resource: resource(plural), namespace: None },
        ["namespaces", ns, plural] => {
            Target::Collection { resource: resource(plural), namespace: Some((*ns).into()) }
        }
        [plural, name] => {
            Target::Object { resource: resource(plural), namespace: String::new(), name: (*name).into() }
        }
        ["namespaces", ns, plural, name] => {
            Target::Object { resource: resource(plural), namespace: (*ns).into(), name: (*name).into() }
        }
        _ => return None,
    })
}

/// Which objects of a collection a list or watch returns: its namespace, and the field
/// selectors `spec.nodeName=…` and `metadata.name=…`.
#[derive(Clone, Debug, Default)]
struct Select {
    namespace: Option<String>,
    node: Option<String>,
    name: Option<String>,
}

impl Select {
    fn matches(&self, obj: &Value) -> bool {
        let m = &obj["metadata"];
        self.namespace.as_deref().is_none_or(|ns| m["namespace"].as_str() == Some(ns))
            && self.node.as_deref().is_none_or(|n| obj["spec"]["nodeName"].as_str() == Some(n))
            && self.name.as_deref().is_none_or(|n| m["name"].as_str() == Some(n))
    }
}

/// What a 403 names: the plural and the group of a resource.
fn plural_and_group(resource: &str) -> (&str, &str) {
    resource.split_once('.').unwrap_or((resource, ""))
}

pub(super) async fn handle(
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
        (&Method::GET, segments) if target(segments).is_some() => {
            let (resource, namespace, name) = match target(segments) {
                Some(Target::Collection { resource, namespace }) => (resource, namespace, None),
                Some(Target::Object { resource, namespace, name }) => (resource, Some(namespace), Some(name)),
                None => return status(404, "NotFound", "the server could not find the requested resource"),
            };
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
                let (subject, scope) = match (&name, namespace.as_deref()) {
                    (Some(n), _) => (format!("{resource} \"{n}\""), scope_of(namespace.as_deref())),
                    (None, ns) => (resource.clone(), scope_of(ns)),
                };
                return status(
                    403,
                    "Forbidden",
                    &format!(
                        "{subject} is forbidden: User \"{user}\" cannot {verb} resource \"{plural}\" in API group \"{group}\" {scope}"
                    ),
                );
            }
            if let Some(name) = name {
                let ns = namespace.unwrap_or_default();
                let found = state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .resource(&resource)
                    .objects
                    .get(&key(&ns, &name))
                    .cloned();
                return match found {
                    Some(obj) => json_response(200, &obj),
                    None => status(404, "NotFound", &format!("{resource} \"{name}\" not found")),
                };
            }
            let field = |prefix: &str| {
                seen.query.get("fieldSelector").and_then(|f| f.strip_prefix(prefix)).map(str::to_owned)
            };
            let select = Select { namespace, node: field("spec.nodeName="), name: field("metadata.name=") };
            if verb == "watch" {
                let from = seen.query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
                watch_response(&state, &resource, from, select)
            } else {
                let mut released = released;
                let _ = released.wait_for(|r| *r).await;
                list_response(&state, &resource, &select)
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

/// Where a 403 says the request was refused.
fn scope_of(namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("in the namespace \"{ns}\""),
        _ => "at the cluster scope".to_owned(),
    }
}

fn list_response(state: &Arc<Mutex<State>>, resource: &str, select: &Select) -> Response<Body> {
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    let rv = st.rv;
    let r = st.resource(resource);
    let items: Vec<&Value> = r.objects.values().filter(|o| select.matches(o)).collect();
    let list = json!({
        "apiVersion": r.api_version,
        "kind": format!("{}List", r.kind),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    });
    json_response(200, &list)
}

fn watch_response(state: &Arc<Mutex<State>>, resource: &str, from: u64, select: Select) -> Response<Body> {
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
            if *rv > from && select.matches(obj) {
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
                Live::Event(kind, obj) if select.matches(&obj) => {
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
