//! The install story held to the workspace: every dependency line the docs
//! give an adopter (`name = { git = …, tag = … }`, `name = { path =
//! ".../crates/name" }`, `cargo install --git … --tag … name`) names a
//! publishable crate of the workspace, the workspace's `repository` and
//! the tag of its version; and the README's version table says what the
//! Cargo files say. Both read `cargo metadata`, so neither can drift.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::cmd::workspace_root;

/// What the docs' lines are checked against, from `cargo metadata`.
struct Workspace {
    /// Every package: name → whether it may be published.
    packages: BTreeMap<String, bool>,
    /// The `repository` and `version` the publishable crates inherit.
    repository: String,
    version: String,
    /// The minimum Rust version (`rust-version`).
    rust_version: String,
    /// Package → dependency name → version requirement (normal
    /// dependencies, optional ones included).
    requirements: BTreeMap<String, BTreeMap<String, String>>,
}

impl Workspace {
    fn read() -> Self {
        let metadata = crate::cmd::workspace_metadata().expect("cargo metadata");
        let packages = metadata["packages"].as_array().expect("packages");
        let publishable = |p: &Value| p["publish"].is_null();
        let first = packages
            .iter()
            .find(|p| publishable(p))
            .expect("a publishable crate");
        let text = |p: &Value, key: &str| p[key].as_str().unwrap_or_default().to_owned();
        let requirements = packages
            .iter()
            .map(|p| {
                let deps = p["dependencies"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|d| d["kind"].is_null())
                    .map(|d| (text(d, "name"), text(d, "req")))
                    .collect();
                (text(p, "name"), deps)
            })
            .collect();
        Self {
            packages: packages
                .iter()
                .map(|p| (text(p, "name"), publishable(p)))
                .collect(),
            repository: text(first, "repository"),
            version: text(first, "version"),
            rust_version: text(first, "rust_version"),
            requirements,
        }
    }

    /// The version requirement of `dependency` in `package`, without the
    /// caret cargo adds (`2.3` for `diesel = "2.3"`).
    fn requirement(&self, package: &str, dependency: &str) -> Option<String> {
        let req = self.requirements.get(package)?.get(dependency)?;
        Some(req.trim_start_matches('^').to_owned())
    }
}

/// One dependency line of the docs, where it was found.
#[derive(Debug, PartialEq, Eq)]
struct Coordinate {
    crate_name: String,
    git: Option<String>,
    tag: Option<String>,
    path: Option<String>,
}

/// The value of `key = "…"` in `text`.
fn quoted(text: &str, key: &str) -> Option<String> {
    let (_, rest) = text.split_once(&format!("{key} = \""))?;
    Some(rest.split('"').next()?.to_owned())
}

/// The outbox crates' dependency lines in `doc`: `outbox-… = { … }` with a
/// `git`, `path` or `version` key, `outbox-… = "<version>"`, and `cargo
/// install --git … --tag … outbox-…`.
fn coordinates(doc: &str) -> Vec<Coordinate> {
    let mut found = Vec::new();
    for line in doc.lines().map(str::trim) {
        // A line of a TOML block, or one quoted in a sentence.
        let name_and_table = line
            .split_once(" = {")
            .or_else(|| line.split_once(" = \""))
            .map(|(before, table)| {
                let name = before.rsplit([' ', '`']).next().unwrap_or(before);
                (name, table)
            });
        if let Some((name, table)) = name_and_table
            && name.starts_with("outbox-")
            && (table.contains("git = ")
                || table.contains("path = ")
                || table.contains("version = ")
                || table.starts_with(|c: char| c.is_ascii_digit()))
        {
            found.push(Coordinate {
                crate_name: name.to_owned(),
                git: quoted(table, "git"),
                tag: quoted(table, "tag"),
                path: quoted(table, "path"),
            });
        } else if let Some(rest) = line.strip_prefix("cargo install --git ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let tag = words.iter().position(|w| *w == "--tag");
            found.push(Coordinate {
                crate_name: words.last().copied().unwrap_or_default().to_owned(),
                git: words.first().map(|w| (*w).to_owned()),
                tag: tag.and_then(|i| words.get(i + 1)).map(|w| (*w).to_owned()),
                path: None,
            });
        }
    }
    found
}

