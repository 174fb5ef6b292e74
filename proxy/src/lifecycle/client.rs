//! A port's client settings at run time (ClientPolicy). In: the table's
//! [`ClientSettings`] of a port (at table build) and, per request, the peer address and the
//! `X-Forwarded-For` fields. Out: [`PortClient`] (with the port's compression settings), kept in the snapshot for ports with
//! settings, and [`PortClient::resolve`]: the address CEL `source.address`, rate-limit
//! counters and the access log use, and the trusted chain the upstream's `X-Forwarded-For`
//! carries (client first, what a client wrote left of its own entry dropped).
//!
//! `X-Forwarded-For` is read only as far as it is trusted: with `NumTrustedHops(n)`, the
//! entry `n` places from the right (written by the farthest trusted proxy); with
//! `TrustedCidrs`, from the peer leftwards while addresses are in the trusted networks. An
//! entry a client wrote beyond that never becomes its address, so forging entries cannot pick
//! someone else's rate-limit counter or pass a network rule.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use tollgate_api::ObjectKey;
use tollgate_api::client::{Cidr, ClientLimits, ClientSettings, ForwardedFor};

use crate::lifecycle::compress;
use crate::lifecycle::forward::X_FORWARDED_FOR;
use crate::lifecycle::normalize::PathOptions;

/// Which `X-Forwarded-For` entry is the client, networks parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Trust {
    /// The entry this many places from the right.
    Hops(usize),
    /// The first address outside these networks, from the peer leftwards.
    Cidrs(Vec<Cidr>),
}

/// A port's client settings, ready for requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PortClient {
    /// PROXY protocol on the port's connections.
    pub proxy_protocol: Option<ProxyTrust>,
    /// Trusted `X-Forwarded-For` hops.
    pub trust: Option<Trust>,
    /// Path normalization.
    pub paths: PathOptions,
    /// Invalid ClientPolicies never valid: every request answers 500.
    pub closed_by: Vec<ObjectKey>,
    /// Limits over the proxy's own.
    pub limits: ClientLimits,
    /// Response compression.
    pub compression: Option<Arc<compress::Settings>>,
}

/// Why a port's settings cannot be served.
#[derive(Debug, thiserror::Error)]
#[error("port {port}: trusted network {cidr:?}: {source}")]
pub struct ClientSettingsError {
    port: u16,
    cidr: String,
    source: tollgate_api::client::CidrError,
}

impl PortClient {
    /// The runtime form of a port's settings; `None` for the defaults (nothing to do).
    pub(crate) fn build(
        port: u16,
        s: &ClientSettings,
    ) -> Result<Option<Self>, ClientSettingsError> {
        if s.is_default() {
            return Ok(None);
        }
        let trust = match &s.forwarded_for {
            None => None,
            Some(ForwardedFor::NumTrustedHops(n)) => {
                Some(Trust::Hops(usize::try_from(*n).unwrap_or(usize::MAX)))
            }
            Some(ForwardedFor::TrustedCidrs(list)) => Some(Trust::Cidrs(cidrs(port, list)?)),
        };
        let proxy_protocol = match &s.proxy_protocol {
            None => None,
            Some(pp) => Some(ProxyTrust {
                required: pp.required,
                peers: cidrs(port, &pp.trusted_cidrs)?,
            }),
        };
        Ok(Some(Self {
            proxy_protocol,
            trust,
            paths: PathOptions {
                merge_slashes: s.path.merge_slashes,
                escaped_slashes: s.path.escaped_slashes,
            },
            closed_by: s.closed_by.clone(),
            limits: s.limits,
            compression: s
                .compression
                .as_ref()
                .map(|c| Arc::new(compress::Settings::new(c))),
        }))
    }

