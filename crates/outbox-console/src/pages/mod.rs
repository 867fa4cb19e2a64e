//! The routes, who is asking ([`Viewer`]), where the console is mounted
//! ([`Base`]) and the layout every page shares.

mod actions;
mod bulk;
mod bulk_cancel;
mod dead;
mod event;
mod events;
mod execution;
mod login;
pub(crate) mod overview;
mod workflows;

use axum::Router;
use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, html};

use crate::session::{self, COOKIE};
use crate::{Console, Identity, Role};

pub(crate) fn routes(console: Console) -> Router {
    Router::new()
        .route("/", get(overview::page))
        .route("/live", get(overview::live))
        .route("/events", get(events::page))
        .route("/events/requeue", get(bulk::dry_run).post(bulk::confirm))
        .route(
            "/events/cancel",
            get(bulk_cancel::dry_run).post(bulk_cancel::confirm),
        )
        .route("/events/{id}", get(event::page))
        .route(
            "/events/{id}/requeue",
            get(actions::requeue_dry_run).post(actions::requeue_confirm),
        )
        .route(
            "/events/{id}/cancel",
            get(actions::cancel_dry_run).post(actions::cancel_confirm),
        )
        .route("/queues/{queue}/dead", get(dead::page).post(dead::retry))
        .route("/workflows", get(workflows::list))
        .route("/workflows/{id}", get(workflows::one))
        .route("/executions", get(workflows::executions))
        .route("/executions/{id}", get(execution::page))
        .route("/executions/{id}/live", get(execution::live))
        .route("/executions/{id}/answer", post(execution::answer))
        .route("/executions/{id}/cancel", post(execution::cancel))
        .route("/login", get(login::form).post(login::submit))
        .route("/logout", post(login::logout))
        .route("/assets/console.js", get(crate::assets::script))
        .route("/assets/console.css", get(crate::assets::style))
        .layer(axum::middleware::map_response(protect))
        .with_state(console)
}

/// Headers on every answer of the console: no page is kept by a browser or
/// a proxy (event pages hold payloads), none is shown inside another
/// site's frame (an embedding application's own sessions have no
/// `SameSite` cookie to stop a click through a frame), and no answer is
/// read as another type than it says.
async fn protect(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// Where the console is mounted: `""` at the root, `/ops/outbox` when an
/// application nests it there. Every link starts with it.
#[derive(Debug, Clone)]
pub(crate) struct Base(pub String);

impl Base {
    fn of(parts: &Parts) -> Self {
        let inner = parts.uri.path();
        let full = parts
            .extensions
            .get::<OriginalUri>()
            .map_or(inner, |original| original.path());
        let base = full
            .strip_suffix(inner)
            .or_else(|| (inner == "/").then(|| full.trim_end_matches('/')))
            .unwrap_or("");
        Self(base.trim_end_matches('/').to_owned())
    }

    /// The link to `path` (which starts with `/`) of the console.
    pub(crate) fn to(&self, path: &str) -> String {
        format!("{}{path}", self.0)
    }

    /// The overview's link.
    pub(crate) fn home(&self) -> String {
        if self.0.is_empty() {
            "/".to_owned()
        } else {
            self.0.clone()
        }
    }

    /// The path of the session cookie: the whole console.
    pub(crate) fn cookie_path(&self) -> String {
        self.home()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Base {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self::of(parts))
    }
}

/// Who asks, and the CSRF token their forms carry (`None` for a bearer
/// token, which a browser never sends on its own).
pub(crate) struct Viewer {
    pub identity: Identity,
    pub csrf: Option<String>,
    pub base: Base,
    /// The console session the request came with (signed in through the
    /// form); `None` for a bearer token or the application's hook.
    pub session: Option<String>,
}

impl Viewer {
    /// The value of the hidden `csrf` field of this viewer's forms.
    pub(crate) fn csrf_field(&self) -> &str {
        self.csrf.as_deref().unwrap_or("")
    }

    /// Why an action of this viewer, whose form carried `csrf`, is
    /// refused (a reader's, or one without this session's CSRF token), or
    /// `None` when it may go ahead. The refusal page says it with 403.
    pub(crate) fn refusal_of_action(&self, csrf: &str) -> Option<Response> {
        let why = if self.identity.role != Role::Operator {
            "Readers may look but not act: this needs an operator's token."
        } else if self
            .csrf
            .as_ref()
            .is_some_and(|expected| !session::same_token(expected, csrf))
        {
            "The form's CSRF token is missing or not this session's: reload the page and try again."
        } else {
            return None;
        };
        Some(refusal(&self.base, StatusCode::FORBIDDEN, why))
    }
}

impl FromRequestParts<Console> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, console: &Console) -> Result<Self, Response> {
        let base = Base::of(parts);
        let sessions = &console.inner.sessions;
        if let Some(hook) = &console.inner.authorize
            && let Some(identity) = hook.authorize(parts)
        {
            let csrf = sessions.csrf(&format!("hook:{}:{}", identity.name, identity.role));
            return Ok(Self {
                identity,
                csrf: Some(csrf),
                base,
                session: None,
            });
        }
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if let Some(token) = bearer {
            return match console.inner.tokens.identify(token.trim()) {
                Some(identity) => Ok(Self {
                    identity,
                    csrf: None,
                    base,
                    session: None,
                }),
                None => Err(login::needed(&base, Some("That token is not valid."))),
            };
        }
        let session_id = parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|v| session::cookie(v, COOKIE));
        if let Some(id) = session_id
            && let Some(identity) = sessions.identity(id)
        {
            let csrf = sessions.csrf(&format!("session:{id}"));
            return Ok(Self {
                identity,
                csrf: Some(csrf),
                base,
                session: Some(id.to_owned()),
            });
        }
        Err(login::needed(&base, None))
    }
}

