//! Every relative link of the Markdown docs leads somewhere: the file or
//! folder it names exists, and a `#section` names a heading of that file
//! (GitHub's anchors: lower case, punctuation dropped, spaces as `-`, a
//! repeated heading numbered) or an `id`/`name` it declares. Links to
//! other sites are not followed. A section moved to another page shows up
//! here as the links that still point at its old place. Sections named in
//! prose the way docs and code comments name them, a page from the root
//! and a quoted name (`docs/operations/retention.md, "Retention"`), are
//! held to that page's headings and bold paragraph leads the same way.

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

/// The names of `text`'s sections: each heading's text and each bold
/// paragraph lead (`**The wake gate.**`), inline code marks dropped.
fn section_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            names.insert(line[hashes..].trim().replace('`', ""));
        }
        let lead = line.trim_start().trim_start_matches("- ");
        if let Some(bold) = lead.strip_prefix("**")
            && let Some(end) = bold.find("**")
        {
            names.insert(bold[..end].trim_end_matches('.').replace('`', ""));
        }
    }
    names
}

/// The characters that may stand between a page and the quoted name of
/// one of its sections: closing marks, commas, spaces, line breaks and
/// the comment markers of Rust and YAML (`//!`, `///`, `#`), and the
/// backslash of a quote inside a Rust string.
fn between_page_and_name(c: char) -> bool {
    c.is_whitespace() || "`),(/!#\\".contains(c)
}

/// Every section named as `docs/<page>.md, "Name"` in `text`: (line,
/// page, name), the name's line breaks and comment markers made spaces.
fn named_sections(text: &str) -> Vec<(usize, String, String)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("docs/") {
        let start = from + at;
        from = start + 5;
        let page_len = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_/.-".contains(c)))
            .unwrap_or(text.len() - start);
        let page = &text[start..start + page_len];
        if !page.ends_with(".md") {
            continue;
        }
        let rest = &text[start + page_len..];
        let gap = rest
            .find(|c: char| !between_page_and_name(c))
            .unwrap_or(rest.len());
        if gap > 40 || !rest[gap..].starts_with('"') {
            continue;
        }
        let quoted = &rest[gap + 1..];
        let Some(end) = quoted.find(['"', '\\']) else {
            continue;
        };
        let name = quoted[..end]
            .split_whitespace()
            .filter(|word| !["//!", "///", "//", "#"].contains(word))
            .collect::<Vec<_>>()
            .join(" ")
            .replace('`', "");
        if name.starts_with(|c: char| c.is_uppercase()) {
            let line = text[..start].matches('\n').count() + 1;
            found.push((line, page.to_owned(), name));
        }
    }
    found
}

/// The files whose prose and comments name sections of the docs: every
/// Markdown, Rust, YAML and TOML file of the workspace but the history
/// of runs, the changelog, build output and this file (whose tests name
/// pages that do not exist).
fn files_naming_sections(dir: &Path, files: &mut Vec<PathBuf>) {
    for path in std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
    {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !(name.starts_with('.') || ["target", "history", "node_modules"].contains(&name)) {
                files_naming_sections(&path, files);
            }
        } else if name != "CHANGELOG.md"
            && !path.ends_with("verify/doc_links.rs")
            && path
                .extension()
                .is_some_and(|e| ["md", "rs", "yml", "toml"].contains(&e.to_str().unwrap_or("")))
        {
            files.push(path);
        }
    }
}

/// Every section named as `docs/<page>.md, "Name"` in `files` that
/// `root`'s page does not have, as `file:line: page, "Name": why`.
fn missing_sections(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut names_of: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
    let mut missing = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (line, page, name) in named_sections(&text) {
            let names = names_of.entry(page.clone()).or_insert_with(|| {
                std::fs::read_to_string(root.join(&page))
                    .ok()
                    .map(|text| section_names(&text))
            });
            match names {
                None => missing.push(format!("{shown}:{line}: {page}, \"{name}\": no such file")),
                Some(names) if !names.iter().any(|s| s.starts_with(&name)) => {
                    missing.push(format!(
                        "{shown}:{line}: {page}, \"{name}\": no such section"
                    ));
                }
                Some(_) => {}
            }
        }
    }
    missing
}

#[test]
fn every_section_the_docs_and_comments_name_by_page_and_quoted_name_is_on_that_page() {
    let root = workspace_root();
    let mut files = Vec::new();
    files_naming_sections(&root, &mut files);
    assert!(files.len() > 100, "the workspace's files were not found");
    let missing = missing_sections(&root, &files);
    assert!(
        missing.is_empty(),
        "sections named where they are not:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_section_named_in_a_comment_across_lines_is_found_and_checked() {
    let dir = std::env::temp_dir().join(format!("doc-sections-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(
        dir.join("docs/page.md"),
        "# Page\n## The claim index\n**The wake gate.** Text.\n",
    )
    .unwrap();
    let code = dir.join("lib.rs");
    std::fs::write(
        &code,
        "//! See docs/page.md, \"The claim\n//! index\" and (docs/page.md, \"The wake gate\").\n\
         /// docs/page.md (\"Moved away\"); docs/gone.md, \"Page\"; docs/page.md says \"Other\"\n\
         const M: &str = \"docs/page.md, \\\"Page\\\"\";\n",
    )
    .unwrap();
    let missing = missing_sections(&dir, std::slice::from_ref(&code));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        missing,
        [
            "lib.rs:3: docs/page.md, \"Moved away\": no such section",
            "lib.rs:3: docs/gone.md, \"Page\": no such file",
        ]
    );
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
