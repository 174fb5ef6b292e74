//! One meaning of a request (ARCHITECTURE principle 9). In: the authority (Host, `:authority`
//! or an absolute-form target) and the path of a request as the client sent them. Out: one
//! normalized value of each, used by the router, policies (CEL `request.host`,
//! `request.url_path`), filters, redirects, the access log and the upstream request; or the
//! reason the request is refused with 400, never a guess.
//!
//! - [`authority`]: lower case, one trailing dot removed, port validated as digits, IPv6
//!   brackets kept; userinfo, a non-numeric port or characters no host may carry are refused.
//! - [`path`]: RFC 3986 §6.2.2 syntax-based normalization (unreserved characters decoded,
//!   remaining escapes upper-cased, dot-segments removed) plus merged slashes; `%2F` and `%5C`
//!   stay encoded (opaque), a raw `\` is encoded as `%5C`, a fragment, an invalid escape or a
//!   path climbing above `/` is refused.
//!
//! Both borrow the input when it is already normal (the usual request allocates nothing).

pub mod authority;
pub mod path;

pub use authority::{Authority, BadAuthority, parse_authority};
pub use path::{BadPath, EscapedSlashes, PathOptions, normalize_path};
