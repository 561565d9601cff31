use super::*;

fn info(reporter: Reporter, dst: &Arc<Workload>) -> ConnectionInfo {
    ConnectionInfo {
        reporter,
        src_addr: "10.0.0.1:40000".parse().expect("addr"),
        src_workload: None,
        src_identity: None,
        dst_addr: "10.0.0.2:8080".parse().expect("addr"),
        hbone_addr: None,
        dst_service: None,
        dst_workload: Some(dst.clone()),
        dst_identity: None,
        mtls: false,
    }
}

fn workload(name: &str, namespace: &str) -> Arc<Workload> {
    Arc::new(
        serde_json::from_value(serde_json::json!({"name": name, "namespace": namespace, "workloadIps": []}))
            .expect("workload"),
    )
}

fn scrape(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encode");
    out
}

fn count(text: &str, metric: &str, needle: &str) -> Vec<String> {
    text.lines().filter(|l| l.starts_with(metric) && l.contains(needle)).map(str::to_owned).collect()
}

/// A `MakeWriter` that appends everything to one shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn peer_supplied_fields_are_cut_in_the_access_log() {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    let authority = format!("{}:80", "a".repeat(60_000));
    let error = format!("no valid authority pseudo header: {authority}");
    tracing::subscriber::with_default(subscriber, || {
        let info = info(Reporter::destination, &workload("web", "demo"));
        record_failure(&metrics, &info, Flag::Connect, &error);
        ConnectionRecord::open(&metrics, info).finish(crate::copy::Transferred::default(), Some(&error));
    });
    let text = String::from_utf8(out.0.lock().expect("lock").clone()).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for line in lines {
        assert!(line.contains("no valid authority pseudo header: aaaa"), "{line}");
        assert!(line.contains("… (60037 bytes, cut to 1024)"), "{line}");
        assert!(line.len() < MAX_LOG_FIELD + 512, "a {}-byte access-log line", line.len());
    }
}

#[test]
fn clip_cuts_at_a_char_boundary() {
    assert_eq!(clip("short", 10), "short");
    assert_eq!(clip("ééé", 3), "é… (6 bytes, cut to 3)");
}

#[test]
fn cached_handles_count_into_the_right_series() {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let (web, db) = (workload("web", "demo"), workload("db", "demo"));
    for _ in 0..3 {
        let r = ConnectionRecord::open(&metrics, info(Reporter::source, &web));
        r.finish(crate::copy::Transferred::default(), None);
    }
    let open = ConnectionRecord::open(&metrics, info(Reporter::destination, &web));
    ConnectionRecord::open(&metrics, info(Reporter::source, &db))
        .finish(crate::copy::Transferred::default(), None);
    // A changed workload (the state hands out a new Arc) gets its own labels.
    let web2 = workload("web", "demo2");
    ConnectionRecord::open(&metrics, info(Reporter::source, &web2))
        .finish(crate::copy::Transferred::default(), None);

    let text = scrape(&registry);
    let opened = "istio_tcp_connections_opened_total";
    let src_web = "reporter=\"source\",source_workload=\"unknown\"";
    let web_lines: Vec<String> = count(&text, opened, src_web)
        .into_iter()
        .filter(|l| l.contains("destination_workload=\"web\""))
        .collect();
    assert_eq!(web_lines.len(), 2, "demo/web and demo2/web are separate series: {web_lines:?}");
    assert!(web_lines.iter().any(|l| l.contains("namespace=\"demo\"") && l.ends_with(" 3")), "{web_lines:?}");
    assert!(
        web_lines.iter().any(|l| l.contains("namespace=\"demo2\"") && l.ends_with(" 1")),
        "{web_lines:?}"
    );
    assert_eq!(count(&text, opened, "destination_workload=\"db\"").len(), 1);
    assert_eq!(count(&text, opened, "reporter=\"destination\"").len(), 1);
    let sockets = count(&text, "istio_tcp_sockets_open", "reporter=\"destination\"");
    assert_eq!(sockets.len(), 1);
    assert!(sockets[0].ends_with(" 1"), "one inbound connection still open: {sockets:?}");
    let sockets = count(&text, "istio_tcp_sockets_open", "reporter=\"source\"");
    assert!(sockets[0].ends_with(" 0"), "{sockets:?}");
    drop(open);
}

fn located(name: &str, region: &str, zone: &str) -> Arc<Workload> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "name": name, "namespace": "demo", "workloadIps": [],
            "locality": {"region": region, "zone": zone, "subzone": "ignored"},
        }))
        .expect("workload"),
    )
}

/// The locality labels of `family`'s samples whose labels contain `needle`, as
/// (source_region, source_zone, destination_region, destination_zone), `None` if absent.
fn locality(text: &str, family: &str, needle: &str) -> Vec<Option<[String; 4]>> {
    let get = |line: &str, key: &str| -> Option<String> {
        let rest = line.split(&format!(",{key}=\"")).nth(1)?;
        Some(rest.split('"').next()?.to_owned())
    };
    count(text, family, needle)
        .iter()
        .map(|l| {
            let v: Vec<Option<String>> =
                ["source_region", "source_zone", "destination_region", "destination_zone"]
                    .iter()
                    .map(|k| get(l, k))
                    .collect();
            match v.as_slice() {
                [Some(a), Some(b), Some(c), Some(d)] => Some([a.clone(), b.clone(), c.clone(), d.clone()]),
                [None, None, None, None] => None,
                _ => panic!("some locality labels but not all: {l}"),
            }
        })
        .collect()
}

