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

fn service(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: demo\nspec:\n{spec}  ports: [{{port: 80}}]\n"
    )
}

fn cluster_ips(d: &Desired) -> Vec<String> {
    d.passed
        .iter()
        .filter(|p| p.kind == Kind::Service)
        .map(|p| {
            format!(
                "{} {} {}",
                p.name,
                p.value["spec"]["clusterIP"].as_str().unwrap_or("-"),
                p.value["spec"]["clusterIPs"]
            )
        })
        .collect()
}

#[test]
fn services_without_a_cluster_ip_get_one_of_the_service_range() {
    let files = [
        ("a.yaml", format!("{NS}---\n{}", service("given", "  clusterIP: 10.96.0.10\n"))),
        ("b.yaml", format!("{}---\n{}", service("auto", ""), service("headless", "  clusterIP: None\n"))),
        ("c.yaml", service("other", "  clusterIP: \"\"\n")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let d = Desired::load(folder(&files).path(), &nodes()).expect("load");
    let want = [
        "given 10.96.0.10 null",
        "auto 10.96.187.140 [\"10.96.187.140\"]",
        "headless None null",
        "other 10.96.189.103 [\"10.96.189.103\"]",
    ];
    assert_eq!(cluster_ips(&d), want);
    // The same objects in other files and another order get the same addresses.
    let reordered = [
        ("z.yaml", service("other", "")),
        ("y.yaml", format!("{}---\n{NS}", service("auto", ""))),
        ("x.yaml", service("headless", "  clusterIP: None\n")),
        ("w.yaml", service("given", "  clusterIP: 10.96.0.10\n")),
    ];
    let reordered: Vec<(&str, &str)> = reordered.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let again = Desired::load(folder(&reordered).path(), &nodes()).expect("load");
    let mut a = cluster_ips(&again);
    let mut b = want.map(String::from).to_vec();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    // An address given that the automatic one would have had: the automatic one moves on.
    let taken = [(
        "a.yaml",
        format!("{NS}---\n{}---\n{}", service("auto", ""), service("first", "  clusterIP: 10.96.187.140\n")),
    )];
    let taken: Vec<(&str, &str)> = taken.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let d = Desired::load(folder(&taken).path(), &nodes()).expect("load");
    assert_eq!(cluster_ips(&d), ["auto 10.96.187.141 [\"10.96.187.141\"]", "first 10.96.187.140 null"]);
}

#[test]
fn a_cluster_ip_given_must_be_an_address_of_the_range_and_not_taken() {
    let text = format!(
        "{NS}---\n{}---\n{}---\n{}---\n{}",
        service("a", "  clusterIP: 10.96.0.10\n"),
        service("b", "  clusterIP: 10.96.0.10\n"),
        service("c", "  clusterIP: 10.0.0.1\n"),
        service("d", "  clusterIP: nope\n"),
    );
    assert_eq!(
        errors(&[("s.yaml", &text)]),
        [
            "s.yaml:17: Service demo/b: clusterIP 10.96.0.10 is taken by Service demo/a",
            "s.yaml:26: Service demo/c: clusterIP 10.0.0.1 is outside the cluster's service range 10.96.0.0/16",
            "s.yaml:35: Service demo/d: clusterIP \"nope\" is not an IPv4 address (or None, for a headless Service)",
        ]
    );
}

#[test]
fn applied_again_without_its_address_a_service_keeps_it() {
    let at = Location::new("x.yaml", 1);
    let yaml = |s: &str| ambit_objects::file::yaml_value(s).expect("yaml");
    let current =
        vec![(yaml(&service("auto", "  clusterIP: 10.96.200.1\n  clusterIPs: [10.96.200.1]\n")), at.clone())];
    let mut ours = vec![(yaml(&service("auto", "")), at.clone()), (yaml(&service("new", "")), at.clone())];
    keep_cluster_ips(&mut ours, &current);
    assert_eq!(ours[0].0["spec"]["clusterIP"], "10.96.200.1");
    assert_eq!(ours[0].0["spec"]["clusterIPs"], serde_json::json!(["10.96.200.1"]));
    assert_eq!(ours[1].0["spec"].get("clusterIP"), None, "a new Service is given one by the check");
    let mut all = current.clone();
    all.push((yaml(NS), at.clone()));
    all.push(ours[1].clone());
    let d = Desired::check(all, Vec::new(), &nodes()).expect("check");
    fill_cluster_ips(&mut ours, &d);
    let given = d.passed.iter().find(|p| p.name == "new").expect("new");
    assert_eq!(ours[1].0["spec"]["clusterIP"], given.value["spec"]["clusterIP"]);
    assert!(cluster_ip(&ours[1].0).is_some_and(|ip| ip.starts_with("10.96.")), "{}", ours[1].0);
}

const WAYPOINT: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: wp, namespace: demo}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
";

#[test]
fn a_waypoint_gateway_gets_its_deployment_service_service_account_and_address() {
    let dir = folder(&[("a.yaml", NS), ("b.yaml", WAYPOINT)]);
    let d = Desired::load(dir.path(), &nodes()).expect("accepted");
    let pod = d.pods.iter().find(|p| p.name == "wp-0").expect("the waypoint's pod");
    assert_eq!((pod.namespace.as_str(), pod.service_account.as_str()), ("demo", "wp"));
    assert_eq!(pod.deployment.as_deref(), Some("wp"));
    assert_eq!(pod.labels.get("gateway.networking.k8s.io/gateway-name").map(String::as_str), Some("wp"));
    assert_eq!(pod.labels.get("istio.io/dataplane-mode").map(String::as_str), Some("none"));
    let c = &pod.containers[0];
    assert_eq!(c.argv, ["ambit", "waypoint"]);
    assert_eq!(c.ports, [15021, 15008]);
    assert_eq!(c.ready_http, Some((15021, "/healthz/ready".to_owned())));
    let gw = d.passed.iter().find(|p| p.kind == Kind::Gateway).expect("gateway");
    assert_eq!(
        gw.value["status"]["addresses"],
        serde_json::json!([{"type": "Hostname", "value": "wp.demo.svc.cluster.local"}])
    );
    let svc = d.passed.iter().find(|p| p.kind == Kind::Service && p.name == "wp").expect("service");
    assert_eq!(
        svc.value["spec"]["selector"],
        serde_json::json!({"gateway.networking.k8s.io/gateway-name": "wp"})
    );
    assert!(cluster_ip(&svc.value).is_some(), "{}", svc.value);
    let ports: Vec<&Value> = svc.value["spec"]["ports"].as_array().expect("ports").iter().collect();
    assert_eq!(ports.len(), 2);
    assert_eq!((ports[1]["name"].as_str(), ports[1]["port"].as_u64()), (Some("mesh"), Some(15008)));
}

#[test]
fn a_waypoint_gateway_keeps_an_address_it_states_and_refuses_a_namesake() {
    let stated =
        WAYPOINT.replace("spec:", "status: {addresses: [{type: IPAddress, value: 10.96.0.9}]}\nspec:");
    let dir = folder(&[("a.yaml", NS), ("b.yaml", &stated)]);
    let d = Desired::load(dir.path(), &nodes()).expect("accepted");
    let gw = d.passed.iter().find(|p| p.kind == Kind::Gateway).expect("gateway");
    assert_eq!(gw.value["status"]["addresses"][0]["value"], "10.96.0.9");

    let namesake =
        "apiVersion: v1\nkind: Service\nmetadata: {name: wp, namespace: demo}\nspec: {ports: [{port: 80}]}\n";
    let dir = folder(&[("a.yaml", NS), ("b.yaml", WAYPOINT), ("c.yaml", namesake)]);
    let problems: Vec<String> = match Desired::load(dir.path(), &nodes()) {
        Ok(d) => panic!("accepted: {d:?}"),
        Err(e) => e.0.iter().map(|e| format!("{}: {}", e.at, e.problem)).collect(),
    };
    let at = |f: &str| dir.path().join(f).display().to_string();
    assert_eq!(
        problems,
        [format!(
            "{}:1: Service demo/wp has the name of the waypoint Gateway at {}:1, whose Deployment, Service and \
             ServiceAccount demo/wp are made for it (as istiod makes them); rename this Service",
            at("c.yaml"),
            at("b.yaml")
        )]
    );
}
