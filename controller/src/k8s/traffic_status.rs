//! XBackendTrafficPolicy status: what the status writer ([`super::status`]) does with
//! `status.ancestors`.
//!
//! In: the compiler's [`Output`] (`backend_traffic_policies`: ancestors only, as the Gateway
//! API's policy kinds carry them), the watched policies in the [`Stores`]. Out: a
//! [`StatusWrite::TrafficPolicy`] for each policy whose ancestor entries of ours differ from
//! the desired ones, the entries an Event compares, and the server-side apply of one
//! policy's `status.ancestors`.
//!
//! As for BackendTLSPolicy (module `backend_tls_status`), `status.ancestors` is an atomic list
//! shared with every implementation that reads the policy: we send the others' entries
//! unchanged followed by ours, with the live `resourceVersion` as a precondition, so a
//! concurrent write by another controller makes ours fail with 409 (retried from a fresher
//! store) instead of erasing theirs.

use gateway_types::experimental::xbackendtrafficpolicies::XBackendTrafficPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tollgate_api::ObjectKey;

use super::lenient::Lenient;
use super::status::{StatusWrite, keep_times, live, same};
use super::stores::Stores;
use crate::compile::Output;
use crate::crds::common::PolicyAncestorStatus;

/// The Kubernetes kind name.
pub const KIND: &str = "XBackendTrafficPolicy";
/// Its `apiVersion`.
pub const API_VERSION: &str = "gateway.networking.x-k8s.io/v1alpha1";

fn same_ancestor(a: &PolicyAncestorStatus, b: &PolicyAncestorStatus) -> bool {
    a.ancestor_ref == b.ancestor_ref
}

/// The live ancestor entries of `policy`: ours (read as [`PolicyAncestorStatus`]) and every
/// other controller's, kept as JSON so they go back exactly as they came.
fn live_ancestors(
    policy: &XBackendTrafficPolicy,
    controller_name: &str,
) -> (Vec<PolicyAncestorStatus>, Vec<serde_json::Value>) {
    let all = policy
        .status
        .as_ref()
        .and_then(|s| serde_json::to_value(&s.ancestors).ok())
        .and_then(|v| serde_json::from_value::<Vec<serde_json::Value>>(v).ok())
        .unwrap_or_default();
    let (ours, others): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|a| a.get("controllerName").and_then(|n| n.as_str()) == Some(controller_name));
    let ours = ours
        .into_iter()
        .filter_map(|a| serde_json::from_value(a).ok())
        .collect();
    (ours, others)
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
    for obj in stores.backend_traffic_policies.state() {
        let Lenient::Ok(policy) = obj.as_ref() else {
            continue;
        };
        let key = ObjectKey::new(
            policy.namespace().unwrap_or_default(),
            policy.name_any().as_str(),
        );
        let (live_ours, others) = live_ancestors(policy, controller_name);
        let desired = out
            .backend_traffic_policies
            .get(&key)
            .map(|s| s.ancestors.as_slice())
            .unwrap_or_default();
        if live_ours.is_empty() && desired.is_empty() {
            continue;
        }
        let mut ours = desired.to_vec();
        for a in &mut ours {
            a.controller_name = controller_name.to_owned();
            if let Some(old) = live_ours.iter().find(|l| same_ancestor(l, a)) {
                keep_times(&mut a.conditions, &old.conditions);
            }
        }
        if ours == live_ours || same(&ours, &live_ours) {
            continue;
        }
        let mut ancestors = others;
        ancestors.extend(ours.iter().filter_map(|a| serde_json::to_value(a).ok()));
        writes.push(StatusWrite::TrafficPolicy {
            key,
            resource_version: policy.resource_version().unwrap_or_default(),
            ancestors,
        });
    }
}

/// Feeds `diff` each ancestor entry of a write (those our type reads) with the live entry
/// it replaces.
pub(super) fn rejections(
    stores: &Stores,
    key: &ObjectKey,
    ancestors: &[serde_json::Value],
    diff: &mut impl FnMut(Option<String>, &[Condition], &[Condition]),
) {
    let parse =
        |a: &serde_json::Value| serde_json::from_value::<PolicyAncestorStatus>(a.clone()).ok();
    let r = ObjectRef::new(&key.name).within(&key.namespace);
    let old: Vec<PolicyAncestorStatus> = live(&stores.backend_traffic_policies, r)
        .and_then(|p| p.status)
        .and_then(|s| serde_json::to_value(&s.ancestors).ok())
        .and_then(|v| serde_json::from_value::<Vec<serde_json::Value>>(v).ok())
        .unwrap_or_default()
        .iter()
        .filter_map(parse)
        .collect();
    for a in ancestors.iter().filter_map(parse) {
        let o = old
            .iter()
            .find(|o| o.controller_name == a.controller_name && same_ancestor(o, &a));
        let oc = o.map(|o| o.conditions.as_slice()).unwrap_or_default();
        let r = &a.ancestor_ref;
        diff(
            Some(format!("ancestor {}/{}", r.namespace, r.name)),
            &a.conditions,
            oc,
        );
    }
}

/// Applies a policy's `status.ancestors` over `resource_version`.
pub(super) async fn apply(
    client: &Client,
    pp: &PatchParams,
    key: &ObjectKey,
    resource_version: &str,
    ancestors: &[serde_json::Value],
) -> Result<(), kube::Error> {
    let body = json!({
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": key.name, "namespace": key.namespace,
                     "resourceVersion": resource_version},
        "status": {"ancestors": ancestors},
    });
    Api::<XBackendTrafficPolicy>::namespaced(client.clone(), &key.namespace)
        .patch_status(&key.name, pp, &Patch::Apply(body))
        .await?;
    Ok(())
}
