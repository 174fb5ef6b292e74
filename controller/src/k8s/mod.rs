//! The thin Kubernetes shell around the compiler: watches and stores, the controller loop,
//! status writing, leader election and provisioning.
//!
//! Flow: [`stores`] (one watcher per kind, per-object deserialization through [`lenient`];
//! [`optional`] decides whether a kind whose CRD may be missing can be done without) →
//! [`controller`] (debounce) → [`reconcile`] in three parts: its Publisher (snapshot,
//! compile, publish to the push server), Provisioner (each Gateway's proxy objects) and
//! StatusWriter (the final status of every object from one pure function, then [`status`]
//! plan and server-side apply, [`route_status`] for the route kinds, Events), with
//! [`leader`] gating every write, and
//! [`metrics`] served on the admin address. [`namespace`] makes sure, at start, that the
//! controller's own namespace exists.
//!
//! Every replica watches, compiles and publishes tables (so any replica can serve proxies);
//! only the Lease holder writes status, provisions and records Events. What a change costs:
//!
//! | change | compile + publish | status pass | provisioning |
//! | --- | --- | --- | --- |
//! | EndpointSlice only | yes | no (no condition depends on endpoints) | no |
//! | status only (e.g. the echo of our own write) | no | yes (a comparison; writes only on a difference) | no |
//! | anything else | yes | yes | yes (when the Gateway changed) |
//!
//! Known limits: the status of a Gateway or GatewayClass that stops being ours (class or
//! controllerName changed) is left as we last wrote it; watches are cluster-wide for every
//! kind but Secrets (TLS only), so Services and EndpointSlices of the whole cluster are held
//! (stripped of managedFields).

pub mod backend_tls_status;
pub mod controller;
pub mod leader;
pub mod lenient;
pub mod metrics;
pub mod namespace;
pub mod optional;
pub mod overlay;
pub mod owner;
pub mod provision;
pub mod reconcile;
pub mod referenced;
pub mod route_status;
pub mod status;
pub mod stores;
pub mod traffic_status;
