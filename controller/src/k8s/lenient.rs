//! Per-object deserialization, so one malformed object never stalls a watch.
//!
//! In: the JSON of one object as the API server sends it (in a list or a watch event). Out:
//! [`Lenient::Ok`] with the typed object, or [`Lenient::Malformed`] with its metadata and the
//! serde error. kube's watcher fails a whole list page when one typed item does not
//! deserialize (and retries it forever); wrapping the type makes the item's failure its own.

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// The annotation `kubectl apply` (client-side) stores the whole object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A watched object that may have failed to deserialize into `K`.
#[derive(Debug, Clone)]
pub enum Lenient<K> {
    /// The typed object, shared: the compiler's snapshot of the stores holds it too, so a
    /// snapshot copies a pointer per object.
    Ok(Arc<K>),
    /// The object did not fit `K`: only its metadata is kept.
    Malformed {
        /// Metadata (default when even that does not parse); boxed, so that the common case,
        /// a pointer, does not pay for the rare one's size.
        metadata: Box<ObjectMeta>,
        /// The deserialization error.
        error: String,
    },
}

impl<K: DeserializeOwned> Lenient<K> {
    /// Converts one object's JSON.
    pub fn from_value(value: serde_json::Value) -> Self {
        match K::deserialize(&value) {
            Ok(k) => Self::Ok(Arc::new(k)),
            Err(e) => Self::Malformed {
                metadata: value
                    .get("metadata")
                    .and_then(|m| ObjectMeta::deserialize(m).ok())
                    .unwrap_or_default()
                    .into(),
                error: e.to_string(),
            },
        }
    }
}

impl<K> Lenient<K> {
    /// The typed object, if it deserialized.
    pub fn as_ok(&self) -> Option<&K> {
        match self {
            Self::Ok(k) => Some(k),
            Self::Malformed { .. } => None,
        }
    }

    /// The typed object, shared, if it deserialized.
    pub fn shared(&self) -> Option<&Arc<K>> {
        match self {
            Self::Ok(k) => Some(k),
            Self::Malformed { .. } => None,
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone> Lenient<K> {
    /// Drops what the controller never reads and that can be large: `managedFields` and the
    /// client-side-apply annotation.
    pub fn strip(&mut self) {
        let meta = self.meta_mut();
        // Keep who manages the status subresource (the small status field sets only): the
        // status writer releases a status it owned once the object is no longer ours.
        meta.managed_fields = meta
            .managed_fields
            .take()
            .map(|entries| {
                entries
                    .into_iter()
                    .filter(|e| e.subresource.as_deref() == Some("status"))
                    .collect::<Vec<_>>()
            })
            .filter(|v| !v.is_empty());
        if let Some(a) = meta.annotations.as_mut() {
            a.remove(LAST_APPLIED);
            if a.is_empty() {
                meta.annotations = None;
            }
        }
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Only invalid JSON fails here; a well-formed object that does not fit `K` does not.
        let value = serde_json::Value::deserialize(d)?;
        Ok(Self::from_value(value))
    }
}

impl<K: Resource<DynamicType = ()> + Clone> Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Ok(k) => k.meta(),
            Self::Malformed { metadata, .. } => metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            // Unshared while the watch strips it (the only writer): no copy there.
            Self::Ok(k) => Arc::make_mut(k).meta_mut(),
            Self::Malformed { metadata, .. } => metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use gateway_types::experimental::httproutes::HttpRoute;
    use k8s_openapi::api::core::v1::Service;
    use kube::core::ObjectList;
    use serde_json::json;

    fn route(name: &str, spec: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": "ns", "managedFields": [{"manager": "x"}],
                         "annotations": {LAST_APPLIED: "{}", "keep": "me"}},
            "spec": spec,
        })
    }

    #[test]
    fn a_malformed_item_does_not_fail_its_list() {
        let list = json!({
            "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "7"},
            "items": [
                route("good", json!({"parentRefs": [{"name": "gw"}]})),
                route("bad", json!({"parentRefs": "not-a-list"})),
            ],
        });
        let list: ObjectList<Lenient<HttpRoute>> = serde_json::from_value(list).unwrap();
        assert_eq!(list.items.len(), 2);
        assert!(list.items[0].as_ok().is_some());
        match &list.items[1] {
            Lenient::Malformed { metadata, error } => {
                assert_eq!(metadata.name.as_deref(), Some("bad"));
                assert!(error.contains("invalid type"), "{error}");
            }
            Lenient::Ok(_) => panic!("bad route parsed"),
        }
    }

    #[test]
    fn metadata_is_kept_and_stripped_of_bulk() {
        let mut r: Lenient<HttpRoute> = Lenient::from_value(route("a", json!({"rules": 5})));
        r.strip();
        assert_eq!(r.meta().name.as_deref(), Some("a"));
        assert!(r.meta().managed_fields.is_none());
        let ann = r.meta().annotations.clone().unwrap();
        assert_eq!(ann.len(), 1);
        assert_eq!(ann["keep"], "me");
        let mut ok: Lenient<HttpRoute> = Lenient::from_value(route("b", json!({})));
        ok.strip();
        assert!(ok.as_ok().is_some());
        assert!(ok.meta().managed_fields.is_none());
    }

    #[test]
    fn no_metadata_at_all_is_still_an_item() {
        let s: Lenient<Service> = Lenient::from_value(json!({"spec": {"ports": 3}}));
        assert!(matches!(s, Lenient::Malformed { ref metadata, .. } if metadata.name.is_none()));
        assert_eq!(<Lenient<Service> as Resource>::plural(&()), "services");
    }
}
