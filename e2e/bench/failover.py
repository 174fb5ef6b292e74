#!/usr/bin/env python3
"""The figures and report of failover.sh.

  failover.py spread RUNDIR UA PORT...    after the warm-up: each endpoint's share of the client
                                          requests; exits 1 unless every one has at least 20%
  failover.py analyze RUNDIR CONTENDER ROUND UA PORT... --killed I --window S
                                          one JSON line of one timeline's figures
  failover.py brief < LINE                a one-line summary of such a line, for the log
  failover.py report RAW.jsonl ...        the markdown report (medians across rounds)

A run directory holds what one timeline left: timeline.txt (epoch ms of the start, the kill,
the restart, when the restarted endpoint listened, the end), be-PORT.log per endpoint
("$msec $http_user_agent" per request; the clients' User-Agent is UA, anything else is a
health check or the script's own probe), from failover.lua errors.txt (non-2xx answers),
latencies.txt (requests sent in the latency windows that a backend answered), unmatched.txt
(those it did not) and summary.txt (wrk's totals), and what the contender counted itself
(Tollgate's metrics.txt, HAProxy's stats.csv, nginx's error log) and logged (contender.log).
"""
import argparse
import calendar
import json
import math
import os
import re
import statistics
import sys
import time

PROBE_UA = "failover-probe"
FAIR = 0.25  # a fair share of three endpoints, with room for noise


def client_times(path, ua):
    """Times (epoch ms) of the clients' requests in one backend log, and of the others'."""
    clients, others = [], []
    if not os.path.exists(path):
        return clients, others
    for line in open(path, errors="replace"):
        t, _, agent = line.rstrip("\n").partition(" ")
        try:
            ms = float(t) * 1000
        except ValueError:
            continue
        if agent == ua:
            clients.append(ms)
        elif agent != PROBE_UA:
            others.append(ms)
    clients.sort()
    others.sort()
    return clients, others


def count(ts, lo, hi):
    return sum(1 for t in ts if lo <= t < hi)


