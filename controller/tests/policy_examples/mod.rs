//! The policy examples (examples/rate-limit, examples/llm-tokens, examples/api-key,
//! examples/basic-auth, examples/jwt, examples/introspection, examples/ext-authz, examples/oidc,
//! examples/mtls, examples/client-ip) served by `tollgate run`, checked against what
//! their READMEs say: statuses, `Content-Encoding`, `WWW-Authenticate`, `X-RateLimit-*` and `Retry-After`, TLS
//! handshakes refused for want of a client certificate, and what the demo backend received.
//! Called one after another by `examples_serve_as_documented`, since every example uses the
//! demo backend's port.
mod llm_tokens;
mod oidc;

pub use llm_tokens::llm_tokens;
pub use oidc::oidc;

use crate::WAIT;
use crate::support::{
    self, Tollgate, eventually, get, get_mtls, get_with, send_with, temp_dir, workspace,
};

/// `tollgate run` on a policy example with the demo backend and no admin server.
fn run_example(name: &str) -> Tollgate {
    let logs = temp_dir(name);
    Tollgate::start(
        &[
            "run",
            &format!("examples/{name}"),
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            "off",
        ],
        &logs,
    )
}

/// `(X-RateLimit-Limit, X-RateLimit-Remaining)` of an answer.
fn rate_headers(r: &support::Resp) -> (Option<&str>, Option<&str>) {
    (
        r.header("x-ratelimit-limit"),
        r.header("x-ratelimit-remaining"),
    )
}

/// examples/rate-limit, as its README says: 3 a minute per X-Client-Id on /api, the
/// Gateway's default of 5 a minute per address elsewhere, a token bucket on /exports and a
/// fixed window on /reports.
pub fn rate_limit() {
    let tg = run_example("rate-limit");
    let api = |client: &str| get_with(8084, "127.0.0.1:8084", "/api", &[("x-client-id", client)]);
    // Wait with a client of its own, so the README's clients start with full counters.
    eventually(WAIT, || api("probe").filter(|r| r.status == 200))
        .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));

    for remaining in ["2", "1", "0"] {
        let r = api("alice").unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(rate_headers(&r), (Some("3"), Some(remaining)));
        assert!(r.header("x-ratelimit-reset").is_some(), "{r:?}");
    }
    let refused = api("alice").unwrap();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(rate_headers(&refused), (Some("3"), Some("0")));
    // A full sliding window of 3 a minute: the previous window's count weighs until a third
    // of the next one has passed.
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=80).contains(&retry), "{refused:?}");
    assert!(refused.header("x-ratelimit-reset").is_some());
    assert_eq!(api("alice").unwrap().status, 429);

    let bob = api("bob").unwrap();
    assert_eq!(bob.status, 200);
    assert_eq!(rate_headers(&bob), (Some("3"), Some("2")));

    // The Gateway's default on every other route: 5 a minute from this address.
    for remaining in ["4", "3", "2", "1", "0"] {
        let r = get(8084, "127.0.0.1:8084", "/").unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(rate_headers(&r), (Some("5"), Some(remaining)));
    }
    let refused = get(8084, "127.0.0.1:8084", "/").unwrap();
    assert_eq!(refused.status, 429);
    assert_eq!(rate_headers(&refused), (Some("5"), Some("0")));
    assert!(refused.header("retry-after").is_some());

    token_bucket();
    fixed_window();
}

/// The `X-RateLimit-Reset` or `Retry-After` seconds of an answer.
fn seconds(r: &support::Resp, name: &str) -> u64 {
    r.header(name)
        .unwrap_or_else(|| panic!("no {name}: {r:?}"))
        .parse()
        .unwrap()
}

/// examples/rate-limit's /exports: a TokenBucket of 3 refilled at 3 an hour. A burst spends
/// the bucket; the refusal's Retry-After is one token's refill (at most 20 minutes), less
/// than the time the bucket takes to fill up again (X-RateLimit-Reset). Nothing here depends
/// on the clock but the burst taking less than the 20 minutes one token takes to come back.
fn token_bucket() {
    let exports = || {
        get_with(
            8084,
            "127.0.0.1:8084",
            "/exports",
            &[("x-client-id", "alice")],
        )
    };
    for (remaining, full_in) in [("2", 1200), ("1", 2400), ("0", 3600)] {
        let r = exports().unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(rate_headers(&r), (Some("3"), Some(remaining)));
        // The bucket is full again once every spent token is back, 20 minutes each.
        let reset = seconds(&r, "x-ratelimit-reset");
        assert!((full_in - 1200 + 1..=full_in).contains(&reset), "{r:?}");
    }
    let refused = exports().unwrap();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(rate_headers(&refused), (Some("3"), Some("0")));
    let retry = seconds(&refused, "retry-after");
    assert!((1..=1200).contains(&retry), "one token's wait: {refused:?}");
    assert!(
        seconds(&refused, "x-ratelimit-reset") > retry + 1200,
        "{refused:?}"
    );
}

