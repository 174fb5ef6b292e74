//! TLS: certificates are checked the way the proxy loads them, and TLS settings we do not
//! implement (`tls.options`) are refused out loud, never ignored; frontend client-certificate
//! validation and the backend client certificate's Gateway condition.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::certs::check_key_pair;
use tollgate_api::ObjectKey;

/// Asserts the listener's certificate was refused with a message containing `what`.
#[track_caller]
fn assert_bad_certificate(out: &tollgate::compile::Output, name: &str, what: &str) {
    let l = listener(out, "infra", "certs", name);
    assert_cond(&l.conditions, "Accepted", "True", "Accepted");
    assert_cond(
        &l.conditions,
        "ResolvedRefs",
        "False",
        "InvalidCertificateRef",
    );
    assert_cond(&l.conditions, "Programmed", "False", "Invalid");
    let msg = &cond(&l.conditions, "ResolvedRefs").message;
    assert!(msg.contains(what), "{name}: {msg}");
    assert!(
        !msg.contains("MII") && !msg.contains("BEGIN"),
        "{name}: message quotes PEM: {msg}"
    );
    assert!(
        table(out, "infra", "certs")
            .ports
            .iter()
            .flat_map(|p| &p.listeners)
            .all(|t| t.name != name),
        "{name} must not reach the proxy"
    );
}

#[test]
fn garbage_but_pem_shaped_certificate_is_invalid_certificate_ref() {
    let out = run(&["tls"], "");
    assert_bad_certificate(&out, "garbage-cert", "infra/tls-garbage-cert tls.crt");
}

#[test]
fn garbage_but_pem_shaped_key_is_invalid_certificate_ref() {
    let out = run(&["tls"], "");
    assert_bad_certificate(&out, "garbage-key", "unsupported type");
}

#[test]
fn key_that_does_not_match_the_certificate_is_invalid_certificate_ref() {
    let out = run(&["tls"], "");
    assert_bad_certificate(&out, "key-mismatch", "does not match the certificate");
}

#[test]
fn certificate_without_key_is_invalid_certificate_ref() {
    let out = run(&["tls"], "");
    assert_bad_certificate(&out, "no-key", "has no PEM tls.key");
}

#[test]
fn more_than_one_private_key_is_invalid_certificate_ref() {
    let out = run(&["tls"], "");
    assert_bad_certificate(&out, "two-keys", "2 private keys");
}

#[test]
fn valid_certificates_of_every_key_format_are_served() {
    // PKCS#8 EC with a CA chain (tls-ok), a self-signed certificate served as the leaf (webpki
    // only parses it: trust is the client's business), and RSA PKCS#1.
    let out = run(&["tls"], "");
    let t = table(&out, "infra", "certs");
    for name in ["ok", "self-signed", "rsa"] {
        let l = listener(&out, "infra", "certs", name);
        assert_cond(&l.conditions, "ResolvedRefs", "True", "ResolvedRefs");
        assert_cond(&l.conditions, "Programmed", "True", "Programmed");
        assert_eq!(table_listener(t, name).certificates.len(), 1, "{name}");
    }
    // SEC1 EC key, through stringData and a ReferenceGrant.
    let granted = run(&["listeners"], "");
    let l = listener(&granted, "infra", "tls", "granted");
    assert_cond(&l.conditions, "ResolvedRefs", "True", "ResolvedRefs");
}

#[test]
fn one_bad_certificate_among_good_ones_is_reported_and_skipped() {
    let out = run(&["tls"], "");
    let l = listener(&out, "infra", "certs", "one-bad");
    assert_cond(
        &l.conditions,
        "ResolvedRefs",
        "False",
        "InvalidCertificateRef",
    );
    assert_cond(&l.conditions, "Programmed", "True", "Programmed");
    let cfg = table_listener(table(&out, "infra", "certs"), "one-bad");
    let sources: Vec<&str> = cfg.certificates.iter().map(|c| c.source.as_str()).collect();
    assert_eq!(sources, vec!["infra/tls-ok"]);
}

