// Command kubectl is a thin wrapper so that a kubectl matching the API server
// version can be built from the Go module proxy (k8s.io/kubectl). It mirrors
// k8s.io/kubernetes/cmd/kubectl/kubectl.go of the same Kubernetes release.
// e2e/cluster.sh builds it only when no kubectl is on PATH, or when
// TOLLGATE_KUBECTL=build.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// Import to initialize client auth plugins.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	// Parse the verbosity flag before the command is built, as upstream does.
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		// Pretty-print the error and exit with an error.
		util.CheckErr(err)
	}
}
