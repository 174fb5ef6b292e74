// extauthz-grpc: a tiny Envoy ext_authz gRPC service built on the published protos
// (github.com/envoyproxy/go-control-plane/envoy/service/auth/v3), for Tollgate's socket
// tests and benchmarks of the AuthPolicy `external` gRPC method.
//
// A request whose header `x-allow` is `yes` is allowed: the answer adds `x-ext-user: alice`
// (plus `x-ext-path: <the checked path>`) to the upstream request and `x-ext-client: hello`
// to the client's answer. Any other request is denied with 403, the header
// `x-ext-denied: yes` and the body `denied by extauthz\n`.
//
// Usage: extauthz-grpc -listen 127.0.0.1:PORT [-count 127.0.0.1:PORT]
// `-count` serves GET /count on HTTP: the number of Check calls so far.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync/atomic"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	auth "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

type server struct {
	auth.UnimplementedAuthorizationServer
	checks atomic.Int64
}

func header(k, v string) *core.HeaderValueOption {
	return &core.HeaderValueOption{Header: &core.HeaderValue{Key: k, Value: v}}
}

func (s *server) Check(_ context.Context, req *auth.CheckRequest) (*auth.CheckResponse, error) {
	s.checks.Add(1)
	h := req.GetAttributes().GetRequest().GetHttp()
	if h.GetHeaders()["x-allow"] == "yes" {
		return &auth.CheckResponse{
			Status: &status.Status{Code: int32(codes.OK)},
			HttpResponse: &auth.CheckResponse_OkResponse{OkResponse: &auth.OkHttpResponse{
				Headers: []*core.HeaderValueOption{
					header("x-ext-user", "alice"),
					header("x-ext-path", h.GetPath()),
				},
				ResponseHeadersToAdd: []*core.HeaderValueOption{header("x-ext-client", "hello")},
			}},
		}, nil
	}
	return &auth.CheckResponse{
		Status: &status.Status{Code: int32(codes.PermissionDenied)},
		HttpResponse: &auth.CheckResponse_DeniedResponse{DeniedResponse: &auth.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode_Forbidden},
			Headers: []*core.HeaderValueOption{header("x-ext-denied", "yes")},
			Body:    "denied by extauthz\n",
		}},
	}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9191", "gRPC address")
	count := flag.String("count", "", "address of the HTTP /count endpoint (off when empty)")
	flag.Parse()
	s := &server{}
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
