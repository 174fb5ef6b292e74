//! Costs read from the response body (`int(response.body.usage.total_tokens)`), on the wire:
//! an upstream on a raw socket answers JSON bodies as an LLM API does (in chunks split at
//! arbitrary points), and the request after the one that crossed the limit gets 429 without
//! reaching it; what counts when the body cannot be read (not JSON, over the cap, gzip, too
//! deeply nested, no body), and when the upstream aborts or the client hangs up mid-body.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tollgate_api::policy::{Cost, LimitMode, RateLimit};
use tollgate_proxy::metrics::Metrics;

use crate::common::*;
use crate::cost::{proxy_with_limits, tokens};
use crate::support::*;

/// What the raw upstream writes for one request.
#[derive(Clone)]
enum Step {
    /// These bytes.
    Write(Vec<u8>),
    /// Waits until the gate opens.
    Wait(Arc<Gate>),
}

/// Opened once, for good.
#[derive(Default)]
struct Gate {
    open: std::sync::atomic::AtomicBool,
    notify: Notify,
}

impl Gate {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if self.open.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

/// The raw upstream: its address, the requests it got, the answers it wrote whole.
struct Upstream {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
}

/// An upstream on a raw socket that answers every request with `steps` then closes the
/// connection; the requests it got.
async fn raw_upstream(steps: Vec<Step>) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let finished = done.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let steps = steps.clone();
            let hits = counted.clone();
            let done = finished.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                hits.fetch_add(1, Ordering::SeqCst);
                for step in steps {
                    match step {
                        Step::Write(bytes) => {
                            if s.write_all(&bytes).await.is_err() {
                                return;
                            }
                            let _ = s.flush().await;
                        }
                        Step::Wait(gate) => gate.wait().await,
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    Upstream { addr, hits, done }
}

/// [`raw_upstream`]'s address and hits.
async fn raw_backend(steps: Vec<Step>) -> (SocketAddr, Arc<AtomicUsize>) {
    let u = raw_upstream(steps).await;
    (u.addr, u.hits)
}

/// A chunked 200 answer whose body is `body` cut at `cuts`, with `extra` head lines.
fn chunked(body: &[u8], cuts: &[usize], extra: &str) -> Vec<Step> {
    let mut head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{extra}transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    )
    .into_bytes();
    let mut steps = Vec::new();
    let mut start = 0;
    for &end in cuts.iter().chain([&body.len()]) {
        let part = &body[start..end];
        head.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        head.extend_from_slice(part);
        head.extend_from_slice(b"\r\n");
        steps.push(Step::Write(std::mem::take(&mut head)));
        start = end;
    }
    steps.push(Step::Write(b"0\r\n\r\n".to_vec()));
    steps
}

/// An OpenAI-style answer counting `total` tokens.
fn usage(total: u64) -> Vec<u8> {
    format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"Hello {{\"usage\": 1}}"}}}}],"usage":{{"prompt_tokens":100,"completion_tokens":{},"total_tokens":{total}}}}}"#,
        total - 100
    )
    .into_bytes()
}

fn body_tokens() -> Option<Cost> {
    Some(Cost::Response(
        "int(response.body.usage.total_tokens)".into(),
    ))
}

/// A limit of 1,000 tokens a minute per `x-user`, read from the body, in `mode`.
fn llm_limit(mode: LimitMode) -> RateLimit {
    tokens("tokens", 1_000, body_tokens(), mode)
}

const ALICE: [(&str, &str); 1] = [("x-user", "alice")];

