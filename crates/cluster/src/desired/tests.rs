use super::*;

fn folder(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    dir
}

fn nodes() -> Vec<String> {
    vec!["node1".into(), "node2".into()]
}

fn errors(files: &[(&str, &str)]) -> Vec<String> {
    let dir = folder(files);
    match Desired::load(dir.path(), &nodes()) {
        Ok(d) => panic!("accepted: {d:?}"),
        Err(e) => {
            e.0.iter()
                .map(|e| {
                    let file = e.at.path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
                    format!("{file}:{}: {}", e.at.line, e.problem)
                })
                .collect()
        }
    }
}

const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n  labels:\n    istio.io/dataplane-mode: ambient\n";

const DEPLOY: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: server
  namespace: demo
spec:
  replicas: 2
  selector:
    matchLabels: {app: server}
  template:
    metadata:
      labels: {app: server}
    spec:
      serviceAccountName: server
      containers:
      - name: echo
        command: [ambit, app, echo]
        args: [--port, \"8080\"]
        env: [{name: A, value: b}]
        ports: [{containerPort: 8080}]
";

#[test]
fn a_folder_becomes_objects_passed_on_and_pods_to_run() {
    let sa = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: server\n  namespace: demo\n";
    let svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: server\n  namespace: demo\nspec:\n  selector: {app: server}\n  ports: [{port: 80, targetPort: 8080}]\n";
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: client\nspec:\n  nodeName: node2\n  containers:\n  - name: c\n    command: [sleep, infinity]\n";
    let dir = folder(&[("a.yaml", &format!("{NS}---\n{sa}---\n{svc}")), ("b.yaml", DEPLOY), ("c.yml", pod)]);
    let d = Desired::load(dir.path(), &nodes()).expect("load");
    let passed: Vec<String> =
        d.passed.iter().map(|p| format!("{} {}/{}", p.kind, p.namespace, p.name)).collect();
    assert_eq!(passed, ["Namespace /demo", "Service demo/server"]);
    assert_eq!(d.passed[1].at.line, 14);
    let pods: Vec<String> = d.pods.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect();
    assert_eq!(pods, ["demo/server-0", "demo/server-1", "default/client"]);
    let s = &d.pods[0];
    assert_eq!(s.deployment.as_deref(), Some("server"));
    assert_eq!(s.service_account, "server");
    assert_eq!(s.labels.get("app").map(String::as_str), Some("server"));
    assert_eq!(s.containers[0].argv, ["ambit", "app", "echo", "--port", "8080"]);
    assert_eq!(s.containers[0].env, [("A".to_owned(), "b".to_owned())]);
    assert_eq!(s.containers[0].ports, [8080]);
    assert_eq!(s.digest, d.pods[1].digest);
    assert_eq!(d.pods[2].node.as_deref(), Some("node2"));
    assert_eq!(d.pods[2].service_account, "default");
    assert!(d.namespaces.contains("demo") && d.namespaces.contains("default"));
}

#[test]
fn every_problem_names_its_file_and_line_and_nothing_is_used() {
    let unknown = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ok\n---\napiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: x\n";
    assert_eq!(
        errors(&[("k.yaml", unknown)]),
        [format!("k.yaml:6: kind CronJob (batch/v1) is not one `ambit up` runs; it reads {KINDS}")]
    );
    let orphan = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: nowhere\nspec:\n  containers:\n  - {name: c, command: [\"true\"]}\n";
    assert_eq!(
        errors(&[("p.yaml", orphan)]),
        ["p.yaml:1: Pod nowhere/p is in namespace \"nowhere\", which no Namespace object defines"]
    );
    let broken = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: [unclosed\n";
    let e = errors(&[("b.yaml", broken)]);
    assert_eq!(e.len(), 1);
    assert!(e[0].starts_with("b.yaml:") && e[0].contains("not valid YAML"), "{e:?}");
    assert!(!e[0].starts_with("b.yaml:0:"), "no line: {e:?}");
    let no_command = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - {name: web, image: nginx}\n";
    assert_eq!(
        errors(&[("n.yaml", no_command)]),
        [
            "n.yaml:1: pod default/p: container \"web\" has no command; `ambit up` runs commands in the pod's network namespace, not images (e.g. command: [ambit, app, echo])"
        ]
    );
    let twice = format!("{NS}---\n{NS}");
    let e = errors(&[("t.yaml", &twice)]);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("t.yaml:8: Namespace demo is defined twice: also at /"), "{e:?}");
    assert!(e[0].ends_with("/t.yaml:1; delete one of them"), "{e:?}");
    let placed = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  nodeName: node9\n  containers:\n  - {name: c, command: [\"true\"]}\n";
    assert_eq!(
        errors(&[("x.yaml", placed)]),
        ["x.yaml:1: pod default/p: nodeName \"node9\" is not a node of this cluster (node1, node2)"]
    );
    let node = "apiVersion: v1\nkind: Node\nmetadata:\n  name: n\n";
    assert_eq!(errors(&[("n.yaml", node)]).len(), 1);
    let no_sa = DEPLOY;
    assert_eq!(
        errors(&[("a.yaml", NS), ("d.yaml", no_sa)]),
        [
            "d.yaml:1: pod demo/server-0: service account \"server\" is not defined (add a ServiceAccount in namespace demo)",
            "d.yaml:1: pod demo/server-1: service account \"server\" is not defined (add a ServiceAccount in namespace demo)"
        ]
    );
    let many = DEPLOY.replace("replicas: 2", "replicas: 65");
    assert_eq!(
        errors(&[("a.yaml", NS), ("d.yaml", &many)]),
        ["d.yaml:1: Deployment demo/server asks for 65 replicas; `ambit up` runs 0 to 64"]
    );
}

/// The errors of a folder as `ambit up` prints them, file names without their folder.
fn shown(files: &[(&str, &str)]) -> Vec<String> {
    let dir = folder(files);
    let prefix = format!("{}/", dir.path().display());
    match Desired::load(dir.path(), &nodes()) {
        Ok(d) => panic!("accepted: {d:?}"),
        Err(e) => e.0.iter().map(|e| e.to_string().replace(&prefix, "")).collect(),
    }
}

#[test]
fn fields_are_decoded_strictly_and_errors_point_at_the_field() {
    let policy = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: allow\n  namespace: demo\nspec:\n";
    let rulez = format!("{policy}  rulez:\n  - from:\n    - source:\n        namespaces: [demo]\n");
    assert_eq!(
        shown(&[("a.yaml", NS), ("p.yaml", &rulez)]),
        [r#"p.yaml:7:3: AuthorizationPolicy demo/allow: unknown field "spec.rulez" (did you mean "rules"?)"#]
    );
    let deny = format!("{policy}  action: deny\n");
    assert_eq!(
        shown(&[("a.yaml", NS), ("p.yaml", &deny)]),
        [
            r#"p.yaml:7:11: AuthorizationPolicy demo/allow: spec.action: Unsupported value: "deny": supported values: "ALLOW", "DENY", "AUDIT", "CUSTOM""#
        ]
    );
    let three = DEPLOY.replace("replicas: 2", "replicas: \"three\"");
    assert_eq!(
        shown(&[("a.yaml", NS), ("d.yaml", &three)]),
        [r#"d.yaml:7:13: Deployment demo/server: spec.replicas: invalid type: string "three", expected i32"#]
    );
    // Deep in a Deployment's pod template, in a List item, namespace defaulted.
    let typo = DEPLOY.replace("  namespace: demo\n", "").replace("containerPort:", "containerPrt:");
    let list = format!("apiVersion: v1\nkind: List\nitems:\n- {}", typo.replace('\n', "\n  "));
    assert_eq!(
        shown(&[("l.yaml", &list)]),
        [
            r#"l.yaml:22:20: Deployment default/server: unknown field "spec.template.spec.containers[0].ports[0].containerPrt" (did you mean "containerPort"?)"#
        ]
    );
    let sa = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: web\nautomountToken: false\n";
    assert_eq!(
        shown(&[("s.yaml", sa)]),
        [r#"s.yaml:5:1: ServiceAccount default/web: unknown field "automountToken""#]
    );
    // A file that is not YAML is placed at its line and column too.
    let broken = "apiVersion: v1\nkind: Namespace\nmetadata: [unclosed\n";
    assert_eq!(shown(&[("b.yaml", broken)]), ["b.yaml:3:11: not valid YAML: unclosed bracket '['"]);
}
