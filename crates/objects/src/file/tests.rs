use std::path::Path;

use super::*;

fn write(dir: &Path, name: &str, text: &str) {
    // Via a rename, as editors and `kubectl`-style tools do; the stamp changes with the inode.
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, dir.join(name)).expect("rename");
}

fn pod(name: &str, node: &str, extra_label: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: demo\n  uid: uid-{name}\n  labels:\n    app: {extra_label}\n\
         spec:\n  nodeName: {node}\n  containers:\n  - name: app\n    image: app\nstatus:\n  podIP: 10.0.0.1\n"
    )
}

fn keys(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| match c {
            Change::Upsert(o) => format!("upsert {}", o.key()),
            Change::Delete(k) => format!("delete {k}"),
        })
        .collect()
}

fn errors(src: &FileSource) -> Vec<String> {
    src.errors().iter().map(ToString::to_string).collect()
}

#[test]
fn reads_documents_lists_and_filters() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        "mesh.yaml",
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n---\n{}---\n{}---\n\
             apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: vs\n  namespace: demo\n---\n\
             apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n  name: strict\n  namespace: demo\n\
             spec:\n  mtls:\n    mode: STRICT\n",
            pod("a", "n1", "a"),
            pod("b", "n2", "b")
        ),
    );
    write(
        dir.path(),
        "list.yml",
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata:\n    name: web\n    namespace: demo\n",
    );
    write(dir.path(), "notes.txt", "not read");
    write(dir.path(), ".hidden.yaml", "kind: [unclosed");

    let mut all = FileSource::new(dir.path(), Filter::all());
    assert!(!all.is_synced());
    let got = keys(&all.poll());
    assert_eq!(
        got,
        [
            "upsert Namespace demo",
            "upsert Pod demo/a",
            "upsert Pod demo/b",
            "upsert Service demo/web",
            "upsert PeerAuthentication demo/strict"
        ],
        "unknown kinds (VirtualService) are skipped, List items read"
    );
    assert!(all.is_synced());
    assert!(all.errors().is_empty(), "{:?}", errors(&all));
    assert!(all.poll().is_empty(), "unchanged");

    let mut agent = FileSource::new(dir.path(), Filter::kinds(&[Kind::Namespace, Kind::Pod]).pods_on("n1"));
    assert_eq!(
        keys(&agent.poll()),
        ["upsert Namespace demo", "upsert Pod demo/a"],
        "kinds and node filtered"
    );
}

#[test]
fn one_edited_object_among_many_is_one_upsert() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pods = |changed: &str| -> String {
        (0..50)
            .map(|i| pod(&format!("p{i}"), "n1", if i == 17 { changed } else { "same" }))
            .collect::<Vec<_>>()
            .join("---\n")
    };
    write(dir.path(), "pods.yaml", &pods("before"));
    write(dir.path(), "other.yaml", &pod("q", "n1", "q"));
    let mut src = FileSource::new(dir.path(), Filter::all());
    assert_eq!(src.poll().len(), 51);
    write(dir.path(), "pods.yaml", &pods("after"));
    let changes = src.poll();
    assert_eq!(keys(&changes), ["upsert Pod demo/p17"]);
    let Change::Upsert(Object::Pod(p)) = &changes[0] else { panic!("a pod upsert") };
    assert_eq!(p.metadata.labels.as_ref().and_then(|l| l.get("app")).map(String::as_str), Some("after"));
    // Rewriting the same content changes the stamp but no object.
    write(dir.path(), "pods.yaml", &pods("after"));
    assert!(src.poll().is_empty());
}

#[test]
fn deleting_a_file_deletes_its_objects() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "a.yaml", &format!("{}---\n{}", pod("a1", "n1", "x"), pod("a2", "n1", "x")));
    write(dir.path(), "b.yaml", &pod("b", "n1", "x"));
    let mut src = FileSource::new(dir.path(), Filter::all());
    assert_eq!(src.poll().len(), 3);
    std::fs::remove_file(dir.path().join("a.yaml")).expect("remove");
    assert_eq!(keys(&src.poll()), ["delete Pod demo/a1", "delete Pod demo/a2"]);
    assert!(src.poll().is_empty());
}

