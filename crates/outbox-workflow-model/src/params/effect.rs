//! Parameters of the blocks with effects outside the run: `email`,
//! `httpRequest`, and the row blocks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ParamError, Params, ensure};
use crate::names::is_identifier;
use crate::{Operand, TextTemplate, VarPath};

/// `email`: sends one mail through the mail pipeline (`outbox.mail`), either
/// inline (`subject` with `text` and/or `html`) or from a named mail
/// template with `vars` (the template has its own subject). Output: the
/// mail's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EmailParams {
    /// Recipients; at least one. A literal recipient must contain `@`.
    pub to: Vec<TextTemplate>,
    /// Carbon copies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cc: Vec<TextTemplate>,
    /// Subject line: required inline, refused with `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<TextTemplate>,
    /// Plain-text body (inline mails).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<TextTemplate>,
    /// HTML body (inline mails). Placeholders are not HTML-escaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<TextTemplate>,
    /// The name of a mail template (`order-confirmation`), instead of
    /// `subject`, `text` and `html`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The template's variables; only with `template`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vars: BTreeMap<String, Operand>,
}

impl Params for EmailParams {
    fn check(&self) -> Result<(), ParamError> {
        ensure(
            !self.to.is_empty(),
            "to",
            "a mail needs at least one recipient",
        )?;
        for (name, list) in [("to", &self.to), ("cc", &self.cc)] {
            for (i, address) in list.iter().enumerate() {
                ensure(
                    !address.is_literal() || address.as_str().contains('@'),
                    &format!("{name}[{i}]"),
                    format!("{:?} is not a mail address", address.as_str()),
                )?;
            }
        }
        if let Some(template) = &self.template {
            ensure(
                !template.trim().is_empty(),
                "template",
                "empty template name",
            )?;
            for (field, given) in [
                ("subject", self.subject.is_some()),
                ("text", self.text.is_some()),
                ("html", self.html.is_some()),
            ] {
                ensure(
                    !given,
                    field,
                    "a template mail takes its subject and body from the template",
                )?;
            }
        } else {
            ensure(
                self.subject.is_some(),
                "subject",
                "an inline mail needs a subject",
            )?;
            ensure(
                self.text.is_some() || self.html.is_some(),
                "text",
                "an inline mail needs `text`, `html` or both (or use `template`)",
            )?;
            ensure(self.vars.is_empty(), "vars", "`vars` go with `template`")?;
        }
        Ok(())
    }

    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        let texts = self.to.iter().chain(&self.cc).chain(&self.subject);
        out.extend(
            texts
                .chain(&self.text)
                .chain(&self.html)
                .flat_map(TextTemplate::placeholders),
        );
        out.extend(self.vars.values().filter_map(Operand::path));
    }
}

/// The default `httpRequest` timeout: 30 s.
pub const DEFAULT_HTTP_TIMEOUT_MS: u64 = 30_000;
/// The longest `httpRequest` timeout: 5 min.
pub const MAX_HTTP_TIMEOUT_MS: u64 = 300_000;

/// An HTTP method. Serialized in upper case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    /// `GET` (no body).
    Get,
    /// `HEAD` (no body).
    Head,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
    /// `PATCH`.
    Patch,
    /// `DELETE`.
    Delete,
}

/// `httpRequest`: one HTTP call. Output: `{ status, headers, body }` (the
/// body parsed as JSON when it is, else text). What counts as a failure
/// (a non-2xx status) is the runner's to define.
///
/// It may name a tenant credential (`credentialId`) that the executor
/// applies to the request, so its credential use is *optional*: preflight
/// checks the credential only when one is named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRequestParams {
    /// The method.
    pub method: HttpMethod,
    /// The URL; it must start with `http://` or `https://` (placeholders
    /// come after the scheme), and parse as a URL when it has no
    /// placeholder.
    pub url: TextTemplate,
    /// Request headers; names are HTTP tokens.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, TextTemplate>,
    /// The body, sent as JSON; refused for `GET` and `HEAD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Operand>,
    /// Timeout, 1 ms to [`MAX_HTTP_TIMEOUT_MS`]; [`DEFAULT_HTTP_TIMEOUT_MS`]
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// A tenant credential to authenticate with, by id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_id: Option<String>,
}

impl HttpRequestParams {
    /// The timeout in force: `timeoutMs` or [`DEFAULT_HTTP_TIMEOUT_MS`].
    #[must_use]
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_HTTP_TIMEOUT_MS)
    }
}

