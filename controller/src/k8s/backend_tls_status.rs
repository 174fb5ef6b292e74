//! BackendTLSPolicy status: what the status writer ([`super::status`]) does with
//! `status.ancestors`.
//!
//! In: the compiler's [`Output`] (`backend_tls_policies`), the watched policies in the
//! [`Stores`]. Out: a [`StatusWrite::BackendTlsPolicy`] for each policy whose ancestor entries
//! of ours differ from the desired ones, the entries an Event compares, and the server-side
//! apply of one policy's `status.ancestors`.
//!
//! `status.ancestors` is an atomic list shared with every other implementation that reads the
//! policy (a Service may sit behind Gateways of several controllers): as for route parents, we
//! send the others' entries unchanged followed by ours, with the live `resourceVersion` as a
//! precondition, so a concurrent write by another controller makes ours fail with 409
//! (retried from a fresher store) instead of erasing theirs. Our entries for Gateways that no
//! longer use the policy's targets are dropped.

use gateway_types::backendtlspolicies::{BackendTlsPolicy, BackendTlsPolicyStatusAncestors};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tollgate_api::ObjectKey;

use super::lenient::Lenient;
use super::status::{API_VERSION, StatusWrite, keep_times, live, same};
use super::stores::Stores;
use crate::compile::Output;

/// The Kubernetes kind name.
pub const KIND: &str = "BackendTLSPolicy";

fn same_ancestor(a: &BackendTlsPolicyStatusAncestors, b: &BackendTlsPolicyStatusAncestors) -> bool {
    let (x, y) = (&a.ancestor_ref, &b.ancestor_ref);
    x.name == y.name
        && x.namespace == y.namespace
        && x.kind.as_deref().unwrap_or("Gateway") == y.kind.as_deref().unwrap_or("Gateway")
        && x.section_name == y.section_name
        && x.port == y.port
}

/// The writes of every policy whose entries of ours differ from the desired ones. The
/// compiler names its entries [`crate::compile::CONTROLLER_NAME`]; they are written as
/// `controller_name`.
pub(super) fn plan(
    out: &Output,
    stores: &Stores,
    controller_name: &str,
    writes: &mut Vec<StatusWrite>,
) {
    for obj in stores.backend_tls_policies.state() {
        let Lenient::Ok(policy) = obj.as_ref() else {
            continue;
        };
        let key = ObjectKey::new(
            policy.namespace().unwrap_or_default(),
            policy.name_any().as_str(),
        );
        let live_all = policy
            .status
            .as_ref()
            .map(|s| s.ancestors.as_slice())
            .unwrap_or_default();
        let live_ours: Vec<&BackendTlsPolicyStatusAncestors> = live_all
            .iter()
            .filter(|a| a.controller_name == controller_name)
            .collect();
        let desired = out
            .backend_tls_policies
            .get(&key)
            .map(|s| s.ancestors.as_slice())
            .unwrap_or_default();
        if live_ours.is_empty() && desired.is_empty() {
            continue;
        }
        let mut ours: Vec<BackendTlsPolicyStatusAncestors> = desired.to_vec();
        for a in &mut ours {
            a.controller_name = controller_name.to_owned();
            if let Some(old) = live_ours.iter().find(|l| same_ancestor(l, a)) {
                keep_times(&mut a.conditions, &old.conditions);
            }
        }
        let equal =
            ours.len() == live_ours.len() && ours.iter().zip(&live_ours).all(|(a, b)| a == *b);
        if equal || same(&ours, &live_ours) {
            continue;
        }
        let mut ancestors: Vec<BackendTlsPolicyStatusAncestors> = live_all
            .iter()
            .filter(|a| a.controller_name != controller_name)
            .cloned()
            .collect();
        ancestors.extend(ours);
        writes.push(StatusWrite::BackendTlsPolicy {
            key,
            resource_version: policy.resource_version().unwrap_or_default(),
            ancestors,
        });
    }
}

/// Feeds `diff` each ancestor entry of a write with the live entry it replaces.
pub(super) fn rejections(
    stores: &Stores,
    key: &ObjectKey,
    ancestors: &[BackendTlsPolicyStatusAncestors],
    diff: &mut impl FnMut(Option<String>, &[Condition], &[Condition]),
) {
    let r = ObjectRef::new(&key.name).within(&key.namespace);
    let live = live(&stores.backend_tls_policies, r);
    let old = live
        .as_ref()
        .and_then(|p| p.status.as_ref())
        .map(|s| s.ancestors.as_slice())
        .unwrap_or_default();
    for a in ancestors {
        let o = old
            .iter()
            .find(|o| o.controller_name == a.controller_name && same_ancestor(o, a));
        let oc = o.map(|o| o.conditions.as_slice()).unwrap_or_default();
        let part = format!(
            "ancestor {}/{}",
            a.ancestor_ref
                .namespace
                .as_deref()
                .unwrap_or(&key.namespace),
            a.ancestor_ref.name
        );
        diff(Some(part), &a.conditions, oc);
    }
}

/// Applies a policy's `status.ancestors` over `resource_version`.
pub(super) async fn apply(
    client: &Client,
    pp: &PatchParams,
    key: &ObjectKey,
    resource_version: &str,
    ancestors: &[BackendTlsPolicyStatusAncestors],
) -> Result<(), kube::Error> {
    let body = json!({
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": key.name, "namespace": key.namespace,
                     "resourceVersion": resource_version},
        "status": {"ancestors": ancestors},
    });
    Api::<BackendTlsPolicy>::namespaced(client.clone(), &key.namespace)
        .patch_status(&key.name, pp, &Patch::Apply(body))
        .await?;
    Ok(())
}