/// examples/rate-limit's /reports: a FixedWindow of 2 an hour, aligned on the hour. The
/// refusal's Retry-After is the time left in the window, the same as its X-RateLimit-Reset.
/// A burst that straddles the top of the hour would see a fresh window: when fewer than 5
/// seconds of the window are left, wait for the next one and count with a new client.
fn fixed_window() {
    let reports = |client: &str| {
        get_with(
            8084,
            "127.0.0.1:8084",
            "/reports",
            &[("x-client-id", client)],
        )
        .unwrap()
    };
    let mut first = reports("alice");
    let mut client = "alice";
    if seconds(&first, "x-ratelimit-reset") < 5 {
        std::thread::sleep(std::time::Duration::from_secs(
            seconds(&first, "x-ratelimit-reset") + 1,
        ));
        client = "alice-next-window";
        first = reports(client);
    }
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(rate_headers(&first), (Some("2"), Some("1")));
    assert!(seconds(&first, "x-ratelimit-reset") <= 3600, "{first:?}");
    let second = reports(client);
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(rate_headers(&second), (Some("2"), Some("0")));
    let refused = reports(client);
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(rate_headers(&refused), (Some("2"), Some("0")));
    let retry = seconds(&refused, "retry-after");
    assert!((1..=3600).contains(&retry), "{refused:?}");
    assert_eq!(
        retry,
        seconds(&refused, "x-ratelimit-reset"),
        "a fixed window admits again only when it ends: {refused:?}"
    );
    // A client over the limit stays refused; another has a counter of its own.
    assert_eq!(reports(client).status, 429);
    let bob = reports("bob");
    assert_eq!(bob.status, 200, "{bob:?}");
    assert_eq!(rate_headers(&bob), (Some("2"), Some("1")));
}

/// examples/api-key, as its README says.
pub fn api_key() {
    let tg = run_example("api-key");
    let call = |path: &str, headers: &[(&str, &str)]| {
        get_with(8085, "127.0.0.1:8085", path, headers).unwrap()
    };
    let none = eventually(WAIT, || {
        get(8085, "127.0.0.1:8085", "/orders").filter(|r| r.status != 404)
    })
    .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));
    assert_eq!(none.status, 401, "{none:?}");
    assert_eq!(
        none.header("www-authenticate"),
        Some("APIKEY realm=\"tollgate\"")
    );
    assert_eq!(call("/orders", &[("X-API-Key", "wrong")]).status, 401);
    assert_eq!(
        call("/orders", &[("X-API-Key", "carol-demo-key")]).status,
        401,
        "a Secret without the tollgate.dev/credential label is not read"
    );

    let alice = call("/orders", &[("X-API-Key", "alice-demo-key")]);
    assert_eq!(alice.status, 200, "{alice:?}");
    let doc = alice.json();
    assert_eq!(doc["headers"]["x-user"], "alice");
    assert!(doc["headers"].get("x-api-key").is_none(), "{doc}");

    let bob = call(
        "/orders",
        &[("X-API-Key", "bob-demo-key"), ("X-User", "alice")],
    );
    assert_eq!(bob.status, 200);
    assert_eq!(bob.json()["headers"]["x-user"], "bob");

    let forbidden = call("/admin/stats", &[("X-API-Key", "bob-demo-key")]);
    assert_eq!(forbidden.status, 403, "{forbidden:?}");
    assert_eq!(forbidden.header("www-authenticate"), None);
    assert_eq!(
        call("/admin/stats", &[("X-API-Key", "alice-demo-key")]).status,
        200
    );
    // The policy reads the normalized path, the one the backend gets: no spelling of
    // `/admin` passes as another path.
    for path in [
        "/orders/../admin/stats",
        "/x/%2e%2e/admin/stats",
        "/./admin/stats",
        "//admin/stats",
        "/%61dmin/stats",
    ] {
        let r = call(path, &[("X-API-Key", "bob-demo-key")]);
        assert_eq!(r.status, 403, "{path}: {r:?}");
        let r = call(path, &[("X-API-Key", "alice-demo-key")]);
        assert_eq!(r.status, 200, "{path}: {r:?}");
        assert_eq!(r.json()["path"], "/admin/stats", "{path}");
    }
    assert_eq!(
        call("/../admin", &[("X-API-Key", "alice-demo-key")]).status,
        400
    );
}

