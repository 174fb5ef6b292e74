//! Names and label values of provisioned objects, derived from the Gateway name alone.
//!
//! In: a Gateway name (a DNS-1123 subdomain: up to 253 characters, may contain dots, may
//! start with a digit). Out: names valid for every provisioned kind, and a label value.
//!
//! The Service is the strictest kind: its name must be a DNS-1035 label (at most 63
//! characters, lowercase alphanumerics and `-`, starting with a letter). One name serves all
//! three objects, so it follows that rule. When the Gateway name has to be changed to fit
//! (dots, a leading digit, length), a short hash of the *original* name is added so two
//! Gateways that map to the same text (`a.b` and `a-b`) still get different objects.

/// Suffix of every provisioned object's name.
pub const NAME_SUFFIX: &str = "-tollgate";

/// Suffix of the proxy TLS Secret's name (after the object name).
pub const TLS_SECRET_SUFFIX: &str = "-proxy-tls";

/// Longest DNS-1035/1123 label, and longest label value.
const MAX_LABEL: usize = 63;

/// Hex digits of the hash added to adjusted names.
const HASH_LEN: usize = 8;

/// Name of the ServiceAccount, Deployment and Service of a Gateway: `<gateway>-tollgate`
/// when that is a valid DNS-1035 label, otherwise an adjusted prefix, `-`, an 8-digit hash
/// of the Gateway name, and `-tollgate` (at most 63 characters in all cases).
pub fn object_name(gateway: &str) -> String {
    let simple = format!("{gateway}{NAME_SUFFIX}");
    if is_dns1035_label(&simple) {
        return simple;
    }
    let mut prefix: String = gateway
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    if !prefix.starts_with(|c: char| c.is_ascii_lowercase()) {
        prefix.insert_str(0, "gw-");
    }
    let room = MAX_LABEL - NAME_SUFFIX.len() - HASH_LEN - 1;
    prefix.truncate(room);
    let prefix = prefix.trim_end_matches('-');
    format!("{prefix}-{}{NAME_SUFFIX}", short_hash(gateway))
}

/// Name of the Secret holding a Gateway's proxy certificate (`tls.crt`, `tls.key`,
/// `ca.crt`), mounted by the proxy Deployment: `<object name>-proxy-tls`.
pub fn tls_secret_name(gateway: &str) -> String {
    format!("{}{TLS_SECRET_SUFFIX}", object_name(gateway))
}

/// Value of the `gateway.networking.k8s.io/gateway-name` label: the Gateway name when it
/// fits a label value (63 characters), otherwise a 54-character prefix, `-` and a hash.
pub fn gateway_label_value(gateway: &str) -> String {
    if gateway.len() <= MAX_LABEL {
        return gateway.to_string();
    }
    // Gateway names are ASCII, so byte slicing is on character boundaries; fall back to the
    // hash alone if that ever stops being true.
    let prefix = gateway
        .get(..MAX_LABEL - HASH_LEN - 1)
        .unwrap_or("")
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        return short_hash(gateway);
    }
    format!("{prefix}-{}", short_hash(gateway))
}

/// `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
fn is_dns1035_label(s: &str) -> bool {
    s.len() <= MAX_LABEL
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// First 8 hex digits of the 64-bit FNV-1a hash: stable across releases and platforms
/// (unlike `std`'s hasher), which matters because names must not change on upgrade.
fn short_hash(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:08x}", h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_kept() {
        assert_eq!(object_name("web"), "web-tollgate");
        assert_eq!(tls_secret_name("web"), "web-tollgate-proxy-tls");
        assert_eq!(gateway_label_value("web"), "web");
    }

    #[test]
    fn longest_plain_name_fits_exactly() {
        let gw = "a".repeat(63 - NAME_SUFFIX.len());
        assert_eq!(object_name(&gw), format!("{gw}-tollgate"));
        assert_eq!(object_name(&gw).len(), 63);
    }

    #[test]
    fn long_names_are_truncated_and_hashed() {
        let gw = "a".repeat(100);
        let name = object_name(&gw);
        assert_eq!(name.len(), 63);
        assert!(is_dns1035_label(&name), "{name}");
        assert!(name.ends_with("-tollgate"));
        let other = object_name(&format!("{}b", "a".repeat(99)));
        assert_ne!(name, other, "same prefix, different Gateways");
    }

    #[test]
    fn dots_and_leading_digits_are_adjusted_without_collisions() {
        let dotted = object_name("a.b");
        assert!(is_dns1035_label(&dotted), "{dotted}");
        assert!(dotted.starts_with("a-b-"));
        assert_ne!(dotted, object_name("a-b"));
        let digit = object_name("1gw");
        assert!(is_dns1035_label(&digit), "{digit}");
        assert!(digit.starts_with("gw-1gw-"));
    }

    #[test]
    fn every_adjusted_name_is_a_dns1035_label() {
        for gw in [
            "x",
            "9",
            "a.b.c",
            "a-",
            &"z".repeat(253),
            &format!("{}.{}", "a".repeat(60), "b".repeat(60)),
            &"1.2-3".repeat(40),
        ] {
            let name = object_name(gw);
            assert!(is_dns1035_label(&name), "{gw} -> {name}");
        }
    }

    #[test]
    fn long_label_values_are_truncated_and_hashed() {
        let gw = format!("{}.{}", "a".repeat(60), "b".repeat(60));
        let v = gateway_label_value(&gw);
        assert_eq!(v.len(), 63);
        assert!(v.starts_with(&"a".repeat(54)));
        assert_ne!(
            v,
            gateway_label_value(&format!("{}.{}", "a".repeat(60), "c".repeat(60)))
        );
    }

    #[test]
    fn hash_is_stable() {
        // Pinned: a change would rename every provisioned object on upgrade.
        assert_eq!(short_hash("a.b"), "e61d9919");
    }
}
