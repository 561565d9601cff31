//! What istiod's gateway controller makes for a waypoint: a `Gateway` of class
//! [`WAYPOINT_CLASS`] gets a ServiceAccount, a Service and a Deployment named after it in its
//! namespace, labelled as Istio labels them, whose pod runs `ambit waypoint`. One definition for
//! both places that deploy waypoints: `ambit up` (a local cluster) and `ambit control` on
//! Kubernetes, which adds what a real cluster needs (image, environment, token and root volumes,
//! owner reference).

use serde_json::{Value, json};

/// The Gateway class that makes a waypoint.
pub const WAYPOINT_CLASS: &str = "istio-waypoint";
/// The label naming the Gateway a pod or Service belongs to.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// What a waypoint's container runs.
pub const WAYPOINT_COMMAND: [&str; 2] = ["ambit", "waypoint"];
/// The waypoint's container (Istio's name for it).
pub const WAYPOINT_CONTAINER: &str = "istio-proxy";
/// The waypoint's readiness port and path (Istio's waypoints').
pub const READINESS: (u16, &str) = (15021, "/healthz/ready");
/// The waypoint's HBONE port (istiod hard-codes it).
pub const HBONE_PORT: u16 = 15008;
/// `gateway.istio.io/managed`'s value on what the controller made.
pub const MANAGED_BY: &str = "istio.io-mesh-controller";

/// Whether `class` is a waypoint's Gateway class.
pub fn is_waypoint_class(class: &str) -> bool {
    class == WAYPOINT_CLASS
}

/// The ServiceAccount, Service and Deployment of waypoint `ns/name`, in that order, as istiod's
/// templates make them: labels, ports 15021 `status-port` and 15008 `mesh`, readiness on 15021,
/// one replica, and `ambit waypoint` as the container's command.
pub fn objects(ns: &str, name: &str) -> [Value; 3] {
    let labels = json!({
        GATEWAY_NAME_LABEL: name,
        "gateway.istio.io/managed": MANAGED_BY,
        "istio.io/dataplane-mode": "none",
        "service.istio.io/canonical-name": name,
        "service.istio.io/canonical-revision": "latest",
    });
    let meta = json!({ "name": name, "namespace": ns, "labels": labels });
    let (ready_port, ready_path) = READINESS;
    [
        json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta }),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "selector": { GATEWAY_NAME_LABEL: name },
                "ports": [
                    { "name": "status-port", "port": ready_port, "protocol": "TCP", "appProtocol": "tcp" },
                    { "name": "mesh", "port": HBONE_PORT, "protocol": "TCP", "appProtocol": "all" },
                ],
            },
        }),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 1,
                "selector": { "matchLabels": { GATEWAY_NAME_LABEL: name } },
                "template": {
                    "metadata": { "labels": labels },
                    "spec": {
                        "serviceAccountName": name,
                        "containers": [{
                            "name": WAYPOINT_CONTAINER,
                            "command": WAYPOINT_COMMAND,
                            "ports": [
                                { "name": "status-port", "containerPort": ready_port, "protocol": "TCP" },
                                { "name": "mesh", "containerPort": HBONE_PORT, "protocol": "TCP" },
                            ],
                            "readinessProbe": {
                                "httpGet": { "path": ready_path, "port": ready_port },
                            },
                        }],
                    },
                },
            },
        }),
    ]
}