#[test]
fn a_broken_edit_keeps_the_old_objects_and_names_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = format!("{}---\n{}", pod("a", "n1", "x"), pod("b", "n1", "x"));
    write(dir.path(), "pods.yaml", &good);
    let mut src = FileSource::new(dir.path(), Filter::all());
    assert_eq!(src.poll().len(), 2);
    let path = dir.path().join("pods.yaml").display().to_string();

    // Not YAML: an unclosed flow sequence on line 3.
    write(dir.path(), "pods.yaml", "apiVersion: v1\nkind: Pod\nmetadata: [unclosed\n");
    assert!(src.poll().is_empty(), "no object of the broken file is deleted");
    assert_eq!(errors(&src), [format!("{path}:3:11: not valid YAML: unclosed bracket '['")]);

    // YAML, but the second document is a Pod that does not decode (labels must be a map);
    // the error names the field, at its own line and column.
    let bad_doc = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: b\n  namespace: demo\n  labels: [1, 2]\n";
    let text = format!("{}---\n{bad_doc}", pod("a", "n1", "changed"));
    write(dir.path(), "pods.yaml", &text);
    assert!(src.poll().is_empty(), "a file with one bad document is not applied at all");
    let line = text.lines().position(|l| l == "  labels: [1, 2]").expect("labels") + 1;
    assert_eq!(
        errors(&src),
        [format!("{path}:{line}:11: Pod demo/b: metadata.labels: invalid type: sequence, expected a map")]
    );

    // A document without apiVersion is reported, not skipped.
    write(dir.path(), "pods.yaml", "kind: Pod\nmetadata:\n  name: a\n");
    src.poll();
    assert_eq!(
        errors(&src),
        [format!("{path}:1:1: not a Kubernetes object: the document has no apiVersion")]
    );

    // So is a List item that is not an object.
    write(dir.path(), "pods.yaml", "apiVersion: v1\nkind: List\nitems:\n- just a string\n");
    src.poll();
    assert_eq!(
        errors(&src),
        [format!(
            "{path}:1:1: not a Kubernetes object: a document must be a mapping with apiVersion, kind and metadata"
        )]
    );

    // Fixed: the error goes, and only what differs from the last good version changes.
    write(dir.path(), "pods.yaml", &format!("{}---\n{}", pod("a", "n1", "x"), pod("b", "n1", "fixed")));
    assert_eq!(keys(&src.poll()), ["upsert Pod demo/b"]);
    assert!(src.errors().is_empty());
}

#[test]
fn the_same_object_in_two_files_is_an_error_and_the_first_keeps_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "b.yaml", &pod("web", "n1", "from-b"));
    let mut src = FileSource::new(dir.path(), Filter::all());
    assert_eq!(src.poll().len(), 1);
    // a.yaml sorts first but comes later: b.yaml keeps the pod, a.yaml is refused.
    write(dir.path(), "a.yaml", &format!("{}---\n{}", pod("other", "n1", "x"), pod("web", "n1", "from-a")));
    assert!(src.poll().is_empty(), "nothing of the refused file is applied");
    let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
    let line = pod("other", "n1", "x").lines().count() + 2;
    assert_eq!(
        errors(&src),
        [format!(
            "{}:{line}:1: Pod demo/web is defined twice: also in {} at line 1; delete one of them",
            a.display(),
            b.display()
        )]
    );
    // Removing it from b.yaml lets a.yaml in, with no error left.
    write(dir.path(), "b.yaml", "");
    let changes = src.poll();
    assert_eq!(keys(&changes), ["upsert Pod demo/other", "upsert Pod demo/web"]);
    assert!(src.errors().is_empty(), "{:?}", errors(&src));
    // Twice in one file is an error too.
    write(dir.path(), "c.yaml", &format!("{}---\n{}", pod("c", "n1", "x"), pod("c", "n1", "yes")));
    assert!(src.poll().is_empty());
    let c = dir.path().join("c.yaml");
    assert_eq!(
        errors(&src),
        [format!(
            "{}:{line}:1: Pod demo/c is defined twice: also in {} at line 1; delete one of them",
            c.display(),
            c.display()
        )]
    );
}

#[test]
fn an_object_moved_between_files_in_one_step_is_no_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "z.yaml", &pod("web", "n1", "x"));
    let mut src = FileSource::new(dir.path(), Filter::all());
    assert_eq!(src.poll().len(), 1);
    write(dir.path(), "a.yaml", &pod("web", "n1", "x"));
    write(dir.path(), "z.yaml", "");
    assert!(src.poll().is_empty(), "same object, other file: no change");
    assert!(src.errors().is_empty(), "{:?}", errors(&src));
    std::fs::remove_file(dir.path().join("z.yaml")).expect("remove");
    assert!(src.poll().is_empty());
    std::fs::remove_file(dir.path().join("a.yaml")).expect("remove");
    assert_eq!(keys(&src.poll()), ["delete Pod demo/web"]);
}