/// Every certificate the compiler lets through loads in the proxy's own TLS config builder.
#[test]
fn every_served_certificate_loads_in_the_proxy() {
    let out = run(&["tls", "listeners", "golden"], "");
    let mut checked = 0;
    for t in out.tables.values() {
        for p in t
            .ports
            .iter()
            .filter(|p| p.protocol == tollgate_api::Protocol::Https)
        {
            checked += p
                .listeners
                .iter()
                .map(|l| l.certificates.len())
                .sum::<usize>();
            tollgate_proxy::tls::server_config(p)
                .unwrap_or_else(|e| panic!("port {} of a table: {e}", p.port));
        }
    }
    assert!(checked >= 5, "{checked}");
}

/// `tls.crt` of Secret `name` in the `tls` fixture.
fn fixture_cert(name: &str) -> String {
    let inputs = inputs(&["tls"], "");
    let s = inputs
        .secrets
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(name))
        .unwrap();
    String::from_utf8(s.data.as_ref().unwrap()["tls.crt"].0.clone()).unwrap()
}

#[test]
fn check_key_pair_messages_never_quote_the_key() {
    let cert = fixture_cert("tls-self-signed");
    let secret = "c2VjcmV0IGtleSBieXRlcw";
    for key in [
        format!("-----BEGIN PRIVATE KEY-----\n{secret}==\n-----END PRIVATE KEY-----\n"),
        format!("-----BEGIN PRIVATE KEY-----\n{secret}\n"),
        format!("-----BEGIN EC PRIVATE KEY-----\n{secret}!!\n-----END EC PRIVATE KEY-----\n"),
    ] {
        let e = check_key_pair(&cert, &key).unwrap_err();
        assert!(e.starts_with("tls.key"), "{e}");
        assert!(!e.contains(secret) && !e.contains("c2Vj"), "{e}");
    }
    assert_eq!(
        check_key_pair("no pem here", "").unwrap_err(),
        "tls.crt holds no PEM certificate"
    );
}

/// The PEM of the `tls-ok` certificate of the fixture (a fine CA anchor for these tests).
fn ok_cert_pem() -> String {
    let inputs = inputs(&["tls"], "");
    let s = inputs
        .secrets
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("tls-ok"))
        .unwrap();
    match s.data.as_ref().and_then(|d| d.get("tls.crt")) {
        Some(b) => String::from_utf8(b.0.clone()).unwrap(),
        None => s.string_data.as_ref().unwrap()["tls.crt"].clone(),
    }
}

fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("    {l}\n")).collect()
}

#[test]
fn frontend_validation_without_a_usable_ca_refuses_the_listeners_it_applies_to() {
    let out = run(&["tls"], "");
    let https = listener(&out, "infra", "mtls", "https");
    assert_cond(
        &https.conditions,
        "Accepted",
        "False",
        "NoValidCACertificate",
    );
    assert_cond(
        &https.conditions,
        "ResolvedRefs",
        "False",
        "InvalidCACertificateRef",
    );
    assert_cond(&https.conditions, "Programmed", "False", "Invalid");
    assert_eq!(https.conditions[0].observed_generation, Some(2));
    let msg = &cond(&https.conditions, "ResolvedRefs").message;
    assert!(
        msg.contains("ConfigMap infra/client-ca does not exist"),
        "{msg}"
    );
    // The perPort entry for 8443 carries no validation and overrides the default; HTTP
    // listeners are not affected by frontend TLS at all.
    for name in ["https-8443", "http"] {
        let l = listener(&out, "infra", "mtls", name);
        assert_cond(&l.conditions, "Accepted", "True", "Accepted");
        assert_cond(&l.conditions, "Programmed", "True", "Programmed");
    }
    let gw = gateway_conds(&out, "infra", "mtls");
    assert_cond(gw, "Accepted", "True", "ListenersNotValid");
    let t = table(&out, "infra", "mtls");
    assert!(
        t.ports.iter().all(|p| p.port != 443),
        "443 must not be served without the validation it asks for"
    );
    assert_eq!(port(t, 8443).listeners.len(), 1);
    assert!(port(t, 8443).client_validation.is_none());
}

