//! One kind's watch: a kube-runtime watcher feeding a reflector store, each object trimmed
//! and deserialized on its own, and a [`Change`] sent for every event after the first full
//! list, with the [`Relevance`] [`relevance`] gives it.

use super::*;

/// A hook run on every watched object before it is stored.
pub(super) type Trim<K> = Arc<dyn Fn(&mut Lenient<K>) + Send + Sync>;

impl Watch {
    pub(super) fn spawn<K>(
        self,
        api: Api<Lenient<K>>,
        config: watcher::Config,
    ) -> (Store<Lenient<K>>, JoinHandle<()>)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.spawn_trimmed(api, config, None)
    }

    /// [`Watch::spawn`], with `trim` applied to every object before it is stored.
    pub(super) fn spawn_trimmed<K>(
        self,
        api: Api<Lenient<K>>,
        config: watcher::Config,
        trim: Option<Trim<K>>,
    ) -> (Store<Lenient<K>>, JoinHandle<()>)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let (reader, writer) = reflector::store::<Lenient<K>>();
        let store = reader.clone();
        let task = tokio::spawn(self.run(api, config, trim, reader, writer));
        (store, task)
    }

    /// [`Watch::spawn`] for a kind whose CRD may be missing (see the module docs and
    /// [`super::optional`]): until the kind can be listed its store is left unlisted, or
    /// listed and empty when the [`verdict`] says it counts as none; asked again every `retry`
    /// (every [`WAIT_RETRY`] at most while in doubt).
    pub(super) fn spawn_optional<K>(
        self,
        api: Api<Lenient<K>>,
        config: watcher::Config,
        mode: Optional,
        retry: std::time::Duration,
    ) -> (Store<Lenient<K>>, JoinHandle<()>)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let (reader, mut writer) = reflector::store::<Lenient<K>>();
        let store = reader.clone();
        let task = tokio::spawn(async move {
            let mut said = None;
            let mut none = false;
            loop {
                let why = match verdict(mode, probe(&api).await) {
                    Verdict::Watch => break,
                    Verdict::None(why) => {
                        if !none {
                            writer.apply_watcher_event(&Event::Init);
                            writer.apply_watcher_event(&Event::InitDone);
                            none = true;
                        }
                        why
                    }
                    Verdict::Wait(why) => why,
                };
                if said != Some(why) {
                    let state = if none {
                        "treated as none until it can be listed"
                    } else {
                        "not listed yet: the controller waits for it"
                    };
                    warn!(kind = self.kind.as_str(), reason = why, "{state}");
                    said = Some(why);
                }
                let pause = if none { retry } else { retry.min(WAIT_RETRY) };
                tokio::time::sleep(pause).await;
            }
            self.run(api, config, None, reader, writer).await;
        });
        (store, task)
    }

    /// Feeds one kind's watch into its store and the change channel until the channel closes.
    async fn run<K>(
        self,
        api: Api<Lenient<K>>,
        config: watcher::Config,
        trim: Option<Trim<K>>,
        reader: Store<Lenient<K>>,
        mut writer: reflector::store::Writer<Lenient<K>>,
    ) where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let mut stream = watch_stream(api, config).default_backoff().boxed();
        let mut listed = false;
        let label = kind_label(self.kind.as_str());
        while let Some(event) = stream.next().await {
            let mut event = match event {
                Ok(e) => e,
                Err(e) => {
                    warn!(kind = self.kind.as_str(), error = %e, "watch failed; retrying with backoff");
                    continue;
                }
            };
            event = event.modify(Lenient::strip);
            if let Some(trim) = &trim {
                event = event.modify(|o| trim(o));
            }
            self.metrics.watch_events.get_or_create(&label).inc();
            let relevance = match &event {
                Event::Apply(o) => {
                    self.report_malformed(o);
                    let old = reader.get(&ObjectRef::from_obj(o));
                    // A Secret or ConfigMap no Gateway references, before and after,
                    // changes nothing a compile reads (nor does a new one).
                    match &old {
                        // Nothing can live in a namespace before it exists: its objects
                        // bring their own events.
                        None if self.kind == Kind::Namespace => None,
                        _ if !unreferenced(o.meta()) => {
                            Some(relevance(self.kind, old.as_deref(), o))
                        }
                        Some(old) if !unreferenced(old.meta()) => {
                            Some(relevance(self.kind, Some(old), o))
                        }
                        _ => None,
                    }
                }
                Event::Delete(o) if unreferenced(o.meta()) => None,
                Event::Delete(_) => Some(base_relevance(self.kind)),
                Event::InitApply(o) => {
                    self.report_malformed(o);
                    None
                }
                Event::Init => None,
                Event::InitDone => {
                    listed = true;
                    debug!(kind = self.kind.as_str(), "listed");
                    Some(Relevance::Full)
                }
            };
            writer.apply_watcher_event(&event);
            if let (true, Some(relevance), Event::Apply(o) | Event::Delete(o)) =
                (listed, relevance, &event)
            {
                let m = o.meta();
                debug!(
                    kind = self.kind.as_str(),
                    namespace = m.namespace.as_deref().unwrap_or(""),
                    name = m.name.as_deref().unwrap_or(""),
                    ?relevance,
                    "changed"
                );
            }
            if let (true, Some(relevance)) = (listed, relevance) {
                let change = Change {
                    kind: self.kind,
                    relevance,
                };
                if self.tx.send(change).is_err() {
                    return;
                }
            }
        }
    }

    fn report_malformed<K: Resource<DynamicType = ()> + Clone>(&self, o: &Lenient<K>) {
        if let Lenient::Malformed { metadata, error } = o {
            self.metrics
                .malformed_objects
                .get_or_create(&kind_label(self.kind.as_str()))
                .inc();
            warn!(
                kind = self.kind.as_str(),
                namespace = metadata.namespace.as_deref().unwrap_or(""),
                name = metadata.name.as_deref().unwrap_or(""),
                error = %error,
                "object does not deserialize; skipped (treated as absent)"
            );
        }
    }
}

