//! ListenerSets: listeners another namespace (or team) contributes to a Gateway.
//!
//! In: every ListenerSet. Out: per parent Gateway, its ListenerSets in precedence order
//! (oldest `creationTimestamp` first, then namespace/name), each with its listeners as Gateway
//! listeners so [`super::listeners`] validates both alike. A ListenerSet listener keeps its own
//! name for `sectionName` and status, but the listener it becomes is named
//! `<namespace>/<set>/<name>`: a Gateway listener name cannot hold `/`, so route tables,
//! policies' `sectionName` and metrics never mix the two up.
//!
//! [`super::listeners::compile_gateway`] decides the rest: whether the Gateway's
//! `allowedListeners` admits a ListenerSet (`NotAllowed`), conflicts (the Gateway's own
//! listeners first, then ListenerSets in precedence order: a later listener on a port another
//! one already holds with another protocol is `ProtocolConflict`, with the same hostname
//! `HostnameConflict`), and the statuses.

use std::collections::BTreeMap;

use gateway_types::gateways::GatewayListeners;
use gateway_types::listenersets::{ListenerSet, ListenerSetListeners};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tollgate_api::ObjectKey;

use super::grants::GATEWAY_GROUP;
use super::index::{by_key, key_of, ns_of};
use crate::compile::Objects;

/// The kind routes name in a parentRef, and ReferenceGrants in `from`.
pub const KIND: &str = "ListenerSet";

/// One ListenerSet whose parentRef names a Gateway.
#[derive(Debug)]
pub struct ListenerSetEntry<'a> {
    /// The ListenerSet.
    pub set: &'a ListenerSet,
    /// Its key.
    pub key: ObjectKey,
    /// Its listeners as Gateway listeners, named `<namespace>/<set>/<name>` (see the module
    /// docs), in spec order.
    pub listeners: Vec<GatewayListeners>,
}

impl ListenerSetEntry<'_> {
    /// The name a listener of this set has in its spec (what `sectionName` names).
    pub fn own_name(&self, i: usize) -> &str {
        self.set
            .spec
            .listeners
            .get(i)
            .map_or("", |l| l.name.as_str())
    }
}

/// ListenerSets by the key of the Gateway they name, each list in precedence order.
pub fn by_parent(sets: &Objects<ListenerSet>) -> BTreeMap<ObjectKey, Vec<ListenerSetEntry<'_>>> {
    let mut out: BTreeMap<ObjectKey, Vec<ListenerSetEntry<'_>>> = BTreeMap::new();
    // The same ListenerSet in two files is kept once, as every kind is.
    for set in by_key(sets, |s| &s.metadata) {
        let p = &set.spec.parent_ref;
        if p.group.as_deref().unwrap_or(GATEWAY_GROUP) != GATEWAY_GROUP
            || p.kind.as_deref().unwrap_or("Gateway") != "Gateway"
        {
            continue;
        }
        let ns = ns_of(&set.metadata);
        let parent = ObjectKey::new(p.namespace.as_deref().unwrap_or(ns), p.name.as_str());
        let key = key_of(&set.metadata);
        let listeners = set
            .spec
            .listeners
            .iter()
            .map(|l| as_gateway_listener(&key, l))
            .collect();
        out.entry(parent).or_default().push(ListenerSetEntry {
            set,
            key,
            listeners,
        });
    }
    for list in out.values_mut() {
        list.sort_by(|a, b| {
            created(a.set)
                .cmp(&created(b.set))
                .then_with(|| a.key.cmp(&b.key))
        });
    }
    out
}

/// Creation time, `None` (files) before any time: files carry none, so their ListenerSets
/// fall back to namespace/name order.
fn created(set: &ListenerSet) -> Option<&Time> {
    set.metadata.creation_timestamp.as_ref()
}

/// `l` as a Gateway listener named `<namespace>/<set>/<name>`. The two schemas are the same
/// (the Gateway API defines ListenerEntry as Listener without hostname defaults); a listener
/// that does not convert keeps name, port and protocol, and its protocol then says why.
fn as_gateway_listener(set: &ObjectKey, l: &ListenerSetListeners) -> GatewayListeners {
    let name = format!("{}/{}/{}", set.namespace, set.name, l.name);
    match serde_json::to_value(l).and_then(serde_json::from_value::<GatewayListeners>) {
        Ok(mut g) => {
            g.name = name;
            g
        }
        Err(e) => GatewayListeners {
            name,
            port: l.port,
            protocol: format!("{} (unreadable listener: {e})", l.protocol),
            ..GatewayListeners::default()
        },
    }
}
