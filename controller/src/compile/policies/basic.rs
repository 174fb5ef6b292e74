//! AuthPolicy `basic`: htpasswd Secrets to table users.
//!
//! In: the method's selector and the Secrets the compiler was given (labelled
//! [`CREDENTIAL_LABEL`](super::auth::CREDENTIAL_LABEL)). Out: one [`BasicUser`] per htpasswd line of the selected Secrets
//! (key [`HTPASSWD_FIELD`]), sorted by Secret then line, or the `Invalid` problem naming the
//! Secret and line of the first entry that is malformed or hashed in a weak format.
//!
//! Only slow, salted hashes are accepted: bcrypt (`$2a$`, `$2b$`, `$2y$`, what
//! `htpasswd -B` writes) and SHA-256/SHA-512 crypt (`$5$`, `$6$`, what `mkpasswd -m
//! sha-512` writes). MD5 (`$apr1$`, `$1$`, the `htpasswd` default), SHA-1 (`{SHA}`), DES
//! crypt (`htpasswd -d`) and plain text are refused: they fall to a GPU in minutes when a
//! Secret leaks, and a policy that accepted them would teach operators to keep them.
//! A refused entry makes the whole policy invalid (it keeps its last valid version, or closes
//! its targets), never silently drops a user.

use k8s_openapi::api::core::v1::Secret;
use tollgate_api::ObjectKey;
use tollgate_api::policy::{BasicUser, BasicUsers};

use super::auth::{secret_value, selected};
use super::{Problem, invalid};
use crate::compile::index::{name_of, ns_of};
use crate::crds::auth::BasicSpec;

/// Key of a basic-auth Secret's data holding the htpasswd lines.
pub const HTPASSWD_FIELD: &str = "htpasswd";

/// The users of `spec` from `secrets`; `field` is `authentication.<name>` for messages.
pub fn users(
    spec: &BasicSpec,
    policy: &ObjectKey,
    secrets: &[&Secret],
    field: &str,
) -> Result<BasicUsers, Problem> {
    let mut chosen: Vec<&Secret> = secrets
        .iter()
        .copied()
        .filter(|s| spec.all_namespaces || ns_of(&s.metadata) == policy.namespace)
        .filter(|s| selected(s, &spec.selector))
        .collect();
    chosen.sort_by_key(|s| (ns_of(&s.metadata), name_of(&s.metadata)));
    let mut users = Vec::new();
    for s in chosen {
        let (ns, name) = (ns_of(&s.metadata), name_of(&s.metadata));
        let Some(raw) = secret_value(s, HTPASSWD_FIELD) else {
            continue;
        };
        let text = String::from_utf8(raw).map_err(|_| {
            invalid(format!(
                "{field}.basic: Secret {ns}/{name}: {HTPASSWD_FIELD} is not UTF-8"
            ))
        })?;
        let identity_of = |username: &str| {
            serde_json::json!({
                "username": username,
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": s.metadata.labels.clone().unwrap_or_default(),
                    "annotations": s.metadata.annotations.clone().unwrap_or_default(),
                },
            })
        };
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = format!("{field}.basic: Secret {ns}/{name} line {}", i + 1);
            let (username, hash) = line
                .split_once(':')
                .ok_or_else(|| invalid(format!("{at}: not `user:hash`")))?;
            if username.is_empty() {
                return Err(invalid(format!("{at}: empty user name")));
            }
            check_hash(hash).map_err(|why| invalid(format!("{at} (user {username:?}): {why}")))?;
            users.push(BasicUser {
                username: username.to_owned(),
                hash: hash.to_owned(),
                identity: identity_of(username),
            });
        }
    }
    Ok(BasicUsers { users })
}

/// `Ok` for an accepted hash format that parses; else why it is refused.
pub fn check_hash(hash: &str) -> Result<(), String> {
    const ADVICE: &str = "use bcrypt (htpasswd -B) or SHA-512 crypt (mkpasswd -m sha-512)";
    if let Some(rest) = ["$2a$", "$2b$", "$2y$"]
        .iter()
        .find_map(|p| hash.strip_prefix(p))
    {
        // `$2y$NN$` + 22 characters of salt + 31 of hash, bcrypt's own base64.
        let (cost, body) = rest.split_once('$').unwrap_or(("", ""));
        let cost_ok = cost.len() == 2 && cost.parse::<u32>().is_ok_and(|c| (4..=31).contains(&c));
        let body_ok = body.len() == 53
            && body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'/');
        return if cost_ok && body_ok {
            Ok(())
        } else {
            Err("malformed bcrypt hash".to_owned())
        };
    }
    if hash.starts_with("$5$") || hash.starts_with("$6$") {
        // `$5$[rounds=N$]salt$hash`: three or four fields after the prefix.
        let fields: Vec<&str> = hash.split('$').skip(2).collect();
        let well_formed = match fields.as_slice() {
            [salt, h] => !salt.is_empty() && !h.is_empty(),
            [rounds, salt, h] => {
                rounds
                    .strip_prefix("rounds=")
                    .is_some_and(|r| r.parse::<u32>().is_ok())
                    && !salt.is_empty()
                    && !h.is_empty()
            }
            _ => false,
        };
        return if well_formed {
            Ok(())
        } else {
            Err("malformed SHA-crypt hash".to_owned())
        };
    }
    let weak = if hash.starts_with("$apr1$") {
        "MD5 (apr1) hashes are weak"
    } else if hash.starts_with("$1$") {
        "MD5 crypt hashes are weak"
    } else if hash.starts_with("{SHA}") {
        "unsalted SHA-1 ({SHA}) hashes are weak"
    } else if hash.len() == 13
        && hash
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'/')
    {
        "DES crypt hashes are weak"
    } else if hash.starts_with('$') {
        "unknown hash format"
    } else {
        "plain-text passwords are refused"
    };
    Err(format!("{weak}; {ADVICE}"))
}

#[cfg(test)]
mod tests {
    use super::check_hash;

    #[test]
    fn accepts_bcrypt_and_sha_crypt() {
        for h in [
            "$2y$05$ftpDcYxkWhxiuNtLOL5ez.sH27VaQ64mqjcORgR3PYpMKRKl9bxJu",
            "$2b$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy",
            "$5$saltstring$5B8vYYiY.CVt1RlTTf8KbXBH3hsxY/GNooZF4MzTW87",
            "$6$rounds=10000$saltstringsaltst$OW1/O6BYHV6BcXZu8QVeXbDWra3Oeqh0sbHbbMCVNSnCM/UrjmM0Dp8vOuZeHBy/YTBmSK6H9qs/y3RnOaw5v.",
        ] {
            assert_eq!(check_hash(h), Ok(()), "{h}");
        }
    }

    #[test]
    fn refuses_weak_and_malformed_formats_with_advice() {
        for (h, why) in [
            ("$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/", "MD5 (apr1)"),
            ("$1$saltsalt$qjXMvbEw8oaL.CzflDugX/", "MD5 crypt"),
            ("{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "SHA-1"),
            ("rqXexS6ZhobKA", "DES crypt"),
            ("hunter2", "plain-text"),
            (
                "$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA",
                "unknown hash format",
            ),
            ("$2y$05$short", "malformed bcrypt"),
            ("$6$", "malformed SHA-crypt"),
        ] {
            let err = check_hash(h).expect_err(h);
            assert!(err.contains(why), "{h}: {err}");
        }
        assert!(
            check_hash("hunter2")
                .expect_err("plain")
                .ends_with("use bcrypt (htpasswd -B) or SHA-512 crypt (mkpasswd -m sha-512)")
        );
    }
}