/// examples/basic-auth, as its README says.
pub fn basic_auth() {
    use base64::Engine as _;
    let tg = run_example("basic-auth");
    let basic = |user_pass: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_pass)
        )
    };
    let call = |method: &str, path: &str, user_pass: &str| {
        send_with(
            8090,
            method,
            "127.0.0.1:8090",
            path,
            &[("Authorization", &basic(user_pass))],
        )
        .unwrap()
    };
    let none = eventually(WAIT, || {
        get(8090, "127.0.0.1:8090", "/users").filter(|r| r.status != 404)
    })
    .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));
    assert_eq!(none.status, 401, "{none:?}");
    assert_eq!(
        none.header("www-authenticate"),
        Some("Basic realm=\"tollgate\"")
    );
    assert_eq!(call("GET", "/users", "alice:wrong").status, 401);
    assert_eq!(call("GET", "/users", "mallory:alice-password").status, 401);
    let alice = call("GET", "/users", "alice:alice-password");
    assert_eq!(alice.status, 200, "{alice:?}");
    let doc = alice.json();
    assert_eq!(doc["headers"]["x-user"], "alice");
    assert!(doc["headers"].get("authorization").is_none(), "{doc}");
    assert_eq!(call("GET", "/users", "carol:carol-password").status, 200);
    assert_eq!(
        call("DELETE", "/users/7", "carol:carol-password").status,
        403,
        "support may read, not write"
    );
    assert_eq!(call("DELETE", "/users/7", "bob:bob-password").status, 200);
}

/// A `NAME=value` line of examples/jwt/README.md (the test tokens).
fn readme_token(name: &str) -> String {
    let readme = std::fs::read_to_string(workspace().join("examples/jwt/README.md")).unwrap();
    readme
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= line in examples/jwt/README.md"))
        .trim()
        .to_owned()
}

/// examples/jwt, with the tokens its README gives.
pub fn jwt() {
    let tg = run_example("jwt");
    let (token, expired) = (readme_token("TOKEN"), readme_token("EXPIRED"));
    let none = eventually(WAIT, || {
        get(8086, "127.0.0.1:8086", "/me").filter(|r| r.status != 404)
    })
    .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));
    assert_eq!(none.status, 401, "{none:?}");
    assert_eq!(
        none.header("www-authenticate"),
        Some("Bearer realm=\"tollgate\"")
    );

    let ok = get_with(
        8086,
        "127.0.0.1:8086",
        "/me",
        &[
            ("Authorization", &format!("Bearer {token}")),
            ("X-User", "root"),
        ],
    )
    .unwrap();
    assert_eq!(ok.status, 200, "{ok:?}\n{}", tg.log());
    assert_eq!(ok.json()["headers"]["x-user"], "alice");

    let late = get_with(
        8086,
        "127.0.0.1:8086",
        "/me",
        &[("Authorization", &format!("Bearer {expired}"))],
    )
    .unwrap();
    assert_eq!(late.status, 401, "{late:?}");
    assert_eq!(
        late.header("www-authenticate"),
        Some("Bearer realm=\"tollgate\"")
    );
}

/// examples/introspection, with the demo backend as its introspection endpoint and the demo
/// tokens its README lists.
pub fn introspection() {
    let tg = run_example("introspection");
    let call = |path: &str, token: Option<&str>| {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth
            .iter()
            .map(|a| ("Authorization", a.as_str()))
            .chain([("X-User", "root")])
            .collect();
        get_with(8087, "127.0.0.1:8087", path, &headers).unwrap()
    };
    let none = eventually(WAIT, || {
        get(8087, "127.0.0.1:8087", "/accounts").filter(|r| r.status != 404)
    })
    .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));
    assert_eq!(none.status, 401, "{none:?}");
    assert_eq!(
        none.header("www-authenticate"),
        Some("Bearer realm=\"tollgate\"")
    );
    let unknown = call("/accounts", Some("not-a-token"));
    assert_eq!(unknown.status, 401, "{unknown:?}\n{}", tg.log());
    assert_eq!(
        unknown.header("www-authenticate"),
        Some("Bearer realm=\"tollgate\"")
    );

    let alice = call("/accounts", Some("demo-token-alice"));
    assert_eq!(alice.status, 200, "{alice:?}\n{}", tg.log());
    let doc = alice.json();
    assert_eq!(doc["headers"]["x-user"], "alice", "{doc}");
    assert_eq!(doc["headers"]["x-scope"], "read", "{doc}");
    assert!(doc["headers"].get("authorization").is_none(), "{doc}");

    let forbidden = call("/admin/users", Some("demo-token-alice"));
    assert_eq!(forbidden.status, 403, "{forbidden:?}");
    assert_eq!(forbidden.header("www-authenticate"), None);
    let admin = call("/admin/users", Some("demo-token-admin"));
    assert_eq!(admin.status, 200, "{admin:?}");
    assert_eq!(admin.json()["headers"]["x-user"], "admin");
}

