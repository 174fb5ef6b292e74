//! UDP ports (Gateway API protocol `UDP`, UDPRoutes). In: a bound [`UdpSocket`] for one table
//! port. Out: each client's datagrams forwarded to one endpoint, and that endpoint's answers
//! sent back to the client from the port's own address.
//!
//! A flow is one client address (IP and port) on the port. Its first datagram picks, in the
//! table live then, the port's first route, a backend of it by weight and an endpoint by the
//! backend's balancer (as a TCP port does for a connection), and opens a socket connected to
//! that endpoint; later datagrams of the flow take the same socket, so a client keeps its
//! endpoint for as long as the flow lives. A task per flow reads the endpoint's answers and
//! sends them to the client. A flow with no datagram either way for
//! [`ProxyOptions::udp_flow_idle_timeout`](crate::ProxyOptions) is forgotten (its socket
//! closed); stopping the port ends every flow.
//!
//! Bounded: a port keeps at most [`ProxyOptions::udp_max_flows`](crate::ProxyOptions) flows
//! (each holds one socket and a small task; no buffer is kept per flow), and a datagram that
//! would open one more is dropped. Nothing is queued: a datagram that cannot be sent at once
//! is dropped, as the network itself may. Every drop is counted in
//! `tollgate_udp_dropped_total` by reason (`no_route`, `no_backend`, `flow_limit`,
//! `socket_failed`, `send_failed`, `backend_unreachable`); forwarded datagrams in
//! `tollgate_udp_datagrams_total` by direction, and open flows in `tollgate_udp_flows_active`.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::watch;

use crate::downstream::listener::ListenerHandle;
use crate::downstream::stream::pick;
use crate::metrics::{StreamOutcome, UdpDirection};
use crate::state::{PortState, Shared};

/// The largest UDP payload over IPv4.
const MAX_DATAGRAM: usize = 65_507;

/// Starts the datagram loop of `table_port` on a bound socket.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    socket: UdpSocket,
    table_port: u16,
) -> io::Result<ListenerHandle> {
    let local_addr = socket.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);
    let port = Port {
        shared,
        socket: Arc::new(socket),
        table_port,
        flows: Mutex::new(HashMap::new()),
        clock: Instant::now(),
    };
    let task = tokio::spawn(serve(Arc::new(port), stop_rx));
    Ok(ListenerHandle::new(local_addr, stop, task))
}

/// One UDP port: its socket and its flows.
struct Port {
    shared: Arc<Shared>,
    socket: Arc<UdpSocket>,
    table_port: u16,
    flows: Mutex<HashMap<SocketAddr, Flow>>,
    /// What flows' activity is measured from.
    clock: Instant,
}

/// One client's flow: the socket connected to its endpoint, and when a datagram last crossed.
#[derive(Clone)]
struct Flow {
    upstream: Arc<UdpSocket>,
    /// Milliseconds since [`Port::clock`].
    last: Arc<AtomicU64>,
}

