//! One owner of `outbox_event`: no source of the workspace outside
//! `crates/outbox-store` holds SQL on the table or its history
//! (`outbox_event_requeue`). Read from the sources of every `src/` folder
//! (`crates/*/src`, `xtask/src`, `examples/*/src`), outside comments and
//! `#[cfg(test)] mod tests` (test fixtures may write rows, as files under
//! `tests/` may). Two shapes count:
//!
//! - a diesel DSL path to the table: `outbox_event::…`,
//!   `schema::outbox_event`, `outbox_event` in a `schema::{…}` import, or
//!   `table_name = outbox_event`;
//! - a string literal that names the table where SQL does: after `FROM`,
//!   `INTO`, `UPDATE`, `JOIN`, `TABLE`, `TRUNCATE`, `LIKE`, as the whole
//!   target of `VACUUM` or `ANALYZE`, or as `'outbox_event'::regclass` /
//!   `relname = 'outbox_event'`. Keywords are matched in upper case, as
//!   every statement of the workspace writes them; prose that mentions the
//!   table (log lines, `--help`) does not count.
//!
//! [`EXCEPTIONS`] names the few files allowed to, each with its reason.

use std::path::{Path, PathBuf};

use crate::cmd::workspace_root;

/// Files outside the store allowed to hold SQL on `outbox_event`, and why.
/// Keep it short: an operation the store has is called, not copied.
const EXCEPTIONS: &[(&str, &str)] = &[
    (
        "crates/outbox-model/src/row.rs",
        "declares the table's row types (`table_name = outbox_event`); no statements",
    ),
    (
        "crates/outbox-testkit/src/sqlx_reads.rs",
        "the test kit's read of published events on an sqlx connection, which \
         cannot run the store's diesel operations (the diesel form calls list_events)",
    ),
    (
        "xtask/src/bench/kit.rs",
        "the benchmarks seed millions of rows with one INSERT … SELECT generate_series",
    ),
    (
        "xtask/src/bench/retention.rs",
        "seeds a million DONE rows of chosen ages and counts what retention left",
    ),
    (
        "xtask/src/bench/handoff.rs",
        "measures the claim and hand-off in isolation: seeds, truncates and claims by hand",
    ),
    (
        "xtask/src/bench/publish.rs",
        "compares the publisher with a plain INSERT into a copy of the table",
    ),
    (
        "xtask/src/bench/drain_audit.rs",
        "reads the drain's timing out of processed_at in one aggregate",
    ),
    (
        "xtask/src/bench/ordering.rs",
        "counts the handled rows of each ordering case to time its drain",
    ),
    (
        "xtask/src/bench/priority.rs",
        "seeds the low-priority backlog with one INSERT … SELECT and reads the probe event's timings",
    ),
    (
        "xtask/src/bench/console.rs",
        "seeds a million events in a mix of states with one INSERT … SELECT generate_series",
    ),
    (
        "xtask/src/bench/latency.rs",
        "reads the table's autovacuum counters from pg_stat_user_tables",
    ),
    (
        "xtask/src/bench/partitioned.rs",
        "seeds ten million DONE rows over daily partitions made by hand and reads \
         the latency out of processed_at",
    ),
    (
        "xtask/src/explain.rs",
        "plans the store's statements under chosen statistics (EXPLAIN, ANALYZE, \
         pg_statistic) to pin the plans docs/performance.md reports",
    ),
    (
        "xtask/src/demo/publish.rs",
        "the demo's plain-SQL producer: a row inserted without the publisher, as \
         another language would",
    ),
    (
        "xtask/src/demo/observe.rs",
        "the demo's checks of what a user sees in the table (duplicates, latencies)",
    ),
];

/// The crate that owns the table.
const OWNER: &str = "crates/outbox-store";

/// The tables the rule is about.
const TABLES: &[&str] = &["outbox_event", "outbox_event_requeue"];

/// Keywords after which a table name in a string is SQL.
const BEFORE_TABLE: &[&str] = &[
    "FROM", "INTO", "UPDATE", "JOIN", "TABLE", "TRUNCATE", "LIKE",
];

