// Command kube-apiserver is a thin wrapper so that the Kubernetes API server
// can be built from the Go module proxy (k8s.io/kubernetes plus its published
// staging modules) without cloning the kubernetes repository. It mirrors
// k8s.io/kubernetes/cmd/kube-apiserver/apiserver.go of the pinned version.
package main

import (
	"os"
	_ "time/tzdata" // for timeZone support in CronJob

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	command := app.NewAPIServerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
