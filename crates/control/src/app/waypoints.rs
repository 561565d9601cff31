//! istiod's gateway controller, for waypoints, on Kubernetes: each `Gateway` of class
//! `istio-waypoint` gets the ServiceAccount, Service and Deployment `ambit up` makes for one
//! ([`ambit_objects::waypoint::objects`]), completed with what a real cluster needs: the image
//! (`--waypoint-image`), the control plane's address, the pod's identity from the downward API, a
//! projected token for the CA (audience `istio-ca`), the mesh root from the namespace's
//! `istio-ca-root-cert` ConfigMap (written here, as istiod writes it), a restricted security
//! context, and an owner reference to the Gateway, so that deleting the Gateway deletes them.
//! The Gateway's status then gets the address node proxies reach it at and the conditions
//! `Accepted` and `Programmed`.
//!
//! Objects are written by server-side apply with the field manager [`FIELD_MANAGER`], so a
//! change to a Gateway (or a new control-plane version) rewrites exactly what this controller
//! owns. Like [`super::status`], one task ([`super::writer`]) writes what differs from what it
//! last wrote and tries again what failed; a refusal that lasts (RBAC) is logged once.

use std::sync::Arc;
use std::time::SystemTime;

use ambit_objects::gateway::Gateway;
use ambit_objects::waypoint::{self, WAYPOINT_CONTAINER};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::writer::{Messages, Writer};

/// The server-side apply field manager of what this controller writes.
pub const FIELD_MANAGER: &str = "ambit-control";
/// Where the waypoint reads its token and the mesh root (Istio's paths).
const TOKEN_DIR: &str = "/var/run/secrets/tokens";
const ROOT_DIR: &str = "/var/run/secrets/istio";
/// The mesh root's ConfigMap in each namespace (istiod's name and key).
pub const ROOT_CONFIGMAP: &str = "istio-ca-root-cert";
const ROOT_KEY: &str = "root-cert.pem";

/// What every waypoint's objects share.
#[derive(Clone, Debug, PartialEq)]
pub struct WaypointSettings {
    /// The image the waypoint's container runs (`--waypoint-image`); without one, no waypoint is
    /// deployed and each Gateway says why.
    pub image: Option<String>,
    /// The control plane's xDS and CA address the waypoint dials.
    pub control_address: String,
    /// The DNS suffix of Service hostnames (`cluster.local`).
    pub domain: String,
    /// The mesh root bundle (PEM).
    pub root_pem: String,
}

/// One waypoint Gateway as the controller acts on it.
#[derive(Clone, Debug, PartialEq)]
pub struct WantedGateway {
    /// Its namespace and name.
    pub namespace: String,
    pub name: String,
    /// Its UID (the owner reference) and generation (the conditions').
    pub uid: String,
    pub generation: i64,
}

impl WantedGateway {
    /// A waypoint Gateway (class `istio-waypoint`) with a name, namespace and UID; else `None`.
    pub fn of(gw: &Gateway) -> Option<WantedGateway> {
        if !waypoint::is_waypoint_class(&gw.spec.gateway_class_name) {
            return None;
        }
        let m = &gw.metadata;
        Some(WantedGateway {
            namespace: m.namespace.clone().filter(|n| !n.is_empty())?,
            name: m.name.clone().filter(|n| !n.is_empty())?,
            uid: m.uid.clone().filter(|u| !u.is_empty())?,
            generation: m.generation.unwrap_or_default(),
        })
    }

    /// The hostname of its Service.
    fn hostname(&self, domain: &str) -> String {
        format!("{}.{}.svc.{domain}", self.name, self.namespace)
    }
}

/// Hands the wanted Gateways to the controller's task.
pub struct WaypointDeployer(Writer<WantedGateway>);

