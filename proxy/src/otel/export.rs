//! The export task. In: finished spans from the bounded queue [`super::Tracer`] fills
//! without waiting. Out: batches (up to `batch_size`, or what came within `batch_delay`)
//! sent one at a time with the OTLP exporter of `opentelemetry-otlp`; while one is being
//! sent the queue fills, and spans beyond its bound are dropped and counted by the tracer.
//! An exporter that cannot be built (logged) leaves every span dropped and counted, and so
//! does a batch the collector refuses or never answers (logged when failing starts and ends).

use opentelemetry_otlp::{SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc::Receiver;

use super::args::{Protocol, TraceSettings};

fn build(settings: &TraceSettings) -> Result<SpanExporter, opentelemetry_otlp::ExporterBuildError> {
    match settings.protocol {
        Protocol::Grpc => SpanExporter::builder()
            .with_tonic()
            .with_endpoint(settings.endpoint.clone())
            .build(),
        Protocol::Http => SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!("{}/v1/traces", settings.endpoint))
            .build(),
    }
}

pub(super) async fn run(
    settings: TraceSettings,
    mut rx: Receiver<SpanData>,
    dropped: Counter,
    service: &'static str,
) {
    let mut exporter = match build(&settings) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(endpoint = %settings.endpoint, error = %e, "tracing: cannot build the OTLP exporter; spans are dropped");
            while rx.recv().await.is_some() {
                dropped.inc();
            }
            return;
        }
    };
    exporter.set_resource(&Resource::builder_empty().with_service_name(service).build());
    let mut batch = Vec::with_capacity(settings.batch_size);
    // Logged when exporting starts failing and when it recovers, not once per batch: an
    // unreachable collector would otherwise log several lines a second under load.
    let mut failing = false;
    loop {
        if rx.recv_many(&mut batch, settings.batch_size).await == 0 {
            break;
        }
        let deadline = tokio::time::Instant::now() + settings.batch_delay;
        while batch.len() < settings.batch_size {
            let room = settings.batch_size - batch.len();
            match tokio::time::timeout_at(deadline, rx.recv_many(&mut batch, room)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let n = batch.len();
        match exporter.export(std::mem::take(&mut batch)).await {
            Err(e) => {
                dropped.inc_by(u64::try_from(n).unwrap_or(u64::MAX));
                if !failing {
                    tracing::warn!(spans = n, error = %e, "tracing: export failing; spans are dropped and counted until it recovers");
                    failing = true;
                }
            }
            Ok(()) if failing => {
                tracing::info!("tracing: export recovered");
                failing = false;
            }
            Ok(()) => {}
        }
    }
}
