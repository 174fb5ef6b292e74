//! What GatewayParameters add to a Gateway's proxy objects: scheduling settings of the pod,
//! a HorizontalPodAutoscaler and a PodDisruptionBudget.
//!
//! In: the pod spec [`super::desired`] built, the merged parameters, the proxy's metadata and
//! selector labels. Out: the pod spec with the parameters' node selector, tolerations,
//! priority class and topology spread; the autoscaler and budget objects. Plain values, as in
//! [`super::desired`].

use std::collections::BTreeMap;

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricSpec,
    MetricTarget, ResourceMetricSource,
};
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::crds::GatewayParametersSpec;
use crate::crds::parameters::{Autoscaling, PodDisruptionBudgetSpec as BudgetParameters};

/// CPU use the autoscaler aims at, in percent of the request, when the parameters name none.
pub const DEFAULT_CPU_TARGET: i32 = 80;

/// `pod` with the scheduling settings of `params`. A topology spread constraint without a
/// label selector selects this Gateway's proxy pods (`selector`): a class's constraint cannot
/// name each Gateway's pods itself.
pub fn with_parameters(
    mut pod: PodSpec,
    params: &GatewayParametersSpec,
    selector: &BTreeMap<String, String>,
) -> PodSpec {
    pod.node_selector.clone_from(&params.node_selector);
    pod.tolerations.clone_from(&params.tolerations);
    pod.priority_class_name
        .clone_from(&params.priority_class_name);
    pod.topology_spread_constraints = params.topology_spread_constraints.clone().map(|all| {
        all.into_iter()
            .map(|mut c| {
                c.label_selector.get_or_insert_with(|| LabelSelector {
                    match_labels: Some(selector.clone()),
                    ..LabelSelector::default()
                });
                c
            })
            .collect()
    });
    pod
}

/// The autoscaler of the proxy Deployment named in `meta`.
pub fn autoscaler(meta: &ObjectMeta, a: &Autoscaling) -> HorizontalPodAutoscaler {
    HorizontalPodAutoscaler {
        metadata: meta.clone(),
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".into()),
                kind: "Deployment".into(),
                name: meta.name.clone().unwrap_or_default(),
            },
            min_replicas: Some(a.min_replicas.unwrap_or(1)),
            max_replicas: a.max_replicas,
            metrics: Some(vec![MetricSpec {
                type_: "Resource".into(),
                resource: Some(ResourceMetricSource {
                    name: "cpu".into(),
                    target: MetricTarget {
                        type_: "Utilization".into(),
                        average_utilization: Some(
                            a.target_cpu_utilization_percentage
                                .unwrap_or(DEFAULT_CPU_TARGET),
                        ),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            ..HorizontalPodAutoscalerSpec::default()
        }),
        ..HorizontalPodAutoscaler::default()
    }
}

/// The disruption budget over the proxy pods (`selector`).
pub fn disruption_budget(
    meta: &ObjectMeta,
    b: &BudgetParameters,
    selector: &BTreeMap<String, String>,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta.clone(),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: b.min_available.clone(),
            max_unavailable: b.max_unavailable.clone(),
            selector: Some(LabelSelector {
                match_labels: Some(selector.clone()),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}
