//! `custom-worker`: the general worker plus the application's search
//! indexing (see the library). `SEARCH_INDEX_DIR` names the directory the
//! index is written to; every other variable is the worker's
//! (`custom-worker --help`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::var_os(custom_worker::SEARCH_INDEX_DIR) else {
        eprintln!(
            "custom-worker: {} must name the index directory",
            custom_worker::SEARCH_INDEX_DIR
        );
        return ExitCode::from(outbox_worker::EXIT_CONFIGURATION);
    };
    custom_worker::worker(std::path::Path::new(&dir)).main()
}
