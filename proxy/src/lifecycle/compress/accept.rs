//! `Accept-Encoding` (RFC 9110 §12.5.3). In: the request's field lines and the codings a
//! port offers, the preferred first. Out: the coding its response goes out in, or none.
//!
//! One pass over the bytes, nothing allocated: a hostile field (huge, repeated, malformed)
//! costs its length and never an error. An entry whose q-value is malformed is skipped (as
//! if absent); a coding listed twice counts at its first place; `x-gzip` is `gzip`; `*`
//! stands for every coding not listed; `q=0` refuses. The highest q wins, a tie goes to the
//! port's order; `identity` listed with a higher q than that keeps the body as it is.

use http::HeaderValue;
use tollgate_api::client::Encoding;

/// q-values in thousandths (`q=0.5` is 500; an entry without one is 1000).
type Q = u16;

/// The coding to apply for a request with these `Accept-Encoding` lines, among `offered`
/// (in preference order); `None` sends the body as it is.
pub(crate) fn choose<'a>(
    fields: impl Iterator<Item = &'a HeaderValue>,
    offered: &[Encoding],
) -> Option<Encoding> {
    // Indexed as `Encoding::ALL`.
    let mut listed: [Option<Q>; 3] = [None; 3];
    let mut star: Option<Q> = None;
    let mut identity: Option<Q> = None;
    for field in fields {
        for entry in field.as_bytes().split(|&b| b == b',') {
            let mut parts = entry.split(|&b| b == b';');
            let name = parts.next().unwrap_or_default().trim_ascii();
            if name.is_empty() {
                continue;
            }
            let mut q = Some(1000);
            for param in parts {
                let param = param.trim_ascii();
                if param.len() >= 2 && param[..2].eq_ignore_ascii_case(b"q=") {
                    q = qvalue(param[2..].trim_ascii());
                }
            }
            let Some(q) = q else { continue };
            let slot = if name.eq_ignore_ascii_case(b"gzip") || name.eq_ignore_ascii_case(b"x-gzip")
            {
                &mut listed[2]
            } else if name.eq_ignore_ascii_case(b"br") {
                &mut listed[1]
            } else if name.eq_ignore_ascii_case(b"zstd") {
                &mut listed[0]
            } else if name == b"*" {
                &mut star
            } else if name.eq_ignore_ascii_case(b"identity") {
                &mut identity
            } else {
                continue;
            };
            slot.get_or_insert(q);
        }
    }
    let mut best: Option<(Encoding, Q)> = None;
    for &e in offered {
        let q = listed[index(e)].or(star).unwrap_or(0);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((e, q));
        }
    }
    let (e, q) = best?;
    // A client that ranks the unencoded body above every coding offered gets it.
    if identity.is_some_and(|i| i > q) {
        return None;
    }
    Some(e)
}

fn index(e: Encoding) -> usize {
    match e {
        Encoding::Zstd => 0,
        Encoding::Br => 1,
        Encoding::Gzip => 2,
    }
}

/// `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )`, in thousandths.
fn qvalue(v: &[u8]) -> Option<Q> {
    let (int, frac) = match v.split_first()? {
        (b'0', rest) => (0, rest),
        (b'1', rest) => (1000, rest),
        _ => return None,
    };
    let digits = match frac {
        [] => return Some(int),
        [b'.', digits @ ..] if digits.len() <= 3 => digits,
        _ => return None,
    };
    let mut thousandths: Q = 0;
    let mut scale = 100;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        thousandths += Q::from(d - b'0') * scale;
        scale /= 10;
    }
    if int == 1000 && thousandths != 0 {
        return None;
    }
    Some(int + thousandths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Encoding::{Br, Gzip, Zstd};

    const ALL: &[Encoding] = &[Zstd, Br, Gzip];

    fn pick(ae: &str, offered: &[Encoding]) -> Option<Encoding> {
        let v = HeaderValue::from_str(ae).unwrap();
        choose(std::iter::once(&v), offered)
    }

    #[test]
    fn the_highest_q_wins_and_ties_go_to_the_ports_order() {
        assert_eq!(pick("gzip, deflate, br, zstd", ALL), Some(Zstd));
        assert_eq!(pick("gzip, deflate, br, zstd", &[Gzip, Br]), Some(Gzip));
        assert_eq!(pick("gzip;q=1.0, br;q=0.9", ALL), Some(Gzip));
        assert_eq!(pick("gzip;q=0.2, br;Q=0.3", ALL), Some(Br));
        assert_eq!(pick("deflate", ALL), None);
        assert_eq!(pick("", ALL), None);
    }

    #[test]
    fn q_zero_refuses_and_star_stands_for_the_rest() {
        assert_eq!(pick("zstd;q=0, br;q=0, gzip", ALL), Some(Gzip));
        assert_eq!(pick("*", ALL), Some(Zstd));
        assert_eq!(pick("*;q=0.5, zstd;q=0, br;q=0.6", ALL), Some(Br));
        assert_eq!(pick("*;q=0", ALL), None);
        assert_eq!(pick("x-gzip", ALL), Some(Gzip));
    }

    #[test]
    fn identity_ranked_above_every_coding_keeps_the_body() {
        assert_eq!(pick("gzip;q=0.5, identity", ALL), None);
        assert_eq!(pick("gzip, identity;q=0.5", ALL), Some(Gzip));
        assert_eq!(pick("identity;q=0, gzip", ALL), Some(Gzip));
    }

    #[test]
    fn malformed_entries_are_skipped_and_the_first_of_repeats_counts() {
        assert_eq!(pick("gzip;q=2, br", ALL), Some(Br));
        assert_eq!(pick("gzip;q=1.5, br;q=0.1", ALL), Some(Br));
        assert_eq!(pick("gzip;q=0.0001, br;q=abc", ALL), None);
        assert_eq!(pick("gzip;q=, br;q=.5", ALL), None);
        assert_eq!(pick("gzip;q=0, gzip;q=1", &[Gzip]), None);
        assert_eq!(pick(",,;;,gzip;;q=0.5;foo=bar,,", &[Gzip]), Some(Gzip));
        let lines = [
            HeaderValue::from_static("br;q=0"),
            HeaderValue::from_static("gzip"),
        ];
        assert_eq!(choose(lines.iter(), ALL), Some(Gzip), "lines join");
    }

    #[test]
    fn q_values_parse_as_the_grammar_says() {
        assert_eq!(qvalue(b"0"), Some(0));
        assert_eq!(qvalue(b"1"), Some(1000));
        assert_eq!(qvalue(b"1.000"), Some(1000));
        assert_eq!(qvalue(b"0.5"), Some(500));
        assert_eq!(qvalue(b"0.05"), Some(50));
        assert_eq!(qvalue(b"0.001"), Some(1));
        assert_eq!(qvalue(b"0."), Some(0));
        for bad in [
            &b"1.001"[..],
            b"0.0001",
            b"-1",
            b"2",
            b"",
            b"0,5",
            b"1e0",
            b"00",
        ] {
            assert_eq!(qvalue(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_huge_field_costs_a_parse_only() {
        let huge = "gzip;q=0.5;a=b, ".repeat(4000) + "br";
        assert_eq!(pick(&huge, ALL), Some(Br));
    }
}
