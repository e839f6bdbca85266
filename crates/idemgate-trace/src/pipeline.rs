//! The export pipeline, configured the way every OpenTelemetry SDK is: by the standard variables.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::SpanExporter;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::Layer;

use crate::TARGET;

/// The OTLP transport (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `grpc`: the collector's port 4317.
    Grpc,
    /// `http/protobuf` (the specification's default): `POST {endpoint}/v1/traces`, port 4318.
    HttpProtobuf,
}

/// Why traces could not be set up as the environment asks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// A variable asks for something idemgate cannot do.
    #[error("{var}={value} is not supported: {supported}")]
    Unsupported {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What would work.
        supported: &'static str,
    },
    /// The exporter could not be built (a malformed endpoint or header).
    #[error("failed to set up the OTLP trace exporter: {0}")]
    Exporter(String),
    /// Another `tracing` subscriber is installed for the whole process already.
    #[error("failed to export traces: another tracing subscriber is installed in this process")]
    SubscriberTaken,
}

/// Whether, and how, the environment `get` reads asks for traces: `None` when no OTLP endpoint is
/// set (traces are off unless an operator points them somewhere), when `OTEL_SDK_DISABLED=true`,
/// or when `OTEL_TRACES_EXPORTER=none`.
fn protocol_in(get: impl Fn(&str) -> Option<String>) -> Result<Option<Protocol>, TraceError> {
    let set = |var: &str| get(var).filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match set("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => {
            return Err(TraceError::Unsupported {
                var: "OTEL_TRACES_EXPORTER",
                value: other.to_owned(),
                supported: "idemgate exports over OTLP (`otlp`) or not at all (`none`)",
            })
        }
    }
    if set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
        && set("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
    {
        return Ok(None);
    }
    let (var, value) = match set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
        Some(v) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", v),
        None => match set("OTEL_EXPORTER_OTLP_PROTOCOL") {
            Some(v) => ("OTEL_EXPORTER_OTLP_PROTOCOL", v),
            None => return Ok(Some(Protocol::HttpProtobuf)),
        },
    };
    match value.trim() {
        "grpc" => Ok(Some(Protocol::Grpc)),
        "http/protobuf" => Ok(Some(Protocol::HttpProtobuf)),
        _ => Err(TraceError::Unsupported {
            var,
            value,
            supported: "use `http/protobuf` or `grpc`",
        }),
    }
}

/// The service name when the environment names none (`OTEL_SERVICE_NAME` or `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`).
fn resource(default_service: &str) -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let builder = Resource::builder();
    match named {
        true => builder.build(),
        false => builder
            .with_service_name(default_service.to_owned())
            .build(),
    }
}

/// The export pipeline: spans batched (`OTEL_BSP_*`) and sent over OTLP from threads of its own,
/// so a slow or absent collector never holds a call up. Dropping it sends what is left.
pub struct Tracing {
    provider: Option<SdkTracerProvider>,
    /// gRPC's client needs a Tokio runtime; its own, so exporting never depends on (or stalls)
    /// a door's runtime, which may be single-threaded and busy shutting down.
    runtime: Option<tokio::runtime::Runtime>,
    protocol: Protocol,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing")
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

impl Tracing {
    /// The pipeline the standard variables ask for, or `None` when they ask for none (see the
    /// crate's documentation); `default_service` names the service when the environment does not.
    ///
    /// # Errors
    /// [`TraceError`] when a variable asks for what idemgate cannot do, or the exporter cannot be
    /// built from them.
    pub fn from_env(default_service: &str) -> Result<Option<Tracing>, TraceError> {
        let Some(protocol) = protocol_in(|var| std::env::var(var).ok())? else {
            return Ok(None);
        };
        let default_service = default_service.to_owned();
        // Built on a thread of its own: neither client may be built, or later dropped, on a
        // thread that runs a Tokio runtime's tasks.
        std::thread::spawn(move || Tracing::build(protocol, &default_service))
            .join()
            .unwrap_or_else(|_| {
                Err(TraceError::Exporter(
                    "the exporter's set-up panicked".into(),
                ))
            })
            .map(Some)
    }

    fn build(protocol: Protocol, default_service: &str) -> Result<Tracing, TraceError> {
        let failed =
            |e: opentelemetry_otlp::ExporterBuildError| TraceError::Exporter(e.to_string());
        // The HTTP exporter builds its own reqwest client: with HTTPS in the build, it needs
        // the process's rustls provider.
        idemgate_kit::tls::install_crypto_provider();
        let (exporter, runtime) = match protocol {
            Protocol::HttpProtobuf => (
                SpanExporter::builder()
                    .with_http()
                    .build()
                    .map_err(failed)?,
                None,
            ),
            Protocol::Grpc => {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("idemgate-otlp")
                    .enable_all()
                    .build()
                    .map_err(|e| TraceError::Exporter(e.to_string()))?;
                let exporter = {
                    let _in = runtime.enter();
                    SpanExporter::builder()
                        .with_tonic()
                        .build()
                        .map_err(failed)?
                };
                (exporter, Some(runtime))
            }
        };
        let provider = SdkTracerProvider::builder()
            .with_resource(resource(default_service))
            .with_batch_exporter(exporter)
            .build();
        Ok(Tracing {
            provider: Some(provider),
            runtime,
            protocol,
        })
    }

