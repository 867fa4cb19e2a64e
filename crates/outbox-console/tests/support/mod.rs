//! What the console's HTTP tests share: a console served on 127.0.0.1
//! over a fresh database, with an operator's and a reader's token, and
//! requests as either.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use diesel_async::SimpleAsyncConnection;
use outbox_console::{Console, Tokens};
use outbox_test_support::TestDatabase;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, COOKIE, SET_COOKIE};
use uuid::Uuid;

pub const OPERATOR: &str = "operator-token-0123456789";
pub const READER: &str = "reader-token-0123456789";

pub struct Served {
    pub db: TestDatabase,
    /// The console's own address, with the mount prefix.
    pub url: String,
    pub http: reqwest::Client,
}

pub async fn served_under(prefix: &str) -> Served {
    served_with(prefix, |console| console).await
}

pub async fn served_with(prefix: &str, setup: impl FnOnce(Console) -> Console) -> Served {
    let db = TestDatabase::new().await;
    let tokens = Tokens::parse(&format!("ana=operator:{OPERATOR},reader:{READER}")).unwrap();
    let console = setup(Console::new(db.pool().clone()).with_tokens(tokens)).router();
    let app = if prefix.is_empty() {
        console
    } else {
        axum::Router::new().nest(prefix, console)
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    Served {
        db,
        url: format!("http://{addr}{prefix}"),
        http,
    }
}

pub async fn served() -> Served {
    served_under("").await
}

impl Served {
    /// Inserts an event row in the state `columns` = `values` describe.
    pub async fn event(&self, payload: &str, columns: &str, values: &str) -> Uuid {
        let id = Uuid::now_v7();
        self.db
            .conn()
            .await
            .batch_execute(&format!(
                "INSERT INTO outbox_event (id, tenant_id, event_type, payload{columns})
                 VALUES ('{id}', 'acme', 'audit.user.login', '{payload}'{values})"
            ))
            .await
            .unwrap();
        id
    }

    pub async fn failed_event(&self) -> Uuid {
        self.event(
            r#"{"userId": "u1"}"#,
            ", status, retries, failed_at, last_error",
            ", 'FAILED', 3, now(), 'queue unreachable'",
        )
        .await
    }

    pub async fn status(&self, id: Uuid) -> String {
        let mut conn = self.db.conn().await;
        outbox_store::event(&mut conn, id)
            .await
            .unwrap()
            .unwrap()
            .status
            .to_string()
    }

    pub async fn history(&self, id: Uuid) -> Vec<outbox_store::HistoryEntry> {
        let mut conn = self.db.conn().await;
        outbox_store::history(&mut conn, id).await.unwrap()
    }

    /// A GET without a token or a cookie.
    pub async fn get_anonymous(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
    }

    pub async fn get_as(&self, token: &str, path: &str) -> (StatusCode, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.url))
            .header(AUTHORIZATION, format!("Bearer {token}"))
            .send()
            .await
            .unwrap();
        (response.status(), response.text().await.unwrap())
    }

    pub async fn post(
        &self,
        path: &str,
        headers: &[(&str, String)],
        form: &str,
    ) -> reqwest::Response {
        let mut request = self
            .http
            .post(format!("{}{path}", self.url))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form.to_owned());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        request.send().await.unwrap()
    }

    /// A form POST with `Authorization: Bearer <token>`.
    pub async fn post_as(&self, token: &str, path: &str, form: &str) -> reqwest::Response {
        self.post(path, &[("authorization", format!("Bearer {token}"))], form)
            .await
    }

    /// Signs in with `token` through the login form; returns the cookie.
    pub async fn sign_in(&self, token: &str) -> String {
        let response = self.post("/login", &[], &format!("token={token}")).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let set = response.headers()[SET_COOKIE].to_str().unwrap().to_owned();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict"),
            "{set}"
        );
        set.split(';').next().unwrap().to_owned()
    }

    pub async fn get_with_cookie(&self, cookie: &str, path: &str) -> String {
        let response = self
            .http
            .get(format!("{}{path}", self.url))
            .header(COOKIE, cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.text().await.unwrap()
    }
}

/// A requeue of `id` posted with the session `cookie` and `form`.
pub async fn requeue(console: &Served, cookie: &str, id: Uuid, form: &str) -> reqwest::Response {
    console
        .post(
            &format!("/events/{id}/requeue"),
            &[("cookie", cookie.to_owned())],
            form,
        )
        .await
}

/// The value of the hidden `csrf` field of a page's form.
pub fn csrf_of(page: &str) -> String {
    let start = page.find(r#"name="csrf" value=""#).expect("a csrf field") + 19;
    page[start..start + 64].to_owned()
}
