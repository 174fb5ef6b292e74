//! Manifests read from a directory, for `tollgate run` and `tollgate validate`.
//!
//! In: a directory of `.yaml`/`.yml` files (searched recursively, multi-document). Out: the
//! compiler's [`Inputs`], merged across files. Each file's last good parse is kept: a file that
//! stops parsing is reported and its previous objects stay, so a half-saved edit never takes
//! routes down.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::compile::Inputs;
use crate::compile::load::{LoadError, inputs_from_yaml};

/// A problem reading the manifests.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The directory (or a file in it) could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file did not parse.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: LoadError,
    },
}

/// One parsed file.
struct Parsed {
    text: String,
    inputs: Inputs,
}

/// The manifests of a directory, with each file's last good parse.
#[derive(Default)]
pub struct ManifestDir {
    root: PathBuf,
    files: BTreeMap<PathBuf, Parsed>,
}

/// The result of one scan.
pub struct Scan {
    /// All objects from every file (the last good parse of files that fail now).
    pub inputs: Inputs,
    /// Files that could not be read or parsed on this scan.
    pub errors: Vec<ManifestError>,
}

impl ManifestDir {
    /// Manifests under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            files: BTreeMap::new(),
        }
    }

    /// Reads every manifest file again. `now` stamps the conditions the compiler writes.
    pub fn scan(&mut self, now: &Time) -> Result<Scan, ManifestError> {
        let mut paths = Vec::new();
        collect(&self.root, &mut paths)?;
        paths.sort();
        let mut errors = Vec::new();
        let mut seen = BTreeMap::new();
        for path in paths {
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(source) => {
                    errors.push(ManifestError::Io {
                        path: path.clone(),
                        source,
                    });
                    seen.insert(path, ());
                    continue;
                }
            };
            let unchanged = self.files.get(&path).is_some_and(|p| p.text == text);
            if !unchanged {
                match inputs_from_yaml(&text, now.clone()) {
                    Ok(inputs) => {
                        self.files.insert(path.clone(), Parsed { text, inputs });
                    }
                    Err(source) => errors.push(ManifestError::Parse {
                        path: path.clone(),
                        source,
                    }),
                }
            }
            seen.insert(path, ());
        }
        // Files that were deleted take their objects with them.
        self.files.retain(|p, _| seen.contains_key(p));
        let mut inputs = Inputs::new(now.clone());
        for parsed in self.files.values() {
            inputs.extend(parsed.inputs.clone());
        }
        Ok(Scan { inputs, errors })
    }
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ManifestError> {
    let io = |source| ManifestError::Io {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('.') {
            continue; // editor swap files, .git
        }
        if path.is_dir() {
            collect(&path, out)?;
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            out.push(path);
        }
    }
    Ok(())
}
