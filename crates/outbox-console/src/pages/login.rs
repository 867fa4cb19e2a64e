//! The login form (a token for a session cookie) and the sign-out.

use axum::Form;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{DOCTYPE, html};
use serde::Deserialize;

use super::{Base, Viewer, head_links};
use crate::Console;
use crate::session::{self, COOKIE};

/// The 401 answer to a request without a valid identity: the login form.
pub(crate) fn needed(base: &Base, problem: Option<&str>) -> Response {
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "Sign in · Outbox console" } (head_links(base)) }
            body {
                main.login {
                    h1 { "Outbox console" }
                    @if let Some(problem) = problem { p.refused #login-problem { (problem) } }
                    form method="post" action=(base.to("/login")) {
                        label for="token" { "Token" }
                        input #token type="password" name="token" autocomplete="current-password" required;
                        button #sign-in type="submit" { "Sign in" }
                    }
                }
            }
        }
    };
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer realm=\"outbox console\"")],
        page,
    )
        .into_response()
}

pub(crate) async fn form(base: Base) -> Response {
    needed(&base, None)
}

#[derive(Deserialize)]
pub(crate) struct Login {
    token: String,
}

/// A valid token opens a session (cookie) and goes to the overview.
pub(crate) async fn submit(
    State(console): State<Console>,
    base: Base,
    headers: axum::http::HeaderMap,
    Form(login): Form<Login>,
) -> Response {
    let Some(identity) = console.inner.tokens.identify(login.token.trim()) else {
        tracing::warn!("console sign-in refused: the token is not one of the console's");
        return needed(&base, Some("That token is not valid."));
    };
    tracing::info!(name = %identity.name, role = %identity.role, "console sign-in");
    let id = console.inner.sessions.open(identity);
    (
        [(
            header::SET_COOKIE,
            session::set_cookie(&id, &base.cookie_path(), session::over_https(&headers)),
        )],
        Redirect::to(&base.home()),
    )
        .into_response()
}

#[derive(Deserialize)]
pub(crate) struct Logout {
    #[serde(default)]
    csrf: String,
}

/// Ends the session (with its CSRF token, so that no other site can).
pub(crate) async fn logout(
    State(console): State<Console>,
    viewer: Viewer,
    headers: axum::http::HeaderMap,
    Form(form): Form<Logout>,
) -> Response {
    if let Some(expected) = &viewer.csrf
        && !session::same_token(expected, &form.csrf)
    {
        return super::refusal(
            &viewer.base,
            StatusCode::FORBIDDEN,
            "The form's CSRF token is missing or not this session's.",
        );
    }
    if let Some(id) = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| session::cookie(v, COOKIE))
    {
        console.inner.sessions.close(id);
    }
    (
        [(
            header::SET_COOKIE,
            session::clear_cookie(&viewer.base.cookie_path()),
        )],
        Redirect::to(&viewer.base.to("/login")),
    )
        .into_response()
}
