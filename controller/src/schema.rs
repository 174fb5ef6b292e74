//! The API server's verdict, offline: objects checked against their CRD's schema.
//!
//! In: one object (JSON) of a kind in a group Tollgate reads (`gateway.networking.k8s.io`,
//! `gateway.networking.x-k8s.io`, `tollgate.dev`). Out: the [`Violation`]s the API server would
//! answer `kubectl apply --validate=strict` with: no CRD for the kind or version, unknown
//! fields, wrong types, enums, patterns, lengths, counts, bounds, required fields, and the
//! CRDs' CEL `x-kubernetes-validations` rules. As the API server does, defaults are applied
//! first, then the value is checked; `metadata` and `status` are not checked.
//!
//! The schemas are the Gateway API CRDs `tollgate-gateway-types` ships (the release
//! `e2e/k8s/gateway-api` pins) and Tollgate's own `crds/`. Three kinds of rule are not
//! evaluated: transition rules (they name `oldSelf`; an offline object has no old version),
//! rules whose functions the CEL library here lacks (`duration`, `format`), and rules that fail
//! to evaluate; each is skipped, never reported, so a valid object is never refused here.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use serde_json::{Map, Value};

/// Groups whose kinds are checked; an unknown kind in one of them is a [`Violation`].
pub const GROUPS: &[&str] = &[
    "gateway.networking.k8s.io",
    "gateway.networking.x-k8s.io",
    "tollgate.dev",
];

/// Tollgate's own CRDs.
const OWN_CRDS: &[&str] = &[
    include_str!("../../crds/authpolicies.tollgate.dev.yaml"),
    include_str!("../../crds/backendpolicies.tollgate.dev.yaml"),
    include_str!("../../crds/cachepolicies.tollgate.dev.yaml"),
    include_str!("../../crds/clientpolicies.tollgate.dev.yaml"),
    include_str!("../../crds/gatewayparameters.tollgate.dev.yaml"),
    include_str!("../../crds/ratelimitpolicies.tollgate.dev.yaml"),
];

/// One thing the API server would refuse, as it words it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// Field path (`spec.rules[0].matches[0].path.type`); empty for the whole object.
    pub path: String,
    /// What is wrong (`Unsupported value: "Foo": supported values: "Exact", "PathPrefix"`).
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// A compiled CEL rule of a schema node.
struct Rule {
    program: Option<cel::Program>,
    message: String,
    field_path: Option<String>,
}

/// One node of a structural schema, with what checking a value needs.
#[derive(Default)]
struct Node {
    ty: Option<String>,
    int_or_string: bool,
    preserve_unknown: bool,
    nullable: bool,
    properties: BTreeMap<String, Node>,
    additional: Option<Box<Node>>,
    items: Option<Box<Node>>,
    required: Vec<String>,
    enumeration: Option<Vec<Value>>,
    pattern: Option<(String, regex::Regex)>,
    max_length: Option<u64>,
    min_length: Option<u64>,
    max_items: Option<u64>,
    min_items: Option<u64>,
    max_properties: Option<u64>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: bool,
    exclusive_maximum: bool,
    default: Option<Value>,
    list_map_keys: Vec<String>,
    list_set: bool,
    rules: Vec<Rule>,
}

/// One served version of a kind.
struct Version {
    served: bool,
    schema: Node,
}

/// What a CRD defines: its versions by name.
struct Crd {
    versions: BTreeMap<String, Version>,
}

/// Every CRD a check can use, by (group, kind).
pub struct Schemas {
    crds: BTreeMap<(String, String), Crd>,
}

impl Schemas {
    /// The schemas built into this binary, built when no caller holds them: they are about
    /// 8 MB compiled, which `tollgate run` needs only while it parses a changed file, so they
    /// are dropped with the last holder and built again (tens of milliseconds) when next
    /// needed. Hold the result across a batch of checks.
    pub fn shared() -> Arc<Self> {
        static SCHEMAS: Mutex<Weak<Schemas>> = Mutex::new(Weak::new());
        let mut held = SCHEMAS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = held.upgrade() {
            return s;
        }
        let s = Arc::new(Self::from_yaml(
            gateway_types::CRDS.iter().chain(OWN_CRDS).copied(),
        ));
        *held = Arc::downgrade(&s);
        s
    }

