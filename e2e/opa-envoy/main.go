// opa-envoy-grpc: Open Policy Agent's policy engine (github.com/open-policy-agent/opa, the
// Rego evaluator OPA-Envoy runs) behind Envoy's ext_authz gRPC protocol
// (envoy.service.auth.v3.Authorization/Check, go-control-plane's published protos), for the
// external authorization benchmark (e2e/bench/external-authz.sh, SERVICES=opa).
//
// OPA-Envoy itself (module github.com/open-policy-agent/opa-envoy-plugin) is not served by the
// Go module proxy this project can reach, so this program does per Check call what its gRPC
// server does: the CheckRequest becomes the policy's input (every field under its JSON name,
// plus `parsed_path`, `parsed_query`, `parsed_body` and `version`), converted to a Rego value
// and evaluated against a query prepared once (default `data.envoy.authz.allow`, the plugin's
// default path), with fresh evaluation metrics per call. A decision of `true` (or an object
// whose `allowed` is true) allows the request; anything else, an undefined decision or an
// evaluation error denies it with 403.
//
// The built-in policy is the one of OPA-Envoy's standalone Envoy tutorial (policy.rego): an
// HS256 JWT bearer token (secret `secret`) whose `role` claim (guest, admin) decides which
// methods and paths (/people/*) are allowed.
//
// Usage: opa-envoy-grpc -listen 127.0.0.1:PORT [-count 127.0.0.1:PORT] [-policy FILE.rego]
// [-query data.envoy.authz.allow]. `-count` serves GET /count on HTTP: the number of Check
// calls so far.
package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"

	auth "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/reflect/protoreflect"
)

//go:embed policy.rego
var tutorialPolicy string

type server struct {
	auth.UnimplementedAuthorizationServer
	query  rego.PreparedEvalQuery
	checks atomic.Int64
}

// message turns a protobuf message into the map OPA-Envoy hands the policy: fields under their
// JSON names, maps and lists as Go maps and slices, scalars as Go values.
func message(m protoreflect.Message) map[string]any {
	out := make(map[string]any, m.Descriptor().Fields().Len())
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			mv := v.Map()
			entries := make(map[string]any, mv.Len())
			mv.Range(func(k protoreflect.MapKey, e protoreflect.Value) bool {
				entries[k.String()] = scalarOr(fd.MapValue(), e)
				return true
			})
			out[fd.JSONName()] = entries
		case fd.IsList():
			l := v.List()
			items := make([]any, l.Len())
			for i := range items {
				items[i] = scalarOr(fd, l.Get(i))
			}
			out[fd.JSONName()] = items
		default:
			out[fd.JSONName()] = scalarOr(fd, v)
		}
		return true
	})
	return out
}

func scalarOr(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return message(v.Message())
	case protoreflect.EnumKind:
		return int64(v.Enum())
	case protoreflect.BytesKind:
		return string(v.Bytes())
	default:
		return v.Interface()
	}
}

// input is the policy's input for one CheckRequest, as OPA-Envoy builds it.
func input(req *auth.CheckRequest) (map[string]any, error) {
	in := message(req.ProtoReflect())
	in["version"] = map[string]any{"ext_authz": "v3", "encoding": "protojson"}
	u, err := url.Parse(req.GetAttributes().GetRequest().GetHttp().GetPath())
	if err != nil {
		return nil, err
	}
	segments := strings.Split(strings.TrimLeft(u.Path, "/"), "/")
	parsedPath := make([]any, len(segments))
	for i, s := range segments {
		parsedPath[i] = s
	}
	parsedQuery := map[string]any{}
	for k, vs := range u.Query() {
		values := make([]any, len(vs))
		for i, v := range vs {
			values[i] = v
		}
		parsedQuery[k] = values
	}
	in["parsed_path"] = parsedPath
	in["parsed_query"] = parsedQuery
	in["parsed_body"] = nil
	in["truncated_body"] = false
	return in, nil
}

func (s *server) allowed(ctx context.Context, req *auth.CheckRequest) bool {
	in, err := input(req)
	if err != nil {
		return false
	}
	v, err := ast.InterfaceToValue(in)
	if err != nil {
		return false
	}
	rs, err := s.query.Eval(ctx, rego.EvalParsedInput(v), rego.EvalMetrics(metrics.New()))
	if err != nil || len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return false
	}
	switch d := rs[0].Expressions[0].Value.(type) {
	case bool:
		return d
	case map[string]any:
		ok, _ := d["allowed"].(bool)
		return ok
	}
	return false
}

func (s *server) Check(ctx context.Context, req *auth.CheckRequest) (*auth.CheckResponse, error) {
	s.checks.Add(1)
	if s.allowed(ctx, req) {
		return &auth.CheckResponse{
			Status:       &status.Status{Code: int32(codes.OK)},
			HttpResponse: &auth.CheckResponse_OkResponse{OkResponse: &auth.OkHttpResponse{}},
		}, nil
	}
	return &auth.CheckResponse{
		Status: &status.Status{Code: int32(codes.PermissionDenied)},
		HttpResponse: &auth.CheckResponse_DeniedResponse{DeniedResponse: &auth.DeniedHttpResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_Forbidden},
		}},
	}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9191", "gRPC address")
	count := flag.String("count", "", "address of the HTTP /count endpoint (off when empty)")
	policyFile := flag.String("policy", "", "Rego policy file (default: OPA-Envoy's tutorial policy)")
	queryText := flag.String("query", "data.envoy.authz.allow", "the decision's query")
	flag.Parse()
	policy, name := tutorialPolicy, "policy.rego"
	if *policyFile != "" {
		b, err := os.ReadFile(*policyFile)
		if err != nil {
			log.Fatalf("policy: %v", err)
		}
		policy, name = string(b), *policyFile
	}
	pq, err := rego.New(rego.Query(*queryText), rego.Module(name, policy)).PrepareForEval(context.Background())
	if err != nil {
		log.Fatalf("policy: %v", err)
	}
	s := &server{query: pq}
	if *count != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/count", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "%d\n", s.checks.Load())
		})
		cl, err := net.Listen("tcp", *count)
		if err != nil {
			log.Fatalf("count listener: %v", err)
		}
		go func() { log.Fatal(http.Serve(cl, mux)) }()
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listen: %v", err)
	}
	g := grpc.NewServer()
	auth.RegisterAuthorizationServer(g, s)
	fmt.Printf("listening %s\n", l.Addr())
	log.Fatal(g.Serve(l))
}
