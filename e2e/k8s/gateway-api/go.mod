module tollgate.local/e2e/k8s/gateway-api

go 1.25.0

// Pins the Gateway API release our Rust types are generated from. Nothing is
// compiled from it: e2e/cluster.sh only reads the CRD YAML shipped in the
// module zip (config/crd/{standard,experimental}), located with
//   go mod download sigs.k8s.io/gateway-api
//   go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api
require sigs.k8s.io/gateway-api v1.6.3
