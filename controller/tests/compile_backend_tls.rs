//! BackendTLSPolicy and Gateway `spec.tls.backend`: which Service ports the proxy speaks TLS
//! to and how, the policies' statuses per ancestor Gateway, conflicts, and fail-closed
//! invalid policies (fixture `backend_tls.yaml`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use gateway_types::backendtlspolicies::BackendTlsPolicyStatus;
use tollgate::compile::Output;
use tollgate_api::backend_tls::{SubjectAltName, Trust};
use tollgate_api::{Backend, BackendProtocol, BackendTls, ObjectKey};

fn out() -> Output {
    run(&["backend_tls"], "")
}

fn backend<'a>(out: &'a Output, gw: &str, key: &str) -> &'a Backend {
    table(out, "infra", gw)
        .backends
        .get(key)
        .unwrap_or_else(|| panic!("no backend {key} in {gw}"))
}

fn tls<'a>(out: &'a Output, gw: &str, key: &str) -> &'a BackendTls {
    backend(out, gw, key)
        .tls
        .as_ref()
        .unwrap_or_else(|| panic!("{key} has no TLS"))
}

fn policy<'a>(out: &'a Output, name: &str) -> &'a BackendTlsPolicy {
    out.backend_tls_policies
        .get(&ObjectKey::new("apps", name))
        .unwrap_or_else(|| panic!("no status for BackendTLSPolicy apps/{name}"))
}

type BackendTlsPolicy = BackendTlsPolicyStatus;

/// Asserts every ancestor entry of policy `name` has these two conditions, and that the
/// ancestors are exactly `gateways` (in infra).
#[track_caller]
fn assert_policy(
    out: &Output,
    name: &str,
    gateways: &[&str],
    accepted: (&str, &str),
    resolved: (&str, &str),
) {
    let s = policy(out, name);
    let names: Vec<&str> = s
        .ancestors
        .iter()
        .map(|a| a.ancestor_ref.name.as_str())
        .collect();
    assert_eq!(names, gateways, "{name} ancestors");
    for a in &s.ancestors {
        assert_eq!(a.ancestor_ref.namespace.as_deref(), Some("infra"));
        assert_eq!(a.ancestor_ref.kind.as_deref(), Some("Gateway"));
        assert_eq!(
            a.ancestor_ref.group.as_deref(),
            Some("gateway.networking.k8s.io")
        );
        assert_eq!(a.controller_name, "tollgate.dev/gateway-controller");
        assert_cond(&a.conditions, "Accepted", accepted.0, accepted.1);
        assert_cond(&a.conditions, "ResolvedRefs", resolved.0, resolved.1);
        assert!(
            a.conditions
                .iter()
                .all(|c| c.observed_generation == Some(2)),
            "{name}: {:?}",
            a.conditions
        );
    }
}

const OK: (&str, &str) = ("True", "Accepted");
const RESOLVED: (&str, &str) = ("True", "ResolvedRefs");

#[test]
fn a_valid_policy_gives_the_port_sni_trust_and_alpn() {
    let out = out();
    let t = tls(&out, "btls", "apps/secure:443");
    assert_eq!(t.source, "apps/secure");
    // Lower-cased: SNI and name matching are case-insensitive.
    assert_eq!(t.server_name, "secure.example.com");
    assert!(t.subject_alt_names.is_empty());
    let Trust::Pem(pem) = &t.trust else {
        panic!("{:?}", t.trust)
    };
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
    // An HTTPRoute backend may get HTTP/2 when the backend picks it.
    assert_eq!(t.alpn, ["h2", "http/1.1"]);
    assert_eq!(t.client_certificate, None);
    // appProtocol HTTPS with a policy is HTTP/1.1 (or h2 by ALPN) over TLS.
    assert_eq!(
        backend(&out, "btls", "apps/secure:443").protocol,
        BackendProtocol::Http1
    );
    let grpc = grpc_parent_conds(&out, "apps", "btls-grpc", 0);
    assert_cond(grpc, "Accepted", "True", "Accepted");
    assert_cond(grpc, "ResolvedRefs", "True", "ResolvedRefs");
    assert_policy(&out, "secure", &["btls", "btls-mtls"], OK, RESOLVED);
}

#[test]
fn grpc_backends_offer_h2_only_and_websocket_ports_http11_only() {
    let out = out();
    assert_eq!(tls(&out, "btls", "apps/secure:443#h2c").alpn, ["h2"]);
    assert_eq!(tls(&out, "btls", "apps/wss:443").alpn, ["http/1.1"]);
}

#[test]
fn subject_alt_names_and_system_roots() {
    let out = out();
    let t = tls(&out, "btls", "apps/sans:443");
    assert_eq!(t.server_name, "sans.example.com");
    assert_eq!(
        t.subject_alt_names,
        [
            SubjectAltName::Hostname("api.example.com".into()),
            SubjectAltName::Uri("spiffe://example.com/ns/apps/sa/api".into()),
        ]
    );
    assert_eq!(tls(&out, "btls", "apps/system:443").trust, Trust::System);
    assert_policy(&out, "system", &["btls", "btls-mtls"], OK, RESOLVED);
}

