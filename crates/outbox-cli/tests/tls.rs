//! The real `outbox` binary reaches a Postgres that accepts TLS only, with
//! the certificate verified (`sslmode=verify-full`), as the workers do; a
//! mistake in the TLS settings is a configuration error (exit 2) that
//! names `DATABASE_URL`. Its Redis commands reach a `rediss://` server
//! whose certificate chains to the CA of `REDIS_CA_CERT`, and refuse one
//! that does not.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use outbox_test_support::{PostgresProcess, RedisProcess, TestPki};

/// Runs `outbox args` against `database_url`: (exit code, stdout, stderr).
fn outbox(database_url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    outbox_with(&[("DATABASE_URL", database_url)], args)
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

/// Runs `outbox args` with only `vars` set: (exit code, stdout, stderr).
fn outbox_with(vars: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env_clear()
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

// Break checked: the CLI's Redis connection built without `REDIS_CA_CERT`
// (the field deleted in `main.rs`, a mutation run's shard 8 of the CLI)
// fails here: the server's certificate is then checked against the
// system's roots only, and refused.
#[tokio::test]
async fn redis_commands_work_over_rediss_with_the_ca_of_redis_ca_cert_and_refuse_another() {
    let dir = std::env::temp_dir().join(format!(
        "outbox-cli-redis-tls-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let pki = TestPki::create(&dir);
    let server = match RedisProcess::start_tls(&pki).await {
        Ok(server) => server,
        Err(reason) => panic!("this redis-server cannot serve TLS: {reason}"),
    };
    let url = server.url().to_owned();
    assert!(url.starts_with("rediss://"), "{url}");
    let ca = pki.ca_file.display().to_string();
    let other = pki.other_ca_file.display().to_string();
    let prefix = format!("clitls{}:", uuid::Uuid::new_v4().simple());
    let dead = ["dead", "outbox.mail", "--json"];

    let (code, stdout, stderr) = outbox_with(
        &[
            ("REDIS_URL", &url),
            ("REDIS_CA_CERT", &ca),
            ("OUTBOX_QUEUE_PREFIX", &prefix),
        ],
        &dead,
    );
    assert!(
        stdout.contains("\"dead\": []"),
        "exit {code:?}: {stdout} {stderr}"
    );
    for vars in [
        vec![
            ("REDIS_URL", url.as_str()),
            ("OUTBOX_QUEUE_PREFIX", &prefix),
        ],
        vec![
            ("REDIS_URL", url.as_str()),
            ("REDIS_CA_CERT", &other),
            ("OUTBOX_QUEUE_PREFIX", &prefix),
        ],
    ] {
        let (code, stdout, stderr) = outbox_with(&vars, &dead);
        assert_ne!(code, Some(0), "{vars:?}: {stdout}");
        assert!(!stdout.contains("\"dead\""), "{vars:?}: {stdout}");
        assert!(
            stderr.contains("cannot read the dead jobs of outbox.mail"),
            "{vars:?}: {stderr}"
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