impl WaypointDeployer {
    /// Starts the controller on the current runtime.
    pub fn spawn(client: kube::Client, settings: WaypointSettings) -> WaypointDeployer {
        if settings.image.is_none() {
            tracing::warn!(
                "no --waypoint-image (AMBIT_WAYPOINT_IMAGE): waypoint Gateways are not deployed; each says so in its Programmed condition"
            );
        }
        let settings = Arc::new(settings);
        let messages = Messages {
            action: "deploy the waypoint",
            field: "Gateway",
            recovered: "waypoints are deployed again",
        };
        // A Gateway gone takes its objects with it (owner references): nothing to delete here.
        WaypointDeployer(Writer::spawn(messages, move |_, _, gw: WantedGateway| {
            let (client, settings) = (client.clone(), settings.clone());
            async move { deploy(&client, &settings, &gw).await }
        }))
    }

    /// Every waypoint Gateway there is now.
    pub fn want(&self, gateways: impl IntoIterator<Item = WantedGateway>) {
        self.0.want(gateways.into_iter().map(|g| ((g.namespace.clone(), g.name.clone()), g)).collect());
    }
}

/// Applies one waypoint's objects, then its Gateway's status.
async fn deploy(
    client: &kube::Client,
    settings: &WaypointSettings,
    gw: &WantedGateway,
) -> Result<(), kube::Error> {
    let ns = gw.namespace.as_str();
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let objects = match manifests(settings, gw) {
        Some(objects) => objects,
        None => {
            let api: Api<Gateway> = Api::namespaced(client.clone(), ns);
            let patch = status_patch(settings, gw, false);
            api.patch_status(&gw.name, &PatchParams::default(), &Patch::Merge(patch)).await?;
            return Ok(());
        }
    };
    let [config_map, account, service, deployment] = objects;
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(ROOT_CONFIGMAP, &apply, &Patch::Apply(&config_map))
        .await?;
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .patch(&gw.name, &apply, &Patch::Apply(&account))
        .await?;
    Api::<Service>::namespaced(client.clone(), ns).patch(&gw.name, &apply, &Patch::Apply(&service)).await?;
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch(&gw.name, &apply, &Patch::Apply(&deployment))
        .await?;
    let api: Api<Gateway> = Api::namespaced(client.clone(), ns);
    api.patch_status(&gw.name, &PatchParams::default(), &Patch::Merge(status_patch(settings, gw, true)))
        .await?;
    tracing::info!(gateway = %format!("{ns}/{}", gw.name), "waypoint deployed");
    Ok(())
}

/// The mesh root ConfigMap of the Gateway's namespace, then its ServiceAccount, Service and
/// Deployment, completed for a real cluster; `None` without an image.
pub fn manifests(settings: &WaypointSettings, gw: &WantedGateway) -> Option<[Value; 4]> {
    let image = settings.image.as_deref()?;
    let owner = json!([{
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "name": gw.name,
        "uid": gw.uid,
    }]);
    let [mut account, mut service, mut deployment] = waypoint::objects(&gw.namespace, &gw.name);
    for o in [&mut account, &mut service, &mut deployment] {
        o["metadata"]["ownerReferences"] = owner.clone();
    }
    let field = |path: &str| json!({ "valueFrom": { "fieldRef": { "fieldPath": path } } });
    let mut env = vec![
        json!({ "name": "XDS_ADDRESS", "value": settings.control_address }),
        json!({ "name": "CA_ADDRESS", "value": settings.control_address }),
        json!({ "name": "XDS_ROOT_CA", "value": format!("{ROOT_DIR}/{ROOT_KEY}") }),
        json!({ "name": "CA_ROOT_CA", "value": format!("{ROOT_DIR}/{ROOT_KEY}") }),
        json!({ "name": "AUTH_TOKEN", "value": format!("{TOKEN_DIR}/istio-token") }),
    ];
    for (name, path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        ("INSTANCE_IP", "status.podIP"),
        ("NODE_NAME", "spec.nodeName"),
    ] {
        let mut e = field(path);
        e["name"] = json!(name);
        env.push(e);
    }
    let pod = &mut deployment["spec"]["template"]["spec"];
    pod["containers"][0]["image"] = json!(image);
    pod["containers"][0]["env"] = json!(env);
    pod["containers"][0]["volumeMounts"] = json!([
        { "name": "istio-token", "mountPath": TOKEN_DIR, "readOnly": true },
        { "name": "istiod-ca-cert", "mountPath": ROOT_DIR, "readOnly": true },
    ]);
    // Nothing the waypoint does needs a privilege: its ports are above 1024.
    pod["containers"][0]["securityContext"] = json!({
        "runAsNonRoot": true,
        "runAsUser": 1337,
        "runAsGroup": 1337,
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "privileged": false,
        "capabilities": { "drop": ["ALL"] },
        "seccompProfile": { "type": "RuntimeDefault" },
    });
    pod["automountServiceAccountToken"] = json!(false);
    pod["volumes"] = json!([
        { "name": "istio-token", "projected": { "sources": [{ "serviceAccountToken": {
            "audience": "istio-ca", "expirationSeconds": 43200, "path": "istio-token" } }] } },
        { "name": "istiod-ca-cert", "configMap": { "name": ROOT_CONFIGMAP } },
    ]);
    debug_assert_eq!(pod["containers"][0]["name"], WAYPOINT_CONTAINER);
    let config_map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ROOT_CONFIGMAP,
            "namespace": gw.namespace,
            "labels": { "istio.io/config": "true" },
        },
        "data": { ROOT_KEY: settings.root_pem },
    });
    Some([config_map, account, service, deployment])
}

