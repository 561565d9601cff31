use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use super::*;

#[test]
fn own_namespace_is_recognised() {
    let ns = Netns::own().expect("own netns");
    assert!(ns.is_own());
    assert_eq!(ns.id(), own_id().expect("own id"));
    assert_eq!(ns.id(), NetnsId::of_path(Path::new("/proc/self/ns/net")).expect("id"));
    assert!(is_netns(ns.as_fd()));
    // Entering a namespace needs CAP_SYS_ADMIN; without it both ways fail with EPERM, cleanly.
    match ns.run(|| 7) {
        Ok(v) => assert_eq!(v, 7),
        Err(NetnsError::Enter(e)) => assert_eq!(e, nix::Error::EPERM),
        Err(e) => panic!("unexpected error: {e}"),
    }
    match ns.run_in_thread(|| 8) {
        Ok(v) => assert_eq!(v, 8),
        Err(NetnsError::Enter(e)) => assert_eq!(e, nix::Error::EPERM),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn host_is_pid_one() {
    // Some sandboxes hide pid 1's namespace even from root; then both ways fail alike.
    match (host_id(Path::new("/proc")), NetnsId::of_path(Path::new("/proc/1/ns/net"))) {
        (Ok(host), Ok(direct)) => assert_eq!(host, direct),
        (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind()),
        (a, b) => panic!("host_id and a direct stat disagree: {a:?} vs {b:?}"),
    }
}

#[test]
fn other_files_are_refused_with_what_they_are() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"x").expect("write");
    match Netns::open(&plain) {
        Err(NetnsError::NotANetns { what, detail }) => {
            assert_eq!(what, plain.display().to_string());
            assert!(detail.starts_with("it refers to "), "{detail}");
        }
        other => panic!("a regular file must be refused: {other:?}"),
    }
    // A file *named* like an nsfs link is still a regular file.
    let fake = dir.path().join("net:[4026531840]");
    std::fs::write(&fake, b"").expect("write");
    assert!(matches!(Netns::open(&fake), Err(NetnsError::NotANetns { .. })));
    // Another kind of namespace.
    let uts: OwnedFd = File::open("/proc/self/ns/uts").expect("uts").into();
    match Netns::from_fd(uts) {
        Err(NetnsError::NotANetns { detail, .. }) => {
            assert!(detail.starts_with("it is another kind of namespace (uts:["), "{detail}")
        }
        other => panic!("a uts namespace must be refused: {other:?}"),
    }
    // A directory and a missing path.
    assert!(matches!(Netns::open(dir.path()), Err(NetnsError::NotANetns { .. })));
    match Netns::open(&dir.path().join("missing")) {
        Err(NetnsError::Open { source, .. }) => assert_eq!(source.kind(), std::io::ErrorKind::NotFound),
        other => panic!("a missing path must fail to open: {other:?}"),
    }
}

#[test]
fn ids_differ_between_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"x").expect("write");
    let file = File::open(&plain).expect("open");
    assert_ne!(NetnsId::of(file.as_fd()).expect("id"), own_id().expect("own"));
}
