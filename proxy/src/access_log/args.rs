//! Command-line settings of the access log, shared by `tollgate-proxy`, `tollgate run` and
//! `tollgate controller` (which passes them on to the proxies it provisions).
//!
//! In: `--access-log`, `--access-log-format`, `--access-log-fields`, `--access-log-filter`,
//! `--access-log-file`. Out: [`ProxyOptions::access_log`] and its [`LogSettings`], or the
//! flags to hand to another process; a bad field name, filter or file is an error at startup.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Fields, Format, LogSettings};
use crate::ProxyOptions;
use crate::lifecycle::policy::cel::{CelError, LogFilter};

/// The access log flags.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct AccessLogArgs {
    /// Write an access-log line per request (stdout unless --access-log-file).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub access_log: bool,
    /// Line format: json or logfmt.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub access_log_format: Format,
    /// Fields written, comma-separated (default: all): time, method, host, path, status,
    /// duration_ms, route, upstream, bytes, request_id, peer, grpc_status, client_timeout,
    /// retried, shadow_limited, grpc_web, trace_id.
    #[arg(long)]
    pub access_log_fields: Option<String>,
    /// Write only the requests this CEL expression keeps, e.g. `response.code >= 500 ||
    /// sample < 0.01` (variables: request.method/host/path, response.code, route,
    /// duration_ms, sample).
    #[arg(long)]
    pub access_log_filter: Option<String>,
    /// Append lines to this file instead of stdout (opened once: rotate by copy and
    /// truncate).
    #[arg(long)]
    pub access_log_file: Option<PathBuf>,
}

impl Default for AccessLogArgs {
    fn default() -> Self {
        Self {
            access_log: true,
            access_log_format: Format::Json,
            access_log_fields: None,
            access_log_filter: None,
            access_log_file: None,
        }
    }
}

/// Flags that cannot be honoured.
#[derive(Debug, thiserror::Error)]
pub enum AccessLogArgsError {
    /// An unknown field name.
    #[error("--access-log-fields: {0}")]
    Fields(String),
    /// A filter that does not compile.
    #[error("--access-log-filter: {0}")]
    Filter(#[from] CelError),
    /// A file that cannot be opened for appending.
    #[error("--access-log-file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl AccessLogArgs {
    /// The settings these flags name (the file opened for appending).
    pub fn settings(&self) -> Result<LogSettings, AccessLogArgsError> {
        let fields = match &self.access_log_fields {
            Some(list) => Fields::parse(list).map_err(AccessLogArgsError::Fields)?,
            None => Fields::ALL,
        };
        let filter = self
            .access_log_filter
            .as_deref()
            .map(LogFilter::compile)
            .transpose()?;
        let file = match &self.access_log_file {
            Some(path) => Some(Arc::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|source| AccessLogArgsError::File {
                        path: path.clone(),
                        source,
                    })?,
            )),
            None => None,
        };
        Ok(LogSettings {
            format: self.access_log_format,
            fields,
            filter,
            file,
        })
    }

    /// Sets the access log these flags name on `opts`.
    pub fn apply(&self, opts: &mut ProxyOptions) -> Result<(), AccessLogArgsError> {
        opts.access_log = self.access_log;
        opts.access_log_settings = self.settings()?;
        Ok(())
    }

    /// The same settings as flags of a provisioned proxy (its file system is read-only: no
    /// file; its lines go to stdout, where the cluster's log collection reads them).
    pub fn to_proxy_flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.access_log {
            out.push("--access-log=false".to_owned());
        }
        if self.access_log_format != Format::Json {
            out.push("--access-log-format=logfmt".to_owned());
        }
        if let Some(f) = &self.access_log_fields {
            out.push(format!("--access-log-fields={f}"));
        }
        if let Some(f) = &self.access_log_filter {
            out.push(format!("--access-log-filter={f}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        log: AccessLogArgs,
    }

    fn parse(args: &[&str]) -> AccessLogArgs {
        Cli::parse_from(std::iter::once("x").chain(args.iter().copied())).log
    }

    #[test]
    fn defaults_and_flags() {
        assert_eq!(parse(&[]), AccessLogArgs::default());
        assert!(parse(&[]).to_proxy_flags().is_empty());
        let a = parse(&[
            "--access-log-format",
            "logfmt",
            "--access-log-fields",
            "status,path",
            "--access-log-filter",
            "response.code >= 500",
        ]);
        let s = a.settings().unwrap();
        assert_eq!(s.format, Format::Logfmt);
        assert_eq!(s.fields, Fields::parse("path,status").unwrap());
        assert!(s.filter.is_some());
        assert_eq!(
            a.to_proxy_flags(),
            [
                "--access-log-format=logfmt",
                "--access-log-fields=status,path",
                "--access-log-filter=response.code >= 500"
            ]
        );
        assert_eq!(
            parse(&["--access-log", "false"]).to_proxy_flags(),
            ["--access-log=false"]
        );
    }

    #[test]
    fn bad_settings_are_errors_at_startup() {
        let e = parse(&["--access-log-fields", "status,cookie"])
            .settings()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--access-log-fields: unknown access log field \"cookie\""),
            "{e}"
        );
        let e = parse(&["--access-log-filter", "response.code >="])
            .settings()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--access-log-filter: invalid CEL expression"),
            "{e}"
        );
        let e = parse(&["--access-log-file", "/nonexistent-dir/x.log"])
            .settings()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--access-log-file /nonexistent-dir/x.log: "),
            "{e}"
        );
    }
}
