module tollgate.local/e2e/k8s/echo-basic

go 1.25.0

// Builds the Gateway API conformance backend (the image
// gcr.io/k8s-staging-gateway-api/echo-basic) from the module proxy, for the
// node agent of `e2e/cluster.sh up --full`: go build sigs.k8s.io/gateway-api/conformance/echo-basic
require sigs.k8s.io/gateway-api/conformance v1.5.1

require (
	golang.org/x/net v0.49.0 // indirect
	golang.org/x/sys v0.40.0 // indirect
	golang.org/x/text v0.33.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20251029180050-ab9386a59fda // indirect
	google.golang.org/grpc v1.78.0 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
