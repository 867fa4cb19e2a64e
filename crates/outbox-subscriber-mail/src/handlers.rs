//! The three mail handlers.

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use lettre::message::{Mailbox, MultiPart, SinglePart, header::ContentType};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use outbox_env::{Text, VariableError};
use outbox_idempotency::{Claim, IdempotencyStore, RedisIdempotencyStore};
use outbox_model::schema::tenant_mail_settings;
use outbox_pg::PgPool;
use outbox_queue::RedisConnection;
use outbox_queue::{OutboxJob, QueueNamespace, push_raw, queues};
use outbox_subscriber::{JobError, JobHandler, JobMeta};
use serde_json::json;
use tracing::Instrument;

use crate::{EmailJob, MailError, Templates, email_task_id, message_id, render_request};

async fn enqueue_email(
    redis: &RedisConnection,
    namespace: &QueueNamespace,
    mail: &EmailJob,
) -> Result<(), JobError> {
    let body = serde_json::to_vec(mail)
        .map_err(|e| JobError::permanent(format!("cannot encode mail: {e}")))?;
    let mut redis = redis.clone();
    let report = push_raw(
        &mut redis,
        namespace,
        queues::TOOLCTRL_EMAIL,
        &[(email_task_id(&mail.delivery_id()), body)],
    )
    .await
    .map_err(|e| JobError::retry(format!("cannot enqueue the mail: {e}")))?;
    tracing::info!(to = ?mail.to, subject = %mail.subject, duplicate = report.duplicates > 0, "mail enqueued");
    Ok(())
}

fn invalid(e: MailError) -> JobError {
    JobError::permanent(e)
}

/// `outbox.mail`: validates and renders a `mail.*` event, then enqueues one
/// `toolctrl.email` job (task id `email:<event id>`, so a redelivery adds none).
#[derive(Clone)]
pub struct MailRequestHandler {
    templates: Templates,
    redis: RedisConnection,
    namespace: QueueNamespace,
}

impl MailRequestHandler {
    /// A handler rendering with `templates` and pushing into `namespace`.
    #[must_use]
    pub fn new(templates: Templates, redis: RedisConnection, namespace: QueueNamespace) -> Self {
        Self {
            templates,
            redis,
            namespace,
        }
    }
}

/// The payload decoded for reading its fields. A payload `serde_json` cannot
/// hold (a number outside `f64`, nesting past 128 levels) cannot be rendered:
/// a permanent failure naming the problem.
fn payload_fields(job: &OutboxJob) -> Result<serde_json::Value, JobError> {
    job.payload
        .value()
        .map_err(|e| JobError::permanent(format!("the mail request payload cannot be read: {e}")))
}

impl JobHandler for MailRequestHandler {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        queues::MAIL
    }

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        let payload = payload_fields(&job)?;
        let mut mail = render_request(
            &self.templates,
            job.outbox_event_id,
            &job.tenant_id,
            &payload,
        )
        .map_err(invalid)?;
        mail.generation = job.generation;
        // The mail job continues this job's trace.
        mail.trace_context = outbox_trace::TraceContext::current();
        enqueue_email(&self.redis, &self.namespace, &mail).await
    }
}

/// `outbox.marketing`: a `marketing.lead.*` event becomes a mail to the
/// tenant's sales inbox (`tenant_mail_settings.sales_inbox`), rendered with
/// the `lead-notification` template from the lead's `name`, `email`,
/// `company` and `message`.
#[derive(Clone)]
pub struct MarketingLeadHandler {
    pool: PgPool,
    templates: Templates,
    redis: RedisConnection,
    namespace: QueueNamespace,
}

impl MarketingLeadHandler {
    /// A handler reading tenant settings through `pool`.
    #[must_use]
    pub fn new(
        pool: PgPool,
        templates: Templates,
        redis: RedisConnection,
        namespace: QueueNamespace,
    ) -> Self {
        Self {
            pool,
            templates,
            redis,
            namespace,
        }
    }
}

