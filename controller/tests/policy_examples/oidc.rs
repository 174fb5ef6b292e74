//! examples/oidc served by `tollgate run`, as its README says: the README's OpenID Provider
//! (e2e/oidc-provider.sh on 127.0.0.1:9998), then the README's login walked by
//! e2e/oidc-browser.py, the scripted browser e2e/examples-test.sh uses on the cluster: the
//! redirect to the provider, its login form, the callback, the page served with
//! `x-user: id1`, a tampered cookie refused, logout. Skips loudly when the provider cannot be
//! built (no Go).
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::WAIT;
use crate::support::{eventually, get, workspace};

/// The provider process, killed when the test ends however it ends.
struct Provider(Child);

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The README's provider on 127.0.0.1:9998, once it accepts connections; `None` after a loud
/// message when e2e/oidc-provider.sh cannot build it.
fn provider() -> Option<Provider> {
    let path = Command::new(workspace().join("e2e/oidc-provider.sh"))
        .arg("path")
        .output()
        .unwrap();
    if !path.status.success() {
        eprintln!(
            "\n*** SKIPPED examples/oidc: e2e/oidc-provider.sh could not build the provider:\n{} ***\n",
            String::from_utf8_lossy(&path.stderr)
        );
        return None;
    }
    let bin = String::from_utf8(path.stdout).unwrap();
    let mut child = Command::new(bin.trim())
        .args(["-listen", "127.0.0.1:9998"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "issuer http://127.0.0.1:9998");
    Some(Provider(child))
}

pub fn oidc() {
    let Some(_provider) = provider() else { return };
    let tg = super::run_example("oidc");
    let api = eventually(WAIT, || {
        get(8090, "127.0.0.1:8090", "/orders").filter(|r| r.status != 404)
    })
    .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));
    assert_eq!(api.status, 401, "an API client without a session: {api:?}");

    let browser = Command::new("python3")
        .arg(workspace().join("e2e/oidc-browser.py"))
        .args([
            "example",
            "http://127.0.0.1:8090/orders",
            "http://127.0.0.1:9998",
        ])
        .output()
        .unwrap();
    assert!(
        browser.status.success(),
        "the README's login failed:\n{}\nlog:\n{}",
        String::from_utf8_lossy(&browser.stderr),
        tg.log()
    );
}
