//! Golden files and determinism: the same input, in any order, gives byte-identical output.
//!
//! `UPDATE_GOLDEN=1 cargo test --test compile_golden` rewrites the golden files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::{Inputs, Objects, Output, compile};

fn json(out: &Output) -> String {
    serde_json::to_string_pretty(out).unwrap()
}

#[track_caller]
fn check_golden(name: &str, actual: &str) {
    let path = fixture_path(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "{name} differs from the compiled output at line {}:\n expected: {:?}\n   actual: {:?}\n(run with UPDATE_GOLDEN=1 to accept)",
            line + 1,
            expected.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}

#[test]
fn golden_tables() {
    let out = run(&["golden"], "");
    assert!(out.rejections().is_empty(), "{:#?}", out.rejections());
    let tables: Vec<_> = out.tables.values().collect();
    check_golden(
        "golden-tables.golden.json",
        &(serde_json::to_string_pretty(&tables).unwrap() + "\n"),
    );
}

#[test]
fn golden_statuses() {
    let mut out = run(&["golden"], "");
    out.tables.clear();
    check_golden("golden-status.golden.json", &(json(&out) + "\n"));
}

/// A deterministic reshuffle: reverse, then interleave from both ends.
fn shuffle<T: Clone>(objects: &mut Objects<T>) {
    let mut v: Vec<T> = objects.iter().cloned().collect();
    v.reverse();
    let mut out = Vec::with_capacity(v.len());
    let (mut i, mut j) = (0usize, v.len());
    while i < j {
        j -= 1;
        out.push(v[j].clone());
        if i < j {
            out.push(v[i].clone());
        }
        i += 1;
    }
    *objects = out.into();
}

fn shuffled(mut i: Inputs) -> Inputs {
    shuffle(&mut i.gateway_classes);
    shuffle(&mut i.gateways);
    shuffle(&mut i.http_routes);
    shuffle(&mut i.grpc_routes);
    shuffle(&mut i.reference_grants);
    shuffle(&mut i.services);
    shuffle(&mut i.endpoint_slices);
    shuffle(&mut i.secrets);
    shuffle(&mut i.namespaces);
    for s in &mut i.endpoint_slices {
        s.endpoints.reverse();
    }
    i
}

#[test]
fn determinism_compile_twice() {
    let inputs = inputs(&["listeners", "attachment", "rules", "golden", "grpc"], "");
    assert_eq!(json(&compile(&inputs)), json(&compile(&inputs)));
}

#[test]
fn determinism_shuffled_inputs() {
    let inputs = inputs(&["listeners", "attachment", "rules", "golden", "grpc"], "");
    let a = json(&compile(&inputs));
    let once = shuffled(inputs.clone());
    assert_ne!(
        once.http_routes
            .iter()
            .map(|r| r.metadata.name.clone())
            .collect::<Vec<_>>(),
        inputs
            .http_routes
            .iter()
            .map(|r| r.metadata.name.clone())
            .collect::<Vec<_>>(),
        "the shuffle must change the order"
    );
    assert_eq!(a, json(&compile(&once)));
    assert_eq!(a, json(&compile(&shuffled(once))));
}

#[test]
fn duplicate_objects_resolve_deterministically() {
    let mut inputs = inputs(&["golden"], "");
    let mut changed = inputs.services[0].clone();
    changed.metadata.annotations = Some(
        [(
            "tollgate.dev/load-balancer".to_owned(),
            "round-robin".to_owned(),
        )]
        .into(),
    );
    inputs.services.push(changed.clone());
    let a = json(&compile(&inputs));
    let mut other = inputs.clone();
    other.services.retain(|s| *s != changed);
    other.services.insert(0, changed);
    assert_eq!(a, json(&compile(&other)));
}