#[test]
fn a_missing_folder_is_reported_and_keeps_the_objects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sub = dir.path().join("src");
    std::fs::create_dir(&sub).expect("mkdir");
    write(&sub, "a.yaml", &pod("a", "n1", "x"));
    let mut src = FileSource::new(&sub, Filter::all());
    assert_eq!(src.poll().len(), 1);
    std::fs::rename(&sub, dir.path().join("moved")).expect("rename");
    assert!(src.poll().is_empty());
    let errs = errors(&src);
    assert!(errs.len() == 1 && errs[0].starts_with(&format!("{}: cannot read: ", sub.display())), "{errs:?}");
}

#[test]
fn too_large_files_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = std::fs::File::create(dir.path().join("big.yaml")).expect("create");
    f.set_len(MAX_FILE_BYTES + 1).expect("grow");
    let mut src = FileSource::new(dir.path(), Filter::all());
    assert!(src.poll().is_empty());
    assert_eq!(
        errors(&src),
        [format!(
            "{}: the file has {} bytes, more than the {MAX_FILE_BYTES} read; split it into several files",
            dir.path().join("big.yaml").display(),
            MAX_FILE_BYTES + 1
        )]
    );
}

fn redirection(change: &Change) -> Option<String> {
    let Change::Upsert(Object::Pod(p)) = change else { panic!("a pod upsert: {change:?}") };
    p.metadata.annotations.as_ref().and_then(|a| a.get(crate::REDIRECTION)).cloned()
}

#[test]
fn capture_state_is_laid_over_pods() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (objects, state) = (dir.path().join("objects"), dir.path().join("state"));
    std::fs::create_dir_all(&objects).expect("mkdir");
    std::fs::create_dir_all(&state).expect("mkdir");
    write(&objects, "pods.yaml", &format!("{}---\n{}", pod("a", "n1", "x"), pod("b", "n2", "x")));
    let mut src = FileSource::new(&objects, Filter::all()).with_capture_state(&state);
    let first = src.poll();
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|c| redirection(c).is_none()));

    let entry = |name: &str, uid: &str, value: &str| CapturedPod {
        namespace: "demo".into(),
        name: name.into(),
        uid: uid.into(),
        redirection: value.into(),
    };
    let mut n1 = CaptureState::new("n1");
    n1.pods = vec![entry("a", "uid-a", "enabled"), entry("b", "uid-b", "enabled")];
    n1.write(&state).expect("write");
    let changes = src.poll();
    // b runs on n2: n1's agent cannot speak for it.
    assert_eq!(keys(&changes), ["upsert Pod demo/a"]);
    assert_eq!(redirection(&changes[0]).as_deref(), Some("enabled"));
    assert!(src.poll().is_empty());

    // Another uid (a pod recreated under the same name) does not inherit the value.
    n1.pods = vec![entry("a", "uid-old", "enabled")];
    n1.write(&state).expect("write");
    let changes = src.poll();
    assert_eq!(keys(&changes), ["upsert Pod demo/a"]);
    assert_eq!(redirection(&changes[0]), None);

    let mut n2 = CaptureState::new("n2");
    n2.pods = vec![entry("b", "uid-b", "pending")];
    n2.write(&state).expect("write");
    let changes = src.poll();
    assert_eq!(keys(&changes), ["upsert Pod demo/b"]);
    assert_eq!(redirection(&changes[0]).as_deref(), Some("pending"));

    // A broken state file keeps what it said; the error names it.
    std::fs::write(state.join("n2.json"), "{\"node\": \"n2\", \"pods\": [}").expect("write");
    assert!(src.poll().is_empty());
    let errs = errors(&src);
    assert!(
        errs.len() == 1 && errs[0].starts_with(&format!("{}:1:", state.join("n2.json").display())),
        "{errs:?}"
    );
    // Removing the file removes the annotation.
    std::fs::remove_file(state.join("n2.json")).expect("remove");
    let changes = src.poll();
    assert_eq!(keys(&changes), ["upsert Pod demo/b"]);
    assert_eq!(redirection(&changes[0]), None);
    assert!(src.errors().is_empty());
}

