//! [`RedisProcess`]: a private `redis-server` a test can stop and restart.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::TestPki;

/// A `redis-server` child process on its own port, for tests of what happens
/// when Redis goes away and comes back, of a Redis that requires a
/// password, or of a server configured in a way the shared one is not.
/// Killed on drop.
pub struct RedisProcess {
    port: u16,
    password: Option<String>,
    args: Vec<String>,
    tls: Option<TestPki>,
    child: Option<Child>,
}

impl RedisProcess {
    /// Starts a server on a free port and waits until it answers.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed or does not come up.
    pub async fn start() -> Self {
        Self::spawn(None, &[]).await
    }

    /// Starts a server that requires `password` (`requirepass`) for the
    /// default user; [`RedisProcess::url`] carries it
    /// (`redis://:<password>@127.0.0.1:<port>`).
    ///
    /// # Panics
    ///
    /// As [`RedisProcess::start`].
    pub async fn start_with_password(password: &str) -> Self {
        Self::spawn(Some(password.to_owned()), &[]).await
    }

    /// Starts a server with extra `redis-server` arguments (configuration
    /// directives such as `["--maxmemory-policy", "allkeys-lru"]`, which
    /// override the defaults), kept across [`RedisProcess::restart`].
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed or does not come up.
    pub async fn start_with(args: &[&str]) -> Self {
        Self::spawn(None, args).await
    }

    /// Starts a server that speaks TLS only (`--port 0`, `--tls-port`),
    /// with the server certificate of `pki` and without client
    /// certificates; [`RedisProcess::url`] is then `rediss://127.0.0.1:<port>`.
    ///
    /// # Errors
    ///
    /// The server's own words when it exits at once, as a `redis-server`
    /// built without TLS does: the caller decides whether to skip.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed or starts but does not answer.
    pub async fn start_tls(pki: &TestPki) -> Result<Self, String> {
        let mut process = Self::unstarted(None, &[], Some(pki.clone()));
        process.try_restart().await?;
        Ok(process)
    }

    async fn spawn(password: Option<String>, args: &[&str]) -> Self {
        let mut process = Self::unstarted(password, args, None);
        process.restart().await;
        process
    }

    fn unstarted(password: Option<String>, args: &[&str], tls: Option<TestPki>) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free port: {e}"));
        Self::unstarted_on(port, password, args, tls)
    }

    /// Starts a server on `port` with extra arguments (a cluster node,
    /// whose bus port is `port + 10000`, so the port is chosen by the
    /// caller).
    pub(crate) async fn start_on(port: u16, args: &[&str]) -> Self {
        let mut process = Self::unstarted_on(port, None, args, None);
        process.restart().await;
        process
    }

    /// The port it listens on.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the server runs (it was not stopped, or was restarted).
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn unstarted_on(
        port: u16,
        password: Option<String>,
        args: &[&str],
        tls: Option<TestPki>,
    ) -> Self {
        Self {
            port,
            password,
            args: args.iter().map(|&arg| arg.to_owned()).collect(),
            tls,
            child: None,
        }
    }

    /// The server's URL, with the password when there is one
    /// (`rediss://` for a server started by [`RedisProcess::start_tls`]).
    #[must_use]
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        match &self.password {
            Some(password) => format!("{scheme}://:{password}@127.0.0.1:{}", self.port),
            None => format!("{scheme}://127.0.0.1:{}", self.port),
        }
    }

    /// A client for [`RedisProcess::url`] (trusting the test CA for TLS).
    ///
    /// # Panics
    ///
    /// When the URL or the CA file is unusable.
    #[must_use]
    pub fn client(&self) -> redis::Client {
        let Some(pki) = &self.tls else {
            return redis::Client::open(self.url().as_str())
                .unwrap_or_else(|e| panic!("bad URL: {e}"));
        };
        // Two rustls crypto providers are linked in: name the one to use.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let ca = std::fs::read(&pki.ca_file).unwrap_or_else(|e| panic!("no CA file: {e}"));
        redis::Client::build_with_tls(
            self.url().as_str(),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca),
            },
        )
        .unwrap_or_else(|e| panic!("bad TLS settings: {e}"))
    }

    /// Kills the server (connections to it start failing).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// (Re)starts the server on the same port, empty, and waits until it answers.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed or does not answer within 10 s.
    pub async fn restart(&mut self) {
        if let Err(e) = self.try_restart().await {
            panic!("{e}");
        }
    }

    async fn try_restart(&mut self) -> Result<(), String> {
        self.stop();
        let mut command = Command::new("redis-server");
        let port = self.port.to_string();
        match &self.tls {
            None => command.args(["--port", &port]),
            Some(pki) => command
                .args([
                    "--port",
                    "0",
                    "--tls-port",
                    &port,
                    "--tls-auth-clients",
                    "no",
                ])
                .arg("--tls-cert-file")
                .arg(&pki.cert_file)
                .arg("--tls-key-file")
                .arg(&pki.key_file)
                .arg("--tls-ca-cert-file")
                .arg(&pki.ca_file),
        };
        command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
            .args(&self.args);
        if let Some(password) = &self.password {
            command.args(["--requirepass", password]);
        }
        // A TLS server's log is kept, to say why it would not start.
        let log = self.tls.as_ref().and_then(|pki| {
            let dir = pki.ca_file.parent()?;
            Some(dir.join(format!("redis-{}.log", self.port)))
        });
        let (stdout, stderr) = match log.as_ref().and_then(|path| {
            let file = std::fs::File::create(path).ok()?;
            Some((file.try_clone().ok()?, file))
        }) {
            Some((out, err)) => (Stdio::from(out), Stdio::from(err)),
            None => (Stdio::null(), Stdio::null()),
        };
        let child = command
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server (install the redis-server package): {e}")
            });
        self.child = Some(child);
        let client = self.client();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = self.child.as_mut()
                && child.try_wait().is_ok_and(|status| status.is_some())
            {
                self.child = None;
                let output = log
                    .and_then(|path| std::fs::read_to_string(path).ok())
                    .unwrap_or_default();
                return Err(format!("redis-server exited at start:\n{output}"));
            }
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            {
                return Ok(());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server on port {} did not answer",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for RedisProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisProcess")
            .field("port", &self.port)
            .field("args", &self.args)
            .finish_non_exhaustive()
    }
}