#[test]
fn frontend_validation_programs_the_ca_bundle_and_mode_per_port() {
    let pem = ok_cert_pem();
    let extra = format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: client-ca, namespace: infra}}
data:
  ca.crt: |
{ca}---
apiVersion: v1
kind: Secret
metadata: {{name: client-ca-secret, namespace: infra}}
stringData:
  ca.crt: |
{ca}---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: mtls-secret, namespace: infra}}
spec:
  gatewayClassName: tollgate
  tls:
    frontend:
      default:
        validation: {{caCertificateRefs: [{{group: "", kind: Secret, name: client-ca-secret}}]}}
  listeners:
  - {{name: https, port: 443, protocol: HTTPS, tls: {{certificateRefs: [{{name: tls-ok}}]}}}}
"#,
        ca = indent(&pem)
    );
    let out = run(&["tls"], &extra);
    // ConfigMap, AllowValidOnly (the default mode).
    let l = listener(&out, "infra", "mtls", "https");
    assert_cond(&l.conditions, "Accepted", "True", "Accepted");
    assert_cond(&l.conditions, "ResolvedRefs", "True", "ResolvedRefs");
    let v = port(table(&out, "infra", "mtls"), 443)
        .client_validation
        .clone()
        .unwrap();
    assert_eq!(v.mode, tollgate_api::ClientCertMode::AllowValidOnly);
    assert_eq!(v.ca_pem.trim(), pem.trim());
    // perPort with AllowInsecureFallback.
    let v = port(table(&out, "infra", "mtls-only"), 443)
        .client_validation
        .clone()
        .unwrap();
    assert_eq!(v.mode, tollgate_api::ClientCertMode::AllowInsecureFallback);
    // The Gateway says so; one that only allows valid certificates has no such condition.
    let insecure = cond(
        gateway_conds(&out, "infra", "mtls-only"),
        "InsecureFrontendValidationMode",
    );
    assert_eq!(
        (insecure.status.as_str(), insecure.reason.as_str()),
        ("True", "ConfigurationChanged")
    );
    assert!(insecure.message.contains("perPort 443"), "{insecure:?}");
    assert!(
        gateway_conds(&out, "infra", "mtls")
            .iter()
            .all(|c| c.type_ != "InsecureFrontendValidationMode")
    );
    // A Secret (implementation-specific kind) works too.
    let v = port(table(&out, "infra", "mtls-secret"), 443)
        .client_validation
        .clone()
        .unwrap();
    assert_eq!(v.ca_pem.trim(), pem.trim());
}

#[test]
fn frontend_ca_refs_of_the_wrong_kind_or_namespace_are_reported() {
    let pem = ok_cert_pem();
    let extra = format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: client-ca, namespace: infra}}
data:
  ca.crt: |
{ca}---
apiVersion: v1
kind: ConfigMap
metadata: {{name: other-ca, namespace: other}}
data:
  ca.crt: |
{ca}---
apiVersion: v1
kind: ConfigMap
metadata: {{name: no-key, namespace: infra}}
data: {{something: else}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: mtls-mixed, namespace: infra}}
spec:
  gatewayClassName: tollgate
  tls:
    frontend:
      default:
        validation:
          caCertificateRefs:
          - {{group: "", kind: ConfigMap, name: client-ca}}
          - {{group: "", kind: Service, name: client-ca}}
          - {{group: "", kind: ConfigMap, name: other-ca, namespace: other}}
          - {{group: "", kind: ConfigMap, name: no-key}}
  listeners:
  - {{name: https, port: 443, protocol: HTTPS, tls: {{certificateRefs: [{{name: tls-ok}}]}}}}