fn cost_errors(metrics: &Metrics) -> usize {
    let text = metrics.encode();
    text.lines()
        .find(|l| l.starts_with(r#"tollgate_ratelimit_cost_errors_total{policy="default/limits"}"#))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// The remaining count a fresh request of alice sees (it is admitted and counts 1 more, when
/// its own body is unreadable: use it last).
async fn remaining(url: &str) -> String {
    let a = get_with(&h1_client(), url, &ALICE).await;
    header(&a, "x-ratelimit-remaining")
        .unwrap_or("none")
        .to_owned()
}

#[tokio::test]
async fn a_body_cost_refuses_the_request_after_the_one_that_crossed_the_limit() {
    let body = usage(400);
    // Cut inside the key, inside the number, and one byte at a time near the end.
    let n = body.len();
    let (upstream, hits) = raw_backend(chunked(&body, &[1, 20, n - 12, n - 11, n - 3], "")).await;
    let (_p, url, metrics) = proxy_with_limits(upstream, vec![llm_limit(LimitMode::Enforce)]).await;
    let c = h1_client();
    // Each answer's numbers are those before its own cost, which its body brings.
    for before in ["1000", "600", "200"] {
        let ok = get_with(&c, &url, &ALICE).await;
        assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
        assert_eq!(ok.body, body, "the body goes through whole");
        assert_eq!(limit_headers(&ok), (Some("1000"), Some(before)));
    }
    let refused = get_with(&c, &url, &ALICE).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        3,
        "the fourth never reached the upstream"
    );
    assert_eq!(cost_errors(&metrics), 0);
    let bob = get_with(&c, &url, &[("x-user", "bob")]).await;
    assert_eq!(limit_headers(&bob), (Some("1000"), Some("1000")));
}

/// The same six requests through the limit enforced and in shadow mode: the shadow proxy
/// serves all six and reports as would-be refusals exactly those the enforcing one refused.
#[tokio::test]
async fn a_shadow_body_cost_counts_the_same_and_never_refuses() {
    let (upstream, hits) = raw_backend(chunked(&usage(400), &[7], "")).await;
    let (_e, enforce, em) = proxy_with_limits(upstream, vec![llm_limit(LimitMode::Enforce)]).await;
    let (_s, shadow, sm) = proxy_with_limits(upstream, vec![llm_limit(LimitMode::Shadow)]).await;
    let c = h1_client();
    let mut enforced = Vec::new();
    for _ in 0..6 {
        enforced.push(get_with(&c, &enforce, &ALICE).await.status);
    }
    assert_eq!(hits.swap(0, Ordering::SeqCst), 3, "{enforced:?}");
    for _ in 0..6 {
        let a = get_with(&c, &shadow, &ALICE).await;
        assert_eq!(a.status, StatusCode::OK, "shadow never refuses: {a:?}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 6);
    let limited =
        r#"tollgate_ratelimit_decisions_total{policy="default/limits",outcome="limited"} 3"#;
    let shadowed =
        r#"tollgate_ratelimit_decisions_total{policy="default/limits",outcome="shadow_limited"} 3"#;
    assert!(em.encode().contains(limited), "{}", em.encode());
    assert!(sm.encode().contains(shadowed), "{}", sm.encode());
}

/// A body cost that cannot be read counts 1 and a cost error.
async fn counts_one(steps: Vec<Step>, limit: RateLimit, method: Method) {
    let (upstream, _hits) = raw_backend(steps).await;
    let (_p, url, metrics) = proxy_with_limits(upstream, vec![limit]).await;
    let a = request(&h1_client(), method, &url, &ALICE).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(cost_errors(&metrics), 1, "{}", metrics.encode());
    assert_eq!(remaining(&url).await, "999");
}

#[tokio::test]
async fn a_body_that_is_not_json_counts_one() {
    counts_one(
        chunked(b"total_tokens: 400", &[5], ""),
        llm_limit(LimitMode::Enforce),
        Method::GET,
    )
    .await;
}

#[tokio::test]
async fn a_body_over_the_cap_counts_one() {
    let mut limit = llm_limit(LimitMode::Enforce);
    limit.cost_max_body_bytes = Some(64);
    let body = usage(400);
    assert!(body.len() > 64);
    counts_one(chunked(&body, &[32], ""), limit, Method::GET).await;
}

#[tokio::test]
async fn a_body_within_the_cap_is_read() {
    let mut limit = llm_limit(LimitMode::Enforce);
    let body = usage(400);
    limit.cost_max_body_bytes = Some(body.len() as u64);
    let (upstream, _hits) = raw_backend(chunked(&body, &[32], "")).await;
    let (_p, url, _m) = proxy_with_limits(upstream, vec![limit]).await;
    get_with(&h1_client(), &url, &ALICE).await;
    assert_eq!(remaining(&url).await, "600");
}

#[tokio::test]
async fn an_encoded_body_is_not_read_and_counts_one() {
    counts_one(
        chunked(&usage(400), &[], "content-encoding: gzip\r\n"),
        llm_limit(LimitMode::Enforce),
        Method::GET,
    )
    .await;
}

#[tokio::test]
async fn json_nested_past_the_parser_limit_counts_one() {
    let mut deep = "[".repeat(100_000).into_bytes();
    deep.extend(b"]".repeat(100_000));
    counts_one(
        chunked(&deep, &[4096], ""),
        llm_limit(LimitMode::Enforce),
        Method::GET,
    )
    .await;
}

#[tokio::test]
async fn an_answer_without_a_body_counts_one() {
    for head in [
        "HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nconnection: close\r\n\r\n",
    ] {
        let (upstream, _hits) = raw_backend(vec![Step::Write(head.as_bytes().to_vec())]).await;
        let (_p, url, metrics) =
            proxy_with_limits(upstream, vec![llm_limit(LimitMode::Enforce)]).await;
        let a = get_with(&h1_client(), &url, &ALICE).await;
        assert!(a.body.is_empty(), "{a:?}");
        assert_eq!(cost_errors(&metrics), 1, "{head}");
        let again = get_with(&h1_client(), &url, &ALICE).await;
        assert_eq!(limit_headers(&again), (Some("1000"), Some("999")), "{head}");
    }
}

#[tokio::test]
async fn an_upstream_that_aborts_mid_body_counts_one() {
    let body = usage(400);
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let mut partial = head.into_bytes();
    partial.extend_from_slice(&body[..body.len() - 10]);
    let (upstream, _hits) = raw_backend(vec![Step::Write(partial)]).await;
    let (_p, url, metrics) = proxy_with_limits(upstream, vec![llm_limit(LimitMode::Enforce)]).await;
    // The client never gets the whole answer: no answer at all when the body failed before
    // the head went out, else one cut short.
    let answer = h1_client()
        .request(
            http::Request::get(&url)
                .header("x-user", "alice")
                .body(http_body_util::Full::default())
                .unwrap(),
        )
        .await;
    if let Ok(resp) = answer {
        use http_body_util::BodyExt as _;
        assert!(resp.into_body().collect().await.is_err(), "cut short");
    }
    assert!(
        eventually(|| cost_errors(&metrics) == 1).await,
        "{}",
        metrics.encode()
    );
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_body_still_pays_the_whole_cost() {
    let body = usage(400);
    let gate = Arc::new(Gate::default());
    let mut steps = chunked(&body, &[10], "");
    // The head and the first chunk, then the rest once the client has gone.
    steps.insert(1, Step::Wait(gate.clone()));
    let up = raw_upstream(steps).await;
    let (_p, url, metrics) = proxy_with_limits(up.addr, vec![llm_limit(LimitMode::Enforce)]).await;
    let addr = url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: llm\r\nx-user: alice\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut b).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&b[..n]);
    }
    drop(s);
    gate.open();
    assert!(eventually(|| up.done.load(Ordering::SeqCst) == 1).await);
    // Probes of alice's counter: HEAD answers have no body, so each counts 1 (a cost
    // error); the k-th sees 1000 - k before the abandoned answer is counted, 600 - k after.
    let c = h1_client();
    let mut counted = false;
    for k in 0..200 {
        let a = request(&c, Method::HEAD, &url, &ALICE).await;
        let left: i64 = header(&a, "x-ratelimit-remaining")
            .unwrap()
            .parse()
            .unwrap();
        if left == 600 - k {
            counted = true;
            break;
        }
        assert_eq!(
            left,
            1000 - k,
            "only the 400 tokens of the abandoned answer"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(counted, "the abandoned answer was counted from its body");
    assert!(
        cost_errors(&metrics) >= 1,
        "the probes, not the abandoned answer"
    );
}
