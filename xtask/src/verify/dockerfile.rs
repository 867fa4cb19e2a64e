//! The container image's toolchain held to the workspace: every `FROM
//! rust:<version>` stage of `deploy/Dockerfile` is the workspace's
//! `rust-version` or newer, so that `cargo build --locked` in the image
//! builds what the lock file holds (an image on 1.88 could not build a
//! workspace whose locked crates need 1.89, and no test noticed).

use crate::cmd::workspace_root;

/// A Rust version as `(major, minor)`; a patch number is ignored.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The Rust version of each `FROM rust:<version>[-<variant>]` line of a
/// Dockerfile, as written (`1.95` of `FROM rust:1.95-bookworm AS build`).
fn builder_versions(dockerfile: &str) -> Vec<String> {
    crate::image::base_images(dockerfile)
        .iter()
        .filter_map(|image| image.strip_prefix("rust:"))
        .map(|tag| tag.split('-').next().unwrap_or(tag).to_owned())
        .collect()
}

/// The `FROM rust:` stages of `dockerfile` older than `rust_version`, or
/// whose version cannot be read (`rust:latest` pins nothing), each with why.
fn too_old(dockerfile: &str, rust_version: &str) -> Vec<String> {
    let Some(needed) = major_minor(rust_version) else {
        return vec![format!(
            "the workspace's rust-version {rust_version:?} is not a version"
        )];
    };
    builder_versions(dockerfile)
        .into_iter()
        .filter_map(|version| match major_minor(&version) {
            Some(found) if found >= needed => None,
            Some(_) => Some(format!(
                "FROM rust:{version} is older than the workspace's rust-version {rust_version}"
            )),
            None => Some(format!(
                "FROM rust:{version} names no version; pin one at least {rust_version}"
            )),
        })
        .collect()
}

#[test]
fn the_dockerfile_builds_with_the_workspace_rust_version_or_newer() {
    let root = workspace_root();
    let dockerfile =
        std::fs::read_to_string(root.join("deploy/Dockerfile")).expect("deploy/Dockerfile");
    let metadata = crate::cmd::workspace_metadata().expect("cargo metadata");
    let rust_version = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "outbox-worker")
        .and_then(|p| p["rust_version"].as_str())
        .expect("outbox-worker's rust-version")
        .to_owned();
    assert!(
        !builder_versions(&dockerfile).is_empty(),
        "deploy/Dockerfile has no `FROM rust:<version>` build stage"
    );
    let problems = too_old(&dockerfile, &rust_version);
    assert!(problems.is_empty(), "deploy/Dockerfile: {problems:?}");
}

#[test]
fn a_build_stage_older_than_the_rust_version_or_without_one_is_refused() {
    let dockerfile = "FROM rust:1.88-bookworm AS build\nRUN cargo build\n\
                      FROM rust:latest AS other\nFROM debian:bookworm-slim\n";
    assert_eq!(
        too_old(dockerfile, "1.89"),
        [
            "FROM rust:1.88 is older than the workspace's rust-version 1.89",
            "FROM rust:latest names no version; pin one at least 1.89",
        ]
    );
    assert!(too_old("FROM rust:1.89.2-slim AS build\n", "1.89").is_empty());
    assert!(too_old("FROM rust:2.0 AS build\n", "1.95").is_empty());
}
