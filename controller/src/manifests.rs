//! Manifests read from a directory, for `tollgate run` and `tollgate validate`.
//!
//! In: a directory of `.yaml`/`.yml` files (searched recursively, multi-document). Out: the
//! compiler's [`Inputs`], merged across files. Each file's last good parse is kept: a file that
//! stops parsing is reported and its previous objects stay, so a half-saved edit never takes
//! routes down. A scan reads only files that changed on disk and parses only those whose text
//! changed, so a change to one file costs that file, not the directory. Each object's
//! resourceVersion is set from its content ([`set_versions`]), so that, as with objects
//! from an API server, an unchanged version means an unchanged object.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::compile::Inputs;
use crate::compile::load::{LoadError, inputs_from_manifests};
use crate::compile::policies::auth::sha256_hex;

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

/// What a file looked like when it was last read: a change of any of these means it must be
/// read again.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(meta);
        #[cfg(not(unix))]
        let inode = 0;
        Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
        }
    }
}

/// A file modified less than this before it was read may be written again within the same
/// timestamp tick (coarse file systems): its stamp is not trusted, the file is read again on
/// the next scan and compared by content ("racy git").
const RACY: Duration = Duration::from_secs(2);

/// One parsed file: its text, how many objects of each kind it holds in the merged inputs, and
/// the stamp it had when read (`None`: not trusted, read it again).
struct Parsed {
    text: String,
    counts: Counts,
    stamp: Option<Stamp>,
}

/// Calls `$m!(field)` for every object list of [`Inputs`].
macro_rules! each_object_list {
    ($m:ident) => {
        $m!(gateway_classes);
        $m!(gateways);
        $m!(http_routes);
        $m!(grpc_routes);
        $m!(tls_routes);
        $m!(tcp_routes);
        $m!(udp_routes);
        $m!(listener_sets);
        $m!(reference_grants);
        $m!(services);
        $m!(endpoint_slices);
        $m!(secrets);
        $m!(namespaces);
        $m!(config_maps);
        $m!(rate_limit_policies);
        $m!(auth_policies);
        $m!(client_policies);
        $m!(backend_policies);
        $m!(cache_policies);
        $m!(backend_traffic_policies);
        $m!(backend_tls_policies);
        $m!(gateway_parameters);
    };
}

/// Calls `$m!(field)` for every object list of [`Inputs`], and for its warnings.
macro_rules! each_list {
    ($m:ident) => {
        each_object_list!($m);
        $m!(warnings);
    };
}

/// Number of entries a file contributes to each list of [`Inputs`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(clippy::struct_field_names)]
struct Counts {
    gateway_classes: usize,
    gateways: usize,
    http_routes: usize,
    grpc_routes: usize,
    tls_routes: usize,
    tcp_routes: usize,
    udp_routes: usize,
    listener_sets: usize,
    reference_grants: usize,
    services: usize,
    endpoint_slices: usize,
    secrets: usize,
    namespaces: usize,
    config_maps: usize,
    rate_limit_policies: usize,
    auth_policies: usize,
    client_policies: usize,
    backend_policies: usize,
    cache_policies: usize,
    backend_traffic_policies: usize,
    backend_tls_policies: usize,
    gateway_parameters: usize,
    warnings: usize,
}

impl Counts {
    fn of(inputs: &Inputs) -> Self {
        // Every list of `Inputs` must be in `each_list!`, or a scan would drop its objects:
        // this pattern stops compiling when `Inputs` gains a field, so the two move together.
        let Inputs {
            gateway_classes: _,
            gateways: _,
            http_routes: _,
            grpc_routes: _,
            tls_routes: _,
            tcp_routes: _,
            udp_routes: _,
            listener_sets: _,
            reference_grants: _,
            services: _,
            endpoint_slices: _,
            secrets: _,
            namespaces: _,
            config_maps: _,
            rate_limit_policies: _,
            auth_policies: _,
            client_policies: _,
            backend_policies: _,
            cache_policies: _,
            backend_traffic_policies: _,
            backend_tls_policies: _,
            gateway_parameters: _,
            last_valid: _,
            reserved_ports: _,
            now: _,
            warnings: _,
        } = inputs;
        let mut c = Self::default();
        macro_rules! count {
            ($f:ident) => {
                c.$f = inputs.$f.len();
            };
        }
        each_list!(count);
        c
    }

