//! [`SmtpSink`]: a small SMTP server on 127.0.0.1 that records every message
//! it accepts, for tests of code that sends mail.
//!
//! It speaks the part of RFC 5321 that a client without TLS uses (what
//! `lettre`'s `builder_dangerous` transport sends): `EHLO`/`HELO`,
//! `MAIL FROM`, `RCPT TO`, `DATA` with dot-unstuffing, `RSET`, `NOOP` and
//! `QUIT`. It advertises `8BITMIME`, `SMTPUTF8` and `PIPELINING`, never
//! `STARTTLS`; started with [`SmtpSink::start_with_auth`] it also advertises
//! `AUTH PLAIN` (RFC 4954) and accepts mail only after a successful login.
//! It is not a mail server: it never relays, and it checks neither addresses
//! nor sizes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{self, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

const HOST: &str = "127.0.0.1";

/// One message the sink accepted: the envelope and the message text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMail {
    /// The reverse path of `MAIL FROM:<...>` without the angle brackets
    /// (empty for the null sender `<>`); parameters such as `BODY=8BITMIME`
    /// are not included.
    pub from: String,
    /// The forward paths of the accepted `RCPT TO:<...>` commands, in the
    /// order they were sent, without the angle brackets.
    pub to: Vec<String>,
    /// The message as transmitted after `DATA` (headers, blank line, body),
    /// dot-unstuffed, CRLF line endings kept, without the final `.` line.
    pub data: String,
}

impl ReceivedMail {
    /// The value of the first header field called `name` (compared
    /// case-insensitively), unfolded and trimmed; `None` when the message
    /// has no such header. Encoded words (`=?utf-8?b?...?=`) are returned as
    /// sent, not decoded.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<String> {
        let mut current: Option<(&str, String)> = None;
        for line in self.header_section().lines() {
            if line.starts_with([' ', '\t']) {
                // A folded continuation line: unfolding drops only the line break.
                if let Some((_, value)) = current.as_mut() {
                    value.push_str(line);
                }
                continue;
            }
            if let Some((field, value)) = current.take()
                && field.trim().eq_ignore_ascii_case(name)
            {
                return Some(value.trim().to_owned());
            }
            current = line
                .split_once(':')
                .map(|(field, value)| (field, value.to_owned()));
        }
        current
            .filter(|(field, _)| field.trim().eq_ignore_ascii_case(name))
            .map(|(_, value)| value.trim().to_owned())
    }

    /// The message body: everything after the first blank line (empty when
    /// the message has no blank line), still in its transfer encoding (for
    /// example quoted-printable as `lettre` sends non-ASCII text).
    #[must_use]
    pub fn body(&self) -> &str {
        self.split_at_blank_line().1
    }

    fn header_section(&self) -> &str {
        self.split_at_blank_line().0
    }

    fn split_at_blank_line(&self) -> (&str, &str) {
        let mut offset = 0;
        for line in self.data.split_inclusive('\n') {
            if line.trim_end_matches(['\r', '\n']).is_empty() {
                return (&self.data[..offset], &self.data[offset + line.len()..]);
            }
            offset += line.len();
        }
        (&self.data, "")
    }
}

/// A real SMTP server on `127.0.0.1` and a free port that records the
/// messages it accepts. Every connection gets its own task; the server stops
/// when the sink is dropped.
///
/// # Example
///
/// ```no_run
/// # async fn example() {
/// use std::time::Duration;
/// use outbox_test_support::SmtpSink;
///
/// let sink = SmtpSink::start().await;
/// // point the mailer at sink.host() / sink.port(), send one mail, then:
/// let mails = sink.wait_for_messages(1, Duration::from_secs(5)).await;
/// assert_eq!(mails[0].header("Subject").as_deref(), Some("Welcome"));
/// # }
/// ```
#[derive(Debug)]
pub struct SmtpSink {
    addr: SocketAddr,
    messages: Arc<watch::Sender<Vec<ReceivedMail>>>,
    task: JoinHandle<()>,
}

