//! Standard output that ends quietly when its reader goes away: `outbox
//! list | head -2`, or a pager closed early, exits 0 without a panic
//! (Rust's own `println!` panics on the broken pipe, exit code 101). The
//! `outbox` binary's `print!` and `println!`, and xtask's, write through
//! [`write()`].

use std::io::Write;

/// Writes `args` to standard output (and a newline when `newline`); when
/// the reader has closed the pipe, the process exits 0 at once: nothing
/// more it prints can be read. Any other write error ends the process with
/// exit code 2 and a message on standard error naming `program`.
pub fn write(program: &str, args: std::fmt::Arguments<'_>, newline: bool) {
    let mut out = std::io::stdout().lock();
    let written = if newline {
        writeln!(out, "{args}")
    } else {
        write!(out, "{args}")
    };
    if let Err(e) = written.and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("{program}: cannot write to standard output: {e}");
        std::process::exit(2);
    }
}
