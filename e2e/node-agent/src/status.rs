//! The status the agent reports for one of its pods, as the kubelet would write it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::pod::{PodRt, State};

/// Remembers when each condition last changed, so that unchanged conditions keep their
/// lastTransitionTime.
#[derive(Debug, Default)]
pub struct Transitions(BTreeMap<&'static str, (bool, Time)>);

impl Transitions {
    fn condition(&mut self, kind: &'static str, value: bool) -> PodCondition {
        let entry = self
            .0
            .entry(kind)
            .or_insert_with(|| (value, Time(Timestamp::now())));
        if entry.0 != value {
            *entry = (value, Time(Timestamp::now()));
        }
        PodCondition {
            type_: kind.into(),
            status: if value { "True" } else { "False" }.into(),
            last_transition_time: Some(entry.1.clone()),
            reason: (!value && (kind == "Ready" || kind == "ContainersReady"))
                .then(|| "ContainersNotReady".into()),
            ..Default::default()
        }
    }
}

fn state(s: &State) -> ContainerState {
    match s {
        State::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: (!message.is_empty()).then(|| message.clone()),
            }),
            ..Default::default()
        },
        State::Running { since } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(since.clone()),
            }),
            ..Default::default()
        },
        State::Terminated {
            code,
            reason,
            started,
            finished,
        } => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: *code,
                reason: Some(reason.clone()),
                started_at: Some(started.clone()),
                finished_at: Some(finished.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
    }
}

/// The pod phase from its containers' states (the kubelet's rules, simplified).
pub fn phase(rt: &PodRt) -> &'static str {
    let all_done = rt
        .containers
        .iter()
        .all(|c| matches!(c.state, State::Terminated { .. }) && c.next_restart.is_none());
    if all_done && !rt.containers.is_empty() {
        let ok = rt
            .containers
            .iter()
            .all(|c| matches!(c.state, State::Terminated { code: 0, .. }));
        return if ok { "Succeeded" } else { "Failed" };
    }
    if rt
        .containers
        .iter()
        .any(|c| matches!(c.state, State::Waiting { .. }))
    {
        return "Pending";
    }
    "Running"
}

pub fn pod_status(rt: &PodRt, host_ip: &str, tr: &mut Transitions) -> PodStatus {
    let ready = !rt.containers.is_empty() && rt.containers.iter().all(|c| c.ready);
    let running = phase(rt) == "Running";
    let conditions = vec![
        tr.condition("PodReadyToStartContainers", true),
        tr.condition("Initialized", true),
        tr.condition("Ready", ready && running),
        tr.condition("ContainersReady", ready && running),
        tr.condition("PodScheduled", true),
    ];
    let statuses = rt
        .containers
        .iter()
        .map(|c| ContainerStatus {
            name: c.spec.name.clone(),
            image: c.spec.image.clone().unwrap_or_default(),
            image_id: c
                .argv
                .first()
                .map(|b| format!("file://{b}"))
                .unwrap_or_default(),
            container_id: c
                .child
                .as_ref()
                .and_then(|ch| ch.id())
                .map(|p| format!("process://{p}")),
            ready: c.ready,
            restart_count: c.restarts,
            started: Some(matches!(c.state, State::Running { .. })),
            state: Some(state(&c.state)),
            last_state: c.last_termination.as_ref().map(state),
            ..Default::default()
        })
        .collect();
    let (reason, message) = match &rt.failure {
        Some((r, m)) => (Some(r.clone()), Some(m.clone())),
        None => (None, None),
    };
    PodStatus {
        phase: Some(phase(rt).into()),
        conditions: Some(conditions),
        container_statuses: Some(statuses),
        host_ip: Some(host_ip.into()),
        host_ips: Some(vec![k8s_openapi::api::core::v1::HostIP {
            ip: host_ip.into(),
        }]),
        pod_ip: Some(rt.ip.to_string()),
        pod_ips: Some(vec![PodIP {
            ip: rt.ip.to_string(),
        }]),
        start_time: Some(rt.start_time.clone()),
        qos_class: Some("BestEffort".into()),
        reason,
        message,
        ..Default::default()
    }
}
