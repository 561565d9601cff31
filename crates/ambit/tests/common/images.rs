//! Ambit's images as `deploy/images/build.sh` builds them, and the tools around them
//! (buildah, podman, skopeo), for tests/images.rs and tests/up_containers.rs.

use std::path::Path;
use std::process::{Command, Output};

/// The repository root.
fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

pub fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"))
}

pub fn ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether the tools are here; under `CI=true` their absence fails the test.
pub fn tools() -> bool {
    if !ambit_cluster::testing::require_root() {
        return false;
    }
    let missing: Vec<&str> = ["buildah", "podman", "skopeo", "strip", "readelf", "apt-get", "dpkg-deb"]
        .into_iter()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect();
    match missing.as_slice() {
        [] => true,
        m if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("the image test needs {} (apt-get install buildah podman skopeo binutils)", m.join(", "))
        }
        m => {
            eprintln!("skipping: {} not installed", m.join(", "));
            false
        }
    }
}

/// One run of build.sh into `out`.
pub fn build(out: &Path, registry: &str, debs: Option<&Path>) -> String {
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("deploy/images/build.sh"))
        .args(["--ambit", env!("CARGO_BIN_EXE_ambit")])
        .arg("--ambit-cni")
        .arg(super::ambit_cni_path())
        .arg("--out")
        .arg(out)
        .args(["--registry", registry]);
    if let Some(d) = debs {
        cmd.env("AMBIT_IMAGE_DEBS", d);
    }
    let o = cmd.output().expect("build.sh");
    assert!(
        o.status.success(),
        "build.sh: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
