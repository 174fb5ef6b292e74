// Package conformance runs the upstream Gateway API conformance suite. Its options come
// from the suite's own flags (-gateway-class, -conformance-profiles, -supported-features,
// -report-output, ...), which e2e/conformance.sh sets; nothing here changes how the suite
// judges an implementation.
package conformance

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
