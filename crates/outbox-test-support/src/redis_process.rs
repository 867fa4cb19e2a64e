//! [`RedisProcess`]: a private `redis-server` a test can stop and restart.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `redis-server` child process on its own port, for tests of what happens
/// when Redis goes away and comes back, of a Redis that requires a
/// password, or of a server configured in a way the shared one is not.
/// Killed on drop.
pub struct RedisProcess {
    port: u16,
    password: Option<String>,
    args: Vec<String>,
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

    async fn spawn(password: Option<String>, args: &[&str]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free port: {e}"));
        let mut process = Self {
            port,
            password,
            args: args.iter().map(|&arg| arg.to_owned()).collect(),
            child: None,
        };
        process.restart().await;
        process
    }

    /// The server's URL, with the password when there is one.
    #[must_use]
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
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
        self.stop();
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
            .args(&self.args);
        if let Some(password) = &self.password {
            command.args(["--requirepass", password]);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server (install the redis-server package): {e}")
            });
        self.child = Some(child);
        let client =
            redis::Client::open(self.url().as_str()).unwrap_or_else(|e| panic!("bad URL: {e}"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            {
                return;
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
