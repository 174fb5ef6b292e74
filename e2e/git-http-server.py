#!/usr/bin/env python3
"""e2e/git-http-server.py — the Git repositories under ROOT served over HTTP on loopback
with Git's own smart HTTP server, `git http-backend` (a CGI program), for e2e/flux-test.sh.

    e2e/git-http-server.py ROOT [--port N] [--port-file FILE]

Serves http://127.0.0.1:PORT/NAME.git for every bare repository ROOT/NAME.git: clone, fetch
and push (each repository needs `git config http.receivepack true` for push, since nobody
authenticates). PORT 0 (the default) picks a free one, written to --port-file once the
server listens. Stops on SIGTERM or SIGINT.
"""

import argparse
import http.server
import os
import shutil
import signal
import subprocess
import sys

BACKEND = None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: no chunked replies to write

    def do_GET(self):
        self.run_backend()

    def do_POST(self):
        self.run_backend()

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline()  # the CRLF after a chunk
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def run_backend(self):
        path, _, query = self.path.partition("?")
        body = self.read_body()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": self.server.root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
        }
        for name in ("Content-Encoding", "Git-Protocol", "Accept"):
            if name in self.headers:
                env["HTTP_" + name.upper().replace("-", "_")] = self.headers[name]
        proc = subprocess.run([BACKEND], input=body, env=env, capture_output=True, check=False)
        head, _, out = proc.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, out = proc.stdout.partition(b"\n\n")
        status, headers = "200 OK", []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = value.strip()
            elif name:
                headers.append((name, value.strip()))
        code, _, reason = status.partition(" ")
        self.send_response(int(code), reason or None)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
        if proc.returncode != 0 and proc.stderr:
            sys.stderr.write(proc.stderr.decode(errors="replace"))

    def log_message(self, fmt, *args):
        sys.stderr.write("[git-http] %s %s\n" % (self.address_string(), fmt % args))


def main():
    global BACKEND
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    args = ap.parse_args()
    git = shutil.which("git") or sys.exit("git-http-server: no git on PATH")
    exec_path = subprocess.run([git, "--exec-path"], capture_output=True, text=True, check=True).stdout.strip()
    BACKEND = os.path.join(exec_path, "git-http-backend")
    if not os.access(BACKEND, os.X_OK):
        sys.exit(f"git-http-server: {BACKEND} is missing")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.root = os.path.abspath(args.root)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(f"{server.server_address[1]}\n")
        os.replace(args.port_file + ".tmp", args.port_file)
    sys.stderr.write(f"[git-http] serving {server.root} on http://127.0.0.1:{server.server_address[1]}/\n")
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass


if __name__ == "__main__":
    main()
