//! The SMTP and HTTP sinks against real clients: a hand-written SMTP client
//! on a `TcpStream`, and `reqwest`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use outbox_test_support::{HttpSink, ReceivedMail, SmtpSink};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

const WAIT: Duration = Duration::from_secs(5);

/// A minimal SMTP client: one command, one (possibly multi-line) reply.
struct SmtpClient {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl SmtpClient {
    async fn connect(sink: &SmtpSink) -> Self {
        let stream = TcpStream::connect((sink.host(), sink.port()))
            .await
            .unwrap();
        let (read, writer) = stream.into_split();
        let mut client = Self {
            reader: BufReader::new(read),
            writer,
        };
        let (code, _) = client.reply().await;
        assert_eq!(code, 220, "greeting");
        client
    }

    /// Reads one reply; returns its code and the text of every line.
    async fn reply(&mut self) -> (u16, Vec<String>) {
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            let read = self.reader.read_line(&mut line).await.unwrap();
            assert!(read > 0, "server closed the connection mid-reply");
            assert!(line.ends_with("\r\n"), "reply line without CRLF: {line:?}");
            let code = line[..3].parse().unwrap();
            let last = line.as_bytes()[3] == b' ';
            lines.push(line[4..].trim_end().to_owned());
            if last {
                return (code, lines);
            }
            assert_eq!(line.as_bytes()[3], b'-', "bad reply line: {line:?}");
        }
    }

    async fn send(&mut self, raw: &str) {
        self.writer.write_all(raw.as_bytes()).await.unwrap();
    }

    async fn command(&mut self, line: &str) -> (u16, Vec<String>) {
        self.send(&format!("{line}\r\n")).await;
        self.reply().await
    }

    async fn code(&mut self, line: &str) -> u16 {
        self.command(line).await.0
    }
}

#[tokio::test]
async fn smtp_records_envelope_and_dot_unstuffed_message() {
    let sink = SmtpSink::start().await;
    assert_eq!(sink.url(), format!("smtp://127.0.0.1:{}", sink.port()));
    let mut client = SmtpClient::connect(&sink).await;

    let (code, ehlo) = client.command("EHLO client.test").await;
    assert_eq!(code, 250);
    assert!(ehlo.iter().any(|l| l == "8BITMIME"), "{ehlo:?}");
    assert!(
        !ehlo
            .iter()
            .any(|l| l.starts_with("STARTTLS") || l.starts_with("AUTH")),
        "must not advertise STARTTLS or AUTH: {ehlo:?}"
    );
    assert_eq!(
        client
            .code("MAIL FROM:<noreply@shop.test> BODY=8BITMIME")
            .await,
        250
    );
    assert_eq!(client.code("RCPT TO:<ada@example.test>").await, 250);
    assert_eq!(client.code("rcpt to:<bob@example.test>").await, 250);
    assert_eq!(client.code("DATA").await, 354);
    client
        .send(concat!(
            "From: noreply@shop.test\r\n",
            "Subject: Your order\r\n",
            " has shipped\r\n",
            "\r\n",
            "Hello Ada,\r\n",
            "..leading dot\r\n",
            "...\r\n",
            ".\r\n",
        ))
        .await;
    assert_eq!(client.reply().await.0, 250);
    assert_eq!(client.code("QUIT").await, 221);

    let mails = sink.wait_for_messages(1, WAIT).await;
    assert_eq!(mails.len(), 1);
    let mail = &mails[0];
    assert_eq!(mail.from, "noreply@shop.test");
    assert_eq!(mail.to, ["ada@example.test", "bob@example.test"]);
    assert_eq!(mail.body(), "Hello Ada,\r\n.leading dot\r\n..\r\n");
    assert_eq!(
        mail.header("subject").as_deref(),
        Some("Your order has shipped")
    );
    assert_eq!(
        mail.data,
        "From: noreply@shop.test\r\nSubject: Your order\r\n has shipped\r\n\r\n\
         Hello Ada,\r\n.leading dot\r\n..\r\n"
    );
    assert_eq!(sink.messages(), mails);
}

#[tokio::test]
async fn smtp_keeps_several_messages_per_connection_and_rset_discards() {
    let sink = SmtpSink::start().await;
    let mut client = SmtpClient::connect(&sink).await;
    assert_eq!(client.code("HELO client.test").await, 250);
    assert_eq!(client.code("NOOP").await, 250);
    assert_eq!(client.code("MAIL FROM:<dropped@shop.test>").await, 250);
    assert_eq!(client.code("RSET").await, 250);
    for n in 1..=2 {
        assert_eq!(client.code("MAIL FROM:<>").await, 250);
        assert_eq!(client.code("RCPT TO:<ops@example.test>").await, 250);
        assert_eq!(client.code("DATA").await, 354);
        client
            .send(&format!("Subject: {n}\r\n\r\nbody\r\n.\r\n"))
            .await;
        assert_eq!(client.reply().await.0, 250);
    }
    assert_eq!(client.code("QUIT").await, 221);

    let mails = sink.wait_for_messages(2, WAIT).await;
    assert_eq!(mails.len(), 2);
    assert!(mails.iter().all(|m| m.from.is_empty()));
    assert_eq!(mails[1].header("Subject").as_deref(), Some("2"));
}