def quantile(xs, q):
    """The value at rank ceil(N * q) of the sorted values (q = 1: the largest)."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[max(1, math.ceil(len(xs) * q)) - 1]


def spread(a):
    per = [client_times(os.path.join(a.dir, f"be-{p}.log"), a.ua)[0] for p in a.ports]
    total = sum(len(x) for x in per)
    shares = [len(x) / total if total else 0 for x in per]
    print(" ".join(f"{p}:{s:.0%}" for p, s in zip(a.ports, shares)) + f" of {total}")
    sys.exit(0 if total and min(shares) >= 0.2 else 1)


ANSI = re.compile(r"\x1b\[[0-9;]*m")
ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?")
NGINX_TIME = re.compile(r"^(\d{4})/(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d)")


def line_time(line):
    """Epoch ms of a log line's leading timestamp (ISO 8601, or nginx's local seconds)."""
    m = ISO.search(line[:48])
    if m:
        y, mo, d, h, mi, s, frac, tz = m.groups()
        t = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s)))
        if tz and tz != "Z":
            sign = 1 if tz[0] == "+" else -1
            tz = tz[1:].replace(":", "")
            t -= sign * (int(tz[:2]) * 3600 + int(tz[2:]) * 60)
        return t * 1000 + (float(frac) * 1000 if frac else 0)
    m = NGINX_TIME.match(line)
    if m:
        return time.mktime(tuple(int(x) for x in m.groups()) + (0, 0, -1)) * 1000
    return None


# What each contender logs about its endpoints' health (anything else is left out).
EVENT = {
    "tollgate": re.compile(r"eject|health|unhealthy|healthy", re.I),
    "haproxy": re.compile(r"Server eps/|backend eps has no server", re.I),
    "nginx": re.compile(r"temporarily disabled|no live upstreams", re.I),
}


def events(d, contender, kill, restart):
    """The contender's own log lines about its endpoints, with their time from the kill (or
    the restart, after it); a run of equal lines at the same time once, with their number.
    The first 12 such entries, and how many lines matched."""
    path = os.path.join(d, "nginx-error.log" if contender == "nginx" else "contender.log")
    out, n = [], 0
    if not os.path.exists(path):
        return out, n
    for line in open(path, errors="replace"):
        line = ANSI.sub("", line.rstrip("\n"))
        if not EVENT[contender].search(line):
            continue
        t = line_time(line)
        if contender == "haproxy" and t is None:
            continue  # the same event again, as a warning on stderr without a time
        n += 1
        when = None
        if t is not None:
            rel, what = (t - restart, "restart") if t >= restart else (t - kill, "kill")
            if contender == "nginx":  # whole seconds: the event is somewhere in that second
                when = f"{what} {rel:+.0f} to {rel + 1000:+.0f} ms"
            else:
                when = f"{what} {rel:+.0f} ms"
        text = line
        if contender == "nginx":
            text = re.sub(r"^\S+ \S+ (\[\w+\]) \d+#\d+: (\*\d+ )?", r"\1 ", text).split(", client:")[0]
        elif t is not None:
            text = ISO.sub("", text, count=1)
        text = re.sub(r"\s+", " ", text).strip()[:160]
        if out and out[-1][0] == when and out[-1][1] == text:
            out[-1][2] += 1
        elif len(out) < 12:
            out.append([when, text, 1])
    return out, n


def own_counts(d, contender, ports, killed):
    """What the contender counted itself: retries, ejections, failed attempts."""
    c = {}
    if contender == "tollgate":
        path = os.path.join(d, "metrics.txt")
        if os.path.exists(path):
            for line in open(path):
                if line.startswith("#"):
                    continue
                name, _, value = line.rpartition(" ")
                for metric, key in (("tollgate_upstream_retries_total", "retries"),
                                    ("tollgate_upstream_ejections_total", "ejections"),
                                    ("tollgate_health_check_transitions_total", "check transitions")):
                    if name.startswith(metric):
                        c[key] = c.get(key, 0) + float(value)
    elif contender == "haproxy":
        path = os.path.join(d, "stats.csv")
        if os.path.exists(path):
            rows = [r.split(",") for r in open(path) if r.strip()]
            head = [h.lstrip("# ") for h in rows[0]] if rows else []
            for r in rows[1:]:
                row = dict(zip(head, r))
                if row.get("pxname") == "eps" and row.get("svname") == "BACKEND":
                    c["retries"] = float(row.get("wretr") or 0)
                    c["redispatches"] = float(row.get("wredis") or 0)
                if row.get("pxname") == "eps" and row.get("svname") == f"ep{killed + 1}":
                    c["ep2 down transitions"] = float(row.get("chkdown") or 0)
                    c["ep2 failed checks"] = float(row.get("chkfail") or 0)
    elif contender == "nginx":
        path = os.path.join(d, "nginx-error.log")
        if os.path.exists(path):
            text = open(path, errors="replace").read()
            c["failed attempts logged"] = len(re.findall(r"\[error\][^\n]*upstream", text))
            c["disabled"] = text.count("temporarily disabled")
    return c


def window_stats(lat, unmatched, lo, hi):
    xs = [ms for sent, ms, _ in lat if lo <= sent < hi]
    return {"n": len(xs), "p50": quantile(xs, 0.5), "p99": quantile(xs, 0.99),
            "max": quantile(xs, 1.0), "unmatched": count(unmatched, lo, hi)}


def analyze(a):
    d = a.dir
    tl = dict(line.strip().split("=", 1) for line in open(os.path.join(d, "timeline.txt")) if "=" in line)
    t0, kill, restart, end = (float(tl[k]) for k in ("t0", "kill", "restart", "end"))
    up = float(tl["up"]) if tl.get("up") else None
    summ = dict(line.strip().split("=", 1) for line in open(os.path.join(d, "summary.txt")) if "=" in line)
    num = lambda k: float(summ.get(k, "nan"))  # noqa: E731

    per, checks = [], []
    for p in a.ports:
        cl, ot = client_times(os.path.join(d, f"be-{p}.log"), a.ua)
        per.append([t for t in cl if t >= t0])  # the warm-up's requests came before t0
        checks.append([t for t in ot if t0 <= t < end])
    k = a.killed
    e2 = per[k]

    def share(i, lo, hi):
        tot = sum(count(x, lo, hi) for x in per)
        return count(per[i], lo, hi) / tot if tot else None

    errors = []
    for line in open(os.path.join(d, "errors.txt")):
        t, s = line.split()
        errors.append((float(t), int(s)))
    by_status = {}
    for _, s in errors:
        by_status[str(s)] = by_status.get(str(s), 0) + 1
    lat = [tuple(float(x) for x in line.split()) for line in open(os.path.join(d, "latencies.txt"))]
    unmatched = [float(x) for x in open(os.path.join(d, "unmatched.txt")) if x.strip()]

    before = [t for t in e2 if t < restart]
    after = [t for t in e2 if t >= restart]
    first_after = after[0] if after else None
    fair = None
    if first_after is not None:
        s = first_after
        while s + 1000 <= end:
            sh = share(k, s, s + 1000)
            if sh is not None and sh >= FAIR:
                fair = s - restart
                break
            s += 100
    w = a.window * 1000
    f = {
        "contender": a.contender, "round": int(a.round),
        "kill_at_ms": kill - t0, "restart_at_ms": restart - t0,
        "requests": num("requests"), "rps": num("requests") / (num("duration_us") / 1e6),
        "non2xx": len(errors), "non2xx_by_status": by_status, "wrk_status_errors": num("status"),
        "connect": num("connect"), "read": num("read"), "write": num("write"), "timeout": num("timeout"),
        "first_error_ms": errors[0][0] - kill if errors else None,
        "last_error_ms": errors[-1][0] - kill if errors else None,
        "errors_after_restart": sum(1 for t, _ in errors if t >= restart),
        "last_before_kill_ms": before[-1] - kill if before else None,
        "served_while_dead": count(e2, kill + 1, restart),
        "listening_ms": up - restart if up else None,
        "first_request_ms": first_after - restart if first_after is not None else None,
        "fair_share_ms": fair,
        "share_before": share(k, t0 + 1000, kill),
        "share_last5": share(k, end - 5000, end),
        "shares_down": [share(i, kill + w, restart) for i in range(len(per))],
        "checks_per_s": [len(c) / ((end - t0) / 1000) for i, c in enumerate(checks) if i != k],
        "p50_ms": num("p50_us") / 1000, "p99_ms": num("p99_us") / 1000, "max_ms": num("max_us") / 1000,
        "win_before": window_stats(lat, unmatched, kill - w, kill),
        "win_kill": window_stats(lat, unmatched, kill, kill + w),
        "win_restart": window_stats(lat, unmatched, restart, restart + w),
        "window_requests": num("window_requests"),
        "own": own_counts(d, a.contender, a.ports, k),
    }
    f["events"], f["events_total"] = events(d, a.contender, kill, restart)
    # What would make the figures wrong.
    if count(e2, kill + 100, restart):
        sys.exit(f"endpoint 2 served {count(e2, kill + 100, restart)} requests while it should have been dead")
    if not f["requests"] > 0:
        sys.exit("wrk counted no request")
    f["doubts"] = []
    if sum(1 for _, s in errors if s > 399) != f["wrk_status_errors"]:
        f["doubts"].append(f"the Lua hook logged {sum(1 for _, s in errors if s > 399)} answers >= 400, "
                           f"wrk counted {f['wrk_status_errors']:.0f}")
    if up is None:
        f["doubts"].append("the restarted endpoint did not accept a connection within 2 s")
    print(json.dumps(f))


def brief(_):
    f = json.loads(sys.stdin.readline())
    ms = lambda v: "none" if v is None else f"{v:.0f} ms"  # noqa: E731
    print(f"{f['requests']:.0f} requests, {f['non2xx']} non-2xx, socket errors "
          f"{f['connect'] + f['read'] + f['write'] + f['timeout']:.0f}; endpoint 2 back after "
          f"{ms(f['first_request_ms'])}, fair share after {ms(f['fair_share_ms'])}")


# ------------------------------------------------------------------------------ report
def cell(vals, fmt):
    """The median of a figure across rounds (the values of the rounds that have one)."""
    have = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not have:
        return "none"
    s = fmt(statistics.median(have))
    if len(have) < len(vals):
        s += f" ({len(have)} of {len(vals)} rounds)"
    return s


def counted(vals):
    """A count across rounds: the median, and with several rounds their total (an error that
    happens in one round of three must not vanish in the median)."""
    s = cell(vals, lambda v: f"{v:,.0f}")
    if len(vals) > 1:
        s += f" (total {sum(v for v in vals if v is not None):,.0f})"
    return s


def ms(v):
    return f"{v:+,.0f} ms" if abs(v) >= 10 else f"{v:+.1f} ms"


def dur(v):
    return f"{v:,.0f} ms" if abs(v) >= 10 else f"{v:.1f} ms"


def lat(v):
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def pct(v):
    return f"{v:.1%}"


def table(runs, contenders, window):
    """One row per figure, one column per contender; medians across the runs given."""
    by = {c: [r for r in runs if r["contender"] == c] for c in contenders}
    rows = []

    def row(name, fn):
        rows.append([name] + [fn(by[c]) for c in contenders])

    def med(key, fmt):
        return lambda rs: cell([r[key] for r in rs], fmt)

    def lat3(key):
        return lambda rs: " / ".join(cell([r[key] for r in rs], lat) for key in key)

    def win(w):
        def f(rs):
            p = " / ".join(cell([r[w][q] for r in rs], lat) for q in ("p50", "p99", "max"))
            n = cell([r[w]["n"] for r in rs], lambda v: f"{v:,.0f}")
            u = cell([r[w]["unmatched"] for r in rs], lambda v: f"{v:,.0f}")
            return f"{p} (n {n}; {u} without a backend's answer)"
        return f

    def statuses(rs):
        keys = sorted({s for r in rs for s in r["non2xx_by_status"]})
        if not keys:
            return "none"
        return ", ".join(f"{s}: " + counted([r["non2xx_by_status"].get(s, 0) for r in rs]) for s in keys)

    def sockets(rs):
        kinds = ("connect", "read", "write", "timeout")
        s = " / ".join(cell([r[k] for r in rs], lambda v: f"{v:,.0f}") for k in kinds)
        if len(rs) > 1:
            s += f" (total {sum(r[k] for r in rs for k in kinds):,.0f})"
        return s

    def own(rs):
        keys = sorted({k for r in rs for k in r["own"]})
        return "; ".join(f"{k} " + cell([r["own"].get(k) for r in rs], lambda v: f"{v:,.0f}") for k in keys) or "none"

    def down(rs):
        return " / ".join(cell([r["shares_down"][i] for r in rs], pct) for i in range(3))

    def checks(rs):
        return " / ".join(cell([r["checks_per_s"][i] for r in rs], lambda v: f"{v:.1f}") for i in range(2))

    row("requests (per second)", lambda rs: cell([r["requests"] for r in rs], lambda v: f"{v:,.0f}")
        + " (" + cell([r["rps"] for r in rs], lambda v: f"{v:,.0f}") + ")")
    row("non-2xx answers", lambda rs: counted([r["non2xx"] for r in rs]))
    row("non-2xx by status", statuses)
    row("socket errors: connect / read / write / timeout (wrk's totals, no times)", sockets)
    row("first non-2xx, from the kill", med("first_error_ms", ms))
    row("last non-2xx, from the kill", med("last_error_ms", ms))
    row("non-2xx after the restart", lambda rs: counted([r["errors_after_restart"] for r in rs]))
    row("endpoint 2: last client request, from the kill", med("last_before_kill_ms", ms))
    row("endpoint 2: listening again, from the restart", med("listening_ms", dur))
    row("**endpoint 2: first client request, from the restart**", med("first_request_ms", dur))
    row("**endpoint 2: fair share (>= 25% of a 1 s window), from the restart**", med("fair_share_ms", dur))
    row("endpoint 2's share: before the kill / last 5 s", lambda rs: cell([r["share_before"] for r in rs], pct)
        + " / " + cell([r["share_last5"] for r in rs], pct))
    row(f"shares of endpoints 1 / 2 / 3 while 2 was down (from kill + {window} s)", down)
    row("latency over the run, ms: p50 / p99 / max (wrk)", lat3(("p50_ms", "p99_ms", "max_ms")))
    row(f"latency {window} s before the kill, ms: p50 / p99 / max", win("win_before"))
    row(f"latency {window} s after the kill, ms: p50 / p99 / max", win("win_kill"))
    row(f"latency {window} s after the restart, ms: p50 / p99 / max", win("win_restart"))
    row("health-check requests per second at endpoints 1 / 3", checks)
    row("the contender's own count", own)
    out = ["| | " + " | ".join(contenders) + " |", "| --- |" + " --- |" * len(contenders)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


NOTES = """\
- **Retries.** All three try a request up to three times, each time on another endpoint:
  Tollgate's `retry` (`attempts: 2`) on an endpoint the request has not tried; nginx's
  `proxy_next_upstream_tries 3` on the next server; HAProxy's `retries 2` with `option redispatch 1`
  (a redispatch on every retry: with plain `option redispatch` only the last retry goes elsewhere,
  the first goes to the same server after a turn-around of min(`timeout connect`, 1 s)). Tollgate
  waits its `backoff` (25 ms, doubled each retry, plus up to a quarter of jitter) before a retry;
  nginx and HAProxy retry at once. What is retried: a failed connection always; a reset or a timeout
  after sending (Tollgate: idempotent requests only; nginx `error timeout`, by default not for a
  POST, LOCK or PATCH once sent; HAProxy `empty-response response-timeout`); answers 502 and 503.
