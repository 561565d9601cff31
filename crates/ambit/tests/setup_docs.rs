//! The set-up the README promises works as root on a fresh Debian 12 machine with only Rust:
//! no command uses `sudo` (a fresh Debian has none), every tool a script runs is installed by
//! that script or by `.ci/run`, and `.ci/run`'s leak check covers every network-namespace
//! name the tests create. (The commands themselves run in CI: `.ci/run` is CI.)

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

/// Shell text without comments (`#` at the start of a word up to the end of the line).
fn without_comments(sh: &str) -> String {
    sh.lines()
        .map(|l| {
            let cut = l
                .char_indices()
                .find(|&(i, c)| c == '#' && (i == 0 || l[..i].ends_with(char::is_whitespace)))
                .map_or(l.len(), |(i, _)| i);
            &l[..cut]
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `word` occurs in `text` as a whole shell word.
fn has_word(text: &str, word: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')).any(|w| w == word)
}

/// The shell scripts the README and TESTING.md tell people to run, and what they source.
const SCRIPTS: [&str; 4] = [".ci/run", "examples/demo/run.sh", "benches/e2e.sh", "scripts/fuzz.sh"];

/// Tools the scripts use that a fresh Debian 12 lacks, and the package that brings each.
const TOOLS: [(&str, &str); 11] = [
    ("curl", "curl"),
    ("python3", "python3"),
    ("nginx", "nginx-light"),
    ("tcpdump", "tcpdump"),
    ("iperf3", "iperf3"),
    ("sockperf", "sockperf"),
    ("wrk", "wrk"),
    ("iptables-restore", "iptables"),
    ("ip", "iproute2"),
    ("sysctl", "procps"),
    ("modprobe", "kmod"),
];

/// The Debian packages a script installs: its `apt-get install` words and `tool:package` pairs.
fn installs(sh: &str) -> Vec<String> {
    let mut out = Vec::new();
    let code = without_comments(sh);
    for word in code.split(|c: char| c.is_whitespace() || "\"();".contains(c)) {
        if let Some((_, pkg)) = word.split_once(':') {
            out.push(pkg.to_owned());
        }
    }
    if let Some(start) = code.find("apt-get install") {
        let rest = &code[start..];
        let end = rest.find(">/dev/null").unwrap_or(rest.len());
        out.extend(rest[..end].split_whitespace().map(|w| w.trim_end_matches('\\').to_owned()));
    }
    out
}

#[test]
fn readme_quick_start_is_two_root_commands_without_sudo() {
    let readme = read("README.md");
    let start = readme.find("## Quick start").expect("README has a Quick start section");
    let section = &readme[start..];
    let block = section.split("```").nth(1).expect("Quick start has a code block");
    let commands: Vec<&str> = block
        .lines()
        .skip(1)
        .map(|l| l.split(" #").next().unwrap_or_default().trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(commands, ["bash examples/demo/run.sh", "bash .ci/run"], "README Quick start commands");
    let heading = section.lines().next().unwrap_or_default();
    assert!(heading.contains("as root") && heading.contains("Debian 12"), "{heading}");
    for (i, block) in readme.split("```").enumerate().filter(|(i, _)| i % 2 == 1) {
        assert!(!has_word(block, "sudo"), "README code block {} uses sudo:\n{block}", i / 2 + 1);
    }
}

#[test]
fn scripts_use_no_sudo_and_install_what_they_run() {
    let ci = read(".ci/run");
    let ci_installs = installs(&ci);
    for need in ["build-essential", "curl", "python3"] {
        assert!(ci_installs.iter().any(|p| p == need), ".ci/run does not install {need}: {ci_installs:?}");
    }
    for script in SCRIPTS {
        let text = read(script);
        let code = without_comments(&text);
        assert!(!has_word(&code, "sudo"), "{script} runs sudo");
        let used = code.clone();
        // .ci/run runs scripts/fuzz.sh, so fuzz.sh may rely on what .ci/run installs.
        let mut provided = installs(&text);
        if script == "scripts/fuzz.sh" {
            provided.extend(ci_installs.iter().cloned());
        }
        for (tool, package) in TOOLS {
            if has_word(&used, tool) {
                assert!(
                    provided.iter().any(|p| p == package),
                    "{script} runs {tool} but neither it nor its runner installs {package}: {provided:?}"
                );
            }
        }
        // `cargo build` needs the C toolchain (aws-lc-sys, the linker).
        if has_word(&used, "cargo") && script != "scripts/fuzz.sh" {
            assert!(
                provided.iter().any(|p| p == "build-essential"),
                "{script} builds but installs no C toolchain"
            );
        }
    }
}

#[test]
fn leak_check_covers_every_netns_prefix_the_tests_use() {
    let ci = read(".ci/run");
    let line = ci.lines().find(|l| l.starts_with("NETNS_PREFIXES=")).expect(".ci/run defines NETNS_PREFIXES");
    let alternatives: Vec<&str> = line
        .split_once("^(")
        .and_then(|(_, rest)| rest.split_once(")[0-9]+-"))
        .map(|(alts, _)| alts.split('|').collect())
        .expect("NETNS_PREFIXES is '^(a|b|…)[0-9]+-'");
    let mut prefixes = Vec::new();
    let mut stack = vec![repo().join("crates")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("read source");
                // Namespace names carry the test's pid right after a letters-only prefix.
                for line in text.lines().filter(|l| l.contains("std::process::id()")) {
                    let Some((_, rest)) = line.split_once("format!(\"") else { continue };
                    let Some((prefix, _)) = rest.split_once("{}") else { continue };
                    if !prefix.is_empty() && prefix.chars().all(|c| c.is_ascii_lowercase()) {
                        prefixes.push((prefix.to_owned(), path.display().to_string()));
                    }
                }
            }
        }
    }
    for p in ["amb", "ambc", "rdx"] {
        assert!(prefixes.iter().any(|(q, _)| q == p), "the scan no longer finds {p}: {prefixes:?}");
    }
    for (prefix, file) in &prefixes {
        assert!(
            alternatives.contains(&prefix.as_str()),
            "{file} creates {prefix}<pid>… names; .ci/run checks {line}"
        );
    }
}