#[tokio::test]
async fn smtp_refuses_out_of_order_and_unknown_commands() {
    let sink = SmtpSink::start().await;
    let mut client = SmtpClient::connect(&sink).await;
    assert_eq!(client.code("MAIL FROM:<a@shop.test>").await, 503);
    assert_eq!(client.code("EHLO client.test").await, 250);
    assert_eq!(client.code("RCPT TO:<b@example.test>").await, 503);
    assert_eq!(client.code("DATA").await, 503);
    assert_eq!(client.code("MAIL FROM:a@shop.test").await, 250);
    assert_eq!(client.code("DATA").await, 554);
    assert_eq!(client.code("MAIL TO:<x@shop.test>").await, 503);
    assert_eq!(client.code("STARTTLS").await, 502);
    assert_eq!(client.code("AUTH PLAIN AGFAYg==").await, 502);
    assert_eq!(client.code("VRFY a").await, 502);
    assert_eq!(client.code("QUIT").await, 221);
    assert!(sink.messages().is_empty());
}

#[tokio::test]
async fn smtp_with_auth_accepts_mail_only_after_a_plain_login_with_its_credentials() {
    use base64::Engine as _;
    let plain = |user: &str, password: &str| {
        base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0{password}"))
    };
    let sink = SmtpSink::start_with_auth("mailer", "pw").await;
    let mut client = SmtpClient::connect(&sink).await;
    let (code, lines) = client.command("EHLO client.test").await;
    assert_eq!(code, 250);
    assert!(lines.iter().any(|l| l == "AUTH PLAIN"), "{lines:?}");
    assert_eq!(client.code("MAIL FROM:<a@shop.test>").await, 530);
    assert_eq!(client.code("AUTH LOGIN").await, 504);
    assert_eq!(
        client
            .code(&format!("AUTH PLAIN {}", plain("mailer", "wrong")))
            .await,
        535
    );
    // Without an initial response: the server asks for it with 334.
    assert_eq!(client.code("AUTH PLAIN").await, 334);
    assert_eq!(client.code(&plain("mailer", "pw")).await, 235);
    assert_eq!(client.code("MAIL FROM:<a@shop.test>").await, 250);
    assert_eq!(client.code("RCPT TO:<b@example.test>").await, 250);
    assert_eq!(client.code("DATA").await, 354);
    client.send("Subject: hi\r\n\r\nx\r\n.\r\n").await;
    assert_eq!(client.reply().await.0, 250);
    assert_eq!(client.code("QUIT").await, 221);
    assert_eq!(
        sink.wait_for_messages(1, WAIT).await[0].to,
        ["b@example.test"]
    );

    let mut other = SmtpClient::connect(&sink).await;
    assert_eq!(other.code("EHLO client.test").await, 250);
    assert_eq!(
        other
            .code(&format!("AUTH PLAIN {}", plain("mailer", "pw")))
            .await,
        235
    );
    assert_eq!(other.code("MAIL FROM:<a@shop.test>").await, 250);
}

