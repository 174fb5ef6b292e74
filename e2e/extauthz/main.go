// extauthz-grpc: a tiny Envoy ext_authz gRPC service built on the published protos
// (github.com/envoyproxy/go-control-plane/envoy/service/auth/v3), for Tollgate's socket
// tests and benchmarks of the AuthPolicy `external` gRPC method. It also serves grpc-go's
// standard health service (grpc.health.v1.Health), the gRPC backend of the gRPC-Web test
// (e2e/grpc-web-test.sh): see health.go.
//
// A request whose header `x-allow` is `yes` is allowed: the answer adds `x-ext-user: alice`
// (plus `x-ext-path: <the checked path>`) to the upstream request and `x-ext-client: hello`
// to the client's answer. Any other request is denied with 403, the header
// `x-ext-denied: yes` and the body `denied by extauthz\n`.
//
// A request whose `x-allow` is `hostile` is allowed with an answer that tries to break the
// request and the client's response: `ok_response.headers` set Host, Content-Length,
// Transfer-Encoding, Connection and Upgrade (besides `x-ext-user: alice`),
// `headers_to_remove` names Host, and `response_headers_to_add` sets Content-Length,
// Transfer-Encoding and Connection (besides `x-ext-client: hello`). A gateway must keep
// every one of those out.
//
// Usage: extauthz-grpc -listen 127.0.0.1:PORT [-count 127.0.0.1:PORT]
//
//	[-tls-cert FILE -tls-key FILE]
//
// `-count` serves GET /count on HTTP: the number of Check calls so far, and GET /peer: how
// the last Check call came (`tls alpn=h2 sni=NAME`, or `plaintext`). With `-tls-cert` and
// `-tls-key` the service speaks only TLS (gRPC over TLS requires ALPN `h2`: grpc-go refuses
// a client that does not offer it).
package main

import (
	"context"
	"crypto/tls"
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
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

type server struct {
	auth.UnimplementedAuthorizationServer
	checks atomic.Int64
	// How the last Check call came: "tls alpn=h2 sni=NAME" or "plaintext".
	last atomic.Value
}

func header(k, v string) *core.HeaderValueOption {
	return &core.HeaderValueOption{Header: &core.HeaderValue{Key: k, Value: v}}
}

func (s *server) Check(ctx context.Context, req *auth.CheckRequest) (*auth.CheckResponse, error) {
	s.checks.Add(1)
	how := "plaintext"
	if p, ok := peer.FromContext(ctx); ok {
		if t, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			how = fmt.Sprintf("tls alpn=%s sni=%s", t.State.NegotiatedProtocol, t.State.ServerName)
		}
	}
	s.last.Store(how)
	h := req.GetAttributes().GetRequest().GetHttp()
	if h.GetHeaders()["x-allow"] == "hostile" {
		return &auth.CheckResponse{
			Status: &status.Status{Code: int32(codes.OK)},
			HttpResponse: &auth.CheckResponse_OkResponse{OkResponse: &auth.OkHttpResponse{
				Headers: []*core.HeaderValueOption{
					header("x-ext-user", "alice"),
					header("host", "evil.test"),
					header("content-length", "1"),
					header("transfer-encoding", "chunked"),
					header("connection", "close"),
					header("upgrade", "websocket"),
				},
				HeadersToRemove: []string{"host"},
				ResponseHeadersToAdd: []*core.HeaderValueOption{
					header("x-ext-client", "hello"),
					header("content-length", "1"),
					header("transfer-encoding", "chunked"),
					header("connection", "close"),
				},
			}},
		}, nil
	}
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
	count := flag.String("count", "", "address of the HTTP /count and /peer endpoints (off when empty)")
	certFile := flag.String("tls-cert", "", "serve TLS with this PEM certificate (with -tls-key)")
	keyFile := flag.String("tls-key", "", "the PEM key of -tls-cert")
	flag.Parse()
	s := &server{}
	s.last.Store("none")
	if *count != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/count", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "%d\n", s.checks.Load())
		})
		mux.HandleFunc("/peer", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "%s\n", s.last.Load())
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
	var opts []grpc.ServerOption
	if *certFile != "" || *keyFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			log.Fatalf("tls: %v", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{cert},
			MinVersion:   tls.VersionTLS12,
		})))
	}
	opts = append(opts, grpc.StreamInterceptor(tickerLimit))
	g := grpc.NewServer(opts...)
	auth.RegisterAuthorizationServer(g, s)
	registerHealth(g)
	fmt.Printf("listening %s\n", l.Addr())
	log.Fatal(g.Serve(l))
}
