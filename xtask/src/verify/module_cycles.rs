//! No module of the workspace's crates imports a module that imports it
//! back. Read from the sources: each file is a module (`a/b.rs` and
//! `a/b/mod.rs` are `a::b`), and it refers to another through a
//! `crate::…` path (the longest prefix that is a module) or a `super::…`
//! path (a sibling, or else the parent), outside comments and `#[cfg(test)]
//! mod tests`. A child named by its bare name from its parent is not a
//! reference here, so a parent and the children it declares never count
//! as a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::cmd::workspace_root;

/// Module path → source, for the `src` folder `root`.
fn modules(root: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for path in crate::verify::table_owner::rust_files(root) {
        let relative = path.strip_prefix(root).unwrap_or(&path).with_extension("");
        let mut parts: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts
            .last()
            .is_some_and(|last| matches!(last.as_str(), "mod" | "lib" | "main"))
        {
            parts.pop();
        }
        let name = if parts.is_empty() {
            "crate".to_owned()
        } else {
            parts.join("::")
        };
        found.insert(name, std::fs::read_to_string(&path).unwrap_or_default());
    }
    found
}

/// The code of `source` without its test module and its comments.
fn code(source: &str) -> String {
    let source = source
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    source
        .lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers of the path that follows each `prefix` in `code`.
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        paths.push(
            rest[..end]
                .split("::")
                .filter(|part| !part.is_empty())
                .collect(),
        );
    }
    paths
}

/// Module → the modules it refers to.
fn references(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, source) in modules {
        let code = code(source);
        let own: Vec<&str> = if module == "crate" {
            Vec::new()
        } else {
            module.split("::").collect()
        };
        let targets = edges.entry(module.clone()).or_default();
        for path in paths_after(&code, "crate::") {
            let found = (1..=path.len())
                .rev()
                .map(|n| path[..n].join("::"))
                .find(|candidate| modules.contains_key(candidate));
            if let Some(target) = found.filter(|t| t != module) {
                targets.insert(target);
            }
        }
        for path in paths_after(&code, "super::") {
            let Some(first) = path.first() else { continue };
            let parent = &own[..own.len().saturating_sub(1)];
            let sibling = parent
                .iter()
                .copied()
                .chain([*first])
                .collect::<Vec<_>>()
                .join("::");
            let parent = if parent.is_empty() {
                "crate".to_owned()
            } else {
                parent.join("::")
            };
            let target = if modules.contains_key(&sibling) {
                sibling
            } else {
                parent
            };
            if &target != module && modules.contains_key(&target) {
                targets.insert(target);
            }
        }
    }
    edges
}

/// The pairs of modules of `root` that refer to each other.
fn cycles(root: &Path) -> Vec<(String, String)> {
    let edges = references(&modules(root));
    let mut pairs = Vec::new();
    for (a, targets) in &edges {
        for b in targets {
            if a < b && edges.get(b).is_some_and(|back| back.contains(a)) {
                pairs.push((a.clone(), b.clone()));
            }
        }
    }
    pairs
}

#[test]
fn no_module_refers_to_one_that_refers_back_to_it() {
    let root = workspace_root();
    let mut roots = vec![root.join("xtask/src")];
    for entry in std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
    {
        roots.push(entry.path().join("src"));
    }
    let found: Vec<String> = roots
        .iter()
        .flat_map(|src| {
            cycles(src)
                .into_iter()
                .map(move |(a, b)| format!("{}: {a} <-> {b}", src.display()))
        })
        .collect();
    assert!(
        found.is_empty(),
        "modules referring to each other: {found:#?}"
    );
}

#[test]
fn two_siblings_that_refer_to_each_other_are_a_cycle() {
    let dir = std::env::temp_dir().join(format!("xtask-cycles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\n").expect("lib.rs");
    std::fs::write(
        dir.join("a.rs"),
        "use crate::b::B;\n// crate::c is a comment\n",
    )
    .expect("a.rs");
    std::fs::write(dir.join("b.rs"), "pub fn f() { super::a::g() }\n").expect("b.rs");
    std::fs::write(dir.join("c.rs"), "use crate::a;\n").expect("c.rs");
    let found = cycles(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(found, vec![("a".to_owned(), "b".to_owned())]);
}
