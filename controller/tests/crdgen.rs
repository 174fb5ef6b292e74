//! crds/ and the chart's copy must be what `tollgate crdgen` writes from the Rust types.

use std::path::Path;

#[test]
fn crds_dir_and_chart_copy_match_the_rust_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = tollgate::crds::crd_yaml().unwrap();
    assert_eq!(
        files.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        [
            "authpolicies.tollgate.dev.yaml",
            "backendpolicies.tollgate.dev.yaml",
            "cachepolicies.tollgate.dev.yaml",
            "clientpolicies.tollgate.dev.yaml",
            "gatewayparameters.tollgate.dev.yaml",
            "ratelimitpolicies.tollgate.dev.yaml"
        ]
    );
    for dir in ["crds", "charts/tollgate/crds"] {
        for (name, yaml) in &files {
            let path = root.join(dir).join(name);
            let on_disk = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                on_disk == *yaml,
                "{} is stale: run `cargo run -p tollgate -- crdgen crds && e2e/check-crds.sh --fix`",
                path.display()
            );
        }
    }
}

#[test]
fn crds_carry_status_subresource_and_printer_columns() {
    for (name, yaml) in tollgate::crds::crd_yaml().unwrap() {
        if name.starts_with("gatewayparameters.") {
            // Settings, not a policy: the Gateways and classes naming it carry its verdict.
            assert!(
                !yaml.contains("status: {}"),
                "{name}: no status subresource"
            );
            assert!(yaml.contains(".spec.replicas"), "{name}: Replicas column");
            assert!(yaml.contains("group: tollgate.dev"), "{name}");
            continue;
        }
        assert!(yaml.contains("status: {}"), "{name}: status subresource");
        assert!(
            yaml.contains(r#".status.conditions[?(@.type=="Accepted")].status"#),
            "{name}: Accepted column"
        );
        // BackendPolicy grants and limits nothing per request: it has no Enforced condition.
        assert_eq!(
            yaml.contains(r#".status.conditions[?(@.type=="Enforced")].status"#),
            !name.starts_with("backendpolicies."),
            "{name}: Enforced column"
        );
        assert!(yaml.contains("group: tollgate.dev"), "{name}");
        assert!(yaml.contains("name: v1alpha1"), "{name}");
    }
}

#[test]
fn crd_reference_page_matches_the_schemas() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let page = tollgate::crds::reference::markdown().unwrap();
    let path = root.join("docs/reference/crds.md");
    let on_disk =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        on_disk == page,
        "{} is stale: run `cargo run -p tollgate -- crdgen crds --docs docs/reference/crds.md`",
        path.display()
    );
}