#[tokio::test]
async fn smtp_failing_sink_answers_rcpt_with_the_given_code() {
    for code in [550, 451] {
        let sink = SmtpSink::start_failing(code).await;
        let mut client = SmtpClient::connect(&sink).await;
        assert_eq!(client.code("EHLO client.test").await, 250);
        assert_eq!(client.code("MAIL FROM:<a@shop.test>").await, 250);
        assert_eq!(client.code("RCPT TO:<b@example.test>").await, code);
        assert_eq!(client.code("DATA").await, 554);
        assert_eq!(client.code("QUIT").await, 221);
        assert!(sink.messages().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn smtp_serves_many_concurrent_connections() {
    let sink = SmtpSink::start().await;
    let mut clients = Vec::new();
    for n in 0..20 {
        clients.push(SmtpClient::connect(&sink).await);
        assert_eq!(clients[n].code("EHLO client.test").await, 250);
    }
    let sends = clients.into_iter().enumerate().map(|(n, mut client)| {
        tokio::spawn(async move {
            assert_eq!(client.code("MAIL FROM:<a@shop.test>").await, 250);
            assert_eq!(client.code(&format!("RCPT TO:<u{n}@x.test>")).await, 250);
            assert_eq!(client.code("DATA").await, 354);
            client.send("Subject: hi\r\n\r\nx\r\n.\r\n").await;
            assert_eq!(client.reply().await.0, 250);
        })
    });
    for send in sends.collect::<Vec<_>>() {
        send.await.unwrap();
    }
    let mails = sink.wait_for_messages(20, WAIT).await;
    let mut to: Vec<String> = mails.into_iter().flat_map(|m| m.to).collect();
    to.sort();
    to.dedup();
    assert_eq!(to.len(), 20);
}

#[tokio::test]
#[should_panic(expected = "expected at least 1 message(s)")]
async fn smtp_wait_for_messages_panics_on_timeout() {
    let sink = SmtpSink::start().await;
    sink.wait_for_messages(1, Duration::from_millis(50)).await;
}

#[test]
fn received_mail_header_lookup_is_case_insensitive_and_unfolds() {
    let mail = ReceivedMail {
        from: String::new(),
        to: Vec::new(),
        data: "X-Id: 1\r\nSubject:  a\r\n\tb\r\nX-Last: z\r\n\r\nX-Id: body\r\n".to_owned(),
    };
    assert_eq!(mail.header("x-id").as_deref(), Some("1"));
    assert_eq!(mail.header("SUBJECT").as_deref(), Some("a\tb"));
    assert_eq!(mail.header("x-last").as_deref(), Some("z"));
    assert_eq!(mail.header("missing"), None);
    assert_eq!(mail.body(), "X-Id: body\r\n");
}

#[tokio::test]
async fn smtp_sink_stops_listening_when_dropped() {
    let sink = SmtpSink::start().await;
    let port = sink.port();
    drop(sink);
    assert_refused(port).await;
}

#[tokio::test]
async fn http_records_a_json_post_before_answering() {
    let sink = HttpSink::start().await;
    let url = sink.url_for("hooks/orders");
    assert_eq!(url, format!("{}/hooks/orders", sink.url()));
    let response = reqwest::Client::new()
        .post(format!("{url}?attempt=1"))
        .header("X-Outbox-Signature", "sha256=abc")
        .json(&json!({ "type": "shop.order.paid", "id": 7 }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);

    let requests = sink.requests_to("/hooks/orders");
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/hooks/orders");
    assert_eq!(request.query.as_deref(), Some("attempt=1"));
    assert_eq!(request.header("x-outbox-signature"), Some("sha256=abc"));
    assert_eq!(request.header("Content-Type"), Some("application/json"));
    assert!(request.headers.iter().all(|(n, _)| *n == n.to_lowercase()));
    assert_eq!(
        request.json(),
        json!({ "type": "shop.order.paid", "id": 7 })
    );
    assert!(request.body_text().contains(r#""type":"shop.order.paid""#));
    assert_eq!(request.body, request.body_text().into_bytes());
}

#[tokio::test]
async fn http_answers_scripted_statuses_in_order_then_the_default() {
    let sink = HttpSink::start().await;
    sink.respond("/hook", vec![500, 503]);
    let client = reqwest::Client::new();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let response = client.post(sink.url_for("/hook")).body("x").send().await;
        seen.push(response.unwrap().status().as_u16());
    }
    assert_eq!(seen, [500, 503, 200, 200]);

    sink.set_default("/hook", 410);
    sink.respond("/hook", vec![502]);
    let statuses = [
        client
            .get(sink.url_for("/hook"))
            .send()
            .await
            .unwrap()
            .status(),
        client
            .get(sink.url_for("/hook"))
            .send()
            .await
            .unwrap()
            .status(),
        client
            .get(sink.url_for("/other"))
            .send()
            .await
            .unwrap()
            .status(),
    ];
    assert_eq!(statuses.map(|s| s.as_u16()), [502, 410, 200]);
    assert_eq!(sink.requests().len(), 7);
    assert_eq!(sink.wait_for_requests("/hook", 6, WAIT).await.len(), 6);
}

#[tokio::test]
async fn http_accepts_any_method_on_any_path() {
    let sink = HttpSink::start().await;
    let client = reqwest::Client::new();
    for method in ["PUT", "DELETE", "PATCH", "GET"] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = client
            .request(method, sink.url_for("/a/b/c"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
    }
    let methods: Vec<String> = sink
        .wait_for_requests("a/b/c", 4, WAIT)
        .await
        .into_iter()
        .map(|r| r.method)
        .collect();
    assert_eq!(methods, ["PUT", "DELETE", "PATCH", "GET"]);
}

#[tokio::test]
async fn http_respond_after_records_at_once_and_answers_late() {
    let sink = HttpSink::start().await;
    sink.respond_after("/slow", Duration::from_secs(2));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let error = client.post(sink.url_for("/slow")).send().await.unwrap_err();
    assert!(error.is_timeout(), "{error}");
    assert_eq!(sink.requests_to("/slow").len(), 1);

    sink.respond_after("/slow", Duration::ZERO);
    let response = client.post(sink.url_for("/slow")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
}

#[tokio::test]
#[should_panic(expected = "expected at least 1 request(s) to /never")]
async fn http_wait_for_requests_panics_on_timeout() {
    let sink = HttpSink::start().await;
    sink.wait_for_requests("/never", 1, Duration::from_millis(50))
        .await;
}

#[tokio::test]
async fn http_sink_stops_listening_when_dropped() {
    let sink = HttpSink::start().await;
    let port = sink.port();
    reqwest::get(sink.url()).await.unwrap();
    drop(sink);
    assert_refused(port).await;
}

/// Waits (up to `WAIT`) until connecting to `port` is refused.
async fn assert_refused(port: u16) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "port {port} still accepts connections after the sink was dropped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
