//! Runs the Argo CD health check shipped with the chart (charts/tollgate/argocd) the way Argo
//! CD does: the object, converted from JSON to a Lua table, is the global `obj`, the script
//! is the body of a function, and its returned table carries `status` and `message`.
//!
//! The interpreter is a real Lua: `lua5.1` when present (Argo CD runs gopher-lua, which is
//! Lua 5.1), else `lua`. Nothing is installed here; `e2e/test-all.sh` installs `lua5.1`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The chart's directory of Argo CD health checks.
pub fn argocd_dir() -> PathBuf {
    workspace().join("charts/tollgate/argocd")
}

/// The policy health check.
pub fn policy_script() -> PathBuf {
    argocd_dir().join("health-policy.lua")
}

/// The Lua interpreter: `lua5.1`, else `lua` (on PATH). Panics, naming the package, when
/// there is none.
pub fn lua() -> &'static Path {
    static LUA: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LUA.get_or_init(|| {
        let path = std::env::var_os("PATH").unwrap_or_default();
        for name in ["lua5.1", "lua"] {
            for dir in std::env::split_paths(&path) {
                let p = dir.join(name);
                if p.is_file() {
                    return p;
                }
            }
        }
        panic!(
            "no Lua interpreter (lua5.1 or lua) on PATH: install Debian's lua5.1 \
             (apt-get install lua5.1); e2e/test-all.sh does"
        )
    })
}

/// The object as a Lua expression, as Argo CD hands it to the script: JSON null is nil
/// (absent), arrays are 1-based sequences, numbers are numbers.
pub fn to_lua(v: &Value) -> String {
    let mut out = String::new();
    write_lua(v, &mut out);
    out
}

fn write_lua(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("nil"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_str(s, out),
        Value::Array(items) => {
            out.push('{');
            for item in items {
                write_lua(item, out);
                out.push(',');
            }
            out.push('}');
        }
        Value::Object(map) => {
            out.push('{');
            for (k, item) in map {
                if item.is_null() {
                    continue;
                }
                out.push('[');
                write_str(k, out);
                out.push_str("]=");
                write_lua(item, out);
                out.push(',');
            }
            out.push('}');
        }
    }
}

/// A Lua 5.1 string literal: `\\`, `\"` and control bytes escaped (decimal `\ddd`, the only
/// numeric escape 5.1 has); other bytes, UTF-8 included, pass through.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                write!(out, "\\{:03}", c as u32).unwrap();
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Argo CD's verdict: `(status, message)` of `script` run on `obj`.
pub fn health(script: &Path, obj: &Value) -> (String, String) {
    let dir = std::env::temp_dir().join(format!("tollgate-argocd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let runner = dir.join(format!("run-{n}.lua"));
    // `obj` is a global, as Argo CD sets it; the script's chunk returns `hs`. Status and
    // message go out on two lines with their newlines escaped (messages may hold any text).
    let program = format!(
        "obj = {obj}\n\
         local check = assert(loadfile({script}))\n\
         local hs = check()\n\
         assert(type(hs) == \"table\", \"the health check returned \" .. type(hs))\n\
         local function line(s) return (string.gsub(tostring(s), \"\\n\", \"\\\\n\")) end\n\
         io.write(line(hs.status), \"\\n\", line(hs.message), \"\\n\")\n",
        obj = to_lua(obj),
        script = to_lua(&Value::String(script.to_str().unwrap().to_owned())),
    );
    std::fs::write(&runner, program).unwrap();
    let out = Command::new(lua()).arg(&runner).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} {} failed ({}):\n{}\n{}",
        lua().display(),
        script.display(),
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(&runner);
    let mut lines = stdout.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let message = lines.next().unwrap_or_default().replace("\\n", "\n");
    (status, message)
}

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
