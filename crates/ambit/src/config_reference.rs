//! `ambit config-reference`: the configuration each component reads, from the same clap
//! definitions `--help` prints, plus what is read from the environment outside the flags.
//! Ambit's chart and Istio's charts are checked against it (`tests/chart.rs`).

use serde_json::{Value, json};

/// Environment read outside the flags, by component: exact names, name prefixes, and names
/// accepted (read only to log, once, that they have no effect).
struct Extra {
    env: Vec<&'static str>,
    prefixes: &'static [&'static str],
    without_effect: Vec<&'static str>,
}

fn extra(component: &str) -> Extra {
    // The Kubernetes client of the agent and the control plane reads these.
    let kube = ["KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"];
    match component {
        "agent" => Extra {
            env: kube.to_vec(),
            prefixes: &[],
            without_effect: ambit_agent::app::args::ISTIO_CNI_WITHOUT_EFFECT
                .iter()
                .map(|(n, _)| *n)
                .collect(),
        },
        "proxy" => Extra {
            env: ambit_proxy::ENV_OUTSIDE_FLAGS.to_vec(),
            prefixes: ambit_proxy::ENV_PREFIXES,
            without_effect: ambit_proxy::UNSUPPORTED_SETTINGS
                .iter()
                .chain(ambit_proxy::ACCEPTED_WITHOUT_EFFECT)
                .copied()
                .collect(),
        },
        "waypoint" => Extra {
            env: ambit_waypoint::app::ENV_OUTSIDE_FLAGS.to_vec(),
            prefixes: ambit_waypoint::app::ENV_PREFIXES,
            without_effect: Vec::new(),
        },
        "control" => Extra { env: kube.to_vec(), prefixes: &[], without_effect: Vec::new() },
        _ => Extra { env: Vec::new(), prefixes: &[], without_effect: Vec::new() },
    }
}

/// The reference as pretty JSON: `{"agent": {"flags": [...], "env": [...], "env_prefixes":
/// [...], "env_without_effect": [...]}, "proxy": {...}, "waypoint": {...}, "control": {...}}`,
/// each list sorted.
pub fn reference(cli: &clap::Command) -> String {
    let mut out = serde_json::Map::new();
    for component in ["agent", "proxy", "waypoint", "control"] {
        let Some(cmd) = cli.find_subcommand(component) else { continue };
        let mut flags: Vec<String> = Vec::new();
        let mut env: Vec<String> = Vec::new();
        for arg in cmd.get_arguments() {
            if let Some(long) = arg.get_long() {
                flags.push(format!("--{long}"));
            }
            if let Some(name) = arg.get_env().and_then(|e| e.to_str()) {
                env.push(name.to_owned());
            }
        }
        let extra = extra(component);
        env.extend(extra.env.iter().map(|s| (*s).to_owned()));
        flags.sort();
        flags.dedup();
        env.sort();
        env.dedup();
        let mut without_effect = extra.without_effect;
        without_effect.sort_unstable();
        out.insert(
            component.to_owned(),
            json!({
                "flags": flags,
                "env": env,
                "env_prefixes": extra.prefixes,
                "env_without_effect": without_effect,
            }),
        );
    }
    serde_json::to_string_pretty(&Value::Object(out)).unwrap_or_default()
}