- **Passive detection.** Tollgate ejects an endpoint after 3 gateway errors (refused, reset,
  timed out, 502/503/504) in a row for `baseEjectionTime` 10 s, and at most 50% of the endpoints
  (one of three). nginx takes a server out after `max_fails=1` failure for `fail_timeout=10s`, on
  a clock of whole seconds; then one live request tries it, and if that fails it is out for
  another 10 s. HAProxy: `observe layer4 error-limit 3 on-error mark-down` (not in the issue's
  list; added so that HAProxy, like the other two, also learns from live traffic): 3 failed
  connections in a row mark the server down until a health check passes.
- **Active checks.** Tollgate: GET / every 1 s (plus up to 10% jitter), timeout 500 ms, out after
  2 failures, back after 1 pass. HAProxy: `option httpchk GET /`, `inter 1s fall 2 rise 1`,
  `timeout check 500ms`. nginx: none (active `health_check` is NGINX Plus only), so nginx learns
  that the endpoint is back only from the live request it sends there once `fail_timeout` is over.
- **Coming back.** Tollgate takes an endpoint again when its ejection is over *and* its health
  check passes; HAProxy when a check passes; nginx when the trial request succeeds. With the
  default timeline the restart comes 10 s after the kill, as long as `fail_timeout` and
  `baseEjectionTime`: the time to recovery of nginx depends on whether its trial request (at the
  first whole second at least 10 s after the last failure) comes before or after the restart; in
  the latter case it is out for 10 s more.
