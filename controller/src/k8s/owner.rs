//! The Deployment this controller runs in, as an owner for what it creates in its own
//! namespace (the leader-election Lease, the push CA Secret), so that deleting the
//! Deployment (`helm uninstall`) garbage-collects them too.
//!
//! In: the pod's name and namespace (`POD_NAME`, `POD_NAMESPACE` from the downward API).
//! Out: an [`OwnerReference`] to the Deployment that owns the pod's ReplicaSet, or `None`
//! when there is none (run outside a cluster, a bare pod) or it cannot be read; that is
//! logged, never fatal: the objects are then simply not owned.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Api, Client};
use tracing::{info, warn};

/// The controlling owner of `refs` of `kind`, if any.
fn controller_of<'a>(refs: Option<&'a [OwnerReference]>, kind: &str) -> Option<&'a OwnerReference> {
    refs?
        .iter()
        .find(|r| r.kind == kind && r.controller == Some(true))
}

/// The Deployment that runs pod `namespace/pod` (through its ReplicaSet).
pub async fn own_deployment(client: &Client, namespace: &str, pod: &str) -> Option<OwnerReference> {
    let found = async {
        let p = Api::<Pod>::namespaced(client.clone(), namespace)
            .get_opt(pod)
            .await?;
        let Some(rs) = p
            .as_ref()
            .and_then(|p| controller_of(p.metadata.owner_references.as_deref(), "ReplicaSet"))
        else {
            return Ok(None);
        };
        let rs = Api::<ReplicaSet>::namespaced(client.clone(), namespace)
            .get_opt(&rs.name)
            .await?;
        Ok::<_, kube::Error>(rs.as_ref().and_then(|rs| {
            controller_of(rs.metadata.owner_references.as_deref(), "Deployment").map(|d| {
                OwnerReference {
                    api_version: "apps/v1".to_owned(),
                    kind: "Deployment".to_owned(),
                    name: d.name.clone(),
                    uid: d.uid.clone(),
                    controller: None,
                    block_owner_deletion: None,
                }
            })
        }))
    };
    match found.await {
        Ok(Some(owner)) => {
            info!(deployment = %owner.name, "the Lease and push CA Secret are owned by our Deployment");
            Some(owner)
        }
        Ok(None) => {
            info!(
                pod,
                "no Deployment owns this pod: the Lease and push CA Secret get no owner"
            );
            None
        }
        Err(e) => {
            warn!(pod, error = %e, "cannot read our pod or ReplicaSet: the Lease and push CA Secret get no owner");
            None
        }
    }
}

/// `refs` with `owner` added (by uid) when it is missing; `None` when nothing changes.
pub fn with_owner(
    refs: Option<&[OwnerReference]>,
    owner: &OwnerReference,
) -> Option<Vec<OwnerReference>> {
    let refs = refs.unwrap_or_default();
    if refs.iter().any(|r| r.uid == owner.uid) {
        return None;
    }
    let mut out = refs.to_vec();
    out.push(owner.clone());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(kind: &str, uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: format!("{kind}-{uid}"),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: None,
        }
    }

    #[test]
    fn the_controlling_owner_of_the_kind_is_found() {
        let refs = [r("ReplicaSet", "a", false), r("ReplicaSet", "b", true)];
        assert_eq!(
            controller_of(Some(&refs), "ReplicaSet").map(|o| o.uid.as_str()),
            Some("b")
        );
        assert!(controller_of(Some(&refs), "Deployment").is_none());
        assert!(controller_of(None, "ReplicaSet").is_none());
    }

    #[test]
    fn an_owner_is_added_once() {
        let d = r("Deployment", "d", false);
        let other = r("Deployment", "x", false);
        assert_eq!(with_owner(None, &d), Some(vec![d.clone()]));
        assert_eq!(
            with_owner(Some(std::slice::from_ref(&other)), &d),
            Some(vec![other.clone(), d.clone()])
        );
        assert_eq!(with_owner(Some(&[other, d.clone()]), &d), None);
    }
}