impl Params for HttpRequestParams {
    fn check(&self) -> Result<(), ParamError> {
        let url = self.url.as_str();
        ensure(
            url.starts_with("http://") || url.starts_with("https://"),
            "url",
            format!("{url:?} does not start with http:// or https://"),
        )?;
        if self.url.is_literal() {
            let parsed = url::Url::parse(url);
            ensure(
                parsed.as_ref().is_ok_and(|u| u.host().is_some()),
                "url",
                match parsed {
                    Err(err) => format!("{url:?} is not a URL: {err}"),
                    Ok(_) => format!("{url:?} has no host"),
                },
            )?;
        }
        for name in self.headers.keys() {
            ensure(
                !name.is_empty() && name.bytes().all(is_token_byte),
                &format!("headers.{name}"),
                format!("{name:?} is not a header name"),
            )?;
        }
        ensure(
            self.body.is_none() || !matches!(self.method, HttpMethod::Get | HttpMethod::Head),
            "body",
            "GET and HEAD requests take no body",
        )?;
        if let Some(ms) = self.timeout_ms {
            ensure(
                (1..=MAX_HTTP_TIMEOUT_MS).contains(&ms),
                "timeoutMs",
                format!("{ms} is outside 1..={MAX_HTTP_TIMEOUT_MS}"),
            )?;
        }
        match &self.credential_id {
            Some(id) => ensure(!id.trim().is_empty(), "credentialId", "empty credential id"),
            None => Ok(()),
        }
    }

    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        out.extend(self.url.placeholders());
        out.extend(self.headers.values().flat_map(TextTemplate::placeholders));
        out.extend(self.body.iter().filter_map(Operand::path));
    }
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `rowGet`: reads one row. Output: the row, or `null` when there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowGetParams {
    /// The entity (an identifier).
    pub entity: String,
    /// The row's id: a string or a number, or a path to one.
    pub id: Operand,
}

/// `rowCreate`: creates a row. Output: the created row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowCreateParams {
    /// The entity (an identifier).
    pub entity: String,
    /// Column (an identifier) → value; at least one.
    pub values: BTreeMap<String, Operand>,
}

/// `rowUpdate`: updates a row. Output: the updated row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowUpdateParams {
    /// The entity (an identifier).
    pub entity: String,
    /// The row's id: a string or a number, or a path to one.
    pub id: Operand,
    /// Column (an identifier) → new value; at least one.
    pub patch: BTreeMap<String, Operand>,
}

/// `rowDelete`: deletes a row. Output: whether a row was deleted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowDeleteParams {
    /// The entity (an identifier).
    pub entity: String,
    /// The row's id: a string or a number, or a path to one.
    pub id: Operand,
}

fn check_entity(entity: &str) -> Result<(), ParamError> {
    ensure(
        is_identifier(entity),
        "entity",
        format!(
            "{entity:?} is not an entity name (a letter or `_`, then letters, digits or `_`, 64 at most)"
        ),
    )
}

fn check_id(id: &Operand) -> Result<(), ParamError> {
    match id {
        Operand::Literal(value) => ensure(
            value.is_string() || value.is_number(),
            "id",
            format!("a row id is a string or a number, not {value}"),
        ),
        Operand::Var(_) => Ok(()),
    }
}

fn check_columns(field: &str, columns: &BTreeMap<String, Operand>) -> Result<(), ParamError> {
    ensure(!columns.is_empty(), field, "at least one column")?;
    match columns.keys().find(|name| !is_identifier(name)) {
        Some(name) => Err(ParamError::new(
            format!("{field}.{name}"),
            format!("{name:?} is not a column name"),
        )),
        None => Ok(()),
    }
}

impl Params for RowGetParams {
    fn check(&self) -> Result<(), ParamError> {
        check_entity(&self.entity)?;
        check_id(&self.id)
    }

    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        out.extend(self.id.path());
    }
}

impl Params for RowCreateParams {
    fn check(&self) -> Result<(), ParamError> {
        check_entity(&self.entity)?;
        check_columns("values", &self.values)
    }

    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        out.extend(self.values.values().filter_map(Operand::path));
    }
}

impl Params for RowUpdateParams {
    fn check(&self) -> Result<(), ParamError> {
        check_entity(&self.entity)?;
        check_id(&self.id)?;
        check_columns("patch", &self.patch)
    }

    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        out.extend(self.id.path());
        out.extend(self.patch.values().filter_map(Operand::path));
    }
}

impl Params for RowDeleteParams {
    fn check(&self) -> Result<(), ParamError> {
        check_entity(&self.entity)?;
        check_id(&self.id)
    }

    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        out.extend(self.id.path());
    }
}