impl SmtpSink {
    /// Starts a sink that accepts every message.
    ///
    /// # Panics
    ///
    /// When no port on 127.0.0.1 can be bound.
    pub async fn start() -> Self {
        Self::spawn(Behaviour::default()).await
    }

    /// Starts a sink that advertises `AUTH PLAIN`, answers `530` to a
    /// `MAIL FROM` before a successful login and `535` to other
    /// credentials than `user` / `password`. A client that has the
    /// credentials (`smtp://user:password@127.0.0.1:<port>`) gets its mail
    /// accepted as with [`SmtpSink::start`].
    ///
    /// # Panics
    ///
    /// When no port on 127.0.0.1 can be bound.
    pub async fn start_with_auth(user: &str, password: &str) -> Self {
        Self::spawn(Behaviour {
            credentials: Some((user.to_owned(), password.to_owned())),
            ..Behaviour::default()
        })
        .await
    }

    /// Starts a sink that answers every `RCPT TO` with `code` (for example
    /// 550 for a permanent or 451 for a transient failure), so no message is
    /// ever accepted; `DATA` is then refused with 554.
    ///
    /// # Panics
    ///
    /// When `code` is not a 4xx or 5xx code, or no port can be bound.
    pub async fn start_failing(code: u16) -> Self {
        assert!(
            (400..=599).contains(&code),
            "SmtpSink::start_failing: {code} is not a 4xx/5xx SMTP failure code"
        );
        Self::spawn(Behaviour {
            rcpt_failure: Some(code),
            ..Behaviour::default()
        })
        .await
    }

    async fn spawn(behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind((HOST, 0))
            .await
            .unwrap_or_else(|e| panic!("SmtpSink: cannot bind {HOST}:0: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("SmtpSink: no local address: {e}"));
        let messages = Arc::new(watch::Sender::new(Vec::new()));
        let task = tokio::spawn(accept_loop(
            listener,
            Arc::clone(&messages),
            Arc::new(behaviour),
        ));
        Self {
            addr,
            messages,
            task,
        }
    }

    /// The host to connect to: always `"127.0.0.1"`.
    #[must_use]
    pub fn host(&self) -> &str {
        HOST
    }

    /// The port the sink listens on.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `smtp://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("smtp://{HOST}:{}", self.port())
    }

    /// A snapshot of the messages accepted so far, oldest first.
    #[must_use]
    pub fn messages(&self) -> Vec<ReceivedMail> {
        self.messages.borrow().clone()
    }

    /// Waits until at least `n` messages have been accepted and returns all
    /// of them, oldest first.
    ///
    /// # Panics
    ///
    /// When fewer than `n` messages arrived within `timeout`; the message
    /// lists what did arrive.
    pub async fn wait_for_messages(&self, n: usize, timeout: Duration) -> Vec<ReceivedMail> {
        let mut rx = self.messages.subscribe();
        let waited = tokio::time::timeout(timeout, async {
            rx.wait_for(|messages| messages.len() >= n)
                .await
                .map(|messages| messages.clone())
        })
        .await;
        match waited {
            Ok(Ok(messages)) => messages,
            Ok(Err(e)) => panic!("SmtpSink on port {}: recorder closed: {e}", self.port()),
            Err(_) => {
                let got = self.messages();
                panic!(
                    "SmtpSink on port {}: expected at least {n} message(s) within {timeout:?}, \
                     got {}: {got:#?}",
                    self.port(),
                    got.len()
                )
            }
        }
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet, which aborts every
        // connection task with it.
        self.task.abort();
    }
}

/// How a sink answers, beyond the plain protocol.
#[derive(Debug, Default)]
struct Behaviour {
    /// Every `RCPT TO` is refused with this code.
    rcpt_failure: Option<u16>,
    /// `AUTH PLAIN` with these credentials is required before `MAIL FROM`.
    credentials: Option<(String, String)>,
}

async fn accept_loop(
    listener: TcpListener,
    messages: Arc<watch::Sender<Vec<ReceivedMail>>>,
    behaviour: Arc<Behaviour>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, Arc::clone(&messages), Arc::clone(&behaviour)));
                }
                // Out of file descriptors and the like: back off, keep serving.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next() => {}
        }
    }
}

