//! HTTP Basic authentication (RFC 7617). In: the table's htpasswd entries (built once per
//! table) and a presented `Authorization: Basic` credential (per request). Out: the identity
//! of the entry whose hash the password matches (`{"username", "metadata"}`, never the hash).
//!
//! The hashes are slow on purpose (bcrypt, SHA-crypt: milliseconds to tens of milliseconds
//! each), so three things keep them off the request path and out of an attacker's hands:
//!
//! - **A memo per table.** A (user, password) pair checked once is remembered by its
//!   SipHash-1-3 (128 bits) under a secret drawn from the OS when the table is built, with
//!   its answer, right or wrong; a repeat caller costs that hash and a lookup, as an API key
//!   does. The memo never holds a password, is bounded ([`MEMO_CAPACITY`] pairs), and belongs
//!   to the compiled table: a new password or a removed user is a new table with an empty memo.
//! - **Hashing on the blocking pool, [`HASHING_PERMITS`] at a time per process** (one per
//!   core), so a flood of wrong passwords uses at most those threads and never stalls the
//!   event loop serving everyone else; beyond [`MAX_WAITING`] queued checks a request is
//!   denied at once (an error outcome, as an unreachable key server is: fail closed).
//! - **Unknown users cost the same as known ones**: their password is checked against the
//!   first entry's hash and the result thrown away, so timing does not tell which user names
//!   exist.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use sha_crypt::PasswordVerifier as _;
use siphasher::sip128::{Hasher128 as _, SipHasher13};
use tokio::sync::Semaphore;
use tollgate_api::policy::BasicUsers;

use super::{AuthBuildError, Failure};
use crate::FastMap;

/// Remembered (user, password) answers per table.
pub(crate) const MEMO_CAPACITY: usize = 16_384;
/// Checks queued for a hashing permit beyond which new ones are denied without hashing.
pub(crate) const MAX_WAITING: usize = 1024;
/// Concurrent hash computations per process: one per core.
static HASHING_PERMITS: LazyLock<usize> =
    LazyLock::new(|| std::thread::available_parallelism().map_or(1, usize::from));
static HASHING: LazyLock<Semaphore> = LazyLock::new(|| Semaphore::new(*HASHING_PERMITS));
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// One htpasswd entry.
struct Entry {
    hash: Arc<str>,
    identity: Arc<serde_json::Value>,
}

/// The compiled users of one method.
#[derive(Clone)]
pub(crate) struct BasicVerifier {
    /// User name → its entries (a user may appear in several Secrets; any one may match).
    users: Arc<FastMap<String, Vec<Entry>>>,
    /// The hash unknown users are checked against (see the module docs).
    decoy: Option<Arc<str>>,
    memo: Arc<Memo>,
}

struct Memo {
    hasher: SipHasher13,
    /// Keyed hash of (user, password) → the matching entry's identity, or `None` (wrong).
    answers: quick_cache::sync::Cache<u128, Option<Arc<serde_json::Value>>>,
}

impl std::fmt::Debug for BasicVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicVerifier")
            .field("users", &self.users.len())
            .finish_non_exhaustive()
    }
}

