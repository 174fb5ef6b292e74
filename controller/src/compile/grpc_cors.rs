//! CORS for a GRPCRoute, so browsers may call it with gRPC-Web. In: the GRPCRoute's
//! `tollgate.dev/cors` annotation and its compiled rules. Out: a CORS filter first in every
//! rule (the proxy answers preflights from it and decorates answers), or the problem that
//! rejects the route.
//!
//! GRPCRoute has no CORS filter in Gateway API (v1.6 gives one to HTTPRoute only), and the
//! API server refuses filter types the GRPCRoute CRD does not list; an annotation is how
//! GRPCRoutes already carry Tollgate's own settings (`tollgate.dev/request-trailers`). Its
//! value is JSON with the fields of HTTPRoute's CORS filter (`allowOrigins`,
//! `allowMethods`, `allowHeaders`, `exposeHeaders`, `allowCredentials`, `maxAge`), so
//! moving to a real filter, should the spec add one, changes nothing else. What gRPC-Web
//! needs is filled in: `allowMethods` defaults to `POST`; `allowHeaders` to the headers
//! gRPC-Web clients send (`content-type`, `x-grpc-web`, `x-user-agent`, `grpc-timeout`);
//! `grpc-status` and `grpc-message` are always exposed, so a script can read the status of
//! a Trailers-Only answer. A field name it does not know, or a value of the wrong type,
//! rejects the route (`UnsupportedValue`), as a typo must not silently open or close CORS.

use gateway_types::experimental::httproutes::HttpRouteRulesFiltersCors;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tollgate_api::{Cors, Filter};

use super::filters::cors;
use super::rules::{CompiledRoute, unsupported};

/// GRPCRoute annotation: the route's CORS settings, as JSON ([module docs](self)).
pub const CORS_ANNOTATION: &str = "tollgate.dev/cors";

/// The fields the annotation may have.
const FIELDS: [&str; 6] = [
    "allowOrigins",
    "allowMethods",
    "allowHeaders",
    "exposeHeaders",
    "allowCredentials",
    "maxAge",
];

/// Request headers gRPC-Web clients send, allowed when the annotation lists none.
const GRPC_WEB_HEADERS: [&str; 4] = ["content-type", "x-grpc-web", "x-user-agent", "grpc-timeout"];

/// Response headers a gRPC-Web client reads, always exposed.
const GRPC_STATUS_HEADERS: [&str; 2] = ["grpc-status", "grpc-message"];

/// Reads [`CORS_ANNOTATION`] into a CORS filter first in each of `compiled`'s rules; a value
/// it cannot have rejects the route, unless a problem in its spec rejected it already.
pub fn read_cors(meta: &ObjectMeta, compiled: &mut CompiledRoute) {
    let Some(value) = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORS_ANNOTATION))
    else {
        return;
    };
    let Ok(rules) = compiled.rules.as_mut() else {
        return;
    };
    match parse(value) {
        Ok(c) => {
            for rule in rules {
                rule.filters.insert(0, Filter::Cors(c.clone()));
            }
        }
        Err(why) => {
            compiled.rules = Err(unsupported(
                &format!("metadata.annotations[{CORS_ANNOTATION}]"),
                why,
            ));
        }
    }
}

/// The annotation's value as the filter the proxy runs.
fn parse(value: &str) -> Result<Cors, String> {
    let json: serde_json::Value =
        serde_json::from_str(value).map_err(|e| format!("not JSON: {e}"))?;
    let serde_json::Value::Object(map) = &json else {
        return Err("not a JSON object".to_owned());
    };
    if let Some(k) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        // A condition message is bounded: a long key is cut.
        let shown: String = k.chars().take(64).collect();
        return Err(format!(
            "unknown field {shown:?} (known: {})",
            FIELDS.join(", ")
        ));
    }
    let spec: HttpRouteRulesFiltersCors =
        serde_json::from_value(json).map_err(|e| format!("invalid: {e}"))?;
    let mut c = cors(&spec, "").map_err(|_| "maxAge must not be negative".to_owned())?;
    if c.allow_origins
        .iter()
        .any(|o| o.chars().any(char::is_whitespace))
    {
        return Err("allowOrigins: an origin has no whitespace".to_owned());
    }
    if c.allow_methods.is_empty() {
        c.allow_methods.push("POST".to_owned());
    }
    if c.allow_headers.is_empty() {
        c.allow_headers = GRPC_WEB_HEADERS.map(str::to_owned).to_vec();
    }
    if !c.expose_headers.iter().any(|h| h == "*") {
        for h in GRPC_STATUS_HEADERS {
            if !c.expose_headers.iter().any(|e| e.eq_ignore_ascii_case(h)) {
                c.expose_headers.push(h.to_owned());
            }
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_what_grpc_web_needs() {
        let c = parse(r#"{"allowOrigins": ["https://app.example"]}"#).unwrap();
        assert_eq!(c.allow_origins, ["https://app.example"]);
        assert_eq!(c.allow_methods, ["POST"]);
        assert_eq!(c.allow_headers, GRPC_WEB_HEADERS);
        assert_eq!(c.expose_headers, GRPC_STATUS_HEADERS);
        assert_eq!(c.max_age, 5, "HTTPRoute's default");
        assert!(!c.allow_credentials);
    }

    #[test]
    fn given_lists_are_kept_and_the_status_headers_added_once() {
        let c = parse(
            r#"{"allowOrigins": ["*"], "allowMethods": ["POST", "GET"],
                "allowHeaders": ["authorization"], "exposeHeaders": ["Grpc-Status", "x-id"],
                "allowCredentials": true, "maxAge": 600}"#,
        )
        .unwrap();
        assert_eq!(c.allow_methods, ["POST", "GET"]);
        assert_eq!(c.allow_headers, ["authorization"]);
        assert_eq!(c.expose_headers, ["Grpc-Status", "x-id", "grpc-message"]);
        assert!(c.allow_credentials);
        assert_eq!(c.max_age, 600);
        let star = parse(r#"{"exposeHeaders": ["*"]}"#).unwrap();
        assert_eq!(star.expose_headers, ["*"]);
    }

    #[test]
    fn what_it_cannot_be_is_refused() {
        for bad in [
            "",
            "allowOrigins: [x]",
            "[]",
            r#"{"allowOrigin": ["https://a.example"]}"#,
            r#"{"allowOrigins": "https://a.example"}"#,
            r#"{"maxAge": -1}"#,
            r#"{"allowOrigins": ["https://a.example b"]}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