/// The Gateway's status as istiod writes a waypoint's: the Service's hostname as its address
/// and `Accepted`/`Programmed`; `Programmed` is false, saying why, when nothing was deployed.
pub fn status_patch(settings: &WaypointSettings, gw: &WantedGateway, deployed: bool) -> Value {
    let now = ambit_identity::rfc3339(SystemTime::now());
    let condition = |kind: &str, ok: bool, reason: &str, message: &str| {
        json!({
            "type": kind,
            "status": if ok { "True" } else { "False" },
            "reason": reason,
            "message": message,
            "observedGeneration": gw.generation,
            "lastTransitionTime": now,
        })
    };
    let accepted = condition("Accepted", true, "Accepted", "Resource accepted");
    let (programmed, addresses) = if deployed {
        (
            condition(
                "Programmed",
                true,
                "Programmed",
                "Resource programmed, assigned to service(s) of the waypoint",
            ),
            json!([{ "type": "Hostname", "value": gw.hostname(&settings.domain) }]),
        )
    } else {
        (
            condition(
                "Programmed",
                false,
                "Invalid",
                "ambit control has no waypoint image (--waypoint-image, AMBIT_WAYPOINT_IMAGE): no waypoint was deployed",
            ),
            Value::Null,
        )
    };
    json!({ "status": { "addresses": addresses, "conditions": [accepted, programmed] } })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn settings(image: Option<&str>) -> WaypointSettings {
        WaypointSettings {
            image: image.map(str::to_owned),
            control_address: "https://ambit-control.istio-system.svc:15012".into(),
            domain: "cluster.local".into(),
            root_pem: "-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n".into(),
        }
    }

    fn gw() -> WantedGateway {
        WantedGateway {
            namespace: "shop".into(),
            name: "waypoint".into(),
            uid: "uid-1".into(),
            generation: 3,
        }
    }

    #[test]
    fn only_waypoint_gateways_with_a_uid_are_deployed() {
        let mut g = Gateway::default();
        g.metadata.name = Some("waypoint".into());
        g.metadata.namespace = Some("shop".into());
        g.metadata.uid = Some("uid-1".into());
        g.metadata.generation = Some(3);
        g.spec.gateway_class_name = "istio-waypoint".into();
        assert_eq!(WantedGateway::of(&g), Some(gw()));
        g.spec.gateway_class_name = "istio".into();
        assert_eq!(WantedGateway::of(&g), None);
        g.spec.gateway_class_name = "istio-waypoint".into();
        g.metadata.uid = None;
        assert_eq!(WantedGateway::of(&g), None);
    }

    #[test]
    fn the_deployment_runs_the_image_with_the_control_plane_its_token_and_the_root() {
        let [cm, sa, svc, d] =
            manifests(&settings(Some("ghcr.io/ambit/ambit:1.0")), &gw()).expect("an image");
        assert_eq!(
            cm["metadata"],
            json!({"name": "istio-ca-root-cert", "namespace": "shop", "labels": {"istio.io/config": "true"}})
        );
        assert!(cm["data"]["root-cert.pem"].as_str().is_some_and(|p| p.contains("root")), "{cm}");
        let owner = json!([{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "name": "waypoint", "uid": "uid-1"}]);
        for o in [&sa, &svc, &d] {
            assert_eq!(o["metadata"]["ownerReferences"], owner, "{o}");
            assert_eq!(o["metadata"]["labels"]["gateway.networking.k8s.io/gateway-name"], "waypoint");
        }
        assert_eq!(
            svc["spec"]["ports"][1],
            json!({"name": "mesh", "port": 15008, "protocol": "TCP", "appProtocol": "all"})
        );
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "ghcr.io/ambit/ambit:1.0");
        assert_eq!(c["command"], json!(["ambit", "waypoint"]));
        let env: BTreeMap<&str, &Value> = c["env"]
            .as_array()
            .expect("env")
            .iter()
            .map(|e| (e["name"].as_str().unwrap_or_default(), e))
            .collect();
        assert_eq!(env["XDS_ADDRESS"]["value"], "https://ambit-control.istio-system.svc:15012");
        assert_eq!(env["CA_ROOT_CA"]["value"], "/var/run/secrets/istio/root-cert.pem");
        assert_eq!(env["AUTH_TOKEN"]["value"], "/var/run/secrets/tokens/istio-token");
        assert_eq!(env["INSTANCE_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
        assert_eq!(env["SERVICE_ACCOUNT"]["valueFrom"]["fieldRef"]["fieldPath"], "spec.serviceAccountName");
        assert_eq!(c["securityContext"]["capabilities"], json!({"drop": ["ALL"]}));
        assert_eq!(c["readinessProbe"]["httpGet"], json!({"path": "/healthz/ready", "port": 15021}));
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "waypoint");
        assert_eq!(
            pod["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]["audience"],
            "istio-ca"
        );
        assert_eq!(pod["volumes"][1]["configMap"]["name"], "istio-ca-root-cert");
        // Every object parses as its Kubernetes type (a misspelt field would not round-trip).
        for (o, typed) in [
            (&cm, serde_json::to_value(serde_json::from_value::<ConfigMap>(cm.clone()).expect("ConfigMap"))),
            (
                &sa,
                serde_json::to_value(
                    serde_json::from_value::<ServiceAccount>(sa.clone()).expect("ServiceAccount"),
                ),
            ),
            (&svc, serde_json::to_value(serde_json::from_value::<Service>(svc.clone()).expect("Service"))),
            (&d, serde_json::to_value(serde_json::from_value::<Deployment>(d.clone()).expect("Deployment"))),
        ] {
            assert_eq!(&typed.expect("json"), o);
        }
    }

    #[test]
    fn without_an_image_nothing_is_deployed_and_the_gateway_says_why() {
        assert!(manifests(&settings(None), &gw()).is_none());
        let p = status_patch(&settings(None), &gw(), false);
        assert_eq!(p["status"]["addresses"], Value::Null);
        let c = &p["status"]["conditions"];
        assert_eq!((c[0]["type"].as_str(), c[0]["status"].as_str()), (Some("Accepted"), Some("True")));
        assert_eq!(
            (c[1]["type"].as_str(), c[1]["status"].as_str(), c[1]["reason"].as_str()),
            (Some("Programmed"), Some("False"), Some("Invalid"))
        );
        assert_eq!(
            c[1]["message"],
            "ambit control has no waypoint image (--waypoint-image, AMBIT_WAYPOINT_IMAGE): no waypoint was deployed"
        );
        let p = status_patch(&settings(Some("i")), &gw(), true);
        assert_eq!(
            p["status"]["addresses"],
            json!([{"type": "Hostname", "value": "waypoint.shop.svc.cluster.local"}])
        );
        assert_eq!(p["status"]["conditions"][1]["status"], "True");
        assert_eq!(p["status"]["conditions"][1]["observedGeneration"], 3);
    }
}
