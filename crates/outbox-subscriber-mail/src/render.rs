//! Validating a mail request and rendering it into an [`EmailJob`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// A rendered mail, ready to send: the body of a `toolctrl.email` job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmailJob {
    /// The outbox event that asked for it (its idempotency key).
    pub outbox_event_id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// Sender; `None` uses the worker's default sender.
    pub from: Option<String>,
    /// Recipients.
    pub to: Vec<String>,
    /// Carbon copies.
    #[serde(default)]
    pub cc: Vec<String>,
    /// Reply-To.
    pub reply_to: Option<String>,
    /// Subject line.
    pub subject: String,
    /// Plain-text body.
    pub text: Option<String>,
    /// HTML body.
    pub html: Option<String>,
    /// The delivery generation of the event this mail belongs to (0 for the
    /// first delivery, n after the n-th operator replay; jobs written before
    /// the field existed read as 0); part of its task id, idempotency key and
    /// `Message-ID` (see [`message_id`]), so that a replay's mail is a new
    /// message rather than a duplicate of the first.
    #[serde(default)]
    pub generation: u32,
    /// The trace context of the job that rendered the mail, which the
    /// sending job's span continues (see
    /// [`outbox_queue::OutboxJob::trace_context`]).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "outbox_trace::deserialize_lenient"
    )]
    pub trace_context: Option<outbox_trace::TraceContext>,
}

impl EmailJob {
    /// The id of the event's delivery generation (see
    /// [`outbox_queue::delivery_id`]).
    #[must_use]
    pub fn delivery_id(&self) -> String {
        outbox_queue::delivery_id(self.outbox_event_id, self.generation)
    }
}

/// The deterministic task id (and idempotency key) of the mail of one
/// delivery of an event: `email:<delivery id>`, i.e. `email:<event id>` for
/// generation 0 ([`outbox_queue::email_task_id`], which reconciliation after a
/// Redis loss also uses).
#[must_use]
pub fn email_task_id(delivery_id: &str) -> String {
    outbox_queue::email_task_id(delivery_id)
}

/// The `Message-ID` domain when the sender's address has none.
pub const MESSAGE_ID_FALLBACK_DOMAIN: &str = "outbox.invalid";

/// The `Message-ID` of the mail of an event: `<{event id}.{generation}@{domain}>`,
/// `domain` being the domain of the worker's sender address (`MAIL_FROM`), or
/// [`MESSAGE_ID_FALLBACK_DOMAIN`] when it is empty.
///
/// It depends on nothing else, so every send of the same mail carries the
/// same id: a duplicate inside the at-least-once window (sent, then the
/// worker died before recording it) is recognisably the same message to
/// receivers and mail clients.
#[must_use]
pub fn message_id(event_id: Uuid, generation: u32, domain: &str) -> String {
    let domain = if domain.is_empty() {
        MESSAGE_ID_FALLBACK_DOMAIN
    } else {
        domain
    };
    format!("<{event_id}.{generation}@{domain}>")
}

/// Why a mail request cannot become a mail. Always permanent: the same
/// request will fail the same way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MailError {
    /// A required field is missing or has the wrong type.
    #[error("mail request: {0}")]
    Invalid(String),
    /// An address does not look like one.
    #[error("invalid mail address {0:?}")]
    BadAddress(String),
    /// No template of that name.
    #[error("unknown mail template {0:?}")]
    UnknownTemplate(String),
    /// The template needs a variable the request did not give.
    #[error("template {template:?} needs variable {variable:?}")]
    MissingVariable {
        /// The template.
        template: String,
        /// The variable.
        variable: String,
    },
}

/// A named template: subject, text and HTML with `{{name}}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Subject line.
    pub subject: String,
    /// Plain-text body.
    pub text: String,
    /// HTML body; values are HTML-escaped.
    pub html: Option<String>,
}

/// The template registry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Templates {
    templates: BTreeMap<String, Template>,
}

