//! examples/gitops: the Argo CD Application and the Flux GitRepository + Kustomization
//! cannot be applied here (no Argo CD, no Flux, not even their CRDs), so they are checked
//! structurally: the fields each kind requires, only fields its API has (a typo fails),
//! paths that exist in this repository, and health checks that name objects the synced
//! directory holds. k8s_kstatus.rs applies that directory to a real API server and checks
//! its policies become Current (kstatus) and Healthy (the Argo CD health check).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn gitops() -> PathBuf {
    workspace().join("examples/gitops")
}

fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    let mut cur = v;
    for k in path.split('.') {
        cur = &cur[k];
    }
    cur.as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| panic!("{path} must be a non-empty string in {v}"))
}

/// The keys of `v` at `path` are all in `allowed` (fields of that API type).
fn only(v: &Value, path: &str, allowed: &[&str]) {
    let mut cur = v;
    for k in path.split('.').filter(|k| !k.is_empty()) {
        cur = &cur[k];
    }
    let obj = cur
        .as_object()
        .unwrap_or_else(|| panic!("{path} is not an object"));
    for k in obj.keys() {
        assert!(
            allowed.contains(&k.as_str()),
            "{path}.{k} is not a field of its type"
        );
    }
}

fn is_duration(s: &str) -> bool {
    // Go time.ParseDuration as Flux and Argo CD read it, e.g. 1m, 10s, 1h30m.
    let mut rest = s;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "h", "m", "s"].iter().find(|u| rest.starts_with(**u));
        let Some(u) = unit else { return false };
        rest = &rest[u.len()..];
        parts += 1;
    }
    parts > 0
}

/// The objects of the synced directory: (apiVersion, kind, name), and the Namespace.
fn app_objects(dir: &Path) -> (BTreeSet<(String, String, String)>, String) {
    let mut objs = BTreeSet::new();
    let mut namespace = None;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        for d in docs(&p) {
            let kind = str_at(&d, "kind").to_owned();
            let name = str_at(&d, "metadata.name").to_owned();
            if kind == "Namespace" {
                assert!(namespace.is_none(), "one Namespace");
                namespace = Some(name.clone());
            } else {
                assert!(
                    d["metadata"].get("namespace").is_none(),
                    "{}: {kind} {name} names a namespace; the GitOps tool sets it",
                    p.display()
                );
            }
            objs.insert((str_at(&d, "apiVersion").to_owned(), kind, name));
        }
    }
    (objs, namespace.expect("a Namespace object"))
}

/// `path` (relative to the repository root, `./` allowed) is a directory of manifests.
fn repo_dir(path: &str) -> PathBuf {
    let dir = workspace().join(path.trim_start_matches("./"));
    assert!(dir.is_dir(), "{path} is not a directory of the repository");
    dir
}

fn repo_url() -> String {
    let chart = std::fs::read_to_string(workspace().join("charts/tollgate/Chart.yaml")).unwrap();
    let home = chart
        .lines()
        .find_map(|l| l.strip_prefix("home: "))
        .unwrap();
    format!("{}.git", home.trim())
}

#[test]
fn the_argo_cd_application_is_well_formed() {
    let all = docs(&gitops().join("argocd-application.yaml"));
    assert_eq!(all.len(), 1);
    let app = &all[0];
    assert_eq!(str_at(app, "apiVersion"), "argoproj.io/v1alpha1");
    assert_eq!(str_at(app, "kind"), "Application");
    str_at(app, "metadata.name");
    str_at(app, "metadata.namespace");
    only(app, "", &["apiVersion", "kind", "metadata", "spec"]);
    only(
        app,
        "spec",
        &[
            "project",
            "source",
            "sources",
            "destination",
            "syncPolicy",
            "ignoreDifferences",
            "info",
            "revisionHistoryLimit",
        ],
    );
    str_at(app, "spec.project");
    only(
        app,
        "spec.source",
        &[
            "repoURL",
            "targetRevision",
            "path",
            "chart",
            "helm",
            "kustomize",
            "directory",
            "plugin",
            "ref",
            "name",
        ],
    );
    assert_eq!(str_at(app, "spec.source.repoURL"), repo_url());
    str_at(app, "spec.source.targetRevision");
    let dir = repo_dir(str_at(app, "spec.source.path"));
    let (_, namespace) = app_objects(&dir);
    only(app, "spec.destination", &["server", "name", "namespace"]);
    assert!(
        app["spec"]["destination"]["server"].is_string()
            != app["spec"]["destination"]["name"].is_string(),
        "destination: server or name"
    );
    assert_eq!(str_at(app, "spec.destination.namespace"), namespace);
    only(
        app,
        "spec.syncPolicy",
        &[
            "automated",
            "syncOptions",
            "retry",
            "managedNamespaceMetadata",
        ],
    );
    only(
        app,
        "spec.syncPolicy.automated",
        &["prune", "selfHeal", "allowEmpty", "enabled"],
    );
    for k in ["prune", "selfHeal"] {
        assert!(
            app["spec"]["syncPolicy"]["automated"][k].is_boolean(),
            "{k}"
        );
    }
    for o in app["spec"]["syncPolicy"]["syncOptions"].as_array().unwrap() {
        let (k, v) = o.as_str().unwrap().split_once('=').unwrap();
        assert!(!k.is_empty() && (v == "true" || v == "false"), "{o}");
    }
    only(
        app,
        "spec.syncPolicy.retry",
        &["limit", "backoff", "refresh"],
    );
    only(
        app,
        "spec.syncPolicy.retry.backoff",
        &["duration", "factor", "maxDuration"],
    );
    for k in ["duration", "maxDuration"] {
        assert!(is_duration(str_at(
            app,
            &format!("spec.syncPolicy.retry.backoff.{k}")
        )));
    }
}

