//! A container's environment and a pod's volumes, resolved against the API server the way the
//! kubelet does: `value` (with `$(VAR)` expansion), `fieldRef`, `secretKeyRef`,
//! `configMapKeyRef`, `envFrom`; Secret, ConfigMap, emptyDir, downwardAPI and projected
//! (service-account token, ConfigMap, Secret, downwardAPI) volumes written to files.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, ObjectFieldSelector, Pod, Secret,
    ServiceAccount, Volume,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::error::{Error, Result, io};

/// Values the kubelet knows about the pod that the API object does not (yet) carry.
pub struct PodFacts<'a> {
    pub pod: &'a Pod,
    pub pod_ip: String,
    pub host_ip: String,
    pub node_name: &'a str,
    /// What pods use to reach the API server (KUBERNETES_SERVICE_HOST / _PORT).
    pub api_host: String,
    pub api_port: u16,
}

fn ns(pod: &Pod) -> String {
    pod.metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into())
}

pub fn field_ref(facts: &PodFacts<'_>, sel: &ObjectFieldSelector) -> Result<String> {
    let pod = facts.pod;
    let path = sel.field_path.as_str();
    let spec = pod.spec.as_ref();
    let value = match path {
        "metadata.name" => pod.metadata.name.clone().unwrap_or_default(),
        "metadata.namespace" => ns(pod),
        "metadata.uid" => pod.metadata.uid.clone().unwrap_or_default(),
        "spec.nodeName" => facts.node_name.to_owned(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => facts.pod_ip.clone(),
        "status.hostIP" | "status.hostIPs" => facts.host_ip.clone(),
        _ => {
            let label = |prefix: &str, map: Option<&BTreeMap<String, String>>| {
                path.strip_prefix(prefix)
                    .and_then(|r| r.strip_prefix("['"))
                    .and_then(|r| r.strip_suffix("']"))
                    .map(|k| map.and_then(|m| m.get(k)).cloned().unwrap_or_default())
            };
            if let Some(v) = label("metadata.labels", pod.metadata.labels.as_ref()) {
                v
            } else if let Some(v) = label("metadata.annotations", pod.metadata.annotations.as_ref())
            {
                v
            } else {
                return Err(Error::Pod(format!("unsupported fieldRef {path}")));
            }
        }
    };
    Ok(value)
}

/// `$(VAR)` expansion as the kubelet does it: defined names are replaced, `$$` is a literal `$`,
/// anything else is left as written.
pub fn expand(input: &str, vars: &[(String, String)]) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
            && let Some((_, v)) = vars.iter().rev().find(|(k, _)| k == &body[..end])
        {
            out.push_str(v);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

async fn secret(client: &Client, ns: &str, name: &str) -> Result<Option<Secret>> {
    Ok(Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?)
}

async fn config_map(client: &Client, ns: &str, name: &str) -> Result<Option<ConfigMap>> {
    Ok(Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?)
}

fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = s
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in s.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone().into_bytes());
    }
    out
}

fn config_map_data(c: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = c
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in c.binary_data.iter().flatten() {
        out.insert(k.clone(), v.0.clone());
    }
    out
}

fn missing(kind: &str, ns: &str, name: &str) -> Error {
    Error::Pod(format!("{kind} {ns}/{name} not found"))
}