fn base_relevance(kind: Kind) -> Relevance {
    match kind {
        Kind::EndpointSlice => Relevance::Endpoints,
        _ => Relevance::Full,
    }
}

/// What an update from `old` to `new` requires. For the Gateway API kinds a change that keeps
/// `metadata.generation`, labels, annotations and deletion timestamp is a status change.
pub fn relevance<K: Resource<DynamicType = ()> + Clone>(
    kind: Kind,
    old: Option<&Lenient<K>>,
    new: &Lenient<K>,
) -> Relevance {
    let gateway_api = matches!(
        kind,
        Kind::GatewayClass
            | Kind::Gateway
            | Kind::HttpRoute
            | Kind::GrpcRoute
            | Kind::TlsRoute
            | Kind::TcpRoute
            | Kind::UdpRoute
            | Kind::ListenerSet
            | Kind::BackendTlsPolicy
            | Kind::ReferenceGrant
            | Kind::RateLimitPolicy
            | Kind::AuthPolicy
            | Kind::ClientPolicy
            | Kind::BackendPolicy
            | Kind::CachePolicy
            | Kind::BackendTrafficPolicy
            | Kind::GatewayParameters
    );
    match old {
        Some(old @ Lenient::Ok(_)) if gateway_api && matches!(new, Lenient::Ok(_)) => {
            let (a, b) = (old.meta(), new.meta());
            if a.generation == b.generation
                && a.labels == b.labels
                && a.annotations == b.annotations
                && a.deletion_timestamp == b.deletion_timestamp
            {
                Relevance::Status
            } else {
                Relevance::Full
            }
        }
        _ => base_relevance(kind),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn route(generation: i64, status: &str) -> Lenient<HttpRoute> {
        Lenient::from_value(json!({
            "metadata": {"name": "r", "namespace": "n", "generation": generation},
            "spec": {},
            "status": {"parents": [{"controllerName": status, "parentRef": {"name": "g"}, "conditions": []}]},
        }))
    }

    #[test]
    fn a_status_only_update_needs_no_compile() {
        let (a, b) = (route(1, "x/a"), route(1, "x/b"));
        assert_eq!(relevance(Kind::HttpRoute, Some(&a), &b), Relevance::Status);
        assert_eq!(
            relevance(Kind::HttpRoute, Some(&a), &route(2, "x/a")),
            Relevance::Full
        );
        assert_eq!(relevance(Kind::HttpRoute, None, &a), Relevance::Full);
        let grpc = |generation: i64, status: &str| -> Lenient<GrpcRoute> {
            Lenient::from_value(json!({
                "metadata": {"name": "g", "namespace": "n", "generation": generation},
                "spec": {},
                "status": {"parents": [{"controllerName": status, "parentRef": {"name": "g"}, "conditions": []}]},
            }))
        };
        let (a, b) = (grpc(1, "x/a"), grpc(1, "x/b"));
        assert_eq!(relevance(Kind::GrpcRoute, Some(&a), &b), Relevance::Status);
    }

    #[test]
    fn endpoint_slices_take_the_fast_way() {
        let s: Lenient<EndpointSlice> = Lenient::from_value(
            json!({"metadata": {"name": "s"}, "addressType": "IPv4", "endpoints": []}),
        );
        assert_eq!(
            relevance(Kind::EndpointSlice, Some(&s), &s),
            Relevance::Endpoints
        );
        let bad: Lenient<HttpRoute> = Lenient::from_value(json!({"spec": {"rules": 1}}));
        assert_eq!(
            relevance(Kind::HttpRoute, Some(&route(1, "a")), &bad),
            Relevance::Full
        );
    }
}
