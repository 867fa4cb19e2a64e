//! The allow-list through the guarded client, against a real HTTP server on
//! 127.0.0.1: a listed name reaches it, a listed range reaches it by IP
//! literal and by a name resolving into the range, and a list that names
//! neither refuses both, with no request made.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use outbox_http_guard::{ALLOW_LIST_VARIABLE, AddressPolicy, AllowList, GuardError, GuardedClient};
use outbox_test_support::HttpSink;
use reqwest::Method;
use url::Url;

fn client(list: &str) -> GuardedClient {
    let listed: AllowList = list.parse().unwrap();
    GuardedClient::new(AddressPolicy::from_settings(false, listed)).unwrap()
}

/// The status of a GET of `target`, or the guard's refusal.
async fn get(client: &GuardedClient, target: &str) -> Result<u16, GuardError> {
    let request = client.request(Method::GET, Url::parse(target).unwrap())?;
    match request.send().await {
        Ok(response) => Ok(response.status().as_u16()),
        Err(error) => Err(GuardError::find(&error)
            .unwrap_or_else(|| panic!("{target}: not a refusal: {error:?}"))
            .clone()),
    }
}

#[tokio::test]
async fn a_listed_name_reaches_the_internal_server() {
    let sink = HttpSink::start().await;
    let by_name = format!("http://localhost:{}/by-name", sink.port());

    let listed = client("crm.internal,LOCALHOST");
    assert_eq!(get(&listed, &by_name).await, Ok(200));
    assert_eq!(sink.requests_to("/by-name").len(), 1);
    // The name is allowed, not its addresses: the same server by IP
    // literal stays refused.
    let literal = sink.url_for("/by-literal");
    assert_eq!(
        get(&listed, &literal).await,
        Err(GuardError::InternalAddress {
            ip: [127, 0, 0, 1].into()
        })
    );
    assert!(sink.requests_to("/by-literal").is_empty());
}

#[tokio::test]
async fn a_listed_range_reaches_the_internal_server_by_address_and_by_name() {
    let sink = HttpSink::start().await;
    for list in ["127.0.0.0/8", "127.0.0.1", "10.0.0.0/8,127.0.0.1/32"] {
        let listed = client(list);
        assert_eq!(
            get(&listed, &sink.url_for("/literal")).await,
            Ok(200),
            "{list}"
        );
        // A name that is not listed, resolving into the range: its address
        // in the range is kept (`::1`, outside it, is dropped).
        let by_name = format!("http://localhost:{}/name", sink.port());
        assert_eq!(get(&listed, &by_name).await, Ok(200), "{list}");
    }
    assert_eq!(sink.requests_to("/literal").len(), 3);
    assert_eq!(sink.requests_to("/name").len(), 3);
}

#[tokio::test]
async fn internal_targets_outside_the_list_are_refused_without_a_request() {
    let sink = HttpSink::start().await;
    let port = sink.port();
    // A name and ranges beside the server's, but not its own.
    for list in ["crm.internal,10.0.0.0/8", "127.0.0.2/32"] {
        let listed = client(list);
        let refused = get(&listed, &sink.url_for("/hook")).await.unwrap_err();
        assert_eq!(
            refused,
            GuardError::InternalAddress {
                ip: [127, 0, 0, 1].into()
            },
            "{list}"
        );
        assert!(
            refused.to_string().contains(ALLOW_LIST_VARIABLE),
            "the refusal says how to allow it: {refused}"
        );
        assert_eq!(
            get(&listed, &format!("http://localhost:{port}/hook")).await,
            Err(GuardError::OnlyInternalAddresses {
                host: "localhost".into()
            }),
            "{list}"
        );
    }
    assert!(sink.requests().is_empty(), "{:?}", sink.requests());
}
