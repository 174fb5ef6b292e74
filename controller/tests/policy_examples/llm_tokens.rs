//! examples/llm-tokens served by `tollgate run`, as its README says: a token budget counted
//! from each answer's `x-tokens-used` (the request after the one that crossed 1,000 tokens
//! is refused) and a shadow limit on prompt bytes that never refuses and is reported in the
//! metrics.
use crate::WAIT;
use crate::support::{Tollgate, eventually, free_port, get, get_with, post_h2c, temp_dir};

pub fn llm_tokens() {
    let admin = free_port();
    let logs = temp_dir("llm-tokens");
    let admin_addr = format!("127.0.0.1:{admin}");
    let tg = Tollgate::start(
        &[
            "run",
            "examples/llm-tokens",
            "--demo-backend",
            "127.0.0.1:9080",
            "--admin",
            &admin_addr,
        ],
        &logs,
    );
    let chat = |user: &str| {
        get_with(
            8090,
            "127.0.0.1:8090",
            "/v1/chat/completions",
            &[("x-user", user)],
        )
    };
    // Wait with a user of its own, so alice starts with a full budget.
    eventually(WAIT, || chat("probe").filter(|r| r.status == 200))
        .unwrap_or_else(|| panic!("never served; log:\n{}", tg.log()));

    for remaining in ["600", "200", "0"] {
        let r = chat("alice").unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("x-tokens-used"), Some("400"), "{r:?}");
        assert_eq!(r.header("x-ratelimit-limit"), Some("1000"), "{r:?}");
        assert_eq!(r.header("x-ratelimit-remaining"), Some(remaining), "{r:?}");
    }
    let refused = chat("alice").unwrap();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));

    // Two prompts of 600 bytes from bob: the second would go over the shadow limit of 1,000
    // bytes a minute, and is served all the same.
    let prompt = vec![b'x'; 600];
    for _ in 0..2 {
        let r = post_h2c(8090, "/v1/chat/completions", &[("x-user", "bob")], &prompt).unwrap();
        assert_eq!(r.status, 200, "{r:?}");
    }
    let metrics = get(admin, &admin_addr, "/metrics").unwrap().body;
    assert!(
        metrics.contains(
            r#"tollgate_ratelimit_decisions_total{policy="default/llm-budget",outcome="shadow_limited"} 1"#
        ),
        "{metrics}"
    );
}