impl Templates {
    /// The built-in templates: `welcome`, `order-confirmation`, `password-reset`,
    /// and `lead-notification` (marketing leads).
    #[must_use]
    pub fn standard() -> Self {
        let mut templates = Self::default();
        templates.insert(
            "welcome",
            "Welcome, {{name}}!",
            "Hello {{name}},\n\nwelcome aboard.\n",
            Some("<p>Hello {{name}},</p><p>welcome aboard.</p>"),
        );
        templates.insert(
            "order-confirmation",
            "Your order #{{orderId}}",
            "Thank you for your order #{{orderId}} ({{totalCents}} cents).\n",
            Some("<p>Thank you for your order <b>#{{orderId}}</b> ({{totalCents}} cents).</p>"),
        );
        templates.insert(
            "password-reset",
            "Reset your password",
            "Follow this link to reset your password: {{link}}\n",
            None,
        );
        templates.insert(
            "lead-notification",
            "New lead: {{name}}",
            "A new lead came in.\n\nName: {{name}}\nEmail: {{email}}\nCompany: {{company}}\nMessage: {{message}}\n",
            None,
        );
        templates
    }

    /// Adds or replaces a template.
    pub fn insert(&mut self, name: &str, subject: &str, text: &str, html: Option<&str>) {
        self.templates.insert(
            name.to_owned(),
            Template {
                subject: subject.to_owned(),
                text: text.to_owned(),
                html: html.map(str::to_owned),
            },
        );
    }

    /// Renders `name` with `vars`.
    ///
    /// # Errors
    ///
    /// [`MailError::UnknownTemplate`] or [`MailError::MissingVariable`].
    pub fn render(
        &self,
        name: &str,
        vars: &Value,
    ) -> Result<(String, String, Option<String>), MailError> {
        let template = self
            .templates
            .get(name)
            .ok_or_else(|| MailError::UnknownTemplate(name.to_owned()))?;
        let fill = |text: &str, html: bool| fill(name, text, vars, html);
        Ok((
            fill(&template.subject, false)?,
            fill(&template.text, false)?,
            template
                .html
                .as_deref()
                .map(|h| fill(h, true))
                .transpose()?,
        ))
    }
}

fn fill(template: &str, text: &str, vars: &Value, html: bool) -> Result<String, MailError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let variable = after[..end].trim();
        let value = match vars.get(variable) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => {
                return Err(MailError::MissingVariable {
                    template: template.to_owned(),
                    variable: variable.to_owned(),
                });
            }
            Some(other) => other.to_string(),
        };
        out.push_str(&if html { escape_html(&value) } else { value });
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

fn escape_html(value: &str) -> String {
    value
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn address(raw: &str) -> Result<String, MailError> {
    raw.parse::<lettre::Address>()
        .map(|_| raw.to_owned())
        .or_else(|_| {
            raw.parse::<lettre::message::Mailbox>()
                .map(|_| raw.to_owned())
        })
        .map_err(|_| MailError::BadAddress(raw.to_owned()))
}

fn addresses(value: Option<&Value>, field: &str) -> Result<Vec<String>, MailError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(one)) => Ok(vec![address(one)?]),
        Some(Value::Array(many)) => many
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| MailError::Invalid(format!("{field} must hold strings")))
                    .and_then(address)
            })
            .collect(),
        Some(_) => Err(MailError::Invalid(format!(
            "{field} must be a string or an array of strings"
        ))),
    }
}

fn optional_text(payload: &Value, field: &str) -> Result<Option<String>, MailError> {
    match payload.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(MailError::Invalid(format!("{field} must be a string"))),
    }
}