/// Every `.rs` file under `folder`, sorted (shared with `module_cycles`).
pub(crate) fn rust_files(folder: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![folder.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// A piece of code: its text and the line it starts on.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    /// Code outside comments and literals.
    Code(String, usize),
    /// The contents of a string literal.
    Literal(String, usize),
}

/// `source` up to its `#[cfg(test)] mod tests`, if it has one.
fn before_test_module(source: &str) -> &str {
    let end = source
        .match_indices("#[cfg(test)]")
        .map(|(at, _)| at)
        .find(|at| {
            source[at + "#[cfg(test)]".len()..]
                .trim_start()
                .starts_with("mod tests")
        })
        .unwrap_or(source.len());
    &source[..end]
}

/// A string literal read from `chars`: its contents, and the index and
/// line just after it.
struct Literal {
    text: String,
    next: usize,
    line: usize,
}

/// The string literal starting at `i`: raw (`r"…"`, `r#"…"#`, its `r` at
/// `i`) or quoted (its `"` at `i`, escapes read as the escaped character, a
/// line continuation as a space).
fn literal(chars: &[char], mut i: usize, mut line: usize, raw: bool) -> Literal {
    let mut text = String::new();
    let mut hashes = 0;
    i += 1;
    if raw {
        while chars.get(i) == Some(&'#') {
            hashes += 1;
            i += 1;
        }
        i += 1;
    }
    while let Some(&ch) = chars.get(i) {
        if ch == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            i += 1 + hashes;
            break;
        }
        if !raw && ch == '\\' {
            if let Some(&escaped) = chars.get(i + 1) {
                line += usize::from(escaped == '\n');
                text.push(if escaped == '\n' { ' ' } else { escaped });
            }
            i += 2;
            continue;
        }
        line += usize::from(ch == '\n');
        text.push(ch);
        i += 1;
    }
    Literal {
        text,
        next: i,
        line,
    }
}

/// Splits `source` (before its test module) into code and string literals,
/// dropping comments and char literals.
fn pieces(source: &str) -> Vec<Piece> {
    let chars: Vec<char> = before_test_module(source).chars().collect();
    let mut out = Vec::new();
    let mut code = String::new();
    let mut code_line = 1;
    let mut line = 1;
    let mut i = 0;
    let flush = |code: &mut String, code_line: usize, out: &mut Vec<Piece>| {
        if !code.trim().is_empty() {
            out.push(Piece::Code(std::mem::take(code), code_line));
        }
        code.clear();
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                line += usize::from(chars[i] == '\n');
                i += 1;
            }
            i += 2;
            continue;
        }
        if c == '\'' {
            // A char literal ('a', '\n', '\''), or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                code.push(c);
                i += 1;
            }
            continue;
        }
        let raw = c == 'r'
            && matches!(next, Some('"' | '#'))
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_');
        if raw || c == '"' {
            flush(&mut code, code_line, &mut out);
            let start_line = line;
            let literal = literal(&chars, i, line, raw);
            (i, line) = (literal.next, literal.line);
            out.push(Piece::Literal(literal.text, start_line));
            code_line = line;
            continue;
        }
        if code.is_empty() {
            code_line = line;
        }
        line += usize::from(c == '\n');
        code.push(c);
        i += 1;
    }
    flush(&mut code, code_line, &mut out);
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The byte offsets where `word` stands in `text` as a whole identifier.
fn word_at(text: &str, word: &str) -> Vec<usize> {
    text.match_indices(word)
        .filter(|(at, _)| {
            !text[..*at].chars().next_back().is_some_and(is_ident)
                && !text[at + word.len()..].chars().next().is_some_and(is_ident)
        })
        .map(|(at, _)| at)
        .collect()
}

/// The offsets in `code` where one of [`TABLES`] is named as a diesel DSL
/// path.
fn dsl_paths(code: &str) -> Vec<usize> {
    let mut found = Vec::new();
    for table in TABLES {
        for at in word_at(code, table) {
            let before = code[..at].trim_end();
            let after = code[at + table.len()..].trim_start();
            let in_schema_import = before
                .rfind("schema::{")
                .is_some_and(|open| !before[open..].contains(['}', ';']));
            if after.starts_with("::")
                || before.ends_with("schema::")
                || before.ends_with("table_name =")
                || before.ends_with("table_name=")
                || in_schema_import
            {
                found.push(at);
            }
        }
    }
    found
}

/// Whether the string literal is SQL naming one of [`TABLES`].
fn sql_literal(text: &str) -> bool {
    let compact: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    TABLES.iter().any(|table| {
        let quoted = format!("'{table}'");
        if compact.contains(&format!("{quoted}::regclass"))
            || compact.contains(&format!("relname = {quoted}"))
        {
            return true;
        }
        word_at(&compact, table).into_iter().any(|at| {
            let before = compact[..at].trim_end();
            let after = compact[at + table.len()..].trim_start();
            let keyword = before.rsplit(' ').next().unwrap_or_default();
            if BEFORE_TABLE.contains(&keyword) {
                return true;
            }
            // `VACUUM [(…)] [ANALYZE] table`, `ANALYZE table`: the table
            // ends the statement.
            let ends = after.is_empty() || after.starts_with(';');
            let maintenance = before.ends_with("VACUUM")
                || before.ends_with("ANALYZE")
                || (before.ends_with(')') && before.contains("VACUUM ("));
            ends && maintenance
        })
    })
}

