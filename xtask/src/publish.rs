//! The publishable crates: which members are not (`publish = false`, read
//! from `cargo metadata`, so a new member needs no list of its own here),
//! `cargo package` of the others (in `cargo xtask test`) and `cargo xtask
//! publish-check`, the dry run of publishing them run before a release.

use anyhow::Result;

use crate::cmd::{cargo, run as step, workspace_metadata};

/// The workspace members that are not published (`publish = false`).
///
/// # Errors
///
/// When `cargo metadata` fails or prints something else than its JSON.
pub fn unpublished_members() -> Result<Vec<String>> {
    Ok(unpublished(&workspace_metadata()?))
}

/// The packages of `metadata` whose `publish` is an empty list.
fn unpublished(metadata: &serde_json::Value) -> Vec<String> {
    metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["publish"].as_array().is_some_and(Vec::is_empty))
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect()
}

/// `--exclude <name>` for each of `names`.
fn exclusions(names: &[String]) -> Vec<String> {
    names
        .iter()
        .flat_map(|name| ["--exclude".to_owned(), name.clone()])
        .collect()
}

/// `cargo package --no-verify` of every publishable crate: the metadata,
/// README and licence files, and what each crate's archive holds (the
/// migrations `outbox-model` embeds), without building them.
///
/// # Errors
///
/// When packaging fails.
pub fn package() -> Result<()> {
    step(
        "cargo package (dry run of the publishable crates)",
        cargo()
            .args(["package", "--workspace", "--no-verify", "--allow-dirty"])
            .args(exclusions(&unpublished_members()?)),
    )
}

/// `cargo xtask publish-check`: `cargo publish --workspace --dry-run`,
/// which packages every publishable crate and builds each from its
/// archive, against the archives of the others (a local overlay of the
/// crates not yet on crates.io): what crates.io would receive, built as
/// an adopter's build would build it.
///
/// # Errors
///
/// When a crate cannot be packaged or does not build from its archive.
pub fn check() -> Result<()> {
    step(
        "cargo publish --workspace --dry-run",
        cargo()
            .args(["publish", "--workspace", "--dry-run", "--allow-dirty"])
            .args(exclusions(&unpublished_members()?)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_with_publish_false_are_excluded_and_the_others_are_not() {
        let metadata = serde_json::json!({ "packages": [
            { "name": "outbox-publish", "publish": null },
            { "name": "xtask", "publish": [] },
            { "name": "only-on-a-registry", "publish": ["private"] },
        ]});
        let names = unpublished(&metadata);
        assert_eq!(names, ["xtask"]);
        assert_eq!(exclusions(&names), ["--exclude", "xtask"]);
    }
}