#[test]
fn capture_state_is_written_atomically() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = CaptureState::new("node-1");
    s.pods = vec![
        CapturedPod {
            namespace: "demo".into(),
            name: "z".into(),
            uid: "u2".into(),
            redirection: "enabled".into(),
        },
        CapturedPod {
            namespace: "demo".into(),
            name: "a".into(),
            uid: "u1".into(),
            redirection: "pending".into(),
        },
    ];
    s.write(dir.path()).expect("write");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["node-1.json"], "no temporary file left");
    let back: CaptureState =
        serde_json::from_slice(&std::fs::read(dir.path().join("node-1.json")).expect("read")).expect("json");
    assert_eq!(back.pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a", "z"], "sorted");
    assert!(matches!(CaptureState::new("../x").write(dir.path()), Err(CaptureError::NodeName(_))));
}

/// Every YAML file the repository ships or tests with (the demo, the control plane's golden
/// cases), decoded strictly: no false unknown field, no refused value.
#[test]
fn the_repositorys_yaml_decodes_strictly() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![root.join("examples/demo/demo.yaml")];
    let mut dirs = vec![root.join("crates/control/tests/golden")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("golden folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml")
                // The cases' objects (`NN-*.yaml`, `common.yaml`), not their settings or expectations.
                && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n == "common.yaml" || n.starts_with(|c: char| c.is_ascii_digit())
                })
            {
                files.push(path);
            }
        }
    }
    let (mut decoded, mut refused) = (0, Vec::new());
    for path in &files {
        let text = std::fs::read_to_string(path).expect("read");
        let docs = documents(&text).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        // The golden cases' `delete:` steps are not objects.
        let docs = docs.into_iter().filter(|(d, _)| !d.is_null() && d.get("delete").is_none());
        for (value, at) in docs {
            let line = at.line;
            let [(value, _)] = <[_; 1]>::try_from(items(value).expect("an object")).expect("one object");
            let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_owned();
            let result = match kind.as_str() {
                "Deployment" => crate::strict::decode::<Deployment>(&value, Decoding::Strict)
                    .map(drop)
                    .map_err(|e| e.to_string()),
                "ServiceAccount" => crate::strict::decode::<ServiceAccount>(&value, Decoding::Strict)
                    .map(drop)
                    .map_err(|e| e.to_string()),
                _ => match Object::decode(value, Decoding::Strict) {
                    Ok(_) | Err(ObjectError::UnknownKind { .. } | ObjectError::Missing { .. }) => Ok(()),
                    Err(e) => Err(e.to_string()),
                },
            };
            if let Err(e) = result {
                let shown = path.strip_prefix(&root).unwrap_or(path).display().to_string();
                refused.push(format!("{shown}:{line}: {e}"));
            }
            decoded += 1;
        }
    }
    assert!(files.len() > 10 && decoded > 50, "{} files, {decoded} objects", files.len());
    // The only refusals are on purpose: the golden case that shows the translation failing closed
    // on wrong-case values from the Kubernetes API (decoded leniently there).
    assert_eq!(
        refused,
        [
            r#"crates/control/tests/golden/policy-not-sent/00.yaml:40: AuthorizationPolicy ns/typo: spec.action: Unsupported value: "deny": supported values: "ALLOW", "DENY", "AUDIT", "CUSTOM""#,
            r#"crates/control/tests/golden/policy-not-sent/00.yaml:46: PeerAuthentication ns/typo: spec.mtls.mode: Unsupported value: "Strict": supported values: "UNSET", "DISABLE", "PERMISSIVE", "STRICT""#,
        ]
    );
}

/// What the API server returns (managedFields, status, timestamps, `null`s) is no unknown field.
#[test]
fn what_the_api_server_returns_decodes_strictly() {
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "web-0", "namespace": "demo", "uid": "u", "resourceVersion": "7", "generation": 1,
            "creationTimestamp": "2025-01-02T03:04:05Z", "deletionTimestamp": null,
            "labels": {"app": "web"}, "annotations": {"a": "b"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "r",
                "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                "time": "2025-01-02T03:04:05Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}}],
        },
        "spec": {
            "nodeName": "n1", "serviceAccountName": "web",
            "containers": [{"name": "app", "image": "app:1", "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}, "requests": {}},
                "readinessProbe": {"httpGet": {"port": "http", "path": "/"}, "periodSeconds": 5},
                "env": [{"name": "X", "value": "1"}, {"name": "Y", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}],
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null,
                "lastTransitionTime": "2025-01-02T03:04:05Z"}],
            "startTime": "2025-01-02T03:04:05Z"},
    });
    Object::decode(pod, Decoding::Strict).expect("a Pod as the API server returns it");
    let service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "demo"},
        "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack", "type": "ClusterIP", "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "grpc", "port": 90, "targetPort": "grpc", "appProtocol": "grpc"}],
            "selector": {"app": "web"}},
        "status": {"loadBalancer": {}},
    });
    Object::decode(service, Decoding::Strict).expect("a Service as the API server returns it");
}

