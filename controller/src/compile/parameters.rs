//! GatewayParameters: which apply to each Gateway, merged and checked.
//!
//! In: the GatewayParameters objects, a GatewayClass's `spec.parametersRef` and a Gateway's
//! `spec.infrastructure.parametersRef`. Out: for a class, its parameters or why they cannot be
//! used ([`class_parameters`]); for a Gateway, the class's merged with its own, field by field
//! (the Gateway's win), or why not ([`gateway_parameters`]). A reference to anything but a
//! GatewayParameters, one that does not resolve, or parameters out of range are an error the
//! Gateway API calls `InvalidParameters`; the provisioner then changes nothing for that Gateway
//! (a bad edit never takes a running proxy down) and its routes stay served.

use std::collections::BTreeMap;

use gateway_types::gatewayclasses::GatewayClassParametersRef;
use gateway_types::gateways::Gateway;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tollgate_proxy::AccessLogArgs;
use tollgate_proxy::otel::{Protocol, TraceArgs, TraceArgsError};

use crate::compile::Objects;
use crate::crds::parameters::{
    AccessLogParameters, GatewayParametersSpec, OtlpProtocol, ServiceParameters, TracingParameters,
};
use crate::crds::{GROUP, GatewayParameters};

/// Gateway annotation setting the proxy replica count (an integer, 0 to [`MAX_REPLICAS`]):
/// superseded by GatewayParameters. It wins over the class's parameters, the Gateway's own
/// `replicas` or `autoscaling` win over it.
pub const REPLICAS_ANNOTATION: &str = "tollgate.dev/replicas";
/// The kind a `parametersRef` must name.
pub const KIND: &str = "GatewayParameters";
/// Most proxies `replicas` or `autoscaling.maxReplicas` may ask for.
pub const MAX_REPLICAS: i32 = 100;
/// Most runtime worker threads.
pub const MAX_WORKERS: u32 = 64;

/// The largest `spec.cache.size` (1 TiB): a larger one is a typo, not a cache.
pub const MAX_CACHE_BYTES: u64 = 1 << 40;

/// GatewayParameters by `(namespace, name)`.
pub type ParametersIndex<'a> = BTreeMap<(&'a str, &'a str), &'a GatewayParametersSpec>;

/// Indexes `objects` by namespace and name.
pub fn index(objects: &Objects<GatewayParameters>) -> ParametersIndex<'_> {
    objects
        .iter()
        .filter_map(|p| {
            Some((
                (
                    p.metadata.namespace.as_deref()?,
                    p.metadata.name.as_deref()?,
                ),
                &p.spec,
            ))
        })
        .collect()
}

/// The parameters a GatewayClass names: `Ok(None)` without a reference.
pub fn class_parameters<'a>(
    reference: Option<&GatewayClassParametersRef>,
    index: &ParametersIndex<'a>,
) -> Result<Option<&'a GatewayParametersSpec>, String> {
    let Some(r) = reference else {
        return Ok(None);
    };
    let what = format!("spec.parametersRef ({}/{} {})", r.group, r.kind, r.name);
    if r.group != GROUP || r.kind != KIND {
        return Err(format!("{what}: only {GROUP}/{KIND} is supported"));
    }
    let Some(ns) = r.namespace.as_deref() else {
        return Err(format!(
            "{what}: a {KIND} is namespaced: the reference needs a namespace"
        ));
    };
    let spec = index
        .get(&(ns, r.name.as_str()))
        .ok_or_else(|| format!("{what}: {KIND} {ns}/{} not found", r.name))?;
    check(spec).map_err(|e| format!("{KIND} {ns}/{}: {e}", r.name))?;
    Ok(Some(spec))
}

