//! The guard of an action on many rows or jobs at once (`outbox requeue`
//! by filters, `outbox retry-dead`, the console's retry of dead jobs): past
//! a threshold it needs an explicit confirmation (`--yes`, a ticked box).

/// The default threshold (`--confirm-above`): an action that changes more
/// rows or jobs than this needs an explicit confirmation.
pub const DEFAULT_CONFIRM_ABOVE: u64 = 100;

/// Whether an action that changes `changes` rows or jobs needs an explicit
/// confirmation under `confirm_above`.
#[must_use]
pub fn needs_confirmation(changes: u64, confirm_above: u64) -> bool {
    changes > confirm_above
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_more_than_the_threshold_needs_a_confirmation() {
        assert!(!needs_confirmation(100, DEFAULT_CONFIRM_ABOVE));
        assert!(needs_confirmation(101, DEFAULT_CONFIRM_ABOVE));
        assert!(!needs_confirmation(0, 0));
    }
}