/// The error a file with `text` gets from the folder source.
fn file_error(text: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "objects.yaml", text);
    let mut src = FileSource::new(dir.path(), Filter::all());
    assert!(src.poll().is_empty(), "nothing of a bad file is read");
    let all = errors(&src);
    assert_eq!(all.len(), 1, "{all:?}");
    let prefix = format!("{}:", dir.path().join("objects.yaml").display());
    all[0].strip_prefix(&prefix).expect("names the file").to_owned()
}

const POLICY: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: allow\n  namespace: demo\nspec:\n";

#[test]
fn an_unknown_field_is_refused_at_its_key_with_a_hint() {
    let text =
        format!("{POLICY}  action: ALLOW\n  rulez:\n  - from:\n    - source:\n        principals: [a]\n");
    assert_eq!(
        file_error(&text),
        r#"8:3: AuthorizationPolicy demo/allow: unknown field "spec.rulez" (did you mean "rules"?)"#
    );
    // Top level, no close name.
    let text = format!("{POLICY}  action: DENY\nextra: 1\n");
    assert_eq!(file_error(&text), r#"8:1: AuthorizationPolicy demo/allow: unknown field "extra""#);
}

#[test]
fn an_unknown_field_in_lists_is_named_with_indices() {
    let text = format!(
        "{POLICY}  rules:\n  - to:\n    - operation:\n        ports: [\"80\"]\n  - from:\n    - source:\n        principal: [a]\n"
    );
    assert_eq!(
        file_error(&text),
        r#"13:9: AuthorizationPolicy demo/allow: unknown field "spec.rules[1].from[0].source.principal" (did you mean "principals"?)"#
    );
}

#[test]
fn enum_values_are_checked_case_sensitively() {
    let text = format!("{POLICY}  action: deny\n");
    assert_eq!(
        file_error(&text),
        r#"7:11: AuthorizationPolicy demo/allow: spec.action: Unsupported value: "deny": supported values: "ALLOW", "DENY", "AUDIT", "CUSTOM""#
    );
    let text = "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n  name: pa\n  namespace: demo\n\
                spec:\n  mtls:\n    mode: STRICT\n  portLevelMtls:\n    9090:\n      mode: strict\n";
    assert_eq!(
        file_error(text),
        r#"11:13: PeerAuthentication demo/pa: spec.portLevelMtls.9090.mode: Unsupported value: "strict": supported values: "UNSET", "DISABLE", "PERMISSIVE", "STRICT""#
    );
    let text = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: se\n  namespace: demo\n\
                spec:\n  hosts: [a.example.com]\n  location: MESH_EXTERNAL\n  resolution: dns\n";
    assert_eq!(
        file_error(text),
        r#"9:15: ServiceEntry demo/se: spec.resolution: Unsupported value: "dns": supported values: "NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN", "DYNAMIC_DNS""#
    );
    let text = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: se\n  namespace: demo\n\
                spec:\n  hosts: [a.example.com]\n  location: external\n";
    assert_eq!(
        file_error(text),
        r#"8:13: ServiceEntry demo/se: spec.location: Unsupported value: "external": supported values: "MESH_EXTERNAL", "MESH_INTERNAL""#
    );
}

#[test]
fn a_type_error_names_the_field_at_its_line() {
    let text = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n---\napiVersion: v1\nkind: Service\n\
                metadata:\n  name: web\n  namespace: demo\nspec:\n  ports:\n  - name: http\n    port: \"eighty\"\n";
    assert_eq!(
        file_error(text),
        r#"14:11: Service demo/web: spec.ports[0].port: invalid type: string "eighty", expected i32"#
    );
}

#[test]
fn an_error_in_a_list_item_is_placed_in_that_item() {
    let text = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: demo\n\
                - apiVersion: v1\n  kind: Service\n  metadata:\n    name: web\n    namespace: demo\n  spec:\n    selectr: {app: web}\n";
    // No hint here: a hint comes from the fields the decoded object re-encodes, and Kubernetes'
    // own types re-encode only the fields written (Ambit's Istio types re-encode all of theirs).
    assert_eq!(file_error(text), r#"14:5: Service demo/web: unknown field "spec.selectr""#);
}
