#!/usr/bin/env python3
"""e2e/doc-blocks.py MARKDOWN SECTION OUT WORK: writes OUT, a bash script that runs the
shell blocks of MARKDOWN (only those under the `## SECTION` heading when SECTION is not
empty) as a user pastes them, and prints how many it runs. WORK is a scratch directory
(outputs, background process ids in WORK/pids). The conventions, in e2e/docs-test.sh's
header: ```sh, ```sh background PORT, ```sh exit=N, ```sh no-test, and ```text output
right after a block for what it must print.
"""
import re, shlex, sys
path, section, out, work = sys.argv[1:5]
lines = open(path, encoding="utf-8").read().split("\n")
blocks, i, current = [], 0, None
while i < len(lines):
    line = lines[i]
    heading = re.match(r"^(#+) (.*)", line)
    if heading:
        current = heading.group(2).strip() if len(heading.group(1)) == 2 else current
    fence = re.match(r"^```(\S*)\s*(.*)$", line)
    if fence and fence.group(1):
        lang, info, body, start = fence.group(1), fence.group(2).split(), [], i + 1
        i += 1
        while i < len(lines) and lines[i] != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            sys.exit(f"{path}:{start}: unterminated code block")
        if not section or current == section:
            blocks.append((lang, info, body, start))
    i += 1
script = ["set -euo pipefail"]
n = 0
for k, (lang, info, body, start) in enumerate(blocks):
    if lang not in ("sh", "bash", "console") or "no-test" in info:
        continue
    n += 1
    where = f"{path}:{start}"
    text = "\n".join(body)
    script.append(f"printf '\\n[docs-test] %s\\n' {shlex.quote(where)} >&2")
    if info and info[0] == "background":
        port = info[1] if len(info) > 1 else sys.exit(f"{where}: background block without a port")
        script.append(f"setsid bash -c {shlex.quote('set -euo pipefail; ' + text)} >{work}/bg-{n}.log 2>&1 &")
        script.append(f"echo $! >> {work}/pids")
        script.append(
            f"for _ in $(seq 1 600); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; "
            f"kill -0 $(tail -1 {work}/pids) 2>/dev/null || {{ cat {work}/bg-{n}.log >&2; "
            f"echo '{where}: the background block exited' >&2; exit 1; }}; sleep 0.5; done"
        )
        script.append(f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null || {{ echo '{where}: nothing on port {port}' >&2; exit 1; }}")
        continue
    expected = None
    if k + 1 < len(blocks) and blocks[k + 1][0] == "text" and "output" in blocks[k + 1][1]:
        expected = "\n".join(blocks[k + 1][2])
    status = [w.split("=", 1)[1] for w in info if w.startswith("exit=")]
    if status:
        script.append("set +e")
        script.append("(\n" + text + f"\n) > {work}/out-{n} 2>&1")
        script.append(f"rc=$?; set -e; cat {work}/out-{n}")
        script.append(
            f"[[ $rc == {status[0]} ]] || {{ echo '{where}: exit status '$rc', the page says {status[0]}' >&2; exit 1; }}"
        )
        if expected is None:
            continue
    elif expected is None:
        script.append(text)
        continue
    else:
        script.append("{\n" + text + f"\n}} > {work}/out-{n}")
        script.append(f"cat {work}/out-{n}")
    script.append(f"cat > {work}/want-{n} <<'DOCS_TEST_EXPECTED'\n{expected}\nDOCS_TEST_EXPECTED")
    script.append(
        f"diff -u {work}/want-{n} {work}/out-{n} >&2 || "
        f"{{ echo '{where}: printed something else than the page says (diff above: - page, + printed)' >&2; exit 1; }}"
    )
if n == 0:
    sys.exit(f"{path}: no shell block{' under ## ' + section if section else ''}")
open(out, "w").write("\n".join(script) + "\n")
print(n)
