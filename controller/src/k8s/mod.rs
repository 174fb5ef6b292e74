//! The thin Kubernetes shell around the compiler: watches and stores, the controller loop,
//! status writing, leader election and provisioning.
//!
//! Flow: [`stores`] (one watcher per kind, per-object deserialization through [`lenient`]) →
//! [`controller`] (debounce) → [`reconcile`] (compile, publish to the push server, provision,
//! [`status`] plan and server-side apply, Events) with [`leader`] gating every write, and
//! [`metrics`] served on the admin address.

pub mod controller;
pub mod leader;
pub mod lenient;
pub mod metrics;
pub mod provision;
pub mod reconcile;
pub mod status;
pub mod stores;
