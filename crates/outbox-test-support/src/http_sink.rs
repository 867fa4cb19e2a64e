//! [`HttpSink`]: a real HTTP/1.1 server on 127.0.0.1 that records every
//! request and answers with scripted status codes, for tests of code that
//! calls webhooks.
//!
//! It accepts any method on any path, records the request before answering,
//! and answers `200` with an empty body unless told otherwise per path
//! ([`HttpSink::respond`], [`HttpSink::set_default`],
//! [`HttpSink::respond_after`]). It is not a mock of any particular API:
//! tests assert on what arrived.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

const HOST: &str = "127.0.0.1";

/// One request the sink received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedRequest {
    /// The method, e.g. `"POST"`.
    pub method: String,
    /// The path without the query string, e.g. `"/hooks/orders"`.
    pub path: String,
    /// The query string without the `?`, if the request had one.
    pub query: Option<String>,
    /// The headers in the order received, names in lower case; values that
    /// are not UTF-8 are decoded lossily.
    pub headers: Vec<(String, String)>,
    /// The body bytes.
    pub body: Vec<u8>,
}

impl ReceivedRequest {
    /// The value of the first header called `name` (compared
    /// case-insensitively).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The body as text (invalid UTF-8 replaced by U+FFFD).
    #[must_use]
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    ///
    /// # Panics
    ///
    /// When the body is not valid JSON; the message shows the body.
    #[must_use]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} {}: body is not JSON ({e}): {:?}",
                self.method,
                self.path,
                self.body_text()
            )
        })
    }
}

/// How one path is answered.
#[derive(Debug)]
struct Route {
    script: VecDeque<StatusCode>,
    default: StatusCode,
    delay: Duration,
}

impl Default for Route {
    fn default() -> Self {
        Self {
            script: VecDeque::new(),
            default: StatusCode::OK,
            delay: Duration::ZERO,
        }
    }
}

#[derive(Debug)]
struct Shared {
    requests: watch::Sender<Vec<ReceivedRequest>>,
    routes: Mutex<HashMap<String, Route>>,
}

impl Shared {
    fn with_route<T>(&self, path: &str, f: impl FnOnce(&mut Route) -> T) -> T {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        f(routes.entry(route_key(path)).or_default())
    }
}