    /// Schemas from CRD documents; documents that are no CRD are ignored.
    fn from_yaml<'s>(texts: impl Iterator<Item = &'s str>) -> Self {
        let mut crds = BTreeMap::new();
        for text in texts {
            let Ok(doc) = serde_yaml_ng::from_str::<Value>(text) else {
                continue;
            };
            let spec = &doc["spec"];
            let (Some(group), Some(kind)) =
                (spec["group"].as_str(), spec["names"]["kind"].as_str())
            else {
                continue;
            };
            let versions = spec["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| {
                    let name = v["name"].as_str()?.to_owned();
                    let schema = node(&v["schema"]["openAPIV3Schema"]);
                    let served = v["served"].as_bool().unwrap_or(false);
                    Some((name, Version { served, schema }))
                })
                .collect();
            crds.insert((group.to_owned(), kind.to_owned()), Crd { versions });
        }
        Self { crds }
    }

    /// Checks `obj` as the API server would on create. `None` when its group is not one of
    /// [`GROUPS`] (nothing to check it against).
    pub fn check(&self, obj: &Value) -> Option<Vec<Violation>> {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        if !GROUPS.contains(&group) {
            return None;
        }
        let no_kind = || {
            vec![Violation {
                path: String::new(),
                message: format!("no matches for kind \"{kind}\" in version \"{api_version}\""),
            }]
        };
        let Some(crd) = self.crds.get(&(group.to_owned(), kind.to_owned())) else {
            return Some(no_kind());
        };
        let Some(v) = crd.versions.get(version).filter(|v| v.served) else {
            return Some(no_kind());
        };
        let mut value = obj.clone();
        if let Some(m) = value.as_object_mut() {
            // What the API server manages itself.
            m.remove("status");
        }
        default(&v.schema, &mut value);
        let mut out = Vec::new();
        let mut path = String::new();
        walk(&v.schema, &value, &mut path, &mut out, true);
        out.sort();
        out.dedup();
        Some(out)
    }
}

/// Builds a node from its OpenAPI v3 schema.
fn node(s: &Value) -> Node {
    let u = |k: &str| s[k].as_u64();
    let properties = s["properties"]
        .as_object()
        .map(|p| p.iter().map(|(k, v)| (k.clone(), node(v))).collect())
        .unwrap_or_default();
    let rules = s["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let source = r["rule"].as_str()?.to_owned();
            let program = if source.contains("oldSelf") {
                None
            } else {
                cel::Program::compile(&source).ok()
            };
            let message = r["message"]
                .as_str()
                .map_or_else(|| format!("failed rule: {source}"), str::to_owned);
            let field_path = r["fieldPath"].as_str().map(str::to_owned);
            Some(Rule {
                program,
                message,
                field_path,
            })
        })
        .collect();
    Node {
        ty: s["type"].as_str().map(str::to_owned),
        int_or_string: s["x-kubernetes-int-or-string"].as_bool() == Some(true),
        preserve_unknown: s["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true),
        nullable: s["nullable"].as_bool() == Some(true),
        properties,
        additional: s["additionalProperties"]
            .is_object()
            .then(|| Box::new(node(&s["additionalProperties"]))),
        items: s["items"].is_object().then(|| Box::new(node(&s["items"]))),
        required: s["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str().map(str::to_owned))
            .collect(),
        enumeration: s["enum"].as_array().cloned(),
        pattern: s["pattern"]
            .as_str()
            .and_then(|p| regex::Regex::new(p).ok().map(|re| (p.to_owned(), re))),
        max_length: u("maxLength"),
        min_length: u("minLength"),
        max_items: u("maxItems"),
        min_items: u("minItems"),
        max_properties: u("maxProperties"),
        minimum: s["minimum"].as_f64(),
        maximum: s["maximum"].as_f64(),
        exclusive_minimum: s["exclusiveMinimum"].as_bool() == Some(true),
        exclusive_maximum: s["exclusiveMaximum"].as_bool() == Some(true),
        default: s.get("default").cloned(),
        list_map_keys: s["x-kubernetes-list-map-keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect(),
        list_set: s["x-kubernetes-list-type"].as_str() == Some("set"),
        rules,
    }
}

/// Fills in the schema's defaults, as the API server does before validating.
fn default(n: &Node, v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, child) in &n.properties {
                if !m.contains_key(k)
                    && let Some(d) = &child.default
                {
                    m.insert(k.clone(), d.clone());
                }
                if let Some(cv) = m.get_mut(k) {
                    default(child, cv);
                }
            }
            if let Some(a) = &n.additional {
                for cv in m.values_mut() {
                    default(a, cv);
                }
            }
        }
        Value::Array(items) => {
            if let Some(i) = &n.items {
                for cv in items {
                    default(i, cv);
                }
            }
        }
        _ => {}
    }
}

