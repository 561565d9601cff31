//! Helpers shared by the socket-level tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use ambit_zds::{MAX_MESSAGE, WorkloadInfo, ZdsClient, ZdsListener, ZdsServerConn};
use tokio_seqpacket::UnixSeqpacket;
use tokio_seqpacket::ancillary::OwnedAncillaryMessage;

/// A listener in its own temp dir (dropped with it).
pub struct Agent {
    pub dir: tempfile::TempDir,
    pub listener: ZdsListener,
}

impl Agent {
    pub fn new() -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let listener = ZdsListener::bind(&dir.path().join("ztunnel.sock")).unwrap();
        Agent { dir, listener }
    }

    pub fn path(&self) -> PathBuf {
        self.listener.path().to_owned()
    }

    /// Connects a client and completes the hello on the server side.
    pub async fn connect(&self) -> (ZdsServerConn, ZdsClient) {
        let client = ZdsClient::connect(&self.path()).await.unwrap();
        let mut server = self.listener.accept().await.unwrap();
        assert_eq!(server.recv_hello().await.unwrap(), 1);
        (server, client)
    }
}

pub fn netns_fd() -> OwnedFd {
    File::open("/proc/self/ns/net").unwrap().into()
}

/// A regular file (kept alive by the returned guard) and an fd on it.
pub fn regular_fd() -> (tempfile::NamedTempFile, OwnedFd) {
    let file = tempfile::NamedTempFile::new().unwrap();
    let fd = File::open(file.path()).unwrap().into();
    (file, fd)
}

pub fn info(name: &str) -> WorkloadInfo {
    WorkloadInfo { name: name.into(), namespace: "ns".into(), service_account: "sa".into() }
}

#[repr(C, align(16))]
struct Control([u8; 256]);

/// Reads one record without any ZDS parsing: its bytes and how many fds came with it.
pub async fn raw_recv(socket: &UnixSeqpacket) -> (Vec<u8>, usize) {
    let mut buf = [0u8; 4 * MAX_MESSAGE];
    let mut control = Control([0; 256]);
    let (info, ancillary) = socket.recv_with_ancillary(&mut buf, &mut control.0).await.unwrap();
    assert!(!info.truncated() && !info.ancillary_truncated());
    let mut fds = 0;
    for message in ancillary.into_messages() {
        if let OwnedAncillaryMessage::FileDescriptors(received) = message {
            fds += received.count();
        }
    }
    (buf[..info.bytes_read()].to_vec(), fds)
}

/// Open fds of this process (only meaningful when no other test runs concurrently).
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}
