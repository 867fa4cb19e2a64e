//! [`RawJson`]: a payload carried as the exact JSON text Postgres holds.

use std::io::Write as _;

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, IsNull, Output, ToSql};
use diesel::sql_types::Jsonb;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

/// The version byte of Postgres' binary `jsonb` format (followed by text).
const JSONB_VERSION: u8 = 1;

/// A JSON value kept as text, never decoded and re-encoded on its way.
///
/// Postgres accepts JSON that `serde_json::Value` cannot hold: integers past
/// 64 bits and long decimals (which `Value` turns into `f64`), numbers
/// outside `f64` (`1e400`), nesting deeper than 128 levels. Loading such a
/// payload as `Value` fails or changes it; `RawJson` reads the `jsonb` column
/// as text and serializes as that same text, so numbers, precision and
/// nesting arrive unchanged in jobs, webhooks and `audit_log`. Look inside
/// with [`RawJson::value`] or [`RawJson::parse`] where a handler needs
/// fields; that decoding may fail and must not be written back.
///
/// ```
/// let raw = outbox_model::RawJson::from_text(r#"{"n":123456789012345678901234567}"#).unwrap();
/// assert_eq!(serde_json::to_string(&raw).unwrap(), r#"{"n":123456789012345678901234567}"#);
/// ```
#[derive(Clone, AsExpression, FromSqlRow, serde::Serialize, serde::Deserialize)]
#[diesel(sql_type = Jsonb)]
#[serde(transparent)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// Wraps JSON text.
    ///
    /// # Errors
    ///
    /// When the text is not one JSON value.
    pub fn from_text(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text.into()).map(Self)
    }

    /// The text of a `serde_json::Value`.
    #[must_use]
    pub fn from_value(value: &serde_json::Value) -> Self {
        // A `Value` always serializes (its map keys are strings); the
        // fallback (`null`) is unreachable.
        Self(serde_json::value::to_raw_value(value).unwrap_or_default())
    }

    /// The JSON text.
    #[must_use]
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Decodes the text into a `serde_json::Value` (for reading fields).
    ///
    /// # Errors
    ///
    /// When `Value` cannot hold it: numbers outside `f64`, nesting deeper
    /// than 128 levels.
    pub fn value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(self.get())
    }

    /// Decodes the text into `T`.
    ///
    /// # Errors
    ///
    /// When the text does not fit `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.get())
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for RawJson {}

impl std::fmt::Debug for RawJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

impl std::fmt::Display for RawJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

impl FromSql<Jsonb, Pg> for RawJson {
    fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
        let bytes = value.as_bytes();
        let (&version, text) = bytes.split_first().ok_or("empty jsonb value")?;
        if version != JSONB_VERSION {
            return Err(format!("unsupported jsonb version {version}").into());
        }
        let text = std::str::from_utf8(text)?;
        Ok(Self::from_text(text)?)
    }
}

impl ToSql<Jsonb, Pg> for RawJson {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        out.write_all(&[JSONB_VERSION])?;
        out.write_all(self.get().as_bytes())?;
        Ok(IsNull::No)
    }
}
