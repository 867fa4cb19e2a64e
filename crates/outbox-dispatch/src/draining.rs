//! Whether a process's dispatcher is draining a backlog, for the work that
//! yields to it: the retention job deletes more slowly meanwhile
//! ([`crate::run_retention`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many of a dispatcher's loops are in some state (ticking back to
/// back for the wake gate, draining a backlog for [`Draining`]). Each loop
/// keeps its own flag of whether it is counted and records changes through
/// it, so the count never goes wrong by a loop recording twice.
#[derive(Debug, Default)]
pub(crate) struct LoopCount(AtomicUsize);

impl LoopCount {
    /// Records whether a loop is in the state now (`now`), given its flag
    /// (`counted`, updated).
    pub(crate) fn record(&self, counted: &mut bool, now: bool) {
        if now != *counted {
            if now {
                self.0.fetch_add(1, Ordering::SeqCst);
            } else {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
            *counted = now;
        }
    }

    /// Records the loop as out of the state (`counted`, updated) and
    /// returns how many others are in it, both in one step: of loops
    /// leaving at the same time, the last sees none left.
    pub(crate) fn leave(&self, counted: &mut bool) -> usize {
        if std::mem::take(counted) {
            self.0.fetch_sub(1, Ordering::SeqCst) - 1
        } else {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// Whether any loop is in the state.
    pub(crate) fn any(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

/// The dispatch loops of one [`crate::Dispatcher`] whose last tick claimed
/// a whole batch, so that they tick again at once: more rows are due than
/// one claim takes. Cheap to clone; clones share the count
/// ([`crate::Dispatcher::draining`]).
#[derive(Debug, Clone, Default)]
pub struct Draining {
    loops: Arc<LoopCount>,
}

impl Draining {
    /// Whether a loop of the dispatcher is draining a backlog now.
    #[must_use]
    pub fn is_draining(&self) -> bool {
        self.loops.any()
    }

    /// Records whether a loop's last tick was full, given what it recorded
    /// before (`counted`, updated).
    pub(crate) fn record(&self, counted: &mut bool, full: bool) {
        self.loops.record(counted, full);
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
