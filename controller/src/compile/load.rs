//! Loading compiler inputs from YAML manifests.
//!
//! In: a multi-document YAML string (what `kubectl apply -f` takes, `kind: List` included).
//! Out: [`Inputs`] with every object of a kind the compiler reads, and in
//! [`Inputs::warnings`] a [`LoadWarning`] for each document of another kind (skipped). A document that is not YAML, or a known kind whose
//! fields do not fit the typed struct, is a [`LoadError`] naming the document index and kind.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;
use serde_yaml_ng::Value;

use super::Inputs;

/// Why a manifest could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The text is not valid YAML.
    #[error("document {index}: invalid YAML: {source}")]
    Yaml {
        /// 0-based document index.
        index: usize,
        /// Parser error.
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// A document is not a mapping with `apiVersion` and `kind`.
    #[error("document {index}: {message}")]
    NotAnObject {
        /// 0-based document index.
        index: usize,
        /// What is missing.
        message: String,
    },
    /// A known kind whose fields do not match its schema.
    #[error("document {index} ({kind} {name}): {source}")]
    Invalid {
        /// 0-based document index.
        index: usize,
        /// `kind`.
        kind: String,
        /// `metadata.name`, when present.
        name: String,
        /// Deserialization error.
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// An object its CRD's schema refuses, as the API server would
    /// ([`check_schemas`]).
    #[error("document {index} ({kind} {name}): {violations}")]
    Schema {
        /// 0-based document index.
        index: usize,
        /// `kind`.
        kind: String,
        /// `metadata.name`, when present.
        name: String,
        /// What the schema refuses.
        violations: Violations,
    },
}

/// The [`Violation`](crate::schema::Violation)s of one object, shown `; `-separated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violations(pub Vec<crate::schema::Violation>);

impl std::fmt::Display for Violations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{v}")?;
        }
        Ok(())
    }
}

/// Checks one object of a group Tollgate reads against its CRD's schema
/// ([`crate::schema`]), as the API server would. Objects of other groups (core, apps) are
/// left to the API server.
fn check_schema(
    schemas: &crate::schema::Schemas,
    index: usize,
    value: &Value,
) -> Result<(), LoadError> {
    let Ok(obj) = serde_json::to_value(value) else {
        // Not representable in JSON (a non-string key): the typed parse reports it.
        return Ok(());
    };
    let Some(violations) = schemas.check(&obj).filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    Err(LoadError::Schema {
        index,
        kind: obj["kind"].as_str().unwrap_or_default().to_owned(),
        name: obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        violations: Violations(violations),
    })
}

/// A document that was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadWarning {
    /// 0-based document index.
    pub index: usize,
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `metadata.name`, when present.
    pub name: String,
}

impl std::fmt::Display for LoadWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "document {}: skipped {} {} ({}): not read by the compiler",
            self.index, self.kind, self.name, self.api_version
        )
    }
}

/// Parses multi-document YAML into [`Inputs`] stamped with `now`; skipped documents are
/// listed in [`Inputs::warnings`].
pub fn inputs_from_yaml(docs: &str, now: Time) -> Result<Inputs, LoadError> {
    load(docs, now, None)
}

/// [`inputs_from_yaml`], refusing as the API server would every object its CRD's schema
/// refuses ([`LoadError::Schema`]): what `tollgate run` and `tollgate validate` read.
pub fn inputs_from_manifests(docs: &str, now: Time) -> Result<Inputs, LoadError> {
    load(docs, now, Some(&crate::schema::Schemas::shared()))
}

fn load(
    docs: &str,
    now: Time,
    schemas: Option<&crate::schema::Schemas>,
) -> Result<Inputs, LoadError> {
    let mut loaded = Inputs::new(now);
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(docs).enumerate() {
        let value = Value::deserialize(doc).map_err(|source| LoadError::Yaml { index, source })?;
        add(&mut loaded, index, value, schemas)?;
    }
    Ok(loaded)
}

fn str_field<'v>(v: &'v Value, path: &[&str]) -> Option<&'v str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

