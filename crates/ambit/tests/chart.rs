//! The Helm charts in deploy/charts, rendered by a real `helm` (`$HELM`, else on PATH; CI installs
//! it with scripts/install-helm.sh): lint, every documented values combination parsed into typed
//! Kubernetes objects and checked against the chart's invariants, the refused combinations
//! with their exact messages, the install guide's commands, the settings each container gets
//! against what its binary reads, and the generated CA as `ambit control` loads it.

mod chart {
    pub mod checks;
    pub mod crds;
    pub mod docs;
    pub mod istio_style;
    pub mod pods;
    pub mod reference;
    pub mod render;
    pub mod values;
}

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ambit_objects::k8s_openapi::api::core::v1::Container;
use ambit_objects::k8s_openapi::api::rbac::v1::{PolicyRule, RoleBinding, RoleRef, Subject};
use ambit_objects::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use chart::checks::check;
use chart::render::{NAMESPACE, Release, first_difference, render, render_args, repo, run_helm};
use chart::values::{Values, chart_app_version, read_yaml};

/// The documented combinations: deploy/charts/ambit/ci/*-values.yaml (the chart-testing
/// convention), which docs/install.md names one by one.
fn combinations() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(repo().join("deploy/charts/ambit/ci"))
        .expect("deploy/charts/ambit/ci")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with("-values.yaml"))
        .map(|n| format!("deploy/charts/ambit/ci/{n}"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    files
}

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

/// Renders `-f file` and checks it, naming the file in every problem.
fn render_and_check(file: &str) -> (Release, Vec<String>) {
    let r = render(&["-f", file]).unwrap_or_else(|e| panic!("{file} does not render: {e}"));
    let expect = Values::of_args(&args(&["-f", file])).expect();
    let problems = check(&r, &expect).into_iter().map(|p| format!("{file}: {p}")).collect();
    (r, problems)
}

#[test]
fn charts_lint_clean_with_every_combination() {
    let mut failures = Vec::new();
    for file in combinations() {
        if let Err(e) = run_helm(&args(&["lint", "--strict", "deploy/charts/ambit", "-f", &file])) {
            failures.push(format!("{file}: {e}"));
        }
    }
    if let Err(e) = run_helm(&args(&["lint", "--strict", "deploy/charts/ambit-crds"])) {
        failures.push(format!("ambit-crds: {e}"));
    }
    assert!(failures.is_empty(), "helm lint:\n{}", failures.join("\n"));
}

#[test]
fn every_documented_combination_holds_the_invariants() {
    let mut problems = Vec::new();
    for file in combinations() {
        problems.extend(render_and_check(&file).1);
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

/// Values that cannot work are refused with a message that says why.
#[test]
fn refused_combinations_fail_with_their_message() {
    let validate = "Error: execution error at (ambit/templates/validate.yaml:2:4): ";
    let schema =
        "Error: values don't meet the specifications of the schema(s) in the following chart(s):\nambit:\n";
    let cases = [
        (
            "existing-ca-without-root-values.yaml",
            format!(
                "{validate}ca.existingSecret=my-mesh-ca needs ca.rootCert: the Secret's root-cert.pem, which the \
                 proxies trust (the chart does not read Secrets)"
            ),
        ),
        (
            "grace-shorter-than-drain-values.yaml",
            format!(
                "{validate}proxy.terminationGracePeriodSeconds (20) must be longer than the proxy's drain deadline \
                 (25 s, proxy.drainDeadlineSeconds): the kubelet kills the proxy when the grace period ends, \
                 cutting connections that were still allowed to finish"
            ),
        ),
        (
            "latest-tag-values.yaml",
            format!(
                "{validate}image.tag=latest is refused: a floating tag does not name the binaries this chart was \
                 written for; leave it empty for the chart's appVersion, or pin a version or image.digest"
            ),
        ),
        (
            "unknown-backend-values.yaml",
            format!("{schema}- at '/agent/captureBackend': value must be one of 'nftables', 'iptables'"),
        ),
        ("unknown-mode-values.yaml", format!("{schema}- at '/mode': value must be one of 'ambit', 'istiod'")),
        // A misspelt key is refused at every depth, not ignored.
        (
            "nested-typo-values.yaml",
            format!("{schema}- at '/agent': additional properties 'captureBackendd' not allowed"),
        ),
        (
            "nested-typo-deep-values.yaml",
            format!("{schema}- at '/agent/resources': additional properties 'request' not allowed"),
        ),
        // Additions never silently replace what the chart sets.
        (
            "env-overrides-chart-values.yaml",
            format!(
                "{validate}proxy.env.RUST_LOG is refused: the chart sets RUST_LOG on the proxy itself (to \"info\"); \
                 change the chart value that sets it instead"
            ),
        ),
        (
            "pod-label-overrides-chart-values.yaml",
            format!(
                "{validate}agent.podLabels.app=my-agent is refused: the chart sets app to \"ambit-agent\" on the \
                 agent's pods itself"
            ),
        ),
        (
            "chart-volume-name-values.yaml",
            format!(
                "{validate}agent.volumes: the name cni-bin-dir is refused: the chart's own volume has it"
            ),
        ),
        (
            "placement-differs-values.yaml",
            format!(
                "{validate}agent.nodeSelector and proxy.nodeSelector differ: the agent and the proxy must run on the \
                 same nodes (a node with an agent and no proxy leaves its captured pods without connectivity); set \
                 the same value on both"
            ),
        ),
        (
            "global-hub-conflict-values.yaml",
            format!(
                "{validate}image.registry=registry.example.com/mesh and global.hub=registry.example.com/istio \
                 disagree: they are the same setting (Istio's name and the chart's); set one of them"
            ),
        ),
    ];
    let on_disk: BTreeSet<String> = std::fs::read_dir(repo().join("deploy/charts/ambit/ci-refused"))
        .expect("ci-refused")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let listed: BTreeSet<String> = cases.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(on_disk, listed, "every refused combination has its expected message here");
    for (file, want) in cases {
        let path = format!("deploy/charts/ambit/ci-refused/{file}");
        // helm adds a hint after a template's `fail`.
        let want = if want.starts_with(validate) {
            format!("{want}\n\nUse --debug flag to render out invalid YAML")
        } else {
            want
        };
        match render(&["-f", &path]) {
            Ok(_) => panic!("{file} rendered; it must be refused"),
            Err(got) => assert_eq!(got, want, "{file}"),
        }
    }
    // The same drain rule with the derived deadline: a 10 s grace period drains for 9 s.
    let err = render(&[
        "--set",
        "proxy.terminationGracePeriodSeconds=10",
        "--set",
        "proxy.drainDeadlineSeconds=10",
    ])
    .expect_err("grace = deadline is refused");
    assert!(
        err.contains(
            "proxy.terminationGracePeriodSeconds (10) must be longer than the proxy's drain deadline (10 s"
        ),
        "{err}"
    );
    render(&["--set", "proxy.terminationGracePeriodSeconds=10"]).expect("grace 10 s, derived deadline 9 s");
}

/// A CA of one's own: no Secret rendered, the given Secret mounted, its root published.
#[test]
fn an_existing_ca_secret_is_mounted_and_its_root_published() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = self_signed_pem();
    let file = dir.path().join("root-cert.pem");
    std::fs::write(&file, &root).expect("write root");
    let set_file = format!("ca.rootCert={}", file.display());
    let cmd = args(&["--set", "ca.existingSecret=my-mesh-ca", "--set-file", &set_file]);
    let r = render(&cmd.iter().map(String::as_str).collect::<Vec<_>>()).expect("renders");
    let e = Values::of_args(&cmd).expect();
    assert!(!e.ca_generated && e.ca_secret == "my-mesh-ca", "{e:?}");
    let problems = check(&r, &e);
    assert!(problems.is_empty(), "{problems:#?}");
    let cm = &r.config_maps[0];
    assert_eq!(cm.data.as_ref().and_then(|d| d.get("root-cert.pem")).map(|s| s.trim()), Some(root.trim()));
}

/// Each check can fail: a deliberately broken object is reported, naming what is wrong.
#[test]
fn the_checker_rejects_broken_objects() {
    let file = "deploy/charts/ambit/ci/default-values.yaml";
    let (good, problems) = render_and_check(file);
    assert!(problems.is_empty(), "{problems:#?}");
    let e = Values::of_args(&args(&["-f", file])).expect();
    let broken = |edit: &dyn Fn(&mut Release), want: &str| {
        let mut r = good.clone();
        edit(&mut r);
        let problems = check(&r, &e);
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "want a problem containing {want:?}, got {problems:#?}"
        );
    };
    fn container<'a>(r: &'a mut Release, ds: &str) -> &'a mut Container {
        let d = r.daemon_sets.iter_mut().find(|d| d.metadata.name.as_deref() == Some(ds)).expect("daemonset");
        let spec = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()).expect("pod spec");
        &mut spec.containers[0]
    }
    broken(
        &|r| container(r, "ambit-agent").security_context.as_mut().expect("sc").privileged = Some(true),
        "DaemonSet ambit-agent container agent: privileged is Some(true), want false",
    );
    broken(
        &|r| {
            let sc = container(r, "ztunnel").security_context.as_mut().expect("sc");
            sc.capabilities.as_mut().expect("caps").add.as_mut().expect("add").push("SYS_PTRACE".into());
        },
        "DaemonSet ztunnel container proxy: capabilities add {\"NET_ADMIN\", \"SYS_ADMIN\", \"SYS_PTRACE\"}, want exactly",
    );
    broken(
        &|r| {
            let role = r
                .cluster_roles
                .iter_mut()
                .find(|c| c.metadata.name.as_deref() == Some("ambit-control"))
                .expect("role");
            role.rules.get_or_insert_default().push(PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["secrets".into()]),
                verbs: vec!["*".into()],
                ..Default::default()
            });
        },
        "ClusterRole ambit-control grants a wildcard (\"\", \"secrets\", \"*\")",
    );
    broken(
        &|r| {
            r.role_bindings.push(RoleBinding {
                metadata: ObjectMeta {
                    name: Some("proxy".into()),
                    namespace: Some(NAMESPACE.into()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: "x".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "ztunnel".into(),
                    ..Default::default()
                }]),
            })
        },
        "RoleBindings {\"ambit-agent\", \"proxy\"}, want {\"ambit-agent\"}",
    );
    broken(
        &|r| {
            let d =
                r.daemon_sets.iter_mut().find(|d| d.metadata.name.as_deref() == Some("ztunnel")).expect("ds");
            d.spec
                .as_mut()
                .and_then(|s| s.template.spec.as_mut())
                .expect("spec")
                .termination_grace_period_seconds = Some(4);
        },
        "DaemonSet ztunnel: TERMINATION_GRACE_PERIOD_SECONDS Some(30) is not the pod's 4",
    );
    broken(
        &|r| {
            let c = container(r, "ztunnel");
            c.env.as_mut().expect("env").retain(|v| v.name != "TERMINATION_GRACE_PERIOD_SECONDS");
            c.env.as_mut().expect("env").push(ambit_objects::k8s_openapi::api::core::v1::EnvVar {
                name: "CONNECTION_TERMINATION_DEADLINE".into(),
                value: Some("45s".into()),
                ..Default::default()
            });
        },
        "DaemonSet ztunnel: terminationGracePeriodSeconds 30 does not outlast the drain deadline 45s",
    );
    broken(
        &|r| container(r, "ambit-agent").image = Some("localhost/ambit/ambit-agent:latest".into()),
        "image \"localhost/ambit/ambit-agent:latest\", want \"localhost/ambit/ambit-agent:0.1.0\"",
    );
    broken(
        &|r| {
            let c = container(r, "ambit-agent");
            let m = c
                .volume_mounts
                .as_mut()
                .expect("mounts")
                .iter_mut()
                .find(|m| m.mount_path == "/host/proc")
                .expect("proc");
            m.read_only = None;
        },
        "DaemonSet ambit-agent: /host/proc is not read-only",
    );
    broken(
        &|r| {
            let c = container(r, "ztunnel");
            for v in c.env.as_mut().expect("env") {
                if v.name == "INPOD_UDS" {
                    v.value = Some("/tmp/ztunnel.sock".into());
                }
            }
        },
        "the agent serves ZDS at Some(\"/var/run/ztunnel/ztunnel.sock\") on the host, the proxy dials None",
    );
    broken(
        &|r| {
            r.pdbs[0].spec.as_mut().expect("spec").max_unavailable =
                Some(ambit_objects::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0))
        },
        "PodDisruptionBudget ambit-control: allows 0 of 1 replicas to be evicted",
    );

    // A field the API does not have (here a wrong capitalisation) fails the typed parse.
    let text =
        run_helm(&args(&["template", "ambit", "deploy/charts/ambit", "-n", NAMESPACE])).expect("render");
    let typo = text.replacen("readOnlyRootFilesystem", "readOnlyRootFileSystem", 1);
    let err = Release::parse(&typo).expect_err("a misspelt field is refused");
    assert!(err.contains("the typed object differs from the rendered document at"), "{err}");
    assert!(err.contains("/securityContext/readOnlyRootFileSystem"), "{err}");
    assert_eq!(
        first_difference(&serde_json::json!({"a": [1, 2]}), &serde_json::json!({"a": [1, 3]}), String::new()),
        Some("/a/1".into())
    );
}

