use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use tempfile::TempDir;

use super::*;

pub(super) const OURS: &str = "ambit-cni";

/// A node's CNI dirs in a temp dir: `net.d`, two bin dirs, and the plugin binary to ship.
pub(super) struct Env {
    _dir: TempDir,
    pub conf: PathBuf,
    pub bins: Vec<PathBuf>,
    pub source: PathBuf,
}

impl Env {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("net.d");
        let bins = vec![dir.path().join("bin1"), dir.path().join("bin2")];
        fs::create_dir(&conf).expect("mkdir");
        let source = dir.path().join("ambit-cni-src");
        fs::write(&source, b"\x7fELF pretend plugin v2").expect("write source");
        Self { _dir: dir, conf, bins, source }
    }

    pub fn config(&self, chained: bool) -> InstallConfig {
        InstallConfig {
            cni_bin_dirs: self.bins.clone(),
            conf_dir: self.conf.clone(),
            conf_name: None,
            chained,
            plugin_binary: self.source.clone(),
            plugin_name: OURS.into(),
            plugin_entry: entry(),
            conf_mode_group_read: false,
        }
    }

    pub fn installer(&self) -> Installer {
        Installer::new(self.config(true)).expect("installer")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.conf.join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        fs::write(&path, text).expect("write conf");
        path
    }

    pub fn read(&self, name: &str) -> String {
        fs::read_to_string(self.path(name)).expect("read conf")
    }

    /// Names in the conf dir, sorted.
    pub fn listing(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.conf)
            .expect("readdir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

pub(super) fn entry() -> Map<String, Value> {
    let v = json!({
        "type": OURS,
        "name": OURS,
        "cni_agent_run_dir": "/var/run/ambit",
        "exclude_namespaces": ["kube-system"],
        "pod_namespace": "ambit-system",
        "plugin_log_level": "info",
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

pub(super) const CALICO: &str = r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"calico","ipam":{"type":"calico-ipam"}},{"type":"portmap","capabilities":{"portMappings":true}}]}"#;

const OUR_ENTRY_GOLDEN: &str = r#"    {
      "cni_agent_run_dir": "/var/run/ambit",
      "exclude_namespaces": [
        "kube-system"
      ],
      "name": "ambit-cni",
      "plugin_log_level": "info",
      "pod_namespace": "ambit-system",
      "type": "ambit-cni"
    }"#;

fn calico_golden() -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {{
      "ipam": {{
        "type": "calico-ipam"
      }},
      "type": "calico"
    }},
    {{
      "capabilities": {{
        "portMappings": true
      }},
      "type": "portmap"
    }},
{OUR_ENTRY_GOLDEN}
  ]
}}
"#
    )
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("stat").permissions().mode() & 0o7777
}

fn installed(config: &Path) -> InstallOutcome {
    InstallOutcome::Installed { config: config.to_owned(), changed: true }
}

#[test]
fn conflist_insert_golden_and_idempotent() {
    let env = Env::new();
    let path = env.write("10-calico.conflist", CALICO);
    let inst = env.installer();
    assert!(!inst.validate().is_valid());
    assert_eq!(inst.install().expect("install"), installed(&path));
    assert_eq!(env.read("10-calico.conflist"), calico_golden());
    assert!(inst.validate().is_valid(), "{}", inst.validate());

    let before = fs::metadata(&path).expect("stat").modified().expect("mtime");
    let second = inst.install().expect("second pass");
    assert_eq!(second, InstallOutcome::Installed { config: path.clone(), changed: false });
    assert_eq!(env.read("10-calico.conflist"), calico_golden());
    let after = fs::metadata(&path).expect("stat").modified().expect("mtime");
    assert_eq!(before, after, "an idempotent pass must not rewrite the file");
    assert_eq!(env.listing(), ["10-calico.conflist"], "no temp files left behind");
}

