//! The checks that read the workspace itself rather than run it: the
//! workflow readiness gate (`cargo xtask verify-workflow-outbox-native`,
//! [`workflow`]), the source inventory of the workflow boundary (`cargo
//! xtask inventory`, [`inventory`]), and the source tests `cargo xtask
//! test` runs with the rest of xtask's tests: the crate table of
//! docs/architecture.md against `cargo metadata` (`crate_table`), no
//! module import cycles (`module_cycles`), one owner of `outbox_event`
//! (`table_owner`), the docs' dependency lines and version table against
//! the Cargo files (`install_docs`), and the container image's toolchain
//! against the workspace's `rust-version` (`dockerfile`), and every
//! relative link of the Markdown docs against the files and headings it
//! names (`doc_links`).
//!
//! Not the CI run itself (that is `crate::test`), and nothing here starts a
//! service except the gate, which runs focused tests through nextest.

#[cfg(test)]
mod crate_table;
#[cfg(test)]
mod doc_links;
#[cfg(test)]
mod dockerfile;
#[cfg(test)]
mod install_docs;
pub(crate) mod inventory;
#[cfg(test)]
mod module_cycles;
#[cfg(test)]
mod table_owner;
pub(crate) mod workflow;
