//! The worker binaries describe themselves: `--help` lists every variable
//! with its default, accepted values and meaning, `--version` prints the
//! version, and neither starts anything (no database or Redis is needed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use outbox_worker::Group;
use outbox_worker::variables::variables;

const GENERAL: &str = env!("CARGO_BIN_EXE_worker-general");
const MAIL: &str = env!("CARGO_BIN_EXE_worker-mail");

/// Runs `binary args` with an empty environment: (exit code, stdout, stderr).
fn run(binary: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(binary)
        .args(args)
        .env_clear()
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn help_lists_every_variable_with_its_default_and_range_and_starts_nothing() {
    for (binary, group) in [(GENERAL, Group::General), (MAIL, Group::Mail)] {
        let (code, stdout, stderr) = run(binary, &["--help"]);
        assert_eq!(code, Some(0), "{binary}: {stderr}");
        for variable in variables(group) {
            assert!(
                stdout.contains(&format!("[env: {}]", variable.name())),
                "{binary}: {} missing from\n{stdout}",
                variable.name()
            );
            let help = variable.help();
            let default = &help[help.rfind("[default:").unwrap()..];
            assert!(stdout.contains(default), "{binary}: {default} missing");
        }
        assert!(
            stdout.contains("[range: 1..=10000] [default: 500]"),
            "{stdout}"
        );
        assert!(stdout.contains(group.default_http_addr()), "{stdout}");
        assert!(stdout.contains("Exit codes"), "{stdout}");
    }
}

#[test]
fn help_never_shows_the_environment_s_values() {
    let output = Command::new(GENERAL)
        .arg("--help")
        .env("DATABASE_URL", "postgres://app:s3cr3t-db@db/app")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("[env: DATABASE_URL]"), "{stdout}");
    assert!(!stdout.contains("s3cr3t-db"), "{stdout}");
}

#[test]
fn version_prints_the_binary_and_its_version() {
    for (binary, name) in [(GENERAL, "worker-general"), (MAIL, "worker-mail")] {
        let (code, stdout, _) = run(binary, &["--version"]);
        assert_eq!(code, Some(0));
        assert_eq!(
            stdout.trim(),
            format!("{name} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn an_unknown_flag_exits_2_and_names_it() {
    let (code, _, stderr) = run(GENERAL, &["--frobnicate"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--frobnicate"), "{stderr}");
}
