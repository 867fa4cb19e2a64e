//! `cargo xtask inventory`: the source inventory of the workflow boundary,
//! the rules of it that types cannot express.
//!
//! Most of the boundary is held by crate dependencies, not here: the
//! producers live in `outbox-workflow-store`, which depends on neither the
//! runner, the sandbox nor the bridge, so no producer can run a workflow in
//! place; `execute_trigger` (create and run in one step) is private to
//! `outbox-workflow-bridge`. Two tests below hold the dependency graph
//! (from `cargo metadata`) to that:
//! `producer_side_crates_cannot_reach_the_runner` and
//! `the_workflow_model_depends_on_no_database_runtime_or_network_crate`
//! (see docs/architecture.md, "The workflow crates"). What remains are
//! rules about what a function does or which names exist, which no
//! dependency can say:
//!
//! - [`MANUAL_AND_API_RUNS_PUBLISH`]: `fn request_execution` exists and
//!   publishes `EXECUTION_REQUESTED`. The store may name the event type and
//!   still not publish it (create the execution and stop); only the body
//!   says whether it does.
//! - [`CONTINUATIONS_PUBLISH`]: `fn request_continuation` exists and
//!   publishes `CONTINUE_REQUESTED`; and outside the runner, the bridge and
//!   the workflow subscriber crates nothing calls `.resume(`. Crates that
//!   must depend on the runner to build it (the worker's composition root,
//!   the sandbox) could call `Runner::resume`, a public method: a
//!   dependency is all or nothing, so only the sources tell who calls it.
//! - [`NO_LEGACY_TRIGGER_FACADE`]: no `fn trigger` and no `WorkflowEngine`
//!   anywhere. No type forbids a name that does not exist yet.
//!
//! Reads the production sources (`crates/*/src/**/*.rs`; `xtask`, the
//! crates' `tests/` directories and the workspace's `tests` crate are not
//! under `crates/*/src`, so they are not read).
//!
//! Matching is on tokens: comments (doc comments included), string, byte,
//! raw and char literals are dropped first, lifetimes are not identifiers,
//! and names match whole identifiers (`r#name` is `name`). Test code is
//! left out as follows: an item `#[cfg(test)] mod name { … }` is skipped,
//! `#[cfg(test)] mod name;` skips the module's file (and its directory of
//! submodules), and a file starting with `#![cfg(test)]` is skipped. Other
//! items under `#[cfg(test)]` (a lone function, an impl) are checked like
//! production code.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// R1: manual and API runs are requested by publishing, never run in place.
pub const MANUAL_AND_API_RUNS_PUBLISH: &str = "manual-and-api-runs-publish";
/// R2: continuations are published; only the subscriber side resumes.
pub const CONTINUATIONS_PUBLISH: &str = "continuations-publish";
/// R4: no engine-level direct trigger entry point. (R3, `execute_trigger`
/// only in the bridge, is the bridge crate's visibility now.)
pub const NO_LEGACY_TRIGGER_FACADE: &str = "no-legacy-trigger-facade";

/// The producers' file (where a missing `request_*` function is reported).
const PRODUCERS: &str = "crates/outbox-workflow-store/src/producers.rs";
/// The crates that may resume a run: the runner itself, the bridge (its
/// executor and its server) and the `outbox.workflow` subscriber.
const RESUMING_CRATES: &[&str] = &[
    "crates/outbox-workflow-runner/",
    "crates/outbox-workflow-bridge/",
    "crates/outbox-subscriber-workflow/",
];

/// One broken rule at one place.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// The file, relative to the workspace root, with `/` separators.
    pub path: String,
    /// The 1-based line.
    pub line: usize,
    /// The rule's name (one of the constants of this module).
    pub rule: &'static str,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: [{}] {}",
            self.path, self.line, self.rule, self.message
        )
    }
}

