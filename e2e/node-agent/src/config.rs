//! The agent's configuration file: which local binary runs for which container image.
//!
//! ```yaml
//! images:
//!   - prefix: gcr.io/k8s-staging-gateway-api/echo-basic
//!     binary: /root/.cache/tollgate/bin/echo-basic-v1.6.3-0123456789
//!   - prefix: tollgate.test/python-http
//!     binary: /usr/bin/python3
//!     entrypoint: ["-m", "http.server"]
//! ```
//!
//! The first entry whose `prefix` starts the image reference wins. A container's `command`
//! replaces the image entrypoint: its first word names the program inside the image and is
//! replaced by `binary`, the rest are arguments. Without `command`, the arguments are
//! `entrypoint` followed by the container's `args` (or the entry's `cmd` when there are none).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub images: Vec<ImageMapping>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageMapping {
    pub prefix: String,
    pub binary: PathBuf,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        serde_yaml_ng::from_str(&text).map_err(|source| Error::Config {
            path: path.to_owned(),
            source,
        })
    }

    pub fn lookup(&self, image: &str) -> Option<&ImageMapping> {
        self.images.iter().find(|m| image.starts_with(&m.prefix))
    }
}

impl ImageMapping {
    /// The argv (binary first) for a container with this `command` and `args`.
    pub fn argv(&self, command: &[String], args: &[String]) -> Vec<String> {
        let mut argv = vec![self.binary.to_string_lossy().into_owned()];
        if let Some((_, rest)) = command.split_first() {
            argv.extend(rest.iter().cloned());
            argv.extend(args.iter().cloned());
        } else {
            argv.extend(self.entrypoint.iter().cloned());
            if args.is_empty() {
                argv.extend(self.cmd.iter().cloned());
            } else {
                argv.extend(args.iter().cloned());
            }
        }
        argv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping() -> ImageMapping {
        ImageMapping {
            prefix: "x/py".into(),
            binary: "/usr/bin/python3".into(),
            entrypoint: vec!["-m".into(), "http.server".into()],
            cmd: vec!["8000".into()],
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn no_command_uses_entrypoint_and_default_cmd() {
        assert_eq!(
            mapping().argv(&[], &[]),
            s(&["/usr/bin/python3", "-m", "http.server", "8000"])
        );
    }

    #[test]
    fn args_replace_cmd() {
        assert_eq!(
            mapping().argv(&[], &s(&["9000"])),
            s(&["/usr/bin/python3", "-m", "http.server", "9000"])
        );
    }

    #[test]
    fn command_replaces_entrypoint_and_its_first_word_is_the_binary() {
        assert_eq!(
            mapping().argv(&s(&["/bin/py", "-c", "1"]), &s(&["a"])),
            s(&["/usr/bin/python3", "-c", "1", "a"])
        );
    }

    #[test]
    fn first_matching_prefix_wins() {
        let config: Config = serde_yaml_ng::from_str(
            "images:\n- {prefix: a/b, binary: /one}\n- {prefix: a/, binary: /two}\n",
        )
        .unwrap();
        assert_eq!(
            config.lookup("a/b:1").unwrap().binary,
            PathBuf::from("/one")
        );
        assert_eq!(config.lookup("a/c").unwrap().binary, PathBuf::from("/two"));
        assert!(config.lookup("c/d").is_none());
    }
}
