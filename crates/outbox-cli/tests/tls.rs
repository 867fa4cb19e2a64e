//! The real `outbox` binary reaches a Postgres that accepts TLS only, with
//! the certificate verified (`sslmode=verify-full`), as the workers do; a
//! mistake in the TLS settings is a configuration error (exit 2) that
//! names `DATABASE_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use outbox_test_support::PostgresProcess;

/// Runs `outbox args` against `database_url`: (exit code, stdout, stderr).
fn outbox(database_url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env_clear()
        .env("DATABASE_URL", database_url)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn migrate_and_stats_work_over_verified_tls_and_bad_tls_settings_exit_2() {
    let pg = PostgresProcess::start_tls();
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        pg.server_url(),
        pg.pki().ca_file.display()
    );

    let (code, _, stderr) = outbox(&url, &["migrate"]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, stderr) = outbox(&url, &["migrate", "--status", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("\"pending\": 0"), "{stdout}");
    let (code, stdout, stderr) = outbox(&url, &["stats", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stdout.is_empty());

    // Configuration mistakes: exit 2, naming the variable and the value.
    for (query, expected) in [
        ("sslmode=verify", "unknown sslmode `verify`"),
        (
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            "cannot read sslrootcert /nonexistent/ca.pem",
        ),
    ] {
        let bad = format!("{}?{query}", pg.server_url());
        for args in [&["stats"][..], &["migrate", "--status"]] {
            let (code, _, stderr) = outbox(&bad, args);
            assert_eq!(code, Some(2), "{args:?} {query}: {stderr}");
            assert!(
                stderr.contains("invalid DATABASE_URL") && stderr.contains(expected),
                "{args:?} {query}: {stderr}"
            );
        }
    }
    // A certificate from another CA is refused, saying why.
    let wrong = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        pg.server_url(),
        pg.pki().other_ca_file.display()
    );
    let (code, _, stderr) = outbox(&wrong, &["stats"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");
}