/// Runs the check over the workspace and prints each violation; fails
/// (exit 1) when there is any.
pub fn run() -> Result<()> {
    let root = crate::cmd::workspace_root();
    let sources = production_sources(&root)?;
    let violations = check_sources(&sources);
    for violation in &violations {
        println!("{violation}");
    }
    if !violations.is_empty() {
        bail!(
            "source inventory: {} violation(s) in {} files read",
            violations.len(),
            sources.len()
        );
    }
    eprintln!("source inventory: {} files, no violations", sources.len());
    Ok(())
}

/// The production sources under `root`: every `crates/*/src/**/*.rs`, as
/// (path relative to `root` with `/` separators, text), sorted by path.
///
/// # Errors
///
/// A directory or file cannot be read.
pub fn production_sources(root: &Path) -> Result<Vec<(String, String)>> {
    let mut files = Vec::new();
    let crates = root.join("crates");
    for entry in read_dir_sorted(&crates)? {
        let src = entry.join("src");
        if src.is_dir() {
            collect_rs(root, &src, &mut files)?;
        }
    }
    files.sort();
    Ok(files)
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut paths = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("cannot read {}", dir.display()))?;
    paths.sort();
    Ok(paths)
}

fn collect_rs(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) -> Result<()> {
    for path in read_dir_sorted(dir)? {
        if path.is_dir() {
            collect_rs(root, &path, files)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let relative = path.strip_prefix(root).unwrap_or(&path);
            let relative = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            files.push((relative, text));
        }
    }
    Ok(())
}

/// Checks `sources` ((path relative to the workspace root, text)) against
/// the three rules; the violations sorted by path and line, one per rule
/// and line.
#[must_use]
pub fn check_sources(sources: &[(String, String)]) -> Vec<Violation> {
    let lexed: Vec<(String, Lexed)> = sources
        .iter()
        .map(|(path, text)| (path.clone(), lex_production(text)))
        .collect();
    let test_only: Vec<String> = lexed
        .iter()
        .flat_map(|(path, lexed)| {
            lexed
                .test_modules
                .iter()
                .flat_map(|name| module_paths(path, name))
        })
        .collect();
    let files: Vec<(&str, &[Token])> = lexed
        .iter()
        .filter(|(path, lexed)| {
            !lexed.test_only_file && !test_only.iter().any(|p| in_path(path, p))
        })
        .map(|(path, lexed)| (path.as_str(), lexed.tokens.as_slice()))
        .collect();

    let mut findings = Findings::default();
    let (mut request_execution, mut request_continuation) = (false, false);
    for &(path, tokens) in &files {
        request_execution |= manual_and_api_runs_publish(path, tokens, &mut findings);
        request_continuation |= continuations_publish(path, tokens, &mut findings);
        no_legacy_trigger_facade(path, tokens, &mut findings);
    }
    // A rule about a function that is gone cannot hold.
    if !request_execution {
        findings.report(
            PRODUCERS,
            1,
            MANUAL_AND_API_RUNS_PUBLISH,
            "no `fn request_execution` in the production sources".into(),
        );
    }
    if !request_continuation {
        findings.report(
            PRODUCERS,
            1,
            CONTINUATIONS_PUBLISH,
            "no `fn request_continuation` in the production sources".into(),
        );
    }
    findings.into_violations()
}

