//! Policy routing for replies to ztunnel-accepted connections: `fwmark 0x111/0xfff lookup 100`
//! and a `local` default route on `lo` in table 100 (§2.8.1), via the `ip` tool.

use crate::exec;
use crate::{Family, MARK_MASK, PodCapture, ROUTE_TABLE, RULE_PRIORITY, RedirectError, TPROXY_MARK};

/// Adds the table-100 routes, then the fwmark rules. Must run inside the pod netns.
pub(crate) fn apply(capture: &PodCapture) -> Result<(), RedirectError> {
    let table = ROUTE_TABLE.to_string();
    if capture.ipv4 {
        let args =
            ["-4", "route", "replace", "local", "0.0.0.0/0", "dev", "lo", "table", &table, "scope", "host"];
        exec::run("ip", &args, None)?;
    }
    if capture.ipv6 && lo_has_ipv6() {
        exec::run("ip", &["-6", "route", "replace", "local", "::/0", "dev", "lo", "table", &table], None)?;
    }
    for family in families(capture) {
        let args = rule_args(family, "add");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = exec::output("ip", &args, None)?;
        if !out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("File exists") {
            return Err(exec::failure("ip", &args, &out));
        }
    }
    Ok(())
}

/// Deletes the fwmark rules and table-100 routes of both families; absent ones are fine.
pub(crate) fn remove() -> Result<(), RedirectError> {
    let table = ROUTE_TABLE.to_string();
    let mut commands: Vec<Vec<String>> =
        [Family::V4, Family::V6].iter().map(|f| rule_args(*f, "del")).collect();
    for (flag, dst) in [("-4", "0.0.0.0/0"), ("-6", "::/0")] {
        commands.push(
            [flag, "route", "del", "local", dst, "dev", "lo", "table", &table].map(str::to_owned).to_vec(),
        );
    }
    for args in commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = exec::output("ip", &args, None)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let gone = ["No such file or directory", "No such process", "Address family not supported"]
            .iter()
            .any(|text| stderr.contains(text));
        if !out.status.success() && !gone {
            return Err(exec::failure("ip", &args, &out));
        }
    }
    Ok(())
}

/// Differences between the live policy routing and what `capture` needs (empty = in sync), and
/// whether any of ours is present at all.
pub(crate) fn verify(capture: &PodCapture) -> Result<(Vec<String>, bool), RedirectError> {
    let mut drift = Vec::new();
    let mut present = false;
    let table = ROUTE_TABLE.to_string();
    let wanted_rule = format!("fwmark {TPROXY_MARK:#x}/{MARK_MASK:#x} lookup {ROUTE_TABLE}");
    for family in [Family::V4, Family::V6] {
        let flag = flag(family);
        let wanted = match family {
            Family::V4 => capture.ipv4,
            Family::V6 => capture.ipv6,
        };
        let rules = exec::stdout(&exec::run("ip", &[flag, "rule", "show"], None)?);
        let has_rule = rules
            .lines()
            .any(|line| line.starts_with(&format!("{RULE_PRIORITY}:")) && line.contains(&wanted_rule));
        let routes = exec::output("ip", &[flag, "route", "show", "table", &table], None)?;
        let has_route = exec::stdout(&routes).lines().any(|line| line.starts_with("local default dev lo"));
        present |= has_rule || has_route;
        if wanted && !has_rule {
            drift.push(format!("ip {flag} rule `{wanted_rule} pref {RULE_PRIORITY}` missing"));
        }
        let route_wanted = wanted && (family == Family::V4 || lo_has_ipv6());
        if route_wanted && !has_route {
            drift.push(format!("ip {flag} route `local default dev lo table {ROUTE_TABLE}` missing"));
        }
    }
    Ok((drift, present))
}

fn families(capture: &PodCapture) -> Vec<Family> {
    let mut families = Vec::new();
    if capture.ipv4 {
        families.push(Family::V4);
    }
    if capture.ipv6 {
        families.push(Family::V6);
    }
    families
}

fn flag(family: Family) -> &'static str {
    match family {
        Family::V4 => "-4",
        Family::V6 => "-6",
    }
}

fn rule_args(family: Family, op: &str) -> Vec<String> {
    [
        flag(family).to_owned(),
        "rule".into(),
        op.into(),
        "fwmark".into(),
        format!("{TPROXY_MARK:#x}/{MARK_MASK:#x}"),
        "lookup".into(),
        ROUTE_TABLE.to_string(),
        "pref".into(),
        RULE_PRIORITY.to_string(),
    ]
    .to_vec()
}

/// `lo` takes IPv6 routes unless `disable_ipv6` is `1`; a read error still tries (as upstream).
/// /proc/sys/net shows the namespace of the reading thread.
fn lo_has_ipv6() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv6/conf/lo/disable_ipv6")
        .map(|v| v.trim() != "1")
        .unwrap_or(true)
}
