//! Desired statuses merged with the live ones: each condition whose status did not change
//! keeps its live `lastTransitionTime` (apimachinery's `SetStatusCondition` rule), and two
//! statuses compare equal when they serialize alike up to empty fields, so a restart or a
//! recompile with nothing new writes nothing.

use gateway_types::gateways::GatewayStatus;
use gateway_types::listenersets::ListenerSetStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Serialize;
use serde_json::Value;

use crate::crds::PolicyStatus;

/// The desired policy status with the live condition times kept.
pub(super) fn policy_status(desired: &PolicyStatus, old: &PolicyStatus) -> PolicyStatus {
    let mut status = desired.clone();
    keep_times(&mut status.conditions, &old.conditions);
    for a in &mut status.ancestors {
        if let Some(o) = old
            .ancestors
            .iter()
            .find(|o| o.ancestor_ref == a.ancestor_ref)
        {
            keep_times(&mut a.conditions, &o.conditions);
        }
    }
    status
}

/// `$desired` with the live condition times of `$old` kept, on the object and on each
/// listener of the same name: Gateways and ListenerSets have the same shape of status.
macro_rules! with_listener_times {
    ($desired:expr, $old:expr) => {{
        let (desired, old) = ($desired, $old);
        let mut status = desired.clone();
        keep_times(
            status.conditions.as_deref_mut().unwrap_or_default(),
            old.conditions.as_deref().unwrap_or_default(),
        );
        for l in status.listeners.iter_mut().flatten() {
            if let Some(o) = old.listeners.iter().flatten().find(|o| o.name == l.name) {
                keep_times(&mut l.conditions, &o.conditions);
            }
        }
        status
    }};
}

/// The desired Gateway status with the live condition times kept.
pub(super) fn gateway_status(desired: &GatewayStatus, old: &GatewayStatus) -> GatewayStatus {
    with_listener_times!(desired, old)
}

/// The desired ListenerSet status with the live condition times kept.
pub(super) fn listener_set_status(
    desired: &ListenerSetStatus,
    old: &ListenerSetStatus,
) -> ListenerSetStatus {
    with_listener_times!(desired, old)
}

/// Copies `lastTransitionTime` from the live condition of the same type when its status is
/// unchanged.
pub fn keep_times(desired: &mut [Condition], live: &[Condition]) {
    for c in desired {
        if let Some(l) = live
            .iter()
            .find(|l| l.type_ == c.type_ && l.status == c.status)
        {
            c.last_transition_time = l.last_transition_time.clone();
        }
    }
}

/// Equal once serialized, ignoring nulls and empty lists and maps (the API server drops or
/// keeps those depending on the schema; they mean the same).
pub fn same<A: Serialize + ?Sized, B: Serialize + ?Sized>(a: &A, b: &B) -> bool {
    match (serde_json::to_value(a), serde_json::to_value(b)) {
        (Ok(a), Ok(b)) => prune(a) == prune(b),
        _ => false,
    }
}

fn prune(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (k, prune(v)))
                .filter(|(_, v)| !empty(v))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(prune).collect()),
        v => v,
    }
}

fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use gateway_types::gatewayclasses::GatewayClassStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn cond(t: &str, status: &str, reason: &str, at: i64) -> Condition {
        Condition {
            type_: t.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::from_second(at).unwrap()),
        }
    }

    #[test]
    fn unchanged_status_keeps_its_transition_time() {
        let live = vec![cond("Accepted", "True", "Accepted", 100)];
        let mut desired = vec![
            cond("Accepted", "True", "Accepted", 200),
            cond("Programmed", "True", "Programmed", 200),
        ];
        keep_times(&mut desired, &live);
        assert_eq!(desired[0], live[0]);
        assert_eq!(desired[1].last_transition_time.0.as_second(), 200);
        let mut flipped = vec![cond("Accepted", "False", "Invalid", 300)];
        keep_times(&mut flipped, &live);
        assert_eq!(flipped[0].last_transition_time.0.as_second(), 300);
    }

    #[test]
    fn empty_and_missing_compare_equal() {
        assert!(same(&json!({"a": [], "b": null, "c": 1}), &json!({"c": 1})));
        assert!(!same(&json!({"c": 1}), &json!({"c": 2})));
        let s = GatewayClassStatus {
            conditions: Some(vec![]),
            supported_features: None,
        };
        assert!(same(&s, &GatewayClassStatus::default()));
    }
}
