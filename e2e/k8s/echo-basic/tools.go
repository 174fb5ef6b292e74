//go:build tools

// Package tools pins sigs.k8s.io/gateway-api/conformance/echo-basic (a main
// package) in go.mod and go.sum; e2e/cluster.sh builds it by import path.
package tools

import _ "sigs.k8s.io/gateway-api/conformance/echo-basic"
