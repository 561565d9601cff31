//! The cluster's pods: brought to the desired folder (created through the node's CNI chain,
//! deleted, retried), their readiness, the Pod objects reported for them, and a waypoint
//! container's environment and gap-less replacement.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{
    Cluster, POD_RETRY, READY_TIMEOUT, RunningPod, STOP_GRACE, WAYPOINT_DRAIN, WAYPOINT_HBONE_PORT, pretty,
    write_atomic,
};
use crate::cni;
use crate::desired::PodTemplate;
use crate::desired::waypoints::WAYPOINT_COMMAND;
use crate::probe;
use crate::sandbox::{self, Sandbox};
use crate::supervise::ProcessSpec;

impl Cluster {
    /// What a container running `ambit waypoint` is given, as istiod's injection gives a
    /// waypoint's pod its control plane and token: the control plane's address and roots, its
    /// node's token (asking for its certificate on the node's behalf, `AMBIT_NODE_TOKEN`) and
    /// its pod IP.
    pub(super) fn waypoint_env(&self, node: usize, ip: Option<Ipv4Addr>) -> Vec<(OsString, OsString)> {
        self.control_env(node)
            .into_iter()
            .chain([
                ("AMBIT_NODE_TOKEN", "true".to_owned()),
                ("INSTANCE_IP", ip.map(|i| i.to_string()).unwrap_or_default()),
            ])
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    /// Replaces a waypoint container as a rolling update replaces its pod, without a gap: the
    /// new process starts beside the old one in the pod (the waypoint's ports are SO_REUSEPORT),
    /// and once it listens on its HBONE port (which it does only when ready: certificate and
    /// configuration in) the old one gets SIGTERM and drains, its listener closed, so new
    /// connections reach only the new one.
    pub(super) fn replace_waypoint(&mut self, name: &str) -> Result<String, String> {
        let spec = self.sup.spec(name).cloned().ok_or_else(|| format!("no process named {name:?}"))?;
        let mut ready = |pid: u32| probe::own_listening_ports(pid).contains(&WAYPOINT_HBONE_PORT);
        let pid = self
            .sup
            .replace(name, spec, &mut ready, READY_TIMEOUT, WAYPOINT_DRAIN + Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        Ok(format!("{name} replaced: pid {pid} took over; the previous one drained"))
    }

    /// Brings the pods to the desired folder: pods gone or changed are deleted, missing ones
    /// created (a failed one is tried again after [`POD_RETRY`]).
    pub(super) fn reconcile(&mut self) {
        let want: BTreeMap<(String, String), PodTemplate> =
            self.desired.pods.iter().map(|t| ((t.namespace.clone(), t.name.clone()), t.clone())).collect();
        let stale: Vec<(String, String)> = self
            .pods
            .iter()
            .filter(|(k, p)| want.get(*k).is_none_or(|t| t.digest != p.template.digest))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            self.delete_pod(&k);
        }
        self.failed.retain(|k, _| want.contains_key(k));
        for (k, t) in want {
            if self.pods.contains_key(&k) {
                continue;
            }
            if let Some((at, _)) = self.failed.get(&k)
                && at.elapsed() < POD_RETRY
            {
                continue;
            }
            match self.create_pod(&t) {
                Ok(p) => {
                    self.failed.remove(&k);
                    self.event(format!(
                        "pod {}/{} created on {} ({}, CNI ADD {:.0} ms)",
                        t.namespace,
                        t.name,
                        self.nodes[p.node].member.name,
                        p.ip.map(|ip| ip.to_string()).unwrap_or_default(),
                        p.cni_add.as_secs_f64() * 1e3
                    ));
                    self.pods.insert(k, p);
                }
                Err(why) => {
                    self.event(format!("pod {}/{}: {why}", t.namespace, t.name));
                    self.failed.insert(k, (Instant::now(), why));
                }
            }
        }
    }

    /// The node a new pod goes on: the one asked for, else the one with the fewest pods.
    pub(super) fn place(&self, t: &PodTemplate) -> usize {
        if let Some(want) = &t.node
            && let Some(i) = self.nodes.iter().position(|n| &n.member.name == want)
        {
            return i;
        }
        let mut count = vec![0usize; self.nodes.len()];
        for p in self.pods.values() {
            count[p.node] += 1;
        }
        (0..self.nodes.len()).min_by_key(|&i| (count[i], i)).unwrap_or(0)
    }

    pub(super) fn create_pod(&mut self, t: &PodTemplate) -> Result<RunningPod, String> {
        let node = self.place(t);
        let created = Instant::now();
        let netns = self.pod_netns(t);
        let mut sandbox = Sandbox::create(&netns, &t.namespace, &t.name, None, &self.cgroup_root)
            .map_err(|e| format!("sandbox: {e}"))?;
        let write = |c: &Cluster, sb: &Sandbox, ip: Option<Ipv4Addr>| {
            write_atomic(&c.pod_file(t), &pretty(&c.observed(t, node, sb, ip)))
        };
        if let Err(e) = write(self, &sandbox, None) {
            let _ = sandbox.remove();
            return Err(e.to_string());
        }
        let t0 = Instant::now();
        let added = self.nodes[node].runtime.add(&sandbox.pod);
        let cni_add = t0.elapsed();
        let ip = match added {
            Ok((result, _)) => cni::result_ipv4(&result),
            Err(e) => {
                let _ = std::fs::remove_file(self.pod_file(t));
                let _ = self.nodes[node].runtime.del(&sandbox.pod);
                let _ = sandbox.remove();
                return Err(format!("CNI ADD on {} failed: {e}", self.nodes[node].member.name));
            }
        };
        let mut pod = RunningPod {
            template: t.clone(),
            node,
            sandbox,
            ip,
            containers: Vec::new(),
            ready: false,
            created,
            cni_add,
        };
        if let Err(e) = write(self, &pod.sandbox, ip) {
            self.remove_pod(&mut pod);
            return Err(e.to_string());
        }
        for c in &t.containers {
            let name = format!("pod/{}/{}/{}", t.namespace, t.name, c.name);
            let mut argv = c.argv.iter();
            let program = match argv.next().map(String::as_str) {
                Some("ambit") | None => self.cfg.ambit.clone(),
                Some(p) => PathBuf::from(p),
            };
            let mut env = self.env();
            let node_name = self.nodes[node].member.name.clone();
            for (k, v) in [
                ("POD_NAME", t.name.clone()),
                ("POD_NAMESPACE", t.namespace.clone()),
                ("POD_IP", ip.map(|i| i.to_string()).unwrap_or_default()),
                ("NODE_NAME", node_name),
                ("SERVICE_ACCOUNT", t.service_account.clone()),
            ] {
                env.push((k.into(), v.into()));
            }
            if c.argv.iter().map(String::as_str).eq(WAYPOINT_COMMAND) {
                env.extend(self.waypoint_env(node, ip));
            }
            env.extend(c.env.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
            let spec = ProcessSpec {
                name: name.clone(),
                netns: Some(pod.sandbox.netns.clone()),
                program,
                args: argv.map(OsString::from).collect(),
                env,
                log: self.layout.log(&name),
                restart: true,
            };
            if let Err(e) = self.sup.start(spec) {
                self.remove_pod(&mut pod);
                return Err(e.to_string());
            }
            pod.containers.push(name);
        }
        Ok(pod)
    }

    /// Marks pods ready once every declared port listens in their namespace.
    pub(super) fn check_pods(&mut self) {
        let mut became = Vec::new();
        for p in self.pods.values_mut().filter(|p| !p.ready) {
            let want: BTreeSet<u16> =
                p.template.containers.iter().flat_map(|c| c.ports.iter().copied()).collect();
            let have = probe::listening_ports(p.sandbox.pause_pid());
            let probes_pass = || {
                p.template
                    .containers
                    .iter()
                    .filter_map(|c| c.ready_http.as_ref())
                    .all(|(port, path)| probe::ready(&p.sandbox.netns, *port, path))
            };
            if want.is_subset(&have) && probes_pass() {
                p.ready = true;
                became.push(format!(
                    "pod {}/{} ready after {:.0} ms",
                    p.template.namespace,
                    p.template.name,
                    p.created.elapsed().as_secs_f64() * 1e3
                ));
            }
        }
        for e in became {
            self.event(e);
        }
    }

    pub(super) fn delete_pod(&mut self, key: &(String, String)) {
        if let Some(mut p) = self.pods.remove(key) {
            self.remove_pod(&mut p);
            self.event(format!("pod {}/{} deleted", key.0, key.1));
        }
    }

    /// Containers stopped, the Pod object removed, CNI DEL, the sandbox removed.
    pub(super) fn remove_pod(&mut self, p: &mut RunningPod) {
        for c in std::mem::take(&mut p.containers) {
            self.sup.stop(&c, STOP_GRACE);
        }
        let _ = std::fs::remove_file(self.pod_file(&p.template));
        if let Err(e) = self.nodes[p.node].runtime.del(&p.sandbox.pod) {
            tracing::warn!("CNI DEL of {}/{}: {e}", p.template.namespace, p.template.name);
        }
        if let Err(e) = p.sandbox.remove() {
            tracing::warn!("removing the sandbox of {}/{}: {e}", p.template.namespace, p.template.name);
        }
    }

    pub(super) fn pod_netns(&self, t: &PodTemplate) -> String {
        let name = format!("{}-{}-{}", self.cfg.tag, t.namespace, t.name);
        if name.len() <= 64 && !crate::ip::netns_exists(&name) {
            name
        } else {
            format!("{}-pod-{}", self.cfg.tag, &sandbox::random_uid()[..8])
        }
    }

    pub(super) fn pod_file(&self, t: &PodTemplate) -> PathBuf {
        self.layout.objects().join(format!("pod-{}-{}.yaml", t.namespace, t.name))
    }

    /// The Pod object as kubelet reports it: Pending on its node, then Running with its IP.
    pub(super) fn observed(&self, t: &PodTemplate, node: usize, sb: &Sandbox, ip: Option<Ipv4Addr>) -> Value {
        let mut spec = match &t.spec {
            Value::Object(m) => Value::Object(m.clone()),
            _ => json!({}),
        };
        spec["nodeName"] = json!(self.nodes[node].member.name);
        spec["serviceAccountName"] = json!(t.service_account);
        let status = match ip {
            Some(ip) => json!({
                "phase": "Running",
                "hostIP": self.nodes[node].member.ip.to_string(),
                "podIP": ip.to_string(),
                "podIPs": [{ "ip": ip.to_string() }],
                "conditions": [{ "type": "Ready", "status": "True" }],
            }),
            None => json!({ "phase": "Pending" }),
        };
        let mut metadata = json!({
            "name": t.name,
            "namespace": t.namespace,
            "uid": sb.pod.uid,
            "labels": t.labels,
            "annotations": t.annotations,
        });
        if let Some(d) = &t.deployment {
            // As a ReplicaSet names its pods: the control plane takes a generated pod's workload
            // name from its controller (the Deployment), as istiod does, not from the pod's name.
            metadata["generateName"] = json!(format!("{d}-"));
            metadata["ownerReferences"] = json!([{ "apiVersion": "apps/v1", "kind": "Deployment", "name": d, "uid": d, "controller": true }]);
        }
        json!({ "apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status })
    }
}
