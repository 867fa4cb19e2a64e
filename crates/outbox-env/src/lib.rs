//! Environment variable specifications: each variable of the outbox's
//! processes is one `pub const` of [`Whole`], [`Flag`] or [`Text`] (name,
//! default, accepted values, meaning), defined in the library beside the
//! settings type that uses it, with that type's own constants as default
//! and bounds. Reading a variable goes through its definition
//! ([`Whole::read`], [`Flag::read`], [`Text::required`], ...), and so does
//! its line of `--help` ([`Variable::help`]), so no default or bound is
//! written twice.
//!
//! This crate only describes and parses; it never reads the process
//! environment itself. Readers take a lookup, `&dyn Fn(&str) ->
//! Option<String>`: the environment in a binary, a map in a test. Which
//! variables a binary reads, and its `--help`, are the binary's.
//!
//! ```
//! use std::time::Duration;
//! use outbox_env::{Whole, millis, MAX_MILLIS};
//!
//! /// The default of the library's own settings type.
//! const DEFAULT_TICK: Duration = Duration::from_millis(250);
//!
//! /// `EXAMPLE_TICK_MS`, beside the type that uses it.
//! pub const EXAMPLE_TICK_MS: Whole = Whole {
//!     name: "EXAMPLE_TICK_MS",
//!     default: millis(DEFAULT_TICK),
//!     min: 1,
//!     max: MAX_MILLIS,
//!     meaning: "how often the example ticks, in ms",
//! };
//!
//! let unset = |_: &str| None;
//! assert_eq!(EXAMPLE_TICK_MS.read_millis(&unset)?, DEFAULT_TICK);
//! let soon = |_: &str| Some("soon".to_owned());
//! let error = EXAMPLE_TICK_MS.read(&soon).unwrap_err();
//! assert_eq!(
//!     error.to_string(),
//!     "invalid configuration: EXAMPLE_TICK_MS=\"soon\": is not a whole number"
//! );
//! # Ok::<(), outbox_env::VariableError>(())
//! ```

use std::time::Duration;

/// Largest value of a millisecond variable; `--help` shows a range up to
/// it as "at least" its smallest value.
pub const MAX_MILLIS: u64 = u64::MAX / 2;

/// `duration` in whole milliseconds: the default of a `…_MS` variable from
/// the [`Duration`] constant of the type that uses it.
#[must_use]
pub const fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

/// `duration` in whole hours: the default of a `…_HOURS` variable.
#[must_use]
pub const fn hours(duration: Duration) -> u64 {
    duration.as_secs() / 3600
}

/// A variable that stops start-up; the message names it.
///
/// ```
/// let error = outbox_env::VariableError {
///     variable: "MY_QUEUE",
///     value: "x y".into(),
///     problem: "must not contain spaces".into(),
/// };
/// assert_eq!(
///     error.to_string(),
///     "invalid configuration: MY_QUEUE=\"x y\": must not contain spaces"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {variable}={value:?}: {problem}")]
pub struct VariableError {
    /// The environment variable.
    pub variable: &'static str,
    /// Its value as found (empty when missing); a URL with its password
    /// hidden, a secret as `<redacted>`.
    pub value: String,
    /// What is wrong.
    pub problem: String,
}

/// The value of `name` through `get`, `None` when unset or blank.
fn raw(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    get(name).filter(|value| !value.trim().is_empty())
}

/// A whole-number variable: its default and the range it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Whole {
    /// The variable.
    pub name: &'static str,
    /// The value when unset.
    pub default: u64,
    /// Smallest accepted value.
    pub min: u64,
    /// Largest accepted value.
    pub max: u64,
    /// What it is for.
    pub meaning: &'static str,
}

impl Whole {
    /// The value through `get`: the default when unset or blank.
    ///
    /// # Errors
    ///
    /// A [`VariableError`] naming the variable for a non-number or a
    /// number outside `min..=max`.
    pub fn read(&self, get: &dyn Fn(&str) -> Option<String>) -> Result<u64, VariableError> {
        let Some(value) = raw(get, self.name) else {
            return Ok(self.default);
        };
        let Ok(parsed) = value.trim().parse::<u64>() else {
            return Err(self.refuse(value, "is not a whole number"));
        };
        if parsed < self.min || parsed > self.max {
            let problem = format!("must be between {} and {}", self.min, self.max);
            return Err(self.refuse(value, problem));
        }
        Ok(parsed)
    }

