//! Ambit's images (`deploy/images/build.sh`): built with buildah from this build's binaries and
//! Debian packages, twice, to the same digests; holding what the chart's pods run (the paths and
//! entry points the rendered manifests name); and running under podman. Root, with buildah,
//! podman and skopeo (`.ci/run` installs them); under `CI=true` a missing one fails the test.

// Shared with tests/chart.rs; this test uses a part of them.
#[allow(dead_code)]
mod chart {
    pub mod pods;
    pub mod render;
    pub mod values;
}
mod common;

use std::path::{Path, PathBuf};

use common::images::{build, ok, run, tools};

use chart::render::{render, repo};
use chart::values::Values;
use serde_json::Value;

fn inspect(archive: &Path, config: bool) -> Value {
    let target = format!("oci-archive:{}", archive.display());
    let args: Vec<&str> =
        if config { vec!["inspect", "--config", &target] } else { vec!["inspect", &target] };
    serde_json::from_str(&ok("skopeo", &args)).expect("skopeo's JSON")
}

/// A container of `image`, mounted: its root directory (removed when dropped).
struct Mounted {
    ctr: String,
    root: PathBuf,
}

impl Mounted {
    fn new(image: &str) -> Mounted {
        let ctr = ok("buildah", &["from", "--quiet", "--pull-never", image]).trim().to_owned();
        let root = PathBuf::from(ok("buildah", &["mount", &ctr]).trim());
        Mounted { ctr, root }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = run("buildah", &["umount", &self.ctr]);
        let _ = run("buildah", &["rm", &self.ctr]);
    }
}

/// `podman run` of `image` with `entrypoint` and `args`, no network, the ulimits this machine
/// kind lets a container set: what it printed on stdout and stderr.
fn podman(image: &str, entrypoint: &str, args: &[&str]) -> String {
    let mut all = vec![
        "run",
        "--rm",
        "--network",
        "none",
        "--pull",
        "never",
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
        "--entrypoint",
        entrypoint,
        image,
    ];
    all.extend_from_slice(args);
    let out = run("podman", &all);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "podman {}: {text}", all.join(" "));
    text
}