/// The envelope of the mail transaction in progress on one connection.
#[derive(Default)]
struct Session {
    greeted: bool,
    authenticated: bool,
    from: Option<String>,
    to: Vec<String>,
}

impl Session {
    fn reset(&mut self) {
        self.from = None;
        self.to.clear();
    }
}

/// What the connection does after a command line.
enum Step {
    Reply(String),
    ReadData,
    /// `AUTH PLAIN` without an initial response: the next line carries it.
    ReadAuth,
    Quit,
}

async fn serve_connection(
    stream: TcpStream,
    messages: Arc<watch::Sender<Vec<ReceivedMail>>>,
    behaviour: Arc<Behaviour>,
) -> io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    write
        .write_all(format!("220 {HOST} ESMTP outbox-test-support SmtpSink\r\n").as_bytes())
        .await?;
    let mut session = Session::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&line);
        match command(
            &mut session,
            text.trim_end_matches(['\r', '\n']),
            &behaviour,
        ) {
            Step::Reply(reply) => write.write_all(reply.as_bytes()).await?,
            Step::ReadAuth => {
                write.write_all(b"334 \r\n").await?;
                line.clear();
                if reader.read_until(b'\n', &mut line).await? == 0 {
                    return Ok(());
                }
                let response = String::from_utf8_lossy(&line);
                let reply = login(&mut session, response.trim(), &behaviour);
                write.write_all(reply.as_bytes()).await?;
            }
            Step::Quit => {
                write.write_all(b"221 2.0.0 Bye\r\n").await?;
                return write.shutdown().await;
            }
            Step::ReadData => {
                write
                    .write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                    .await?;
                let Some(data) = read_data(&mut reader).await? else {
                    return Ok(());
                };
                let mail = ReceivedMail {
                    from: session.from.take().unwrap_or_default(),
                    to: std::mem::take(&mut session.to),
                    data,
                };
                let mut number = 0;
                messages.send_modify(|all| {
                    all.push(mail);
                    number = all.len();
                });
                write
                    .write_all(format!("250 2.0.0 OK: queued as {number}\r\n").as_bytes())
                    .await?;
            }
        }
    }
}

/// Reads the message after `354` up to the `.` line, undoing dot-stuffing.
/// `None` when the client disconnects first.
async fn read_data<R>(reader: &mut R) -> io::Result<Option<String>>
where
    R: AsyncBufReadExt + Unpin,
{
    let mut data = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            return Ok(None);
        }
        if line == b".\r\n" || line == b".\n" {
            return Ok(Some(String::from_utf8_lossy(&data).into_owned()));
        }
        let unstuffed = line.strip_prefix(b".").unwrap_or(&line);
        data.extend_from_slice(unstuffed);
    }
}

