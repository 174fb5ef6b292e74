//! ClientPolicy on the wire: the client address behind trusted proxies (`X-Forwarded-For`)
//! as per-client rate limits count it, what the upstream's `X-Forwarded-For` says, a port
//! closed by an invalid policy, and the path options.
//!
//! The tests play the balancer: each request carries the `X-Forwarded-For` a balancer in
//! front of the gateway would send (what the client sent, then the client's own address).

use http::StatusCode;
use tollgate_api::client::{ClientSettings, EscapedSlashes, ForwardedFor, PathOptions};
use tollgate_api::{ObjectKey, PolicySet};
use tollgate_proxy::Proxy;

use crate::common::*;
use crate::support::*;

/// Two requests a minute per `source.address`.
fn per_source() -> PolicySet {
    PolicySet {
        auth: None,
        rate_limits: vec![per_minute("per-source", 2, "source.address")],
    }
}

/// A proxy with `client` settings whose route (`/`) allows two requests a minute per
/// `source.address`.
async fn limited_per_source(app: &EchoBackend, client: ClientSettings) -> (Proxy, String) {
    proxy_with_client(
        app,
        client,
        vec![guarded("api", "/", "p")],
        vec![("p", per_source())],
    )
    .await
}

fn trusting(f: ForwardedFor) -> ClientSettings {
    ClientSettings {
        forwarded_for: Some(f),
        ..ClientSettings::default()
    }
}

async fn via_balancer(url: &str, xff: &str) -> Answer {
    get_with(&h1_client(), url, &[("x-forwarded-for", xff)]).await
}

const ALICE: &str = "203.0.113.1";
const BOB: &str = "198.51.100.2";

