//! The Kubernetes CEL IP and CIDR libraries (`k8s.io/apiserver/pkg/cel/library`, `ip` and
//! `cidr`), so that policies can allow or deny by network: `ip(s)`, `isIP(s)`,
//! `ip.isCanonical(s)`, `string(ip)` and, on an IP, `family()`, `isUnspecified()`,
//! `isLoopback()`, `isLinkLocalMulticast()`, `isLinkLocalUnicast()`, `isGlobalUnicast()`;
//! `cidr(s)`, `isCIDR(s)`, `string(cidr)` and, on a CIDR, `containsIP(ip or string)`,
//! `containsCIDR(cidr or string)`, `ip()`, `masked()`, `prefixLength()`; `==` on IPs and on
//! CIDRs.
//!
//! In: the environment to declare them on ([`register`], once, where `ENV` is built), then
//! their arguments (strings, or the IP and CIDR values these functions return). Out: CEL
//! values, or an error for text that is not an address or a network. The fast path
//! (`fast.rs`) uses [`parse_cidr`], [`parse_ip`], [`accept`] and [`Cidr::contains`] so that
//! its answers are these functions' answers.
//!
//! Semantics are Kubernetes': an address is what Go's `netip.ParseAddr` accepts (IPv4
//! octets without leading zeros), but for addresses with a zone (`fe80::1%eth0`) and
//! IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`), which are refused; a CIDR is an address
//! and a decimal prefix length (no sign, no leading zero), whose host bits may be set
//! (`cidr('10.0.0.1/8').masked()` is `10.0.0.0/8`). An address never belongs to a network
//! of the other family. `containsCIDR` is containment as Kubernetes documents it (and
//! implements it since kubernetes#130450): `10.0.0.0/8` contains `10.1.0.0/16`.

use std::any::Any;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cel::common::types::{CelBool, CelInt, CelString, Kind, Type};
use cel::common::value::{StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError, add_member_overload, add_overload};

/// The CEL type of IP values, named as Kubernetes names it.
static IP_TYPE: Type = Type::simple_type(Kind::Opaque, "net.IP");

/// The CEL type of CIDR values, named as Kubernetes names it.
static CIDR_TYPE: Type = Type::simple_type(Kind::Opaque, "net.CIDR");

/// Why text is not an IP address or a CIDR. The text is quoted whole, as Kubernetes does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum NetError {
    /// Not an IPv4 or IPv6 address.
    #[error("IP address {0:?} is not valid")]
    Ip(String),
    /// An IPv6 address with a zone.
    #[error("IP address {0:?} with a zone is not allowed")]
    Zone(String),
    /// An IPv4-mapped IPv6 address (or a CIDR of one).
    #[error("IPv4-mapped IPv6 address {0:?} is not allowed")]
    Mapped(String),
    /// Not a CIDR, and why.
    #[error("CIDR {0:?} is not valid: {1}")]
    Cidr(String, &'static str),
}

/// An IP address: the value `ip(s)` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ip(IpAddr);

/// A network in CIDR notation: the value `cidr(s)` returns. The address keeps its host bits
/// (`ip()` returns it as written, `string()` prints it as written); matching masks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    /// Whether `ip` is in the network: of the same family, and equal to the network's
    /// address on the first `bits` bits.
    pub(super) fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                (u32::from(net) ^ u32::from(ip)) & mask4(self.bits) == 0
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                (u128::from(net) ^ u128::from(ip)) & mask6(self.bits) == 0
            }
            _ => false,
        }
    }

    /// Whether every address of `other` is in this network.
    fn contains_cidr(&self, other: &Cidr) -> bool {
        self.bits <= other.bits && self.contains(other.addr)
    }

    /// The network with its host bits cleared.
    fn masked(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => Ipv4Addr::from(u32::from(a) & mask4(self.bits)).into(),
            IpAddr::V6(a) => Ipv6Addr::from(u128::from(a) & mask6(self.bits)).into(),
        };
        Cidr {
            addr,
            bits: self.bits,
        }
    }
}

/// The first `bits` bits of an IPv4 address.
fn mask4(bits: u8) -> u32 {
    u32::MAX
        .checked_shl(32_u32.saturating_sub(bits.into()))
        .unwrap_or(0)
}

