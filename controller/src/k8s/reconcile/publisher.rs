//! The Publisher, on every replica: snapshot the stores, read the objects listeners and
//! policies reference, compile, and publish each Gateway's table to the push server (only the
//! leader's push server hands them to proxies, so a new leader serves them at once).
//!
//! In: the [`Stores`]. Out: the compiled [`Output`] (kept for the status writer and the
//! provisioner) and the tables published. Each compile gets the previous one's `last_valid`
//! policies, so a policy that becomes invalid keeps enforcing its last valid version (held in
//! memory: after a restart a still-invalid AuthPolicy closes its targets until fixed), and
//! the previous compile's [`CompileCache`], so a compile after a small change costs about
//! that change; the cache never changes the output.

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use tollgate_api::ObjectKey;
use tollgate_proxy::otel::Span;
use tracing::{debug, info, warn};

use super::UNREADABLE_GRACE;
use crate::compile::kinds::RouteParent;
use crate::compile::listeners::DEFAULT_ADDRESS;
use crate::compile::{CONTROLLER_NAME, CompileCache, Inputs, Output, compile, compile_cached};
use crate::k8s::metrics::Metrics;
use crate::k8s::provision;
use crate::k8s::referenced;
use crate::k8s::stores::Stores;
use crate::push::PushServer;

/// What a snapshot and compile came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Published {
    /// Compiled and published; `unread` when a referenced object unreadable past
    /// [`UNREADABLE_GRACE`] was compiled without its payload.
    Yes { unread: bool },
    /// A referenced object could not be read, within the grace: nothing compiled or
    /// published, the tables in place stay.
    Held,
}

pub(super) struct Publisher {
    client: Client,
    pub(super) stores: Stores,
    controller_name: String,
    push: Option<PushServer>,
    /// Proxies are provisioned: their admin port is reserved and they listen on every
    /// address of their pod.
    provisioned: bool,
    /// Payloads of referenced objects the watches stored without them.
    fetched: referenced::Fetched,
    /// Since when a referenced object could not be read (`None` while all can).
    unreadable_since: Option<Instant>,
    compiled: Output,
    cache: CompileCache,
    versions: BTreeMap<ObjectKey, u64>,
    /// The last publish: tables whose version changed, and tables removed.
    last_publish: (usize, usize),
}

impl Publisher {
    pub(super) fn new(
        client: Client,
        stores: Stores,
        controller_name: String,
        push: Option<PushServer>,
        provisioned: bool,
    ) -> Self {
        Self {
            client,
            stores,
            controller_name,
            push,
            provisioned,
            fetched: referenced::Fetched::default(),
            unreadable_since: None,
            compiled: Output::default(),
            cache: CompileCache::default(),
            versions: BTreeMap::new(),
            last_publish: (0, 0),
        }
    }

    /// The last compiled output (with our controller name on route parents).
    pub(super) fn compiled(&self) -> &Output {
        &self.compiled
    }

    /// What the last compile and publish came to, as attributes of the reconcile span.
    pub(super) fn describe(&self, span: &mut Span) {
        let out = &self.compiled;
        let routes = out.http_routes.len()
            + out.grpc_routes.len()
            + out.tls_routes.len()
            + out.tcp_routes.len()
            + out.udp_routes.len();
        span.set("tollgate.gateways", count(out.tables.len()));
        span.set("tollgate.routes", count(routes));
        span.set("tollgate.rejected", count(out.rejections().len()));
        span.set("tollgate.push.published", count(self.last_publish.0));
    }