/// Turns a `mail.*` payload into a mail.
///
/// Accepted fields: `to` (required; a string or an array), `cc`, `from`,
/// `replyTo`; then either `subject` with `text` and/or `html`, or
/// `template` with `vars` (an object).
///
/// # Errors
///
/// A [`MailError`] naming what is wrong.
pub fn render_request(
    templates: &Templates,
    event_id: Uuid,
    tenant_id: &str,
    payload: &Value,
) -> Result<EmailJob, MailError> {
    let to = addresses(payload.get("to"), "to")?;
    if to.is_empty() {
        return Err(MailError::Invalid("to is required".into()));
    }
    let cc = addresses(payload.get("cc"), "cc")?;
    let from = optional_text(payload, "from")?
        .map(|f| address(&f))
        .transpose()?;
    let reply_to = optional_text(payload, "replyTo")?
        .map(|r| address(&r))
        .transpose()?;
    let (subject, text, html) = match optional_text(payload, "template")? {
        Some(name) => {
            let vars = payload
                .get("vars")
                .cloned()
                .unwrap_or(Value::Object(Default::default()));
            if !vars.is_object() {
                return Err(MailError::Invalid("vars must be an object".into()));
            }
            let (subject, text, html) = templates.render(&name, &vars)?;
            (subject, Some(text), html)
        }
        None => {
            let subject = optional_text(payload, "subject")?.ok_or_else(|| {
                MailError::Invalid("subject is required without a template".into())
            })?;
            let text = optional_text(payload, "text")?;
            let html = optional_text(payload, "html")?;
            if text.is_none() && html.is_none() {
                return Err(MailError::Invalid(
                    "text or html is required without a template".into(),
                ));
            }
            (subject, text, html)
        }
    };
    if subject.contains(['\r', '\n']) {
        return Err(MailError::Invalid("subject must be one line".into()));
    }
    Ok(EmailJob {
        outbox_event_id: event_id,
        tenant_id: tenant_id.to_owned(),
        from,
        to,
        cc,
        reply_to,
        subject,
        text,
        html,
        generation: 0,
        trace_context: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(payload: Value) -> Result<EmailJob, MailError> {
        render_request(&Templates::standard(), Uuid::nil(), "t", &payload)
    }

    #[test]
    fn renders_templates_and_plain_mails() {
        let mail = render(json!({
            "to": "ada@example.com",
            "template": "order-confirmation",
            "vars": { "orderId": 42, "totalCents": 4200 }
        }))
        .unwrap();
        assert_eq!(mail.subject, "Your order #42");
        assert_eq!(
            mail.text.as_deref(),
            Some("Thank you for your order #42 (4200 cents).\n")
        );
        assert!(mail.html.unwrap().contains("<b>#42</b>"));
        let plain = render(json!({ "to": ["a@example.com", "b@example.com"], "subject": "Hi", "html": "<p>x</p>" })).unwrap();
        assert_eq!(plain.to.len(), 2);
        assert_eq!(plain.text, None);
    }

    #[test]
    fn html_values_are_escaped() {
        let mail = render(
            json!({ "to": "a@example.com", "template": "welcome", "vars": { "name": "<script>" } }),
        )
        .unwrap();
        assert!(mail.html.unwrap().contains("&lt;script&gt;"));
        assert_eq!(mail.subject, "Welcome, <script>!");
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let cases = [
            (json!({ "subject": "x", "text": "y" }), "to is required"),
            (
                json!({ "to": "not-an-address", "subject": "x", "text": "y" }),
                "invalid mail address",
            ),
            (
                json!({ "to": "a@example.com", "text": "y" }),
                "subject is required",
            ),
            (
                json!({ "to": "a@example.com", "subject": "x" }),
                "text or html",
            ),
            (
                json!({ "to": "a@example.com", "template": "nope" }),
                "unknown mail template",
            ),
            (
                json!({ "to": "a@example.com", "template": "welcome", "vars": {} }),
                "needs variable \"name\"",
            ),
            (
                json!({ "to": 7, "subject": "x", "text": "y" }),
                "to must be",
            ),
            (
                json!({ "to": "a@example.com", "subject": "x\r\nBcc: evil@example.com", "text": "y" }),
                "one line",
            ),
        ];
        for (payload, expected) in cases {
            let err = render(payload.clone()).unwrap_err().to_string();
            assert!(err.contains(expected), "{payload}: {err}");
        }
    }

    #[test]
    fn message_ids_are_stable_per_event_and_generation() {
        let id = Uuid::parse_str("0190c7a2-5b1e-7c3d-8e4f-a1b2c3d4e5f6").unwrap();
        assert_eq!(
            message_id(id, 0, "example.test"),
            "<0190c7a2-5b1e-7c3d-8e4f-a1b2c3d4e5f6.0@example.test>"
        );
        assert_eq!(
            message_id(id, 0, "example.test"),
            message_id(id, 0, "example.test"),
            "the same mail, the same id"
        );
        assert_ne!(
            message_id(id, 1, "example.test"),
            message_id(id, 0, "example.test")
        );
        assert_ne!(
            message_id(Uuid::nil(), 0, "example.test"),
            message_id(id, 0, "example.test")
        );
        assert_eq!(
            message_id(id, 2, ""),
            "<0190c7a2-5b1e-7c3d-8e4f-a1b2c3d4e5f6.2@outbox.invalid>"
        );
    }

    #[test]
    fn rendered_mails_are_generation_zero_and_old_jobs_read_as_zero() {
        let mail = render(json!({ "to": "a@example.com", "subject": "x", "text": "y" })).unwrap();
        assert_eq!(mail.generation, 0);
        let mut old = serde_json::to_value(&mail).unwrap();
        old.as_object_mut().unwrap().remove("generation");
        let read: EmailJob = serde_json::from_value(old).unwrap();
        assert_eq!(read, mail);
    }
}