- **Balancing.** Round robin in all three. While an endpoint is out, Tollgate's `RoundRobin` gives
  its turn to the next available endpoint (so endpoint 3 takes endpoint 2's share); nginx and
  HAProxy share it between the other two (see the shares while down).
- **Timeouts.** Connect 1 s (Tollgate `connectTimeout`, nginx `proxy_connect_timeout`, HAProxy
  `timeout connect`); an attempt's answer 5 s (Tollgate `timeouts.backendRequest`, nginx
  `proxy_read_timeout`, HAProxy `timeout server`). On loopback a killed endpoint refuses or resets
  at once, so none of them fires.
- **Per-request work and logs.** As in run.sh: X-Forwarded-For/-Proto/-Host and an X-Request-Id
  in all three, no access log. Tollgate logs ejections and health transitions; nginx logs each
  failed attempt (`error_log warn`); HAProxy logs requests that failed or were retried, and server
  state changes (`option dontlog-normal`, to stderr). Pooled keep-alive connections to the
  endpoints in all three (Tollgate's default pool, nginx `keepalive 64`, HAProxy `http-reuse safe`).
"""


def report(a):
    runs = [json.loads(line) for line in open(a.raw) if line.strip()]
    contenders = a.contenders.split()
    warmup, duration, kill, restart, window = a.timeline.split()
    out = [f"# Failover: one of three endpoints killed under load ({a.started})\n"]
    out.append(f"Tollgate {a.commit}; {a.versions}.\n")
    out.append(
        f"Rounds: {a.rounds}{' (the figures are medians across rounds)' if int(a.rounds) > 1 else ''}. "
        "For each contender in turn, in the same run: three fresh endpoints (each its own single-process "
        "nginx answering 200 `ok`, logging every request with `$msec`) on 127.0.0.1:19180-19182; the "
        "contender in front with one worker or thread on CPU 0; wrk (one thread, "
        f"{a.conns} keep-alive connections, GET /) and the endpoints on CPU 1. A warm-up of {warmup} s "
        "must reach every endpoint with at least a fifth of the requests. Then steady load for "
        f"{duration} s; at {kill} s endpoint 2 (19181) is killed with SIGKILL, at {restart} s it is "
        f"started again.\n")
    out.append(
        "Clients: every non-2xx answer is logged with its time by wrk's Lua `response()` hook; socket "
        "errors (connect, read, write, timeout) exist only as wrk's totals, without times. Latency "
        f"over the run is wrk's; over the {window} s windows it is measured for the requests sent in "
        "them, which carry `X-Seq` (echoed by the endpoints): a request answered by the proxy itself "
        "(an error) or never answered cannot be matched and is counted apart. Endpoints: from their "
        "logs, the clients' requests (their User-Agent) apart from health checks. Fair share: the "
        "start of the first 1-second window, sliding by 100 ms from endpoint 2's first request after "
        "the restart, in which endpoint 2 served at least 25% of the requests. Times of the kill and "
        "the restart are taken by the script just before the signal and the start. The Lua work on "
        "the windows' requests costs wrk some speed there (compare their number with the rate over "
        "the run).\n")
    out.append(f"Load average before: {a.load}; after: {a.load_after} (a shared 2-core machine: "
               "latencies and rates are noisy; the errors and the times of the failover are the point).\n")
    out.append(f"Reproduce: `{a.reproduce}`\n")
    out.append("## Results\n")
    out.append(table(runs, contenders, window) + "\n")
    if int(a.rounds) > 1:
        for r in sorted({x["round"] for x in runs}):
            out.append(f"### Round {r}\n")
            out.append(table([x for x in runs if x["round"] == r], contenders, window) + "\n")
    doubts = [f"round {x['round']}, {x['contender']}: {d}" for x in runs for d in x["doubts"]]
    if doubts:
        out.append("**Doubts about this run:**\n")
        out += [f"- {d}" for d in doubts]
        out.append("")
    out.append("## What the contenders logged about their endpoints\n")
    out.append("Times from the kill, or from the restart once it happened (nginx's error log has whole "
               "seconds only). The first lines of each run.\n")
    for x in runs:
        out.append(f"- round {x['round']}, {x['contender']}: {x['events_total']} lines")
        for when, text, k in x["events"]:
            out.append(f"  - {when or 'no time'}: `{text}`" + (f" (x{k})" if k > 1 else ""))
    out.append("")
    out.append("## Where the configurations differ\n")
    out.append(NOTES)
    out.append("## Configurations\n")
    out.append("`$WORK` is the run's work directory (kept with `KEEP=1`).\n")
    conf = a.conf
    work = os.path.dirname(os.path.abspath(conf))
    for title, path, lang in (("Tollgate (`tollgate compile`, then `tollgate-proxy --table FILE "
                               "--workers 1 --access-log false`)", "manifests/failover.yaml", "yaml"),
                              ("nginx (`nginx -c FILE`)", "nginx.conf", "nginx"),
                              ("HAProxy (`haproxy -db -f FILE`)", "haproxy.cfg", "haproxy")):
        out.append(f"### {title}\n")
        text = open(os.path.join(conf, path)).read().rstrip().replace(work, "$WORK")
        out.append(f"```{lang}\n{text}\n```\n")
    be = sorted(p for p in os.listdir(conf) if p.startswith("be-") and p.endswith(".conf"))
    if be:
        out.append("### An endpoint (`nginx -c FILE`, one per port)\n")
        text = open(os.path.join(conf, be[0])).read().rstrip().replace(work, "$WORK")
        out.append(f"```nginx\n{text}\n```\n")
    v = open(os.path.join(conf, "validate.txt")).read().strip()
    out.append(f"`tollgate validate` on the manifests:\n\n```\n{v}\n```")
    print("\n".join(out))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("spread")
    s.add_argument("dir")
    s.add_argument("ua")
    s.add_argument("ports", nargs="+")
    s = sub.add_parser("analyze")
    s.add_argument("dir")
    s.add_argument("contender")
    s.add_argument("round")
    s.add_argument("ua")
    s.add_argument("ports", nargs="+")
    s.add_argument("--killed", type=int, required=True)
    s.add_argument("--window", type=float, required=True)
    sub.add_parser("brief")
    s = sub.add_parser("report")
    s.add_argument("raw")
    for o in ("conf", "started", "rounds", "conns", "timeline", "load", "load-after", "reproduce",
              "commit", "versions", "contenders"):
        s.add_argument("--" + o, required=True)
    a = p.parse_args()
    {"spread": spread, "analyze": analyze, "brief": brief, "report": report}[a.cmd](a)


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    main()
