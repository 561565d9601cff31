//! The settings each component reads, as `ambit config-reference` lists them, against what the
//! rendered containers set.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use super::pods::{component, env_names};
use super::render::Release;

/// One component's flags and environment variables. The reference also lists names a
/// component accepts without effect (`env_without_effect`, for Istio's charts) and name
/// prefixes; Ambit's own chart may set neither, so they are not read here.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct Surface {
    pub flags: BTreeSet<String>,
    pub env: BTreeSet<String>,
}

/// `ambit config-reference`: every flag and environment variable of each component.
pub fn load() -> BTreeMap<String, Surface> {
    let out = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .arg("config-reference")
        .output()
        .expect("run ambit config-reference");
    assert!(
        out.status.success(),
        "ambit config-reference failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ambit config-reference printed no {{component: {{flags, env}}}} JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Every environment variable and `--flag` of every container that its component does not read.
pub fn unknown_settings(r: &Release, reference: &BTreeMap<String, Surface>) -> Vec<String> {
    let mut problems = Vec::new();
    let templates = r
        .daemon_sets
        .iter()
        .filter_map(|d| d.spec.as_ref().map(|s| (d.metadata.name.clone(), s.template.clone())))
        .chain(
            r.deployments
                .iter()
                .filter_map(|d| d.spec.as_ref().map(|s| (d.metadata.name.clone(), s.template.clone()))),
        );
    for (owner, template) in templates {
        for c in template.spec.iter().flat_map(|s| s.containers.iter()) {
            let at = format!("{} container {}", owner.clone().unwrap_or_default(), c.name);
            let Some(comp) = component(c) else {
                problems.push(format!("{at}: {:?} {:?} is no Ambit component", c.command, c.args));
                continue;
            };
            let Some(surface) = reference.get(comp.key()) else {
                problems.push(format!("{at}: config-reference has no {:?}", comp.key()));
                continue;
            };
            for name in env_names(c) {
                if !surface.env.contains(&name) {
                    problems.push(format!("{at}: sets {name}, which `ambit {}` does not read", comp.key()));
                }
            }
            let argv = c.command.iter().flatten().chain(c.args.iter().flatten());
            for flag in argv.filter(|a| a.starts_with("--")) {
                let flag = flag.split('=').next().unwrap_or_default();
                if !surface.flags.contains(flag) {
                    problems
                        .push(format!("{at}: passes {flag}, which `ambit {}` does not accept", comp.key()));
                }
            }
        }
    }
    problems
}
