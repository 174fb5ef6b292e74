"""What the benchmarks that talk to the API server directly share (route-latency.py,
scale.py): the kubeconfig's client certificate files and a TLS connection built from them.
The kubeconfig is e2e/cluster.sh's, which names files (no inline data)."""
import http.client
import re
import ssl
import sys


class Endpoint:
    """The API server's host and port and the TLS context authenticating to it."""

    def __init__(self, path, who):
        text = open(path).read()
        kc = {}
        for key in ("server", "certificate-authority", "client-certificate", "client-key"):
            m = re.search(rf"^\s*{key}:\s*(\S+)\s*$", text, re.M)
            if not m:
                sys.exit(f"{who}: {key} (as a file path) not found in {path}")
            kc[key] = m.group(1).strip("'\"")
        m = re.match(r"https://([^:/]+):(\d+)", kc["server"])
        if not m:
            sys.exit(f"{who}: unsupported server {kc['server']}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.ctx = ssl.create_default_context(cafile=kc["certificate-authority"])
        self.ctx.load_cert_chain(kc["client-certificate"], kc["client-key"])

    def connect(self, timeout=30):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)
