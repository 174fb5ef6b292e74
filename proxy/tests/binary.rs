//! The `tollgate-proxy` binary: serves a table file, applies a changed file, and keeps the
//! previous table when the file stops parsing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

async fn status_of(client: &TestClient, url: &str) -> Option<u16> {
    let req = http::Request::get(url)
        .body(http_body_util::Full::default())
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), client.request(req))
        .await
        .ok()?
        .ok()?;
    Some(resp.status().as_u16())
}

/// Polls until `url` answers `want`, for at most 30 s (a bound on waiting, not a speed check).
async fn until_status(client: &TestClient, url: &str, want: u16) -> bool {
    for _ in 0..300 {
        if status_of(client, url).await == Some(want) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn binary_serves_and_reloads_its_table_file() {
    let backend = echo_backend("b").await;
    let port = free_port();
    let admin = free_port();
    let dir =
        std::env::temp_dir().join(format!("tollgate-proxy-bin-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("table.json");
    let write = |prefix: &str, version: u64| {
        let t = table(
            version,
            vec![http_port(
                port,
                vec![route("r", prefix, vec![wb("default/b:80", 1)])],
            )],
            vec![("default/b:80", backend_of(&[&backend]))],
        );
        std::fs::write(&file, serde_json::to_string(&t).unwrap()).unwrap();
    };
    write("/one", 1);
    let proxy = Killed(
        Command::new(env!("CARGO_BIN_EXE_tollgate-proxy"))
            .arg("--table")
            .arg(&file)
            .arg("--admin")
            .arg(format!("127.0.0.1:{admin}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = h1_client();
    let base = format!("http://127.0.0.1:{port}");
    assert!(until_status(&client, &format!("{base}/one"), 200).await);
    assert_eq!(status_of(&client, &format!("{base}/two")).await, Some(404));

    write("/two", 2);
    assert!(until_status(&client, &format!("{base}/two"), 200).await);
    assert_eq!(status_of(&client, &format!("{base}/one")).await, Some(404));

    // A broken file changes nothing.
    std::fs::write(&file, "{ not json").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(status_of(&client, &format!("{base}/two")).await, Some(200));

    let ready = status_of(&client, &format!("http://127.0.0.1:{admin}/readyz")).await;
    assert_eq!(ready, Some(200));

    // SIGTERM (what Kubernetes sends) shuts it down cleanly.
    let mut proxy = proxy;
    let pid = proxy.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let mut exited = None;
    for _ in 0..200 {
        if let Some(status) = proxy.0.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
