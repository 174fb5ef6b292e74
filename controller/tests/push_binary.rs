//! The `tollgate-proxy` binary subscribed to an in-process [`PushServer`] with
//! `--controller/--gateway/--tls-dir/--state-dir/--id`: it serves the pushed table, turns
//! ready, and after a restart with the controller gone serves the table from its state dir.
//!
//! The binary is the one `cargo test --workspace` builds next to this test
//! (`target/debug/tollgate-proxy`); when it is missing the test fails and says how to build it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod push_support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use push_support::*;
use tollgate::push::pki::{Ca, proxy_identity};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("tollgate-proxy");
    bin.exists().then_some(bin)
}

fn start(
    bin: &PathBuf,
    controller: &str,
    tls: &std::path::Path,
    state: &std::path::Path,
    admin: u16,
) -> Killed {
    let log = std::fs::File::create(state.with_extension(format!("{admin}.log"))).unwrap();
    Killed(
        Command::new(bin)
            .args([
                "--controller",
                controller,
                "--gateway",
                "default/gw",
                "--id",
                "bin-1",
            ])
            .arg("--tls-dir")
            .arg(tls)
            .arg("--state-dir")
            .arg(state)
            .args([
                "--admin",
                &format!("127.0.0.1:{admin}"),
                "--access-log",
                "false",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_subscribes_and_restarts_from_its_state_dir() {
    // `cargo test --workspace` (what e2e/test-all.sh runs) builds it; a missing binary is a
    // failure, not a skip.
    let bin =
        binary().expect("tollgate-proxy binary not built: run `cargo build -p tollgate-proxy`");
    let ca = Ca::generate().unwrap();
    let server = server(&ca, 0).await;
    let controller = format!("https://{}", server.local_addr());
    let tls = tls_dir(&ca.issue_client(&proxy_identity("default", "gw")).unwrap());
    let state = temp_dir("bin-state");
    let port = free_port();
    let mut t = table(&[echo("one").await]);
    t.ports[0].port = port;
    let v = server.publish(&gw(), t);

    let admin = free_port();
    let proc1 = start(&bin, &controller, &tls, &state, admin);
    let s = wait_sync(&server, |s| s.in_sync == 1).await;
    assert_eq!(s.version, v);
    let ready = format!("http://127.0.0.1:{admin}/readyz");
    assert!(eventually(|| async { get_url(&ready).await.map(|r| r.0) == Some(200) }).await);
    let url = format!("http://127.0.0.1:{port}/");
    assert_eq!(get_url(&url).await.unwrap().1, "one");

    // The table reaches the state dir right after the ACK.
    let saved = state.join("table.json");
    assert!(eventually(|| async { saved.exists() }).await);

    // Controller gone, proxy restarted: ready at once from the state dir.
    server.shutdown();
    drop(server);
    drop(proc1);
    let admin = free_port();
    let _proc2 = start(&bin, &controller, &tls, &state, admin);
    let ready = format!("http://127.0.0.1:{admin}/readyz");
    assert!(eventually(|| async { get_url(&ready).await.map(|r| r.0) == Some(200) }).await);
    assert_eq!(get_url(&url).await.unwrap().1, "one");
}