/// What is wrong with `c` for `workspace`, if anything.
fn check(c: &Coordinate, workspace: &Workspace) -> Option<String> {
    let name = &c.crate_name;
    match workspace.packages.get(name) {
        None => return Some(format!("{name} is not a crate of the workspace")),
        Some(false) => return Some(format!("{name} is not publishable (publish = false)")),
        Some(true) => {}
    }
    if let Some(path) = &c.path {
        return (!path.ends_with(&format!("crates/{name}")))
            .then(|| format!("{name}: the path {path} does not end in crates/{name}"));
    }
    if c.git.is_none() {
        return Some(format!(
            "{name}: a version from crates.io, where the crates are not published: \
             give the git address and tag, or a path"
        ));
    }
    let tag = format!("v{}", workspace.version);
    if c.git.as_deref() != Some(workspace.repository.as_str()) {
        return Some(format!(
            "{name}: git {:?}, the workspace's repository is {:?}",
            c.git, workspace.repository
        ));
    }
    (c.tag.as_deref() != Some(tag.as_str())).then(|| {
        format!(
            "{name}: tag {:?}, the workspace's version is tagged {tag}",
            c.tag
        )
    })
}

/// The documents an adopter reads: the README, CONTRIBUTING.md, every
/// Markdown file under docs/ (its folders included), every crate's and
/// example's README, and the crates' sources, whose doc comments are the
/// API docs (see [`adopter_text`]).
fn documents() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut docs = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    docs.extend(
        super::doc_links::markdown_under(&root.join("docs"))
            .into_iter()
            .filter(|path| !path.starts_with(root.join("docs/history"))),
    );
    for dir in ["crates", "examples"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if dir == "crates" {
                docs.extend(rust_sources(&path.join("src")));
            }
            if path.extension().is_some_and(|e| e == "md") {
                docs.push(path);
            } else if path.join("README.md").is_file() {
                docs.push(path.join("README.md"));
            }
        }
    }
    docs.sort();
    docs
}

