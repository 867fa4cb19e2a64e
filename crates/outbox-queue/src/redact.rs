//! Hiding secrets in URLs before they are shown: in logs, error messages,
//! dead-job reasons and CLI output.
//!
//! - [`redact_url`] for connection URLs (`DATABASE_URL`, `REDIS_URL`,
//!   `SMTP_URL`): the password and secret-looking query values become
//!   `***`; scheme, user, host, port, path and other parameters stay, so the
//!   message still says where the process tried to go.
//! - [`endpoint_origin`] for webhook and plugin endpoints, whose path and
//!   query often carry a token: only scheme, host and port are shown.
//! - [`redact_urls_in`] for free text that may embed URLs (an error chain,
//!   a stored reason): each URL is replaced by one of the above.
//! - [`redact_json`] for a JSON document shown to a person (an event's
//!   payload in the console): the values of secret-looking fields become
//!   `***` and URLs in strings are reduced as above.
//!
//! These functions err on the side of hiding too much: a string they cannot
//! make sense of loses more than its secret, never less.

/// What replaces a hidden secret.
pub const REDACTED: &str = "***";

/// What [`endpoint_origin`] shows for a URL it cannot parse.
pub const INVALID_URL: &str = "<invalid URL>";

/// `url` with its password and the values of secret-looking query
/// parameters (`password`, `sslpassword`, `pass`, `token`, `secret`, `key`,
/// …) replaced by `***`. The user name is kept. Also works on libpq
/// `key=value` strings and on strings that are no valid URL at all, as found
/// in a misconfigured variable.
///
/// ```
/// use outbox_queue::redact_url;
/// assert_eq!(redact_url("postgres://app:pw@db:5432/x"), "postgres://app:***@db:5432/x");
/// assert_eq!(redact_url("redis://:pw@cache:6379/0"), "redis://:***@cache:6379/0");
/// assert_eq!(redact_url("postgres://db/x?user=app&password=pw"), "postgres://db/x?user=app&password=***");
/// assert_eq!(redact_url("smtp://mail.example.com:25"), "smtp://mail.example.com:25");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = split_scheme(url).unwrap_or(("", url));
    let rest = redact_params(rest);
    let mut out = String::with_capacity(url.len());
    if !scheme.is_empty() {
        out.push_str(scheme);
        out.push_str("://");
    }
    // The last `@` ends the user information: a password may itself contain
    // `@`, `/` or `?` when it was not percent-encoded.
    match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..=colon]);
                    out.push_str(REDACTED);
                }
                None => out.push_str(userinfo),
            }
            out.push_str(&rest[at..]);
        }
        None => out.push_str(&rest),
    }
    out
}

/// Where an endpoint URL points, without what may be secret in it (user
/// information, path, query, fragment): `https://hooks.example.com/…`,
/// `http://10.0.0.5:8080/…`; [`INVALID_URL`] when it does not parse.
///
/// ```
/// use outbox_queue::endpoint_origin;
/// assert_eq!(
///     endpoint_origin("https://hooks.example.com/t/abc123?sig=xyz"),
///     "https://hooks.example.com/…"
/// );
/// assert_eq!(endpoint_origin("http://u:pw@127.0.0.1:8080/x"), "http://127.0.0.1:8080/…");
/// assert_eq!(endpoint_origin("not a url /abc123"), "<invalid URL>");
/// ```
#[must_use]
pub fn endpoint_origin(url: &str) -> String {
    match url::Url::parse(url.trim()) {
        Ok(parsed) => match parsed.host_str() {
            Some(host) => match parsed.port() {
                Some(port) => format!("{}://{host}:{port}/…", parsed.scheme()),
                None => format!("{}://{host}/…", parsed.scheme()),
            },
            _ => INVALID_URL.to_owned(),
        },
        Err(_) => INVALID_URL.to_owned(),
    }
}