#[test]
fn conflist_stale_entry_is_replaced_and_moved_last() {
    let env = Env::new();
    env.write(
        "10-calico.conflist",
        r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[
            {"type":"calico","ipam":{"type":"calico-ipam"}},
            {"type":"ambit-cni","name":"ambit-cni","pod_namespace":"old"},
            {"type":"portmap","capabilities":{"portMappings":true}},
            {"type":"ambit-cni"}]}"#,
    );
    let inst = env.installer();
    assert!(matches!(inst.validate().problems().first(), Some(Problem::StaleEntry(_))));
    inst.install().expect("install");
    assert_eq!(env.read("10-calico.conflist"), calico_golden());
}

#[test]
fn a_node_migrating_from_istio_cni_keeps_no_istio_cni_entry() {
    // What istio-cni leaves in the primary config: its entry last, with its own settings.
    let env = Env::new();
    let path = env.write(
        "10-calico.conflist",
        r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[
            {"type":"calico","ipam":{"type":"calico-ipam"}},
            {"type":"portmap","capabilities":{"portMappings":true}},
            {"type":"istio-cni","name":"istio-cni","cni_agent_run_dir":"/var/run/istio-cni",
             "plugin_log_level":"info","exclude_namespaces":["kube-system"]}]}"#,
    );
    let inst = env.installer();
    let v = inst.validate();
    assert!(
        matches!(v.problems().first(), Some(Problem::StaleEntry(p)) if *p == path),
        "an istio-cni entry is a problem to repair: {v}"
    );
    assert_eq!(inst.install().expect("install"), installed(&path));
    let text = env.read("10-calico.conflist");
    assert_eq!(text, calico_golden(), "istio-cni's entry is replaced by ours in one write");
    assert!(!text.contains("istio-cni"), "{text}");
    assert!(inst.validate().is_valid(), "{}", inst.validate());

    // istio-cni's own DaemonSet, still running during a migration, puts its entry back: the
    // next pass takes it out again.
    let mut doc: Value = serde_json::from_str(&text).expect("json");
    doc["plugins"].as_array_mut().expect("plugins").push(json!({"type": "istio-cni", "name": "istio-cni"}));
    fs::write(&path, serde_json::to_string(&doc).expect("json")).expect("write");
    assert!(!inst.validate().is_valid());
    inst.install().expect("repair");
    assert_eq!(env.read("10-calico.conflist"), calico_golden());
}

#[test]
fn conf_is_converted_to_conflist() {
    let env = Env::new();
    let conf = env.write(
        "10-flannel.conf",
        r#"{"cniVersion":"0.4.0","name":"cbr0","type":"flannel","delegate":{"isDefaultGateway":true}}"#,
    );
    fs::set_permissions(&conf, fs::Permissions::from_mode(0o644)).expect("chmod");
    let inst = env.installer();
    let list = env.path("10-flannel.conflist");
    assert_eq!(inst.install().expect("install"), installed(&list));
    assert_eq!(env.listing(), ["10-flannel.conflist"]);
    let want = format!(
        r#"{{
  "ambit_converted_from_conf": true,
  "cniVersion": "0.4.0",
  "name": "cbr0",
  "plugins": [
    {{
      "delegate": {{
        "isDefaultGateway": true
      }},
      "name": "cbr0",
      "type": "flannel"
    }},
{OUR_ENTRY_GOLDEN}
  ]
}}
"#
    );
    assert_eq!(env.read("10-flannel.conflist"), want);
    assert_eq!(mode(&list), 0o644, "the converted list keeps the .conf's mode");
    assert!(inst.validate().is_valid(), "{}", inst.validate());
}