/// Every `.rs` file under `dir`.
fn rust_sources(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for path in entries.flatten().map(|e| e.path()) {
        if path.is_dir() {
            files.extend(rust_sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// What of `path` an adopter reads: a Rust file's doc comments (`//!`,
/// `///`), any other file whole.
fn adopter_text(path: &Path) -> String {
    let text = read(path);
    if path.extension().is_none_or(|e| e != "rs") {
        return text;
    }
    text.lines()
        .filter(|line| {
            let line = line.trim_start();
            line.starts_with("//!") || line.starts_with("///")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The README's version table: component → (version, notes).
fn version_table(readme: &str) -> BTreeMap<String, (String, String)> {
    let section = readme
        .split("<!-- versions:")
        .nth(1)
        .and_then(|rest| rest.split("<!-- end of versions -->").next())
        .expect("README.md has a version table between its markers");
    section
        .lines()
        .filter(|line| line.starts_with('|') && !line.starts_with("|---"))
        .skip(1)
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            Some((
                (*cells.get(1)?).to_owned(),
                ((*cells.get(2)?).to_owned(), (*cells.get(3)?).to_owned()),
            ))
        })
        .collect()
}

#[test]
fn every_dependency_line_in_the_docs_names_a_publishable_crate_at_the_workspaces_address_and_tag() {
    let workspace = Workspace::read();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for doc in documents() {
        for c in coordinates(&adopter_text(&doc)) {
            seen.insert(c.crate_name.clone());
            if let Some(problem) = check(&c, &workspace) {
                problems.push(format!("{}: {problem}", doc.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The crates the README's quick start depends on are among them.
    for name in ["outbox-publish", "outbox-worker", "outbox-subscriber"] {
        assert!(seen.contains(name), "no dependency line names {name}");
    }
}

#[test]
fn a_line_for_another_address_tag_or_crate_or_a_crates_io_version_is_refused() {
    let workspace = Workspace {
        packages: [("outbox-publish", true), ("outbox-tests", false)]
            .into_iter()
            .map(|(n, p)| (n.to_owned(), p))
            .collect(),
        repository: "https://example.invalid/outbox".into(),
        version: "0.1.0".into(),
        rust_version: "1.89".into(),
        requirements: BTreeMap::new(),
    };
    let doc = r#"
outbox-publish = { git = "https://example.invalid/outbox", tag = "v0.1.0" }
outbox-publish = { git = "https://example.invalid/other", tag = "v0.1.0" }
outbox-publish = { git = "https://example.invalid/outbox", tag = "v0.2.0" }
outbox-publish = { path = "../outbox/crates/outbox-publish" }
outbox-tests = { path = "../outbox/crates/outbox-tests" }
outbox-nothing = { git = "https://example.invalid/outbox", tag = "v0.1.0" }
outbox-publish = "0.1"
`outbox-publish = { version = "0.1", features = ["sqlx"] }` in a sentence
cargo install --git https://example.invalid/outbox --tag v0.1.0 outbox-publish
"#;
    let verdicts: Vec<Option<String>> = coordinates(doc)
        .iter()
        .map(|c| check(c, &workspace))
        .collect();
    assert_eq!(verdicts.len(), 9, "{verdicts:?}");
    assert!(verdicts[0].is_none() && verdicts[3].is_none() && verdicts[8].is_none());
    for (i, wanted) in [
        (1, "the workspace's repository"),
        (2, "tagged v0.1.0"),
        (4, "not publishable"),
        (5, "not a crate of the workspace"),
        (6, "not published"),
        (7, "not published"),
    ] {
        let verdict = verdicts[i].as_deref().unwrap_or_default();
        assert!(verdict.contains(wanted), "line {i}: {verdict}");
    }
}

#[test]
fn the_readmes_version_table_says_what_the_cargo_files_say() {
    let workspace = Workspace::read();
    let readme = read(&workspace_root().join("README.md"));
    let table = version_table(&readme);
    let components: BTreeSet<&str> = table.keys().map(String::as_str).collect();
    assert_eq!(
        components,
        BTreeSet::from([
            "Rust",
            "diesel",
            "diesel-async",
            "sqlx",
            "Postgres",
            "Redis"
        ]),
        "README.md's version table: each row needs a check here"
    );
    let version = |component: &str| table[component].0.as_str();
    assert_eq!(
        version("Rust"),
        format!("{} or later", workspace.rust_version),
        "the workspace's rust-version"
    );
    for (component, crate_name) in [
        ("diesel", "outbox-model"),
        ("diesel-async", "outbox-publish"),
    ] {
        assert_eq!(
            Some(version(component).to_owned()),
            workspace.requirement(crate_name, component),
            "{component}: the version {crate_name} depends on"
        );
    }
    // sqlx: checked once outbox-publish depends on it (its `sqlx` feature).
    if let Some(sqlx) = workspace.requirement("outbox-publish", "sqlx") {
        assert_eq!(
            version("sqlx"),
            sqlx,
            "sqlx: the version outbox-publish depends on"
        );
    }

    // Postgres and Redis: what the other documents say.
    let postgres = version("Postgres");
    let adopting = read(&workspace_root().join("docs/adopting.md")).replace('\n', " ");
    let adopting = adopting.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        adopting.contains(&format!("need Postgres {postgres}")),
        "docs/adopting.md gives another minimum Postgres than {postgres}"
    );
    for doc in documents() {
        let text = read(&doc).split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some((_, rest)) = text.split_once("Requires Postgres ") {
            assert!(
                rest.starts_with(postgres),
                "{}: another minimum Postgres than {postgres}",
                doc.display()
            );
        }
    }
    let tested = |notes: &str| {
        notes
            .split("the tests run on ")
            .nth(1)
            .map(|v| v.split(';').next().unwrap_or(v).to_owned())
    };
    let (pg_tested, redis_tested) = (
        tested(&table["Postgres"].1).expect("Postgres: the version the tests run on"),
        tested(&table["Redis"].1).expect("Redis: the version the tests run on"),
    );
    assert!(
        adopting.contains(&format!("Postgres {pg_tested} and Redis {redis_tested}")),
        "docs/adopting.md names other tested versions than Postgres {pg_tested} and Redis {redis_tested}"
    );
    assert!(
        redis_tested.starts_with(version("Redis").trim_end_matches(" or later")),
        "Redis: tested on {redis_tested}, below the minimum the table gives"
    );
}
