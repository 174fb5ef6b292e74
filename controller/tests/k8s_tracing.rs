//! `tollgate controller --otlp-endpoint` on the real kube-apiserver, exporting to a real
//! OpenTelemetry Collector (e2e/otelcol.sh: OTLP receiver, file exporter): each reconcile is
//! one `reconcile` span, with what it did as attributes, and its phases (snapshot, compile,
//! push, status) as child spans in the same trace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_support::{TestEnv, eventually, free_port, workspace};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

/// The collector, killed on drop.
struct Collector {
    child: Child,
    http: u16,
    spans: PathBuf,
}

impl Collector {
    fn start(dir: &Path) -> Self {
        let out = Command::new(workspace().join("e2e/otelcol.sh"))
            .arg("path")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "e2e/otelcol.sh path failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bin = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let (grpc, http) = (free_port(), free_port());
        let spans = dir.join("spans.jsonl");
        let conf = dir.join("collector.yaml");
        std::fs::write(
            &conf,
            format!(
                r#"
receivers:
  otlp:
    protocols:
      grpc: {{endpoint: "127.0.0.1:{grpc}"}}
      http: {{endpoint: "127.0.0.1:{http}"}}
exporters:
  file: {{path: "{}", flush_interval: 100ms}}
service:
  telemetry:
    metrics: {{level: none}}
    logs: {{level: warn}}
  pipelines:
    traces: {{receivers: [otlp], exporters: [file]}}
"#,
                spans.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("collector.log")).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let c = Self { child, http, spans };
        for _ in 0..600 {
            if std::net::TcpStream::connect(("127.0.0.1", http)).is_ok() {
                return c;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the collector is not listening on {http}");
    }

    /// Every span written so far, with its resource's `service.name`.
    fn spans(&self) -> Vec<(String, Value)> {
        let text = std::fs::read_to_string(&self.spans).unwrap_or_default();
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(doc) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
                let service = attrs(&rs["resource"]["attributes"])
                    .get("service.name")
                    .cloned()
                    .unwrap_or_default();
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    for s in ss["spans"].as_array().into_iter().flatten() {
                        out.push((service.as_str().unwrap_or("").to_owned(), s.clone()));
                    }
                }
            }
        }
        out
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A span's attributes: strings as strings, integers as numbers, booleans as booleans.
fn attrs(kvs: &Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for kv in kvs.as_array().into_iter().flatten() {
        let v = &kv["value"];
        let value = if let Some(s) = v.get("stringValue") {
            s.clone()
        } else if let Some(i) = v.get("intValue") {
            // OTLP JSON writes 64-bit integers as strings.
            json!(
                i.as_str()
                    .and_then(|s| s.parse::<i64>().ok())
                    .or(i.as_i64())
            )
        } else if let Some(b) = v.get("boolValue") {
            b.clone()
        } else {
            v.clone()
        };
        out.insert(kv["key"].as_str().unwrap().to_owned(), value);
    }
    out
}

fn nanos(span: &Value, key: &str) -> u128 {
    span[key].as_str().unwrap().parse().unwrap()
}

/// A reconcile that wrote statuses is one span with its phases as children; a change
/// brings another reconcile, in a trace of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciles_are_exported_as_spans_with_their_phases() {
    let env = TestEnv::new("tracing").await;
    let collector = Collector::start(&env.dir);
    env.gateway("gw", &[("http", 8080)]).await;
    env.service("echo", 80, "10.3.0.1").await;
    env.route("r", json!([{"name": "gw"}]), "echo", 80).await;
    let push_port = free_port();
    let push_addr = format!("127.0.0.1:{push_port}");
    let url = format!("https://localhost:{push_port}");
    let endpoint = format!("http://127.0.0.1:{}", collector.http);
    let ctl = env.controller(
        "a",
        &[
            "--push-addr",
            &push_addr,
            "--controller-url",
            &url,
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "http",
            "--trace-sampling",
            "1",
        ],
    );
    ctl.wait_ready().await;

    // The leader's full reconcile that wrote the statuses of our objects.
    let is_writer = |s: &Value| {
        let a = attrs(&s["attributes"]);
        s["name"] == "reconcile"
            && a.get("tollgate.reconcile.path") == Some(&json!("full"))
            && a.get("tollgate.status.writes")
                .and_then(Value::as_i64)
                .is_some_and(|n| n > 0)
    };
    let root = eventually(WAIT, || async {
        collector.spans().into_iter().find(|(_, s)| is_writer(s))
    })
    .await
    .unwrap_or_else(|| panic!("no reconcile span that wrote statuses:\n{}", ctl.log()));
    let (service, root) = root;
    assert_eq!(service, "tollgate-controller");
    let a = attrs(&root["attributes"]);
    assert_eq!(a["tollgate.gateways"], json!(1), "{a:?}");
    assert_eq!(a["tollgate.leader"], json!(true), "{a:?}");
    let trigger = a["tollgate.reconcile.trigger"].as_str().unwrap();
    assert!(["start", "leadership", "watch"].contains(&trigger), "{a:?}");
    assert!(a["tollgate.routes"].as_i64().unwrap() >= 1, "{a:?}");
    assert!(a.contains_key("tollgate.push.published"), "{a:?}");
    assert!(a.contains_key("tollgate.status.failed"), "{a:?}");
    // A root span, internal (1), not failed.
    assert!(root["parentSpanId"].as_str().unwrap_or("").is_empty());
    assert_eq!(root["kind"], json!(1));
    assert_ne!(root["status"]["code"], json!(2), "{root}");

    // Its phases: children in its trace, within its time.
    let trace = root["traceId"].as_str().unwrap().to_owned();
    let id = root["spanId"].as_str().unwrap().to_owned();
    // The exporter sends a batch at once: the children came with or before the root.
    let spans = collector.spans();
    let children: BTreeMap<String, Value> = spans
        .iter()
        .filter(|(_, s)| s["traceId"] == trace.as_str() && s["spanId"] != id.as_str())
        .map(|(_, s)| {
            assert_eq!(s["parentSpanId"], id.as_str(), "{s}");
            (s["name"].as_str().unwrap().to_owned(), s.clone())
        })
        .collect();
    let names: Vec<&str> = children.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["compile", "push", "snapshot", "status"],
        "{children:?}"
    );
    for c in children.values() {
        assert!(nanos(c, "startTimeUnixNano") >= nanos(&root, "startTimeUnixNano"));
        assert!(nanos(c, "endTimeUnixNano") <= nanos(&root, "endTimeUnixNano"));
    }
    assert!(
        nanos(&children["snapshot"], "endTimeUnixNano")
            <= nanos(&children["compile"], "startTimeUnixNano")
    );
    let status = attrs(&children["status"]["attributes"]);
    assert_eq!(
        status["tollgate.status.writes"],
        a["tollgate.status.writes"]
    );
    assert_eq!(status["tollgate.status.failed"], json!(0));
    assert_eq!(
        attrs(&children["compile"]["attributes"])["tollgate.gateways"],
        json!(1)
    );
    let push = attrs(&children["push"]["attributes"]);
    assert_eq!(
        push["tollgate.push.published"],
        a["tollgate.push.published"]
    );