/// The container's environment, in the order the kubelet builds it.
pub async fn container_env(
    client: &Client,
    facts: &PodFacts<'_>,
    container: &Container,
) -> Result<Vec<(String, String)>> {
    let pod_ns = ns(facts.pod);
    let mut vars: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        (
            "HOSTNAME".into(),
            facts.pod.metadata.name.clone().unwrap_or_default(),
        ),
        ("KUBERNETES_SERVICE_HOST".into(), facts.api_host.clone()),
        ("KUBERNETES_SERVICE_PORT".into(), facts.api_port.to_string()),
        (
            "KUBERNETES_SERVICE_PORT_HTTPS".into(),
            facts.api_port.to_string(),
        ),
        (
            "KUBERNETES_PORT".into(),
            format!("tcp://{}:{}", facts.api_host, facts.api_port),
        ),
    ];
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(r) = &from.config_map_ref {
            match config_map(client, &pod_ns, &r.name).await? {
                Some(c) => config_map_data(&c),
                None if r.optional == Some(true) => BTreeMap::new(),
                None => return Err(missing("configmap", &pod_ns, &r.name)),
            }
        } else if let Some(r) = &from.secret_ref {
            match secret(client, &pod_ns, &r.name).await? {
                Some(s) => secret_data(&s),
                None if r.optional == Some(true) => BTreeMap::new(),
                None => return Err(missing("secret", &pod_ns, &r.name)),
            }
        } else {
            BTreeMap::new()
        };
        for (k, v) in data {
            vars.push((
                format!("{prefix}{k}"),
                String::from_utf8_lossy(&v).into_owned(),
            ));
        }
    }
    for env in container.env.iter().flatten() {
        let value = if let Some(v) = &env.value {
            expand(v, &vars)
        } else if let Some(from) = &env.value_from {
            if let Some(f) = &from.field_ref {
                field_ref(facts, f)?
            } else if let Some(r) = &from.secret_key_ref {
                let data = secret(client, &pod_ns, &r.name)
                    .await?
                    .map(|s| secret_data(&s));
                match data.and_then(|d| d.get(&r.key).cloned()) {
                    Some(v) => String::from_utf8_lossy(&v).into_owned(),
                    None if r.optional == Some(true) => continue,
                    None => {
                        return Err(missing(
                            "secret key",
                            &pod_ns,
                            &format!("{}[{}]", r.name, r.key),
                        ));
                    }
                }
            } else if let Some(r) = &from.config_map_key_ref {
                let data = config_map(client, &pod_ns, &r.name)
                    .await?
                    .map(|c| config_map_data(&c));
                match data.and_then(|d| d.get(&r.key).cloned()) {
                    Some(v) => String::from_utf8_lossy(&v).into_owned(),
                    None if r.optional == Some(true) => continue,
                    None => {
                        return Err(missing(
                            "configmap key",
                            &pod_ns,
                            &format!("{}[{}]", r.name, r.key),
                        ));
                    }
                }
            } else {
                return Err(Error::Pod(format!(
                    "env {}: unsupported valueFrom",
                    env.name
                )));
            }
        } else {
            String::new()
        };
        vars.push((env.name.clone(), value));
    }
    // Later definitions win, as with a real container runtime.
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<(String, String)> = vars
        .into_iter()
        .rev()
        .filter(|(k, _)| seen.insert(k.clone()))
        .collect();
    out.reverse();
    Ok(out)
}

fn write_file(dir: &Path, rel: &str, data: &[u8], mode: i32) -> Result<()> {
    if rel.split('/').any(|c| c == ".." || c.is_empty()) {
        return Err(Error::Pod(format!("volume path {rel:?} is not allowed")));
    }
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    std::fs::write(&path, data).map_err(io(format!("writing {}", path.display())))?;
    let perm = std::fs::Permissions::from_mode((mode & 0o777) as u32);
    std::fs::set_permissions(&path, perm).map_err(io(format!("chmod {}", path.display())))
}

fn write_keys(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: i32,
) -> Result<()> {
    match items {
        Some(items) => {
            for item in items {
                let Some(v) = data.get(&item.key) else {
                    return Err(Error::Pod(format!("key {} not found", item.key)));
                };
                write_file(dir, &item.path, v, item.mode.unwrap_or(default_mode))?;
            }
        }
        None => {
            for (k, v) in data {
                write_file(dir, k, v, default_mode)?;
            }
        }
    }
    Ok(())
}

fn write_downward(
    dir: &Path,
    facts: &PodFacts<'_>,
    items: &[DownwardAPIVolumeFile],
    mode: i32,
) -> Result<()> {
    for item in items {
        let value = match &item.field_ref {
            Some(f) => field_ref(facts, f)?,
            None => {
                return Err(Error::Pod(format!(
                    "downwardAPI {}: only fieldRef is supported",
                    item.path
                )));
            }
        };
        write_file(dir, &item.path, value.as_bytes(), item.mode.unwrap_or(mode))?;
    }
    Ok(())
}