/// examples/ext-authz, with the demo backend as its HTTP authorization service and the demo
/// tokens its README lists.
pub fn ext_authz() {
    let tg = run_example("ext-authz");
    let call = |path: &str, token: &str| {
        let auth = format!("Bearer {token}");
        get_with(
            8092,
            "127.0.0.1:8092",
            path,
            &[("Authorization", auth.as_str()), ("X-Auth-User", "root")],
        )
        .unwrap()
    };
    let none = eventually(WAIT, || {
        get(8092, "127.0.0.1:8092", "/orders").filter(|r| r.status != 404)
    })
    .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));
    // The service's own denial, challenge included.
    assert_eq!(none.status, 401, "{none:?}\n{}", tg.log());
    assert_eq!(
        none.header("www-authenticate"),
        Some("Bearer realm=\"demo-authz\"")
    );

    let alice = call("/orders", "demo-token-alice");
    assert_eq!(alice.status, 200, "{alice:?}\n{}", tg.log());
    assert_eq!(alice.header("x-auth-plan"), Some("free"));
    let doc = alice.json();
    assert_eq!(doc["headers"]["x-auth-user"], "alice", "{doc}");
    assert_eq!(doc["path"], "/orders", "{doc}");

    let forbidden = call("/admin/users", "demo-token-alice");
    assert_eq!(forbidden.status, 403, "{forbidden:?}");
    assert_eq!(forbidden.body, "alice may not call /admin\n");
    let admin = call("/admin/users", "demo-token-admin");
    assert_eq!(admin.status, 200, "{admin:?}");
    assert_eq!(admin.json()["headers"]["x-auth-user"], "admin");
}

/// Whether `e` is a TLS alert the server sent: how a refused client certificate shows up.
fn is_tls_alert(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|tls| matches!(tls, rustls::Error::AlertReceived(_)))
}

/// A self-signed client certificate for `cn`: one the example's client CA did not issue.
fn stranger_cert(cn: &str) -> support::ClientCert {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let cert = params.self_signed(&key).unwrap();
    (
        vec![cert.der().clone()],
        rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
}

/// examples/mtls, with the client certificate its README uses: the handshake needs a
/// certificate issued by the client CA (AllowValidOnly), and the AuthPolicy sends its CN
/// upstream.
pub fn mtls() {
    let tg = run_example("mtls");
    let dir = workspace().join("examples/mtls");
    let ca = dir.join("demo-ca.pem");
    let alice = || {
        Some(support::client_cert(
            &dir.join("client.crt"),
            &dir.join("client.key"),
        ))
    };
    let call = |client| get_mtls(8444, "api.example.test", "/whoami", &[], &ca, client);
    let ok = eventually(WAIT, || call(alice()).ok())
        .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));
    assert_eq!(ok.status, 200, "{ok:?}\n{}", tg.log());
    let doc = ok.json();
    assert_eq!(doc["headers"]["x-forwarded-proto"], "https");
    assert_eq!(doc["headers"]["x-client-cn"], "alice", "{doc}");
    assert_eq!(doc["headers"]["x-client-subject"], "CN=alice, O=Example");

    // A client-sent X-Client-CN is replaced by the certificate's.
    let spoof = get_mtls(
        8444,
        "api.example.test",
        "/whoami",
        &[("X-Client-CN", "mallory")],
        &ca,
        alice(),
    )
    .unwrap();
    assert_eq!(spoof.json()["headers"]["x-client-cn"], "alice");

    // No certificate, or one the client CA did not issue: no handshake, so no HTTP at all.
    for (what, client) in [
        ("none", None),
        ("self-signed", Some(stranger_cert("alice"))),
    ] {
        match call(client) {
            Err(e) => assert!(is_tls_alert(&e), "{what}: not a TLS alert: {e:?}"),
            Ok(r) => panic!("{what}: served without a valid client certificate: {r:?}"),
        }
    }
}