    // A change: a reconcile of its own, in a new trace, compiling the new route.
    let before: Vec<String> = collector
        .spans()
        .iter()
        .filter(|(_, s)| s["name"] == "reconcile")
        .map(|(_, s)| s["traceId"].as_str().unwrap().to_owned())
        .collect();
    let routes = a["tollgate.routes"].as_i64().unwrap();
    env.route("r2", json!([{"name": "gw"}]), "echo", 80).await;
    // Started by the watch, naming the kind that changed.
    let next = eventually(WAIT, || async {
        collector.spans().into_iter().find(|(_, s)| {
            let a = attrs(&s["attributes"]);
            s["name"] == "reconcile"
                && !before.iter().any(|t| s["traceId"] == t.as_str())
                && a.get("tollgate.routes")
                    .and_then(Value::as_i64)
                    .is_some_and(|n| n > routes)
                && a.get("tollgate.reconcile.trigger") == Some(&json!("watch"))
                && a.get("tollgate.reconcile.kinds")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.split(',').any(|k| k == "HTTPRoute"))
        })
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "no reconcile span of the watch after the change:\n{:#?}\n{}",
            collector.spans(),
            ctl.log()
        )
    });
    assert_ne!(next.1["traceId"], root["traceId"]);
    assert_eq!(
        ctl.metric("tollgate_controller_trace_spans_dropped_total", ""),
        0.0
    );
}