impl JobHandler for MarketingLeadHandler {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        queues::MARKETING
    }

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        let settings: Option<(String, Option<String>)> = {
            let mut conn = self
                .pool
                .get()
                .await
                .map_err(|e| JobError::retry(format!("database: {e}")))?;
            tenant_mail_settings::table
                .find(&job.tenant_id)
                .select((
                    tenant_mail_settings::sales_inbox,
                    tenant_mail_settings::from_address,
                ))
                .first(&mut conn)
                .await
                .optional()
                .map_err(|e| JobError::retry(format!("database: {e}")))?
        };
        let Some((sales_inbox, from)) = settings else {
            return Err(JobError::permanent(format!(
                "tenant {} has no sales inbox (tenant_mail_settings); the lead cannot be mailed",
                job.tenant_id
            )));
        };
        let lead = payload_fields(&job)?;
        let field = |name: &str| {
            lead.get(name)
                .and_then(|v| v.as_str())
                .unwrap_or("-")
                .to_owned()
        };
        let mut request = json!({
            "to": sales_inbox,
            "template": "lead-notification",
            "vars": {
                "name": field("name"),
                "email": field("email"),
                "company": field("company"),
                "message": field("message"),
            },
        });
        if let Some(from) = from {
            request["from"] = json!(from);
        }
        if let Some(email) = lead.get("email").and_then(|v| v.as_str())
            && email.parse::<lettre::Address>().is_ok()
        {
            request["replyTo"] = json!(email);
        }
        let mut mail = render_request(
            &self.templates,
            job.outbox_event_id,
            &job.tenant_id,
            &request,
        )
        .map_err(invalid)?;
        mail.generation = job.generation;
        // The mail job continues this job's trace.
        mail.trace_context = outbox_trace::TraceContext::current();
        enqueue_email(&self.redis, &self.namespace, &mail).await
    }
}

/// SMTP settings of `toolctrl.email`. Its `Debug` output shows the URL
/// without its password.
#[derive(Clone, PartialEq, Eq)]
pub struct SmtpSettings {
    /// `smtp://host:port`, `smtps://…` or `smtp://…?tls=required`, with
    /// optional `user:password@` (lettre's URL form).
    pub url: String,
    /// The sender when a mail names none.
    pub default_from: String,
    /// Per-command timeout.
    pub timeout: Duration,
    /// How long a send in progress holds its idempotency key.
    pub lease: Duration,
    /// How long a sent mail is remembered.
    pub ttl: Duration,
}

impl SmtpSettings {
    /// Default of `default_from` (`MAIL_FROM`).
    pub const DEFAULT_FROM: &'static str = "outbox@localhost";

    /// Defaults for `url`: sender `outbox@localhost`, 30 s timeout, 5 min lease, 24 h memory.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            default_from: Self::DEFAULT_FROM.to_owned(),
            timeout: Duration::from_secs(30),
            lease: Duration::from_secs(300),
            ttl: Duration::from_secs(24 * 3600),
        }
    }
}

impl std::fmt::Debug for SmtpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpSettings")
            .field("url", &outbox_queue::redact_url(&self.url))
            .field("default_from", &self.default_from)
            .field("timeout", &self.timeout)
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// `SMTP_URL`: [`SmtpSettings::url`], read by [`SmtpSettings::url_from_lookup`].
pub const SMTP_URL: Text = Text {
    name: "SMTP_URL",
    default: "required by worker-mail",
    form: "smtp://host:port, smtps://user:pass@host, smtp://host?tls=required",
    meaning: "where toolctrl.email sends",
};

/// `MAIL_FROM`: [`SmtpSettings::default_from`], read by
/// [`SmtpSettings::default_from_lookup`].
pub const MAIL_FROM: Text = Text {
    name: "MAIL_FROM",
    default: SmtpSettings::DEFAULT_FROM,
    form: "a mail address",
    meaning: "sender when a mail names none",
};

