//! The fuzzing surface: manifest text loaded as `tollgate run` and `tollgate validate` load a
//! file. In: the text of one YAML file. Out: the compiler's [`Inputs`], with the content
//! versions a [`crate::manifests::ManifestDir`] scan gives them, ready for
//! [`crate::compile::compile`]. A thin wrapper for the fuzz targets (`fuzz/` at the
//! repository root); not a stable API.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::compile::{Inputs, LoadError, inputs_from_yaml};

/// Parses one manifest file's text as a directory scan does (`now` at the Unix epoch).
pub fn load(text: &str) -> Result<Inputs, LoadError> {
    let mut inputs = inputs_from_yaml(text, Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))?;
    crate::manifests::set_versions(&mut inputs);
    Ok(inputs)
}