/// `text` with every URL in it (`scheme://…` up to the next white space or
/// quote) replaced: `http`, `https`, `ws` and `wss` URLs by their
/// [`endpoint_origin`], others by [`redact_url`]. For messages that embed a
/// URL the caller does not control, such as a client library's error chain
/// or a reason stored by an older version.
///
/// ```
/// use outbox_queue::redact_urls_in;
/// assert_eq!(
///     redact_urls_in("error sending request for url (https://h.example/t/abc?k=1): timed out"),
///     "error sending request for url (https://h.example/…): timed out"
/// );
/// ```
#[must_use]
pub fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("://") {
        let scheme_start = trailing_run(&rest[..found], is_scheme_char);
        let end = rest[found..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .map_or(rest.len(), |i| found + i);
        if scheme_start == found {
            // `://` without a scheme: not a URL; keep it and look further.
            out.push_str(&rest[..found + 3]);
            rest = &rest[found + 3..];
            continue;
        }
        // Punctuation that closes the surrounding sentence is not part of the URL.
        let token = rest[scheme_start..end].trim_end_matches([')', ',', '.', ';', ':']);
        let trailing = &rest[scheme_start + token.len()..end];
        out.push_str(&rest[..scheme_start]);
        let scheme = token[..found - scheme_start].to_ascii_lowercase();
        if matches!(scheme.as_str(), "http" | "https" | "ws" | "wss") {
            out.push_str(&endpoint_origin(token));
        } else {
            out.push_str(&redact_url(token));
        }
        out.push_str(trailing);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Where the run of characters matching `part_of` at the end of `text` starts.
fn trailing_run(text: &str, part_of: impl Fn(char) -> bool) -> usize {
    text.char_indices()
        .rev()
        .find(|&(_, c)| !part_of(c))
        .map_or(0, |(i, c)| i + c.len_utf8())
}

fn is_scheme_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')
}

/// `("postgres", "app:pw@db/x")` for `postgres://app:pw@db/x`.
fn split_scheme(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let valid =
        scheme.starts_with(|c: char| c.is_ascii_alphabetic()) && scheme.chars().all(is_scheme_char);
    valid.then_some((scheme, rest))
}

/// `value` with the value of every secret-looking field (a name containing
/// `pass`, `pwd`, `secret`, `token`, `key`, `auth`, `sig` or `credential`,
/// the same words as the query parameters [`redact_url`] hides), at any
/// depth, replaced by `***`, and every URL inside a string reduced by
/// [`redact_urls_in`]. Field names, numbers and other strings stay.
///
/// ```
/// use outbox_queue::redact_json;
/// use serde_json::json;
/// let shown = redact_json(&json!({
///     "user": "ana",
///     "webhook": { "signingSecret": "whsec_abc", "url": "https://h.example/t/abc?k=1" },
///     "tokens": ["a", "b"]
/// }));
/// assert_eq!(shown, json!({
///     "user": "ana",
///     "webhook": { "signingSecret": "***", "url": "https://h.example/…" },
///     "tokens": "***"
/// }));
/// ```
#[must_use]
pub fn redact_json(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(name, field)| {
                    let shown = if is_secret_key(name) && !field.is_null() {
                        Value::String(REDACTED.to_owned())
                    } else {
                        redact_json(field)
                    };
                    (name.clone(), shown)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact_json).collect()),
        Value::String(text) => Value::String(redact_urls_in(text)),
        other => other.clone(),
    }
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "pass",
        "pwd",
        "secret",
        "token",
        "key",
        "auth",
        "sig",
        "credential",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// Replaces the values of secret-looking `key=value` pairs (URL query
/// parameters and libpq keywords alike).
fn redact_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let before = &rest[..eq];
        let key_start = trailing_run(before, |c| {
            c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
        });
        let secret = is_secret_key(&before[key_start..]);
        out.push_str(before);
        out.push('=');
        let value = &rest[eq + 1..];
        let end = value_end(value);
        if secret && end > 0 {
            out.push_str(REDACTED);
        } else {
            out.push_str(&value[..end]);
        }
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

