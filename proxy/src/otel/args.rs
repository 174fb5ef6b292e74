//! Command-line settings of tracing, shared by `tollgate-proxy`, `tollgate run` and
//! `tollgate controller` (its own reconcile spans; it also passes a Gateway's `telemetry` on
//! to that Gateway's proxies as these flags).
//!
//! In: `--otlp-endpoint`, `--otlp-protocol`, `--trace-sampling`. Out: the
//! [`TraceSettings`] for [`crate::ProxyOptions::tracing`] (`None`: tracing off), or an
//! error at startup for an endpoint that is not an `http(s)` URL or a ratio outside [0, 1].

use std::time::Duration;

/// How spans are sent to the collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// OTLP/gRPC.
    #[default]
    Grpc,
    /// OTLP/HTTP with protobuf bodies, posted to `<endpoint>/v1/traces`.
    Http,
}

impl Protocol {
    /// The flag's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::Http => "http",
        }
    }
}

/// The tracing flags.
#[derive(Debug, Clone, PartialEq, clap::Args, Default)]
pub struct TraceArgs {
    /// Export spans over OTLP to this collector URL (tracing is off without it), e.g.
    /// http://127.0.0.1:4317 for gRPC or http://127.0.0.1:4318 for HTTP.
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: grpc, or http (protobuf bodies posted to URL/v1/traces).
    #[arg(long, value_enum, default_value_t = Protocol::Grpc)]
    pub otlp_protocol: Protocol,
    /// Fraction of new traces kept (0 to 1); a request with a parent follows its sampled flag.
    #[arg(long, default_value_t = 1.0)]
    pub trace_sampling: f64,
}

/// What the tracer needs.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The collector's URL (for HTTP, the base: `/v1/traces` is appended).
    pub endpoint: String,
    pub protocol: Protocol,
    /// Ratio of new traces sampled.
    pub sampling_ratio: f64,
    /// Spans waiting for export at most; more are dropped (and counted).
    pub queue_size: usize,
    /// Spans per export at most.
    pub batch_size: usize,
    /// How long a batch waits to fill.
    pub batch_delay: Duration,
}

/// Flags that cannot be honoured.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TraceArgsError {
    #[error(
        "--otlp-endpoint {0:?}: not an http:// URL with a host (TLS to the collector is not built in)"
    )]
    Endpoint(String),
    #[error("--trace-sampling {0}: not a ratio between 0 and 1")]
    Ratio(f64),
}

impl TraceSettings {
    /// Settings for `endpoint`, checked, with the default queue and batch sizes.
    pub fn new(
        endpoint: &str,
        protocol: Protocol,
        sampling_ratio: f64,
    ) -> Result<Self, TraceArgsError> {
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|_| TraceArgsError::Endpoint(endpoint.to_owned()))?;
        // The exporter is built without TLS: an https:// endpoint would drop every span.
        let scheme_ok = uri.scheme_str() == Some("http");
        if !scheme_ok || uri.host().is_none_or(str::is_empty) {
            return Err(TraceArgsError::Endpoint(endpoint.to_owned()));
        }
        if !(0.0..=1.0).contains(&sampling_ratio) {
            return Err(TraceArgsError::Ratio(sampling_ratio));
        }
        Ok(Self {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            protocol,
            sampling_ratio,
            queue_size: 8192,
            batch_size: 512,
            batch_delay: super::DEFAULT_BATCH_DELAY,
        })
    }
}

impl TraceArgs {
    /// The settings, `None` without an endpoint.
    pub fn settings(&self) -> Result<Option<TraceSettings>, TraceArgsError> {
        self.otlp_endpoint
            .as_deref()
            .map(|e| TraceSettings::new(e, self.otlp_protocol, self.trace_sampling))
            .transpose()
    }

    /// The flags that give another process these settings.
    pub fn to_flags(&self) -> Vec<String> {
        let Some(e) = &self.otlp_endpoint else {
            return Vec::new();
        };
        vec![
            format!("--otlp-endpoint={e}"),
            format!("--otlp-protocol={}", self.otlp_protocol.as_str()),
            format!("--trace-sampling={}", self.trace_sampling),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_endpoint_and_ratio() {
        let ok = TraceSettings::new("http://127.0.0.1:4318/", Protocol::Http, 0.5).unwrap();
        assert_eq!(ok.endpoint, "http://127.0.0.1:4318");
        for bad in ["127.0.0.1:4317", "ftp://x", "http://", "", "https://c:4317"] {
            assert_eq!(
                TraceSettings::new(bad, Protocol::Grpc, 1.0),
                Err(TraceArgsError::Endpoint(bad.to_owned()))
            );
        }
        assert_eq!(
            TraceSettings::new("http://c:4317", Protocol::Grpc, 1.5),
            Err(TraceArgsError::Ratio(1.5))
        );
        assert!(TraceSettings::new("http://c:4317", Protocol::Grpc, f64::NAN).is_err());
    }
}