#[test]
fn conversion_refuses_to_overwrite_a_foreign_conflist() {
    let env = Env::new();
    env.write("10-net.conf", r#"{"name":"n","type":"bridge"}"#);
    env.write("10-net.conflist", r#"{"name":"other","plugins":[{"type":"x"}]}"#);
    let err = env.installer().install().expect_err("must refuse");
    assert!(matches!(err, InstallError::ConflistExists { .. }), "{err}");
    assert!(err.to_string().contains("10-net.conflist"), "{err}");
}

#[test]
fn reconverts_a_conf_dropped_again_over_our_conversion() {
    let env = Env::new();
    let original = r#"{"name":"n","type":"bridge"}"#;
    env.write("10-net.conf", original);
    let inst = env.installer();
    inst.install().expect("install");
    // The primary CNI's installer writes its .conf again.
    env.write("10-net.conf", original);
    inst.install().expect("reinstall");
    assert_eq!(env.listing(), ["10-net.conflist"]);
    assert!(inst.validate().is_valid(), "{}", inst.validate());
}

#[test]
fn standalone_writes_our_own_file() {
    let env = Env::new();
    env.write("10-calico.conflist", CALICO);
    let inst = Installer::new(env.config(false)).expect("installer");
    let path = env.path("YYY-ambit-cni.conf");
    assert_eq!(inst.install().expect("install"), installed(&path));
    let want = r#"{
  "cniVersion": "0.3.1",
  "cni_agent_run_dir": "/var/run/ambit",
  "exclude_namespaces": [
    "kube-system"
  ],
  "name": "ambit-cni",
  "plugin_log_level": "info",
  "pod_namespace": "ambit-system",
  "type": "ambit-cni"
}
"#;
    assert_eq!(env.read("YYY-ambit-cni.conf"), want);
    assert_eq!(mode(&path), 0o600);
    assert_eq!(env.read("10-calico.conflist"), CALICO, "the primary is untouched");
    assert!(inst.validate().is_valid(), "{}", inst.validate());
    let second = inst.install().expect("second pass");
    assert_eq!(second, InstallOutcome::Installed { config: path, changed: false });

    let env = Env::new();
    let mut cfg = env.config(false);
    cfg.conf_mode_group_read = true;
    cfg.conf_name = Some("05-ambit.conf".into());
    Installer::new(cfg).expect("installer").install().expect("install");
    assert_eq!(mode(&env.path("05-ambit.conf")), 0o640);
}

#[test]
fn existing_mode_is_preserved() {
    for m in [0o644, 0o600, 0o640] {
        let env = Env::new();
        let path = env.write("10-calico.conflist", CALICO);
        fs::set_permissions(&path, fs::Permissions::from_mode(m)).expect("chmod");
        env.installer().install().expect("install");
        assert_eq!(mode(&path), m);
    }
}

#[test]
fn binaries_are_copied_executable_and_stale_temps_removed() {
    let env = Env::new();
    fs::create_dir(&env.bins[0]).expect("mkdir");
    let stale = env.bins[0].join("ambit-cni.tmp.1234.0");
    fs::write(&stale, b"half a binary").expect("write");
    let other = env.bins[0].join("bridge");
    fs::write(&other, b"someone else's").expect("write");
    env.write("10-calico.conflist", CALICO);
    let inst = env.installer();
    inst.install().expect("install");
    let source = fs::read(&env.source).expect("read source");
    for dir in &env.bins {
        let bin = dir.join(OURS);
        assert_eq!(fs::read(&bin).expect("read"), source);
        assert_eq!(mode(&bin), 0o755);
    }
    assert!(!stale.exists(), "stale temp file must be removed");
    assert!(other.exists(), "other plugins are left alone");

    // A changed or missing binary is noticed and put back.
    fs::write(env.bins[1].join(OURS), b"\x7fELF pretend plugin v1").expect("write");
    fs::remove_file(env.bins[0].join(OURS)).expect("rm");
    let problems: Vec<String> = inst.validate().problems().iter().map(|p| p.to_string()).collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("bin1/ambit-cni is missing"), "{problems:?}");
    assert!(problems[1].contains("bin2/ambit-cni differs"), "{problems:?}");
    inst.install().expect("repair");
    assert!(inst.validate().is_valid(), "{}", inst.validate());
}

