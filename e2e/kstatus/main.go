// Command kstatus-check reads one live object through the dynamic client and
// computes its kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute), the
// library Flux (kustomize-controller `wait`/healthChecks), `kpt live` and
// other GitOps tools judge health with. It polls until the computed status is
// the expected one or the timeout passes.
//
//	kstatus-check --kubeconfig K --resource tollgate.dev/v1alpha1/ratelimitpolicies \
//	    --namespace NS --name N --want Current [--timeout 30s] [--interval 200ms]
//
// --resource is group/version/resource (core group: v1/pods); instead of it,
// --kind Kind --api-version group/version resolves the resource through
// discovery.
//
// Every change of the computed status is printed as one line,
// `status=<Status> message="<message>" generation=<g> observedGeneration=<o>`,
// and the last line is `ok: ...` or `timeout: ...`.
//
// Exit codes: 0 the object reached --want; 1 it did not within --timeout (the
// last computed status is printed); 2 bad arguments or an unusable kubeconfig.
// A missing object is polled like any other state (status "NotFound").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type options struct {
	kubeconfig string
	resource   string
	kind       string
	apiVersion string
	namespace  string
	name       string
	want       string
	timeout    time.Duration
	interval   time.Duration
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	var o options
	fs := flag.NewFlagSet("kstatus-check", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file")
	fs.StringVar(&o.resource, "resource", "", "group/version/resource, e.g. tollgate.dev/v1alpha1/ratelimitpolicies (core: v1/pods)")
	fs.StringVar(&o.kind, "kind", "", "kind, resolved through discovery (with --api-version) instead of --resource")
	fs.StringVar(&o.apiVersion, "api-version", "", "group/version of --kind")
	fs.StringVar(&o.namespace, "namespace", "", "namespace (empty for cluster-scoped objects)")
	fs.StringVar(&o.name, "name", "", "object name")
	fs.StringVar(&o.want, "want", "", "expected status: Current, InProgress, Failed (also Terminating, NotFound, Unknown)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to poll")
	fs.DurationVar(&o.interval, "interval", 200*time.Millisecond, "poll interval")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := o.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "kstatus-check: %v\n", err)
		fs.Usage()
		return 2
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus-check: kubeconfig: %v\n", err)
		return 2
	}
	// Many quick reads: more than client-go's default 5 QPS.
	cfg.QPS, cfg.Burst = 50, 100
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus-check: client: %v\n", err)
		return 2
	}
	gvr, err := o.gvr(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus-check: %v\n", err)
		return 2
	}
	var ri dynamic.ResourceInterface = client.Resource(gvr)
	if o.namespace != "" {
		ri = client.Resource(gvr).Namespace(o.namespace)
	}
	ref := o.name
	if o.namespace != "" {
		ref = o.namespace + "/" + o.name
	}

	// Each read has its own deadline, so the last observation is the object's state, not
	// an error from running out of time mid-request.
	deadline := time.Now().Add(o.timeout)
	last := ""
	for {
		obs := observe(ri, o.name)
		if obs.text() != last {
			last = obs.text()
			fmt.Println(last)
		}
		if obs.status == o.want {
			fmt.Printf("ok: %s %s is %s\n", gvr.Resource, ref, o.want)
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Printf("timeout: %s %s is %s after %s, not %s\n", gvr.Resource, ref, obs.status, o.timeout, o.want)
			return 1
		}
		time.Sleep(o.interval)
	}
}

func (o *options) validate() error {
	switch {
	case o.kubeconfig == "":
		return errors.New("--kubeconfig (or $KUBECONFIG) is required")
	case o.name == "":
		return errors.New("--name is required")
	case (o.resource == "") == (o.kind == ""):
		return errors.New("give exactly one of --resource and --kind")
	case o.kind != "" && o.apiVersion == "":
		return errors.New("--kind needs --api-version")
	}
	known := []string{
		status.CurrentStatus.String(), status.InProgressStatus.String(), status.FailedStatus.String(),
		status.TerminatingStatus.String(), status.NotFoundStatus.String(), status.UnknownStatus.String(),
	}
	for _, k := range known {
		if o.want == k {
			return nil
		}
	}
	return fmt.Errorf("--want must be one of %s, not %q", strings.Join(known, ", "), o.want)
}

// gvr: --resource parsed, or --kind mapped through discovery.
func (o *options) gvr(cfg *rest.Config) (schema.GroupVersionResource, error) {
	if o.resource != "" {
		parts := strings.Split(o.resource, "/")
		switch len(parts) {
		case 2:
			return schema.GroupVersionResource{Version: parts[0], Resource: parts[1]}, nil
		case 3:
			return schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}, nil
		}
		return schema.GroupVersionResource{}, fmt.Errorf("--resource %q is not group/version/resource", o.resource)
	}
	gv, err := schema.ParseGroupVersion(o.apiVersion)
	if err != nil {
		return schema.GroupVersionResource{}, fmt.Errorf("--api-version: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return schema.GroupVersionResource{}, err
	}
	var mapper meta.RESTMapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	m, err := mapper.RESTMapping(gv.WithKind(o.kind).GroupKind(), gv.Version)
	if err != nil {
		return schema.GroupVersionResource{}, fmt.Errorf("mapping %s %s: %w", o.apiVersion, o.kind, err)
	}
	return m.Resource, nil
}

// observation: one read of the object and its computed status.
type observation struct {
	status     string
	message    string
	generation string
	observed   string
}

func (l observation) text() string {
	return fmt.Sprintf("status=%s message=%q generation=%s observedGeneration=%s",
		l.status, l.message, l.generation, l.observed)
}

func observe(ri dynamic.ResourceInterface, name string) observation {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u, err := ri.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return observation{status: status.NotFoundStatus.String(), message: "not found", generation: "-", observed: "-"}
	case err != nil:
		return observation{status: "Error", message: err.Error(), generation: "-", observed: "-"}
	}
	return compute(u)
}

func compute(u *unstructured.Unstructured) observation {
	o := observation{generation: "-", observed: "-"}
	if g, ok, _ := unstructured.NestedInt64(u.Object, "metadata", "generation"); ok {
		o.generation = fmt.Sprint(g)
	}
	if g, ok, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration"); ok {
		o.observed = fmt.Sprint(g)
	}
	res, err := status.Compute(u)
	if err != nil {
		o.status, o.message = "Error", err.Error()
		return o
	}
	o.status, o.message = res.Status.String(), res.Message
	return o
}
