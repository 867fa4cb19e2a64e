//! [`LogCapture`]: what the code under test logs, for tests whose effect
//! to check is a log line (a warning an operator would act on).

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use tracing_subscriber::fmt::MakeWriter;

/// The log lines (level `info` and above) written on the current thread
/// while the value lives, as the workers' plain-text format shows them.
///
/// It replaces the process-wide subscriber for this thread only, so it
/// sees the tasks of a single-threaded runtime (`#[tokio::test]`'s
/// default), which all run on the test's thread; it is not `Send`.
pub struct LogCapture {
    lines: Buffer,
    _guard: tracing::dispatcher::DefaultGuard,
}

impl LogCapture {
    /// Starts capturing.
    #[must_use]
    pub fn start() -> Self {
        let lines = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(lines.clone())
            .finish();
        Self {
            lines,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// Everything captured so far.
    #[must_use]
    pub fn text(&self) -> String {
        let bytes = self.lines.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// How many captured lines contain `needle`.
    #[must_use]
    pub fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}

impl std::fmt::Debug for LogCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogCapture").finish_non_exhaustive()
    }
}

/// The shared buffer the subscriber writes into.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buffer {
    type Writer = Buffer;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_keeps_the_lines_logged_at_info_and_above_with_their_fields() {
        let logs = LogCapture::start();
        tracing::warn!(queue = "outbox.mail", "the queue is stuck");
        tracing::debug!("below the level");
        assert_eq!(logs.count("the queue is stuck"), 1, "{}", logs.text());
        assert!(logs.text().contains("WARN"), "{}", logs.text());
        assert!(
            logs.text().contains("queue=\"outbox.mail\""),
            "{}",
            logs.text()
        );
        assert_eq!(logs.count("below the level"), 0);
    }
}