/// A page that says why a request was refused.
pub(crate) fn refusal(base: &Base, status: StatusCode, why: &str) -> Response {
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "Outbox console: refused" } (head_links(base)) }
            body {
                main {
                    h1 { "Refused" }
                    p.refused #refusal { (why) }
                    p { a href=(base.home()) { "Back to the overview" } }
                }
            }
        }
    };
    (status, page).into_response()
}

/// The 404 page of an event that does not exist.
pub(crate) fn not_found(base: &Base, id: uuid::Uuid) -> Response {
    refusal(
        base,
        StatusCode::NOT_FOUND,
        &format!("There is no outbox event {id}."),
    )
}

/// `value` as indented JSON with its secrets masked and the URLs inside its
/// strings reduced (`outbox_queue::redact_json`): how every page shows a
/// payload, an input or an output.
pub(crate) fn shown_json(value: &serde_json::Value) -> String {
    let shown = outbox_queue::redact_json(value);
    serde_json::to_string_pretty(&shown).unwrap_or_else(|_| shown.to_string())
}

/// A time as the pages show it (UTC, to the second), or `-`.
pub(crate) fn when(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map_or_else(
        || "-".to_owned(),
        |at| at.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

fn head_links(base: &Base) -> Markup {
    html! {
        meta name="viewport" content="width=device-width, initial-scale=1";
        link rel="stylesheet" href=(base.to("/assets/console.css"));
        script src=(base.to("/assets/console.js")) defer {}
    }
}

/// A page of the console: the navigation, who is signed in, and `body`.
pub(crate) fn layout(viewer: &Viewer, title: &str, body: Markup) -> Markup {
    let base = &viewer.base;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · Outbox console" }
                (head_links(base))
            }
            body {
                header {
                    nav {
                        a.brand href=(base.home()) { "Outbox" }
                        a href=(base.home()) { "Overview" }
                        a href=(base.to("/events")) { "Events" }
                        a href=(base.to("/workflows")) { "Workflows" }
                        a href=(base.to("/executions")) { "Executions" }
                    }
                    div.who {
                        span #who { (viewer.identity.name) " (" (viewer.identity.role.as_str()) ")" }
                        // Only a console session signs out here; the
                        // application's hook signs its users out itself.
                        @if viewer.session.is_some() {
                            form method="post" action=(base.to("/logout")) {
                                input type="hidden" name="csrf" value=(viewer.csrf_field());
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}