    /// The transport in use.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The layer that exports idemgate's spans (those with the target [`TARGET`]) and no other.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let tracer = self
            .provider
            .as_ref()
            .expect("the provider lives as long as the pipeline")
            .tracer("idemgate");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_target(false)
            .with_threads(false)
            .with_level(false)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.target() == TARGET
            }))
    }

    /// Sends every span ended so far and waits for the collector to take them (or for the
    /// exporter's timeout): for a process about to exit.
    pub fn flush(&self) {
        if let Some(provider) = &self.provider {
            let provider = provider.clone();
            // Off the caller's thread, which may be a runtime's.
            let _ = std::thread::spawn(move || provider.force_flush()).join();
        }
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        let (provider, runtime) = (self.provider.take(), self.runtime.take());
        // Shut down (sending what is left) and drop the clients on a thread of their own: the
        // caller may be inside a runtime, where neither may block nor be dropped.
        let _ = std::thread::spawn(move || {
            if let Some(provider) = provider {
                let _ = provider.shutdown();
            }
            drop(runtime);
        })
        .join();
    }
}

/// Installs, for the whole process, a subscriber that exports idemgate's spans when the
/// environment asks for traces (for doors that log nothing themselves: `idemgate exec`, the Python
/// and Node packages). Keep the returned pipeline alive as long as calls are made.
///
/// # Errors
/// As [`Tracing::from_env`], and [`TraceError::SubscriberTaken`] when another subscriber is
/// installed already.
pub fn install(default_service: &str) -> Result<Option<Tracing>, TraceError> {
    let Some(tracing) = Tracing::from_env(default_service)? else {
        return Ok(None);
    };
    let subscriber = tracing_subscriber::registry().with(tracing.layer());
    tracing::subscriber::set_global_default(subscriber).map_err(|_| TraceError::SubscriberTaken)?;
    Ok(Some(tracing))
}

/// The process's pipeline for the in-process doors (the Python and Node packages), installed at
/// the first call: whether spans are exported.
static PROCESS: std::sync::OnceLock<Result<Option<Tracing>, String>> = std::sync::OnceLock::new();

/// Installs the process's pipeline once (as [`install`], named `default_service` unless the
/// environment names the service) and says whether spans are exported. The environment is read
/// once: every engine of the process shares the pipeline.
///
/// # Errors
/// The message of the [`TraceError`] that stopped it, every time it is asked.
pub fn install_for_process(default_service: &str) -> Result<bool, String> {
    match PROCESS.get_or_init(|| install(default_service).map_err(|e| e.to_string())) {
        Ok(pipeline) => Ok(pipeline.is_some()),
        Err(e) => Err(e.clone()),
    }
}

/// Sends the process's spans ended so far (see [`Tracing::flush`]): for an in-process door's
/// exit hook, since a static pipeline is never dropped.
pub fn flush_process() {
    if let Some(Ok(Some(tracing))) = PROCESS.get() {
        tracing.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protocol(vars: &[(&str, &str)]) -> Result<Option<Protocol>, TraceError> {
        protocol_in(|var| {
            vars.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn traces_are_off_without_an_endpoint() {
        assert!(protocol(&[]).unwrap().is_none());
        assert!(protocol(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])
            .unwrap()
            .is_none());
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")];
        assert_eq!(protocol(&on).unwrap(), Some(Protocol::HttpProtobuf));
        let disabled = [on[0], ("OTEL_SDK_DISABLED", "TRUE")];
        assert!(protocol(&disabled).unwrap().is_none());
        let none = [on[0], ("OTEL_TRACES_EXPORTER", "none")];
        assert!(protocol(&none).unwrap().is_none());
    }

    #[test]
    fn the_traces_variables_come_before_the_general_ones() {
        let vars = [
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:4317",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ];
        assert_eq!(protocol(&vars).unwrap(), Some(Protocol::Grpc));
    }

    #[test]
    fn what_cannot_be_done_is_refused_by_name() {
        let json = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ];
        let e = protocol(&json).unwrap_err().to_string();
        assert!(e.contains("OTEL_EXPORTER_OTLP_PROTOCOL=http/json"), "{e}");
        let zipkin = [("OTEL_TRACES_EXPORTER", "zipkin")];
        let e = protocol(&zipkin).unwrap_err().to_string();
        assert!(e.contains("OTEL_TRACES_EXPORTER=zipkin"), "{e}");
    }
}