    /// [`Whole::read`] as `T`, the type of the field it sets.
    ///
    /// # Errors
    ///
    /// As [`Whole::read`], and "is too large" for a value `T` cannot hold.
    pub fn read_as<T: TryFrom<u64>>(
        &self,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<T, VariableError> {
        let value = self.read(get)?;
        T::try_from(value).map_err(|_| self.refuse(value.to_string(), "is too large"))
    }

    /// [`Whole::read`] counted in milliseconds.
    ///
    /// # Errors
    ///
    /// As [`Whole::read`].
    pub fn read_millis(
        &self,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Duration, VariableError> {
        self.read(get).map(Duration::from_millis)
    }

    /// [`Whole::read`] counted in hours.
    ///
    /// # Errors
    ///
    /// As [`Whole::read`].
    pub fn read_hours(
        &self,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Duration, VariableError> {
        self.read(get)
            .map(|hours| Duration::from_secs(3600 * hours))
    }

    /// The error of a `value` of this variable that cannot work.
    #[must_use]
    pub fn refuse(&self, value: impl Into<String>, problem: impl Into<String>) -> VariableError {
        refuse(self.name, value, problem)
    }
}

/// A true/false variable (`true`, `1`, `yes`, `on` or `false`, `0`, `no`,
/// `off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag {
    /// The variable.
    pub name: &'static str,
    /// The value when unset.
    pub default: bool,
    /// What it is for.
    pub meaning: &'static str,
}

impl Flag {
    /// The value through `get`: the default when unset or blank.
    ///
    /// # Errors
    ///
    /// A [`VariableError`] naming the variable for any other word.
    pub fn read(&self, get: &dyn Fn(&str) -> Option<String>) -> Result<bool, VariableError> {
        let Some(value) = raw(get, self.name) else {
            return Ok(self.default);
        };
        match value.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(refuse(self.name, value, "must be true or false")),
        }
    }
}

/// A text variable (a URL, an address, a name). Its parsing belongs to the
/// type it becomes; [`Text::read`] and [`Text::required`] give the raw
/// value, and [`Text::refuse`] the error naming the variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Text {
    /// The variable.
    pub name: &'static str,
    /// The value when unset, as shown: a value, `required`, or `unset`.
    pub default: &'static str,
    /// The values it accepts.
    pub form: &'static str,
    /// What it is for.
    pub meaning: &'static str,
}

impl Text {
    /// The value through `get` as given, `None` when unset or blank.
    #[must_use]
    pub fn read(&self, get: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        raw(get, self.name)
    }

    /// The value through `get`, which must be set.
    ///
    /// # Errors
    ///
    /// A [`VariableError`] "is required" when it is unset or blank.
    pub fn required(&self, get: &dyn Fn(&str) -> Option<String>) -> Result<String, VariableError> {
        self.read(get)
            .ok_or_else(|| refuse(self.name, "", "is required"))
    }

    /// The error of a `value` of this variable that cannot work.
    #[must_use]
    pub fn refuse(&self, value: impl Into<String>, problem: impl Into<String>) -> VariableError {
        refuse(self.name, value, problem)
    }
}

fn refuse(
    variable: &'static str,
    value: impl Into<String>,
    problem: impl Into<String>,
) -> VariableError {
    VariableError {
        variable,
        value: value.into(),
        problem: problem.into(),
    }
}

/// One variable of a binary's list, whatever its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variable {
    /// A whole number.
    Whole(Whole),
    /// True or false.
    Flag(Flag),
    /// Text.
    Text(Text),
}

impl From<Whole> for Variable {
    fn from(spec: Whole) -> Self {
        Self::Whole(spec)
    }
}

impl From<Flag> for Variable {
    fn from(spec: Flag) -> Self {
        Self::Flag(spec)
    }
}

impl From<Text> for Variable {
    fn from(spec: Text) -> Self {
        Self::Text(spec)
    }
}

impl Variable {
    /// The variable's name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Whole(v) => v.name,
            Self::Flag(v) => v.name,
            Self::Text(v) => v.name,
        }
    }

    /// Its line of `--help`: meaning, accepted values, default.
    ///
    /// ```
    /// use outbox_env::{Variable, Whole};
    ///
    /// let batch = Whole {
    ///     name: "EXAMPLE_BATCH_SIZE",
    ///     default: 500,
    ///     min: 1,
    ///     max: 10_000,
    ///     meaning: "rows per batch",
    /// };
    /// assert_eq!(
    ///     Variable::from(batch).help(),
    ///     "rows per batch [range: 1..=10000] [default: 500]"
    /// );
    /// ```
    #[must_use]
    pub fn help(&self) -> String {
        match self {
            Self::Whole(v) => {
                let range = if v.max >= MAX_MILLIS {
                    format!("at least {}", v.min)
                } else {
                    format!("{}..={}", v.min, v.max)
                };
                format!("{} [range: {range}] [default: {}]", v.meaning, v.default)
            }
            Self::Flag(v) => format!(
                "{} [values: true, false] [default: {}]",
                v.meaning, v.default
            ),
            Self::Text(v) => format!(
                "{} [values: {}] [default: {}]",
                v.meaning, v.form, v.default
            ),
        }
    }

    /// The flag of the same name: `--outbox-dispatch-batch-size`.
    #[must_use]
    pub fn flag(&self) -> String {
        self.name().to_ascii_lowercase().replace('_', "-")
    }

    /// Whether a whole number's default lies within its range (always true
    /// of the other kinds): what a test walking the definitions checks.
    #[must_use]
    pub fn default_in_range(&self) -> bool {
        match self {
            Self::Whole(v) => v.min <= v.default && v.default <= v.max,
            Self::Flag(_) | Self::Text(_) => true,
        }
    }
}
