//! `custom-worker`: the general worker plus the application's search
//! indexing (see the library). `SEARCH_INDEX_DIR` names the directory the
//! index is written to; every other variable is the worker's
//! (`custom-worker --help`).

fn main() -> std::process::ExitCode {
    let dir = std::env::var_os(custom_worker::SEARCH_INDEX_DIR).map(std::path::PathBuf::from);
    custom_worker::worker(dir).main()
}