/// The environment and flags every rendered container gets are settings its binary reads.
#[test]
fn rendered_settings_are_ones_the_binaries_read() {
    let reference = chart::reference::load();
    let mut problems = Vec::new();
    for file in combinations() {
        let r = render(&["-f", &file]).expect("renders");
        problems.extend(
            chart::reference::unknown_settings(&r, &reference).into_iter().map(|p| format!("{file}: {p}")),
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // The comparison can fail: a variable no component reads, a flag of another component.
    let mut r = render(&[]).expect("renders");
    let d = r.daemon_sets.iter_mut().find(|d| d.metadata.name.as_deref() == Some("ztunnel")).expect("proxy");
    let c = &mut d.spec.as_mut().and_then(|s| s.template.spec.as_mut()).expect("spec").containers[0];
    c.env.get_or_insert_default().push(ambit_objects::k8s_openapi::api::core::v1::EnvVar {
        name: "INPOD_ENABLED".into(),
        value: Some("true".into()),
        ..Default::default()
    });
    c.args = Some(vec!["--exclude-namespaces=kube-system".into()]);
    let problems = chart::reference::unknown_settings(&r, &reference);
    assert_eq!(
        problems,
        [
            "ztunnel container proxy: sets INPOD_ENABLED, which `ambit proxy` does not read",
            "ztunnel container proxy: passes --exclude-namespaces, which `ambit proxy` does not accept",
        ]
    );
}

/// Every helm command of the guides renders (install and upgrade as `helm template`) and
/// holds the invariants; the guide names every documented combination; every object a
/// `kubectl` line names is one the chart renders.
#[test]
fn the_guides_commands_are_the_rendered_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut named_files = BTreeSet::new();
    let mut plain_install = false;
    let mut objects: BTreeSet<String> = render(&[]).expect("renders").names().into_iter().collect();
    objects.extend(render(&["-f", "deploy/charts/ambit/ci/istiod-values.yaml"]).expect("istiod").names());
    for guide in ["docs/install.md", "docs/migrate-from-istio.md"] {
        let text = std::fs::read_to_string(repo().join(guide)).unwrap_or_else(|e| panic!("{guide}: {e}"));
        let commands = chart::docs::commands(&text, &["helm", "kubectl"]);
        assert!(!commands.is_empty() || guide.ends_with("migrate-from-istio.md"), "{guide} has no commands");
        for cmd in commands {
            let at = format!("{guide}:{}", cmd.line);
            let w: Vec<&str> = cmd.words.iter().map(String::as_str).collect();
            match w.as_slice() {
                ["helm", "install" | "upgrade" | "template", ..] => {
                    let Some(t) = as_template(&cmd.words, dir.path(), &mut named_files) else { continue };
                    if t[2].starts_with("deploy/charts/ambit-crds") {
                        render_args(&t).unwrap_or_else(|e| panic!("{at}: {e}"));
                        continue;
                    }
                    let r = render_args(&t)
                        .unwrap_or_else(|e| panic!("{at}: `{}` does not render: {e}", cmd.words.join(" ")));
                    let problems = check(&r, &Values::of_args(&t[3..]).expect());
                    assert!(problems.is_empty(), "{at}: {problems:#?}");
                    plain_install |= guide == "docs/install.md"
                        && w[1] == "install"
                        && !t.iter().any(|a| a.starts_with('-') && a != "-n");
                }
                ["helm", "uninstall" | "lint" | "repo" | "list" | "status", ..] => {}
                ["helm", ..] => panic!("{at}: a helm command the test does not know: {w:?}"),
                ["kubectl", rest @ ..] => {
                    let mut names_ours = false;
                    for word in rest {
                        if let Some(image) = word.strip_prefix("--image=") {
                            let want = format!(
                                "{}/ambit:{}",
                                Values::defaults().expect().registry,
                                chart_app_version()
                            );
                            assert_eq!(image, want, "{at}: not the image the chart installs");
                        }
                        names_ours |= *word == "app=ztunnel";
                        let Some((kind, name)) = word.split_once('/') else { continue };
                        let kind = match kind {
                            "ds" | "daemonset" => "daemonset",
                            "deploy" | "deployment" => "deployment",
                            "svc" | "service" => "service",
                            "cm" | "configmap" => "configmap",
                            "secret" => "secret",
                            _ => continue,
                        };
                        let obj = format!("{kind}/{name}");
                        assert!(objects.contains(&obj), "{at}: {obj} is not an object the chart renders");
                        names_ours = true;
                    }
                    if names_ours {
                        let ns = rest
                            .iter()
                            .position(|w| *w == "-n" || *w == "--namespace")
                            .and_then(|i| rest.get(i + 1));
                        assert_eq!(
                            ns.copied(),
                            Some(NAMESPACE),
                            "{at}: the chart's objects are in {NAMESPACE}"
                        );
                    }
                }
                _ => {}
            }
        }
    }
    // The defaults are installed without -f; the guide says which file stands for them.
    let install = std::fs::read_to_string(repo().join("docs/install.md")).expect("install.md");
    let default = "deploy/charts/ambit/ci/default-values.yaml";
    if plain_install && install.contains(default) {
        named_files.insert(default.to_owned());
    }
    for file in combinations() {
        assert!(
            named_files.contains(&file),
            "docs/install.md never installs with {file}; document it or remove it"
        );
    }
    // Paths the guides mention exist.
    for guide in ["docs/install.md", "docs/migrate-from-istio.md"] {
        let text = std::fs::read_to_string(repo().join(guide)).expect("guide");
        for span in text.split('`').skip(1).step_by(2) {
            let path = span.split_whitespace().next().unwrap_or_default();
            if ["deploy/", "scripts/", "crates/", "docs/"].iter().any(|p| path.starts_with(p)) {
                let path = path.trim_end_matches([',', '.', ':', ')']);
                assert!(repo().join(path).exists(), "{guide} names {path}, which does not exist");
            }
        }
    }
}

/// `helm install|upgrade [--install] NAME CHART flags…` as `helm template` arguments; `None` for
/// charts that are not this repository's. Records the `-f` files; `--set-file` paths that are
/// examples get a generated certificate.
fn as_template(words: &[String], tmp: &Path, files: &mut BTreeSet<String>) -> Option<Vec<String>> {
    let mut rest: Vec<&str> = words[2..].iter().map(String::as_str).collect();
    rest.retain(|w| {
        !matches!(*w, "--install" | "--create-namespace" | "--wait" | "--atomic" | "--reuse-values")
    });
    let (release, chart) = (rest.first()?.to_string(), rest.get(1)?.to_string());
    if !chart.starts_with("deploy/charts/") {
        return None;
    }
    let mut out = vec!["template".to_owned(), release, chart];
    let mut it = rest[2..].iter();
    while let Some(&w) = it.next() {
        match w {
            "--timeout" => {
                it.next();
            }
            "-f" | "--values" => {
                let f = it.next().copied().unwrap_or_default();
                files.insert(f.to_owned());
                out.extend([w.to_owned(), f.to_owned()]);
            }
            "--set-file" => {
                let pair = it.next().copied().unwrap_or_default();
                let (key, path) = pair.split_once('=').unwrap_or((pair, ""));
                let path = if repo().join(path).exists() {
                    path.to_owned()
                } else {
                    let p = tmp.join(Path::new(path).file_name().unwrap_or_default());
                    std::fs::write(&p, self_signed_pem()).expect("write example file");
                    p.display().to_string()
                };
                out.extend(["--set-file".to_owned(), format!("{key}={path}")]);
            }
            other => out.push(other.to_owned()),
        }
    }
    Some(out)
}

fn self_signed_pem() -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).expect("self-signed").pem()
}

