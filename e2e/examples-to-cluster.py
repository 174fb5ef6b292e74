#!/usr/bin/env python3
"""Turns an example of examples/ (written for `tollgate run`) into what a cluster takes, as
docs/kubernetes.md tells users to, for e2e/examples-test.sh:

- the GatewayClass is dropped (the Helm chart creates `tollgate`);
- EndpointSlices written by hand are dropped (Kubernetes derives them from Services);
- a Gateway's pinned `addresses` (127.0.0.1) are dropped: the LoadBalancer gives one;
- a Service without a selector (the demo backend's, whose endpoint `tollgate run` takes from
  the hand-written EndpointSlice) selects the demo backend pod, which is added: a Deployment
  running `tollgate demo-backend` on the port the EndpointSlices named;
- the demo introspection endpoint http://127.0.0.1:9080 becomes that Service's DNS name;
- a ClientPolicy's trusted networks (127.0.0.0/8: the loopback `tollgate run` examples are
  called from) become the loopback cluster's balancer, the node agent, whose connections to
  pods come from the bridge address (BALANCER below, e2e/full.sh's BRIDGE_IP), as the
  README tells users to put their balancer's network there;
- every namespaced object moves to --namespace.

Usage:
  examples-to-cluster.py --namespace NS DIR > out.yaml
  examples-to-cluster.py --namespace NS --kstatus-resources out.yaml
      (prints "KIND API_VERSION NAME" for each Gateway API and policy object of out.yaml)
"""

import argparse
import pathlib
import sys

import yaml

DEMO_IMAGE = "ghcr.io/tollgate-dev/tollgate:examples"
DEMO_LABELS = {"app": "tollgate-demo-backend"}
# Where the loopback cluster's LoadBalancer (the node agent's forwarder) connects to pods from.
BALANCER = "10.244.0.1/32"
KSTATUS_GROUPS = ("gateway.networking.k8s.io/", "tollgate.dev/")


def load(path: pathlib.Path) -> list:
    files = sorted(path.rglob("*.yaml")) + sorted(path.rglob("*.yml")) if path.is_dir() else [path]
    docs = []
    for f in files:
        docs.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    return docs


def demo_backend(port: int) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "tollgate-demo-backend"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": DEMO_LABELS},
            "template": {
                "metadata": {"labels": DEMO_LABELS},
                "spec": {
                    "containers": [
                        {
                            "name": "demo-backend",
                            "image": DEMO_IMAGE,
                            "args": ["demo-backend", "--listen", f"0.0.0.0:{port}"],
                            # The demo backend answers UDP on the same port (examples/udp).
                            "ports": [
                                {"name": "http", "containerPort": port},
                                {"name": "udp", "containerPort": port, "protocol": "UDP"},
                            ],
                            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
                        }
                    ]
                },
            },
        },
    }


def to_cluster(docs: list, ns: str) -> str:
    # The demo backend's port: what the EndpointSlices of selectorless Services name (a Service
    # with a selector, like examples/tls's TLS server, keeps its own pods).
    selectorless_services = {
        d["metadata"]["name"] for d in docs if d.get("kind") == "Service" and not d.get("spec", {}).get("selector")
    }
    ports = {
        p.get("port")
        for d in docs
        if d.get("kind") == "EndpointSlice"
        and d.get("metadata", {}).get("labels", {}).get("kubernetes.io/service-name") in selectorless_services
        for p in d.get("ports", [])
    }
    ports.discard(None)
    if len(ports) > 1:
        sys.exit(f"examples-to-cluster: the EndpointSlices name several ports {sorted(ports)}")
    out, selectorless = [], False
    for d in docs:
        kind = d.get("kind")
        if kind in ("GatewayClass", "EndpointSlice"):
            continue
        if kind == "Namespace":
            out.append(d)
            continue
        d.setdefault("metadata", {})["namespace"] = ns
        if kind == "Gateway":
            d["spec"].pop("addresses", None)
        if kind == "ClientPolicy":
            for section in ("xForwardedFor", "proxyProtocol"):
                trusted = d["spec"].get("clientIP", {}).get(section, {})
                if "trustedCIDRs" in trusted:
                    trusted["trustedCIDRs"] = [
                        BALANCER if c == "127.0.0.0/8" else c for c in trusted["trustedCIDRs"]
                    ]
        if kind == "Service" and not d.get("spec", {}).get("selector"):
            d["spec"]["selector"] = dict(DEMO_LABELS)
            selectorless = True
        out.append(d)
    if selectorless:
        out.append(demo_backend(ports.pop() if ports else 9080))
        out[-1]["metadata"]["namespace"] = ns
    text = yaml.safe_dump_all(out, sort_keys=False)
    return text.replace("http://127.0.0.1:9080", f"http://echo.{ns}.svc.cluster.local")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--kstatus-resources", action="store_true")
    ap.add_argument("path", type=pathlib.Path)
    a = ap.parse_args()
    if a.kstatus_resources:
        for d in load(a.path):
            if d.get("apiVersion", "").startswith(KSTATUS_GROUPS):
                print(d["kind"], d["apiVersion"], d["metadata"]["name"])
        return
    sys.stdout.write(to_cluster(load(a.path), a.namespace))


if __name__ == "__main__":
    main()