/// Violations found so far: one per (path, line, rule), with the first
/// finding's message.
#[derive(Default)]
struct Findings(BTreeMap<(String, usize, &'static str), String>);

impl Findings {
    fn report(&mut self, path: &str, line: usize, rule: &'static str, message: String) {
        self.0
            .entry((path.to_owned(), line, rule))
            .or_insert(message);
    }

    fn into_violations(self) -> Vec<Violation> {
        self.0
            .into_iter()
            .map(|((path, line, rule), message)| Violation {
                path,
                line,
                rule,
                message,
            })
            .collect()
    }
}

/// R1 on one file; whether it defines `request_execution`.
fn manual_and_api_runs_publish(path: &str, tokens: &[Token], findings: &mut Findings) -> bool {
    publishing_function(
        path,
        tokens,
        "request_execution",
        "EXECUTION_REQUESTED",
        MANUAL_AND_API_RUNS_PUBLISH,
        findings,
    )
}

/// R2 on one file; whether it defines `request_continuation`.
fn continuations_publish(path: &str, tokens: &[Token], findings: &mut Findings) -> bool {
    let rule = CONTINUATIONS_PUBLISH;
    let found = publishing_function(
        path,
        tokens,
        "request_continuation",
        "CONTINUE_REQUESTED",
        rule,
        findings,
    );
    if !RESUMING_CRATES.iter().any(|krate| path.starts_with(krate)) {
        for line in method_calls(tokens, "resume") {
            let message = "`.resume(` outside the runner, the bridge and the workflow \
                           subscriber: publish a continuation instead"
                .into();
            findings.report(path, line, rule, message);
        }
    }
    found
}

/// Checks every `fn name` in `tokens` for `rule`: its body names `event`.
/// Whether there is one.
fn publishing_function(
    path: &str,
    tokens: &[Token],
    name: &str,
    event: &str,
    rule: &'static str,
    findings: &mut Findings,
) -> bool {
    let bodies = function_bodies(tokens, name);
    for body in &bodies {
        let body = &tokens[body.clone()];
        if !body.iter().any(|t| t.is_ident(event)) {
            let message = format!("{name} does not publish {event}");
            findings.report(path, body[0].line, rule, message);
        }
    }
    !bodies.is_empty()
}

/// R4 on one file.
fn no_legacy_trigger_facade(path: &str, tokens: &[Token], findings: &mut Findings) {
    let rule = NO_LEGACY_TRIGGER_FACADE;
    for pair in tokens.windows(2) {
        if pair[0].is_ident("fn") && pair[1].is_ident("trigger") {
            let message = "`fn trigger`: a direct trigger entry point; publish a workflow event";
            findings.report(path, pair[0].line, rule, message.into());
        }
    }
    for token in tokens.iter().filter(|t| t.is_ident("WorkflowEngine")) {
        let message = "`WorkflowEngine`: the legacy engine facade".into();
        findings.report(path, token.line, rule, message);
    }
}

/// Whether `path` is `prefix` itself or lies under the directory `prefix`
/// (which then ends with `/`).
fn in_path(path: &str, prefix: &str) -> bool {
    if prefix.ends_with('/') {
        path.starts_with(prefix)
    } else {
        path == prefix
    }
}

/// The file and directory of module `name` declared (`mod name;`) in the
/// file `path`.
fn module_paths(path: &str, name: &str) -> [String; 2] {
    let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
    let is_root = matches!(file, "lib.rs" | "main.rs" | "mod.rs") || dir.ends_with("/src/bin");
    let base = if is_root {
        dir.to_owned()
    } else {
        format!("{dir}/{}", file.trim_end_matches(".rs"))
    };
    [format!("{base}/{name}.rs"), format!("{base}/{name}/")]
}

/// Lines of `.name(` and `.name::<…>(` in `tokens`.
fn method_calls<'t>(tokens: &'t [Token], name: &'t str) -> impl Iterator<Item = usize> + 't {
    tokens.windows(3).filter_map(move |w| {
        let call =
            w[0].is_punct('.') && w[1].is_ident(name) && (w[2].is_punct('(') || w[2].is_punct(':'));
        call.then_some(w[1].line)
    })
}

/// The token ranges of the bodies (`{` to `}`) of every `fn name`.
fn function_bodies(tokens: &[Token], name: &str) -> Vec<std::ops::Range<usize>> {
    let mut bodies = Vec::new();
    for i in 0..tokens.len().saturating_sub(1) {
        if !(tokens[i].is_ident("fn") && tokens[i + 1].is_ident(name)) {
            continue;
        }
        // The signature ends at the body's `{`, or at `;` (no body), outside
        // parentheses and brackets.
        let mut depth = 0usize;
        for j in i + 2..tokens.len() {
            match &tokens[j].kind {
                Kind::Punct('(' | '[') => depth += 1,
                Kind::Punct(')' | ']') => depth = depth.saturating_sub(1),
                Kind::Punct(';') if depth == 0 => break,
                Kind::Punct('{') if depth == 0 => {
                    let end = matching(tokens, j, '{', '}');
                    bodies.push(j..end + 1);
                    break;
                }
                _ => {}
            }
        }
    }
    bodies
}

/// The index of the token closing the `open` at `start` (the last token
/// when it is never closed).
fn matching(tokens: &[Token], start: usize, open: char, close: char) -> usize {
    let mut depth = 0usize;
    for (j, token) in tokens.iter().enumerate().skip(start) {
        if token.is_punct(open) {
            depth += 1;
        } else if token.is_punct(close) {
            depth -= 1;
            if depth == 0 {
                return j;
            }
        }
    }
    tokens.len().saturating_sub(1)
}

/// A token of the comment- and literal-free source.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    kind: Kind,
    /// 1-based.
    line: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// An identifier or keyword (`r#` removed).
    Ident(String),
    /// Any other character that is not whitespace.
    Punct(char),
}

impl Token {
    fn ident(&self) -> Option<&str> {
        match &self.kind {
            Kind::Ident(ident) => Some(ident),
            Kind::Punct(_) => None,
        }
    }

    fn is_ident(&self, name: &str) -> bool {
        self.ident() == Some(name)
    }

    fn is_punct(&self, c: char) -> bool {
        self.kind == Kind::Punct(c)
    }

    fn text(&self) -> String {
        match &self.kind {
            Kind::Ident(ident) => ident.clone(),
            Kind::Punct(c) => c.to_string(),
        }
    }
}

/// A file's production tokens.
#[derive(Debug, Default)]
struct Lexed {
    /// The tokens outside `#[cfg(test)] mod … { … }`.
    tokens: Vec<Token>,
    /// Out-of-line test modules (`#[cfg(test)] mod name;`).
    test_modules: Vec<String>,
    /// The file starts with `#![cfg(test)]`.
    test_only_file: bool,
}

fn lex_production(source: &str) -> Lexed {
    let tokens = lex(source);
    let mut lexed = Lexed::default();
    // Inner attributes come first.
    let mut i = 0;
    while i + 2 < tokens.len()
        && tokens[i].is_punct('#')
        && tokens[i + 1].is_punct('!')
        && tokens[i + 2].is_punct('[')
    {
        let end = matching(&tokens, i + 2, '[', ']');
        if is_cfg_test(&tokens[i + 3..end]) {
            lexed.test_only_file = true;
            return lexed;
        }
        i = end + 1;
    }
    let mut i = 0;
    while i < tokens.len() {
        if let Some(skip) = test_module_at(&tokens, i, &mut lexed.test_modules) {
            i = skip;
        } else {
            lexed.tokens.push(tokens[i].clone());
            i += 1;
        }
    }
    lexed
}

/// Whether an attribute's content is exactly `cfg(test)`.
fn is_cfg_test(content: &[Token]) -> bool {
    let expected = ["cfg", "(", "test", ")"];
    content.len() == expected.len() && content.iter().zip(expected).all(|(t, e)| t.text() == e)
}

/// When `#[cfg(test)]` at `i` starts a `mod` item: the index after the item
/// (recording the name of an out-of-line module). `None` otherwise.
fn test_module_at(tokens: &[Token], i: usize, test_modules: &mut Vec<String>) -> Option<usize> {
    let attribute = |at: usize| {
        (at + 1 < tokens.len() && tokens[at].is_punct('#') && tokens[at + 1].is_punct('['))
            .then(|| matching(tokens, at + 1, '[', ']'))
    };
    let end = attribute(i)?;
    if !is_cfg_test(&tokens[i + 2..end]) {
        return None;
    }
    let mut j = end + 1;
    while let Some(end) = attribute(j) {
        j = end + 1;
    }
    if tokens.get(j)?.is_ident("pub") {
        j += 1;
        if tokens.get(j)?.is_punct('(') {
            j = matching(tokens, j, '(', ')') + 1;
        }
    }
    if !tokens.get(j)?.is_ident("mod") {
        return None;
    }
    let name = tokens.get(j + 1)?.ident()?.to_owned();
    let after = tokens.get(j + 2)?;
    if after.is_punct(';') {
        test_modules.push(name);
        Some(j + 3)
    } else if after.is_punct('{') {
        Some(matching(tokens, j + 2, '{', '}') + 1)
    } else {
        None
    }
}

/// Splits `source` into identifiers and punctuation, dropping whitespace,
/// comments, literals (strings, chars, numbers) and lifetimes.
fn lex(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Skips from `from` to `to` (exclusive), counting lines.
    let skip = |from: usize, to: usize, line: &mut usize| {
        *line += chars[from..to.min(chars.len())]
            .iter()
            .filter(|&&c| c == '\n')
            .count();
        to
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let end = block_comment_end(&chars, i);
            i = skip(i, end, &mut line);
        } else if c == '"' {
            let end = string_end(&chars, i + 1);
            i = skip(i, end, &mut line);
        } else if c == '\'' {
            i = skip(i, quote_end(&chars, i), &mut line);
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let after = chars.get(i).copied();
            match (word.as_str(), after) {
                ("r" | "br" | "cr", Some('"' | '#')) if raw_string_start(&chars, i) => {
                    let end = raw_string_end(&chars, i);
                    i = skip(i, end, &mut line);
                }
                ("b" | "c", Some('"')) => {
                    let end = string_end(&chars, i + 1);
                    i = skip(i, end, &mut line);
                }
                ("b", Some('\'')) => i = skip(i, quote_end(&chars, i), &mut line),
                ("r", Some('#'))
                    if chars
                        .get(i + 1)
                        .is_some_and(|c| c.is_alphabetic() || *c == '_') =>
                {
                    // A raw identifier: `r#name` is `name`.
                    i += 1;
                }
                _ => tokens.push(Token {
                    kind: Kind::Ident(word),
                    line,
                }),
            }
        } else {
            tokens.push(Token {
                kind: Kind::Punct(c),
                line,
            });
            i += 1;
        }
    }
    tokens
}

