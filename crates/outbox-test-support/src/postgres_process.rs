//! [`PostgresProcess`]: a private Postgres cluster with TLS (or without),
//! for tests of how clients connect to it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::TestPki;

/// A Postgres cluster of its own (`initdb` in a temporary directory, a free
/// port on 127.0.0.1 and on 127.0.0.2, an address the certificate does not
/// name) that accepts TCP connections over TLS only
/// (`ssl=on`, `hostssl` lines and a `hostnossl … reject` line in
/// `pg_hba.conf`, trust authentication), with the certificate of a
/// [`TestPki`]; or, from [`PostgresProcess::start_plain`], one without TLS.
/// Stopped and deleted on drop.
///
/// Needs the server binaries (`initdb`, `pg_ctl`; Debian's
/// `/usr/lib/postgresql/<version>/bin` is searched). As root they run as
/// the `postgres` user (or `nobody`), since Postgres refuses to run as root.
pub struct PostgresProcess {
    root: PathBuf,
    data: PathBuf,
    bin: PathBuf,
    run_as: Option<&'static str>,
    port: u16,
    pki: TestPki,
}

impl PostgresProcess {
    /// Initialises and starts the cluster; returns once it accepts
    /// connections (`pg_ctl start -w`).
    ///
    /// # Panics
    ///
    /// When the server binaries are missing or the server does not start
    /// (the message includes its log).
    #[must_use]
    pub fn start_tls() -> Self {
        Self::start(true)
    }

    /// As [`PostgresProcess::start_tls`], but with `ssl=off`: a server that
    /// refuses TLS and accepts plain TCP connections.
    ///
    /// # Panics
    ///
    /// As [`PostgresProcess::start_tls`].
    #[must_use]
    pub fn start_plain() -> Self {
        Self::start(false)
    }

    fn start(tls: bool) -> Self {
        let bin = bin_dir().unwrap_or_else(|| {
            panic!("no Postgres server binaries (initdb, pg_ctl): install the postgresql package")
        });
        let root =
            std::env::temp_dir().join(format!("outbox-pg-tls-{}", uuid::Uuid::new_v4().simple()));
        let data = root.join("data");
        let pki = TestPki::create(&root.join("pki"));
        let run_as = is_root().then(|| {
            if succeeds(Command::new("id").arg("postgres")) {
                "postgres"
            } else {
                "nobody"
            }
        });
        if let Some(user) = run_as {
            // The server's user owns its directory, certificate and key.
            std::fs::create_dir_all(&data)
                .unwrap_or_else(|e| panic!("cannot create {data:?}: {e}"));
            let chowned = succeeds(Command::new("chown").args(["-R", user]).arg(&root));
            assert!(chowned, "cannot chown {root:?} to {user}");
        }
        let initdb = pg(&bin, "initdb", run_as)
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        assert!(
            initdb.is_ok_and(|s| s.success()),
            "initdb failed in {data:?}"
        );
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free port: {e}"));
        append(
            &data.join("postgresql.conf"),
            &format!(
                "\nport = {port}\nlisten_addresses = '127.0.0.1,127.0.0.2'\nunix_socket_directories = '{}'\n\
                 fsync = off\nssl = {}\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                root.display(),
                if tls { "on" } else { "off" },
                pki.cert_file.display(),
                pki.key_file.display(),
            ),
        );
        let hba = if tls {
            "local all all trust\n\
             hostssl all all 127.0.0.0/8 trust\n\
             hostnossl all all 127.0.0.0/8 reject\n"
        } else {
            "local all all trust\nhost all all 127.0.0.0/8 trust\n"
        };
        std::fs::write(data.join("pg_hba.conf"), hba)
            .unwrap_or_else(|e| panic!("cannot write pg_hba.conf: {e}"));
        let process = Self {
            root,
            data,
            bin,
            run_as,
            port,
            pki,
        };
        let log = process.root.join("postgres.log");
        let started = pg(&process.bin, "pg_ctl", run_as)
            .arg("-D")
            .arg(&process.data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "start"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !started.is_ok_and(|s| s.success()) {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("the private Postgres did not start:\n{log}");
        }
        process
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`, without `sslmode`.
    #[must_use]
    pub fn server_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The certificates the server uses (its CA, and a CA that did not sign it).
    #[must_use]
    pub fn pki(&self) -> &TestPki {
        &self.pki
    }
}

impl Drop for PostgresProcess {
    fn drop(&mut self) {
        let _ = pg(&self.bin, "pg_ctl", self.run_as)
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl std::fmt::Debug for PostgresProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresProcess")
            .field("port", &self.port)
            .field("data", &self.data)
            .finish_non_exhaustive()
    }
}

/// `OUTBOX_TEST_PG_BIN`, else the newest `/usr/lib/postgresql/<n>/bin`
/// holding `initdb` and `pg_ctl`, else the `PATH` (empty path).
fn bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("OUTBOX_TEST_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pg_ctl").exists()).then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    succeeds(Command::new("initdb").arg("--version")).then(PathBuf::new)
}

fn pg(bin: &Path, program: &str, run_as: Option<&str>) -> Command {
    let program = bin.join(program);
    match run_as {
        Some(user) => {
            let mut command = Command::new("runuser");
            command.args(["-u", user, "--"]).arg(program);
            command
        }
        None => Command::new(program),
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn succeeds(command: &mut Command) -> bool {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {path:?}: {e}"));
    file.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("cannot write {path:?}: {e}"));
}
