//! The policy examples (examples/rate-limit, examples/api-key, examples/jwt) served by
//! `tollgate run`, checked against what their READMEs say: statuses, `WWW-Authenticate`,
//! `X-RateLimit-*` and `Retry-After`, and what the demo backend received. Called one after
//! another by `examples_serve_as_documented`, since every example uses the demo backend's port.

use crate::WAIT;
use crate::support::{self, Tollgate, eventually, get, get_with, temp_dir, workspace};

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
/// Gateway's default of 5 a minute per address elsewhere.
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