#[test]
fn the_flux_source_and_kustomization_are_well_formed() {
    let all = docs(&gitops().join("flux-kustomization.yaml"));
    assert_eq!(all.len(), 2);
    let (repo, ks) = (&all[0], &all[1]);
    assert_eq!(str_at(repo, "apiVersion"), "source.toolkit.fluxcd.io/v1");
    assert_eq!(str_at(repo, "kind"), "GitRepository");
    only(
        repo,
        "spec",
        &[
            "url",
            "secretRef",
            "provider",
            "interval",
            "timeout",
            "ref",
            "verify",
            "proxySecretRef",
            "ignore",
            "suspend",
            "recurseSubmodules",
            "include",
            "sparseCheckout",
        ],
    );
    assert_eq!(str_at(repo, "spec.url"), repo_url());
    assert!(is_duration(str_at(repo, "spec.interval")));
    only(
        repo,
        "spec.ref",
        &["branch", "tag", "semver", "name", "commit"],
    );
    str_at(repo, "spec.ref.branch");

    assert_eq!(str_at(ks, "apiVersion"), "kustomize.toolkit.fluxcd.io/v1");
    assert_eq!(str_at(ks, "kind"), "Kustomization");
    only(
        ks,
        "spec",
        &[
            "interval",
            "retryInterval",
            "timeout",
            "sourceRef",
            "path",
            "prune",
            "deletionPolicy",
            "targetNamespace",
            "wait",
            "healthChecks",
            "healthCheckExprs",
            "dependsOn",
            "postBuild",
            "patches",
            "images",
            "components",
            "commonMetadata",
            "namePrefix",
            "nameSuffix",
            "force",
            "suspend",
            "serviceAccountName",
            "decryption",
            "kubeConfig",
        ],
    );
    for k in ["interval", "retryInterval", "timeout"] {
        assert!(is_duration(str_at(ks, &format!("spec.{k}"))), "{k}");
    }
    only(
        ks,
        "spec.sourceRef",
        &["apiVersion", "kind", "name", "namespace"],
    );
    assert_eq!(str_at(ks, "spec.sourceRef.kind"), "GitRepository");
    assert_eq!(
        str_at(ks, "spec.sourceRef.name"),
        str_at(repo, "metadata.name")
    );
    assert_eq!(
        str_at(ks, "metadata.namespace"),
        str_at(repo, "metadata.namespace")
    );
    assert!(str_at(ks, "spec.path").starts_with("./"));
    let (objects, namespace) = app_objects(&repo_dir(str_at(ks, "spec.path")));
    assert_eq!(str_at(ks, "spec.targetNamespace"), namespace);
    assert!(ks["spec"]["prune"].is_boolean());

    // Flux ignores healthChecks under `wait: true`; here they are what it waits for, and each
    // names an object of the synced directory, in the target namespace.
    assert_eq!(ks["spec"]["wait"], Value::Bool(false));
    let checks = ks["spec"]["healthChecks"].as_array().unwrap();
    let mut kinds = BTreeSet::new();
    for c in checks {
        only(c, "", &["apiVersion", "kind", "name", "namespace"]);
        let key = (
            str_at(c, "apiVersion").to_owned(),
            str_at(c, "kind").to_owned(),
            str_at(c, "name").to_owned(),
        );
        assert!(objects.contains(&key), "{key:?} is not in {objects:?}");
        assert_eq!(str_at(c, "namespace"), namespace);
        kinds.insert(key.1);
    }
    assert!(kinds.contains("RateLimitPolicy") && kinds.contains("AuthPolicy"));
}

#[test]
fn the_readmes_point_at_the_files() {
    let readme = std::fs::read_to_string(gitops().join("README.md")).unwrap();
    for f in [
        "argocd-application.yaml",
        "flux-kustomization.yaml",
        "app/",
        "charts/tollgate/argocd",
    ] {
        assert!(
            readme.contains(f),
            "examples/gitops/README.md never names {f}"
        );
    }
    let page = std::fs::read_to_string(workspace().join("docs/gitops.md")).unwrap();
    assert!(
        page.contains("../examples/gitops"),
        "docs/gitops.md links examples/gitops"
    );
    let argocd =
        std::fs::read_to_string(workspace().join("charts/tollgate/argocd/README.md")).unwrap();
    for key in [
        "resource.customizations.health.tollgate.dev_RateLimitPolicy",
        "resource.customizations.health.tollgate.dev_AuthPolicy",
        "resource.customizations.health.tollgate.dev_ClientPolicy",
    ] {
        assert!(argocd.contains(key), "{key}");
    }
}

#[test]
fn durations_parse_as_go_does() {
    for ok in ["1m", "10s", "1h30m", "250ms"] {
        assert!(is_duration(ok), "{ok}");
    }
    for bad in ["", "1", "m", "1 m", "1d"] {
        assert!(!is_duration(bad), "{bad}");
    }
}