impl BasicVerifier {
    /// Indexes the entries by user name.
    pub fn compile(users: &BasicUsers) -> Result<Self, AuthBuildError> {
        let mut by_name: FastMap<String, Vec<Entry>> = FastMap::default();
        for u in &users.users {
            by_name.entry(u.username.clone()).or_default().push(Entry {
                hash: u.hash.as_str().into(),
                identity: Arc::new(u.identity.clone()),
            });
        }
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).map_err(|e| AuthBuildError::Random(e.to_string()))?;
        Ok(Self {
            users: Arc::new(by_name),
            decoy: users.users.first().map(|u| u.hash.as_str().into()),
            memo: Arc::new(Memo {
                hasher: SipHasher13::new_with_key(&secret),
                answers: quick_cache::sync::Cache::new(MEMO_CAPACITY),
            }),
        })
    }

    /// The identity of the user whose password `credential` (the base64 of `user:password`)
    /// carries.
    pub async fn verify(&self, credential: &str) -> Result<Arc<serde_json::Value>, Failure> {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credential)
            .map_err(|_| Failure::Invalid("malformed Basic credential"))?;
        let colon = decoded
            .iter()
            .position(|b| *b == b':')
            .ok_or(Failure::Invalid("malformed Basic credential"))?;
        let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
        let memo_key = {
            let mut h = self.memo.hasher;
            std::hash::Hasher::write(&mut h, user);
            std::hash::Hasher::write_u8(&mut h, 0xff);
            std::hash::Hasher::write(&mut h, password);
            h.finish128().as_u128()
        };
        if let Some(answer) = self.memo.answers.get(&memo_key) {
            return answer.ok_or(Failure::Invalid("wrong user name or password"));
        }
        let entries: Vec<(Arc<str>, Arc<serde_json::Value>)> = std::str::from_utf8(user)
            .ok()
            .and_then(|u| self.users.get(u))
            .map(|es| {
                es.iter()
                    .map(|e| (e.hash.clone(), e.identity.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let decoy = entries.is_empty().then(|| self.decoy.clone()).flatten();
        let password = password.to_vec();
        let answer = hashing(move || {
            if let Some(hash) = decoy {
                let _ = matches(&password, &hash);
                return None;
            }
            entries
                .into_iter()
                .find(|(hash, _)| matches(&password, hash))
                .map(|(_, identity)| identity)
        })
        .await?;
        self.memo.answers.insert(memo_key, answer.clone());
        answer.ok_or(Failure::Invalid("wrong user name or password"))
    }
}

/// Runs `check` on the blocking pool under a hashing permit.
async fn hashing<T: Send + 'static>(
    check: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Failure> {
    hashing_on(&HASHING, &WAITING, check).await
}

/// [`hashing`] on the given permits and queue count. The permit moves into the blocking task
/// and is released when the hash is done, not when the request is: a client that sends a
/// password and hangs up at once must not free a permit while its hash still runs (each
/// such hang-up would otherwise start one more hash, up to the whole blocking pool).
async fn hashing_on<T: Send + 'static>(
    permits: &'static Semaphore,
    waiting_count: &'static AtomicUsize,
    check: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Failure> {
    struct Waiting(&'static AtomicUsize);
    impl Drop for Waiting {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
    if waiting_count.fetch_add(1, Ordering::Relaxed) >= MAX_WAITING {
        waiting_count.fetch_sub(1, Ordering::Relaxed);
        return Err(Failure::Unavailable(
            "too many password checks waiting".to_owned(),
        ));
    }
    let waiting = Waiting(waiting_count);
    let permit = permits
        .acquire()
        .await
        .map_err(|_| Failure::Unavailable("password hashing stopped".to_owned()))?;
    drop(waiting);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        check()
    })
    .await
    .map_err(|e| Failure::Unavailable(format!("password check failed: {e}")))
}

/// Whether `password` matches `hash` (a format the compiler accepted; anything else never
/// matches).
fn matches(password: &[u8], hash: &str) -> bool {
    if hash.starts_with("$2") {
        bcrypt::verify(password, hash).unwrap_or(false)
    } else if hash.starts_with("$5$") || hash.starts_with("$6$") {
        sha_crypt::ShaCrypt::default()
            .verify_password(password, hash)
            .is_ok()
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_api::policy::BasicUser;

    fn users(entries: &[(&str, &str)]) -> BasicVerifier {
        let users = BasicUsers {
            users: entries
                .iter()
                .map(|(u, h)| BasicUser {
                    username: (*u).to_owned(),
                    hash: (*h).to_owned(),
                    identity: serde_json::json!({ "username": u }),
                })
                .collect(),
        };
        BasicVerifier::compile(&users).expect("compiles")
    }

    fn basic(user_pass: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    }

    // `openssl passwd -5 -salt saltsalt secret` and `openssl passwd -6 -salt saltsalt secret`.
    const SHA256: &str = "$5$saltsalt$0IyaXrmV7.sGNS6tirgqHLqX/G.FBvgkYA.lpPdS5sA";
    const SHA512: &str = "$6$saltsalt$TVLlQcbpFVof5W3Yz4DTP6gRstiNuHwwTt6GLc1E5n0U0aDehy0S5knV8wiOQSpT0Y77vwPZN.Pq.H91p5hVO1";

    #[tokio::test]
    async fn each_format_verifies_its_password_only() {
        let bcrypt = bcrypt::hash("secret", 4).expect("bcrypt");
        let v = users(&[("b", &bcrypt), ("five", SHA256), ("six", SHA512)]);
        for user in ["b", "five", "six"] {
            let id = v.verify(&basic(&format!("{user}:secret"))).await;
            assert_eq!(
                id.expect("right password")["username"],
                serde_json::json!(user)
            );
            assert!(v.verify(&basic(&format!("{user}:Secret"))).await.is_err());
        }
        assert!(v.verify(&basic("nobody:secret")).await.is_err());
        assert!(v.verify("not base64!").await.is_err());
        assert!(v.verify(&basic("no colon")).await.is_err());
    }

    #[tokio::test]
    async fn answers_are_remembered_right_and_wrong() {
        let v = users(&[("six", SHA512)]);
        assert!(v.verify(&basic("six:secret")).await.is_ok());
        assert!(v.verify(&basic("six:wrong")).await.is_err());
        assert_eq!(v.memo.answers.len(), 2);
        assert!(v.verify(&basic("six:secret")).await.is_ok());
        assert!(v.verify(&basic("six:wrong")).await.is_err());
        assert_eq!(v.memo.answers.len(), 2);
    }

    /// A request dropped while its hash runs (the client hung up) keeps the permit until the
    /// hash ends, so hang-ups cannot start more hashes than there are permits.
    #[tokio::test]
    async fn a_dropped_check_holds_its_permit_until_the_hash_ends() {
        static PERMITS: Semaphore = Semaphore::const_new(1);
        static QUEUED: AtomicUsize = AtomicUsize::new(0);
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let check = hashing_on(&PERMITS, &QUEUED, move || {
            let _ = started_tx.send(());
            let _ = finish_rx.recv();
            let _ = done_tx.send(());
        });
        let task = tokio::spawn(check);
        tokio::task::spawn_blocking(move || started_rx.recv())
            .await
            .expect("join")
            .expect("the hash started");
        task.abort();
        let _ = task.await;
        assert_eq!(
            PERMITS.available_permits(),
            0,
            "the hash still runs: its permit is still taken"
        );
        finish_tx.send(()).expect("release the hash");
        tokio::task::spawn_blocking(move || done_rx.recv())
            .await
            .expect("join")
            .expect("the hash ended");
        let permit = tokio::time::timeout(std::time::Duration::from_secs(5), PERMITS.acquire())
            .await
            .expect("the permit came back once the hash ended");
        drop(permit);
    }

    #[tokio::test]
    async fn a_user_in_two_secrets_matches_either_password() {
        let v = users(&[
            ("ann", SHA256),
            ("ann", &bcrypt::hash("other", 4).expect("bcrypt")),
        ]);
        assert!(v.verify(&basic("ann:secret")).await.is_ok());
        assert!(v.verify(&basic("ann:other")).await.is_ok());
        assert!(v.verify(&basic("ann:neither")).await.is_err());
    }
}