#[test]
fn images_build_reproducibly_hold_what_the_chart_runs_and_run() {
    if !tools() {
        return;
    }
    let version = env!("CARGO_PKG_VERSION");
    let registry = format!("localhost/ambit-test{}", std::process::id());
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));

    // Twice, the second from the first's downloaded packages: the same digests.
    let printed = build(&a, &registry, None);
    build(&b, &registry, Some(&a.join("debs")));
    let values = Values::defaults();
    let names = [values.str("proxy.image.repository"), values.str("agent.image.repository")];
    assert_eq!(names, ["ambit", "ambit-agent"]);
    assert_eq!(values.str("control.image.repository"), "ambit");
    let head = ok("git", &["-C", &repo().display().to_string(), "rev-parse", "HEAD"]);
    for name in names {
        let (first, second) =
            (inspect(&a.join(format!("{name}.tar")), false), inspect(&b.join(format!("{name}.tar")), false));
        assert_eq!(first["Digest"], second["Digest"], "{name}: two builds of the same input differ");
        let labels = &first["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], version, "{name}");
        let revision = labels["org.opencontainers.image.revision"].as_str().unwrap_or_default();
        assert!(revision.starts_with(head.trim()), "{name}: revision {revision}, HEAD {head}");
        assert_eq!(first["Created"], "1970-01-01T00:00:00Z", "{name}");
        let line = printed.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_default();
        assert!(line.contains(&format!("{registry}/{name}:{version}")), "{printed}");
        let packages = std::fs::read_to_string(a.join(format!("{name}.packages.txt"))).expect("package list");
        assert!(packages.lines().any(|l| l.starts_with("libc6 ")), "{packages}");
        assert!(packages.contains("file /usr/local/bin/ambit sha256:"), "{packages}");
        assert_eq!(packages.lines().any(|l| l.starts_with("iptables ")), name == "ambit-agent", "{packages}");
    }
    let (proxy_image, agent_image) =
        (format!("{registry}/ambit:{version}"), format!("{registry}/ambit-agent:{version}"));
    let proxy_config = inspect(&a.join("ambit.tar"), true);
    assert_eq!(proxy_config["config"]["User"], "65532:65532");
    assert_eq!(proxy_config["config"]["Entrypoint"], serde_json::json!(["/usr/local/bin/ambit"]));
    let agent_config = inspect(&a.join("ambit-agent.tar"), true);
    let lock = agent_config["config"]["Env"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|e| e.as_str()?.strip_prefix("XTABLES_LOCKFILE="))
        .expect("XTABLES_LOCKFILE in the agent image")
        .to_owned();

    // The chart's default images are the ones build.sh tags by default.
    let r = render(&[]).expect("renders");
    let script = std::fs::read_to_string(repo().join("deploy/images/build.sh")).expect("build.sh");
    for (pod, name) in [("ambit-agent", "ambit-agent"), ("ztunnel", "ambit"), ("ambit-control", "ambit")] {
        let spec = r.pod_spec(pod).unwrap_or_else(|| panic!("{pod}"));
        let image = spec.containers[0].image.clone().unwrap_or_default();
        let default_registry = image
            .strip_suffix(&format!("/{name}:{version}"))
            .unwrap_or_else(|| panic!("{pod} runs {image}, not {name}:{version}"));
        assert!(
            script.contains(&format!("registry=\"{default_registry}\"")),
            "{pod} runs {image}, but build.sh's default registry is not {default_registry}"
        );
    }

    // What the chart's pods name is in the images.
    let agent_pod = r.pod_spec("ambit-agent").expect("agent");
    let agent = &agent_pod.containers[0];
    let plugin = chart::pods::env(agent, "AMBIT_CNI_BINARY").expect("AMBIT_CNI_BINARY").to_owned();
    assert_eq!(
        chart::pods::backing(&agent_pod, agent, &lock).0,
        chart::pods::Backing::EmptyDir,
        "iptables-legacy's lock {lock} is on the read-only root"
    );
    let m = Mounted::new(&agent_image);
    for program in agent.command.iter().flatten().take(1).chain([&plugin]) {
        assert!(m.path(program).is_file(), "the agent image has no {program}");
    }
    for link in ["install-cni", "ztunnel"] {
        let target = std::fs::read_link(m.path(&format!("/usr/local/bin/{link}"))).expect(link);
        assert_eq!(target, Path::new("ambit"), "{link}");
    }
    drop(m);
    for (pod, image) in [("ztunnel", &proxy_image), ("ambit-control", &proxy_image)] {
        let spec = r.pod_spec(pod).unwrap_or_else(|| panic!("{pod}"));
        let m = Mounted::new(image);
        for program in spec.containers[0].command.iter().flatten().take(1) {
            assert!(m.path(program).is_file(), "{image} has no {program} ({pod})");
        }
    }

    // They run.
    assert_eq!(
        podman(&proxy_image, "/usr/local/bin/ambit", &["--version"]).trim(),
        format!("ambit {version}")
    );
    let cni = podman(&agent_image, &plugin, &[]);
    assert!(cni.contains(&format!("ambit-cni {version}")), "{cni}");
    for (program, variant) in [
        ("iptables-legacy-save", "(legacy)"),
        ("ip6tables-legacy-restore", "(legacy)"),
        ("iptables-nft-save", "(nf_tables)"),
        ("ip6tables-nft", "(nf_tables)"),
        ("iptables", "(nf_tables)"),
    ] {
        let out = podman(&agent_image, &format!("/usr/sbin/{program}"), &["--version"]);
        assert!(out.contains(variant), "{program}: {out}");
    }

    for name in ["ambit", "ambit-agent", "ztunnel", "install-cni"] {
        let _ = run("buildah", &["rmi", "--force", &format!("{registry}/{name}:{version}")]);
    }
}
