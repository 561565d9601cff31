//! The monitoring server (15014): `/metrics`, the debug endpoints, `/logging` and CPU profiles.

use std::sync::{Mutex, PoisonError, mpsc};
use std::time::Duration;

use ambit_admin::{Body, text};
use ambit_xds::server::{AdsServer, Resources};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use crate::translate::{Translator, render};

/// The index (`/`).
const INDEX: &str = "ambit control
  /metrics                       Prometheus metrics
  /debug/connections             connected proxies: node, identity, per type what was last sent and acked, NACKs
  /debug/config_dump             the translated resources (?type=address|authorization|destination|policy, ?name=<xDS name>)
  /debug/config_errors           files of the YAML folder that are not in effect, policies node proxies do not enforce as written, and what keeps waypoints' configuration from being as written
  /debug/policies                every AuthorizationPolicy and PeerAuthentication: what it applies to, what node proxies enforce (in words), warnings
  /logging                       POST: show the log level; ?level=<level> or ?level=<mod>:<level>,...; ?reset
  /debug/pprof/profile           GET: CPU profile (pprof protobuf); ?seconds=1..300 (10), ?frequency=1..1000 Hz (100)
";

/// How long a debug request waits for the translation thread (busy with a big batch).
const TRANSLATE_WAIT: Duration = Duration::from_secs(10);

/// What the monitoring endpoints read.
pub struct Ctx {
    /// Every metric.
    pub registry: Registry,
    /// The xDS servers (TLS, plaintext).
    pub streams: Vec<AdsServer>,
    /// What is published.
    pub resources: Resources,
    /// Requests to the translation thread.
    pub translate: Mutex<mpsc::Sender<DebugRequest>>,
    /// The YAML folder's current errors.
    pub file_errors: std::sync::Arc<Mutex<Vec<String>>>,
}

/// A question for the translation thread, which owns the translated state.
pub struct DebugRequest {
    kind: Option<String>,
    name: Option<String>,
    reply: tokio::sync::oneshot::Sender<Value>,
}

/// `kind` of a request for the policy reports.
const POLICIES: &str = "policies";
/// `kind` of a request for the waypoints' configuration errors.
const WAYPOINT_ERRORS: &str = "waypoint_errors";
/// The `type`s of `/debug/config_dump`.
const DUMP_TYPES: &[&str] = &["address", "authorization", "destination", "policy"];

impl DebugRequest {
    /// Answers from the translator's current state.
    pub fn answer(self, tr: &Translator) {
        if self.kind.as_deref() == Some(POLICIES) {
            let reports = tr.policy_reports();
            let _ = self.reply.send(serde_json::to_value(reports).unwrap_or_default());
            return;
        }
        if self.kind.as_deref() == Some(WAYPOINT_ERRORS) {
            let _ = self.reply.send(serde_json::to_value(tr.waypoint_errors()).unwrap_or_default());
            return;
        }
        let want = |k: &str| self.kind.as_deref().is_none_or(|x| x == k);
        let named = |n: &str| self.name.as_deref().is_none_or(|x| x == n);
        let mut out = serde_json::Map::new();
        if want("address") {
            let v: serde_json::Map<String, Value> = tr
                .addresses()
                .filter(|(n, _)| named(n))
                .map(|(n, a)| (n.clone(), render::address(a)))
                .collect();
            out.insert("addresses".into(), Value::Object(v));
        }
        if want("authorization") {
            let v: serde_json::Map<String, Value> = tr
                .authorizations()
                .filter(|(n, _)| named(n))
                .map(|(n, a)| (n.clone(), render::authorization(a)))
                .collect();
            out.insert("authorizations".into(), Value::Object(v));
        }
        if want("destination") {
            let v: serde_json::Map<String, Value> = tr
                .destinations()
                .filter(|(n, _)| named(n))
                .map(|(n, d)| (n.clone(), render::destination(d)))
                .collect();
            out.insert("waypoint_destinations".into(), Value::Object(v));
        }
        if want("policy") {
            let v: serde_json::Map<String, Value> = tr
                .waypoint_policies()
                .filter(|(n, _)| named(n))
                .map(|(n, p)| (n.clone(), render::waypoint_policy(p)))
                .collect();
            out.insert("waypoint_policies".into(), Value::Object(v));
        }
        let _ = self.reply.send(Value::Object(out));
    }
}