/// A real HTTP server on `127.0.0.1` and a free port that records every
/// request and answers with scripted status codes. It stops accepting when
/// dropped (requests in flight are finished, idle connections closed).
///
/// # Example
///
/// ```no_run
/// # async fn example() {
/// use std::time::Duration;
/// use outbox_test_support::HttpSink;
///
/// let sink = HttpSink::start().await;
/// sink.respond("/hook", vec![503]); // first call fails, then 200
/// // configure the webhook subscriber with sink.url_for("/hook"), run it, then:
/// let calls = sink.wait_for_requests("/hook", 2, Duration::from_secs(5)).await;
/// assert_eq!(calls[1].json()["type"], "billing.subscription.updated");
/// # }
/// ```
#[derive(Debug)]
pub struct HttpSink {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl HttpSink {
    /// Starts the sink on a free port.
    ///
    /// # Panics
    ///
    /// When no port on 127.0.0.1 can be bound.
    pub async fn start() -> Self {
        let listener = TcpListener::bind((HOST, 0))
            .await
            .unwrap_or_else(|e| panic!("HttpSink: cannot bind {HOST}:0: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("HttpSink: no local address: {e}"));
        let shared = Arc::new(Shared {
            requests: watch::Sender::new(Vec::new()),
            routes: Mutex::new(HashMap::new()),
        });
        let app = Router::new()
            .fallback(record_and_answer)
            .layer(DefaultBodyLimit::disable())
            .with_state(Arc::clone(&shared));
        let (shutdown, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            // Ends when the sink is dropped; errors are per connection only.
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            addr,
            shared,
            shutdown: Some(shutdown),
        }
    }

    /// `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{HOST}:{}", self.addr.port())
    }

    /// The URL of `path` on the sink (a missing leading `/` is added).
    #[must_use]
    pub fn url_for(&self, path: &str) -> String {
        if path.starts_with('/') {
            format!("{}{path}", self.url())
        } else {
            format!("{}/{path}", self.url())
        }
    }

    /// The port the sink listens on.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Answers the next requests on `path` with `statuses`, one each, in
    /// order (appended to any statuses still scripted); after that `path` gets
    /// its default again.
    ///
    /// # Panics
    ///
    /// When a status is not in 200..=599.
    pub fn respond(&self, path: &str, statuses: Vec<u16>) {
        let statuses: Vec<StatusCode> = statuses.into_iter().map(status).collect();
        self.shared
            .with_route(path, |route| route.script.extend(statuses));
    }

    /// Answers requests on `path` with `code` once its script (if any) is
    /// used up. Without this the default is 200.
    ///
    /// # Panics
    ///
    /// When `code` is not in 200..=599.
    pub fn set_default(&self, path: &str, code: u16) {
        let code = status(code);
        self.shared.with_route(path, |route| route.default = code);
    }

    /// Delays every following answer on `path` by `delay` (the request is
    /// still recorded at once), to exercise client timeouts.
    /// `Duration::ZERO` answers promptly again.
    pub fn respond_after(&self, path: &str, delay: Duration) {
        self.shared.with_route(path, |route| route.delay = delay);
    }

    /// A snapshot of every request received so far, oldest first.
    #[must_use]
    pub fn requests(&self) -> Vec<ReceivedRequest> {
        self.shared.requests.borrow().clone()
    }

    /// A snapshot of the requests received on `path` (without query string),
    /// oldest first.
    #[must_use]
    pub fn requests_to(&self, path: &str) -> Vec<ReceivedRequest> {
        let key = route_key(path);
        self.shared
            .requests
            .borrow()
            .iter()
            .filter(|request| request.path == key)
            .cloned()
            .collect()
    }

    /// Waits until at least `n` requests arrived on `path` and returns all
    /// requests on `path`, oldest first.
    ///
    /// # Panics
    ///
    /// When fewer than `n` arrived within `timeout`; the message lists every
    /// request the sink did receive.
    pub async fn wait_for_requests(
        &self,
        path: &str,
        n: usize,
        timeout: Duration,
    ) -> Vec<ReceivedRequest> {
        let key = route_key(path);
        let mut rx = self.shared.requests.subscribe();
        let arrived = tokio::time::timeout(
            timeout,
            rx.wait_for(|all| all.iter().filter(|r| r.path == key).count() >= n),
        )
        .await
        .is_ok();
        if !arrived {
            let seen: Vec<String> = self
                .requests()
                .iter()
                .map(|r| format!("{} {}", r.method, r.path))
                .collect();
            panic!(
                "HttpSink on port {}: expected at least {n} request(s) to {key} within \
                 {timeout:?}, got {}; all requests received: {seen:?}",
                self.port(),
                self.requests_to(&key).len()
            );
        }
        self.requests_to(&key)
    }
}

impl Drop for HttpSink {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// The one handler: records the request, then answers as scripted.
async fn record_and_answer(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let request = ReceivedRequest {
        method: method.as_str().to_owned(),
        path: uri.path().to_owned(),
        query: uri.query().map(str::to_owned),
        headers: headers
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: body.to_vec(),
    };
    let path = request.path.clone();
    shared.requests.send_modify(|all| all.push(request));
    let (code, delay) = shared.with_route(&path, |route| {
        (
            route.script.pop_front().unwrap_or(route.default),
            route.delay,
        )
    });
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    code
}

/// The key a path is scripted and looked up under: leading `/`, no query.
fn route_key(path: &str) -> String {
    let path = path.split_once('?').map_or(path, |(path, _query)| path);
    if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    }
}

fn status(code: u16) -> StatusCode {
    if !(200..=599).contains(&code) {
        panic!("HttpSink: {code} is not a final HTTP status (200..=599)");
    }
    StatusCode::from_u16(code).unwrap_or_else(|e| panic!("HttpSink: status {code}: {e}"))
}
