//! The client's side of the proxy. In: accepted sockets. Out: requests handed to
//! `lifecycle::service`, and their answers written back.
//!
//! `listener` accepts (plain, TLS-terminating, TLS-passthrough and TCP ports: `tls`, `sni`,
//! `stream`; UDP ports have their own datagram loop, `udp`) and serves HTTP/1 with our own server (`h1serve`, over the `tollgate-h1`
//! codec; request bodies in `h1_body`) and HTTP/2 with hyper's; `client_body` is the request
//! body either gives the lifecycle, `pace` bounds how slowly it may come, `inflight` caps
//! an HTTP/2 connection's requests in flight, `conn` is what a connection knows of itself,
//! `proxy_protocol` reads the PROXY header a load balancer may put before the client's bytes,
//! `per_client` counts a port's open connections per client address.

pub(crate) mod client_body;
pub(crate) mod conn;
pub(crate) mod h1_body;
pub(crate) mod h1serve;
pub(crate) mod inflight;
pub(crate) mod listener;
pub(crate) mod pace;
pub(crate) mod per_client;
pub mod proxy_protocol;
pub mod sni;
pub(crate) mod stream;
pub mod tls;
pub(crate) mod udp;
