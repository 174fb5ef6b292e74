// Command etcd is a thin wrapper so that etcd can be built from the Go module
// proxy (go.etcd.io/etcd/server/v3) without cloning the etcd repository.
// It is equivalent to etcd's own server/main.go.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
