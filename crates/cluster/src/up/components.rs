//! The cluster's own processes: the control plane, each node's agent and proxy (and the
//! proxy's gap-less replacement), as specs for the supervisor.

use std::ffi::OsString;
use std::time::Duration;

use super::{
    AGENT_HEALTH, AGENT_METRICS, CONTROL_GRPC, CONTROL_HOSTNAME, CONTROL_MONITORING, CONTROL_READY, Cluster,
    PROXY_DRAIN, READY_TIMEOUT, UpError, host_cores, proxy_workers,
};
use crate::probe;
use crate::state::ProxyPorts;
use crate::supervise::ProcessSpec;
use serde_json::Value;

impl Cluster {
    pub(super) fn env(&self) -> Vec<(OsString, OsString)> {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
        vec![("PATH".into(), path), ("RUST_LOG".into(), "info".into())]
    }

    pub(super) fn spec(
        &self,
        name: &str,
        netns: &str,
        args: Vec<String>,
        env: Vec<(&str, String)>,
    ) -> ProcessSpec {
        let mut all = self.env();
        all.extend(env.into_iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
        ProcessSpec {
            name: name.to_owned(),
            netns: Some(netns.to_owned()),
            program: self.cfg.ambit.clone(),
            args: args.into_iter().map(OsString::from).collect(),
            env: all,
            log: self.layout.log(name),
            restart: true,
        }
    }

    pub(super) fn start_control(&mut self) -> Result<(), UpError> {
        let l = &self.layout;
        let args = vec![
            "control".into(),
            "--config".into(),
            l.objects().display().to_string(),
            "--capture-state-dir".into(),
            l.capture().display().to_string(),
            "--state-dir".into(),
            l.control().display().to_string(),
            "--secure-grpc-addr".into(),
            format!("0.0.0.0:{CONTROL_GRPC}"),
            "--grpc-addr".into(),
            String::new(),
            "--monitoring-addr".into(),
            format!("0.0.0.0:{CONTROL_MONITORING}"),
            "--http-addr".into(),
            format!("0.0.0.0:{CONTROL_READY}"),
        ];
        let spec = self.launched(self.spec("control", &self.control_netns(), args, Vec::new()));
        self.sup.start(spec)?;
        Ok(())
    }

    pub(super) fn start_agent(&mut self, i: usize) -> Result<(), UpError> {
        let n = &self.nodes[i];
        let l = &self.layout;
        let args = vec![
            "agent".into(),
            "--source-dir".into(),
            l.objects().display().to_string(),
            "--capture-state-dir".into(),
            l.capture().display().to_string(),
            "--node-name".into(),
            n.member.name.clone(),
            "--run-dir".into(),
            n.dirs.agent_run_dir().display().to_string(),
            "--zds-socket".into(),
            n.dirs.zds_socket().display().to_string(),
            "--source-poll".into(),
            "100ms".into(),
            "--metrics-addr".into(),
            format!("0.0.0.0:{AGENT_METRICS}"),
            "--health-addr".into(),
            format!("0.0.0.0:{AGENT_HEALTH}"),
            "--exclude-namespaces".into(),
            "kube-system".into(),
            "--cni-conf-dir".into(),
            n.dirs.conf_dir().display().to_string(),
            "--cni-bin-dir".into(),
            n.dirs.bin_dir().display().to_string(),
            "--cni-binary".into(),
            self.cfg.ambit_cni.display().to_string(),
        ];
        let spec =
            self.launched(self.spec(&format!("agent/{}", n.member.name), &n.member.netns, args, Vec::new()));
        self.sup.start(spec)?;
        Ok(())
    }

    /// How a process on node `i` reaches the control plane: its address (as istiod's name, for
    /// the certificate), roots, and the node's token.
    pub(super) fn control_env(&self, i: usize) -> [(&'static str, String); 7] {
        let url = format!("https://{}:{CONTROL_GRPC}", self.control_ip());
        let root = self.layout.root_cert().display().to_string();
        let token = self.layout.control().join("tokens").join(format!("{}.token", self.nodes[i].member.name));
        [
            ("XDS_ADDRESS", url.clone()),
            ("CA_ADDRESS", url),
            ("XDS_ROOT_CA", root.clone()),
            ("CA_ROOT_CA", root),
            ("ALT_XDS_HOSTNAME", CONTROL_HOSTNAME.to_owned()),
            ("ALT_CA_HOSTNAME", CONTROL_HOSTNAME.to_owned()),
            ("AUTH_TOKEN", token.display().to_string()),
        ]
    }

    /// Node `i`'s proxy of generation `generation` (its ports: [`ProxyPorts::of_generation`]).
    pub(super) fn proxy_spec(&self, i: usize, generation: u32) -> ProcessSpec {
        let n = &self.nodes[i];
        let ports = ProxyPorts::of_generation(generation);
        let mut env = vec![
            ("PROXY_MODE", "shared".to_owned()),
            ("INPOD_UDS", n.dirs.zds_socket().display().to_string()),
        ];
        env.extend(self.control_env(i));
        env.extend([
            ("NODE_NAME", n.member.name.clone()),
            ("INSTANCE_IP", n.member.ip.to_string()),
            ("POD_NAME", format!("ztunnel-{}", n.member.name)),
            ("POD_NAMESPACE", crate::desired::SYSTEM_NAMESPACE.to_owned()),
            ("FAKE_CA", "false".to_owned()),
            (
                "ZTUNNEL_WORKER_THREADS",
                proxy_workers(std::env::var("ZTUNNEL_WORKER_THREADS").ok(), host_cores(), self.nodes.len()),
            ),
            ("AMBIT_ADMIN_ADDR", format!("127.0.0.1:{}", ports.admin)),
            ("AMBIT_STATS_ADDR", format!("[::]:{}", ports.stats)),
            ("AMBIT_READINESS_ADDR", format!("[::]:{}", ports.ready)),
            ("CONNECTION_TERMINATION_DEADLINE", format!("{}s", PROXY_DRAIN.as_secs())),
        ]);
        let mut spec =
            self.spec(&format!("proxy/{}", n.member.name), &n.member.netns, vec!["proxy".into()], env);
        if let Some(other) = &self.cfg.node_proxy {
            spec.program = other.clone();
            spec.args = vec!["proxy".into(), "ztunnel".into()];
        }
        self.launched(spec)
    }

    /// `spec` started through [`UpConfig::launcher`](super::UpConfig::launcher) when there is one.
    fn launched(&self, mut spec: ProcessSpec) -> ProcessSpec {
        if let Some(launcher) = &self.cfg.launcher {
            let program = std::mem::replace(&mut spec.program, launcher.clone());
            let head =
                [spec.name.clone().into(), spec.netns.clone().unwrap_or_default().into(), program.into()];
            spec.args.splice(0..0, head);
        }
        spec
    }

    /// The pods node `i`'s proxy of generation `generation` serves (`workloadState` `Up`).
    pub(super) fn proxy_serves(&self, i: usize, generation: u32) -> usize {
        let ports = ProxyPorts::of_generation(generation);
        match probe::http_get(&self.nodes[i].member.netns, ports.admin, "/config_dump") {
            Ok((200, body)) => {
                let dump: Value = serde_json::from_str(&body).unwrap_or_default();
                dump["workloadState"]
                    .as_object()
                    .map_or(0, |m| m.values().filter(|v| v["state"] == "Up").count())
            }
            _ => 0,
        }
    }

    /// Replaces node `i`'s proxy as a DaemonSet rolling update does, without a gap: the new one
    /// starts beside the old one (the other set of ports), and once it is ready and serves as
    /// many pods as the old one (the agent hands it every pod), the old one gets SIGTERM and
    /// drains.
    pub(super) fn replace_proxy(&mut self, i: usize) -> Result<String, String> {
        if let Some(other) = &self.cfg.node_proxy {
            return Err(format!(
                "the node proxies are {} (ambit up --node-proxy), which cannot listen beside itself on a second set of ports; only `ambit proxy` is replaced without a gap",
                other.display()
            ));
        }
        let old = self.proxy_generation[i];
        let new = old + 1;
        let serving = self.proxy_serves(i, old);
        let spec = self.proxy_spec(i, new);
        let name = format!("proxy/{}", self.nodes[i].member.name);
        let netns = self.nodes[i].member.netns.clone();
        let ready_port = ProxyPorts::of_generation(new).ready;
        // The supervisor is taken out while the readiness check borrows the rest.
        let mut sup = std::mem::take(&mut self.sup);
        let r = {
            let this = &*self;
            let mut ready = |_: u32| {
                probe::ready(&netns, ready_port, "/healthz/ready") && this.proxy_serves(i, new) >= serving
            };
            sup.replace(&name, spec, &mut ready, READY_TIMEOUT, PROXY_DRAIN + Duration::from_secs(5))
        };
        self.sup = sup;
        match r {
            Ok(pid) => {
                self.proxy_generation[i] = new;
                {
                    let p = ProxyPorts::of_generation(new);
                    Ok(format!(
                        "{name} replaced: pid {pid} serves {serving} pod(s) (admin :{}, metrics :{}, readiness :{}); the previous one drained",
                        p.admin, p.stats, p.ready
                    ))
                }
            }
            Err(e) => Err(e.to_string()),
        }
    }
}