/// examples/client-ip, as its README says: from the balancer's network, the last `X-Forwarded-For`
/// entry outside it is the client;
/// `/admin` only from the office networks; 5 requests a minute per client.
pub fn client_ip() {
    let tg = run_example("client-ip");
    let from = |xff: &str, path: &str| {
        get_with(8088, "127.0.0.1:8088", path, &[("X-Forwarded-For", xff)]).unwrap()
    };
    // Probe with an address of its own, so the README's clients start with full counters.
    eventually(WAIT, || {
        get_with(
            8088,
            "127.0.0.1:8088",
            "/",
            &[("X-Forwarded-For", "192.0.2.200")],
        )
        .filter(|r| r.status == 200)
    })
    .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));

    // The ClientPolicy's compression: the coding the client ranks highest among the
    // policy's, ties to the policy's order (zstd, br, gzip); `Vary` either way.
    // HEAD: the same header fields as GET, without the encoded body this client reads as text.
    let ae = |method: &str, accept: &str| {
        send_with(
            8088,
            method,
            "127.0.0.1:8088",
            "/",
            &[
                ("X-Forwarded-For", "192.0.2.201"),
                ("Accept-Encoding", accept),
            ],
        )
        .unwrap()
    };
    let coded = ae("HEAD", "gzip, br");
    assert_eq!(coded.status, 200, "{coded:?}");
    assert_eq!(coded.header("content-encoding"), Some("br"), "{coded:?}");
    assert_eq!(coded.header("vary"), Some("Accept-Encoding"));
    let plain = ae("GET", "identity");
    assert_eq!(plain.header("content-encoding"), None, "{plain:?}");
    assert_eq!(plain.header("vary"), Some("Accept-Encoding"));
    assert_eq!(plain.json()["path"], "/");

    for (xff, want) in [
        ("10.1.2.3", 200),
        ("2001:db8::5", 200),
        ("203.0.113.7", 403),
        ("10.1.2.3, 203.0.113.7", 403),
    ] {
        let r = from(xff, "/admin");
        assert_eq!(r.status, want, "X-Forwarded-For: {xff}: {r:?}");
    }

    for remaining in ["4", "3", "2", "1", "0"] {
        let r = from("198.51.100.1", "/");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(rate_headers(&r), (Some("5"), Some(remaining)));
    }
    assert_eq!(from("198.51.100.1", "/").status, 429);
    let other = from("198.51.100.2", "/");
    assert_eq!(other.status, 200);
    assert_eq!(
        other.json()["headers"]["x-forwarded-for"],
        "198.51.100.2, 127.0.0.1",
        "the client, then the gateway's peer"
    );
    assert_eq!(
        from("192.0.2.50, 198.51.100.1", "/").status,
        429,
        "a fresh address claimed to the left does not reset a counter"
    );
    let claimed = from("10.9.9.9, 198.51.100.3", "/");
    assert_eq!(
        claimed.json()["headers"]["x-forwarded-for"],
        "198.51.100.3, 127.0.0.1",
        "what a client wrote left of its entry does not reach the backend"
    );
    // Access log lines are written as answers end, by a writer of their own.
    assert!(
        eventually(WAIT, || tg
            .log()
            .contains(r#""peer":"198.51.100.2""#)
            .then_some(()))
        .is_some(),
        "the access log names the client; log:\n{}",
        tg.log()
    );
}

/// examples/resilience, as its README says: `orders` has a live endpoint and a dead one;
/// with the route's retry rule no request fails, the dead one is ejected (the access log
/// names the retries and the ejection), and validate accepts the BackendPolicy.
pub fn resilience() {
    let tg = run_example("resilience");
    eventually(WAIT, || {
        get_with(8089, "127.0.0.1:8089", "/orders/1", &[]).filter(|r| r.status == 200)
    })
    .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));
    for i in 0..20 {
        let r = get_with(8089, "127.0.0.1:8089", &format!("/orders/{i}"), &[]).unwrap();
        assert_eq!(r.status, 200, "request {i}: {r:?}\nlog:\n{}", tg.log());
    }
    for needle in [
        r#""retried":["127.0.0.2:9080 connect"]"#,
        "endpoint ejected by outlier detection",
    ] {
        assert!(
            eventually(WAIT, || tg.log().contains(needle).then_some(())).is_some(),
            "the log says {needle:?}; log:\n{}",
            tg.log()
        );
    }
}