#[test]
fn primary_is_first_loadable_file_in_kubelet_order() {
    let env = Env::new();
    env.write("00-broken.conflist", "{ not json");
    env.write("01-not-array.conflist", r#"{"name":"x","plugins":{"type":"a"}}"#);
    env.write("02-empty.conf", "");
    env.write("03-only-ours.conflist", r#"{"name":"x","plugins":[{"type":"ambit-cni"}]}"#);
    let huge = format!(r#"{{"name":"x","type":"bridge","pad":"{}"}}"#, "a".repeat(2 << 20));
    env.write("04-huge.conf", &huge);
    env.write("05-ignored.json", r#"{"name":"x","type":"bridge"}"#);
    // A FIFO must be skipped, not opened (which would block forever).
    let fifo = env.path("06-fifo.conf");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    env.write("10-calico.conflist", CALICO);
    env.write("20-other.conflist", r#"{"name":"o","plugins":[{"type":"o"}]}"#);
    let inst = env.installer();
    inst.install().expect("install");
    assert_eq!(env.read("10-calico.conflist"), calico_golden());
    assert_eq!(env.read("00-broken.conflist"), "{ not json");
    assert_eq!(env.read("20-other.conflist"), r#"{"name":"o","plugins":[{"type":"o"}]}"#);
    assert!(inst.validate().is_valid(), "{}", inst.validate());
}

#[test]
fn waits_for_a_primary_and_writes_no_config() {
    let env = Env::new();
    env.write("00-broken.conflist", r#"{"name":"x","plugins":[]}"#);
    let inst = env.installer();
    assert_eq!(inst.install().expect("install"), InstallOutcome::WaitingForPrimary);
    assert_eq!(env.listing(), ["00-broken.conflist"]);
    assert!(env.bins.iter().all(|d| d.join(OURS).exists()), "binaries go in first");
    assert!(matches!(inst.validate().problems(), [Problem::NoPrimaryConfig(_)]));

    // A conf dir that does not exist yet is the same situation.
    let mut cfg = env.config(true);
    cfg.conf_dir = env.conf.join("missing");
    let inst = Installer::new(cfg).expect("installer");
    assert_eq!(inst.install().expect("install"), InstallOutcome::WaitingForPrimary);
}

#[test]
fn configured_conf_name_and_its_sibling() {
    let env = Env::new();
    env.write("10-calico.conflist", CALICO);
    env.write("20-other.conflist", r#"{"name":"o","plugins":[{"type":"o"}]}"#);
    let mut cfg = env.config(true);
    cfg.conf_name = Some("20-other.conf".into());
    let inst = Installer::new(cfg).expect("installer");
    let want = env.path("20-other.conflist");
    assert_eq!(inst.install().expect("install"), installed(&want));
    assert_eq!(env.read("10-calico.conflist"), CALICO);
    assert!(inst.validate().is_valid(), "{}", inst.validate());

    let mut cfg = env.config(true);
    cfg.conf_name = Some("30-missing.conflist".into());
    let inst = Installer::new(cfg).expect("installer");
    assert_eq!(inst.install().expect("install"), InstallOutcome::WaitingForPrimary);

    env.write("40-bad.conflist", r#"{"name":"b","plugins":"no"}"#);
    let mut cfg = env.config(true);
    cfg.conf_name = Some("40-bad.conflist".into());
    let err = Installer::new(cfg).expect("installer").install().expect_err("bad file");
    let text = err.to_string();
    assert!(text.contains("40-bad.conflist") && text.contains("not an array"), "{text}");
}

#[test]
fn new_higher_priority_config_gets_our_entry() {
    let env = Env::new();
    env.write("10-calico.conflist", CALICO);
    let inst = env.installer();
    inst.install().expect("install");
    env.write("05-cilium.conflist", r#"{"name":"cilium","plugins":[{"type":"cilium-cni"}]}"#);
    assert!(
        matches!(inst.validate().problems(), [Problem::NotChained(p)] if p.ends_with("05-cilium.conflist"))
    );
    inst.install().expect("repair");
    assert!(env.read("05-cilium.conflist").contains("\"type\": \"ambit-cni\""));
    assert!(inst.validate().is_valid(), "{}", inst.validate());
}

#[test]
fn uninstall_removes_everything_and_restores_the_conf() {
    let env = Env::new();
    let flannel =
        r#"{"cniVersion":"0.4.0","name":"cbr0","type":"flannel","delegate":{"isDefaultGateway":true}}"#;
    let conf = env.write("10-flannel.conf", flannel);
    fs::set_permissions(&conf, fs::Permissions::from_mode(0o644)).expect("chmod");
    let calico = env.write("20-calico.conflist", CALICO);
    fs::set_permissions(&calico, fs::Permissions::from_mode(0o640)).expect("chmod");
    env.write("00-broken.conflist", "][");
    let inst = env.installer();
    inst.install().expect("install");
    // An earlier primary that kept our entry, and a leftover standalone file.
    fs::write(&calico, calico_golden()).expect("write");
    env.write("YYY-ambit-cni.conf", r#"{"cniVersion":"0.3.1","type":"ambit-cni"}"#);

    inst.uninstall().expect("uninstall");
    assert_eq!(env.listing(), ["00-broken.conflist", "10-flannel.conf", "20-calico.conflist"]);
    let restored: Value = serde_json::from_str(&env.read("10-flannel.conf")).expect("json");
    let original: Value = serde_json::from_str(flannel).expect("json");
    assert_eq!(restored, original);
    assert_eq!(mode(&conf), 0o644);
    let calico_now: Value = serde_json::from_str(&env.read("20-calico.conflist")).expect("json");
    let calico_then: Value = serde_json::from_str(CALICO).expect("json");
    assert_eq!(calico_now, calico_then);
    assert_eq!(mode(&calico), 0o640);
    assert!(env.bins.iter().all(|d| !d.join(OURS).exists()));
    // Nothing left to do the second time.
    inst.uninstall().expect("second uninstall");
}

#[test]
fn uninstall_keeps_a_list_the_owner_extended() {
    let env = Env::new();
    env.write("10-net.conf", r#"{"name":"n","type":"bridge"}"#);
    let inst = env.installer();
    inst.install().expect("install");
    let text = env.read("10-net.conflist").replace(r#""plugins": ["#, r#""plugins": [{"type": "portmap"},"#);
    env.write("10-net.conflist", &text);
    inst.uninstall().expect("uninstall");
    assert_eq!(env.listing(), ["10-net.conflist"]);
    let doc: Value = serde_json::from_str(&env.read("10-net.conflist")).expect("json");
    let want = json!({"name": "n", "plugins": [{"type": "portmap"}, {"name": "n", "type": "bridge"}]});
    assert_eq!(doc, want);
}

#[test]
fn bad_installer_config_is_refused() {
    let env = Env::new();
    type Edit = Box<dyn Fn(&mut InstallConfig)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("plugin name", Box::new(|c| c.plugin_name = "../x".into())),
        ("no CNI bin dir", Box::new(|c| c.cni_bin_dirs.clear())),
        ("conf name", Box::new(|c| c.conf_name = Some("net.json".into()))),
        (
            "standalone",
            Box::new(|c| {
                c.chained = false;
                c.conf_name = Some("a.conflist".into());
            }),
        ),
        (
            "differs",
            Box::new(|c| {
                c.plugin_entry.insert("type".into(), json!("other"));
            }),
        ),
    ];
    for (want, edit) in cases {
        let mut cfg = env.config(true);
        edit(&mut cfg);
        let err = Installer::new(cfg).expect_err(want).to_string();
        assert!(err.contains(want), "{want}: {err}");
    }
    let mut cfg = env.config(true);
    cfg.plugin_binary = env.conf.join("nope");
    let err = Installer::new(cfg).expect("installer").install().expect_err("no source");
    assert!(err.to_string().contains("nope"), "{err}");
}