impl Port {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn flows(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Flow>> {
        self.flows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn dropped(&self, reason: &'static str) {
        self.shared.metrics.udp_dropped(reason);
    }
}

async fn serve(port: Arc<Port>, mut stop: watch::Receiver<bool>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    // The flows' relays: ended with the port, so that once it is stopped nothing holds its
    // socket (the address is free for a table that binds it again).
    let mut relays = tokio::task::JoinSet::new();
    loop {
        while relays.try_join_next().is_some() {}
        let received = tokio::select! {
            _ = stop.changed() => {
                relays.shutdown().await;
                return;
            }
            r = port.socket.recv_from(&mut buf) => r,
        };
        let (n, peer) = match received {
            Ok(r) => r,
            Err(e) => {
                // A datagram larger than the buffer is truncated, not an error; an error here
                // is the socket's (an ICMP report on some systems): go on.
                tracing::debug!(error = %e, port = port.table_port, "UDP receive failed");
                continue;
            }
        };
        let existing = {
            let flows = port.flows();
            flows.get(&peer).cloned().inspect(|f| {
                // Under the lock, so an expiring flow sees this datagram's activity.
                f.last.store(port.now_ms(), Ordering::Relaxed);
            })
        };
        let flow = match existing {
            Some(f) => f,
            None => match open(&port, peer, &stop, &mut relays).await {
                Ok(f) => f,
                Err(reason) => {
                    port.dropped(reason);
                    continue;
                }
            },
        };
        match flow.upstream.send(&buf[..n]).await {
            Ok(_) => port.shared.metrics.udp_datagram(UdpDirection::ToBackend),
            Err(e) => {
                tracing::debug!(error = %e, peer = %peer, port = port.table_port, "UDP send to the backend failed");
                port.dropped(if e.kind() == io::ErrorKind::ConnectionRefused {
                    "backend_unreachable"
                } else {
                    "send_failed"
                });
            }
        }
    }
}

/// Opens the flow of `peer`: picks its endpoint, connects a socket to it, starts its relay.
async fn open(
    port: &Arc<Port>,
    peer: SocketAddr,
    stop: &watch::Receiver<bool>,
    relays: &mut tokio::task::JoinSet<()>,
) -> Result<Flow, &'static str> {
    if port.flows().len() >= port.shared.limits.udp_max_flows {
        tracing::debug!(peer = %peer, port = port.table_port, "UDP flow limit reached: datagram dropped");
        return Err("flow_limit");
    }
    let addr = match pick(&port.shared, port.table_port, "") {
        Ok((PortState::Udp, target)) => target.addr,
        Ok(_) => return Err("no_route"),
        Err(outcome) => {
            if let Some(why) = &outcome.why {
                tracing::debug!(peer = %peer, port = port.table_port, reason = %why, "UDP datagram dropped");
            }
            return Err(match outcome.kind {
                StreamOutcome::NoBackend => "no_backend",
                _ => "no_route",
            });
        }
    };
    let local: SocketAddr = if addr.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let upstream = match UdpSocket::bind(local).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, port = port.table_port, "UDP flow socket failed");
            return Err("socket_failed");
        }
    };
    if let Err(e) = upstream.connect(addr).await {
        tracing::debug!(error = %e, backend = %addr, "UDP flow connect failed");
        return Err("socket_failed");
    }
    let flow = Flow {
        upstream: Arc::new(upstream),
        last: Arc::new(AtomicU64::new(port.now_ms())),
    };
    port.flows().insert(peer, flow.clone());
    relays.spawn(relay(port.clone(), peer, flow.clone(), stop.clone()));
    Ok(flow)
}

/// Sends the endpoint's answers to the client until the flow is idle or the port stops, then
/// forgets the flow.
async fn relay(port: Arc<Port>, peer: SocketAddr, flow: Flow, mut stop: watch::Receiver<bool>) {
    let _open = port.shared.metrics.udp_flow_opened();
    let idle = port.shared.limits.udp_flow_idle_timeout;
    loop {
        let quiet = Duration::from_millis(
            port.now_ms()
                .saturating_sub(flow.last.load(Ordering::Relaxed)),
        );
        let wait = idle.saturating_sub(quiet);
        if wait.is_zero() {
            let mut flows = port.flows();
            // Checked again under the lock: a datagram may have just arrived.
            let quiet = port
                .now_ms()
                .saturating_sub(flow.last.load(Ordering::Relaxed));
            if Duration::from_millis(quiet) >= idle {
                if flows
                    .get(&peer)
                    .is_some_and(|f| Arc::ptr_eq(&f.upstream, &flow.upstream))
                {
                    flows.remove(&peer);
                }
                return;
            }
            continue;
        }
        tokio::select! {
            _ = stop.changed() => break,
            r = flow.upstream.readable() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, peer = %peer, "UDP flow socket failed");
                    break;
                }
                while let Some(answer) = take_answer(&port, peer, &flow) {
                    match port.socket.send_to(&answer, peer).await {
                        Ok(_) => port.shared.metrics.udp_datagram(UdpDirection::ToClient),
                        Err(_) => port.dropped("send_failed"),
                    }
                }
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
    let mut flows = port.flows();
    if flows
        .get(&peer)
        .is_some_and(|f| Arc::ptr_eq(&f.upstream, &flow.upstream))
    {
        flows.remove(&peer);
    }
}

/// The next answer waiting on the flow's socket, if any, copied out at its own size: the
/// receive buffer lives only here, so a flow waiting for answers holds none.
fn take_answer(port: &Port, peer: SocketAddr, flow: &Flow) -> Option<Vec<u8>> {
    let mut buf = [0u8; MAX_DATAGRAM];
    loop {
        match flow.upstream.try_recv(&mut buf) {
            Ok(n) => {
                flow.last.store(port.now_ms(), Ordering::Relaxed);
                return Some(buf[..n].to_vec());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                // ICMP port unreachable for an earlier datagram: the endpoint is not listening.
                port.dropped("backend_unreachable");
            }
            Err(e) => {
                tracing::debug!(error = %e, peer = %peer, "UDP flow receive failed");
                return None;
            }
        }
    }
}
