//! One error type for the node agent.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("parsing config {path}: {source}")]
    Config {
        path: PathBuf,
        source: serde_yaml_ng::Error,
    },
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("{0}")]
    Pod(String),
    #[error("no free pod IP in {0}")]
    NoIp(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `io(what)` turns an io::Error into an [`Error::Io`] that says what was being done.
pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}
