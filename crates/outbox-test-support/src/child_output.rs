//! [`ChildOutput`]: what a child process (a worker binary) writes, collected
//! for assertions and echoed to the test's own stderr.

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Everything a child process wrote to stdout and stderr, line by line, as
/// it arrives.
#[derive(Debug, Clone, Default)]
pub struct ChildOutput {
    text: Arc<Mutex<String>>,
    /// Streams still being read (not yet closed by the child).
    open: Arc<AtomicUsize>,
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

    /// Whether every captured stream has been read to its end: after the
    /// child exits, [`ChildOutput::text`] then holds all it wrote. Until
    /// then the reader threads may still be behind the exit.
    #[must_use]
    pub fn closed(&self) -> bool {
        self.open.load(Ordering::Acquire) == 0
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
        let open = self.open.clone();
        open.fetch_add(1, Ordering::AcqRel);
        std::thread::spawn(move || {
            /// Counts the stream closed however the loop ends.
            struct Closed(Arc<AtomicUsize>);
            impl Drop for Closed {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::AcqRel);
                }
            }
            let _closed = Closed(open);
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
