//! ReferenceGrant checks.
//!
//! In: a cross-namespace reference (who refers, from which namespace, to what). Out: whether
//! a ReferenceGrant in the referent's namespace allows it. Same-namespace references never
//! need a grant.

use super::index::{Index, ns_of};

/// The Gateway API group.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// A reference from one object to another.
#[derive(Debug, Clone, Copy)]
pub struct CrossRef<'s> {
    /// Group of the referring object (e.g. `gateway.networking.k8s.io`).
    pub from_group: &'s str,
    /// Kind of the referring object (`Gateway`, `HTTPRoute`).
    pub from_kind: &'s str,
    /// Namespace of the referring object.
    pub from_namespace: &'s str,
    /// Group of the referent (`""` for core).
    pub to_group: &'s str,
    /// Kind of the referent (`Secret`, `Service`).
    pub to_kind: &'s str,
    /// Namespace of the referent.
    pub to_namespace: &'s str,
    /// Name of the referent.
    pub to_name: &'s str,
}

/// Whether `r` is allowed: same namespace, or a ReferenceGrant in the referent's namespace
/// lists the referrer in `from` and the referent in `to`.
pub fn permitted(idx: &Index<'_>, r: &CrossRef<'_>) -> bool {
    if r.from_namespace == r.to_namespace {
        return true;
    }
    let Some(grants) = idx.grants.get(r.to_namespace) else {
        return false;
    };
    grants.iter().any(|g| {
        debug_assert_eq!(ns_of(&g.metadata), r.to_namespace);
        let from_ok = g.spec.from.iter().any(|f| {
            f.group == r.from_group && f.kind == r.from_kind && f.namespace == r.from_namespace
        });
        let to_ok = g.spec.to.iter().any(|t| {
            core_group(&t.group) == core_group(r.to_group)
                && t.kind == r.to_kind
                && t.name.as_deref().is_none_or(|n| n == r.to_name)
        });
        from_ok && to_ok
    })
}

/// `core` and `""` both name the core group.
fn core_group(g: &str) -> &str {
    if g == "core" { "" } else { g }
}