async fn token(
    client: &Client,
    facts: &PodFacts<'_>,
    audience: Option<&str>,
    seconds: Option<i64>,
) -> Result<String> {
    let pod = facts.pod;
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audience.map(|a| vec![a.to_owned()]).unwrap_or_default(),
            expiration_seconds: Some(seconds.unwrap_or(3607)),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let api = Api::<ServiceAccount>::namespaced(client.clone(), &ns(pod));
    let out: TokenRequest = api
        .create_subresource("token", &sa, &PostParams::default(), &req)
        .await?;
    Ok(out.status.map(|s| s.token).unwrap_or_default())
}

/// Writes every volume of the pod under `root/<volume name>/` and returns the directory of each.
pub async fn write_volumes(
    client: &Client,
    facts: &PodFacts<'_>,
    root: &Path,
) -> Result<BTreeMap<String, PathBuf>> {
    let pod_ns = ns(facts.pod);
    let mut dirs = BTreeMap::new();
    let volumes: &[Volume] = facts
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or(&[]);
    for vol in volumes {
        let dir = root.join(&vol.name);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        if let Some(s) = &vol.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            match secret(client, &pod_ns, &name).await? {
                Some(sec) => write_keys(
                    &dir,
                    &secret_data(&sec),
                    s.items.as_ref(),
                    s.default_mode.unwrap_or(0o644),
                )?,
                None if s.optional == Some(true) => {}
                None => return Err(missing("secret", &pod_ns, &name)),
            }
        } else if let Some(c) = &vol.config_map {
            match config_map(client, &pod_ns, &c.name).await? {
                Some(cm) => write_keys(
                    &dir,
                    &config_map_data(&cm),
                    c.items.as_ref(),
                    c.default_mode.unwrap_or(0o644),
                )?,
                None if c.optional == Some(true) => {}
                None => return Err(missing("configmap", &pod_ns, &c.name)),
            }
        } else if let Some(d) = &vol.downward_api {
            write_downward(
                &dir,
                facts,
                d.items.as_deref().unwrap_or(&[]),
                d.default_mode.unwrap_or(0o644),
            )?;
        } else if let Some(p) = &vol.projected {
            let mode = p.default_mode.unwrap_or(0o644);
            for src in p.sources.iter().flatten() {
                if let Some(t) = &src.service_account_token {
                    let tok =
                        token(client, facts, t.audience.as_deref(), t.expiration_seconds).await?;
                    write_file(&dir, &t.path, tok.as_bytes(), mode)?;
                } else if let Some(c) = &src.config_map {
                    match config_map(client, &pod_ns, &c.name).await? {
                        Some(cm) => {
                            write_keys(&dir, &config_map_data(&cm), c.items.as_ref(), mode)?
                        }
                        None if c.optional == Some(true) => {}
                        None => return Err(missing("configmap", &pod_ns, &c.name)),
                    }
                } else if let Some(s) = &src.secret {
                    match secret(client, &pod_ns, &s.name).await? {
                        Some(sec) => write_keys(&dir, &secret_data(&sec), s.items.as_ref(), mode)?,
                        None if s.optional == Some(true) => {}
                        None => return Err(missing("secret", &pod_ns, &s.name)),
                    }
                } else if let Some(d) = &src.downward_api {
                    write_downward(&dir, facts, d.items.as_deref().unwrap_or(&[]), mode)?;
                }
            }
        } else if vol.empty_dir.is_none() {
            return Err(Error::Pod(format!(
                "volume {}: unsupported volume type",
                vol.name
            )));
        }
        dirs.insert(vol.name.clone(), dir);
    }
    Ok(dirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vec<(String, String)> {
        vec![("A".into(), "1".into()), ("B".into(), "two".into())]
    }

    #[test]
    fn expands_defined_variables() {
        assert_eq!(expand("x$(A)-$(B)", &vars()), "x1-two");
    }

    #[test]
    fn leaves_undefined_and_unterminated_references() {
        assert_eq!(expand("$(C) $(A", &vars()), "$(C) $(A");
    }

    #[test]
    fn double_dollar_escapes() {
        assert_eq!(expand("$$(A) $", &vars()), "$(A) $");
    }
}