/// The index after the (nested) block comment starting at `start`.
fn block_comment_end(chars: &[char], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i < chars.len() {
        if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    chars.len()
}

/// The index after the closing `"` of a string whose content starts at
/// `i`.
fn string_end(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// At a `'` (index `i`): the index after the char literal (`'a'`, `'\n'`,
/// `'\u{…}'`), or after the lifetime or label (`'a`, `'static`).
fn quote_end(chars: &[char], i: usize) -> usize {
    match (chars.get(i + 1), chars.get(i + 2)) {
        (Some('\\'), _) => {
            let mut j = i + 3;
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            j + 1
        }
        (Some(_), Some('\'')) => i + 3,
        _ => {
            let mut j = i + 1;
            while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            j
        }
    }
}

/// Whether the `#`s from `i` (maybe none) are followed by `"`.
fn raw_string_start(chars: &[char], mut i: usize) -> bool {
    while chars.get(i) == Some(&'#') {
        i += 1;
    }
    chars.get(i) == Some(&'"')
}

/// The index after a raw string whose `#`s (or `"`) start at `i`.
fn raw_string_end(chars: &[char], mut i: usize) -> usize {
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    i += 1; // the opening quote
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    chars.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules a set of files breaks, as (rule, path, line).
    fn hits(files: &[(&str, &str)]) -> Vec<(&'static str, String, usize)> {
        let sources: Vec<(String, String)> = files
            .iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect();
        check_sources(&sources)
            .into_iter()
            .map(|v| (v.rule, v.path, v.line))
            .collect()
    }

    /// Producers that follow R1 and R2.
    const GOOD_PRODUCERS: &str = r#"
        //! Producers. Nothing here runs a workflow (this crate has no runner).
        use crate::events::{CONTINUE_REQUESTED, EXECUTION_REQUESTED};

        /// Publishes a run request; the subscriber calls `Runner::run`.
        pub async fn request_execution(tx: &mut OutboxTx<'_>) -> Result<Uuid, E> {
            let event = NewOutboxEvent::new(t, EXECUTION_REQUESTED, payload);
            let note = "never runner.run(conn, id) or execute_trigger here";
            publish_outbox_event(tx, event).await?;
            Ok(id)
        }

        pub async fn request_continuation(tx: &mut OutboxTx<'_>) -> Result<(), E> {
            /* not runner.resume(...) */
            let kind = if at.is_some() { '"' } else { 'x' };
            publish_outbox_event(tx, NewOutboxEvent::new(t, CONTINUE_REQUESTED, p)).await
        }
    "#;

    fn with_producers(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut files = vec![(PRODUCERS, GOOD_PRODUCERS)];
        files.extend_from_slice(extra);
        files
    }

    /// No line.
    const NONE: [usize; 0] = [];

    /// The lines of `path` that break `rule`, the file being `text` (next
    /// to the compliant producers unless it is the producers' file).
    fn lines(rule: &str, path: &'static str, text: &'static str) -> Vec<usize> {
        let files = if path == PRODUCERS {
            vec![(path, text)]
        } else {
            with_producers(&[(path, text)])
        };
        hits(&files)
            .into_iter()
            .filter(|(r, p, _)| *r == rule && p == path)
            .map(|(_, _, line)| line)
            .collect()
    }

    #[test]
    fn compliant_producers_pass() {
        assert_eq!(hits(&with_producers(&[])), []);
    }

    #[test]
    fn r1_requires_request_execution_to_publish_execution_requested() {
        let rule = MANUAL_AND_API_RUNS_PUBLISH;
        let silent = "pub async fn request_execution() { store::create(x) }\n\
                      pub async fn request_continuation() { publish(CONTINUE_REQUESTED) }";
        assert_eq!(lines(rule, PRODUCERS, silent), [1]);
        // Renamed away: the rule cannot hold, so it fails.
        let gone = "pub async fn request_continuation() { publish(CONTINUE_REQUESTED) }";
        assert_eq!(lines(rule, PRODUCERS, gone), [1]);
    }

    #[test]
    fn r2_catches_a_continuation_that_resumes() {
        let rule = CONTINUATIONS_PUBLISH;
        let resumes = r#"
            pub async fn request_execution() { publish(EXECUTION_REQUESTED) }
            pub async fn request_continuation(r: &R) {
                publish(CONTINUE_REQUESTED);
                r.resume(conn, id, block, kind, input).await
            }
        "#;
        assert_eq!(lines(rule, PRODUCERS, resumes), [5]);
        let silent = "pub async fn request_execution() { publish(EXECUTION_REQUESTED) }\n\
                      pub async fn request_continuation() { publish(OTHER) }";
        assert_eq!(lines(rule, PRODUCERS, silent), [2]);
    }

    #[test]
    fn r2_allows_resume_only_on_the_subscriber_side() {
        let rule = CONTINUATIONS_PUBLISH;
        let resume = "async fn go(r: &Runner) { r.resume(c, id, b, k, i).await; }";
        for path in [
            "crates/outbox-workflow-runner/src/lib.rs",
            "crates/outbox-workflow-bridge/src/executor.rs",
            "crates/outbox-workflow-bridge/src/stream.rs",
            "crates/outbox-subscriber-workflow/src/lib.rs",
        ] {
            assert_eq!(lines(rule, path, resume), NONE, "{path}");
        }
        for path in [
            "crates/outbox-worker/src/lib.rs",
            "crates/outbox-workflow-store/src/db.rs",
            "crates/outbox-workflow-sandbox/src/lib.rs",
            "crates/outbox-workflow-runners/src/lib.rs",
        ] {
            assert_eq!(lines(rule, path, resume), [1], "{path}");
        }
        // Not a call of `.resume(`: a function named resume, a comment.
        let other = "fn resume() {} // r.resume(x)\nfn f() { resume_unwind(p) }";
        assert_eq!(lines(rule, "crates/outbox-worker/src/lib.rs", other), NONE);
    }

    #[test]
    fn r4_catches_a_trigger_facade() {
        let rule = NO_LEGACY_TRIGGER_FACADE;
        let path = "crates/outbox-workflow-runner/src/engine.rs";
        let facade = "pub struct Engine;\nimpl Engine {\n    fn trigger(&self) {}\n}";
        assert_eq!(lines(rule, path, facade), [3]);
        let variants = "pub(crate) async fn trigger<T>(t: T) {}\n\
                        trait T { fn r#trigger(); }\n\
                        pub struct WorkflowEngine { pool: PgPool }";
        assert_eq!(lines(rule, path, variants), [1, 2, 3]);
        let compliant = "/// Not a `fn trigger(`; no WorkflowEngine.\n\
                         fn trigger_block(&self) {}\nfn f() { let trigger = 1; w.trigger_block(); }\n\
                         struct WorkflowEngineRoom;";
        assert_eq!(lines(rule, path, compliant), NONE);
    }

    #[test]
    fn test_modules_are_left_out() {
        let path = "crates/outbox-workflow-model/src/registry.rs";
        let inline = "fn real() {}\n#[cfg(test)]\n#[allow(dead_code)]\nmod tests {\n    \
                      fn trigger() { execute_trigger(); }\n}\nfn trigger() {}";
        assert_eq!(
            hits(&with_producers(&[(path, inline)])),
            [(NO_LEGACY_TRIGGER_FACADE, path.to_owned(), 7)]
        );
        // An out-of-line test module's file and submodules; a test-only file.
        let parent = (
            "crates/outbox-worker/src/config.rs",
            "#[cfg(test)]\nmod checks;",
        );
        let files = with_producers(&[
            parent,
            (
                "crates/outbox-worker/src/config/checks.rs",
                "fn trigger() {}",
            ),
            (
                "crates/outbox-worker/src/config/checks/more.rs",
                "fn trigger() {}",
            ),
            (
                "crates/outbox-worker/src/fixtures.rs",
                "#![cfg(test)]\nfn trigger() {}",
            ),
        ]);
        assert_eq!(hits(&files), []);
        // cfg(any(test, …)) is production code.
        let feature = "#[cfg(any(test, feature = \"x\"))]\nmod tests { fn trigger() {} }";
        assert_eq!(
            hits(&with_producers(&[(path, feature)])),
            [(NO_LEGACY_TRIGGER_FACADE, path.to_owned(), 2)]
        );
    }

    #[test]
    fn the_lexer_drops_literals_and_keeps_lines() {
        let source = "let a = \"x\\\"y\nz\"; /* a /* nested */\n */ let b = b'\\''; \
                      let c = br##\"q\"#\"##; 'outer: loop { f::<'static>() }\nlet r#fn = 1.5e3;";
        let idents: Vec<(String, usize)> = lex(source)
            .into_iter()
            .filter_map(|t| t.ident().map(|i| (i.to_owned(), t.line)))
            .collect();
        let expected = [
            ("let", 1),
            ("a", 1),
            ("let", 3),
            ("b", 3),
            ("let", 3),
            ("c", 3),
            ("loop", 3),
            ("f", 3),
            ("let", 4),
            ("fn", 4),
        ];
        let expected: Vec<(String, usize)> = expected
            .iter()
            .map(|(i, l)| ((*i).to_owned(), *l))
            .collect();
        assert_eq!(idents, expected);
    }

    /// The crates that run workflows.
    const RUNNING: [&str; 3] = [
        "outbox-workflow-runner",
        "outbox-workflow-sandbox",
        "outbox-workflow-bridge",
    ];

    /// The crates `from` depends on (normal dependencies), directly or
    /// through other crates of `graph`.
    fn reachable(
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        from: &str,
    ) -> std::collections::BTreeSet<String> {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(name) = todo.pop() {
            for dep in graph.get(&name).into_iter().flatten() {
                if seen.insert(dep.clone()) {
                    todo.push(dep.clone());
                }
            }
        }
        seen
    }

    /// What replaced the lexing of R1 and R3: the producer side cannot
    /// name the runner, the sandbox or the bridge. The model, the store
    /// (with the producers), `outbox-publish` (what applications compile)
    /// and the CLI reach none of them through any crate: the CLI reads the
    /// subscribers' descriptions from `outbox-catalog`, which are plain
    /// data and bring no handler along, so it neither compiles a workflow
    /// runner nor can its code name one.
    #[test]
    fn producer_side_crates_cannot_reach_the_runner() {
        let graph = crate::verify::crate_table::workspace_graph();
        for name in RUNNING.iter().chain(&["outbox-workflow-store"]) {
            assert!(graph.contains_key(*name), "no package {name}");
        }
        for producer in [
            "outbox-workflow-model",
            "outbox-workflow-store",
            "outbox-publish",
        ] {
            let reached = reachable(&graph, producer);
            for running in RUNNING {
                assert!(
                    !reached.contains(running),
                    "{producer} depends on {running} (directly or through another crate): \
                     producers must publish, not run"
                );
            }
        }
        let cli = reachable(&graph, "outbox-cli");
        for running in RUNNING {
            assert!(
                !cli.contains(running),
                "outbox-cli depends on {running} (directly or through another crate): its \
                 workflow commands publish, never run, and the subscribers' descriptions it \
                 reads are data"
            );
        }
    }

    /// The bottom of the workflow crates is pure: definitions and
    /// validation depend on no database, runtime, network or sandbox crate,
    /// so the producers and the CLI's `validate` compile none for it.
    #[test]
    fn the_workflow_model_depends_on_no_database_runtime_or_network_crate() {
        let graph = crate::verify::crate_table::dependency_graph();
        let model = &graph["outbox-workflow-model"];
        for io in [
            "diesel",
            "diesel-async",
            "tokio",
            "reqwest",
            "axum",
            "redis",
            "rquickjs",
            "outbox-model",
            "outbox-publish",
        ] {
            assert!(
                !model.contains(io),
                "outbox-workflow-model depends on {io}: keep the model pure"
            );
        }
    }

    #[test]
    fn reachability_follows_paths_through_other_crates() {
        let graph = [
            ("store", vec!["model", "publish"]),
            ("publish", vec!["helper"]),
            ("helper", vec!["outbox-workflow-runner"]),
            ("model", vec![]),
        ]
        .into_iter()
        .map(|(name, deps)| {
            let deps = deps.into_iter().map(str::to_owned).collect();
            (name.to_owned(), deps)
        })
        .collect();
        let reached = reachable(&graph, "store");
        assert!(reached.contains("outbox-workflow-runner"));
        assert!(!reached.contains("store"));
        assert_eq!(reachable(&graph, "model").len(), 0);
    }

    /// The real workspace keeps every rule.
    #[test]
    fn the_workspace_passes_the_source_inventory() {
        let root = crate::cmd::workspace_root();
        let sources = production_sources(&root).unwrap();
        assert!(
            sources.iter().any(|(path, _)| path == PRODUCERS),
            "{PRODUCERS} not found under {}",
            root.display()
        );
        let violations: Vec<String> = check_sources(&sources)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(violations.is_empty(), "{}", violations.join("\n"));
    }
}
