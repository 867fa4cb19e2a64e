//! The crate table of docs/architecture.md, held to the workspace: every
//! package has a row, and each row's third column names exactly the
//! workspace crates the package depends on outside its tests (as `cargo
//! metadata` reports them), so the table cannot drift from the Cargo files.

use std::collections::{BTreeMap, BTreeSet};

use crate::cmd::workspace_root;

/// Package name → the packages it depends on (normal dependencies only,
/// workspace crates and others), from `cargo metadata`.
pub(crate) fn dependency_graph() -> BTreeMap<String, BTreeSet<String>> {
    let metadata = crate::cmd::workspace_metadata().expect("cargo metadata");
    let packages = metadata["packages"].as_array().expect("packages");
    packages
        .iter()
        .map(|package| {
            let deps = package["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .map(str::to_owned)
                .collect();
            (
                package["name"].as_str().unwrap_or_default().to_owned(),
                deps,
            )
        })
        .collect()
}

/// Package name → the workspace packages it depends on (normal
/// dependencies only), from `cargo metadata`.
pub(crate) fn workspace_graph() -> BTreeMap<String, BTreeSet<String>> {
    let graph = dependency_graph();
    let names: BTreeSet<String> = graph.keys().cloned().collect();
    graph
        .into_iter()
        .map(|(name, deps)| {
            let deps = deps.into_iter().filter(|d| names.contains(d)).collect();
            (name, deps)
        })
        .collect()
}

/// Crate → the workspace crates its row names, from the table under
/// "## Crates".
fn documented(packages: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let docs = std::fs::read_to_string(workspace_root().join("docs/architecture.md"))
        .expect("docs/architecture.md");
    let section = docs
        .split("\n## Crates\n")
        .nth(1)
        .expect("a Crates section")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let deps = cells
                .get(3)?
                .split([',', ' ', '(', ')'])
                .filter(|word| packages.contains(*word))
                .map(str::to_owned)
                .collect();
            Some((name.to_owned(), deps))
        })
        .collect()
}

#[test]
fn architecture_lists_every_crate_and_its_workspace_dependencies() {
    let graph = workspace_graph();
    let packages: BTreeSet<String> = graph.keys().cloned().collect();
    let table = documented(&packages);
    let listed: BTreeSet<String> = table.keys().cloned().collect();
    assert_eq!(
        listed, packages,
        "docs/architecture.md's crate table lists these crates; the workspace has those"
    );
    for (name, deps) in &graph {
        assert_eq!(
            &table[name], deps,
            "docs/architecture.md: the workspace crates {name} depends on"
        );
    }
}
