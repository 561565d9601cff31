use super::*;

const UID: &str = "863b91d4-4b68-4efa-917f-4b560e3e86aa";

#[test]
fn cgroup_paths() {
    let cases = [
        // systemd driver, containerd (the spec's example).
        (
            "/kubepods.slice/kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod863b91d4_4b68_4efa_917f_4b560e3e86aa.slice/cri-containerd-75c7aa3e4a.scope",
            Some(UID),
        ),
        // cgroupfs driver.
        ("/kubepods/burstable/pod863b91d4-4b68-4efa-917f-4b560e3e86aa/75c7aa3e4a", Some(UID)),
        // CRI-O.
        (
            "/kubepods.slice/kubepods-pod863b91d4_4b68_4efa_917f_4b560e3e86aa.slice/crio-75c7aa.scope",
            Some(UID),
        ),
        // Upper-case hex is canonicalised.
        ("/kubepods/pod863B91D4-4B68-4EFA-917F-4B560E3E86AA/abc", Some(UID)),
        // No container id after the pod segment.
        ("/kubepods/pod863b91d4-4b68-4efa-917f-4b560e3e86aa/", None),
        ("/kubepods/pod863b91d4-4b68-4efa-917f-4b560e3e86aa", None),
        // Not a pod cgroup.
        ("/user.slice/user-0.slice/session-1.scope", None),
        ("/system.slice/podman.service", None),
        // "pod" not after punctuation, short uid.
        ("/xpod863b91d4-4b68-4efa-917f-4b560e3e86aa/abc", None),
        ("/pod863b91d4-4b68/abc", None),
        ("", None),
    ];
    for (path, want) in cases {
        assert_eq!(pod_uid_from_cgroup_path(path).as_deref(), want, "{path}");
    }
}

#[test]
fn cgroup_files() {
    let one = format!("12:memory:/kubepods/pod{UID}/c1\n0::/kubepods/pod{UID}/c1\n");
    assert_eq!(pod_uid_from_cgroup(&one).as_deref(), Some(UID));
    let two =
        format!("0::/kubepods/pod{UID}/c1\n1:cpu:/kubepods/pod11111111-2222-3333-4444-555555555555/c2\n");
    assert_eq!(pod_uid_from_cgroup(&two), None, "two different pods");
    assert_eq!(pod_uid_from_cgroup("garbage line\n"), None);
}

#[test]
fn stat_start_time() {
    let stat = "4242 (pause (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 100";
    assert_eq!(starttime(stat), Some(987654));
    assert_eq!(starttime("1 (init"), None);
    assert_eq!(starttime(""), None);
}

/// A fake /proc: pid 1 (host), two processes of the same pod in one netns (oldest wins), a
/// process of another pod, and a process whose namespace the owner check rejects.
#[test]
fn scan_fake_proc() {
    let root = tempfile::tempdir().expect("tempdir");
    let mk = |pid: u32, cgroup: &str, start: u64, netns_from: Option<u32>| {
        let d = root.path().join(pid.to_string());
        fs::create_dir_all(d.join("ns")).expect("mkdir");
        fs::write(d.join("cgroup"), cgroup).expect("cgroup");
        fs::write(d.join("stat"), format!("{pid} (p) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0"))
            .expect("stat");
        match netns_from {
            Some(other) => {
                fs::hard_link(root.path().join(format!("{other}/ns/net")), d.join("ns/net")).expect("link")
            }
            None => fs::write(d.join("ns/net"), pid.to_string()).expect("net"),
        }
    };
    mk(1, "0::/init.scope\n", 1, None);
    mk(100, &format!("0::/kubepods/pod{UID}/sandbox\n"), 500, None);
    mk(101, &format!("0::/kubepods/pod{UID}/app\n"), 600, Some(100));
    mk(102, &format!("0::/kubepods/pod{UID}/late\n"), 400, Some(100));
    mk(200, "0::/kubepods/pod11111111-2222-3333-4444-555555555555/c\n", 10, None);
    mk(300, "0::/kubepods/pod22222222-2222-3333-4444-555555555555/c\n", 10, None);
    // A pod process sitting in the host namespace is never taken.
    mk(400, "0::/kubepods/pod33333333-2222-3333-4444-555555555555/c\n", 10, Some(1));
    let wanted: HashSet<String> =
        [UID, "22222222-2222-3333-4444-555555555555", "33333333-2222-3333-4444-555555555555"]
            .into_iter()
            .map(String::from)
            .collect();
    let scanned = scan(root.path(), &wanted, |uid, _| !uid.starts_with("2222"));
    let found = scanned.found;
    assert_eq!(found.len(), 1, "{found:?}");
    let f = &found[UID];
    assert_eq!(f.pid, 102, "the oldest process wins");
    assert_eq!(f.netns_path, root.path().join("102/ns/net"));
    assert_eq!(scanned.refused, 0);
    assert!(scan(&root.path().join("missing"), &wanted, |_, _| true).found.is_empty());
}

/// A process of a wanted pod whose namespace refuses the agent is counted, so the error can say
/// why the pod was not found (an agent without CAP_SYS_PTRACE). Here the refusal is a directory
/// the scanning thread may not search, once it has given up its DAC override.
#[test]
fn a_refused_namespace_is_counted() {
    use std::os::unix::fs::PermissionsExt;
    if !ambit_cluster::testing::require_root() {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    for (pid, uid) in [(100, UID), (200, "11111111-2222-3333-4444-555555555555")] {
        let d = root.path().join(pid.to_string());
        fs::create_dir_all(d.join("ns")).expect("mkdir");
        fs::write(d.join("cgroup"), format!("0::/kubepods/pod{uid}/c\n")).expect("cgroup");
        fs::write(d.join("ns/net"), "x").expect("net");
        fs::set_permissions(d.join("ns"), fs::Permissions::from_mode(0o000)).expect("chmod");
    }
    let wanted: HashSet<String> = [UID.to_owned()].into();
    let scanned = std::thread::scope(|s| {
        s.spawn(|| {
            drop_dac_override();
            scan(root.path(), &wanted, |_, _| true)
        })
        .join()
        .expect("thread")
    });
    assert!(scanned.found.is_empty());
    assert_eq!(scanned.refused, 1, "only the wanted pod's process counts");
}

/// Takes CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH out of the calling thread's effective set
/// (capabilities are per thread; the thread ends with the test).
#[allow(unsafe_code)]
fn drop_dac_override() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset with a version-3 header and two data words, as capget(2) documents.
    let got = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    assert_eq!(got, 0, "capget: {}", std::io::Error::last_os_error());
    data[0].effective &= !((1 << 1) | (1 << 2));
    // SAFETY: as above.
    let set = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    assert_eq!(set, 0, "capset: {}", std::io::Error::last_os_error());
}

proptest::proptest! {
    #[test]
    fn parsers_never_panic(s in ".{0,200}") {
        let _ = pod_uid_from_cgroup_path(&s);
        let _ = pod_uid_from_cgroup(&s);
        let _ = starttime(&s);
    }
}