#[test]
fn ports_without_a_policy_stay_plaintext() {
    let out = out();
    assert_eq!(backend(&out, "btls", "apps/web:80").tls, None);
}

#[test]
fn the_older_policy_wins_a_conflict_whatever_the_names() {
    let out = out();
    // a-newer sorts first by name but is a month younger.
    assert_eq!(
        tls(&out, "btls", "apps/contested:443").server_name,
        "older.example.com"
    );
    assert_policy(&out, "z-older", &["btls", "btls-mtls"], OK, RESOLVED);
    assert_policy(
        &out,
        "a-newer",
        &["btls", "btls-mtls"],
        ("False", "Conflicted"),
        RESOLVED,
    );
    // Same age: the first by namespace/name wins.
    assert_policy(
        &out,
        "z-older-twin",
        &["btls", "btls-mtls"],
        ("False", "Conflicted"),
        RESOLVED,
    );
}

#[test]
fn a_policy_naming_the_port_beats_one_naming_the_service() {
    let out = out();
    assert_eq!(
        tls(&out, "btls", "apps/split:443").server_name,
        "whole.example.com"
    );
    // split-two is younger, but names the port: no conflict, and it applies there.
    assert_eq!(
        tls(&out, "btls", "apps/split:8443").server_name,
        "two.example.com"
    );
    assert_policy(&out, "split-whole", &["btls", "btls-mtls"], OK, RESOLVED);
    assert_policy(&out, "split-two", &["btls", "btls-mtls"], OK, RESOLVED);
}

#[test]
fn a_missing_ca_config_map_closes_the_service() {
    let out = out();
    assert_policy(
        &out,
        "missing-ca",
        &["btls"],
        ("False", "NoValidCACertificate"),
        ("False", "InvalidCACertificateRef"),
    );
    let c = cond(
        &policy(&out, "missing-ca").ancestors[0].conditions,
        "ResolvedRefs",
    );
    assert!(
        c.message.contains("ConfigMap apps/nowhere does not exist"),
        "{}",
        c.message
    );
    assert_closed(&out, "/missing-ca", 0);
}

#[test]
fn a_ca_ref_of_another_kind_is_invalid_kind() {
    let out = out();
    assert_policy(
        &out,
        "bad-kind",
        &["btls"],
        ("False", "NoValidCACertificate"),
        ("False", "InvalidKind"),
    );
    assert_closed(&out, "/bad-kind", 1);
}

#[test]
fn one_bad_ca_ref_among_good_ones_still_closes_the_service() {
    let out = out();
    // Accepted: one ref is usable; ResolvedRefs names both bad ones.
    assert_policy(
        &out,
        "bad-pem",
        &["btls"],
        OK,
        ("False", "InvalidCACertificateRef"),
    );
    let c = cond(
        &policy(&out, "bad-pem").ancestors[0].conditions,
        "ResolvedRefs",
    );
    assert!(
        c.message.contains("not-pem") && c.message.contains("no-ca-key"),
        "{}",
        c.message
    );
    // "Connections using an invalid CACertificateRef MUST fail": never with part of the CAs.
    assert_closed(&out, "/bad-pem", 2);
}

/// The rule of `btls-broken` at `path` (index `rule`) answers 500: its backend did not
/// resolve, and the route says why.
#[track_caller]
fn assert_closed(out: &Output, path: &str, rule: u32) {
    let conds = parent_conds(out, "apps", "btls-broken", 0);
    assert_cond(conds, "Accepted", "True", "Accepted");
    assert_cond(conds, "ResolvedRefs", "False", "InvalidBackendTLSPolicy");
    let t = table(out, "infra", "btls");
    let routes: Vec<_> = t
        .ports
        .iter()
        .flat_map(|p| &p.listeners)
        .flat_map(|l| &l.virtual_hosts)
        .flat_map(|v| v.routes.iter())
        .filter(|r| r.route == ObjectKey::new("apps", "btls-broken") && r.rule_index == rule)
        .collect();
    assert_eq!(routes.len(), 1, "{path}");
    assert!(
        routes[0].backends.iter().all(|b| b.backend.is_none()),
        "{path}: {:?}",
        routes[0].backends
    );
    let svc = path.trim_start_matches('/');
    assert!(
        !t.backends
            .keys()
            .any(|k| k.starts_with(&format!("apps/{svc}:"))),
        "{path} must not reach the proxy"
    );
}

