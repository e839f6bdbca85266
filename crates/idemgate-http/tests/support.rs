//! A gateway in this process on 127.0.0.1:0, a fake upstream, and captured logs.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::task::JoinHandle;

pub(crate) const ACME: &str = "acme-token-0123456789abcdef";
pub(crate) const OTHER: &str = "other-token-0123456789abcdef";

/// Everything every gateway in this test binary logged.
pub(crate) fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = Capture(buf.clone());
        let _ = tracing::subscriber::set_global_default(idemgate_http::logging::subscriber(
            move || writer.clone(),
        ));
        buf
    })
}

#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A running gateway.
pub(crate) struct Gw {
    pub(crate) url: String,
    pub(crate) addr: SocketAddr,
    pub(crate) http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    pub(crate) task: Option<JoinHandle<Result<(), idemgate_http::Error>>>,
    pub(crate) dir: tempfile::TempDir,
}

/// The configuration of a test gateway: two tenants on the memory store, plus `extra` (tables
/// after `[server]`), with `server` lines added to `[server]`.
pub(crate) fn config_text(server: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
store = "memory:"
{server}

[[tenants]]
id = "acme"
token_sha256 = "{}"

[[tenants]]
id = "other"
token_sha256 = "{}"

{extra}
"#,
        idemgate_http::token_sha256(ACME),
        idemgate_http::token_sha256(OTHER),
    )
}

pub(crate) async fn start(server: &str, extra: &str) -> Gw {
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(server, extra).replace(
        "AUDIT",
        &dir.path().join("audit.jsonl").display().to_string(),
    );
    start_config(idemgate_http::Config::parse(&text).unwrap(), dir).await
}

pub(crate) async fn start_config(config: idemgate_http::Config, dir: tempfile::TempDir) -> Gw {
    logs();
    let server = idemgate_http::bind(config).await.unwrap();
    let addr = server.local_addr();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(server.serve(async {
        let _ = rx.await;
    }));
    Gw {
        url: format!("http://{addr}"),
        addr,
        http: client(),
        stop: Some(tx),
        task: Some(task),
        dir,
    }
}

pub(crate) fn client() -> reqwest::Client {
    idemgate_kit::tls::client_builder()
        .no_proxy()
        // The gateway speaks plain HTTP: skip loading the system's root certificates, which
        // takes about 100 ms per client in a debug build.
        .tls_certs_only([])
        .build()
        .unwrap()
}

impl Gw {
    pub(crate) fn post(&self, path: &str, token: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.url))
            .bearer_auth(token)
            .header("content-type", "application/json")
    }

    pub(crate) fn get(&self, path: &str, token: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", self.url))
            .bearer_auth(token)
    }

    /// The JSON body of a `GET`.
    pub(crate) async fn get_json(&self, path: &str, token: &str) -> Value {
        let res = self.get(path, token).send().await.unwrap();
        res.json().await.unwrap()
    }

    /// `begin` with a key and a JSON body.
    pub(crate) async fn begin(&self, tool: &str, key: &str, body: &str) -> reqwest::Response {
        self.post(&format!("/v1/tools/{tool}/begin"), ACME)
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
            .await
            .unwrap()
    }

    /// The Prometheus text of `/metrics`.
    pub(crate) async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Asks the gateway to stop; `task` ends once it did.
    pub(crate) fn stop_signal(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// The body of a problem answer, checked for its content type, status and type.
pub(crate) async fn problem(res: reqwest::Response, status: u16, name: &str) -> Value {
    assert_eq!(res.status().as_u16(), status, "status");
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "problem content type"
    );
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        body["type"],
        format!("https://idemgate.dev/problems/{name}"),
        "{body}"
    );
    assert_eq!(body["status"], status);
    body
}

pub(crate) fn header<'a>(res: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}

/// What the fake upstream saw.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) calls: HashMap<String, usize>,
    pub(crate) keys: Vec<Option<String>>,
    /// The request bodies, in order.
    pub(crate) bodies: Vec<String>,
}

/// A fake downstream. Paths: `/ok` (200, `{"n": calls so far, "tenant_body": body}`),
/// `/slow` (the same after 400 ms), `/gate` (the same once the test opens the gate),
/// `/bad` (400), `/busy` (429 with Retry-After 7), `/fail` (500), `/hang` (answers after 5 s),
/// `/flaky` (500 the first time, then like `/ok`); and verify URLs: `/applied` (the call happened,
/// with the result `{"charge": "ch_verified"}`), `/not_applied`, `/unknown`.
pub(crate) struct Upstream {
    pub(crate) url: String,
    pub(crate) seen: Arc<Mutex<Seen>>,
    arrived: watch::Receiver<usize>,
    gate: Arc<Semaphore>,
}