/// The parameters of `gateway`: its class's (`class`, as [`class_parameters`] returned them)
/// merged with those its `spec.infrastructure.parametersRef` names.
pub fn gateway_parameters(
    gateway: &Gateway,
    class: Result<Option<&GatewayParametersSpec>, &str>,
    index: &ParametersIndex<'_>,
) -> Result<GatewayParametersSpec, String> {
    let class = class.map_err(|e| {
        format!(
            "GatewayClass {}: {e}; nothing is provisioned or changed until it is fixed",
            gateway.spec.gateway_class_name
        )
    })?;
    let own = match gateway
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    {
        None => None,
        Some(r) => {
            let ns = gateway.metadata.namespace.as_deref().unwrap_or_default();
            let what = format!(
                "spec.infrastructure.parametersRef ({}/{} {})",
                r.group, r.kind, r.name
            );
            let held = "nothing is provisioned or changed until it is fixed";
            if r.group != GROUP || r.kind != KIND {
                return Err(format!("{what}: only {GROUP}/{KIND} is supported; {held}"));
            }
            let spec = index
                .get(&(ns, r.name.as_str()))
                .ok_or_else(|| format!("{what}: {KIND} {ns}/{} not found; {held}", r.name))?;
            check(spec).map_err(|e| format!("{KIND} {ns}/{}: {e}; {held}", r.name))?;
            Some(*spec)
        }
    };
    let mut merged = match (class, own) {
        (None, None) => GatewayParametersSpec::default(),
        (Some(c), None) => c.clone(),
        (None, Some(g)) => g.clone(),
        (Some(c), Some(g)) => merge(c, g),
    };
    let own_scaling = own.is_some_and(|g| g.replicas.is_some() || g.autoscaling.is_some());
    let annotated = gateway
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(REPLICAS_ANNOTATION));
    if annotated && !own_scaling {
        // The annotation is the Gateway's own setting: the provisioner reads it when the
        // parameters set no scaling.
        merged.replicas = None;
        merged.autoscaling = None;
    }
    // Each object is valid alone; what only the merge can get wrong is checked again.
    check_merged(&merged).map_err(|e| {
        format!("the merged parameters: {e}; nothing is provisioned or changed until it is fixed")
    })?;
    Ok(merged)
}

/// `gateway`'s fields over `class`'s. `replicas` and `autoscaling` are one choice: a Gateway
/// setting either replaces both of the class's. `service` and `accessLog` merge field by field.
pub fn merge(
    class: &GatewayParametersSpec,
    gateway: &GatewayParametersSpec,
) -> GatewayParametersSpec {
    let own_scaling = gateway.replicas.is_some() || gateway.autoscaling.is_some();
    let (replicas, autoscaling) = if own_scaling {
        (gateway.replicas, gateway.autoscaling.clone())
    } else {
        (class.replicas, class.autoscaling.clone())
    };
    fn or<T: Clone>(own: &Option<T>, class: &Option<T>) -> Option<T> {
        own.clone().or_else(|| class.clone())
    }
    let service = match (&class.service, &gateway.service) {
        (Some(c), Some(g)) => Some(ServiceParameters {
            type_: g.type_.or(c.type_),
            annotations: or(&g.annotations, &c.annotations),
        }),
        (c, g) => or(g, c),
    };
    let access_log = match (&class.access_log, &gateway.access_log) {
        (Some(c), Some(g)) => Some(AccessLogParameters {
            enabled: g.enabled.or(c.enabled),
            format: g.format.or(c.format),
            fields: or(&g.fields, &c.fields),
            filter: or(&g.filter, &c.filter),
        }),
        (c, g) => or(g, c),
    };
    GatewayParametersSpec {
        replicas,
        autoscaling,
        resources: or(&gateway.resources, &class.resources),
        workers: gateway.workers.or(class.workers),
        pod_disruption_budget: or(&gateway.pod_disruption_budget, &class.pod_disruption_budget),
        topology_spread_constraints: or(
            &gateway.topology_spread_constraints,
            &class.topology_spread_constraints,
        ),
        node_selector: or(&gateway.node_selector, &class.node_selector),
        tolerations: or(&gateway.tolerations, &class.tolerations),
        priority_class_name: or(&gateway.priority_class_name, &class.priority_class_name),
        service,
        log_level: gateway.log_level.or(class.log_level),
        access_log,
        telemetry: or(&gateway.telemetry, &class.telemetry),
        cache: or(&gateway.cache, &class.cache),
    }
}