/// The JSON type name the API server uses in messages.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `v` as the API server quotes it in an `Invalid value` message.
fn shown(v: &Value) -> String {
    match v {
        Value::Object(_) => "\"object\"".to_owned(),
        Value::Array(_) => "\"array\"".to_owned(),
        other => other.to_string(),
    }
}

fn push(out: &mut Vec<Violation>, path: &str, message: String) {
    out.push(Violation {
        path: path.to_owned(),
        message,
    });
}

/// Checks `v` against `n` at `path` (a buffer, restored on return), pushing violations.
fn walk(n: &Node, v: &Value, path: &mut String, out: &mut Vec<Violation>, root: bool) {
    if v.is_null() && (n.nullable || root) {
        return;
    }
    let t = type_of(v);
    let type_ok = match n.ty.as_deref() {
        _ if n.int_or_string => matches!(t, "integer" | "string"),
        None => true,
        Some("number") => matches!(t, "integer" | "number"),
        Some(want) => want == t,
    };
    if !type_ok {
        let want = n.ty.as_deref().unwrap_or("integer or string");
        let at = if path.is_empty() {
            "body"
        } else {
            path.as_str()
        };
        let message =
            format!("Invalid value: \"{t}\": {at} in body must be of type {want}: \"{t}\"");
        push(out, path, message);
        return;
    }
    if let Some(allowed) = &n.enumeration
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        push(
            out,
            path,
            format!(
                "Unsupported value: {}: supported values: {}",
                v,
                list.join(", ")
            ),
        );
    }
    match v {
        Value::String(s) => string_checks(n, s, v, path, out),
        Value::Number(num) => {
            if let Some(x) = num.as_f64() {
                number_checks(n, x, v, path, out);
            }
        }
        Value::Array(items) => array_checks(n, items, path, out),
        Value::Object(m) => object_checks(n, m, path, out, root),
        _ => {}
    }
    rule_checks(n, v, path, out);
}

fn string_checks(n: &Node, s: &str, v: &Value, path: &str, out: &mut Vec<Violation>) {
    let chars = s.chars().count() as u64;
    if let Some(max) = n.max_length
        && chars > max
    {
        push(
            out,
            path,
            format!("Too long: may not be more than {max} bytes"),
        );
    }
    if let Some(min) = n.min_length
        && chars < min
    {
        push(
            out,
            path,
            format!("Invalid value: {v}: {path} in body should be at least {min} chars long"),
        );
    }
    if let Some((p, re)) = &n.pattern
        && !re.is_match(s)
    {
        push(
            out,
            path,
            format!("Invalid value: {v}: {path} in body should match '{p}'"),
        );
    }
}

fn number_checks(n: &Node, x: f64, v: &Value, path: &str, out: &mut Vec<Violation>) {
    if let Some(min) = n.minimum {
        let low = if n.exclusive_minimum {
            x <= min
        } else {
            x < min
        };
        if low {
            let how = if n.exclusive_minimum {
                "greater than"
            } else {
                "greater than or equal to"
            };
            push(
                out,
                path,
                format!("Invalid value: {v}: {path} in body should be {how} {min}"),
            );
        }
    }
    if let Some(max) = n.maximum {
        let high = if n.exclusive_maximum {
            x >= max
        } else {
            x > max
        };
        if high {
            let how = if n.exclusive_maximum {
                "less than"
            } else {
                "less than or equal to"
            };
            push(
                out,
                path,
                format!("Invalid value: {v}: {path} in body should be {how} {max}"),
            );
        }
    }
}