#[test]
fn appprotocol_https_without_a_policy_is_unsupported_protocol() {
    let out = out();
    let conds = parent_conds(&out, "apps", "btls-no-policy", 0);
    assert_cond(conds, "ResolvedRefs", "False", "UnsupportedProtocol");
    assert!(
        cond(conds, "ResolvedRefs").message.contains("https"),
        "{:?}",
        conds
    );
}

#[test]
fn options_are_refused_and_close_the_port() {
    let out = out();
    assert_policy(
        &out,
        "options",
        &["btls", "btls-mtls"],
        ("False", "Invalid"),
        RESOLVED,
    );
    let conds = parent_conds(&out, "apps", "btls", 0);
    assert_cond(conds, "ResolvedRefs", "False", "InvalidBackendTLSPolicy");
    assert!(
        !table(&out, "infra", "btls")
            .backends
            .contains_key("apps/web:9000")
    );
}

#[test]
fn a_policy_no_gateway_uses_gets_no_status() {
    let out = out();
    assert!(
        !out.backend_tls_policies
            .contains_key(&ObjectKey::new("apps", "unused"))
    );
}

#[test]
fn the_gateway_client_certificate_goes_to_its_tls_backends_only() {
    let out = out();
    let gw = gateway_conds(&out, "infra", "btls-mtls");
    assert_cond(gw, "ResolvedRefs", "True", "ResolvedRefs");
    let t = tls(&out, "btls-mtls", "apps/secure:443");
    let cert = t.client_certificate.as_ref().expect("client certificate");
    assert_eq!(cert.source, "certs/shared-tls");
    assert!(cert.key_pem.contains("PRIVATE KEY"));
    // The other Gateway presents none; plain backends get none.
    assert_eq!(
        tls(&out, "btls", "apps/secure:443").client_certificate,
        None
    );
    assert_eq!(backend(&out, "btls-mtls", "apps/web:80").tls, None);
    let missing = gateway_conds(&out, "infra", "btls-missing-cert");
    assert_cond(
        missing,
        "ResolvedRefs",
        "False",
        "InvalidClientCertificateRef",
    );
    assert_cond(missing, "Accepted", "True", "Accepted");
    assert_cond(missing, "Programmed", "True", "Programmed");
}

#[test]
fn invalid_policies_are_rejections() {
    let rej = out().rejections();
    for (name, reason) in [
        ("missing-ca", "NoValidCACertificate"),
        ("bad-kind", "InvalidKind"),
        ("a-newer", "Conflicted"),
    ] {
        assert!(
            rej.iter().any(|r| r.kind == "BackendTLSPolicy"
                && r.key == ObjectKey::new("apps", name)
                && r.part.as_deref() == Some("ancestor infra/btls")
                && r.reason == reason),
            "{name} {reason}: {rej:#?}"
        );
    }
}

#[test]
fn the_cache_follows_a_policy_that_becomes_invalid() {
    use tollgate::compile::{CompileCache, compile, compile_cached};
    let good = inputs(&["backend_tls"], "");
    let (first, cache) = compile_cached(&good, CompileCache::default());
    assert_eq!(first, compile(&good));
    // The CA ConfigMap goes away: every policy naming it now closes its Service.
    let mut bad = good.clone();
    bad.config_maps
        .retain(|c| c.metadata.name.as_deref() != Some("backend-ca"));
    let (second, _) = compile_cached(&bad, cache);
    assert_eq!(second, compile(&bad));
    assert_cond(
        parent_conds(&second, "apps", "btls", 0),
        "ResolvedRefs",
        "False",
        "InvalidBackendTLSPolicy",
    );
    assert!(
        !table(&second, "infra", "btls")
            .backends
            .contains_key("apps/secure:443")
    );
}

/// A BackendPolicy's HTTP health check on a TLS backend stays an HTTP check (made over the
/// policy's TLS by the proxy), with no note on the policy.
#[test]
fn an_http_health_check_of_a_tls_backend_stays_an_http_check() {
    let out = run(
        &["backend_tls"],
        r#"
apiVersion: tollgate.dev/v1alpha1
kind: BackendPolicy
metadata: {name: secure-checks, namespace: apps, generation: 1}
spec:
  targetRefs: [{group: "", kind: Service, name: secure}]
  healthCheck:
    active: {type: HTTP, http: {path: /healthz, expectedStatuses: [200]}, interval: 2s, timeout: 1s}
"#,
    );
    let b = backend(&out, "btls", "apps/secure:443");
    assert!(b.tls.is_some());
    let check = b.settings.health_check.as_ref().expect("a health check");
    assert_eq!(
        check.probe,
        tollgate_api::backend::Probe::Http {
            path: "/healthz".into(),
            host: None,
            expected_statuses: vec![200],
        }
    );
    let st = &out.backend_policies[&ObjectKey::new("apps", "secure-checks")];
    let accepted = cond(&st.conditions, "Accepted");
    assert_eq!(accepted.status, "True", "{accepted:?}");
    assert!(!accepted.message.contains("TCP"), "{}", accepted.message);
}
