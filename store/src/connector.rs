//! The HTTP client of the object stores: hyper + rustls on the ring provider instead of
//! object_store's reqwest on aws-lc-rs, whose C build adds ~1.5 min to a cold build.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpRequestBody,
    HttpResponse, HttpResponseBody, HttpService,
};
use object_store::{ClientConfigKey, ClientOptions};

/// Connects object_store to hyper + rustls (ring) instead of reqwest (aws-lc-rs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HyperConnector;

type HyperClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    HttpRequestBody,
>;

#[derive(Debug)]
struct HyperService {
    client: HyperClient,
    allow_http: bool,
    timeout: Duration,
}

impl HttpConnector for HyperConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let generic = |e: String| object_store::Error::Generic {
            store: "llmreplay",
            source: e.into(),
        };
        let allow_http = options
            .get_config_value(&ClientConfigKey::AllowHttp)
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| generic(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .build(https);
        Ok(HttpClient::new(HyperService {
            client,
            allow_http,
            timeout: Duration::from_secs(30),
        }))
    }
}

#[async_trait::async_trait]
impl HttpService for HyperService {
    async fn call(&self, req: HttpRequest) -> std::result::Result<HttpResponse, HttpError> {
        if !self.allow_http && req.uri().scheme_str() == Some("http") {
            return Err(HttpError::new(
                HttpErrorKind::Request,
                std::io::Error::other(
                    "plain http to the object store is off: set AWS_ALLOW_HTTP=true \
                     (or the store's allow_http option) for an http:// endpoint",
                ),
            ));
        }
        let res = match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Err(_) => {
                return Err(HttpError::new(
                    HttpErrorKind::Timeout,
                    std::io::Error::other("no response from the object store within 30 s"),
                ))
            }
            Ok(Err(e)) => {
                let kind = if e.is_connect() {
                    HttpErrorKind::Connect
                } else {
                    HttpErrorKind::Request
                };
                return Err(HttpError::new(kind, e));
            }
            Ok(Ok(res)) => res,
        };
        let (parts, body) = res.into_parts();
        let body =
            HttpResponseBody::new(body.map_err(|e| HttpError::new(HttpErrorKind::Interrupted, e)));
        Ok(HttpResponse::from_parts(parts, body))
    }
}
