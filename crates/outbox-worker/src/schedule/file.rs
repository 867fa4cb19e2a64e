//! The routes file's `[[schedule]]` tables (`OUTBOX_ROUTES_FILE`), beside
//! its `[[route]]` tables (which `outbox_dispatch` reads).

use outbox_publish::NewOutboxEvent;

use super::{Missed, Schedule, ScheduleError};

/// The part of a routes file read here.
#[derive(Debug, serde::Deserialize)]
struct SchedulesFile {
    #[serde(default)]
    schedule: Vec<toml::Table>,
}

/// One `[[schedule]]` table.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    cron: String,
    zone: String,
    tenant: String,
    event_type: String,
    #[serde(default)]
    payload: toml::Table,
    missed: Option<String>,
}

/// The schedules of a routes file's `[[schedule]]` tables, in the file's
/// order; other tables (`[[route]]`) are left to the routing table's reader.
///
/// ```
/// let schedules = outbox_worker::schedules_from_file(
///     r#"
/// [[schedule]]
/// name = "nightly-report"
/// cron = "0 0 3 * * *"
/// zone = "Europe/Berlin"
/// tenant = "acme"
/// event_type = "reports.nightly.due"
/// payload = { kind = "daily" }
/// missed = "publish-last"
/// "#,
/// )?;
/// assert_eq!(schedules[0].name(), "nightly-report");
/// # Ok::<(), outbox_worker::ScheduleError>(())
/// ```
///
/// # Errors
///
/// [`ScheduleError::Parse`] for text that is not TOML,
/// [`ScheduleError::File`] for a table of another form (naming its
/// position and the key), [`ScheduleError::Duplicate`] for a name used
/// twice, and the refusals of [`Schedule::new`] for a table's values.
pub fn schedules_from_file(text: &str) -> Result<Vec<Schedule>, ScheduleError> {
    let file: SchedulesFile =
        toml::from_str(text).map_err(|e| ScheduleError::Parse(e.message().to_owned()))?;
    let schedules = file
        .schedule
        .into_iter()
        .enumerate()
        .map(|(i, table)| schedule(i + 1, table))
        .collect::<Result<Vec<_>, _>>()?;
    super::merge(&schedules, &[])
}

/// The schedule of the `index`-th table.
fn schedule(index: usize, table: toml::Table) -> Result<Schedule, ScheduleError> {
    let file_error = |problem: String| ScheduleError::File { index, problem };
    let entry: Entry = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| file_error(e.message().to_owned()))?;
    let payload =
        serde_json::to_value(&entry.payload).map_err(|e| file_error(format!("payload: {e}")))?;
    let missed = match entry.missed.as_deref().map(str::parse::<Missed>) {
        None => Missed::default(),
        Some(Ok(missed)) => missed,
        Some(Err(value)) => {
            return Err(ScheduleError::Missed {
                name: entry.name,
                value,
            });
        }
    };
    let event = NewOutboxEvent::new(entry.tenant, entry.event_type, payload);
    Ok(Schedule::new(entry.name, &entry.cron, &entry.zone, event)?.missed(missed))
}