    fn add(&mut self, other: &Self) {
        macro_rules! add {
            ($f:ident) => {
                self.$f += other.$f;
            };
        }
        each_list!(add);
    }
}

/// The manifests of a directory, with each file's last good parse.
///
/// Scans are incremental: a file whose size, modification time and inode are unchanged is not
/// read again, a file whose text is unchanged is not parsed again, and the merged [`Inputs`]
/// are kept between scans, a changed file's objects spliced in place of its old ones. The
/// result is exactly what reading every file afresh gives (objects in path order, then
/// document order), without copying 10k unchanged routes on every change.
pub struct ManifestDir {
    root: PathBuf,
    files: BTreeMap<PathBuf, Parsed>,
    merged: Inputs,
    /// Whether a scan has run.
    scanned: bool,
}

/// The result of one scan.
pub struct Scan<'a> {
    /// All objects from every file (the last good parse of files that fail now).
    pub inputs: &'a Inputs,
    /// Files that could not be read or parsed on this scan.
    pub errors: Vec<ManifestError>,
    /// Files read on this scan (the others were unchanged on disk).
    pub read: usize,
    /// Files parsed on this scan (read, and their text changed).
    pub parsed: usize,
    /// Whether [`Scan::inputs`] differ from the previous scan's (always true on the first).
    pub changed: bool,
}

impl ManifestDir {
    /// Manifests under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            files: BTreeMap::new(),
            merged: Inputs::default(),
            scanned: false,
        }
    }

    /// Sets the [`Inputs::last_valid`] the next scans hand the compiler: the previous
    /// compile's [`crate::compile::Output::last_valid`]. It changes no object, so a scan that
    /// finds no file changed still reports `changed: false`.
    pub fn set_last_valid(&mut self, last_valid: crate::compile::LastValid) {
        self.merged.last_valid = last_valid;
    }

    /// Reads every manifest file that changed since the last scan. `now` stamps the
    /// conditions the compiler writes.
    pub fn scan(&mut self, now: &Time) -> Result<Scan<'_>, ManifestError> {
        let mut paths = BTreeSet::new();
        collect(&self.root, &mut paths)?;
        // Deleted files take their objects with them; walking old and new paths together in
        // order keeps a running offset of each file's objects in the merged lists.
        let mut all: Vec<PathBuf> = paths.iter().cloned().collect();
        all.extend(self.files.keys().filter(|p| !paths.contains(*p)).cloned());
        all.sort();
        let mut errors = Vec::new();
        let (mut read, mut parsed) = (0, 0);
        let mut offset = Counts::default();
        let mut changed = !self.scanned;
        self.scanned = true;
        // Built by the first file parsed, then shared by the others, dropped after the scan.
        let mut schemas = None;
        for path in all {
            if paths.contains(&path) {
                match self.refresh(&path, &offset, now, &mut schemas) {
                    Ok(Refresh::Unchanged) => {}
                    Ok(Refresh::Read) => read += 1,
                    Ok(Refresh::Parsed) => {
                        (read, parsed, changed) = (read + 1, parsed + 1, true);
                    }
                    Err(e) => {
                        read += 1;
                        if matches!(e, ManifestError::Parse { .. }) {
                            parsed += 1;
                        }
                        errors.push(e);
                    }
                }
                if let Some(p) = self.files.get(&path) {
                    offset.add(&p.counts);
                }
            } else {
                self.splice(&path, &offset, None);
                changed = true;
            }
        }
        self.merged.now = now.clone();
        Ok(Scan {
            inputs: &self.merged,
            errors,
            read,
            parsed,
            changed,
        })
    }

    /// Reads and parses `path` again if it changed; its objects start at `offset` in the
    /// merged lists. On error the file keeps its last good objects.
    fn refresh(
        &mut self,
        path: &Path,
        offset: &Counts,
        now: &Time,
        schemas: &mut Option<std::sync::Arc<crate::schema::Schemas>>,
    ) -> Result<Refresh, ManifestError> {
        let stamp = std::fs::metadata(path).ok().map(|m| Stamp::of(&m));
        let known = self.files.get(path);
        if let (Some(p), Some(s)) = (known, &stamp)
            && p.stamp.as_ref() == Some(s)
        {
            return Ok(Refresh::Unchanged);
        }
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let trusted = stamp.filter(|s| {
            s.modified
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|age| age >= RACY)
        });
        if let Some(p) = self.files.get_mut(path)
            && p.text == text
        {
            p.stamp = trusted;
            return Ok(Refresh::Read);
        }
        // On a parse error the stamp is not recorded: the next scan reads the file and
        // reports it again.
        schemas.get_or_insert_with(crate::schema::Schemas::shared);
        let mut inputs =
            inputs_from_manifests(&text, now.clone()).map_err(|source| ManifestError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        set_versions(&mut inputs);
        self.splice(path, offset, Some((text, inputs, trusted)));
        Ok(Refresh::Parsed)
    }

    /// Puts `new`'s objects in place of `path`'s, which start at `offset` in the merged
    /// lists (`None`: removes them and forgets the file).
    fn splice(
        &mut self,
        path: &Path,
        offset: &Counts,
        new: Option<(String, Inputs, Option<Stamp>)>,
    ) {
        let old = self.files.get(path).map(|p| p.counts).unwrap_or_default();
        let m = &mut self.merged;
        match new {
            Some((text, mut inputs, stamp)) => {
                let counts = Counts::of(&inputs);
                macro_rules! splice {
                    ($f:ident) => {
                        m.$f.splice(
                            offset.$f..offset.$f + old.$f,
                            std::mem::take(&mut inputs.$f),
                        );
                    };
                }
                each_list!(splice);
                self.files.insert(
                    path.to_path_buf(),
                    Parsed {
                        text,
                        counts,
                        stamp,
                    },
                );
            }
            None => {
                macro_rules! remove {
                    ($f:ident) => {
                        m.$f.drain(offset.$f..offset.$f + old.$f);
                    };
                }
                each_list!(remove);
                self.files.remove(path);
            }
        }
    }
}