/// The charts carry the workspace's version (the images' tag; what the images hold is checked
/// on the built images by `tests/images.rs`).
#[test]
fn charts_carry_the_workspace_version() {
    let version = env!("CARGO_PKG_VERSION");
    for chart in ["deploy/charts/ambit/Chart.yaml", "deploy/charts/ambit-crds/Chart.yaml"] {
        let c = read_yaml(&repo().join(chart));
        assert_eq!(
            (c["version"].as_str(), c["appVersion"].as_str()),
            (Some(version), Some(version)),
            "{chart}"
        );
    }
    assert_eq!(chart_app_version(), version);
}

/// The Secret the chart generates is a bundle `ambit control` loads as a plugged-in CA, and the
/// ConfigMap's root verifies the serving certificate for the name the proxies dial.
#[tokio::test]
async fn the_generated_ca_is_one_ambit_control_serves_with() {
    let r = render(&[]).expect("renders");
    let secret = r.secrets.iter().find(|s| s.metadata.name.as_deref() == Some("cacerts")).expect("cacerts");
    let cacerts = tempfile::tempdir().expect("tempdir");
    for (key, value) in secret.data.clone().unwrap_or_default() {
        std::fs::write(cacerts.path().join(&key), &value.0).expect("write key");
    }
    let config = tempfile::tempdir().expect("config dir");
    let state = tempfile::tempdir().expect("state dir");
    let control = r.pod_spec("ambit-control").expect("control");
    let c = &control.containers[0];
    let custom = chart::pods::env(c, "ISTIOD_CUSTOM_HOST").expect("ISTIOD_CUSTOM_HOST");
    let [grpc, monitoring, ready] = free_ports();
    let child = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("control")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AMBIT_CONFIG_DIR", config.path())
        .env("ROOT_CA_DIR", cacerts.path())
        .env("AMBIT_CONTROL_STATE_DIR", state.path())
        .env("POD_NAMESPACE", NAMESPACE)
        .env("ISTIOD_CUSTOM_HOST", custom)
        .env("AMBIT_SECURE_GRPC_ADDR", format!("127.0.0.1:{grpc}"))
        .env("AMBIT_GRPC_ADDR", "")
        .env("AMBIT_MONITORING_ADDR", format!("127.0.0.1:{monitoring}"))
        .env("AMBIT_HTTP_ADDR", format!("127.0.0.1:{ready}"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ambit control");
    let mut child = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_status(ready, "/ready") != Some(200) {
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!("ambit control exited ({status}) with the chart's CA bundle:\n{}", child.stderr());
        }
        assert!(Instant::now() < deadline, "ambit control not ready in 30 s:\n{}", child.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    let root = r.config_maps[0].data.as_ref().and_then(|d| d.get("root-cert.pem")).expect("root").clone();
    let host = format!("ambit-control.{NAMESPACE}.svc");
    tls_handshake(grpc, &host, &root)
        .await
        .unwrap_or_else(|e| panic!("TLS to {host} with the ConfigMap's root: {e}"));
    let _ = child.0.kill();
    let _ = child.0.wait();
    let log = child.stderr();
    assert!(log.contains("Plugged"), "the CA was not the plugged-in bundle:\n{log}");
}

/// A child killed when the test ends, whatever happens.
struct Killed(Child);

impl Killed {
    fn stderr(&mut self) -> String {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut s = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_ports() -> [u16; 3] {
    let listeners: Vec<std::net::TcpListener> =
        (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    let ports: Vec<u16> = listeners.iter().map(|l| l.local_addr().expect("addr").port()).collect();
    [ports[0], ports[1], ports[2]]
}

/// The status code of `GET path` on 127.0.0.1:port, if it answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

async fn tls_handshake(port: u16, host: &str, root_pem: &str) -> Result<(), String> {
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};
    let mut roots = RootCertStore::empty();
    for cert in <rustls_pki_types::CertificateDer<'_> as rustls_pki_types::pem::PemObject>::pem_slice_iter(
        root_pem.as_bytes(),
    ) {
        roots.add(cert.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let mut cfg = ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_owned())?
        .map(drop)
        .map_err(|e| e.to_string())
}
