// The standard gRPC health service (grpc-go's google.golang.org/grpc/health), served beside
// Authorization so the gRPC-Web test (e2e/grpc-web-test.sh) calls a real gRPC backend with a
// unary method (Health/Check) and a server-streaming one (Health/Watch).
//
// Statuses: the server as a whole ("") and envoy.service.auth.v3.Authorization are SERVING;
// "ticker" flips between SERVING and NOT_SERVING every 100 ms, so a Watch on it yields a
// message per flip. A Watch on "ticker" ends after tickerUpdates messages with the status
// OUT_OF_RANGE and the message "ticker: N updates sent": a stream whose error comes in the
// trailers after its messages (the health service's own Watch never ends). Any other service
// is unknown: Check answers NOT_FOUND, Watch SERVICE_UNKNOWN (as grpc-go does).
package main

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

const (
	tickerService = "ticker"
	tickerUpdates = 6
	tickerPeriod  = 100 * time.Millisecond
)

func registerHealth(g *grpc.Server) {
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("envoy.service.auth.v3.Authorization", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(tickerService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	go func() {
		serving := true
		for range time.Tick(tickerPeriod) {
			serving = !serving
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if serving {
				st = healthpb.HealthCheckResponse_SERVING
			}
			hs.SetServingStatus(tickerService, st)
		}
	}()
}

var errTickerDone = errors.New("ticker: enough updates sent")

// tickerStream counts the messages a Watch on "ticker" sends and refuses the one past
// tickerUpdates, which makes the health server's Watch return.
type tickerStream struct {
	grpc.ServerStream
	ticker bool
	sent   int
}

func (t *tickerStream) RecvMsg(m any) error {
	err := t.ServerStream.RecvMsg(m)
	if req, ok := m.(*healthpb.HealthCheckRequest); ok && err == nil {
		t.ticker = req.GetService() == tickerService
	}
	return err
}

func (t *tickerStream) SendMsg(m any) error {
	if t.ticker && t.sent >= tickerUpdates {
		return errTickerDone
	}
	t.sent++
	return t.ServerStream.SendMsg(m)
}

// tickerLimit ends a Watch on "ticker" with OUT_OF_RANGE after tickerUpdates messages; every
// other stream passes untouched.
func tickerLimit(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != healthpb.Health_Watch_FullMethodName {
		return handler(srv, ss)
	}
	t := &tickerStream{ServerStream: ss}
	err := handler(srv, t)
	if t.ticker && t.sent >= tickerUpdates {
		return status.Error(codes.OutOfRange, fmt.Sprintf("ticker: %d updates sent", t.sent))
	}
	return err
}