/// Serves one monitoring request.
pub async fn handle(req: Request<Incoming>, ctx: &Ctx) -> Response<Body> {
    match req.uri().path() {
        "/metrics" | "/stats/prometheus" => ambit_admin::metrics(&req, &ctx.registry),
        "/debug/connections" => {
            let streams: Vec<_> = ctx.streams.iter().flat_map(AdsServer::status).collect();
            let published = json!({
                "version": ctx.resources.version(),
                "addresses": ctx.resources.len(ambit_api::type_url::ADDRESS),
                "authorizations": ctx.resources.len(ambit_api::type_url::AUTHORIZATION),
                "waypoint_destinations": ctx.resources.len(ambit_api::type_url::WAYPOINT_DESTINATION),
                "waypoint_policies": ctx.resources.len(ambit_api::type_url::WAYPOINT_POLICY),
            });
            ambit_admin::json(
                &json!({ "published": published, "connected": streams.len(), "streams": streams }),
            )
        }
        "/debug/config_errors" => {
            let errors = ctx.file_errors.lock().unwrap_or_else(PoisonError::into_inner).clone();
            let policies = match ask(ctx, Some(POLICIES.to_owned()), None).await {
                Ok(Value::Array(reports)) => reports
                    .into_iter()
                    .filter(|r| r["warnings"].as_array().is_some_and(|w| !w.is_empty()))
                    .collect(),
                Ok(_) => Vec::new(),
                Err(busy) => return busy,
            };
            let waypoints = match ask(ctx, Some(WAYPOINT_ERRORS.to_owned()), None).await {
                Ok(v) => v,
                Err(busy) => return busy,
            };
            ambit_admin::json(&json!({ "errors": errors, "policies": policies, "waypoints": waypoints }))
        }
        "/debug/policies" => match ask(ctx, Some(POLICIES.to_owned()), None).await {
            Ok(v) => ambit_admin::json(&v),
            Err(busy) => busy,
        },
        "/debug/config_dump" => {
            let pairs = ambit_admin::query_pairs(req.uri().query());
            let get = |k: &str| pairs.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.clone());
            let kind = get("type");
            if let Some(k) = &kind
                && !DUMP_TYPES.contains(&k.as_str())
            {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("type must be address, authorization, destination or policy, not {k:?}\n"),
                );
            }
            match ask(ctx, kind, get("name")).await {
                Ok(v) => ambit_admin::json(&v),
                Err(busy) => busy,
            }
        }
        _ => ambit_admin::tools(INDEX, req.method(), req.uri()).await,
    }
}

/// Asks the translation thread; the error is the answer to give when it cannot answer.
async fn ask(ctx: &Ctx, kind: Option<String>, name: Option<String>) -> Result<Value, Response<Body>> {
    let (reply, rx) = tokio::sync::oneshot::channel();
    let sent =
        ctx.translate.lock().unwrap_or_else(PoisonError::into_inner).send(DebugRequest { kind, name, reply });
    if sent.is_err() {
        return Err(text(StatusCode::SERVICE_UNAVAILABLE, "the translation thread is gone\n"));
    }
    match tokio::time::timeout(TRANSLATE_WAIT, rx).await {
        Ok(Ok(v)) => Ok(v),
        _ => Err(text(StatusCode::SERVICE_UNAVAILABLE, "the translation is busy; try again\n")),
    }
}

#[cfg(test)]
mod tests {
    use ambit_objects::{Change, Object};
    use serde_json::json;

    use super::*;
    use crate::translate::Settings;

    fn answer(tr: &Translator, kind: Option<&str>) -> Value {
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        DebugRequest { kind: kind.map(str::to_owned), name: None, reply }.answer(tr);
        rx.try_recv().expect("answered")
    }

    #[test]
    fn config_dump_and_config_errors_show_the_waypoints_configuration() {
        let mut tr = Translator::new(Settings::default());
        let objects = [
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": "wp", "namespace": "app"},
                "spec": {"gatewayClassName": "istio-waypoint"},
                "status": {"addresses": [{"type": "Hostname", "value": "wp.app.svc.cluster.local"}]}}),
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "a", "namespace": "app", "labels": {"istio.io/use-waypoint": "wp"}},
                "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "http", "port": 80}]}}),
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "r", "namespace": "app"},
                "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "a"}],
                    "rules": [{"backendRefs": [{"name": "gone", "port": 80}]}]}}),
        ];
        tr.apply(objects.map(|v| Change::Upsert(Object::from_value(v).expect("object"))));
        let dump = answer(&tr, Some("destination"));
        let name = "app/wp/app/a.app.svc.cluster.local";
        assert_eq!(dump["waypoint_destinations"][name]["kind"], "SERVICE", "{dump}");
        assert!(dump.get("addresses").is_none(), "only the type asked for");
        assert!(answer(&tr, None)["waypoint_policies"].is_object());
        assert_eq!(
            answer(&tr, Some(WAYPOINT_ERRORS)),
            json!([{
                "waypoint": "app/wp",
                "object": "HTTPRoute app/r",
                "message": "rules[0].backendRefs[0]: Service app/gone does not exist: its share of requests (weight 1) answers 500",
            }])
        );
    }
}
