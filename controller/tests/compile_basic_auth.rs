//! AuthPolicy `basic`: htpasswd Secrets selected by label into table users; weak or malformed
//! entries refuse the policy (which then closes its route: it was never valid).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::Output;
use tollgate_api::ObjectKey;
use tollgate_api::policy::{Credentials, Method};

const BCRYPT: &str = "$2y$05$ftpDcYxkWhxiuNtLOL5ez.sH27VaQ64mqjcORgR3PYpMKRKl9bxJu";
const SHA512: &str = "$6$saltsalt$TVLlQcbpFVof5W3Yz4DTP6gRstiNuHwwTt6GLc1E5n0U0aDehy0S5knV8wiOQSpT0Y77vwPZN.Pq.H91p5hVO1";

fn policy_with(htpasswd: &str) -> Output {
    let extra = format!(
        r#"
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {{name: staff, namespace: pol}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: shop, sectionName: checkout}}]
  rules:
    authentication:
      staff: {{basic: {{selector: {{matchLabels: {{app: admin}}}}}}}}
---
apiVersion: v1
kind: Secret
metadata:
  name: admins
  namespace: pol
  labels: {{app: admin, tollgate.dev/credential: "true"}}
  annotations: {{team: ops}}
stringData:
  htpasswd: |
{htpasswd}
---
apiVersion: v1
kind: Secret
metadata: {{name: more-admins, namespace: pol, labels: {{app: admin, tollgate.dev/credential: "true"}}}}
stringData:
  htpasswd: "carol:{SHA512}\n"
---
apiVersion: v1
kind: Secret
metadata: {{name: unlabelled, namespace: pol, labels: {{app: admin}}}}
stringData:
  htpasswd: "mallory:{SHA512}\n"
---
apiVersion: v1
kind: Secret
metadata: {{name: elsewhere, namespace: other, labels: {{app: admin, tollgate.dev/credential: "true"}}}}
stringData:
  htpasswd: "eve:{SHA512}\n"
"#,
        htpasswd = htpasswd
            .lines()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    run(&["policies"], &extra)
}

fn staff(out: &Output) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
    &out.auth_policies[&ObjectKey::new("pol", "staff")].conditions
}

#[test]
fn htpasswd_entries_of_labelled_selected_secrets_become_users() {
    let out = policy_with(&format!("# admins\nalice:{BCRYPT}\n\nbob:{SHA512}\n"));
    assert_cond(staff(&out), "Accepted", "True", "Accepted");
    let t = table(&out, "pol", "gw");
    let r = vhost(table_listener(t, "http"), "shop.test")
        .routes
        .iter()
        .find(|r| matches!(&r.matcher.path, tollgate_api::PathMatch::PathPrefix(p) if p == "/checkout"))
        .expect("checkout route");
    let auth = t.policies[r.policy.as_deref().expect("policy")]
        .auth
        .as_ref()
        .expect("auth");
    let m = &auth.authentication[0];
    assert_eq!(
        m.credentials,
        Credentials::AuthorizationHeader {
            prefix: "Basic".into()
        }
    );
    let Method::Basic(b) = &m.method else {
        panic!("{:?}", m.method)
    };
    let users: Vec<(&str, &str)> = b
        .users
        .iter()
        .map(|u| (u.username.as_str(), u.hash.as_str()))
        .collect();
    assert_eq!(
        users,
        [("alice", BCRYPT), ("bob", SHA512), ("carol", SHA512)],
        "sorted by Secret then line; unlabelled and other-namespace Secrets are not read"
    );
    assert_eq!(b.users[0].identity["username"], "alice");
    assert_eq!(b.users[0].identity["metadata"]["name"], "admins");
    assert_eq!(
        b.users[0].identity["metadata"]["annotations"]["team"],
        "ops"
    );
    assert_eq!(b.users[2].identity["metadata"]["name"], "more-admins");
}

#[test]
fn weak_and_malformed_entries_refuse_the_policy_and_close_its_route() {
    for (line, needle) in [
        (
            "dave:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/",
            "line 2 (user \"dave\"): MD5 (apr1) hashes are weak; use bcrypt (htpasswd -B) or SHA-512 crypt (mkpasswd -m sha-512)",
        ),
        (
            "dave:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=",
            "(user \"dave\"): unsalted SHA-1 ({SHA}) hashes are weak",
        ),
        (
            "dave:rqXexS6ZhobKA",
            "(user \"dave\"): DES crypt hashes are weak",
        ),
        (
            "dave:hunter2",
            "(user \"dave\"): plain-text passwords are refused",
        ),
        (
            "dave:$1$saltsalt$qjXMvbEw8oaL.CzflDugX/",
            "MD5 crypt hashes are weak",
        ),
        ("dave", "line 2: not `user:hash`"),
        (":$6$salt$hash", "line 2: empty user name"),
    ] {
        let out = policy_with(&format!("alice:{BCRYPT}\n{line}\n"));
        let c = staff(&out);
        assert_cond(c, "Accepted", "False", "Invalid");
        let m = &cond(c, "Accepted").message;
        assert!(
            m.contains("authentication.staff.basic: Secret pol/admins line 2")
                && m.contains(needle),
            "{line}: {m}"
        );
        if let Some((_, hash)) = line.split_once(':') {
            assert!(
                !m.contains(hash),
                "the hash (or password) is not echoed: {m}"
            );
        }
        let t = table(&out, "pol", "gw");
        assert!(
            t.closed
                .values()
                .any(|c| c.by.contains(&ObjectKey::new("pol", "staff"))),
            "{line}: the route is closed, not opened"
        );
    }
}
