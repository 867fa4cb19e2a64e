//! Progress of the demo's stages on stderr: bars (indicatif) on a terminal;
//! elsewhere (CI logs, a pipe) nothing drawn, one line per stage when it
//! ends.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Where stage progress goes.
pub struct Progress {
    /// `None` when not drawing (stdout or stderr is not a terminal).
    multi: Option<MultiProgress>,
}

impl Progress {
    /// Bars when both stdout and stderr are terminals, plain lines otherwise.
    pub fn new() -> Self {
        let fancy = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        Self {
            multi: fancy.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
        }
    }

    /// A line of its own, above the bars.
    pub fn note(&self, text: &str) {
        match &self.multi {
            Some(multi) => {
                if multi.println(text).is_err() {
                    eprintln!("{text}");
                }
            }
            None => eprintln!("{text}"),
        }
    }

    /// A spinner with a changing message (a build, a wait).
    pub fn spinner(&self, label: &str) -> Line {
        let bar = self.multi.as_ref().map(|multi| {
            let bar = multi.add(ProgressBar::new_spinner());
            bar.set_style(
                ProgressStyle::with_template("{spinner} {prefix:.bold} {wide_msg} [{elapsed}]")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_prefix(label.to_owned());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        if bar.is_none() {
            eprintln!("demo: {label} …");
        }
        Line {
            bar,
            label: label.to_owned(),
            started: Instant::now(),
        }
    }

    /// A bar counting to `len` (which may grow).
    pub fn bar(&self, label: &str, len: u64) -> Bar {
        let bar = self.multi.as_ref().map(|multi| {
            let bar = multi.add(ProgressBar::new(len));
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>10.bold} [{bar:40}] {pos:>6}/{len:<6} [{elapsed}] {wide_msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_prefix(label.to_owned());
            bar
        });
        Bar {
            bar,
            label: label.to_owned(),
            started: Instant::now(),
            pos: 0,
            len,
            done: false,
        }
    }
}

/// A spinner line.
pub struct Line {
    bar: Option<ProgressBar>,
    label: String,
    started: Instant,
}

impl Line {
    /// Shows `text` next to the label (drawn only on a terminal).
    pub fn message(&self, text: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(text.to_owned());
        }
    }

    /// Ends the line with `text`.
    pub fn finish(&self, text: &str) {
        let took = self.started.elapsed().as_secs_f64();
        match &self.bar {
            Some(bar) => bar.finish_with_message(format!("{text} ({took:.1} s)")),
            None => eprintln!("demo: {}: {text} ({took:.1} s)", self.label),
        }
    }
}

/// A counting bar.
pub struct Bar {
    bar: Option<ProgressBar>,
    label: String,
    started: Instant,
    pos: u64,
    len: u64,
    done: bool,
}

impl Bar {
    /// Sets the count and the target.
    pub fn set(&mut self, pos: u64, len: u64) {
        self.pos = pos;
        self.len = len;
        if let Some(bar) = &self.bar {
            bar.set_length(len);
            bar.set_position(pos);
        }
    }

    /// Ends the stage: on a terminal the bar stays; elsewhere one line.
    pub fn finish(&mut self, text: &str) {
        if self.done {
            return;
        }
        self.done = true;
        let took = self.started.elapsed().as_secs_f64();
        match &self.bar {
            Some(bar) => bar.finish_with_message(text.to_owned()),
            None => eprintln!(
                "demo: {:<10} {}/{} in {took:.1} s {text}",
                self.label, self.pos, self.len
            ),
        }
    }
}
