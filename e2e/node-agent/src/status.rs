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
        reason,
        message,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Container;

    use super::*;
    use crate::netns::PodNet;
    use crate::pod::ContainerRt;

    fn container(state: State) -> ContainerRt {
        let spec = Container {
            name: "c".into(),
            ..Default::default()
        };
        ContainerRt {
            argv: vec!["/bin/x".into()],
            ..ContainerRt::new(spec, state)
        }
    }

    fn pod(containers: Vec<ContainerRt>) -> PodRt {
        PodRt {
            namespace: "ns".into(),
            name: "p".into(),
            net: PodNet::for_uid("0123456789ab"),
            ip: "10.244.0.2".parse().unwrap(),
            dir: "/nonexistent".into(),
            restart_policy: "Always".into(),
            grace: Duration::from_secs(1),
            containers,
            start_time: Time(Timestamp::now()),
            created: Vec::new(),
            failure: None,
        }
    }

    fn running() -> State {
        State::Running {
            since: Time(Timestamp::now()),
        }
    }

    fn exited(code: i32) -> State {
        let t = Time(Timestamp::now());
        State::Terminated {
            code,
            reason: "x".into(),
            started: t.clone(),
            finished: t,
        }
    }

    #[test]
    fn a_waiting_container_keeps_the_pod_pending() {
        let w = State::Waiting {
            reason: "ImageNotMapped".into(),
            message: String::new(),
        };
        assert_eq!(
            phase(&pod(vec![container(running()), container(w)])),
            "Pending"
        );
    }

    #[test]
    fn all_exited_is_succeeded_or_failed() {
        assert_eq!(phase(&pod(vec![container(exited(0))])), "Succeeded");
        assert_eq!(
            phase(&pod(vec![container(exited(0)), container(exited(1))])),
            "Failed"
        );
    }

    #[test]
    fn an_exited_container_about_to_restart_keeps_the_pod_running() {
        let mut c = container(exited(1));
        c.next_restart = Some(std::time::Instant::now());
        assert_eq!(phase(&pod(vec![c])), "Running");
    }

    #[test]
    fn ready_only_when_every_container_is_and_qos_class_is_left_to_the_api_server() {
        let mut tr = Transitions::default();
        let mut p = pod(vec![container(running()), container(running())]);
        p.containers[0].ready = true;
        let st = pod_status(&p, "10.244.0.1", &mut tr);
        let ready = |st: &PodStatus| {
            st.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.status.clone())
        };
        assert_eq!(ready(&st).as_deref(), Some("False"));
        // status.qosClass is immutable once the API server set it.
        assert!(st.qos_class.is_none());
        p.containers[1].ready = true;
        let st2 = pod_status(&p, "10.244.0.1", &mut tr);
        assert_eq!(ready(&st2).as_deref(), Some("True"));
        assert_eq!(st2.pod_ip.as_deref(), Some("10.244.0.2"));
    }

    #[test]
    fn unchanged_conditions_keep_their_transition_time() {
        let mut tr = Transitions::default();
        let p = pod(vec![container(running())]);
        let a = pod_status(&p, "h", &mut tr);
        std::thread::sleep(Duration::from_millis(5));
        let b = pod_status(&p, "h", &mut tr);
        assert_eq!(a.conditions, b.conditions);
    }
}