#[test]
fn locality_labels_follow_the_known_workloads() {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let (web, db) = (located("web", "eu-west-1", "eu-west-1a"), located("db", "us-east-1", "us-east-1b"));
    // Only the destination known (outbound to a pod).
    ConnectionRecord::open(&metrics, info(Reporter::source, &web))
        .finish(crate::copy::Transferred::default(), None);
    // Both known (inbound from a pod of the mesh).
    let mut both = info(Reporter::destination, &db);
    both.src_workload = Some(web.clone());
    let r = ConnectionRecord::open(&metrics, both.clone());
    r.finish(crate::copy::Transferred::default(), None);
    record_failure(&metrics, &both, Flag::Deny, &"denied");
    // Neither known (passthrough to an address outside the mesh).
    let mut none = info(Reporter::destination, &web);
    none.dst_workload = None;
    none.dst_addr = "192.0.2.1:80".parse().expect("addr");
    ConnectionRecord::open(&metrics, none).finish(crate::copy::Transferred::default(), None);

    let text = scrape(&registry);
    let s = |v: [&str; 4]| Some(v.map(str::to_owned));
    for family in [
        "istio_tcp_connections_opened_total",
        "istio_tcp_connections_closed_total",
        "istio_tcp_received_bytes_total",
        "istio_tcp_sent_bytes_total",
    ] {
        assert_eq!(
            locality(&text, family, "reporter=\"source\""),
            vec![s(["unknown", "unknown", "eu-west-1", "eu-west-1a"])],
            "{family}: {text}"
        );
        assert_eq!(
            locality(&text, family, "destination_workload=\"db\""),
            vec![s(["eu-west-1", "eu-west-1a", "us-east-1", "us-east-1b"])],
            "{family}: {text}"
        );
        assert_eq!(
            locality(&text, family, "destination_workload=\"unknown\""),
            vec![None],
            "{family}: {text}"
        );
    }
    assert_eq!(
        locality(&text, "istio_tcp_connections_failed_total", "response_flags=\"DENY\""),
        vec![s(["eu-west-1", "eu-west-1a", "us-east-1", "us-east-1b"])],
        "{text}"
    );
    // The labels come last, after connection_security_policy, as in Istio.
    let line = count(&text, "istio_tcp_connections_opened_total", "destination_workload=\"db\"").remove(0);
    assert!(
        line.contains("connection_security_policy=\"unknown\",source_region=\"eu-west-1\",source_zone=\"eu-west-1a\",destination_region=\"us-east-1\",destination_zone=\"us-east-1b\"}"),
        "{line}"
    );
}

#[test]
fn process_and_runtime_collectors() {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut registry = Registry::default();
    register_process_and_runtime(&mut registry, rt.handle().clone());
    // Keep 40 descriptors open while scraping: other tests only add to the count.
    let files: Vec<std::fs::File> =
        (0..40).map(|_| std::fs::File::open("/proc/self/status").expect("open")).collect();
    rt.block_on(async {
        let tasks: Vec<_> = (0..3).map(|_| tokio::spawn(std::future::pending::<()>())).collect();
        tokio::task::yield_now().await;
        let text = scrape(&registry);
        let value = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} missing: {text}"));
            line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
        };
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).expect("rlimit");
        assert_eq!(value("process_max_fds"), soft as f64);
        let open = value("process_open_fds");
        assert!(open >= 40.0 && open <= soft as f64, "{open}");
        assert!(value("process_resident_memory_bytes") > 1e6, "{text}");
        assert!(value("process_cpu_seconds_total") > 0.0, "{text}");
        assert_eq!(value("tokio_num_workers"), 2.0);
        assert!(value("tokio_num_alive_tasks") >= 3.0, "{text}");
        assert!(value("tokio_global_queue_depth") >= 0.0);
        for family in [
            "tokio_worker_total_busy_duration_seconds_total",
            "tokio_worker_park_count_total",
            "tokio_worker_park_unpark_count_total",
        ] {
            for worker in 0..2 {
                let _ = value(&format!("{family}{{worker=\"{worker}\"}}"));
            }
            assert!(!text.contains(&format!("{family}{{worker=\"2\"}}")), "{text}");
        }
        for (family, kind) in [
            ("process_open_fds", "gauge"),
            ("process_max_fds", "gauge"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_cpu_seconds", "counter"),
            ("tokio_num_workers", "gauge"),
            ("tokio_worker_park_count", "counter"),
            ("tokio_worker_total_busy_duration_seconds", "counter"),
        ] {
            assert!(text.contains(&format!("# TYPE {family} {kind}\n")), "{family}: {text}");
        }
        assert!(!text.contains("(unstable)"), "these families are stable: {text}");
        for t in tasks {
            t.abort();
        }
    });
    drop(files);
}
