//! Compression metrics (module `lifecycle::compress`): responses compressed and the bytes
//! into and out of the encoders, by algorithm (three values). Registered with the others
//! under `tollgate_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tollgate_api::client::Encoding;

/// Labels of the compression metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlgorithmLabels {
    algorithm: &'static str,
}

/// The families, and each algorithm's handles resolved once.
#[derive(Debug)]
pub(crate) struct CompressionMetrics {
    responses: Family<AlgorithmLabels, Counter>,
    bytes_in: Family<AlgorithmLabels, Counter>,
    bytes_out: Family<AlgorithmLabels, Counter>,
    /// Indexed as [`Encoding::ALL`].
    handles: [CompressionCounters; 3],
}

/// One algorithm's counters.
#[derive(Debug, Clone, Default)]
pub(crate) struct CompressionCounters {
    responses: Counter,
    bytes_in: Counter,
    bytes_out: Counter,
}

impl CompressionCounters {
    /// A response whose body is compressed.
    pub(crate) fn response(&self) {
        self.responses.inc();
    }

    /// A compressed body's bytes, before and after, when it ends.
    pub(crate) fn bytes(&self, before: u64, after: u64) {
        self.bytes_in.inc_by(before);
        self.bytes_out.inc_by(after);
    }
}

impl CompressionMetrics {
    pub(crate) fn new() -> Self {
        let (responses, bytes_in, bytes_out) = (
            Family::<AlgorithmLabels, Counter>::default(),
            Family::<AlgorithmLabels, Counter>::default(),
            Family::<AlgorithmLabels, Counter>::default(),
        );
        let handles = Encoding::ALL.map(|e| {
            let l = AlgorithmLabels {
                algorithm: e.as_str(),
            };
            CompressionCounters {
                responses: responses.get_or_create(&l).clone(),
                bytes_in: bytes_in.get_or_create(&l).clone(),
                bytes_out: bytes_out.get_or_create(&l).clone(),
            }
        });
        Self {
            responses,
            bytes_in,
            bytes_out,
            handles,
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "compressed_responses",
            "Responses whose body the proxy compressed, by algorithm (zstd, br, gzip)",
            self.responses.clone(),
        );
        registry.register(
            "compression_in_bytes",
            "Bytes of response bodies before compression, by algorithm",
            self.bytes_in.clone(),
        );
        registry.register(
            "compression_out_bytes",
            "Bytes of response bodies after compression, by algorithm",
            self.bytes_out.clone(),
        );
    }

    /// The handles of `e`.
    pub(crate) fn of(&self, e: Encoding) -> CompressionCounters {
        let i = Encoding::ALL.iter().position(|x| *x == e).unwrap_or(0);
        self.handles[i].clone()
    }
}
