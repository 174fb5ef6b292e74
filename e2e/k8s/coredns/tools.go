//go:build tools

// Package tools pins github.com/coredns/coredns (a main package) in go.mod and
// go.sum; e2e/cluster.sh builds it by import path for the conformance suite's
// UDPRoute test, whose backend is CoreDNS.
package tools

import _ "github.com/coredns/coredns"
