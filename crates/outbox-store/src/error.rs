//! [`StoreError`] and the [`ErrorKind`] callers match on.

/// Why a store operation failed. Most operations are one statement or one
/// transaction: when one fails, nothing it would have changed is changed.
/// Those that send several statements (the dispatcher's outcome updates,
/// inserts of more than [`crate::ROWS_PER_STATEMENT`] rows, retention on a
/// partitioned table) may have applied some of them when one fails.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A statement failed (its message is Postgres' or diesel's own).
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
    /// A partitioning operation refused to run (`outbox partition`).
    #[error(transparent)]
    Partition(#[from] crate::PartitionError),
    /// A statement on an sqlx connection failed (the operations of
    /// [`crate::sqlx`]; its message is Postgres' or sqlx's own).
    #[cfg(feature = "sqlx")]
    #[error(transparent)]
    Sqlx(#[from] ::sqlx::Error),
}

/// What kind of failure a [`StoreError`] is, for callers that act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A unique constraint refused the row (a taken `dispatch_key`).
    UniqueViolation,
    /// A check or foreign key constraint refused the row.
    ConstraintViolation,
    /// The transaction lost a serialization conflict; running it again may work.
    SerializationFailure,
    /// The connection closed while the statement ran.
    ConnectionClosed,
    /// The statement matched no row where one was required.
    NotFound,
    /// Anything else.
    Other,
}

impl StoreError {
    /// The error of an insert that met a row with the same id: a
    /// [`ErrorKind::UniqueViolation`], as Postgres' own.
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    pub(crate) fn duplicate_id(id: uuid::Uuid) -> Self {
        Self::Database(diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::UniqueViolation,
            Box::new(format!("an outbox_event row with id {id} exists already")),
        ))
    }

    /// The kind of failure.
    ///
    /// ```
    /// use outbox_store::{ErrorKind, StoreError};
    /// let error = StoreError::from(diesel::result::Error::NotFound);
    /// assert_eq!(error.kind(), ErrorKind::NotFound);
    /// ```
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        use diesel::result::{DatabaseErrorKind as Db, Error};
        match self {
            Self::Database(Error::NotFound) => ErrorKind::NotFound,
            Self::Database(Error::DatabaseError(kind, _)) => match kind {
                Db::UniqueViolation => ErrorKind::UniqueViolation,
                Db::CheckViolation | Db::ForeignKeyViolation | Db::NotNullViolation => {
                    ErrorKind::ConstraintViolation
                }
                Db::SerializationFailure => ErrorKind::SerializationFailure,
                Db::ClosedConnection => ErrorKind::ConnectionClosed,
                _ => ErrorKind::Other,
            },
            Self::Database(_) | Self::Partition(_) => ErrorKind::Other,
            #[cfg(feature = "sqlx")]
            Self::Sqlx(error) => sqlx_kind(error),
        }
    }

    /// The diesel error underneath, for callers whose own error type
    /// carries one (`outbox_publish::PublishError::Database`). An sqlx
    /// error (feature `sqlx`) comes back inside
    /// `diesel::result::Error::QueryBuilderError`, its message unchanged.
    #[must_use]
    pub fn into_diesel(self) -> diesel::result::Error {
        match self {
            Self::Database(error) => error,
            Self::Partition(error) => diesel::result::Error::QueryBuilderError(Box::new(error)),
            #[cfg(feature = "sqlx")]
            Self::Sqlx(error) => diesel::result::Error::QueryBuilderError(Box::new(error)),
        }
    }
}

/// The kind of an sqlx error, as [`StoreError::kind`] gives it.
#[cfg(feature = "sqlx")]
fn sqlx_kind(error: &::sqlx::Error) -> ErrorKind {
    use ::sqlx::error::ErrorKind as Db;
    match error {
        ::sqlx::Error::RowNotFound => ErrorKind::NotFound,
        ::sqlx::Error::Io(_) => ErrorKind::ConnectionClosed,
        ::sqlx::Error::Database(db) => match db.kind() {
            Db::UniqueViolation => ErrorKind::UniqueViolation,
            Db::CheckViolation
            | Db::ForeignKeyViolation
            | Db::NotNullViolation
            | Db::ExclusionViolation => ErrorKind::ConstraintViolation,
            // serialization_failure
            _ if db.code().as_deref() == Some("40001") => ErrorKind::SerializationFailure,
            _ => ErrorKind::Other,
        },
        _ => ErrorKind::Other,
    }
}

/// The result of a store operation.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use diesel::result::{DatabaseErrorKind, Error};

    use super::{ErrorKind, StoreError};

    #[test]
    fn each_database_error_has_its_kind() {
        let db = |kind| {
            StoreError::from(Error::DatabaseError(
                kind,
                Box::new(String::from("refused")),
            ))
        };
        let cases = [
            (
                db(DatabaseErrorKind::UniqueViolation),
                ErrorKind::UniqueViolation,
            ),
            (
                db(DatabaseErrorKind::CheckViolation),
                ErrorKind::ConstraintViolation,
            ),
            (
                db(DatabaseErrorKind::ForeignKeyViolation),
                ErrorKind::ConstraintViolation,
            ),
            (
                db(DatabaseErrorKind::NotNullViolation),
                ErrorKind::ConstraintViolation,
            ),
            (
                db(DatabaseErrorKind::SerializationFailure),
                ErrorKind::SerializationFailure,
            ),
            (
                db(DatabaseErrorKind::ClosedConnection),
                ErrorKind::ConnectionClosed,
            ),
            (db(DatabaseErrorKind::Unknown), ErrorKind::Other),
            (StoreError::from(Error::NotFound), ErrorKind::NotFound),
            (
                StoreError::from(Error::RollbackTransaction),
                ErrorKind::Other,
            ),
        ];
        for (error, kind) in cases {
            assert_eq!(error.kind(), kind, "{error}");
        }
    }

    #[test]
    fn the_message_is_the_database_message() {
        let error = StoreError::from(Error::NotFound);
        assert_eq!(error.to_string(), Error::NotFound.to_string());
    }
}
