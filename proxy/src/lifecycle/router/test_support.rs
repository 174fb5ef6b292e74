//! Small builders for route tables in tests.

use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate_api::{
    HeaderMatch, ListenerConfig, ObjectKey, PathMatch, PortConfig, Protocol, Route, RouteMatch,
    RouteTable, StringMatch, Timeouts, VirtualHost,
};

/// A route called `ns/name` matching `path`.
pub(crate) fn mk_route(name: &str, path: PathMatch) -> Route {
    Route {
        route: ObjectKey::new("ns", name),
        rule_index: 0,
        rule_name: None,
        matcher: RouteMatch {
            path,
            method: None,
            headers: vec![],
            query_params: vec![],
        },
        filters: vec![],
        backends: vec![],
        timeouts: Timeouts::default(),
        policy: None,
        request_trailers: false,
        max_request_body_bytes: None,
        compression_disabled: false,
        grpc_web: false,
        cache: None,
        retry: None,
        session: None,
    }
}

pub(crate) fn mk_prefix(name: &str, prefix: &str) -> Route {
    mk_route(name, PathMatch::PathPrefix(prefix.into()))
}

pub(crate) fn mk_exact(name: &str, path: &str) -> Route {
    mk_route(name, PathMatch::Exact(path.into()))
}

pub(crate) fn mk_regex(name: &str, re: &str) -> Route {
    mk_route(name, PathMatch::RegularExpression(re.into()))
}

/// Adds an exact header predicate.
pub(crate) fn with_header(mut r: Route, name: &str, value: &str) -> Route {
    r.matcher.headers.push(HeaderMatch {
        name: name.into(),
        value: StringMatch::Exact(value.into()),
    });
    r
}

/// Adds an exact query predicate.
pub(crate) fn with_query(mut r: Route, name: &str, value: &str) -> Route {
    r.matcher.query_params.push(HeaderMatch {
        name: name.into(),
        value: StringMatch::Exact(value.into()),
    });
    r
}

pub(crate) fn with_method(mut r: Route, method: &str) -> Route {
    r.matcher.method = Some(method.into());
    r
}

pub(crate) fn mk_vhost(hostname: &str, routes: Vec<Route>) -> VirtualHost {
    VirtualHost {
        hostname: hostname.into(),
        routes: routes.into(),
    }
}

pub(crate) fn mk_listener(
    name: &str,
    hostname: Option<&str>,
    virtual_hosts: Vec<VirtualHost>,
) -> ListenerConfig {
    ListenerConfig {
        passthrough: false,
        name: name.into(),
        hostname: hostname.map(Into::into),
        certificates: vec![],
        virtual_hosts,
    }
}

pub(crate) fn mk_port(port: u16, listeners: Vec<ListenerConfig>) -> PortConfig {
    PortConfig {
        address: "0.0.0.0".into(),
        port,
        protocol: Protocol::Http,
        listeners,
        client_validation: None,
        client: Default::default(),
    }
}

pub(crate) fn mk_table(ports: Vec<PortConfig>) -> RouteTable {
    RouteTable {
        version: 1,
        gateway: ObjectKey::new("ns", "gw"),
        ports,
        backends: Default::default(),
        policies: Default::default(),
        closed: Default::default(),
    }
}

/// One port 80, one listener without hostname, one `*` virtual host.
pub(crate) fn mk_simple(routes: Vec<Route>) -> RouteTable {
    mk_table(vec![mk_port(
        80,
        vec![mk_listener("http", None, vec![mk_vhost("*", routes)])],
    )])
}

pub(crate) fn mk_headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            h.append(k, v);
        }
    }
    h
}
