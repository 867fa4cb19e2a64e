//! [`ChildOutput`]: what a child process (a worker binary) writes, collected
//! for assertions and echoed to the test's own stderr.

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::sync::{Arc, Mutex, PoisonError};

/// Everything a child process wrote to stdout and stderr, line by line, as
/// it arrives.
#[derive(Debug, Clone, Default)]
pub struct ChildOutput {
    text: Arc<Mutex<String>>,
}

impl ChildOutput {
    /// Takes `child`'s piped stdout and stderr (a stream that is not piped
    /// is skipped) and reads them on threads of their own until the child
    /// closes them. Each line is also echoed to this process' stderr, which
    /// the test harness shows for a failing test.
    pub fn capture(child: &mut Child) -> Self {
        let output = Self::default();
        if let Some(stdout) = child.stdout.take() {
            output.read(stdout);
        }
        if let Some(stderr) = child.stderr.take() {
            output.read(stderr);
        }
        output
    }

    /// What was collected so far.
    #[must_use]
    pub fn text(&self) -> String {
        self.text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn read(&self, stream: impl Read + Send + 'static) {
        let text = self.text.clone();
        std::thread::spawn(move || {
            // Bytes, not `lines()`: a line that is not UTF-8 must not stop
            // the reader (the child would block on a full pipe).
            for line in BufReader::new(stream).split(b'\n') {
                let Ok(line) = line else { return };
                let line = String::from_utf8_lossy(&line);
                eprintln!("{line}");
                let mut text = text.lock().unwrap_or_else(PoisonError::into_inner);
                text.push_str(&line);
                text.push('\n');
            }
        });
    }
}
