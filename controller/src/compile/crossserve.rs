//! Cross serving: an HTTPRoute and a GRPCRoute never share a hostname on a listener.
//!
//! In: the attached [`Routes`] and the Gateways. Out: the same routes, with the attachments
//! that lose a conflict removed and, for a parentRef that lost every listener it attached to,
//! `Accepted=False HostnameConflict` in its status entry.
//!
//! The GRPCRoute spec (`spec.hostnames`, "cross serving" in GEP-1016): when a route of one kind
//! is attached to a listener that already has a route of the other kind, and their hostnames
//! intersect, exactly one of the two is accepted: the oldest by creationTimestamp, then the
//! first by `namespace/name`. We decide per listener, oldest route first (routes without a
//! timestamp, as in files `tollgate run` reads, after those with one), each route keeping the
//! listener unless a route of the other kind kept before it intersects it. Intersection is on
//! the effective hostnames (a route without hostnames takes the listener's, `*` for none), so a
//! listener without a hostname serves one kind unless every route names its hostnames.
//! `attachedRoutes` is unchanged: the spec bases it on allowedRoutes and parentRefs only.
//!
//! Only routes with valid rules take part (only they have attachments): a rejected route holds
//! no hostname, so it cannot take one from a working route of the other kind.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tollgate_api::ObjectKey;

use super::conditions::{ACCEPTED, Conds, reason};
use super::hostnames::intersect;
use super::kinds::RouteKind;
use super::listeners::GatewayModel;
use super::routes::{RouteModel, Routes};

/// Whether two lists of effective hostnames share a host.
fn overlaps(a: &[String], b: &[String]) -> bool {
    a.iter()
        .any(|x| b.iter().any(|y| intersect(Some(x), y).is_some()))
}

/// Age order: oldest first, routes without a timestamp last, then `namespace/name`, then kind.
fn age<'r>(r: &'r RouteModel<'_>) -> (bool, Option<Timestamp>, &'r ObjectKey, RouteKind) {
    let created = r.meta.creation_timestamp.as_ref().map(|t| t.0);
    (created.is_none(), created, &r.key, r.kind)
}

/// Removes the attachments that lose a cross-serving conflict (see the module docs).
pub fn resolve(routes: &mut Routes<'_>, gateways: &[GatewayModel<'_>], now: &Time) {
    // Only an attached HTTPRoute and an attached GRPCRoute can conflict (TLSRoutes live on
    // listeners of their own): without both, the common case, there is nothing to decide.
    let attached = |kind| {
        routes
            .routes
            .iter()
            .any(|r| r.kind == kind && !r.attachments.is_empty())
    };
    if !(attached(RouteKind::Http) && attached(RouteKind::Grpc)) {
        return;
    }
    // (gateway, listener) -> [(route, attachment)]
    let mut by_listener: BTreeMap<(usize, usize), Vec<(usize, usize)>> = BTreeMap::new();
    for (ri, r) in routes.routes.iter().enumerate() {
        for (ai, a) in r.attachments.iter().enumerate() {
            by_listener
                .entry((a.gateway, a.listener))
                .or_default()
                .push((ri, ai));
        }
    }
    // (route, attachment) -> the route that won
    let mut lost: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    for mut entries in by_listener.into_values() {
        let rs = &routes.routes;
        let kinds: BTreeSet<_> = entries.iter().map(|&(ri, _)| rs[ri].kind).collect();
        if kinds.len() < 2 {
            continue;
        }
        entries.sort_by(|a, b| age(&rs[a.0]).cmp(&age(&rs[b.0])).then(a.1.cmp(&b.1)));
        let mut kept: Vec<(usize, usize)> = Vec::new();
        for (ri, ai) in entries {
            let hosts = &rs[ri].attachments[ai].hostnames;
            let winner = kept.iter().find(|&&(kri, kai)| {
                rs[kri].kind != rs[ri].kind && overlaps(&rs[kri].attachments[kai].hostnames, hosts)
            });
            match winner {
                Some(&(wri, _)) => {
                    lost.insert((ri, ai), wri);
                }
                None => kept.push((ri, ai)),
            }
        }
    }
    if lost.is_empty() {
        return;
    }
    let mut by_route: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
    for (&(ri, ai), &winner) in &lost {
        by_route.entry(ri).or_default().push((ai, winner));
    }
    for (ri, losses) in by_route {
        let (winner_kind, winner_key) = {
            let w = &routes.routes[losses[0].1];
            (w.kind, w.key.clone())
        };
        let r = &mut routes.routes[ri];
        let first = &r.attachments[losses[0].0];
        let gw = &gateways[first.gateway];
        let message = format!(
            "Gateway {} listener {}: hostnames intersect those of {winner_kind} {winner_key}, \
             which is older (or, as old, first by namespace/name); an HTTPRoute and a GRPCRoute \
             cannot share a hostname on a listener",
            gw.key, gw.listeners[first.listener].spec.name
        );
        let before: BTreeSet<usize> = r.attachments.iter().map(|a| a.parent).collect();
        let gone: BTreeSet<usize> = losses.iter().map(|&(ai, _)| ai).collect();
        let mut ai = 0;
        std::sync::Arc::make_mut(&mut r.attachments).retain(|_| {
            let keep = !gone.contains(&ai);
            ai += 1;
            keep
        });
        let after: BTreeSet<usize> = r.attachments.iter().map(|a| a.parent).collect();
        let conds = Conds::new(r.meta.generation, now);
        for pi in before.difference(&after) {
            for c in r.parents[*pi].conditions.iter_mut() {
                if c.type_ == ACCEPTED {
                    *c = conds.no(ACCEPTED, reason::HOSTNAME_CONFLICT, message.clone());
                }
            }
        }
    }
}