/// `path:line: what` for each piece of SQL on the table in `source`.
fn violations(path: &str, source: &str) -> Vec<String> {
    pieces(source)
        .into_iter()
        .filter_map(|piece| match piece {
            Piece::Code(code, line) => {
                let mut lines: Vec<usize> = dsl_paths(&code)
                    .into_iter()
                    .map(|at| line + code[..at].matches('\n').count())
                    .collect();
                lines.sort_unstable();
                lines.dedup();
                Some(
                    lines
                        .into_iter()
                        .map(|line| format!("{path}:{line}: a diesel path to the table"))
                        .collect(),
                )
            }
            Piece::Literal(text, line) => sql_literal(&text).then(|| {
                let first = text
                    .split_whitespace()
                    .take(8)
                    .collect::<Vec<_>>()
                    .join(" ");
                vec![format!("{path}:{line}: SQL \"{first} …\"")]
            }),
        })
        .flatten()
        .collect()
}

/// Every violation in the workspace under `root`, outside the owner and
/// the exceptions.
fn workspace_violations(root: &Path) -> Vec<String> {
    let mut folders = vec![root.join("xtask/src")];
    for parent in ["crates", "examples"] {
        for entry in std::fs::read_dir(root.join(parent))
            .into_iter()
            .flatten()
            .flatten()
        {
            folders.push(entry.path().join("src"));
        }
    }
    let mut found = Vec::new();
    for file in folders.iter().flat_map(|folder| rust_files(folder)) {
        let relative = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .to_string_lossy()
            .replace('\\', "/");
        if relative.starts_with(&format!("{OWNER}/"))
            || EXCEPTIONS.iter().any(|(path, _)| *path == relative)
        {
            continue;
        }
        let source = std::fs::read_to_string(&file).unwrap_or_default();
        found.extend(violations(&relative, &source));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_store_holds_sql_on_outbox_event() {
        let found = workspace_violations(&workspace_root());
        assert!(
            found.is_empty(),
            "SQL on outbox_event outside {OWNER} (call or add an operation of outbox-store): \
             {found:#?}"
        );
    }

    #[test]
    fn every_exception_is_a_file_that_still_needs_it() {
        let root = workspace_root();
        for (path, reason) in EXCEPTIONS {
            assert!(!reason.is_empty(), "{path}: say why");
            let source = std::fs::read_to_string(root.join(path))
                .unwrap_or_else(|e| panic!("{path} is listed as an exception: {e}"));
            assert!(
                !violations(path, &source).is_empty(),
                "{path} holds no SQL on outbox_event any more: take it off the exceptions"
            );
        }
    }

    #[test]
    fn statements_and_dsl_paths_count_and_prose_does_not() {
        let source = r##"
    use outbox_model::schema::outbox_event;
    use outbox_model::schema::{audit_log, outbox_event_requeue};
    fn f() {
        let q = outbox_event::table.filter(outbox_event::id.eq(id));
        diesel::sql_query("UPDATE outbox_event SET status = 'DONE'");
        let n = "SELECT count(*)
                 FROM outbox_event WHERE status <> 'DONE'";
        let v = r#"VACUUM (SKIP_LOCKED) outbox_event"#;
        let r = "SELECT 1 FROM pg_class WHERE oid = 'outbox_event'::regclass";
        tracing::warn!("VACUUM outbox_event failed; trying again after the next rows");
        tracing::info!("vacuumed outbox_event");
        let id = row.outbox_event_id;
        let c = '"';
        // SELECT * FROM outbox_event in a comment
    }
    #[derive(Queryable)]
    #[diesel(table_name = outbox_event)]
    struct Row;
    #[cfg(test)]
    mod tests {
        const FIXTURE: &str = "INSERT INTO outbox_event (tenant_id) VALUES ('t')";
    }
    "##;
        let lines: Vec<usize> = violations("f.rs", source)
            .iter()
            .map(|v| {
                v.split(':')
                    .nth(1)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(lines, [2, 3, 5, 6, 7, 9, 10, 18]);
    }
}

// Break checked: a planted `diesel::sql_query("DELETE FROM outbox_event")`
// in crates/outbox-dispatch/src/gate.rs failed
// `only_the_store_holds_sql_on_outbox_event` with that file and line.