    /// What trusted `X-Forwarded-For` entries say of a request from `peer` with `headers`;
    /// `None` when the port trusts none. `last` is the request's last `X-Forwarded-For`
    /// field and `lines` how many it has (from the one scan of its fields): with one, no
    /// lookup in the map is made.
    pub(crate) fn resolve(
        &self,
        peer: SocketAddr,
        headers: &HeaderMap,
        last: Option<&HeaderValue>,
        lines: u8,
    ) -> Option<Forwarded> {
        let trust = self.trust.as_ref()?;
        let mut out = Forwarded::default();
        match lines {
            0 => {}
            1 => {
                let one = last.map(HeaderValue::as_bytes).unwrap_or_default();
                out = trust.walk(peer, one.rsplit(|&b| b == b','));
            }
            _ => {
                let fields = headers.get_all(&X_FORWARDED_FOR);
                let entries = fields
                    .iter()
                    .rev()
                    .flat_map(|v| v.as_bytes().rsplit(|&b| b == b','));
                out = trust.walk(peer, entries);
            }
        }
        if out.client == Some(peer) {
            out.client = None;
        }
        Some(out)
    }
}

impl Trust {
    /// The client among `entries` (right to left) of a request from `peer`, and the text
    /// sent on.
    fn walk<'e>(&self, peer: SocketAddr, mut entries: impl Iterator<Item = &'e [u8]>) -> Forwarded {
        let mut out = Forwarded::default();
        // Trusted hops, right to left, as (address, its text).
        let mut hops: Vec<(SocketAddr, &[u8])> = Vec::new();
        let client = match self {
            Trust::Hops(n) => {
                // The n - 1 hops the trusted proxies wrote, then the client.
                for _ in 1..*n {
                    match entries.next().and_then(|e| parse_entry(e).map(|a| (a, e))) {
                        Some(hop) => hops.push(hop),
                        // Too few entries, or one no trusted proxy would write: the peer.
                        None => return out,
                    }
                }
                entries.next().and_then(|e| parse_entry(e).map(|a| (a, e)))
            }
            Trust::Cidrs(nets) => {
                let trusted = |ip: IpAddr| nets.iter().any(|c| c.contains(ip));
                if !trusted(peer.ip()) {
                    return out;
                }
                // The first address outside the networks is the client, else the last
                // trusted hop (an unreadable entry ends the walk).
                let mut client = None;
                for e in entries {
                    match parse_entry(e) {
                        Some(a) if trusted(a.ip()) => hops.push((a, e)),
                        Some(a) => {
                            client = Some((a, e));
                            break;
                        }
                        None => break,
                    }
                }
                client.or_else(|| hops.pop())
            }
        };
        let Some((client, text)) = client else {
            return out;
        };
        out.client = Some(client);
        for e in std::iter::once(text).chain(hops.iter().rev().map(|h| h.1)) {
            // Entries that parse are ASCII: their own text goes on.
            out.sent.push_str(
                std::str::from_utf8(e)
                    .unwrap_or("")
                    .trim_matches([' ', '\t']),
            );
            out.sent.push_str(", ");
        }
        out
    }
}

/// What a port's trusted `X-Forwarded-For` entries say of one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Forwarded {
    /// The client, when the entries name one other than the peer.
    pub client: Option<SocketAddr>,
    /// The start of the upstream's `X-Forwarded-For`, each entry followed by `, `: the
    /// client's entry and the trusted proxies' after it, as they were written (the peer goes
    /// last). What a client wrote to the left of its own entry is dropped, so a backend
    /// reading the first entry reads the client. Empty without a client.
    pub sent: String,
}

/// PROXY protocol on a port: whether the header is required, and from which peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProxyTrust {
    pub required: bool,
    /// Peers that may send the header; empty: any.
    pub peers: Vec<Cidr>,
}

/// What a connection from `peer` does about the PROXY header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProxyStep {
    /// Read it (`required`: a connection without one is refused).
    Read { required: bool },
    /// A peer that may not send one, where one is required: refused.
    Refuse,
    /// A peer that may not send one, where it is optional: served as it is.
    Skip,
}

impl ProxyTrust {
    /// What a connection from `peer` does.
    pub(crate) fn step(&self, peer: IpAddr) -> ProxyStep {
        if self.peers.is_empty() || self.peers.iter().any(|c| c.contains(peer)) {
            ProxyStep::Read {
                required: self.required,
            }
        } else if self.required {
            ProxyStep::Refuse
        } else {
            ProxyStep::Skip
        }
    }
}