/// The length of the value at the start of `value`: a libpq single-quoted
/// string (backslash escapes), or up to the next separator.
fn value_end(value: &str) -> usize {
    if let Some(quoted) = value.strip_prefix('\'') {
        let mut escaped = false;
        for (i, c) in quoted.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '\'' => return i + 2,
                _ => {}
            }
        }
        return value.len();
    }
    value
        .find(|c: char| c.is_whitespace() || matches!(c, '&' | ';' | '#'))
        .unwrap_or(value.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The URL parser gives no host (rather than an empty one) for each of
    // these, so an endpoint without a host is refused without a guard of
    // its own.
    #[test]
    fn an_endpoint_without_a_host_is_shown_as_invalid() {
        for url in [
            "file:///etc/passwd",
            "unix:/run/app.sock",
            "foo:///path",
            "foo://",
            "redis:///0",
        ] {
            assert_eq!(endpoint_origin(url), INVALID_URL, "{url}");
        }
        assert_eq!(endpoint_origin("https://h.example"), "https://h.example/…");
    }

    #[test]
    fn passwords_in_connection_urls_are_hidden() {
        let cases = [
            (
                "postgres://app:s3cr3t@db:5432/x",
                "postgres://app:***@db:5432/x",
            ),
            (
                "postgresql://app:s3cr3t@db/x?sslmode=require",
                "postgresql://app:***@db/x?sslmode=require",
            ),
            ("redis://:s3cr3t@cache:6379", "redis://:***@cache:6379"),
            (
                "rediss://default:s3cr3t@cache:6380/2",
                "rediss://default:***@cache:6380/2",
            ),
            (
                "smtps://mailer:s3cr3t@smtp.example.com",
                "smtps://mailer:***@smtp.example.com",
            ),
            (
                "smtp://mailer:s3cr3t@smtp.example.com:587?tls=required",
                "smtp://mailer:***@smtp.example.com:587?tls=required",
            ),
            // Not percent-encoded: `@`, `/`, `:` and `?` inside the password.
            ("postgres://app:s3@c/r:e?t@db/x", "postgres://app:***@db/x"),
            // Percent-encoded.
            (
                "postgres://app:s3%40cr%2Fet@db/x",
                "postgres://app:***@db/x",
            ),
            // An empty secret stays empty: the operator sees that it is missing.
            (
                "postgres://db/x?password=&user=app",
                "postgres://db/x?password=&user=app",
            ),
            // Several hosts (libpq form).
            (
                "postgres://app:s3cr3t@db1:5432,db2:5432/x",
                "postgres://app:***@db1:5432,db2:5432/x",
            ),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn urls_without_secrets_are_unchanged() {
        for url in [
            "postgres://app@db:5432/x",
            "postgres://db/x?sslmode=disable&application_name=outbox",
            "redis://127.0.0.1:6379/0",
            "smtp://127.0.0.1:2525",
            "",
            "notaurl",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }

    #[test]
    fn secret_parameters_are_hidden_in_queries_and_keyword_strings() {
        assert_eq!(
            redact_url("postgres://db/x?user=app&password=s3cr3t&sslmode=require"),
            "postgres://db/x?user=app&password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://app:s3cr3t@db/x?sslpassword=k3y"),
            "postgres://app:***@db/x?sslpassword=***"
        );
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?db=1&pass=s3cr3t"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(
            redact_url("host=db user=app password=s3cr3t dbname=x"),
            "host=db user=app password=*** dbname=x"
        );
        assert_eq!(
            redact_url("host=db password='s3 cr\\'3t' dbname=x"),
            "host=db password=*** dbname=x"
        );
    }

    #[test]
    fn invalid_urls_are_redacted_too() {
        for (url, shown) in [
            ("mysql://app:s3cr3t@db/x", "mysql://app:***@db/x"),
            ("app:s3cr3t@db:5432/x", "app:***@db:5432/x"),
            ("postgres://app:s3cr3t@", "postgres://app:***@"),
            ("bogus://:s3cr3t@", "bogus://:***@"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn endpoints_show_scheme_host_and_port_only() {
        let cases = [
            (
                "https://hooks.example.com/services/T0/B0/tok?token=abc#frag",
                "https://hooks.example.com/…",
            ),
            ("https://hooks.example.com", "https://hooks.example.com/…"),
            (
                "http://user:pw@127.0.0.1:8080/hook/tok",
                "http://127.0.0.1:8080/…",
            ),
            (
                "https://hooks.example.com:443/x",
                "https://hooks.example.com/…",
            ),
            ("http://[::1]:9000/x?t=1", "http://[::1]:9000/…"),
            ("HTTPS://Hooks.Example.COM/x", "https://hooks.example.com/…"),
            ("http://hooks example.com/tok", INVALID_URL),
            ("/relative/tok", INVALID_URL),
            ("", INVALID_URL),
        ];
        for (url, shown) in cases {
            assert_eq!(endpoint_origin(url), shown, "{url}");
        }
    }

    #[test]
    fn urls_inside_text_are_replaced() {
        assert_eq!(
            redact_urls_in(
                "error sending request for url (http://127.0.0.1:9/h/tok?token=tok): connection refused"
            ),
            "error sending request for url (http://127.0.0.1:9/…): connection refused"
        );
        assert_eq!(
            redact_urls_in("https://a.example/x/tok, https://b.example/y?sig=1."),
            "https://a.example/…, https://b.example/…."
        );
        assert_eq!(
            redact_urls_in("cannot connect to postgres://app:s3cr3t@db/x: refused"),
            "cannot connect to postgres://app:***@db/x: refused"
        );
        assert_eq!(
            redact_urls_in("é https://a.example/tok é–redis://:s3cr3t@c"),
            "é https://a.example/… é–redis://:***@c"
        );
        assert_eq!(
            redact_urls_in("no url here :// at all"),
            "no url here :// at all"
        );
        assert_eq!(redact_urls_in("peer answered 410"), "peer answered 410");
    }
}
