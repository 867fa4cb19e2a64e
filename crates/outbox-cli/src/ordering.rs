//! `outbox ordering list | release KEY [--skip-event]`: the ordering keys
//! held on an event that failed for good, and letting them go on.
//!
//! `release KEY` gives the held event another delivery (a FAILED row is
//! requeued; a DONE row, whose job died in the queue, is replayed as a new
//! generation) and lifts the hold: the key's later events follow once it
//! succeeds. `release KEY --skip-event` moves the key past the held event
//! instead (a FAILED row becomes CANCELLED), recording who and why in the
//! event's history (action `skip`); the next event is claimable at once.

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use outbox_model::OutboxStatus;
use outbox_store::{Change, HeldKey};
use serde::Serialize;
use uuid::Uuid;

use crate::{Cli, ExitStatus, Outcome, connect, print_json};

/// Default of `--reason`.
const DEFAULT_REASON: &str = "ordering key released by operator";

/// Most held keys `list` shows.
const LIST_LIMIT: i64 = 1_000;

/// Arguments of `outbox ordering`.
#[derive(Debug, Args)]
pub struct OrderingArgs {
    #[command(subcommand)]
    command: OrderingCommand,
}

#[derive(Debug, Subcommand)]
enum OrderingCommand {
    /// The held keys: key, the event it waits on, since when, why, and how many events wait behind it.
    List,
    /// Let a held key go on: deliver its held event again, or with --skip-event move past it.
    Release(ReleaseArgs),
}

/// Arguments of `outbox ordering release`.
#[derive(Debug, Args)]
struct ReleaseArgs {
    /// The ordering key.
    key: String,
    /// Move the key past the held event (it is not delivered; a FAILED row becomes CANCELLED) instead of delivering it again.
    #[arg(long)]
    skip_event: bool,
    /// Why, kept in the event's history.
    #[arg(long, default_value = DEFAULT_REASON)]
    reason: String,
}

/// Runs `outbox ordering`.
pub async fn run(cli: &Cli, args: &OrderingArgs) -> Outcome {
    match &args.command {
        OrderingCommand::List => list(cli).await,
        OrderingCommand::Release(release_args) => release(cli, release_args).await,
    }
}

async fn list(cli: &Cli) -> Outcome {
    let mut conn = connect(cli).await?;
    let held = outbox_store::held_keys(&mut conn, LIST_LIMIT)
        .await
        .context("cannot read the held ordering keys")?;
    if cli.json {
        print_json(
            &serde_json::json!({ "held": held.iter().map(Held::from).collect::<Vec<_>>() }),
        )?;
    } else if held.is_empty() {
        println!("no ordering key is held");
    } else {
        println!(
            "{:<32}  {:<36}  {:>8}  {:<9}  {:<20}  {:>7}  REASON",
            "KEY", "EVENT", "POSITION", "STATUS", "SINCE", "WAITING"
        );
        for key in &held {
            println!(
                "{:<32}  {:<36}  {:>8}  {:<9}  {:<20}  {:>7}  {}",
                key.ordering_key,
                key.event_id,
                key.position.map_or("-".to_owned(), |p| p.to_string()),
                key.status.as_deref().unwrap_or("-"),
                crate::render::utc(key.since),
                key.waiting,
                key.reason
            );
        }
    }
    Ok(ExitStatus::alert_if(!held.is_empty()))
}

/// One held key in `--json`.
#[derive(Debug, Serialize)]
struct Held<'a> {
    key: &'a str,
    event_id: Uuid,
    position: Option<i64>,
    status: Option<&'a str>,
    since: DateTime<Utc>,
    reason: &'a str,
    waiting: i64,
}

impl<'a> From<&'a HeldKey> for Held<'a> {
    fn from(key: &'a HeldKey) -> Self {
        Self {
            key: &key.ordering_key,
            event_id: key.event_id,
            position: key.position,
            status: key.status.as_deref(),
            since: key.since,
            reason: &key.reason,
            waiting: key.waiting,
        }
    }
}

/// What `release` did.
#[derive(Debug, Serialize)]
struct Released {
    key: String,
    event_id: Option<Uuid>,
    /// `skipped`, `requeued`, `replayed`, `stepped past (its row was
    /// deleted)` or `not held`.
    action: &'static str,
}

async fn release(cli: &Cli, args: &ReleaseArgs) -> Outcome {
    let mut conn = connect(cli).await?;
    let requested_by = std::env::var("USER").ok();
    let held = outbox_store::held_keys(&mut conn, i64::MAX)
        .await
        .context("cannot read the held ordering keys")?
        .into_iter()
        .find(|held| held.ordering_key == args.key);
    let released = match held {
        None => Released {
            key: args.key.clone(),
            event_id: None,
            action: "not held",
        },
        // The held event's row is gone (retention deleted it): there is
        // nothing to deliver again or to skip; the key steps over it.
        Some(held) if held.status.is_none() => {
            let released = outbox_store::release_deleted_hold(&mut conn, &args.key)
                .await
                .context("cannot step the key past its deleted event")?;
            Released {
                key: args.key.clone(),
                event_id: Some(held.event_id),
                action: if released.is_some() {
                    "stepped past (its row was deleted)"
                } else {
                    "not held"
                },
            }
        }
        Some(_) if args.skip_event => {
            let skipped = outbox_store::skip_held(
                &mut conn,
                &args.key,
                &args.reason,
                requested_by.as_deref(),
            )
            .await
            .context("cannot skip the held event")?;
            Released {
                key: args.key.clone(),
                event_id: skipped.map(|s| s.event_id),
                action: if skipped.is_some() {
                    "skipped"
                } else {
                    "not held"
                },
            }
        }
        Some(held) => {
            let status = held
                .status
                .as_deref()
                .and_then(|s| s.parse::<OutboxStatus>().ok());
            let allowed = match status {
                Some(OutboxStatus::Failed) => OutboxStatus::Failed,
                _ => OutboxStatus::Done,
            };
            let requeued = outbox_store::requeue(
                &mut conn,
                Change {
                    ids: &[held.event_id],
                    allowed: &[allowed],
                    reason: &args.reason,
                    requested_by: requested_by.as_deref(),
                },
            )
            .await
            .context("cannot deliver the held event again")?;
            outbox_store::clear_hold(&mut conn, &args.key)
                .await
                .context("cannot lift the hold")?;
            Released {
                key: args.key.clone(),
                event_id: Some(held.event_id),
                action: match (requeued.ids.is_empty(), requeued.replayed) {
                    (true, _) => "not held",
                    (false, 0) => "requeued",
                    (false, _) => "replayed",
                },
            }
        }
    };
    if cli.json {
        print_json(&released)?;
    } else {
        match released.event_id {
            Some(id) => println!("{}: event {id} {}", released.key, released.action),
            None => println!("{}: not held; nothing changed", released.key),
        }
    }
    Ok(ExitStatus::alert_if(released.action == "not held"))
}
