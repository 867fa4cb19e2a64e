//! Whether a process's dispatcher is draining a backlog, for the work that
//! yields to it: the retention job deletes more slowly meanwhile
//! ([`crate::run_retention`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The dispatch loops of one [`crate::Dispatcher`] whose last tick claimed
/// a whole batch, so that they tick again at once: more rows are due than
/// one claim takes. Cheap to clone; clones share the count
/// ([`crate::Dispatcher::draining`]).
#[derive(Debug, Clone, Default)]
pub struct Draining {
    loops: Arc<AtomicUsize>,
}

impl Draining {
    /// Whether a loop of the dispatcher is draining a backlog now.
    #[must_use]
    pub fn is_draining(&self) -> bool {
        self.loops.load(Ordering::Relaxed) > 0
    }

    /// Records whether a loop's last tick was full, given what it recorded
    /// before (`counted`, updated).
    pub(crate) fn record(&self, counted: &mut bool, full: bool) {
        if full != *counted {
            if full {
                self.loops.fetch_add(1, Ordering::Relaxed);
            } else {
                self.loops.fetch_sub(1, Ordering::Relaxed);
            }
            *counted = full;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draining_while_any_loop_records_a_full_tick() {
        let draining = Draining::default();
        let (mut first, mut second) = (false, false);
        assert!(!draining.is_draining());
        draining.record(&mut first, true);
        draining.record(&mut second, true);
        draining.record(&mut first, true);
        draining.record(&mut first, false);
        assert!(
            draining.clone().is_draining(),
            "the second loop still drains"
        );
        draining.record(&mut second, false);
        draining.record(&mut second, false);
        assert!(!draining.is_draining());
    }
}
