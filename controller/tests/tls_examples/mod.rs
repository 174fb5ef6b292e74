//! examples/backend-tls served by `tollgate run`, checked against its README. Called by
//! `examples_serve_as_documented`, one example after another (they share the demo backend's
//! port).
use crate::WAIT;
use crate::support::{Tollgate, eventually, get, temp_dir, workspace};
use crate::validate;

/// examples/backend-tls: TLS from the gateway to a backend (its own HTTPS listener on 9446,
/// which requires a client certificate): verified, with the Gateway's client certificate;
/// refused when the backend's certificate is not for the policy's hostname.
pub fn backend_tls() {
    let logs = temp_dir("backend-tls");
    let tg = Tollgate::start(
        &[
            "run",
            "examples/backend-tls",
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            "off",
        ],
        &logs,
    );
    let resp = eventually(WAIT, || get(8097, "shop.example.test", "/hello"))
        .unwrap_or_else(|| panic!("never answered; log:\n{}", tg.log()));
    assert_eq!(resp.status, 200, "{resp:?}\n{}", tg.log());
    let doc = resp.json();
    assert_eq!(doc["path"], "/hello");
    // The inner hop is the HTTPS listener (so the hop to it was TLS), which verified the
    // gateway's client certificate (CN alice) and sent its CN upstream.
    assert_eq!(doc["headers"]["x-forwarded-proto"], "https", "{doc}");
    assert_eq!(doc["headers"]["x-client-cn"], "alice", "{doc}");
    let wrong = get(8097, "shop.example.test", "/wrong-name").unwrap();
    assert_eq!(wrong.status, 502, "{wrong:?}");
}

/// BackendTLSPolicy status is per ancestor Gateway: `validate` prints it under each.
#[test]
fn validate_prints_backend_tls_policy_status() {
    let (code, out) = validate(&workspace().join("examples/backend-tls"));
    assert_eq!(code, 0, "{out}");
    for name in ["secure-api", "misnamed-api"] {
        let block = format!(
            "BackendTLSPolicy default/{name}\n  Gateway default/backend-tls\n    Accepted=True Accepted: BackendTLSPolicy is accepted\n    ResolvedRefs=True ResolvedRefs:"
        );
        assert!(out.contains(&block), "{name}:\n{out}");
    }
}
