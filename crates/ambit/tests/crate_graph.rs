//! The workspace's crate graph keeps the layering ARCHITECTURE.md's "Crate dependencies" table
//! allows: every normal dependency of a workspace crate on another one is a listed edge, every
//! row names a crate that exists, and every crate has a row. Dev- and build-dependencies are not
//! checked (tests may use any crate).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Crate name → the workspace crates it depends on (or may depend on).
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The heading the table sits under.
const HEADING: &str = "### Crate dependencies";

#[test]
fn crate_graph_follows_the_architecture_table() {
    let root = workspace_root();
    let graph = workspace_graph(&root);
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md"))
        .unwrap_or_else(|e| panic!("cannot read ARCHITECTURE.md: {e}"));
    let table = allowed(&text).unwrap_or_else(|e| panic!("ARCHITECTURE.md: {e}"));
    let problems = check(&graph, &table);
    assert!(
        problems.is_empty(),
        "the crate graph does not follow ARCHITECTURE.md's \"{HEADING}\" table:\n  {}\n\
         Remove the dependency, or change the table (and say why) if the layering really changes.",
        problems.join("\n  ")
    );
}

#[test]
fn check_names_each_forbidden_edge_unknown_crate_and_missing_row() {
    let graph = parse_graph(&[("a", &[]), ("b", &["a"]), ("c", &["a", "b"]), ("e", &[])]);
    let table = allowed(
        "# x\n\n### Crate dependencies\n\ntext\n\n| Crate | May depend on |\n|---|---|\n\
         | `a` | — |\n| `b` | — |\n| `c` | `a` |\n| `d` | `a`, `x` |\n\nnot the table:\n| `e` | — |\n",
    )
    .expect("the table parses");
    assert_eq!(
        check(&graph, &table),
        [
            "b -> a: not allowed (b may depend on nothing in the workspace)",
            "c -> b: not allowed (c may depend on a)",
            "the table has a row for d, which is not a workspace crate",
            "the table lets d depend on x, which is not a workspace crate",
            "e has no row in the table",
        ]
    );
}

#[test]
fn table_without_heading_or_with_a_bad_row_is_an_error() {
    assert!(allowed("| `a` | — |\n").is_err());
    let elsewhere = format!("{HEADING}\n\ntext\n\n## Next\n\n|Crate|May|\n|---|---|\n| `a` | — |\n");
    assert!(allowed(&elsewhere).expect_err("a table of another section").contains("no table rows"));
    let twice = format!("{HEADING}\n\n|Crate|May|\n|---|---|\n| `a` | — |\n| `a` | `b` |\n");
    assert!(allowed(&twice).expect_err("a crate with two rows").contains("two rows"));
    let unnamed = format!("{HEADING}\n\n|Crate|May|\n|---|---|\n| a | — |\n");
    assert!(allowed(&unnamed).expect_err("no backticks").contains("`crate-name`"));
}

/// The workspace root: two levels above this package.
fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or_else(|e| panic!("workspace root {}: {e}", root.display()))
}

/// The normal dependencies between workspace crates, from `cargo metadata`.
fn workspace_graph(root: &Path) -> Graph {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", Path::new(&cargo).display()));
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let packages = meta["packages"].as_array().expect("cargo metadata lists packages");
    let members: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().expect("a package has a name");
            let deps = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                // `kind` is null for a normal dependency, "dev" or "build" otherwise.
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .filter(|d| members.contains(d))
                .map(str::to_owned)
                .collect();
            (name.to_owned(), deps)
        })
        .collect()
}

/// The first table under [`HEADING`] (before the next heading): the first cell names a crate in
/// backticks, the second the crates it may depend on (backticked, comma-separated; `—` for
/// none). The table ends at the first line that is not a table row.
fn allowed(markdown: &str) -> Result<Graph, String> {
    let mut lines = markdown.lines().skip_while(|l| l.trim() != HEADING);
    if lines.next().is_none() {
        return Err(format!("no \"{HEADING}\" section"));
    }
    let rows = lines
        .take_while(|l| !l.starts_with('#'))
        .skip_while(|l| !l.trim_start().starts_with('|'))
        .take_while(|l| l.trim_start().starts_with('|'))
        .skip(2); // the header and the |---| line
    let mut table = Graph::new();
    for row in rows {
        let cells: Vec<&str> = row.trim().trim_matches('|').split('|').collect();
        let [krate, deps] = cells[..] else {
            return Err(format!("row {row:?} does not have two cells"));
        };
        let [krate] = backticked(krate)[..] else {
            return Err(format!("row {row:?}: the first cell should name one crate as `crate-name`"));
        };
        let deps = backticked(deps).into_iter().map(str::to_owned).collect();
        if table.insert(krate.to_owned(), deps).is_some() {
            return Err(format!("{krate} has two rows"));
        }
    }
    if table.is_empty() {
        return Err(format!("no table rows under \"{HEADING}\""));
    }
    Ok(table)
}

/// The names written as `name` in a cell.
fn backticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).map(str::trim).filter(|s| !s.is_empty()).collect()
}

/// Every way `graph` and `table` disagree, one line each: forbidden edges first, then rows for
/// crates that do not exist, then crates without a row.
fn check(graph: &Graph, table: &Graph) -> Vec<String> {
    let mut problems = Vec::new();
    for (krate, deps) in graph {
        let Some(may) = table.get(krate) else { continue };
        for dep in deps.difference(may) {
            let allowed = if may.is_empty() {
                "nothing in the workspace".to_owned()
            } else {
                may.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
            };
            problems.push(format!("{krate} -> {dep}: not allowed ({krate} may depend on {allowed})"));
        }
    }
    for (krate, may) in table {
        if !graph.contains_key(krate) {
            problems.push(format!("the table has a row for {krate}, which is not a workspace crate"));
        }
        for dep in may.iter().filter(|d| !graph.contains_key(*d)) {
            problems.push(format!("the table lets {krate} depend on {dep}, which is not a workspace crate"));
        }
    }
    for krate in graph.keys().filter(|k| !table.contains_key(*k)) {
        problems.push(format!("{krate} has no row in the table"));
    }
    problems
}

/// A graph from literal edges (the unit tests of [`check`]).
fn parse_graph(edges: &[(&str, &[&str])]) -> Graph {
    edges.iter().map(|(k, deps)| ((*k).to_owned(), deps.iter().map(|d| (*d).to_owned()).collect())).collect()
}