/// Gives every object parsed from a file a resourceVersion that names its content: a digest of
/// the object as JSON, without the resourceVersion the file may give (replaced). Two objects
/// with the same version are then the same object, as on an API server, which lets the compile
/// cache tell an unchanged route from a changed one without comparing them field by field,
/// also among the unchanged objects of an edited file; and a fresh scan of the same files
/// gives the same versions.
pub(crate) fn set_versions(inputs: &mut Inputs) {
    let mut json = Vec::new();
    macro_rules! set {
        ($f:ident) => {
            for o in &mut inputs.$f {
                o.metadata.resource_version = None;
                json.clear();
                // An object that does not serialize keeps no version: the cache then compares
                // it field by field.
                if serde_json::to_writer(&mut json, &*o).is_ok() {
                    o.metadata.resource_version = Some(format!("file-{}", sha256_hex(&json)));
                }
            }
        };
    }
    each_object_list!(set);
}

/// What [`ManifestDir::refresh`] did with a file.
enum Refresh {
    /// Not read: its stamp is unchanged.
    Unchanged,
    /// Read, but its text is unchanged.
    Read,
    /// Read and parsed: its objects were replaced.
    Parsed,
}

fn collect(dir: &Path, out: &mut BTreeSet<PathBuf>) -> Result<(), ManifestError> {
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
            out.insert(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::compile;
    use std::time::Duration;

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    /// A fresh directory under the system temp dir, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir()
                .join(format!("tollgate-manifests-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }

        /// Writes `file` with `text`; `age` back-dates its modification time (`None`: now).
        fn write(&self, file: &str, text: &str, age: Option<Duration>) {
            let path = self.0.join(file);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            std::fs::write(&path, text).unwrap();
            if let Some(age) = age {
                let f = std::fs::File::options().write(true).open(&path).unwrap();
                f.set_modified(SystemTime::now() - age).unwrap();
            }
        }

        fn remove(&self, file: &str) {
            std::fs::remove_file(self.0.join(file)).unwrap();
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const OLD: Option<Duration> = Some(Duration::from_secs(3600));
    const OLDER: Option<Duration> = Some(Duration::from_secs(7200));

    fn routes(names: &[&str]) -> String {
        names
            .iter()
            .map(|n| {
                format!(
                    "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
                     metadata: {{name: {n}, namespace: default}}\nspec:\n  parentRefs: [{{name: gw}}]\n  \
                     rules:\n  - matches: [{{path: {{type: PathPrefix, value: /{n}}}}}]\n    \
                     backendRefs: [{{name: svc, port: 80}}]\n"
                )
            })
            .collect()
    }

    const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\n\
        metadata: {name: tollgate}\nspec: {controllerName: tollgate.dev/gateway-controller}\n---\n\
        apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: default}\n\
        spec:\n  gatewayClassName: tollgate\n  listeners: [{name: http, protocol: HTTP, port: 80}]\n---\n\
        apiVersion: v1\nkind: Service\nmetadata: {name: svc, namespace: default}\n\
        spec: {ports: [{port: 80}]}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n";

    /// One metadata field of every HTTPRoute, in order.
    fn of_routes(
        inputs: &Inputs,
        field: impl Fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &Option<String>,
    ) -> Vec<String> {
        inputs
            .http_routes
            .iter()
            .map(|r| field(&r.metadata).clone().unwrap_or_default())
            .collect()
    }

    fn route_names(inputs: &Inputs) -> Vec<String> {
        of_routes(inputs, |m| &m.name)
    }

    /// The scan of `m` is exactly what a fresh scan of the same directory gives.
    fn assert_fresh(m: &mut ManifestDir, dir: &TempDir) {
        let incremental = format!("{:?}", m.scan(&now()).unwrap().inputs);
        let mut fresh = ManifestDir::new(&dir.0);
        let scan = fresh.scan(&now()).unwrap();
        assert!(scan.errors.is_empty(), "{:?}", scan.errors);
        assert_eq!(incremental, format!("{:?}", scan.inputs));
        let compiled = compile(scan.inputs);
        assert_eq!(compile(m.scan(&now()).unwrap().inputs), compiled);
    }

    #[test]
    fn unchanged_files_are_not_read_again() {
        let dir = TempDir::new("unchanged");
        dir.write("a.yaml", GATEWAY, OLD);
        dir.write("b.yaml", &routes(&["r1", "r2"]), OLD);
        let mut m = ManifestDir::new(&dir.0);
        let s = m.scan(&now()).unwrap();
        assert_eq!((s.read, s.parsed, s.changed), (2, 2, true));
        assert_eq!(route_names(s.inputs), ["r1", "r2"]);
        let s = m.scan(&now()).unwrap();
        assert_eq!((s.read, s.parsed, s.changed), (0, 0, false));
        assert_eq!(route_names(s.inputs), ["r1", "r2"]);
    }

    #[test]
    fn a_changed_file_is_read_and_parsed_again() {
        let dir = TempDir::new("changed");
        dir.write("a.yaml", GATEWAY, OLD);
        dir.write("b.yaml", &routes(&["r1", "r2"]), OLD);
        let mut m = ManifestDir::new(&dir.0);
        m.scan(&now()).unwrap();
        // Same length, other content, other modification time.
        dir.write("b.yaml", &routes(&["r3", "r4"]), OLDER);
        let s = m.scan(&now()).unwrap();
        assert_eq!((s.read, s.parsed, s.changed), (1, 1, true));
        assert_eq!(route_names(s.inputs), ["r3", "r4"]);
        assert_fresh(&mut m, &dir);
    }

    #[test]
    fn recently_modified_files_are_compared_by_content() {
        // A file modified just now may change again within its timestamp's resolution: it is
        // read on every scan, but parsed only when its text changed.
        let dir = TempDir::new("racy");
        dir.write("a.yaml", GATEWAY, None);
        let mut m = ManifestDir::new(&dir.0);
        m.scan(&now()).unwrap();
        let s = m.scan(&now()).unwrap();
        assert_eq!((s.read, s.parsed, s.changed), (1, 0, false));
    }

    #[test]
    fn a_deleted_file_takes_its_objects() {
        let dir = TempDir::new("deleted");
        dir.write("a.yaml", &routes(&["r1"]), OLD);
        dir.write("b.yaml", GATEWAY, OLD);
        dir.write("c.yaml", &routes(&["r2", "r3"]), OLD);
        let mut m = ManifestDir::new(&dir.0);
        assert_eq!(
            route_names(m.scan(&now()).unwrap().inputs),
            ["r1", "r2", "r3"]
        );
        dir.remove("a.yaml");
        let s = m.scan(&now()).unwrap();
        assert_eq!((s.read, s.parsed, s.changed), (0, 0, true));
        assert_eq!(route_names(s.inputs), ["r2", "r3"]);
        assert_eq!(s.inputs.services.len(), 1);
        assert_fresh(&mut m, &dir);
    }

    #[test]
    fn a_file_that_stops_parsing_keeps_its_objects_and_is_reported_each_scan() {
        let dir = TempDir::new("broken");
        dir.write("a.yaml", &routes(&["r1"]), OLD);
        let mut m = ManifestDir::new(&dir.0);
        m.scan(&now()).unwrap();
        dir.write("a.yaml", "a: [", OLDER);
        for _ in 0..2 {
            let s = m.scan(&now()).unwrap();
            assert_eq!(s.errors.len(), 1, "reported on every scan");
            assert!(!s.changed);
            assert_eq!(route_names(s.inputs), ["r1"]);
        }
    }

    fn versions(inputs: &Inputs) -> Vec<String> {
        of_routes(inputs, |m| &m.resource_version)
    }

    #[test]
    fn objects_are_versioned_by_their_content() {
        let dir = TempDir::new("versions");
        dir.write("a.yaml", GATEWAY, OLD);
        // A resourceVersion in a file (as `kubectl get -o yaml` writes) is replaced.
        let given = routes(&["r1", "r2"]).replace(
            "metadata: {name: r2, namespace: default}",
            "metadata: {name: r2, namespace: default, resourceVersion: \"7\"}",
        );
        dir.write("b.yaml", &given, OLD);
        let mut m = ManifestDir::new(&dir.0);
        let (out, cache) =
            crate::compile::compile_cached(m.scan(&now()).unwrap().inputs, Default::default());
        assert!(out.rejections().is_empty(), "{:?}", out.rejections());
        let before = versions(m.scan(&now()).unwrap().inputs);
        assert_eq!(before.len(), 2);
        assert!(before.iter().all(|v| v.starts_with("file-")), "{before:?}");
        assert_ne!(before[0], before[1]);
        // Every object of every kind gets one.
        let s = m.scan(&now()).unwrap();
        assert!(s.inputs.services[0].metadata.resource_version.is_some());
        assert!(s.inputs.gateways[0].metadata.resource_version.is_some());

        // r2 edited, r1 the same text in the same file: only r2's version changes, so only r2
        // is compiled again.
        let edited = given.replace("value: /r2", "value: /r2b");
        dir.write("b.yaml", &edited, OLDER);
        let after = versions(m.scan(&now()).unwrap().inputs);
        assert_eq!(after[0], before[0]);
        assert_ne!(after[1], before[1]);
        let (_, cache) = crate::compile::compile_cached(m.scan(&now()).unwrap().inputs, cache);
        let stats = cache.stats();
        assert_eq!((stats.routes_compiled, stats.routes_reused), (1, 1));

        // Back to the first text: the first versions again; and the same as a fresh scan.
        dir.write("b.yaml", &given, OLD);
        assert_eq!(versions(m.scan(&now()).unwrap().inputs), before);
        assert_fresh(&mut m, &dir);
    }

    #[test]
    fn incremental_scans_equal_a_fresh_scan() {
        let dir = TempDir::new("fresh");
        dir.write("b.yaml", GATEWAY, OLD);
        dir.write("d/x.yaml", &routes(&["x1", "x2"]), OLD);
        dir.write("f.yaml", &routes(&["f1"]), OLD);
        let mut m = ManifestDir::new(&dir.0);
        assert_fresh(&mut m, &dir);
        // A file added before the others, one in the middle growing, one at the end shrinking.
        dir.write("a.yaml", &routes(&["a1", "a2", "a3"]), OLD);
        dir.write("d/x.yaml", &routes(&["x1", "x2", "x3", "x4"]), OLDER);
        dir.write("f.yaml", "", OLDER);
        assert_fresh(&mut m, &dir);
        // Objects moving between files, one file deleted, a recent write.
        dir.remove("a.yaml");
        dir.write("d/x.yaml", &routes(&["a1"]), OLD);
        dir.write("f.yaml", &(routes(&["x1"]) + "---\n" + GATEWAY), None);
        assert_fresh(&mut m, &dir);
        let s = m.scan(&now()).unwrap();
        assert_eq!(route_names(s.inputs), ["a1", "x1"]);
        assert_eq!(s.inputs.gateways.len(), 2);
        assert_eq!(s.inputs.warnings.len(), 2);
    }
}
