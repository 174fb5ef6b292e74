"""Stand-in for `agnhost netexec` (registry.k8s.io/e2e-test-images/agnhost), which
examples/gitops/app runs as its backend: the node agent of `e2e/cluster.sh up --full` runs
local programs, not images. Serves what the example relies on, on --http-port (default
8080): `/hostname` answers the pod's name, `/echo?msg=M` answers M, and every other path
`NOW: <time>` (netexec's handler for `/` catches every path); answers are plain text.

Usage (argv as the agent builds it): agnhost-netexec.py netexec [--http-port=N]
"""

import datetime
import http.server
import os
import socket
import sys
import urllib.parse


def main() -> None:
    args = sys.argv[1:]
    if not args or args[0] != "netexec":
        sys.exit(f"agnhost stand-in: only `netexec` is provided, not {args[:1]}")
    port = 8080
    for a in args[1:]:
        if a.startswith("--http-port="):
            port = int(a.split("=", 1)[1])
    name = os.environ.get("HOSTNAME") or socket.gethostname()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/echo":
                text = urllib.parse.parse_qs(url.query).get("msg", [""])[0]
            elif url.path == "/hostname":
                text = name
            else:
                text = f"NOW: {datetime.datetime.now(datetime.timezone.utc).isoformat()}"
            data = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