fn array_checks(n: &Node, items: &[Value], path: &mut String, out: &mut Vec<Violation>) {
    let len = items.len() as u64;
    if let Some(max) = n.max_items
        && len > max
    {
        push(
            out,
            path,
            format!("Too many: {len}: must have at most {max} items"),
        );
    }
    if let Some(min) = n.min_items
        && len < min
    {
        push(
            out,
            path,
            format!("Invalid value: {len}: {path} in body should have at least {min} items"),
        );
    }
    // list-type map: the key fields identify an item; list-type set: items are unique.
    // Keys as their JSON text, in a set: a long list costs n log n, not n squared.
    let mut seen: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let key = if !n.list_map_keys.is_empty() {
            Some(Value::Array(
                n.list_map_keys.iter().map(|k| item[k].clone()).collect(),
            ))
        } else if n.list_set {
            Some(item.clone())
        } else {
            None
        };
        if let Some(key) = key
            && !seen.insert(key.to_string())
        {
            push(
                out,
                &format!("{path}[{i}]"),
                format!("Duplicate value: {}", shown_key(&n.list_map_keys, item)),
            );
        }
    }
    if let Some(child) = &n.items {
        for (i, item) in items.iter().enumerate() {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            walk(child, item, path, out, false);
            path.truncate(len);
        }
    }
}

fn shown_key(keys: &[String], item: &Value) -> String {
    if keys.is_empty() {
        return item.to_string();
    }
    let fields: Vec<String> = keys
        .iter()
        .map(|k| format!("\"{k}\":{}", item[k]))
        .collect();
    format!("map[string]interface {{}}{{{}}}", fields.join(", "))
}

fn object_checks(
    n: &Node,
    m: &Map<String, Value>,
    path: &mut String,
    out: &mut Vec<Violation>,
    root: bool,
) {
    let join = |path: &str, k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    for r in &n.required {
        if !m.contains_key(r) {
            push(out, &join(path, r), "Required value".to_owned());
        }
    }
    if let Some(max) = n.max_properties
        && m.len() as u64 > max
    {
        push(
            out,
            path,
            format!("Too many: {}: must have at most {max} items", m.len()),
        );
    }
    for (k, cv) in m {
        // The API server checks metadata itself and manages status.
        if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
            continue;
        }
        let child = n.properties.get(k).or(n.additional.as_deref());
        let Some(child) = child else {
            if !n.preserve_unknown {
                push(out, "", format!("unknown field \"{}\"", join(path, k)));
            }
            continue;
        };
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(k);
        walk(child, cv, path, out, false);
        path.truncate(len);
    }
}

fn rule_checks(n: &Node, v: &Value, path: &str, out: &mut Vec<Violation>) {
    if n.rules.is_empty() {
        return;
    }
    let Ok(this) = cel::to_value(v) else {
        return;
    };
    thread_local! {
        // The standard library and Kubernetes' functions, built once per thread: a scope per
        // node holds `self`.
        static ROOT: cel::Context<'static, 'static> = {
            let mut ctx = cel::Context::default();
            // Both names are free in the standard library: adding them cannot fail.
            ctx.add_function("split", split).ok();
            ctx.add_function("isIP", is_ip).ok();
            ctx
        };
    }
    ROOT.with(|root| {
        let mut ctx = root.new_inner_scope();
        // Converted here, not by `add_variable_from_value`, which unwraps the conversion.
        let Ok(this) = Box::<dyn cel::common::value::Val>::try_from(this) else {
            return;
        };
        ctx.add_variable_as_val("self", this);
        eval_rules(n, v, &ctx, path, out);
    });
}

fn eval_rules(
    n: &Node,
    v: &Value,
    ctx: &cel::Context<'_, '_>,
    path: &str,
    out: &mut Vec<Violation>,
) {
    for r in &n.rules {
        let Some(program) = &r.program else {
            continue;
        };
        // Not evaluable here (an unknown function, a missing field): skipped, see the
        // module docs.
        if let Ok(cel::Value::Bool(false)) = program.execute(ctx) {
            let at = match &r.field_path {
                Some(f) => format!("{path}{f}"),
                None => path.to_owned(),
            };
            let message = format!("Invalid value: {}: {}", shown(v), r.message);
            push(out, &at, message);
        }
    }
}

/// `s.split(sep)`: Kubernetes' CEL string library.
fn split(
    cel::extractors::This(s): cel::extractors::This<Arc<String>>,
    sep: Arc<String>,
) -> cel::Value {
    let parts = s
        .split(sep.as_str())
        .map(|p| cel::Value::String(Arc::new(p.to_owned())))
        .collect();
    cel::Value::List(Arc::new(parts))
}

/// `isIP(s)`: Kubernetes' CEL IP library.
fn is_ip(s: Arc<String>) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
}

#[cfg(test)]
mod tests;
