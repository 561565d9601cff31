//! nginx as a pod's HTTP server for the load tests and benches: one process (no master, so that
//! a killed pod takes it all), listening on 8080, serving a folder with a 1 KiB page `/1k`.

use std::path::{Path, PathBuf};

/// Writes the folder `dir/www` with the page `1k` (1 KiB) and an nginx configuration named
/// after `name` (its pid and log files too) serving it; returns the configuration's path.
pub fn nginx_conf(dir: &Path, name: &str) -> PathBuf {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).expect("www dir");
    let page: String = (0..1024).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    std::fs::write(www.join("1k"), page).expect("write the 1 KiB page");
    let d = dir.display();
    let conf = dir.join(format!("nginx-{name}.conf"));
    std::fs::write(
        &conf,
        format!(
            "daemon off; master_process off; worker_processes 1; pid {d}/nginx-{name}.pid; error_log {d}/nginx-{name}.log;\n\
             events {{ worker_connections 4096; }}\n\
             http {{ access_log off; keepalive_requests 100000; server {{ listen 8080 reuseport backlog=4096; root {}; }} }}\n",
            www.display()
        ),
    )
    .expect("write nginx.conf");
    conf
}

/// An `ambit up` container (flow-style YAML) running nginx with [`nginx_conf`]`(dir, name)`.
pub fn nginx_container(dir: &Path, name: &str) -> String {
    let conf = nginx_conf(dir, name);
    format!(
        "{{name: nginx, command: [nginx, -e, {}/nginx-{name}.err, -c, {}], ports: [{{containerPort: 8080}}]}}",
        dir.display(),
        conf.display()
    )
}