impl SmtpSettings {
    /// [`SMTP_URL`] through `get`: `None` when unset, else an `smtp` or
    /// `smtps` URL with a host (whether a process needs one is its own
    /// business).
    ///
    /// # Errors
    ///
    /// A [`VariableError`] naming `SMTP_URL`, with the URL's password
    /// hidden.
    pub fn url_from_lookup(
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<String>, VariableError> {
        let Some(url) = SMTP_URL.read(get) else {
            return Ok(None);
        };
        let problem = match url::Url::parse(&url) {
            Ok(parsed) if !matches!(parsed.scheme(), "smtp" | "smtps") => {
                format!("scheme {:?} is not smtp or smtps", parsed.scheme())
            }
            Ok(parsed) if parsed.host_str().is_none_or(str::is_empty) => "has no host".to_owned(),
            Ok(_) => return Ok(Some(url)),
            Err(e) => format!("is not a URL: {e}"),
        };
        Err(SMTP_URL.refuse(outbox_queue::redact_url(&url), problem))
    }

    /// [`MAIL_FROM`] through `get`, [`SmtpSettings::DEFAULT_FROM`] when
    /// unset.
    ///
    /// # Errors
    ///
    /// A [`VariableError`] naming `MAIL_FROM` when it is not a mail address.
    pub fn default_from_lookup(
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<String, VariableError> {
        let from = MAIL_FROM
            .read(get)
            .unwrap_or_else(|| MAIL_FROM.default.into());
        match from.parse::<Mailbox>() {
            Ok(_) => Ok(from),
            Err(e) => Err(MAIL_FROM.refuse(from, format!("is not a mail address: {e}"))),
        }
    }
}

/// `toolctrl.email`: sends one rendered mail over SMTP, at most once per
/// event, with the stable `Message-ID` of [`message_id`].
#[derive(Clone)]
pub struct SmtpHandler {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    settings: SmtpSettings,
    store: RedisIdempotencyStore<outbox_queue::RedisConnection>,
    /// The domain of `settings.default_from`, for `Message-ID`s.
    message_id_domain: String,
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid SMTP_URL {url:?}: {reason}")]
pub struct SmtpConfigError {
    /// The URL, with its password hidden ([`outbox_queue::redact_url`]).
    pub url: String,
    /// Why.
    pub reason: String,
}

impl SmtpHandler {
    /// A handler sending through `settings.url`.
    ///
    /// # Errors
    ///
    /// [`SmtpConfigError`] when the URL or the default sender does not parse.
    pub fn new(
        settings: SmtpSettings,
        store: RedisIdempotencyStore<outbox_queue::RedisConnection>,
    ) -> Result<Self, SmtpConfigError> {
        let error = |reason: String| SmtpConfigError {
            url: outbox_queue::redact_url(&settings.url),
            reason,
        };
        let default_from = settings
            .default_from
            .parse::<Mailbox>()
            .map_err(|e| error(format!("default sender {:?}: {e}", settings.default_from)))?;
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(&settings.url)
            .map_err(|e| error(e.to_string()))?
            .timeout(Some(settings.timeout))
            .build();
        Ok(Self {
            transport,
            message_id_domain: default_from.email.domain().to_owned(),
            settings,
            store,
        })
    }

    fn message(&self, mail: &EmailJob) -> Result<Message, JobError> {
        let mailbox = |raw: &str| {
            raw.parse::<Mailbox>()
                .map_err(|e| JobError::permanent(format!("invalid address {raw:?}: {e}")))
        };
        let from = mail.from.as_deref().unwrap_or(&self.settings.default_from);
        let mut builder = Message::builder()
            .message_id(Some(message_id(
                mail.outbox_event_id,
                mail.generation,
                &self.message_id_domain,
            )))
            .from(mailbox(from)?)
            .subject(&mail.subject);
        for to in &mail.to {
            builder = builder.to(mailbox(to)?);
        }
        for cc in &mail.cc {
            builder = builder.cc(mailbox(cc)?);
        }
        if let Some(reply_to) = &mail.reply_to {
            builder = builder.reply_to(mailbox(reply_to)?);
        }
        let message = match (&mail.text, &mail.html) {
            (Some(text), Some(html)) => builder.multipart(MultiPart::alternative_plain_html(
                text.clone(),
                html.clone(),
            )),
            (Some(text), None) => builder.singlepart(SinglePart::plain(text.clone())),
            (None, Some(html)) => builder.singlepart(
                SinglePart::builder()
                    .header(ContentType::TEXT_HTML)
                    .body(html.clone()),
            ),
            (None, None) => return Err(JobError::permanent("mail has no body")),
        };
        message.map_err(|e| JobError::permanent(format!("cannot build the mail: {e}")))
    }
}

impl JobHandler for SmtpHandler {
    type Job = EmailJob;

    fn queue(&self) -> &str {
        queues::TOOLCTRL_EMAIL
    }

    async fn handle(&self, mail: EmailJob, _meta: &JobMeta) -> Result<(), JobError> {
        let message = self.message(&mail)?;
        let key = email_task_id(&mail.delivery_id());
        let token = match self
            .store
            .claim(&key, self.settings.lease)
            .await
            .map_err(|e| JobError::retry(format!("idempotency store: {e}")))?
        {
            Claim::Completed(_) => {
                tracing::info!("mail was sent before; not sending again");
                return Ok(());
            }
            Claim::InProgress => {
                return Err(JobError::retry("the mail is being sent by another worker"));
            }
            Claim::Acquired(token) => token,
        };
        let span = tracing::info_span!(
            "outbox.smtp.send",
            otel.kind = "client",
            recipients = mail.to.len() + mail.cc.len(),
        );
        match self.transport.send(message).instrument(span).await {
            Ok(response) => {
                let recorded = json!({ "code": response.code().to_string() });
                match self
                    .store
                    .complete(&key, &token, &recorded, self.settings.ttl)
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => tracing::warn!(
                        "mail sent but not recorded: the claim's lease ran out during the send (DELIVERY_LEASE_MS); a redelivery may send it again"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "mail sent but not recorded; a redelivery may send it again")
                    }
                }
                tracing::info!(to = ?mail.to, "mail sent");
                Ok(())
            }
            Err(e) => {
                if let Err(release) = self.store.release(&key, &token).await {
                    tracing::warn!(error = %release, "cannot release the send claim; it expires with its lease");
                }
                if e.is_permanent() {
                    Err(JobError::permanent(format!(
                        "SMTP server refused the mail: {e}"
                    )))
                } else {
                    Err(JobError::retry(format!("SMTP failure: {e}")))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use outbox_test_support::TestRedis;
    use uuid::Uuid;

    /// A lookup that answers `vars` and nothing else.
    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn smtp_url_is_none_when_unset_and_kept_as_given_when_smtp_or_smtps_with_a_host() {
        assert_eq!(SmtpSettings::url_from_lookup(&lookup(&[])).unwrap(), None);
        for url in ["smtp://mail.acme.test:25", "smtps://u:p@mail.acme.test"] {
            assert_eq!(
                SmtpSettings::url_from_lookup(&lookup(&[("SMTP_URL", url)])).unwrap(),
                Some(url.to_owned())
            );
        }
    }

    #[test]
    fn smtp_url_of_another_scheme_without_a_host_or_unparsable_is_refused_naming_why() {
        for (url, problem) in [
            (
                "http://mail.acme.test",
                "scheme \"http\" is not smtp or smtps",
            ),
            ("smtp://", "has no host"),
            ("smtp:mail.acme.test", "has no host"),
            ("//mail.acme.test:25", "is not a URL"),
        ] {
            let err = SmtpSettings::url_from_lookup(&lookup(&[("SMTP_URL", url)])).unwrap_err();
            assert_eq!(err.variable, "SMTP_URL", "{url}");
            assert!(err.problem.starts_with(problem), "{url}: {}", err.problem);
        }
        let err = SmtpSettings::url_from_lookup(&lookup(&[(
            "SMTP_URL",
            "http://user:secret@mail.acme.test",
        )]))
        .unwrap_err();
        assert_eq!(
            err.value,
            outbox_queue::redact_url("http://user:secret@mail.acme.test")
        );
        assert!(!err.value.contains("secret"), "{}", err.value);
    }

    #[test]
    fn mail_from_is_the_default_sender_when_unset_and_refused_when_not_an_address() {
        assert_eq!(
            SmtpSettings::default_from_lookup(&lookup(&[])).unwrap(),
            SmtpSettings::DEFAULT_FROM
        );
        assert_eq!(
            SmtpSettings::default_from_lookup(&lookup(&[("MAIL_FROM", "Shop <shop@acme.test>")]))
                .unwrap(),
            "Shop <shop@acme.test>"
        );
        let err = SmtpSettings::default_from_lookup(&lookup(&[("MAIL_FROM", "not an address")]))
            .unwrap_err();
        assert_eq!(err.variable, "MAIL_FROM");
        assert!(
            err.problem.starts_with("is not a mail address"),
            "{}",
            err.problem
        );
    }

    fn message_id_line(message: &Message) -> Option<String> {
        String::from_utf8(message.formatted())
            .unwrap()
            .lines()
            .find(|line| line.to_ascii_lowercase().starts_with("message-id:"))
            .map(str::to_owned)
    }

    #[tokio::test]
    async fn every_mail_carries_the_message_id_of_its_event_with_the_senders_domain() {
        let redis = TestRedis::new().await;
        let store = RedisIdempotencyStore::new(redis.conn().await).with_prefix(redis.prefix());
        let settings = SmtpSettings {
            default_from: "Acme Shop <shop@acme.test>".to_owned(),
            ..SmtpSettings::new("smtp://127.0.0.1:25")
        };
        let handler = SmtpHandler::new(settings, store).unwrap();
        let id = Uuid::now_v7();
        // A mail naming its own sender still takes the domain of MAIL_FROM:
        // the id stays the same whatever the mail's sender.
        let mail = render_request(
            &Templates::standard(),
            id,
            "acme",
            &json!({ "to": "ada@example.com", "from": "sales@elsewhere.test", "subject": "Hi", "text": "Hello" }),
        )
        .unwrap();

        let expected = format!("Message-ID: <{id}.0@acme.test>");
        let first = handler.message(&mail).unwrap();
        assert_eq!(message_id_line(&first), Some(expected.clone()));
        let again = handler.message(&mail).unwrap();
        assert_eq!(
            message_id_line(&again),
            Some(expected),
            "the same every time"
        );
    }

    #[tokio::test]
    async fn the_smtp_password_never_shows_in_errors_or_settings() {
        let redis =
            outbox_queue::connect(&outbox_queue::RedisSettings::new("redis://127.0.0.1:6379"))
                .unwrap();
        let store = RedisIdempotencyStore::new(redis);
        let settings = SmtpSettings::new("bogus://mailer:s3cr3t-smtp-pw@mail.example.com");
        let debug = format!("{settings:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(
            debug.contains("bogus://mailer:***@mail.example.com"),
            "{debug}"
        );
        let Err(error) = SmtpHandler::new(settings, store) else {
            panic!("an unknown scheme should be refused");
        };
        for text in [error.to_string(), format!("{error:?}")] {
            assert!(!text.contains("s3cr3t"), "{text}");
            assert!(
                text.contains("bogus://mailer:***@mail.example.com"),
                "{text}"
            );
        }
    }
}
