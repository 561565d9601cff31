//! Opening the network namespace a CNI ADD names, and refusing what is not a pod's.
//!
//! The plugin checks `CNI_NETNS` too, but it can be told to skip its checks
//! (`CNI_NETNS_OVERRIDE=1`), anything that can write to the event socket can bypass it, and it
//! cannot tell a network namespace from another file. So the agent checks again, in its own
//! process, before it enters the namespace: the path's form (absolute, no `.`/`..`; done when
//! the event is parsed, see [`ambit_cni::event::check_netns_path`]), that it opens, that it is
//! a network namespace (nsfs, [`Netns::open`]), and that it is none of the namespaces a pod can
//! never have: the agent's own and the host's ([`HostNamespaces`]).

use std::fs::OpenOptions;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ambit_netns::{Netns, NetnsError, NetnsId};

/// Namespaces a CNI ADD may never name: the agent's own, and the host's as far as it can be
/// told (`--host-netns`, and pid 1's under the host's `/proc` when readable).
#[derive(Clone, Debug, Default)]
pub struct HostNamespaces {
    ids: Vec<(NetnsId, String)>,
}

/// Why the agent refuses a CNI ADD's network namespace (the event server answers 400).
#[derive(Debug, thiserror::Error)]
pub enum NetnsRefusal {
    /// Nothing at the path.
    #[error("it does not exist")]
    Missing,
    /// The path does not open.
    #[error("it cannot be opened: {0}")]
    Unopenable(#[source] io::Error),
    /// Something else than a network namespace.
    #[error("it is not a network namespace ({0})")]
    NotANetns(String),
    /// One of the [`HostNamespaces`].
    #[error("it is {0}, not a pod's")]
    Host(String),
}

impl HostNamespaces {
    /// The agent's own namespace, the one at `host_netns`, and pid 1's under `proc_root`; those
    /// that cannot be read are left out (pid 1's is hidden in some sandboxes) and logged.
    pub fn discover(host_netns: &Path, proc_root: &Path) -> HostNamespaces {
        let mut found = HostNamespaces::default();
        match ambit_netns::own_id() {
            Ok(id) => found.add(id, "the node agent's own network namespace".into()),
            Err(e) => tracing::warn!(error = %e, "cannot identify the agent's own network namespace"),
        }
        match NetnsId::of_path(host_netns) {
            Ok(id) => found.add(id, format!("the host's network namespace ({})", host_netns.display())),
            Err(e) => tracing::warn!(path = %host_netns.display(), error = %e,
                "cannot identify the host network namespace (--host-netns)"),
        }
        match ambit_netns::host_id(proc_root) {
            Ok(id) => {
                found.add(id, format!("the host's network namespace (pid 1 in {})", proc_root.display()))
            }
            Err(e) => tracing::debug!(proc = %proc_root.display(), error = %e,
                "pid 1's network namespace is not readable; relying on --host-netns"),
        }
        found
    }

    /// These ids exactly (tests).
    pub fn of(ids: impl IntoIterator<Item = (NetnsId, String)>) -> HostNamespaces {
        let mut found = HostNamespaces::default();
        for (id, what) in ids {
            found.add(id, what);
        }
        found
    }

    fn add(&mut self, id: NetnsId, what: String) {
        if !self.ids.iter().any(|(known, _)| *known == id) {
            self.ids.push((id, what));
        }
    }

    /// What `id` is, if it is one of these namespaces.
    pub fn which(&self, id: NetnsId) -> Option<&str> {
        self.ids.iter().find(|(known, _)| *known == id).map(|(_, what)| what.as_str())
    }

    /// Opens `path` (the runtime's `CNI_NETNS`, already joined to the host prefix) and checks
    /// that it is a network namespace other than these.
    ///
    /// Only a regular file is opened (an nsfs inode is one): opening a FIFO would block the
    /// agent, and opening some devices has side effects. The open is non-blocking anyway, in case
    /// the file is swapped between the check and the open.
    pub fn open_pod_netns(&self, path: &Path) -> Result<Netns, NetnsRefusal> {
        let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => NetnsRefusal::Missing,
            _ => NetnsRefusal::Unopenable(e),
        })?;
        let kind = meta.file_type();
        if !kind.is_file() {
            let what = if kind.is_dir() {
                "a directory"
            } else if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_socket() {
                "a socket"
            } else if kind.is_block_device() || kind.is_char_device() {
                "a device"
            } else {
                "not a regular file"
            };
            return Err(NetnsRefusal::NotANetns(format!("it is {what}")));
        }
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => NetnsRefusal::Missing,
                _ => NetnsRefusal::Unopenable(e),
            })?;
        let netns = Netns::from_fd(OwnedFd::from(file)).map_err(|e| match e {
            NetnsError::NotANetns { detail, .. } => NetnsRefusal::NotANetns(detail),
            other => NetnsRefusal::Unopenable(io::Error::from(other)),
        })?;
        if let Some(what) = self.which(netns.id()) {
            return Err(NetnsRefusal::Host(what.to_owned()));
        }
        Ok(netns)
    }
}

/// The runtime's `CNI_NETNS` (a host path) as the agent opens it: under `prefix` (`/host` when
/// the agent runs in a container).
pub fn host_path(prefix: &Path, netns: &str) -> PathBuf {
    prefix.join(netns.trim_start_matches('/'))
}