/// The first `bits` bits of an IPv6 address.
fn mask6(bits: u8) -> u128 {
    u128::MAX
        .checked_shl(128_u32.saturating_sub(bits.into()))
        .unwrap_or(0)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// `ip` if Kubernetes accepts it as an address: not an IPv4-mapped IPv6 address.
/// (`source.address` of a client on a dual-stack socket can be one.)
pub(super) fn accept(ip: IpAddr) -> Option<IpAddr> {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => None,
        _ => Some(ip),
    }
}

/// Parses an address as `ip(s)` does.
pub(super) fn parse_ip(text: &str) -> Result<IpAddr, NetError> {
    match text.parse::<IpAddr>() {
        Ok(ip) => accept(ip).ok_or_else(|| NetError::Mapped(text.to_owned())),
        Err(_) => match text.split_once('%') {
            Some((addr, zone)) if !zone.is_empty() && addr.parse::<Ipv6Addr>().is_ok() => {
                Err(NetError::Zone(text.to_owned()))
            }
            _ => Err(NetError::Ip(text.to_owned())),
        },
    }
}

/// Parses a network as `cidr(s)` does.
pub(super) fn parse_cidr(text: &str) -> Result<Cidr, NetError> {
    let invalid = |why| NetError::Cidr(text.to_owned(), why);
    let (addr, bits) = text.rsplit_once('/').ok_or_else(|| invalid("no '/'"))?;
    let addr = parse_ip(addr).map_err(|e| match e {
        NetError::Mapped(_) => NetError::Mapped(text.to_owned()),
        NetError::Zone(_) => invalid("a zone is not allowed"),
        _ => invalid("the address is not valid"),
    })?;
    // Decimal digits only, as Go's `netip.ParsePrefix`: no sign, no leading zero.
    if bits.is_empty()
        || !bits.bytes().all(|b| b.is_ascii_digit())
        || (bits.len() > 1 && bits.starts_with('0'))
    {
        return Err(invalid("the prefix length is not a decimal number"));
    }
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let bits = bits
        .parse::<u8>()
        .ok()
        .filter(|b| *b <= max)
        .ok_or_else(|| invalid("the prefix length is out of range"))?;
    Ok(Cidr { addr, bits })
}

// The IP classes, as Go's `netip.Addr` defines them (Kubernetes calls those).

/// 127.0.0.0/8; ::1.
fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.octets()[0] == 127,
        IpAddr::V6(a) => u128::from(a) == 1,
    }
}

/// 224.0.0.0/4; ff00::/8.
fn is_multicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.octets()[0] & 0xf0 == 0xe0,
        IpAddr::V6(a) => a.segments()[0] >> 8 == 0xff,
    }
}

/// 224.0.0.0/24; ff02::/16 with any flags (`ffX2::/16`).
fn is_link_local_multicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => matches!(a.octets(), [224, 0, 0, _]),
        IpAddr::V6(a) => a.segments()[0] & 0xff0f == 0xff02,
    }
}

/// 169.254.0.0/16; fe80::/10.
fn is_link_local_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => matches!(a.octets(), [169, 254, _, _]),
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// Anything but the unspecified, IPv4 broadcast, loopback, multicast and link-local unicast
/// addresses (private and unique-local addresses included, as in Go).
fn is_global_unicast(ip: IpAddr) -> bool {
    !(ip.is_unspecified()
        || ip == IpAddr::from([255, 255, 255, 255])
        || is_loopback(ip)
        || is_multicast(ip)
        || is_link_local_unicast(ip))
}

impl Val for Ip {
    fn get_type(&self) -> &Type {
        &IP_TYPE
    }

    fn cel_type() -> &'static Type {
        &IP_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Ip>() == Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for Ip {}

impl Val for Cidr {
    fn get_type(&self) -> &Type {
        &CIDR_TYPE
    }

    fn cel_type() -> &'static Type {
        &CIDR_TYPE
    }

