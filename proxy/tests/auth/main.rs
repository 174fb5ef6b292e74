//! Authentication and authorization (`tollgate_proxy::policy::auth`) against real loopback
//! JWKS and introspection servers: every credential source, every JWT check, key rotation and
//! fetch failure, the answer caches, API key revocation, authorization rules, success headers
//! and X.509 identities. Only 127.0.0.1 is ever contacted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api_keys;
mod introspection;
mod jwks;
mod jwt;
mod policy;
mod support;
