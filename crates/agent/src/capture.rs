//! Traffic capture as the mesh core sees it: the [`Capture`] seam (installing and removing a
//! pod's rules, and the host side of an enrolled pod), its typed error, and the adapter onto
//! `ambit-redirect` that `ambit agent` uses.

use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;

use ambit_netns::Netns;
use ambit_redirect::host::NftProbeSnat;
use ambit_redirect::{PodCapture, RedirectError, RuleBackend, Verification};
use prometheus_client::metrics::counter::Counter;

use crate::model::Pod;

/// Installs and removes the capture rules inside a pod's network namespace.
pub trait Capture: Send + Sync + 'static {
    /// Installs (or repairs) the pod's capture; idempotent.
    fn apply(&self, netns: &Netns, pod: &Pod) -> Result<(), CaptureError>;
    /// Compares the pod's live capture with what it must be and re-applies it when it
    /// drifted; returns the differences found (empty: in sync, nothing done).
    fn repair(&self, netns: &Netns, pod: &Pod) -> Result<Vec<String>, CaptureError>;
    /// Removes the pod's capture; idempotent.
    fn remove(&self, netns: &Netns) -> Result<(), CaptureError>;
    /// Host side of an enrolled pod (probe SNAT entries for its IPs); idempotent.
    fn host_add(&self, _pod: &Pod) -> Result<(), CaptureError> {
        Ok(())
    }
    /// Removes the host side of a pod that left the mesh; idempotent.
    fn host_remove(&self, _pod: &Pod) -> Result<(), CaptureError> {
        Ok(())
    }
}

/// Why capture could not be installed or removed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The in-pod rules or routes.
    #[error(transparent)]
    Rules(#[from] RedirectError),
    /// The host's probe SNAT entry for one of the pod's addresses.
    #[error("probe SNAT entry for {ip}: {source}")]
    ProbeSnat {
        /// The pod address.
        ip: IpAddr,
        /// Why.
        #[source]
        source: RedirectError,
    },
    /// The blocking task that ran the capture did not finish (a bug: it panicked).
    #[error("the capture task failed: {0}")]
    Task(String),
}

/// Capture through an `ambit-redirect` backend, per-pod settings from the pod's annotations,
/// and the host's probe SNAT entries when a kubelet runs on this host.
pub struct RedirectCapture {
    backend: Box<dyn RuleBackend>,
    dns: bool,
    ipv6: bool,
    errors: Counter,
    repairs: Counter,
    probes: Option<(Netns, NftProbeSnat)>,
}

impl RedirectCapture {
    /// A capture adapter; `errors` counts failed rule operations, `repairs` captures found
    /// drifted and re-applied.
    pub fn new(
        backend: Box<dyn RuleBackend>,
        dns: bool,
        ipv6: bool,
        (errors, repairs): (Counter, Counter),
        probes: Option<(Netns, NftProbeSnat)>,
    ) -> RedirectCapture {
        RedirectCapture { backend, dns, ipv6, errors, repairs, probes }
    }

    fn counted<T>(&self, r: Result<T, RedirectError>) -> Result<T, CaptureError> {
        r.map_err(|e| {
            self.errors.inc();
            CaptureError::Rules(e)
        })
    }
}

impl Capture for RedirectCapture {
    fn apply(&self, netns: &Netns, pod: &Pod) -> Result<(), CaptureError> {
        let capture = PodCapture::from_annotations(&pod.annotations, self.dns, self.ipv6);
        self.counted(self.backend.apply(netns.as_fd(), &capture))
    }

    fn repair(&self, netns: &Netns, pod: &Pod) -> Result<Vec<String>, CaptureError> {
        let capture = PodCapture::from_annotations(&pod.annotations, self.dns, self.ipv6);
        let drift = match self.counted(self.backend.verify(netns.as_fd(), &capture))? {
            Verification::InSync => return Ok(Vec::new()),
            Verification::Absent => vec!["no capture rules present".to_owned()],
            Verification::Drift(drift) => drift,
        };
        self.counted(self.backend.apply(netns.as_fd(), &capture))?;
        self.repairs.inc();
        Ok(drift)
    }

    fn remove(&self, netns: &Netns) -> Result<(), CaptureError> {
        let capture = PodCapture::from_annotations(&Default::default(), self.dns, self.ipv6);
        self.counted(self.backend.remove(netns.as_fd(), &capture))
    }

    fn host_add(&self, pod: &Pod) -> Result<(), CaptureError> {
        let Some((host, probes)) = &self.probes else { return Ok(()) };
        for ip in &pod.ips {
            probes
                .upsert(host.as_fd(), *ip, &pod.uid)
                .map_err(|source| CaptureError::ProbeSnat { ip: *ip, source })?;
        }
        Ok(())
    }

    fn host_remove(&self, pod: &Pod) -> Result<(), CaptureError> {
        let Some((host, probes)) = &self.probes else { return Ok(()) };
        for ip in &pod.ips {
            probes
                .remove_for_pod(host.as_fd(), *ip, &pod.uid)
                .map_err(|source| CaptureError::ProbeSnat { ip: *ip, source })?;
        }
        Ok(())
    }
}

/// Installs the host probe SNAT (kubelet's probes to captured pods come from a link-local
/// address the in-pod rules let through), when a kubelet runs on this host.
pub fn probe_snat(proc_root: &Path, host_netns: &Path, ipv6: bool) -> Option<(Netns, NftProbeSnat)> {
    let uid = match ambit_redirect::host::kubelet_uid(proc_root) {
        Ok(uid) => uid,
        Err(e) => {
            tracing::info!(error = %e, "no kubelet found: host probe SNAT not installed");
            return None;
        }
    };
    let host = match Netns::open(host_netns) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the host network namespace: host probe SNAT not installed");
            return None;
        }
    };
    let probes = NftProbeSnat::new(ipv6, uid);
    match probes.install(host.as_fd()).and_then(|()| probes.flush_sets(host.as_fd())) {
        Ok(()) => Some((host, probes)),
        Err(e) => {
            tracing::warn!(error = %e, "installing the host probe SNAT failed; kubelet probes may be refused under STRICT mTLS");
            None
        }
    }
}
