// Command kube-controller-manager is a thin wrapper so that the Kubernetes
// controller manager can be built from the Go module proxy (k8s.io/kubernetes
// plus its published staging modules) without cloning the kubernetes
// repository. It mirrors
// k8s.io/kubernetes/cmd/kube-controller-manager/controller-manager.go of the
// pinned version.
package main

import (
	"os"
	_ "time/tzdata" // for CronJob Time Zone support

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	command := app.NewControllerManagerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
