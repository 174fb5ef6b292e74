#!/usr/bin/env python3
"""Turns run.sh's raw measurements into the markdown results table.

In: a TSV of `scenario round contender metric value` lines. Out (stdout): the goals of issue 6
with the measured ratio and PASS/FAIL, then every metric per scenario (median across rounds of
each contender's figure, and the median across rounds of the per-round ratio).
"""
import argparse
import statistics
from collections import defaultdict

p = argparse.ArgumentParser()
p.add_argument("raw")
p.add_argument("--notes")
p.add_argument("--started")
p.add_argument("--rounds")
p.add_argument("--load")
p.add_argument("--load-after")
p.add_argument("--command")
p.add_argument("--versions")
a = p.parse_args()

data = defaultdict(dict)  # (scenario, metric) -> {(round, contender): value}
for line in open(a.raw):
    parts = line.rstrip("\n").split("\t")
    if len(parts) != 5 or parts[4] == "":
        continue
    s, r, c, m, v = parts
    try:
        data[(s, m)][(r, c)] = float(v)
    except ValueError:
        pass


def median_of(s, m, c):
    vals = [v for (r, cc), v in data.get((s, m), {}).items() if cc == c]
    return statistics.median(vals) if vals else None


def ratio(s, m, other):
    """Median across rounds of tollgate/other for one metric."""
    d = data.get((s, m), {})
    rounds = sorted({r for r, _ in d})
    rs = [d[(r, "tollgate")] / d[(r, other)] for r in rounds
          if (r, "tollgate") in d and (r, other) in d and d[(r, other)] > 0]
    return (statistics.median(rs), rs) if rs else (None, [])


def fmt(v, digits=2):
    if v is None:
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def goal(name, value, op, target, unit, spread=None):
    if value is None:
        verdict = "n/a"
    else:
        ok = value >= target if op == ">=" else value <= target if op == "<=" else value < target
        verdict = "**PASS**" if ok else "**FAIL**"
    shown = "n/a" if value is None else (f"{value:.2f}{unit}" if unit == "x" else f"{fmt(value, 1)}{unit}")
    if spread:
        shown += f" ({', '.join(f'{x:.2f}' for x in spread)})"
    print(f"| {name} | {op} {target}{unit} | {shown} | {verdict} |")


print(f"# Tollgate benchmark results ({a.started})\n")
print(f"Rounds: {a.rounds}, interleaved (tollgate, nginx, haproxy per round). Proxy on CPU 0 with "
      "one worker; load generator and backend on CPU 1. Ratios are tollgate/other, median across "
      "rounds of the per-round ratio (per-round values in brackets).\n")
print(f"Load average (1/5/15 min) before: {a.load}; after: {a.load_after} "
      "(the machine is shared: absolute figures are noisy, the ratios are what counts).\n")
print(f"Reproduce: `{a.command}`\n")
print("Requests/s per core is requests per second of the proxy's own CPU time (its threads' time "
      "on a CPU, from /proc/PID/task/*/schedstat, in nanoseconds) at saturation: with the load "
      "generator and the backend sharing the other core, wrk's requests/s is often bounded by that "
      "core, not by the proxy. Both are shown below.\n")

print("## Goals (issue 6)\n")
print("| goal | target | measured | result |")
print("| --- | --- | --- | --- |")
r, rs = ratio("one", "rps_per_core", "nginx")
goal("bare proxy: requests/s per core vs nginx", r, ">=", 1.0, "x", rs)
r, rs = ratio("one", "rps_per_core", "haproxy")
goal("bare proxy: requests/s per core vs HAProxy", r, ">=", 1.1, "x", rs)
r, rs = ratio("one", "cpu_10k_us", "nginx")
goal("bare proxy: CPU per request at a fixed rate (10k req/s) vs nginx", r, "<=", 1.0, "x", rs)
r, rs = ratio("one", "p99_ms", "nginx")
goal("bare proxy: p99 at half nginx's saturation rate (at most 10k req/s) vs nginx", r, "<=", 1.2, "x", rs)
r, rs = ratio("routes10k", "rps_per_core", "nginx")
goal("10k routes: requests/s per core vs nginx", r, ">=", 1.2, "x", rs)
r, rs = ratio("https", "rps_per_core", "nginx")
goal("HTTPS: requests/s per core vs nginx", r, ">=", 1.0, "x", rs)
r, rs = ratio("logs", "rps_per_core", "nginx")
goal("access log on for every contender: requests/s per core vs nginx (issue 31)", r, ">=", 1.0, "x", rs)
one_tg, logs_tg = median_of("one", "rps_per_core", "tollgate"), median_of("logs", "rps_per_core", "tollgate")
goal("the access log's cost to tollgate: requests/s per core, `logs` against `one` (issue 31)",
     None if not (one_tg and logs_tg) else 100 * (1 - logs_tg / one_tg), "<", 8, "%")
