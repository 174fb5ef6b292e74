//! Command-line settings of the slow-client limits, shared by `tollgate-proxy` and
//! `tollgate run` until a ClientPolicy sets them per Gateway.
//!
//! In: `--request-body-idle-timeout-secs`, `--request-body-timeout-secs`,
//! `--request-body-min-rate`, `--request-body-rate-window-secs`,
//! `--http2-stream-idle-timeout-secs`, `--http2-idle-timeout-secs`,
//! `--http2-max-concurrent-streams`, `--max-upstream-requests-per-connection`,
//! `--stream-idle-timeout-secs`, `--udp-flow-idle-timeout-secs`, `--udp-max-flows`. Out: those
//! fields of a [`ProxyOptions`] ([`ClientLimitArgs::apply`]); their defaults are
//! [`ProxyOptions::default`]'s, documented there.

use std::time::Duration;

use crate::ProxyOptions;

/// The slow-client limit flags (see [`ProxyOptions`] for what each bounds).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ClientLimitArgs {
    /// An HTTP/1.x request body the client sends nothing of for this long is cut (408).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_body_idle_timeout_secs: u64,
    /// A request body not whole this long after it starts is cut (408; HTTP/2: until the
    /// answer starts).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_body_timeout_secs: u64,
    /// Least pace of an HTTP/1.x request body, bytes per second (0: none).
    #[arg(long, default_value_t = 256)]
    pub request_body_min_rate: u64,
    /// How far (in seconds of the minimum pace) a body may fall behind it.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_body_rate_window_secs: u64,
    /// An HTTP/2 request body the client sends nothing of for this long is cut.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub http2_stream_idle_timeout_secs: u64,
    /// A connection with no request in flight for this long is closed (GOAWAY on HTTP/2).
    #[arg(long, default_value_t = 75, value_parser = clap::value_parser!(u64).range(1..))]
    pub http2_idle_timeout_secs: u64,
    /// Most open streams per HTTP/2 connection; more are refused.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub http2_max_concurrent_streams: u32,
    /// Most requests of one HTTP/2 connection forwarded at once; more wait.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_upstream_requests_per_connection: u64,
    /// A TLS or TCP stream with no byte either way for this long is closed.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub stream_idle_timeout_secs: u64,
    /// A UDP flow (client address) with no datagram either way for this long is forgotten.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub udp_flow_idle_timeout_secs: u64,
    /// Most UDP flows per port; a datagram that would open another is dropped.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub udp_max_flows: u64,
}

impl ClientLimitArgs {
    /// Sets the limits these flags name on `opts`.
    pub fn apply(&self, opts: &mut ProxyOptions) {
        opts.request_body_idle_timeout = Duration::from_secs(self.request_body_idle_timeout_secs);
        opts.request_body_timeout = Duration::from_secs(self.request_body_timeout_secs);
        opts.request_body_min_rate = self.request_body_min_rate;
        opts.request_body_rate_window = Duration::from_secs(self.request_body_rate_window_secs);
        opts.http2_stream_idle_timeout = Duration::from_secs(self.http2_stream_idle_timeout_secs);
        opts.http2_idle_timeout = Duration::from_secs(self.http2_idle_timeout_secs);
        opts.http2_max_concurrent_streams = self.http2_max_concurrent_streams;
        opts.max_upstream_requests_per_connection =
            usize::try_from(self.max_upstream_requests_per_connection).unwrap_or(usize::MAX);
        opts.stream_idle_timeout = Duration::from_secs(self.stream_idle_timeout_secs);
        opts.udp_flow_idle_timeout = Duration::from_secs(self.udp_flow_idle_timeout_secs);
        opts.udp_max_flows = usize::try_from(self.udp_max_flows).unwrap_or(usize::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        limits: ClientLimitArgs,
    }

    fn options(args: &[&str]) -> ProxyOptions {
        let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).unwrap();
        let mut opts = ProxyOptions::default();
        cli.limits.apply(&mut opts);
        opts
    }

    fn limits(
        o: &ProxyOptions,
    ) -> (
        Duration,
        Duration,
        u64,
        Duration,
        Duration,
        Duration,
        u32,
        usize,
    ) {
        (
            o.request_body_idle_timeout,
            o.request_body_timeout,
            o.request_body_min_rate,
            o.request_body_rate_window,
            o.http2_stream_idle_timeout,
            o.http2_idle_timeout,
            o.http2_max_concurrent_streams,
            o.max_upstream_requests_per_connection,
        )
    }

    #[test]
    fn no_flag_keeps_the_documented_defaults() {
        assert_eq!(limits(&options(&[])), limits(&ProxyOptions::default()));
    }

    #[test]
    fn each_flag_sets_its_limit() {
        let o = options(&[
            "--request-body-idle-timeout-secs=1",
            "--request-body-timeout-secs=2",
            "--request-body-min-rate=0",
            "--request-body-rate-window-secs=4",
            "--http2-stream-idle-timeout-secs=5",
            "--http2-idle-timeout-secs=6",
            "--http2-max-concurrent-streams=7",
            "--max-upstream-requests-per-connection=8",
        ]);
        let s = Duration::from_secs;
        assert_eq!(limits(&o), (s(1), s(2), 0, s(4), s(5), s(6), 7, 8));
        let o = options(&[
            "--stream-idle-timeout-secs=9",
            "--udp-flow-idle-timeout-secs=10",
            "--udp-max-flows=11",
        ]);
        assert_eq!(
            (
                o.stream_idle_timeout,
                o.udp_flow_idle_timeout,
                o.udp_max_flows
            ),
            (s(9), s(10), 11)
        );
        let d = ProxyOptions::default();
        assert_eq!(
            (
                d.stream_idle_timeout,
                d.udp_flow_idle_timeout,
                d.udp_max_flows
            ),
            {
                let o = options(&[]);
                (
                    o.stream_idle_timeout,
                    o.udp_flow_idle_timeout,
                    o.udp_max_flows,
                )
            }
        );
    }

    #[test]
    fn a_zero_timeout_or_cap_is_refused() {
        for flag in [
            "--request-body-timeout-secs=0",
            "--http2-idle-timeout-secs=0",
            "--udp-max-flows=0",
            "--http2-max-concurrent-streams=0",
            "--max-upstream-requests-per-connection=0",
        ] {
            assert!(Cli::try_parse_from(["x", flag]).is_err(), "{flag}");
        }
    }
}