"#,
        ca = indent(&pem)
    );
    let out = run(&["tls"], &extra);
    let l = listener(&out, "infra", "mtls-mixed", "https");
    // One usable CA: served, with every bad reference named.
    assert_cond(&l.conditions, "Accepted", "True", "Accepted");
    assert_cond(
        &l.conditions,
        "ResolvedRefs",
        "False",
        "InvalidCACertificateKind",
    );
    let msg = &cond(&l.conditions, "ResolvedRefs").message;
    for needle in [
        "Service infra/client-ca",
        "ConfigMap other/other-ca is not permitted",
        "ConfigMap infra/no-key has no key ca.crt",
    ] {
        assert!(msg.contains(needle), "{needle}: {msg}");
    }
    assert!(
        port(table(&out, "infra", "mtls-mixed"), 443)
            .client_validation
            .is_some()
    );
}

#[test]
fn frontend_without_validation_is_accepted() {
    let out = run(&["tls"], "");
    let l = listener(&out, "infra", "mtls-empty", "https");
    assert_cond(&l.conditions, "Accepted", "True", "Accepted");
    assert_cond(&l.conditions, "Programmed", "True", "Programmed");
}

#[test]
fn listener_tls_options_are_unsupported_value() {
    let out = run(&["tls"], "");
    let tuned = listener(&out, "infra", "options", "tuned");
    assert_cond(&tuned.conditions, "Accepted", "False", "UnsupportedValue");
    assert_cond(&tuned.conditions, "Programmed", "False", "Invalid");
    let msg = &cond(&tuned.conditions, "Accepted").message;
    assert!(
        msg.contains("example.com/ciphers, example.com/min-tls-version"),
        "{msg}"
    );
    let plain = listener(&out, "infra", "options", "plain");
    assert_cond(&plain.conditions, "Accepted", "True", "Accepted");
    let t = table(&out, "infra", "options");
    assert_eq!(
        port(t, 443)
            .listeners
            .iter()
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>(),
        vec!["plain"]
    );
}

#[test]
fn backend_client_certificate_sets_gateway_resolved_refs_only() {
    let out = run(&["tls"], "");
    let gw = gateway_conds(&out, "infra", "backend-cert");
    assert_cond(gw, "Accepted", "True", "Accepted");
    assert_cond(gw, "Programmed", "True", "Programmed");
    // Presented to TLS backends (compile_backend_tls.rs has what reaches the table).
    assert_cond(gw, "ResolvedRefs", "True", "ResolvedRefs");
    assert!(
        out.tables
            .contains_key(&ObjectKey::new("infra", "backend-cert"))
    );
    let cross = gateway_conds(&out, "infra", "backend-cert-cross");
    assert_cond(cross, "ResolvedRefs", "False", "RefNotPermitted");
    assert_cond(cross, "Accepted", "True", "Accepted");
    // Gateways without spec.tls.backend carry no Gateway-level ResolvedRefs.
    assert!(
        gateway_conds(&out, "infra", "mtls")
            .iter()
            .all(|c| c.type_ != "ResolvedRefs")
    );
}

#[test]
fn unsupported_tls_settings_are_rejections() {
    let rej = run(&["tls"], "").rejections();
    for (gw, part, reason) in [
        ("mtls", Some("listener https"), "NoValidCACertificate"),
        ("options", Some("listener tuned"), "UnsupportedValue"),
        ("backend-cert-cross", None, "RefNotPermitted"),
        (
            "certs",
            Some("listener key-mismatch"),
            "InvalidCertificateRef",
        ),
    ] {
        assert!(
            rej.iter().any(|r| r.key == ObjectKey::new("infra", gw)
                && r.part.as_deref() == part
                && r.reason == reason),
            "{gw} {part:?} {reason}: {rej:#?}"
        );
    }
}