/// Checks an `AUTH PLAIN` response (base64 of `authzid NUL user NUL
/// password`) and answers it.
fn login(session: &mut Session, response: &str, behaviour: &Behaviour) -> String {
    let Some((user, password)) = &behaviour.credentials else {
        return "503 5.5.1 AUTH not advertised\r\n".to_owned();
    };
    if response == "*" {
        return "501 5.0.0 Authentication cancelled\r\n".to_owned();
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(response)
        .unwrap_or_default();
    let mut parts = decoded.split(|b| *b == 0);
    let (_authzid, given_user, given_password) = (parts.next(), parts.next(), parts.next());
    if given_user == Some(user.as_bytes()) && given_password == Some(password.as_bytes()) {
        session.authenticated = true;
        "235 2.7.0 Authentication successful\r\n".to_owned()
    } else {
        "535 5.7.8 Authentication credentials invalid\r\n".to_owned()
    }
}

/// Answers one command line (without its line ending).
fn command(session: &mut Session, line: &str, behaviour: &Behaviour) -> Step {
    let needs_auth = behaviour.credentials.is_some() && !session.authenticated;
    let (verb, argument) = line.split_once(' ').unwrap_or((line, ""));
    let argument = argument.trim();
    let reply = |text: &str| Step::Reply(format!("{text}\r\n"));
    match verb.to_ascii_uppercase().as_str() {
        "EHLO" | "HELO" if argument.is_empty() => reply("501 5.5.4 Domain name required"),
        "EHLO" => {
            session.greeted = true;
            session.reset();
            let auth = if behaviour.credentials.is_some() {
                "250-AUTH PLAIN\r\n"
            } else {
                ""
            };
            Step::Reply(format!(
                "250-{HOST} greets {argument}\r\n{auth}250-8BITMIME\r\n250-SMTPUTF8\r\n250 PIPELINING\r\n"
            ))
        }
        "AUTH" if behaviour.credentials.is_none() => reply("502 5.5.1 AUTH not advertised"),
        "AUTH" if !session.greeted => reply("503 5.5.1 Send EHLO first"),
        "AUTH" if session.authenticated => reply("503 5.5.1 Already authenticated"),
        "AUTH" => {
            let (mechanism, initial) = argument.split_once(' ').unwrap_or((argument, ""));
            if !mechanism.eq_ignore_ascii_case("PLAIN") {
                reply("504 5.5.4 Only PLAIN is supported")
            } else if initial.trim().is_empty() {
                Step::ReadAuth
            } else {
                Step::Reply(login(session, initial.trim(), behaviour))
            }
        }
        "HELO" => {
            session.greeted = true;
            session.reset();
            Step::Reply(format!("250 {HOST} greets {argument}\r\n"))
        }
        "MAIL" if !session.greeted => reply("503 5.5.1 Send EHLO or HELO first"),
        "MAIL" if needs_auth => reply("530 5.7.0 Authentication required"),
        "MAIL" if session.from.is_some() => reply("503 5.5.1 Sender already given"),
        "MAIL" => match path_after(argument, "FROM:") {
            Some(from) => {
                session.from = Some(from);
                reply("250 2.1.0 OK")
            }
            None => reply("501 5.5.4 Syntax: MAIL FROM:<address>"),
        },
        "RCPT" if session.from.is_none() => reply("503 5.5.1 Send MAIL first"),
        "RCPT" => match (path_after(argument, "TO:"), behaviour.rcpt_failure) {
            (None, _) => reply("501 5.5.4 Syntax: RCPT TO:<address>"),
            (Some(_), Some(code)) => Step::Reply(format!(
                "{code} {}.0.0 Recipient refused (SmtpSink::start_failing)\r\n",
                code / 100
            )),
            (Some(to), None) => {
                session.to.push(to);
                reply("250 2.1.5 OK")
            }
        },
        "DATA" if session.from.is_none() => reply("503 5.5.1 Send MAIL first"),
        "DATA" if session.to.is_empty() => reply("554 5.5.1 No valid recipients"),
        "DATA" => Step::ReadData,
        "RSET" => {
            session.reset();
            reply("250 2.0.0 OK")
        }
        "NOOP" => reply("250 2.0.0 OK"),
        "QUIT" => Step::Quit,
        "" => reply("500 5.5.2 Syntax error"),
        _ => reply("502 5.5.1 Command not implemented"),
    }
}

/// The address in `FROM:<address> PARAMS` / `TO:<address> PARAMS` (keyword
/// compared case-insensitively), without the angle brackets.
fn path_after(argument: &str, keyword: &str) -> Option<String> {
    let head = argument.get(..keyword.len())?;
    if !head.eq_ignore_ascii_case(keyword) {
        return None;
    }
    let rest = argument[keyword.len()..].trim_start();
    if let Some(bracketed) = rest.strip_prefix('<') {
        let (path, _parameters) = bracketed.split_once('>')?;
        return Some(path.to_owned());
    }
    // Lenient: a bare address up to the first parameter.
    rest.split_whitespace()
        .next()
        .filter(|path| !path.is_empty())
        .map(str::to_owned)
}
