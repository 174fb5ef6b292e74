//! OIDC login (`oidc` authentication method) against a real OpenID Provider: zitadel/oidc's
//! example provider, built by `e2e/oidc-provider.sh build` and started per test on
//! 127.0.0.1. A scripted browser (cookie jar, redirects, the provider's login form) logs in
//! through a proxy whose route sends the ID token's claims to an echo backend; then refresh,
//! logout, tampered cookies, forged state, cookie key rotation and an unreachable provider.
//! Each test skips with a loud message when the provider was never built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod login;
mod session;
mod support;