/// The fake downstream's state.
#[derive(Clone)]
struct Shared {
    seen: Arc<Mutex<Seen>>,
    /// Bumped after every call is counted.
    arrived: Arc<watch::Sender<usize>>,
    /// `/gate` answers once a permit is added.
    gate: Arc<Semaphore>,
}

impl Upstream {
    pub(crate) fn calls(&self, path: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .calls
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// Waits until `path` has been called `n` times (the calls reached the upstream), for at most
    /// 10 s.
    pub(crate) async fn wait_for_calls(&self, path: &str, n: usize) {
        let mut rx = self.arrived.clone();
        tokio::time::timeout(
            Duration::from_secs(10),
            rx.wait_for(|_| self.calls(path) >= n),
        )
        .await
        .unwrap_or_else(|_| panic!("{path} was not called {n} times within 10 s"))
        .unwrap();
    }

    /// Lets one call waiting at `/gate` answer.
    pub(crate) fn open_gate(&self) {
        self.gate.add_permits(1);
    }
}

/// The fake downstream's routes, and the `Upstream` that watches them at `url`.
fn upstream_app(url: String) -> (Router, Upstream) {
    let (arrived, rx) = watch::channel(0);
    let shared = Shared {
        seen: Arc::new(Mutex::new(Seen::default())),
        arrived: Arc::new(arrived),
        gate: Arc::new(Semaphore::new(0)),
    };
    let app = Router::new()
        .route("/{path}", post(handle))
        .with_state(shared.clone());
    let up = Upstream {
        url,
        seen: shared.seen,
        arrived: rx,
        gate: shared.gate,
    };
    (app, up)
}

pub(crate) async fn upstream() -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (app, up) = upstream_app(format!("http://{addr}"));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    up
}

/// The fake downstream over HTTPS on 127.0.0.1, its certificate issued by a CA made here and now;
/// also returns the CA certificate (PEM), which nothing trusts unless told to.
pub(crate) async fn https_upstream() -> (Upstream, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair,
    };
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "idemgate test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut leaf_params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca).unwrap();
    let tls = tokio_rustls::rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (app, up) = upstream_app(format!("https://{addr}"));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // A client that does not trust the certificate hangs up here.
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(stream),
                        hyper_util::service::TowerToHyperService::new(app),
                    )
                    .await;
            });
        }
    });
    (up, ca.pem())
}

async fn handle(
    State(shared): State<Shared>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let n = {
        let mut s = shared.seen.lock().unwrap();
        s.keys.push(
            headers
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned()),
        );
        s.bodies.push(body.clone());
        let n = s.calls.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    shared.arrived.send_modify(|total| *total += 1);
    let ok = || {
        (
            StatusCode::OK,
            [("content-type", "application/json")],
            json!({"n": n, "body": body}).to_string(),
        )
            .into_response()
    };
    match path.as_str() {
        "ok" => ok(),
        "slow" => {
            tokio::time::sleep(Duration::from_millis(400)).await;
            ok()
        }
        "gate" => {
            shared.gate.acquire().await.unwrap().forget();
            ok()
        }
        "bad" => (
            StatusCode::BAD_REQUEST,
            [("content-type", "text/plain")],
            format!("card declined {n}"),
        )
            .into_response(),
        "busy" => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "7")],
            "slow down",
        )
            .into_response(),
        "fail" => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        "flaky" if n == 1 => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        "flaky" => ok(),
        "applied" => axum::Json(json!({"status": "applied", "result": {"charge": "ch_verified"}}))
            .into_response(),
        "not_applied" | "unknown" => axum::Json(json!({"status": path})).into_response(),
        "hang" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            ok()
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A loopback address nothing listens on, for as long as the value lives (`{dead}` formats as
/// its `http://` URL). Its port stays bound but is never listened on, so a connection is refused;
/// a port merely freed was once handed to a listener the same test started next (the verifier
/// test then read that server's 404 where it expected a refused connection).
pub(crate) struct ClosedPort {
    url: String,
    _bound: tokio::net::TcpSocket,
}

impl std::fmt::Display for ClosedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

pub(crate) async fn closed_port() -> ClosedPort {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let url = format!("http://{}", socket.local_addr().unwrap());
    ClosedPort {
        url,
        _bound: socket,
    }
}