goal("tollgate-proxy resident memory, 10k routes + 10k endpoints",
     median_of("control", "proxy_rss_10000_mb", "tollgate"), "<=", 50, " MB")
goal("route change to first served request, p99 (10k routes, under load)",
     median_of("control", "change_p99_ms", "tollgate"), "<", 100, " ms")
for m, label in (("route_changes_failed", "100 route changes"),
                 ("endpoint_changes_failed", "100 endpoint changes")):
    v = median_of("control", m, "tollgate")
    goal(f"failed requests during {label} (under load)", v, "<=", 0, "")

metrics = [
    ("rps_per_core", "requests per proxy CPU-second at saturation (per core)"),
    ("rps", "requests/s at saturation (wrk -t1 -c50, keep-alive)"),
    ("cpu_sat_us", "CPU µs per request at saturation"),
    ("cpu_10k_us", "CPU µs per request at the fixed rate"),
    ("target_10k", "fixed rate asked (10k, or 80% of nginx saturation)"),
    ("rate_10k", "fixed rate achieved"),
    ("half_rate", "latency run: fixed rate asked (half nginx saturation, at most 10k)"),
    ("half_achieved", "latency run: rate achieved"),
    ("p50_ms", "p50 latency, ms (latency-corrected)"),
    ("p99_ms", "p99 latency, ms"),
    ("p999_ms", "p99.9 latency, ms"),
    ("errors_sat", "non-2xx + socket errors at saturation"),
    ("errors_half", "non-2xx + errors in the latency run"),
    ("log_lines", "access log lines written over the scenario"),
]
titles = {"one": "One route (HTTP)", "routes10k": "10k routes (HTTP)", "https": "One route, HTTPS termination",
          "logs": "One route, access log on for every contender"}
for s in ("one", "logs", "routes10k", "https"):
    if not any(k[0] == s for k in data):
        continue
    print(f"\n## {titles[s]}\n")
    print("| metric | tollgate | nginx | haproxy | tollgate/nginx | tollgate/haproxy |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m, label in metrics:
        if (s, m) not in data:
            continue
        vals = [fmt(median_of(s, m, c), 3 if m.endswith("_ms") else 2) for c in ("tollgate", "nginx", "haproxy")]
        ratios = ["" if m.startswith(("errors", "half", "rate", "target")) else fmt(ratio(s, m, o)[0]) for o in ("nginx", "haproxy")]
        print(f"| {label} | {' | '.join(vals)} | {' | '.join(ratios)} |")

control = [
    ("compile_1000_s", "`tollgate compile` 1k HTTPRoutes (10k endpoints), s"),
    ("proxy_rss_1000_mb", "tollgate-proxy RSS, 1k routes, MB"),
    ("run_rss_1000_mb", "tollgate run RSS, 1k routes, MB"),
    ("compile_10000_s", "`tollgate compile` 10k HTTPRoutes (10k endpoints), s"),
    ("proxy_rss_10000_mb", "tollgate-proxy RSS, 10k routes, MB"),
    ("run_rss_10000_mb", "tollgate run RSS, 10k routes, MB"),
    ("change_p50_ms", "route added → first served request, p50 ms (100 changes)"),
    ("change_p99_ms", "route added → first served request, p99 ms"),
    ("change_max_ms", "route added → first served request, slowest, ms"),
    ("change_failed", "failed requests while adding those routes"),
    ("route_changes_p50_ms", "route changed → served on its new path, p50 ms (100 changes)"),
    ("route_changes_p99_ms", "route changed → served on its new path, p99 ms"),
    ("route_changes_failed", "failed requests during 100 route changes"),
    ("route_changes_requests", "requests sent during the route changes"),
    ("endpoint_changes_failed", "failed requests during 100 endpoint changes"),
    ("endpoint_changes_requests", "requests sent during the endpoint changes"),
]
if any(k[0] == "control" for k in data):
    print("\n## Control plane (tollgate only)\n")
    print("| metric | value |")
    print("| --- | --- |")
    for m, label in control:
        print(f"| {label} | {fmt(median_of('control', m, 'tollgate'), 2)} |")

print(f"\nTools: {a.versions}.")
if a.notes:
    notes = [n.strip() for n in open(a.notes) if n.strip()]
    if notes:
        print("\nNotes:\n")
        for n in notes:
            print(f"- {n}")
