//! Every relative link of the Markdown docs leads somewhere: the file or
//! folder it names exists, and a `#section` names a heading of that file
//! (GitHub's anchors: lower case, punctuation dropped, spaces as `-`, a
//! repeated heading numbered) or an `id`/`name` it declares. Links to
//! other sites are not followed. A section moved to another page shows up
//! here as the links that still point at its old place.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use crate::cmd::workspace_root;

/// The Markdown files a reader follows links in: the README,
/// CONTRIBUTING.md, the CHANGELOG, everything under docs/ (history
/// included) and every crate's and example's README.
fn markdown_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"]
        .iter()
        .map(|name| root.join(name))
        .filter(|path| path.is_file())
        .collect();
    files.extend(markdown_under(&root.join("docs")));
    for dir in ["crates", "examples"] {
        for entry in std::fs::read_dir(root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let readme = entry.path().join("README.md");
            if readme.is_file() {
                files.push(readme);
            }
        }
    }
    files.sort();
    files
}

/// Every Markdown file under `dir`, its folders included.
pub(super) fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for path in std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
    {
        if path.is_dir() {
            files.extend(markdown_under(&path));
        } else if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files
}

/// The lines of `text` outside fenced code blocks, with their numbers.
fn prose_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fence: Option<&str> = None;
    text.lines().enumerate().filter_map(move |(i, line)| {
        let trimmed = line.trim_start();
        for marker in ["```", "~~~"] {
            if trimmed.starts_with(marker) {
                match fence {
                    None => fence = Some(marker),
                    Some(open) if open == marker => fence = None,
                    Some(_) => {}
                }
                return None;
            }
        }
        fence.is_none().then_some((i + 1, line))
    })
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors a Markdown text declares: one per heading (a repeated one
/// numbered `-1`, `-2`…), and each `id="…"` or `name="…"` of its HTML.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let count = seen.entry(base.clone()).or_insert(0);
            anchors.insert(match *count {
                0 => base.clone(),
                n => format!("{base}-{n}"),
            });
            *count += 1;
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                rest = &rest[at + attr.len()..];
                if let Some(end) = rest.find('"') {
                    anchors.insert(rest[..end].to_owned());
                }
            }
        }
    }
    anchors
}

/// The targets of the inline links `[text](target)` and reference
/// definitions `[label]: target` of one line, inline code left out.
fn link_targets(line: &str) -> Vec<String> {
    let mut prose = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            prose.push_str(part);
        }
    }
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => return true,
                    ')' => depth -= 1,
                    _ => {}
                }
                false
            })
            .map(|(i, _)| i);
        if let Some(end) = end {
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            targets.push(target.trim_matches(['<', '>']).to_owned());
        }
    }
    let trimmed = prose.trim_start();
    if trimmed.starts_with('[')
        && let Some(at) = trimmed.find("]: ")
        && let Some(target) = trimmed[at + 3..].split_whitespace().next()
    {
        targets.push(target.to_owned());
    }
    targets
}

/// `base/relative` with `..` and `.` resolved.
fn resolve(base: &Path, relative: &str) -> PathBuf {
    let mut path = PathBuf::new();
    for component in base.join(relative).components() {
        match component {
            Component::ParentDir => {
                path.pop();
            }
            Component::CurDir => {}
            other => path.push(other),
        }
    }
    path
}

/// Every link of `files` that leads nowhere, as `file:line: target: why`.
fn broken_links(files: &[PathBuf]) -> Vec<String> {
    let root = workspace_root();
    let mut anchors_of: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).expect("a Markdown file");
        let name = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (number, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let linked = if path.is_empty() {
                    file.clone()
                } else {
                    resolve(file.parent().expect("a folder"), path)
                };
                if !linked.exists() {
                    broken.push(format!("{name}:{number}: {target}: no such file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if linked.extension().is_none_or(|e| e != "md") {
                    continue;
                }
                let known = anchors_of.entry(linked.clone()).or_insert_with(|| {
                    anchors(&std::fs::read_to_string(&linked).expect("a Markdown file"))
                });
                if !known.contains(anchor) {
                    broken.push(format!("{name}:{number}: {target}: no such section"));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_of_the_docs_names_a_file_and_section_that_exist() {
    let files = markdown_files();
    assert!(files.len() > 10, "the docs were not found: {files:?}");
    let broken = broken_links(&files);
    assert!(
        broken.is_empty(),
        "links that lead nowhere:\n{}",
        broken.join("\n")
    );
}

#[test]
fn anchors_follow_githubs_rules_for_headings() {
    let text = "# Operations runbook\n\
                ## Probing a live deployment: `outbox probe`\n\
                ```sh\n# not a heading\n```\n\
                ### Figures\n### Figures\n\
                ## TLS to Postgres and Redis\n\
                <a id=\"kept\"></a>\n";
    let found = anchors(text);
    let expected: BTreeSet<String> = [
        "operations-runbook",
        "probing-a-live-deployment-outbox-probe",
        "figures",
        "figures-1",
        "tls-to-postgres-and-redis",
        "kept",
    ]
    .map(String::from)
    .into();
    assert_eq!(found, expected);
}

#[test]
fn a_link_to_a_missing_file_or_section_is_reported_with_its_line() {
    let dir = std::env::temp_dir().join(format!("doc-links-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("b.md"), "# Here\n").unwrap();
    let a = dir.join("a.md");
    std::fs::write(
        &a,
        "[ok](b.md#here) [gone](c.md)\n`[code](nowhere.md)`\n[moved](b.md#there)\n\
         [site](https://example.com/x.md)\n[self](#top)\n# Top\n",
    )
    .unwrap();
    let broken = broken_links(std::slice::from_ref(&a));
    std::fs::remove_dir_all(&dir).unwrap();
    let name = a.display().to_string();
    assert_eq!(
        broken,
        [
            format!("{name}:1: c.md: no such file"),
            format!("{name}:3: b.md#there: no such section"),
        ]
    );
}
