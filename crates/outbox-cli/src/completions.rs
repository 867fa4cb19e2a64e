//! `outbox completions <shell>`: the shell completion script, generated
//! from the command line itself (so it never lags behind a new flag).

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::{Cli, ExitStatus, Outcome};

/// Arguments of `outbox completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell: bash, elvish, fish, powershell, zsh.
    pub shell: Shell,
}

/// Prints the completion script of `args.shell` on standard output.
pub fn run(args: &CompletionsArgs) -> Outcome {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "outbox", &mut script);
    print!("{}", String::from_utf8_lossy(&script));
    Ok(ExitStatus::Ok)
}
