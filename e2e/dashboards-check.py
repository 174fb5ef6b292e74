#!/usr/bin/env python3
"""e2e/dashboards-check.py: the helpers of e2e/dashboards-test.sh.

  scrape-config RELEASE_NS OUT   reads the chart's ServiceMonitor and PodMonitor (installed in
                                 RELEASE_NS), finds the Services, pods and ports they select on
                                 the cluster (kubectl), fails when they select no controller or
                                 no proxy pod, and writes a Prometheus config with one static
                                 target per selected pod (labels namespace, pod, and for the
                                 proxies the `gateway` the PodMonitor's relabeling gives).
  queries URL DASHBOARD.json... -- NAME=VALUE...
                                 asks Prometheus at URL (/api/v1/query) every panel query of
                                 every dashboard, Grafana's variables replaced ($name by the
                                 VALUE given for it, $__rate_interval and $__range by fixed
                                 windows), and checks each variable's label_values() query has
                                 the VALUE given among its values. Prints a line per query;
                                 exits 1 naming every panel whose query errs or returns no
                                 data (an empty result, or only NaN samples: what Grafana draws
                                 as "No data").

Monitors are read with kubectl as the test user; nothing is written to the cluster.
"""

import json
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

# Windows that cover the test's traffic (sent within the last minute or two before the check).
FIXED = {"$__rate_interval": "3m", "$__range": "10m", "$__interval": "15s"}


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def kubectl_json(*args):
    out = subprocess.run(["kubectl", *args, "-o", "json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def selector_arg(sel):
    """A LabelSelector as kubectl's -l syntax."""
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        op, key, values = e["operator"], e["key"], e.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            fail(f"unknown selector operator {op}")
    if not parts:
        fail("a monitor with an empty selector (it would select everything)")
    return ",".join(parts)


def namespaces_of(ns_selector, own):
    if ns_selector.get("any"):
        return None  # every namespace
    return ns_selector.get("matchNames") or [own]


def list_in(kind, namespaces, selector):
    if namespaces is None:
        return kubectl_json("get", kind, "-A", "-l", selector)["items"]
    items = []
    for ns in namespaces:
        items += kubectl_json("get", kind, "-n", ns, "-l", selector)["items"]
    return items


def container_port(pod, name):
    for c in pod["spec"]["containers"]:
        for p in c.get("ports") or []:
            if p.get("name") == name:
                return p["containerPort"]
    return None


def relabel_label(endpoint, pod, target):
    """The value a `sourceLabels: [__meta_kubernetes_pod_label_X]` relabeling gives TARGET."""
    for r in endpoint.get("relabelings") or []:
        if r.get("targetLabel") != target:
            continue
        (src,) = r["sourceLabels"]
        prefix = "__meta_kubernetes_pod_label_"
        if not src.startswith(prefix):
            fail(f"relabeling of {target} from {src}: not a pod label")
        for k, v in (pod["metadata"].get("labels") or {}).items():
            if re.sub(r"[^a-zA-Z0-9_]", "_", k) == src[len(prefix):]:
                return v
        fail(f"pod {pod['metadata']['name']} has no label for {src}")
    return None


def scrape_config(release_ns, out):
    jobs = []
    (sm,) = kubectl_json("get", "servicemonitors.monitoring.coreos.com", "-n", release_ns)["items"]
    (pm,) = kubectl_json("get", "podmonitors.monitoring.coreos.com", "-n", release_ns)["items"]

    # ServiceMonitor: Services by label, then their ready endpoints on the named port.
    (ep,) = sm["spec"]["endpoints"]
    sel = selector_arg(sm["spec"]["selector"])
    services = list_in("services", namespaces_of(sm["spec"].get("namespaceSelector") or {}, release_ns), sel)
    if not services:
        fail(f"ServiceMonitor {sm['metadata']['name']} selects no Service ({sel})")
    targets = []
    for svc in services:
        ns = svc["metadata"]["namespace"]
        if not any(p.get("name") == ep["port"] for p in svc["spec"]["ports"]):
            fail(f"Service {ns}/{svc['metadata']['name']} has no port named {ep['port']}")
        slices = kubectl_json("get", "endpointslices", "-n", ns, "-l",
                              f"kubernetes.io/service-name={svc['metadata']['name']}")["items"]
        for s in slices:
            port = next((p["port"] for p in s.get("ports") or [] if p.get("name") == ep["port"]), None)
            for e in s.get("endpoints") or []:
                if port and (e.get("conditions") or {}).get("ready"):
                    pod = (e.get("targetRef") or {}).get("name", "")
                    for a in e["addresses"]:
                        targets.append({"targets": [f"{a}:{port}"], "labels": {"namespace": ns, "pod": pod}})
    if not targets:
        fail(f"ServiceMonitor {sm['metadata']['name']}: no ready controller endpoint on port {ep['port']}")
    jobs.append({"job_name": "tollgate-controller", "metrics_path": ep.get("path", "/metrics"), "static_configs": targets})
    print(f"ServiceMonitor selects {len(services)} Service(s), {len(targets)} controller endpoint(s)")

    # PodMonitor: pods by label, on the named container port.
    (pep,) = pm["spec"]["podMetricsEndpoints"]
    sel = selector_arg(pm["spec"]["selector"])
    pods = [p for p in list_in("pods", namespaces_of(pm["spec"].get("namespaceSelector") or {}, release_ns), sel)
            if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
    if not pods:
        fail(f"PodMonitor {pm['metadata']['name']} selects no running pod ({sel})")
    targets = []
    for pod in pods:
        port = container_port(pod, pep["port"])
        if port is None:
            fail(f"pod {pod['metadata']['name']} has no container port named {pep['port']}")
        labels = {"namespace": pod["metadata"]["namespace"], "pod": pod["metadata"]["name"]}
        gw = relabel_label(pep, pod, "gateway")
        if gw is not None:
            labels["gateway"] = gw
        targets.append({"targets": [f"{pod['status']['podIP']}:{port}"], "labels": labels})
    jobs.append({"job_name": "tollgate-proxy", "metrics_path": pep.get("path", "/metrics"), "static_configs": targets})
    print(f"PodMonitor selects {len(pods)} proxy pod(s): "
          + ", ".join(f"{t['labels']['namespace']}/{t['labels']['pod']}" for t in targets))

    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
              "scrape_configs": jobs}
    with open(out, "w") as f:
        json.dump(config, f, indent=2)  # JSON is YAML


def prom(url, path, params):
    q = urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(f"{url}{path}?{q}", timeout=30) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        body = json.load(e)
    if body.get("status") != "success":
        return None, f"{body.get('errorType')}: {body.get('error')}"
    return body["data"], None


def substitute(expr, values):
    for k, v in FIXED.items():
        expr = expr.replace(k, v)
    for k, v in values.items():
        expr = re.sub(r"\$\{?" + re.escape(k) + r"\b\}?", v, expr)
    left = re.findall(r"\$\{?\w+", expr)
    return expr, left


def has_data(data):
    for s in data.get("result") or []:
        samples = [s["value"]] if "value" in s else s.get("values") or []
        if any(v[1] not in ("NaN", "+Inf", "-Inf") for v in samples):
            return True
    return False


def queries(url, files, values):
    failures = []
    checked = 0
    for path in files:
        with open(path) as f:
            dash = json.load(f)
        title = dash["title"]
        for var in dash.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
            if not m:
                failures.append(f"{title}: variable {var['name']}: not label_values(METRIC, LABEL): {q}")
                continue
            match, left = substitute(m.group(1), values)
            want = values.get(var["name"])
            data, err = prom(url, f"/api/v1/label/{m.group(2)}/values", {"match[]": match})
            if err or left or want is None or want not in data:
                failures.append(f"{title}: variable {var['name']} ({q}): values {data}, want {want!r} {err or ''}")
            else:
                print(f"ok   {title}: variable {var['name']} has {want!r}")
        panels = []
        for p in dash["panels"]:
            panels += [p] + p.get("panels", [])
        for p in panels:
            for t in p.get("targets") or []:
                expr, left = substitute(t["expr"], values)
                checked += 1
                name = f"{title}: panel {p['title']!r} ({t['refId']})"
                if left:
                    failures.append(f"{name}: variables left unsubstituted {left}: {expr}")
                    continue
                data, err = prom(url, "/api/v1/query", {"query": expr})
                if err:
                    failures.append(f"{name}: error {err}: {expr}")
                elif not has_data(data):
                    failures.append(f"{name}: no data: {expr}")
                else:
                    print(f"ok   {name}: {len(data['result'])} series")
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    if failures:
        sys.exit(1)
    if checked == 0:
        fail("no panel query found")
    print(f"every one of {checked} panel queries returned data")


def main(argv):
    if len(argv) == 3 and argv[0] == "scrape-config":
        scrape_config(argv[1], argv[2])
    elif len(argv) >= 3 and argv[0] == "queries" and "--" in argv:
        i = argv.index("--")
        values = dict(a.split("=", 1) for a in argv[i + 1:])
        queries(argv[1], argv[2:i], values)
    else:
        fail(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