#[tokio::test]
async fn behind_one_trusted_hop_each_client_has_its_own_counter() {
    let app = echo_backend("app").await;
    let (_p, url) = limited_per_source(&app, trusting(ForwardedFor::NumTrustedHops(1))).await;
    for _ in 0..2 {
        assert_eq!(via_balancer(&url, ALICE).await.status, StatusCode::OK);
    }
    assert_eq!(
        via_balancer(&url, ALICE).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Every request comes from the same peer (the "balancer", 127.0.0.1): bob is apart.
    let bob = via_balancer(&url, BOB).await;
    assert_eq!(bob.status, StatusCode::OK);
    assert_eq!(limit_headers(&bob), (Some("2"), Some("1")));
    // The upstream gets the chain with the gateway's peer appended.
    assert_eq!(
        bob.upstream_header("x-forwarded-for").as_deref(),
        Some("198.51.100.2, 127.0.0.1")
    );
}

#[tokio::test]
async fn forged_entries_cannot_pick_a_counter() {
    let app = echo_backend("app").await;
    let (_p, url) = limited_per_source(&app, trusting(ForwardedFor::NumTrustedHops(1))).await;
    // Bob claims to be a fresh address each time; the balancer appends his real one.
    for (i, forged) in ["192.0.2.10", "192.0.2.11", "192.0.2.12"]
        .iter()
        .enumerate()
    {
        let a = via_balancer(&url, &format!("{forged}, {BOB}")).await;
        let want = if i < 2 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(a.status, want, "request {i} claiming {forged}");
    }
    // Claiming to be alice spends bob's counter, not alice's.
    let a = via_balancer(&url, &format!("{ALICE}, {BOB}")).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    // Nor does the claim reach the backend: the chain it gets starts with bob.
    let app2 = echo_backend("app").await;
    let (_p2, url2) = proxy_with_client(
        &app2,
        trusting(ForwardedFor::NumTrustedHops(1)),
        vec![route("site", "/", vec![wb("app", 1)])],
        vec![],
    )
    .await;
    let a = via_balancer(&url2, &format!("{ALICE}, 192.0.2.10, {BOB}")).await;
    assert_eq!(
        a.upstream_header("x-forwarded-for").as_deref(),
        Some("198.51.100.2, 127.0.0.1")
    );
    let alice = via_balancer(&url, ALICE).await;
    assert_eq!(alice.status, StatusCode::OK);
    assert_eq!(limit_headers(&alice), (Some("2"), Some("1")));
}

#[tokio::test]
async fn without_a_client_policy_every_client_behind_a_balancer_is_the_balancer() {
    let app = echo_backend("app").await;
    let (_p, url) = limited_per_source(&app, ClientSettings::default()).await;
    assert_eq!(via_balancer(&url, ALICE).await.status, StatusCode::OK);
    assert_eq!(via_balancer(&url, BOB).await.status, StatusCode::OK);
    assert_eq!(
        via_balancer(&url, "192.0.2.99").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn trusted_networks_are_walked_and_an_untrusted_peer_is_the_client() {
    let app = echo_backend("app").await;
    // The test's peer is 127.0.0.1: trusted here, along with an inner proxy at 10.9.9.9.
    let (_p, url) = limited_per_source(
        &app,
        trusting(ForwardedFor::TrustedCidrs(vec![
            "127.0.0.0/8".into(),
            "10.0.0.0/8".into(),
        ])),
    )
    .await;
    for _ in 0..2 {
        let a = via_balancer(&url, &format!("192.0.2.1, {ALICE}, 10.9.9.9")).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(
            a.upstream_header("x-forwarded-for").as_deref(),
            Some("203.0.113.1, 10.9.9.9, 127.0.0.1"),
            "the client, the trusted proxies, the peer"
        );
    }
    let a = via_balancer(&url, &format!("{ALICE}, 10.9.9.9")).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(via_balancer(&url, BOB).await.status, StatusCode::OK);

    // A peer outside the networks: its header is not read, whatever it says.
    let app2 = echo_backend("app").await;
    let (_p2, url2) = limited_per_source(
        &app2,
        trusting(ForwardedFor::TrustedCidrs(vec!["10.0.0.0/8".into()])),
    )
    .await;
    assert_eq!(via_balancer(&url2, ALICE).await.status, StatusCode::OK);
    assert_eq!(via_balancer(&url2, BOB).await.status, StatusCode::OK);
    assert_eq!(
        via_balancer(&url2, "192.0.2.7").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_port_closed_by_an_invalid_policy_answers_500_and_forwards_nothing() {
    let app = echo_backend("app").await;
    let closed = ClientSettings {
        closed_by: vec![ObjectKey::new("infra", "broken")],
        ..ClientSettings::default()
    };
    let (_p, url) = proxy_with_client(
        &app,
        closed,
        vec![route("site", "/", vec![wb("app", 1)])],
        vec![],
    )
    .await;
    let a = get(&h1_client(), &format!("{url}/anything")).await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(app.hits(), 0);
}

#[tokio::test]
async fn escaped_slashes_rejected_or_unescaped_as_the_port_says() {
    let app = echo_backend("app").await;
    let routes = || {
        vec![
            guarded("admin", "/admin", "p"),
            route("public", "/public", vec![wb("app", 1)]),
        ]
    };
    let locked = || vec![("p", only_auth(api_key_auth()))];
    let with = |escaped_slashes| ClientSettings {
        path: PathOptions {
            merge_slashes: true,
            escaped_slashes,
        },
        ..ClientSettings::default()
    };

    let (_r, reject) =
        proxy_with_client(&app, with(EscapedSlashes::Reject), routes(), locked()).await;
    let status = |url: String| async move { get(&h1_client(), &url).await.status };
    assert_eq!(
        status(format!("{reject}/public%2Fx")).await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(status(format!("{reject}/public/x")).await, StatusCode::OK);

    // Decoded, `%2F..%2F` climbs out of /public: the guarded route judges it.
    let (_u, unescape) =
        proxy_with_client(&app, with(EscapedSlashes::Unescape), routes(), locked()).await;
    assert_eq!(
        status(format!("{unescape}/public%2F..%2Fadmin")).await,
        StatusCode::UNAUTHORIZED
    );
    let a = get(&h1_client(), &format!("{unescape}/public%2Fx")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.json()["path"],
        "/public/x",
        "the upstream gets what was matched"
    );

    // Kept (the default): an opaque character of one segment `public%2F..%2Fadmin`, which
    // neither `/public` nor `/admin` matches.
    let (_k, keep) = proxy_with_client(&app, with(EscapedSlashes::Keep), routes(), locked()).await;
    assert_eq!(
        status(format!("{keep}/public%2F..%2Fadmin")).await,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn slashes_kept_apart_when_the_port_does_not_merge_them() {
    let app = echo_backend("app").await;
    let routes = || {
        vec![
            guarded("admin", "/admin", "p"),
            route("site", "/", vec![wb("app", 1)]),
        ]
    };
    let locked = || vec![("p", only_auth(api_key_auth()))];
    let (_m, merging) =
        proxy_with_client(&app, ClientSettings::default(), routes(), locked()).await;
    assert_eq!(
        get(&h1_client(), &format!("{merging}//admin")).await.status,
        StatusCode::UNAUTHORIZED,
        "merged by default: `//admin` is the guarded `/admin`"
    );
    let keep = ClientSettings {
        path: PathOptions {
            merge_slashes: false,
            escaped_slashes: EscapedSlashes::Keep,
        },
        ..ClientSettings::default()
    };
    let (_k, kept) = proxy_with_client(&app, keep, routes(), locked()).await;
    let a = get(&h1_client(), &format!("{kept}//admin")).await;
    assert_eq!(
        a.status,
        StatusCode::OK,
        "`//admin` is not `/admin` on this port"
    );
    assert_eq!(a.json()["path"], "//admin", "and is forwarded as matched");
}