    /// Equal when written with the same address and prefix length:
    /// `cidr('10.0.0.1/8') != cidr('10.0.0.0/8')`, as in Kubernetes.
    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Cidr>() == Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for Cidr {}

/// Declares the functions on `env`.
pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    add_overload!(env, fn string_to_ip: (CelString<'_>) -> Result<Ip>,
        name = "ip", id = "string_to_ip")?;
    add_overload!(env, fn is_ip: (CelString<'_>) -> CelBool, name = "isIP", id = "is_ip")?;
    add_overload!(env, fn ip_is_canonical: (CelString<'_>) -> Result<CelBool>,
        name = "ip.isCanonical", id = "ip_is_canonical")?;
    add_overload!(env, fn ip_to_string: (Ip) -> CelString<'_>,
        name = "string", id = "ip_to_string")?;
    add_member_overload!(env, fn family: (Ip) -> CelInt, id = "ip_family")?;
    add_member_overload!(env, fn ip_is_unspecified: (Ip) -> CelBool,
        name = "isUnspecified", id = "ip_is_unspecified")?;
    add_member_overload!(env, fn ip_is_loopback: (Ip) -> CelBool,
        name = "isLoopback", id = "ip_is_loopback")?;
    add_member_overload!(env, fn ip_is_link_local_multicast: (Ip) -> CelBool,
        name = "isLinkLocalMulticast", id = "ip_is_link_local_multicast")?;
    add_member_overload!(env, fn ip_is_link_local_unicast: (Ip) -> CelBool,
        name = "isLinkLocalUnicast", id = "ip_is_link_local_unicast")?;
    add_member_overload!(env, fn ip_is_global_unicast: (Ip) -> CelBool,
        name = "isGlobalUnicast", id = "ip_is_global_unicast")?;

    add_overload!(env, fn string_to_cidr: (CelString<'_>) -> Result<Cidr>,
        name = "cidr", id = "string_to_cidr")?;
    add_overload!(env, fn is_cidr: (CelString<'_>) -> CelBool, name = "isCIDR", id = "is_cidr")?;
    add_overload!(env, fn cidr_to_string: (Cidr) -> CelString<'_>,
        name = "string", id = "cidr_to_string")?;
    add_member_overload!(env, fn contains_ip_string: (Cidr, CelString<'_>) -> Result<CelBool>,
        name = "containsIP", id = "cidr_contains_ip_string")?;
    add_member_overload!(env, fn contains_ip: (Cidr, Ip) -> CelBool,
        name = "containsIP", id = "cidr_contains_ip_ip")?;
    add_member_overload!(env, fn contains_cidr_string: (Cidr, CelString<'_>) -> Result<CelBool>,
        name = "containsCIDR", id = "cidr_contains_cidr_string")?;
    add_member_overload!(env, fn contains_cidr: (Cidr, Cidr) -> CelBool,
        name = "containsCIDR", id = "cidr_contains_cidr")?;
    add_member_overload!(env, fn cidr_ip: (Cidr) -> Ip, name = "ip", id = "cidr_ip")?;
    add_member_overload!(env, fn masked: (Cidr) -> Cidr, id = "cidr_masked")?;
    add_member_overload!(env, fn prefix_length: (Cidr) -> CelInt, id = "cidr_prefix_length")?;
    Ok(())
}

// The overloads, each the typed function the macros above wrap.

/// `e` as the error of CEL function `function`.
fn failed(function: &str, e: NetError) -> ExecutionError {
    ExecutionError::function_error(function, e)
}

fn string_to_ip(s: &CelString<'_>) -> Result<Ip, ExecutionError> {
    parse_ip(s.inner()).map(Ip).map_err(|e| failed("ip", e))
}

fn is_ip(s: &CelString<'_>) -> CelBool {
    CelBool::from(parse_ip(s.inner()).is_ok())
}

/// Whether `s` is written as `string(ip(s))` prints it; an error when it is no address.
fn ip_is_canonical(s: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    let ip = parse_ip(s.inner()).map_err(|e| failed("ip.isCanonical", e))?;
    Ok(CelBool::from(ip.to_string() == s.inner()))
}

/// IPv4 dotted decimal; IPv6 as RFC 5952 prints it (lower case, the longest run of two or
/// more zero groups as `::`), as Go does.
fn ip_to_string(ip: &Ip) -> CelString<'static> {
    CelString::from(ip.0.to_string())
}

fn family(ip: &Ip) -> CelInt {
    CelInt::from(if ip.0.is_ipv4() { 4 } else { 6 })
}

fn ip_is_unspecified(ip: &Ip) -> CelBool {
    CelBool::from(ip.0.is_unspecified())
}

fn ip_is_loopback(ip: &Ip) -> CelBool {
    CelBool::from(is_loopback(ip.0))
}

fn ip_is_link_local_multicast(ip: &Ip) -> CelBool {
    CelBool::from(is_link_local_multicast(ip.0))
}

fn ip_is_link_local_unicast(ip: &Ip) -> CelBool {
    CelBool::from(is_link_local_unicast(ip.0))
}

fn ip_is_global_unicast(ip: &Ip) -> CelBool {
    CelBool::from(is_global_unicast(ip.0))
}

fn string_to_cidr(s: &CelString<'_>) -> Result<Cidr, ExecutionError> {
    parse_cidr(s.inner()).map_err(|e| failed("cidr", e))
}

fn is_cidr(s: &CelString<'_>) -> CelBool {
    CelBool::from(parse_cidr(s.inner()).is_ok())
}

fn cidr_to_string(c: &Cidr) -> CelString<'static> {
    CelString::from(c.to_string())
}

/// An error, not false, when `s` is no address.
fn contains_ip_string(c: &Cidr, s: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    let ip = parse_ip(s.inner()).map_err(|e| failed("containsIP", e))?;
    Ok(CelBool::from(c.contains(ip)))
}

fn contains_ip(c: &Cidr, ip: &Ip) -> CelBool {
    CelBool::from(c.contains(ip.0))
}

/// An error, not false, when `s` is no CIDR.
fn contains_cidr_string(c: &Cidr, s: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    let other = parse_cidr(s.inner()).map_err(|e| failed("containsCIDR", e))?;
    Ok(CelBool::from(c.contains_cidr(&other)))
}

fn contains_cidr(c: &Cidr, other: &Cidr) -> CelBool {
    CelBool::from(c.contains_cidr(other))
}

fn cidr_ip(c: &Cidr) -> Ip {
    Ip(c.addr)
}

fn masked(c: &Cidr) -> Cidr {
    c.masked()
}

fn prefix_length(c: &Cidr) -> CelInt {
    CelInt::from(i64::from(c.bits))
}

#[cfg(test)]
mod tests {
    use cel::Value;
    use http::HeaderMap;

    use super::super::{Activation, Attrs, Expr};

    /// `src` evaluated by the interpreter for a GET from 10.1.2.3, or the error's text.
    fn eval(src: &str) -> Result<Value, String> {
        let headers = HeaderMap::new();
        let attrs = Attrs {
            method: "GET",
            host: "a.test",
            path: "/",
            scheme: "http",
            headers: &headers,
            source: "10.1.2.3:5555".parse().unwrap(),
        };
        let e = Expr::compile(src).map_err(|e| e.to_string())?;
        e.eval(&Activation::new(&attrs)).map_err(|e| e.to_string())
    }

    fn assert_all(cases: &[(&str, Value)]) {
        for (src, want) in cases {
            assert_eq!(eval(src).as_ref(), Ok(want), "{src}");
        }
    }

    /// Each line of `table`, `template | yes | no`: the template with `{}` replaced by each
    /// word of `yes` is true, by each word of `no` false.
    fn assert_bools(table: &str) {
        for line in table.lines().filter(|l| !l.trim().is_empty()) {
            let [template, yes, no] = line.split('|').collect::<Vec<_>>()[..] else {
                panic!("not `template | yes | no`: {line}");
            };
            for (words, want) in [(yes, true), (no, false)] {
                for word in words.split_whitespace() {
                    let src = template.trim().replace("{}", word);
                    assert_eq!(eval(&src), Ok(Value::Bool(want)), "{src}");
                }
            }
        }
    }

    /// Each `(expression, part of its error)`.
    fn assert_errors(cases: &[(&str, &str)]) {
        for (src, want) in cases {
            match eval(src) {
                Err(e) => assert!(e.contains(want), "{src}: {e}"),
                Ok(v) => panic!("{src}: {v:?}, not an error"),
            }
        }
    }

    #[test]
    fn the_error_of_an_invalid_address_quotes_it() {
        assert_eq!(
            eval("ip('not-an-ip')"),
            Err(
                "CEL expression `ip('not-an-ip')` failed: Error executing function 'ip': \
                 IP address \"not-an-ip\" is not valid"
                    .to_owned()
            )
        );
    }

    #[test]
    fn ip_parses_addresses_as_kubernetes_does() {
        assert_bools(
            "isIP('{}')           | 127.0.0.1 ::1 2001:DB8::ABCD ::1.2.3.4 0:0::1 \
                                  | 127.0.0.256 :::1 01.2.3.4 ::ffff:1.2.3.4 ::ffff:0102:0304 \
                                    fe80::1%eth0 1.2.3.4/32 [::1] 1.2.3 0x1.2.3.4
             ip.isCanonical('{}') | 127.0.0.1 2001:db8::abcd ::1 1:0:0:2::3 \
                                  | 2001:DB8::ABCD 2001:db8::0:0:0:abcd 0:0::1 1::2:0:0:0:3",
        );
        assert_all(&[
            ("isIP('')", false.into()),
            ("isIP(' 1.2.3.4')", false.into()),
            ("string(ip('127.0.0.1'))", "127.0.0.1".into()),
            (
                "string(ip('2001:DB8::0:0:0:ABCD'))",
                "2001:db8::abcd".into(),
            ),
            ("string(ip('1:0:0:2:0:0:0:3'))", "1:0:0:2::3".into()),
            ("string(ip('::1.2.3.4'))", "::102:304".into()),
            ("ip('::1') == ip('0:0::1')", true.into()),
            ("ip('10.0.0.1') == ip('10.0.0.2')", false.into()),
            ("ip('10.0.0.1') != ip('10.0.0.2')", true.into()),
            ("ip('1.2.3.4') == ip('::102:304')", false.into()),
            ("ip('1.2.3.4') == '1.2.3.4'", false.into()),
            ("ip(source.address).family() == 4", true.into()),
            ("ip('127.0.0.1').family()", Value::Int(4)),
            ("ip('::1').family()", Value::Int(6)),
        ]);
        assert_errors(&[
            (
                "ip('127.0.0.256')",
                "IP address \"127.0.0.256\" is not valid",
            ),
            ("ip('01.2.3.4')", "IP address \"01.2.3.4\" is not valid"),
            (
                "ip('fe80::1%eth0')",
                "IP address \"fe80::1%eth0\" with a zone is not allowed",
            ),
            (
                "ip('::ffff:1.2.3.4')",
                "IPv4-mapped IPv6 address \"::ffff:1.2.3.4\" is not allowed",
            ),
            ("ip(1)", "ip"),
            ("ip.isCanonical('x')", "IP address \"x\" is not valid"),
        ]);
    }

    #[test]
    fn ip_classes_are_gos() {
        assert_bools(
            "ip('{}').isUnspecified()        | 0.0.0.0 ::                | 127.0.0.1 ::1 0.0.0.1
             ip('{}').isLoopback()           | 127.0.0.1 127.255.0.1 ::1 | 192.168.0.1 ::2 ::
             ip('{}').isLinkLocalMulticast() | 224.0.0.1 224.0.0.255 ff02::1 ff12::1 \
                                             | 224.0.1.1 ff05::1 fd00::1 fe80::1
             ip('{}').isLinkLocalUnicast()   | 169.254.169.254 169.254.0.0 fe80::1 febf::1 \
                                             | 192.168.0.1 169.255.0.1 fec0::1 fd80::1
             ip('{}').isGlobalUnicast()      | 192.168.0.1 10.0.0.1 1.1.1.1 2001:db8::abcd fd00::1 \
                                             | 255.255.255.255 0.0.0.0 127.0.0.1 224.0.0.1 \
                                               239.1.1.1 169.254.0.1 ff00::1 :: ::1 fe80::1",
        );
    }

    #[test]
    fn cidr_parses_networks_as_kubernetes_does() {
        assert_bools(
            "isCIDR('{}') | 192.168.0.0/16 ::1/128 192.168.0.1/16 0.0.0.0/0 ::/0 2001:DB8::/32 \
                          | 192.168.0.0/33 ::1/129 10.0.0.0 10.0.0.0/ 10.0.0.0/08 10.0.0.0/+8 \
                            10.0.0.0/-1 010.0.0.0/8 10.0.0.0/8/8 ::ffff:1.2.3.0/120 \
                            fe80::%eth0/64 /8",
        );
        assert_all(&[
            ("string(cidr('192.168.0.1/24'))", "192.168.0.1/24".into()),
            ("string(cidr('2001:DB8::/32'))", "2001:db8::/32".into()),
            ("cidr('192.168.0.0/16').prefixLength()", Value::Int(16)),
            ("cidr('::1/128').prefixLength()", Value::Int(128)),
            (
                "cidr('192.168.0.1/24').ip() == ip('192.168.0.1')",
                true.into(),
            ),
            ("cidr('::1/128').ip().family()", Value::Int(6)),
            (
                "cidr('10.0.0.1/8').masked() == cidr('10.0.0.0/8')",
                true.into(),
            ),
            (
                "string(cidr('2001:db8:1::/32').masked())",
                "2001:db8::/32".into(),
            ),
            ("string(cidr('10.1.2.3/0').masked())", "0.0.0.0/0".into()),
            (
                "cidr('10.0.0.0/8') == cidr('10.0.0.0/8').masked()",
                true.into(),
            ),
            (
                "cidr('10.0.0.1/8') == cidr('10.0.0.1/8').masked()",
                false.into(),
            ),
            ("cidr('10.0.0.0/8') == cidr('10.0.0.0/9')", false.into()),
        ]);
        assert_errors(&[
            (
                "cidr('192.168.0.0/')",
                "\"192.168.0.0/\" is not valid: the prefix length is not",
            ),
            (
                "cidr('10.0.0.0/33')",
                "\"10.0.0.0/33\" is not valid: the prefix length is out",
            ),
            ("cidr('10.0.0.0')", "CIDR \"10.0.0.0\" is not valid: no '/'"),
            (
                "cidr('10.0.0.256/8')",
                "CIDR \"10.0.0.256/8\" is not valid: the address",
            ),
            (
                "cidr('::ffff:1.2.3.0/120')",
                "IPv4-mapped IPv6 address \"::ffff:1.2.3.0/120\"",
            ),
            ("cidr(192168)", "cidr"),
        ]);
    }

    #[test]
    fn a_network_contains_addresses_and_networks_of_its_family() {
        assert_bools(
            "cidr('192.168.0.0/24').containsIP({}) | '192.168.0.1' ip('192.168.0.255') \
                                                   | '192.168.1.1' ip('192.168.1.1')
             cidr('10.0.0.0/8').containsIP('{}')   | 10.0.0.0 10.255.255.255 \
                                                   | 11.0.0.0 9.255.255.255 ::a00:1
             cidr('10.0.0.1/8').containsIP('{}')   | 10.9.9.9             | 11.0.0.1
             cidr('10.1.2.3/32').containsIP('{}')  | 10.1.2.3             | 10.1.2.4 10.1.2.2
             cidr('0.0.0.0/0').containsIP('{}')    | 0.0.0.0 255.255.255.255 | ::1 ::
             cidr('::/0').containsIP('{}')         | :: ffff:: ::1        | 0.0.0.0 1.2.3.4
             cidr('2001:db8::/32').containsIP('{}') | 2001:db8::1 2001:db8:ffff:: \
                                                    | 2001:dc8::1 2001:db7::1
             cidr('{}').containsIP(source.address) | 10.0.0.0/8 10.1.2.3/32 0.0.0.0/0 \
                                                   | 10.1.2.4/32 ::/0
             cidr('192.168.0.0/24').containsCIDR({}) \
                 | cidr('192.168.0.0/25') '192.168.0.128/25' '192.168.0.0/24' \
                 | cidr('192.168.0.0/23') '192.168.1.0/25' '::/0'
             cidr('10.0.0.0/8').containsCIDR('{}') | 10.1.0.0/16 10.0.0.0/8 10.1.2.3/32 \
                                                   | 11.0.0.0/16 0.0.0.0/0
             cidr('2001:db8::/32').containsCIDR('{}') | 2001:db8:1::/48 \
                                                      | 2001:db8::/31 10.0.0.0/8
             cidr('::/0').containsCIDR('{}')       | ::/0 ::1/128         | 10.0.0.0/8 0.0.0.0/0",
        );
        assert_errors(&[
            (
                "cidr('10.0.0.0/8').containsIP('not-an-ip')",
                "IP address \"not-an-ip\"",
            ),
            (
                "cidr('10.0.0.0/8').containsIP('::ffff:10.0.0.1')",
                "IPv4-mapped",
            ),
            ("cidr('10.0.0.0/8').containsIP(1)", "containsIP"),
            (
                "cidr('10.0.0.0/8').containsCIDR('10.0.0.0/33')",
                "out of range",
            ),
        ]);
    }

    #[test]
    fn the_library_declares_on_a_standard_environment() {
        let mut env = cel::Env::stdlib();
        assert_eq!(env.add_extension(super::register), Ok(()));
    }
}