fn add(
    loaded: &mut Inputs,
    index: usize,
    value: Value,
    schemas: Option<&crate::schema::Schemas>,
) -> Result<(), LoadError> {
    if value.is_null() {
        return Ok(()); // empty document (`---` at the end)
    }
    if !value.is_mapping() {
        return Err(LoadError::NotAnObject {
            index,
            message: "not a mapping".to_owned(),
        });
    }
    let (Some(api_version), Some(kind)) = (
        str_field(&value, &["apiVersion"]),
        str_field(&value, &["kind"]),
    ) else {
        return Err(LoadError::NotAnObject {
            index,
            message: "missing apiVersion or kind".to_owned(),
        });
    };
    let (api_version, kind) = (api_version.to_owned(), kind.to_owned());
    let name = str_field(&value, &["metadata", "name"])
        .unwrap_or_default()
        .to_owned();
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);

    macro_rules! push {
        ($field:ident) => {{
            let obj = serde_yaml_ng::from_value(value).map_err(|source| LoadError::Invalid {
                index,
                kind: kind.clone(),
                name: name.clone(),
                source,
            })?;
            loaded.$field.push(obj);
        }};
    }
    if let Some(schemas) = schemas
        && crate::schema::GROUPS.contains(&group)
    {
        check_schema(schemas, index, &value)?;
    }
    match (group, kind.as_str()) {
        ("", "List") => {
            if let Some(items) = value.get("items").and_then(Value::as_sequence) {
                for item in items.clone() {
                    add(loaded, index, item, schemas)?;
                }
            }
        }
        ("gateway.networking.k8s.io", "GatewayClass") => push!(gateway_classes),
        ("gateway.networking.k8s.io", "Gateway") => push!(gateways),
        ("gateway.networking.k8s.io", "HTTPRoute") => push!(http_routes),
        ("gateway.networking.k8s.io", "GRPCRoute") => push!(grpc_routes),
        ("gateway.networking.k8s.io", "TLSRoute") => push!(tls_routes),
        ("gateway.networking.k8s.io", "TCPRoute") => push!(tcp_routes),
        ("gateway.networking.k8s.io", "UDPRoute") => push!(udp_routes),
        ("gateway.networking.k8s.io", "ListenerSet") => push!(listener_sets),
        ("gateway.networking.k8s.io", "ReferenceGrant") => push!(reference_grants),
        ("gateway.networking.k8s.io", "BackendTLSPolicy") => push!(backend_tls_policies),
        ("tollgate.dev", "RateLimitPolicy") => push!(rate_limit_policies),
        ("tollgate.dev", "AuthPolicy") => push!(auth_policies),
        ("tollgate.dev", "ClientPolicy") => push!(client_policies),
        ("tollgate.dev", "BackendPolicy") => push!(backend_policies),
        ("tollgate.dev", "CachePolicy") => push!(cache_policies),
        ("tollgate.dev", "GatewayParameters") => push!(gateway_parameters),
        ("gateway.networking.x-k8s.io", "XBackendTrafficPolicy") => {
            push!(backend_traffic_policies)
        }
        ("", "Service") => push!(services),
        ("", "Secret") => push!(secrets),
        ("", "ConfigMap") => push!(config_maps),
        ("", "Namespace") => push!(namespaces),
        ("discovery.k8s.io", "EndpointSlice") => push!(endpoint_slices),
        _ => loaded.warnings.push(LoadWarning {
            index,
            api_version,
            kind,
            name,
        }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn dispatches_by_kind_and_warns_on_unknown() {
        let yaml = r"
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: g, namespace: a}
spec: {from: [], to: []}
---
";
        let l = inputs_from_yaml(yaml, now()).unwrap();
        assert_eq!(l.namespaces.len(), 1);
        assert_eq!(l.reference_grants.len(), 1);
        assert_eq!(l.warnings.len(), 1);
        assert_eq!(l.warnings[0].index, 1);
        assert_eq!(l.warnings[0].kind, "Deployment");
    }

    #[test]
    fn lists_are_flattened() {
        let yaml = r"
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Namespace, metadata: {name: a}}
- {apiVersion: v1, kind: Service, metadata: {name: s, namespace: a}, spec: {ports: [{port: 80}]}}
";
        let l = inputs_from_yaml(yaml, now()).unwrap();
        assert_eq!((l.namespaces.len(), l.services.len()), (1, 1));
    }

    #[test]
    fn not_yaml_and_not_objects() {
        let e = inputs_from_yaml("a: [", now()).unwrap_err();
        assert!(matches!(e, LoadError::Yaml { index: 0, .. }), "{e}");
        let e = inputs_from_yaml("---\n- 1\n", now()).unwrap_err();
        assert!(matches!(e, LoadError::NotAnObject { index: 0, .. }), "{e}");
        let e = inputs_from_yaml("kind: Service\n", now()).unwrap_err();
        assert!(e.to_string().contains("missing apiVersion or kind"), "{e}");
    }

    #[test]
    fn names_the_bad_document() {
        let yaml = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw}\nspec: {listeners: 3}\n";
        let e = inputs_from_yaml(yaml, now()).unwrap_err();
        match &e {
            LoadError::Invalid {
                index, kind, name, ..
            } => {
                assert_eq!((*index, kind.as_str(), name.as_str()), (1, "Gateway", "gw"));
            }
            other => panic!("unexpected {other}"),
        }
        assert!(e.to_string().starts_with("document 1 (Gateway gw)"), "{e}");
    }
}