    /// Snapshots, compiles and publishes; each phase a child of `span`, when traced.
    pub(super) async fn run(
        &mut self,
        started: Instant,
        metrics: &Metrics,
        span: Option<&Span>,
    ) -> Published {
        let mut phase = span.map(|s| s.child("snapshot"));
        let mut inputs = self.stores.inputs(Time(Timestamp::now()));
        if self.provisioned {
            // A listener there would take the provisioned proxy's admin port.
            inputs.reserved_ports = u16::try_from(provision::desired::ADMIN_PORT)
                .into_iter()
                .collect();
        }
        own_classes(&mut inputs, &self.controller_name);
        let refs = referenced::references(&inputs);
        self.stores.referenced.replace(refs.clone());
        let unread = match self.fetched.fill(&self.client, &mut inputs, &refs).await {
            Ok(()) => {
                self.unreadable_since = None;
                false
            }
            Err(e) => {
                let since = *self.unreadable_since.get_or_insert(started);
                if let Some(p) = &mut phase {
                    p.fail(format!("a referenced object could not be read: {e}"));
                }
                if since.elapsed() < UNREADABLE_GRACE {
                    warn!(error = %e, "a referenced object could not be read: tables, statuses and proxies stay as they are; retrying");
                    if let Some(p) = phase {
                        p.end();
                    }
                    return Published::Held;
                }
                warn!(error = %e, grace_s = UNREADABLE_GRACE.as_secs(), "a referenced object is still unreadable: compiling without it (the listeners naming it are rejected)");
                true
            }
        };
        let snapshot = started.elapsed();
        if let Some(p) = phase {
            p.end();
        }
        let phase = span.map(|s| s.child("compile"));
        inputs.last_valid = self.compiled.last_valid.clone();
        let (mut out, cache) = compile_cached(&inputs, std::mem::take(&mut self.cache));
        self.cache = cache;
        name_parents(&mut out, &self.controller_name);
        drop(inputs);
        let compiled = started.elapsed();
        if let Some(mut p) = phase {
            p.set("tollgate.gateways", count(out.tables.len()));
            p.end();
        }
        let phase = span
            .filter(|_| self.push.is_some())
            .map(|s| s.child("push"));
        self.publish(&out, metrics);
        if let Some(mut p) = phase {
            p.set("tollgate.push.published", count(self.last_publish.0));
            p.set("tollgate.push.removed", count(self.last_publish.1));
            p.end();
        }
        self.compiled = out;
        debug!(
            snapshot_ms = snapshot.as_millis(),
            compile_ms = (compiled - snapshot).as_millis(),
            "compiled"
        );
        Published::Yes { unread }
    }

    fn publish(&mut self, out: &Output, metrics: &Metrics) {
        metrics
            .gateways
            .set(i64::try_from(out.tables.len()).unwrap_or(i64::MAX));
        self.last_publish = (0, 0);
        let Some(push) = &self.push else {
            return;
        };
        for (key, table) in &out.tables {
            let mut table = table.clone();
            if self.provisioned {
                // A provisioned proxy listens on every address of its pod: the Gateway's
                // `spec.addresses` are its Service's (load balancer) business.
                for p in &mut table.ports {
                    DEFAULT_ADDRESS.clone_into(&mut p.address);
                }
            }
            let v = push.publish(key, table);
            let old = self.versions.insert(key.clone(), v);
            if old != Some(v) {
                self.last_publish.0 += 1;
                metrics.pushed_versions.inc();
                info!(gateway = %key, version = v, "route table published");
            }
        }
        let gone: Vec<ObjectKey> = self
            .versions
            .keys()
            .filter(|k| !out.tables.contains_key(*k))
            .cloned()
            .collect();
        self.last_publish.1 = gone.len();
        for key in gone {
            push.remove(&key);
            self.versions.remove(&key);
        }
    }
}

/// A count as a span attribute (OTLP integers are signed).
pub(super) fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Compiles `inputs` after `previous` (the last compile's output): hands the compiler the
/// policies `previous` found valid, so a policy that became invalid keeps its last valid
/// version (fail closed), and names our controller on route parents. The Publisher does the
/// same with its compile cache.
pub fn compile_next(previous: &Output, inputs: &mut Inputs, controller_name: &str) -> Output {
    inputs.last_valid = previous.last_valid.clone();
    let mut out = compile(inputs);
    name_parents(&mut out, controller_name);
    out
}

/// Makes the compiler treat `controller_name`'s classes as its own and nothing else: the
/// compiler knows one name ([`CONTROLLER_NAME`]); several installs (and parallel tests) each
/// own their name.
pub fn own_classes(inputs: &mut Inputs, controller_name: &str) {
    if controller_name == CONTROLLER_NAME {
        return;
    }
    for c in &mut inputs.gateway_classes {
        c.spec.controller_name = if c.spec.controller_name == controller_name {
            CONTROLLER_NAME.to_owned()
        } else {
            format!("not-ours/{}", c.spec.controller_name)
        };
    }
}

/// Writes `controller_name` into every route parent entry of `out`.
pub fn name_parents(out: &mut Output, controller_name: &str) {
    for p in out.http_routes.values_mut().flat_map(|s| &mut s.parents) {
        p.set_controller_name(controller_name);
    }
    for p in out.grpc_routes.values_mut().flat_map(|s| &mut s.parents) {
        p.set_controller_name(controller_name);
    }
    for p in out.tls_routes.values_mut().flat_map(|s| &mut s.parents) {
        p.set_controller_name(controller_name);
    }
    for p in out.tcp_routes.values_mut().flat_map(|s| &mut s.parents) {
        p.set_controller_name(controller_name);
    }
    for p in out.udp_routes.values_mut().flat_map(|s| &mut s.parents) {
        p.set_controller_name(controller_name);
    }
}