fn cidrs(port: u16, list: &[String]) -> Result<Vec<Cidr>, ClientSettingsError> {
    list.iter()
        .map(|c| {
            c.parse().map_err(|source| ClientSettingsError {
                port,
                cidr: c.clone(),
                source,
            })
        })
        .collect()
}

/// One `X-Forwarded-For` entry: an IPv4 or IPv6 address, optionally with a port (`a.b.c.d:p`,
/// `[v6]`, `[v6]:p`), surrounded by optional spaces. The port is 0 when absent.
fn parse_entry(e: &[u8]) -> Option<SocketAddr> {
    let s = std::str::from_utf8(e).ok()?.trim_matches([' ', '\t']);
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip.to_canonical(), 0));
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let ip: std::net::Ipv6Addr = ip.parse().ok()?;
        let port = match after {
            "" => 0,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        return Some(SocketAddr::new(IpAddr::V6(ip).to_canonical(), port));
    }
    let a: std::net::SocketAddrV4 = s.parse().ok()?;
    Some(SocketAddr::V4(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(fwd: ForwardedFor) -> PortClient {
        let s = ClientSettings {
            forwarded_for: Some(fwd),
            ..ClientSettings::default()
        };
        PortClient::build(80, &s).unwrap().unwrap()
    }

    fn headers(lines: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(&X_FORWARDED_FOR, HeaderValue::from_str(l).unwrap());
        }
        h
    }

    fn resolved(p: &PortClient, peer: &str, lines: &[&str]) -> Forwarded {
        let h = headers(lines);
        let last = h.get_all(&X_FORWARDED_FOR).iter().next_back();
        let n = u8::try_from(lines.len()).unwrap();
        let one = p.resolve(peer.parse().unwrap(), &h, last, n).unwrap();
        // The map's lines are read the same way as the scan's last one.
        if n == 1 {
            assert_eq!(one, p.resolve(peer.parse().unwrap(), &h, None, 2).unwrap());
        }
        one
    }

    fn client(p: &PortClient, peer: &str, lines: &[&str]) -> Option<String> {
        resolved(p, peer, lines).client.map(|a| a.to_string())
    }

    /// The entries sent on before the peer.
    fn chain(p: &PortClient, peer: &str, lines: &[&str]) -> Vec<String> {
        let sent = resolved(p, peer, lines).sent;
        sent.split(", ")
            .filter(|e| !e.is_empty())
            .skip(1)
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_chain_keeps_the_trusted_hops_right_of_the_client() {
        let two = port(ForwardedFor::NumTrustedHops(2));
        assert_eq!(
            chain(&two, LB, &["6.6.6.6, 203.0.113.7, 10.1.1.1"]),
            ["10.1.1.1"]
        );
        assert!(chain(&two, LB, &["203.0.113.7"]).is_empty());
        let one = port(ForwardedFor::NumTrustedHops(1));
        assert!(chain(&one, LB, &["6.6.6.6, 203.0.113.7"]).is_empty());
        let nets = port(ForwardedFor::TrustedCidrs(vec!["10.0.0.0/8".into()]));
        assert_eq!(
            chain(&nets, LB, &["6.6.6.6, 203.0.113.7, 10.3.3.3, 10.2.2.2"]),
            ["10.3.3.3", "10.2.2.2"]
        );
        assert_eq!(
            client(&nets, LB, &["10.3.3.3, 10.2.2.2"]).as_deref(),
            Some("10.3.3.3:0")
        );
        assert_eq!(chain(&nets, LB, &["10.3.3.3, 10.2.2.2"]), ["10.2.2.2"]);
        assert!(chain(&nets, "198.51.100.1:1", &["10.2.2.2"]).is_empty());
    }

    const LB: &str = "10.0.0.9:40000";

    #[test]
    fn one_trusted_hop_is_the_last_entry() {
        let p = port(ForwardedFor::NumTrustedHops(1));
        assert_eq!(
            client(&p, LB, &["203.0.113.7"]).as_deref(),
            Some("203.0.113.7:0")
        );
        // A client forging entries: the balancer appended the real address last.
        assert_eq!(
            client(&p, LB, &["1.1.1.1, 2.2.2.2", "203.0.113.7"]).as_deref(),
            Some("203.0.113.7:0")
        );
        assert_eq!(
            client(&p, LB, &["1.1.1.1,203.0.113.7"]).as_deref(),
            Some("203.0.113.7:0")
        );
    }

    #[test]
    fn two_trusted_hops_is_the_second_entry_from_the_right() {
        let p = port(ForwardedFor::NumTrustedHops(2));
        assert_eq!(
            client(&p, LB, &["9.9.9.9, 203.0.113.7, 10.1.1.1"]).as_deref(),
            Some("203.0.113.7:0")
        );
        assert_eq!(
            client(&p, LB, &["9.9.9.9, 203.0.113.7", "10.1.1.1"]).as_deref(),
            Some("203.0.113.7:0"),
            "entries across field lines"
        );
    }

    #[test]
    fn too_few_entries_or_an_unreadable_one_leaves_the_peer() {
        let p = port(ForwardedFor::NumTrustedHops(2));
        assert_eq!(client(&p, LB, &["203.0.113.7"]), None);
        assert_eq!(client(&p, LB, &[]), None);
        let one = port(ForwardedFor::NumTrustedHops(1));
        for bad in [
            "unknown",
            "203.0.113.7 x",
            "",
            "300.1.1.1",
            "[::1",
            "1.2.3.4:99999",
        ] {
            assert_eq!(client(&one, LB, &[bad]), None, "{bad:?}");
        }
    }

    #[test]
    fn entries_may_carry_ports_and_brackets() {
        let p = port(ForwardedFor::NumTrustedHops(1));
        assert_eq!(
            client(&p, LB, &["203.0.113.7:5555"]).as_deref(),
            Some("203.0.113.7:5555")
        );
        assert_eq!(
            client(&p, LB, &["[2001:db8::7]"]).as_deref(),
            Some("[2001:db8::7]:0")
        );
        assert_eq!(
            client(&p, LB, &["[2001:db8::7]:443"]).as_deref(),
            Some("[2001:db8::7]:443")
        );
        assert_eq!(
            client(&p, LB, &[" 2001:db8::7 "]).as_deref(),
            Some("[2001:db8::7]:0")
        );
        assert_eq!(
            client(&p, LB, &["::ffff:203.0.113.7"]).as_deref(),
            Some("203.0.113.7:0"),
            "IPv4 written as IPv6 is the IPv4 address"
        );
    }

    #[test]
    fn trusted_networks_walk_from_the_peer_to_the_first_untrusted_address() {
        let p = port(ForwardedFor::TrustedCidrs(vec![
            "10.0.0.0/8".into(),
            "192.168.1.1".into(),
        ]));
        assert_eq!(
            client(&p, LB, &["6.6.6.6, 203.0.113.7, 192.168.1.1, 10.2.2.2"]).as_deref(),
            Some("203.0.113.7:0")
        );
        // A peer outside the networks is the client: its header is not read.
        assert_eq!(client(&p, "198.51.100.1:1", &["203.0.113.7"]), None);
        // Every entry trusted: the leftmost.
        assert_eq!(
            client(&p, LB, &["10.3.3.3, 10.2.2.2"]).as_deref(),
            Some("10.3.3.3:0")
        );
        // An unreadable entry stops the walk at the last trusted hop.
        assert_eq!(
            client(&p, LB, &["203.0.113.7, junk, 10.2.2.2"]).as_deref(),
            Some("10.2.2.2:0")
        );
        assert_eq!(client(&p, LB, &["junk"]), None);
    }

    #[test]
    fn defaults_build_nothing_and_a_bad_network_is_an_error() {
        assert_eq!(
            PortClient::build(80, &ClientSettings::default()).unwrap(),
            None
        );
        let s = ClientSettings {
            forwarded_for: Some(ForwardedFor::TrustedCidrs(vec!["10.0.0.0/40".into()])),
            ..ClientSettings::default()
        };
        assert!(PortClient::build(80, &s).is_err());
    }
}
