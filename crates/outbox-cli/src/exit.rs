//! [`ExitStatus`]: what `outbox` tells the shell, and [`Failure`], an error
//! with its status.

use std::process::ExitCode;

/// The exit status of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: done, nothing to report.
    Ok,
    /// 1: an alert fired, nothing matched, the probe did not get through,
    /// reconcile found handed-off jobs missing, or retry-dead left a job
    /// dead because its ordering key moved past its event.
    Alert,
    /// 2: a usage, configuration or connection error, a value no flag
    /// accepts, or a bulk change above `--confirm-above` without `--yes`
    /// (nothing changed).
    Error,
}

impl ExitStatus {
    /// [`ExitStatus::Alert`] when `alert`, else [`ExitStatus::Ok`].
    #[must_use]
    pub fn alert_if(alert: bool) -> Self {
        if alert { Self::Alert } else { Self::Ok }
    }

    /// The number the shell sees.
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::Alert => 1,
            Self::Error => 2,
        }
    }
}

impl From<ExitStatus> for ExitCode {
    fn from(status: ExitStatus) -> Self {
        Self::from(status.code())
    }
}

/// A failure with its exit status; any error converts into one with
/// [`ExitStatus::Error`].
pub struct Failure {
    /// The status to exit with.
    pub status: ExitStatus,
    /// What went wrong, printed on standard error.
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(error: E) -> Self {
        Self {
            status: ExitStatus::Error,
            error: error.into(),
        }
    }
}

/// What a command returns.
pub type Outcome = Result<ExitStatus, Failure>;