/// Why one GatewayParameters cannot be used, if it cannot (the API server's schema checks the
/// same ranges; `tollgate validate` and `tollgate run` have no API server).
pub fn check(spec: &GatewayParametersSpec) -> Result<(), String> {
    let mut errors = Vec::new();
    if spec.replicas.is_some() && spec.autoscaling.is_some() {
        errors.push("spec.replicas and spec.autoscaling are exclusive".to_owned());
    }
    if let Some(r) = spec.replicas
        && !(0..=MAX_REPLICAS).contains(&r)
    {
        errors.push(format!(
            "spec.replicas {r} is out of range (0 to {MAX_REPLICAS})"
        ));
    }
    if let Some(a) = &spec.autoscaling {
        let min = a.min_replicas.unwrap_or(1);
        for (field, v) in [("minReplicas", min), ("maxReplicas", a.max_replicas)] {
            if !(1..=MAX_REPLICAS).contains(&v) {
                errors.push(format!(
                    "spec.autoscaling.{field} {v} is out of range (1 to {MAX_REPLICAS})"
                ));
            }
        }
        if min > a.max_replicas {
            errors.push(format!(
                "spec.autoscaling.minReplicas {min} is above maxReplicas {}",
                a.max_replicas
            ));
        }
        if let Some(t) = a.target_cpu_utilization_percentage
            && !(1..=100).contains(&t)
        {
            errors.push(format!(
                "spec.autoscaling.targetCPUUtilizationPercentage {t} is out of range (1 to 100)"
            ));
        }
    }
    if let Some(w) = spec.workers
        && !(1..=MAX_WORKERS).contains(&w)
    {
        errors.push(format!(
            "spec.workers {w} is out of range (1 to {MAX_WORKERS})"
        ));
    }
    if let Some(pdb) = &spec.pod_disruption_budget {
        match (&pdb.min_available, &pdb.max_unavailable) {
            (Some(v), None) => check_budget("minAvailable", v, &mut errors),
            (None, Some(v)) => check_budget("maxUnavailable", v, &mut errors),
            _ => errors.push(
                "spec.podDisruptionBudget needs exactly one of minAvailable and maxUnavailable"
                    .to_owned(),
            ),
        }
    }
    if let Some(r) = &spec.resources {
        check_resources(r, &mut errors);
    }
    if let Some(p) = &spec.priority_class_name
        && !is_dns_subdomain(p)
    {
        errors.push(format!(
            "spec.priorityClassName {p:?} is not a valid PriorityClass name"
        ));
    }
    if let Some(log) = &spec.access_log
        && let Err(e) = access_log_args(log, &AccessLogArgs::default()).settings()
    {
        errors.push(format!("spec.accessLog: {e}"));
    }
    if let Some(size) = spec.cache.as_ref().and_then(|c| c.size.as_ref())
        && let Err(e) = cache_size(&size.0)
    {
        errors.push(format!("spec.cache.size: {e}"));
    }
    if let Some(t) = spec.telemetry.as_ref().and_then(|t| t.tracing.as_ref()) {
        match tracing_args(t).settings() {
            Ok(_) => {}
            Err(TraceArgsError::Endpoint(e)) => errors.push(format!(
                "spec.telemetry.tracing.endpoint {e:?} is not an http:// URL with a host (TLS to the collector is not supported)"
            )),
            Err(TraceArgsError::Ratio(r)) => errors.push(format!(
                "spec.telemetry.tracing.samplingRatio {r} is out of range (0 to 1)"
            )),
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// What only a merge of a class's and a Gateway's parameters can get wrong.
fn check_merged(spec: &GatewayParametersSpec) -> Result<(), String> {
    // The autoscaler measures CPU against the request: without one it cannot scale.
    if spec.autoscaling.is_some()
        && let Some(r) = &spec.resources
    {
        let has =
            |m: &Option<BTreeMap<String, _>>| m.as_ref().is_some_and(|m| m.contains_key("cpu"));
        if !has(&r.requests) && !has(&r.limits) {
            return Err(
                "spec.autoscaling scales on CPU, so spec.resources needs a cpu request".to_owned(),
            );
        }
    }
    Ok(())
}

/// The proxy's tracing flags for `t`.
pub fn tracing_args(t: &TracingParameters) -> TraceArgs {
    TraceArgs {
        otlp_endpoint: Some(t.endpoint.clone()),
        otlp_protocol: match t.protocol {
            None | Some(OtlpProtocol::Grpc) => Protocol::Grpc,
            Some(OtlpProtocol::Http) => Protocol::Http,
        },
        trace_sampling: t.sampling_ratio.unwrap_or(1.0),
    }
}

/// The access log flags `log` sets over `base` (the controller's own flags).
pub fn access_log_args(log: &AccessLogParameters, base: &AccessLogArgs) -> AccessLogArgs {
    let mut args = base.clone();
    if let Some(e) = log.enabled {
        args.access_log = e;
    }
    if let Some(f) = log.format {
        args.access_log_format = match f {
            crate::crds::parameters::AccessLogFormat::Json => tollgate_proxy::AccessLogFormat::Json,
            crate::crds::parameters::AccessLogFormat::Logfmt => {
                tollgate_proxy::AccessLogFormat::Logfmt
            }
        };
    }
    if let Some(f) = &log.fields {
        args.access_log_fields = Some(f.join(","));
    }
    if let Some(f) = &log.filter {
        args.access_log_filter = Some(f.clone());
    }
    args
}

fn check_budget(field: &str, v: &IntOrString, errors: &mut Vec<String>) {
    let ok = match v {
        IntOrString::Int(n) => *n >= 0,
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|n| n.parse::<u8>().ok())
            .is_some_and(|n| n <= 100),
    };
    if !ok {
        errors.push(format!(
            "spec.podDisruptionBudget.{field}: {} is neither a count nor a percentage (0% to 100%)",
            match v {
                IntOrString::Int(n) => n.to_string(),
                IntOrString::String(s) => format!("{s:?}"),
            }
        ));
    }
}

fn check_resources(r: &ResourceRequirements, errors: &mut Vec<String>) {
    let mut parsed = BTreeMap::new();
    for (which, map) in [("requests", &r.requests), ("limits", &r.limits)] {
        for (name, q) in map.iter().flatten() {
            match quantity(&q.0) {
                Some(v) => {
                    parsed.insert((which, name.as_str()), v);
                }
                None => errors.push(format!(
                    "spec.resources.{which}.{name}: {:?} is not a quantity",
                    q.0
                )),
            }
        }
    }
    for ((which, name), request) in &parsed {
        if *which == "requests"
            && let Some(limit) = parsed.get(&("limits", name))
            && request > limit
        {
            errors.push(format!(
                "spec.resources.requests.{name} is above spec.resources.limits.{name}"
            ));
        }
    }
}

/// The bytes of a `spec.cache.size` quantity, as the proxy's `--cache-size` takes them.
pub fn cache_size(q: &str) -> Result<u64, String> {
    let bytes = quantity(q).ok_or_else(|| format!("{q:?} is not a quantity"))?;
    if bytes.fract() != 0.0 {
        return Err(format!("{q:?} is not a whole number of bytes"));
    }
    if bytes > MAX_CACHE_BYTES as f64 {
        return Err(format!("{q:?} is above the limit of 1Ti"));
    }
    // Whole and in range (checked above).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// The value of a Kubernetes quantity (`100m`, `64Mi`, `1.5`, `2e3`), if it is one.
fn quantity(s: &str) -> Option<f64> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.is_empty() || number.starts_with('.') && number.len() == 1 {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    (value >= 0.0).then_some(value * scale)
}

/// An RFC 1123 DNS subdomain, as a PriorityClass name must be.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::quantity;

    #[test]
    fn quantities_parse_as_kubernetes_writes_them() {
        assert_eq!(quantity("100m"), Some(0.1));
        assert_eq!(quantity("64Mi"), Some(64.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("2"), Some(2.0));
        assert_eq!(quantity("1.5G"), Some(1.5e9));
        assert_eq!(quantity("2e3"), Some(2000.0));
        for bad in ["", "m", "1x", "abc", "-1", "1 Gi", "."] {
            assert_eq!(quantity(bad), None, "{bad:?}");
        }
    }
}
