//! The proxy's configuration, checked once: [`ProxyConfig::validate`] turns it into the
//! [`ValidatedProxyConfig`] that [`crate::start`] takes, holding what checking it parsed —
//! the upstream URL (scheme, authority, path prefix), the session header's name, the
//! listener's TLS configuration and the roots trusted upstream — so nothing is checked or
//! parsed again when the proxy starts.

use std::sync::Arc;

use http::header::{HeaderName, HeaderValue};

use crate::config::tls;
use crate::config::{ProxyConfig, ShadowConfig};
use crate::error::{ConfigError, Result, Setting};

/// Header values that are credentials: never recorded, logged or used as a label.
pub const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "api-key",
    "x-api-key",
    "cookie",
    "set-cookie",
];

/// The parsed upstream base URL.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    pub(crate) scheme: http::uri::Scheme,
    pub(crate) authority: http::uri::Authority,
    /// The path prefix, without a trailing `/` (empty: none).
    pub(crate) base_path: String,
}

impl Upstream {
    /// Parses the upstream URL: `http://` or `https://`, a host, no credentials, no query.
    pub(crate) fn parse(url: &str) -> Result<Upstream, ConfigError> {
        let bad = |why| ConfigError::Upstream {
            url: url.to_string(),
            why,
        };
        let o = wire::origin::Origin::parse(url).map_err(|e| bad(e.why()))?;
        let authority = o
            .authority
            .parse()
            .map_err(|_| bad(wire::origin::OriginError::NoHost.why()))?;
        Ok(Upstream {
            scheme: if o.https {
                http::uri::Scheme::HTTPS
            } else {
                http::uri::Scheme::HTTP
            },
            authority,
            base_path: o.base_path,
        })
    }
}

/// A shadow candidate as [`validate_shadow`] accepted it.
#[derive(Debug, Clone)]
pub(crate) struct ValidTarget {
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) upstream: Upstream,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) model: Option<String>,
}

/// Headers a candidate's `--shadow-header` may not set: capture frames the request itself.
const FRAMING: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
];

/// Checks the shadow settings: at least one candidate, each named `[A-Za-z0-9._-]+` once,
/// with a URL as `--upstream` takes, its headers valid (none that frames the request), the
/// sample in (0, 1], the in-flight limit and the timeout positive.
pub(crate) fn validate_shadow(cfg: &ShadowConfig) -> Result<Vec<ValidTarget>, ConfigError> {
    let bad = |flag, value: &str, why: &str| ConfigError::Shadow {
        flag,
        value: value.to_string(),
        why: why.to_string(),
    };
    if cfg.targets.is_empty() {
        return Err(bad("--shadow", "", "needs at least one NAME=URL"));
    }
    if !(cfg.sample > 0.0 && cfg.sample <= 1.0) {
        return Err(bad(
            "--shadow-sample",
            &cfg.sample.to_string(),
            "must be in (0, 1]",
        ));
    }
    if cfg.max_in_flight == 0 {
        return Err(bad("--shadow-max-in-flight", "0", "must be > 0"));
    }
    if cfg.timeout.is_zero() {
        return Err(bad("--shadow-timeout", "0", "must be > 0"));
    }
    let mut out: Vec<ValidTarget> = Vec::new();
    for t in &cfg.targets {
        let shown = format!("{}={}", t.name, t.url);
        let name_ok = !t.name.is_empty()
            && t.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(bad(
                "--shadow",
                &shown,
                "NAME must be letters, digits, '.', '_' or '-'",
            ));
        }
        if out.iter().any(|o| o.name == t.name) {
            return Err(bad("--shadow", &shown, "NAME given twice"));
        }
        let upstream = Upstream::parse(&t.url).map_err(|e| match e {
            ConfigError::Upstream { why, .. } => bad("--shadow", &shown, why),
            other => other,
        })?;
        let mut headers = Vec::with_capacity(t.headers.len());
        for (n, v) in &t.headers {
            let shown = format!("{}:{n}={v}", t.name);
            let name = HeaderName::from_bytes(n.as_bytes())
                .map_err(|_| bad("--shadow-header", &shown, "not a header name"))?;
            if FRAMING.contains(&name.as_str()) {
                return Err(bad(
                    "--shadow-header",
                    &shown,
                    "capture sets this header itself",
                ));
            }
            let value = HeaderValue::from_str(v)
                .map_err(|_| bad("--shadow-header", &shown, "not a header value"))?;
            headers.push((name, value));
        }
        if t.model.as_deref() == Some("") {
            return Err(bad("--shadow-model", &t.name, "the model name is empty"));
        }
        out.push(ValidTarget {
            name: t.name.clone(),
            url: t.url.clone(),
            upstream,
            headers,
            model: t.model.clone(),
        });
    }
    Ok(out)
}

/// A [`ProxyConfig`] that [`ProxyConfig::validate`] accepted, with what it parsed;
/// immutable from here on.
#[derive(Debug, Clone)]
pub struct ValidatedProxyConfig {
    cfg: ProxyConfig,
    upstream: Upstream,
    session_header: Option<HeaderName>,
    tls: Option<Arc<rustls::ServerConfig>>,
    upstream_tls: rustls::ClientConfig,
    shadow: Vec<ValidTarget>,
}

/// A [`ValidatedProxyConfig`] taken apart by the server.
pub(crate) struct Parts {
    pub(crate) cfg: ProxyConfig,
    pub(crate) upstream: Upstream,
    pub(crate) session_header: Option<HeaderName>,
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    pub(crate) upstream_tls: rustls::ClientConfig,
    /// The shadow candidates (empty: no `--shadow`).
    pub(crate) shadow: Vec<ValidTarget>,
}

impl ValidatedProxyConfig {
    /// The configuration as given.
    pub fn config(&self) -> &ProxyConfig {
        &self.cfg
    }

    /// The upstream's authority (host and port, as the URL gave them).
    pub fn upstream_authority(&self) -> &str {
        self.upstream.authority.as_str()
    }

    /// The upstream's scheme (`http` or `https`).
    pub fn upstream_scheme(&self) -> &str {
        self.upstream.scheme.as_str()
    }

    /// The upstream URL's path prefix, without a trailing `/` (empty: none).
    pub fn upstream_path_prefix(&self) -> &str {
        &self.upstream.base_path
    }

    /// The header recorded as `session_id`, parsed.
    pub fn session_header(&self) -> Option<&HeaderName> {
        self.session_header.as_ref()
    }

    /// Whether the listener serves TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    pub(crate) fn into_parts(self) -> Parts {
        Parts {
            cfg: self.cfg,
            upstream: self.upstream,
            session_header: self.session_header,
            tls: self.tls,
            upstream_tls: self.upstream_tls,
            shadow: self.shadow,
        }
    }
}

impl ProxyConfig {
    /// Checks the configuration once, into what [`crate::start`] takes: the upstream URL
    /// parsed, the sample rate in (0, 1], sizes, the client timeouts and `threads` positive,
    /// the session header a header name that is no credential, the listener's certificate
    /// and key and the upstream's CA bundle loaded.
    pub fn validate(self) -> Result<ValidatedProxyConfig> {
        let upstream = Upstream::parse(&self.upstream)?;
        if !(self.sample_rate > 0.0 && self.sample_rate <= 1.0) {
            return Err(ConfigError::SampleRate(self.sample_rate).into());
        }
        for (setting, zero) in [
            (Setting::BlockSize, self.block_size == 0),
            (Setting::MaxFileBytes, self.max_file_bytes == 0),
            (Setting::MaxRequestBody, self.max_request_body == 0),
            (Setting::QueueCapacity, self.queue_capacity == 0),
            (Setting::MaxSseEvent, self.max_sse_event == 0),
            (Setting::ClientFirstByte, self.client.first_byte.is_zero()),
            (Setting::ClientHeader, self.client.header.is_zero()),
            (Setting::ClientKeepalive, self.client.keepalive.is_zero()),
            (Setting::ClientBody, self.client.body.is_zero()),
            (Setting::Threads, self.threads == 0),
        ] {
            if zero {
                return Err(ConfigError::Zero(setting).into());
            }
        }
        let session_header = self
            .session_header
            .as_deref()
            .map(|h| {
                let name = HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| ConfigError::SessionHeader(h.to_string()))?;
                if SECRET_HEADERS.contains(&name.as_str()) {
                    return Err(ConfigError::SecretSessionHeader(h.to_string()));
                }
                Ok(name)
            })
            .transpose()?;
        let tls = match &self.tls {
            Some(files) => Some(Arc::new(tls::server_config(files)?)),
            None => None,
        };
        let upstream_tls = tls::client_config(self.upstream_ca.as_deref())?;
        let shadow = match &self.shadow {
            Some(s) => validate_shadow(s)?,
            None => Vec::new(),
        };
        Ok(ValidatedProxyConfig {
            cfg: self,
            upstream,
            session_header,
            tls,
            upstream_tls,
            shadow,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ProxyError;
    use std::time::Duration;

    fn cfg(upstream: &str) -> ProxyConfig {
        ProxyConfig::new("127.0.0.1:0".parse().unwrap(), upstream, "/tmp/unused")
    }

    fn config_error(c: ProxyConfig) -> ConfigError {
        match c.validate() {
            Err(ProxyError::Config(e)) => e,
            other => panic!("not a configuration error: {other:?}"),
        }
    }

    #[test]
    fn validation_yields_the_parsed_upstream_and_session_header() {
        let mut c = cfg("https://gpu.example:8443/v1-proxy/");
        c.session_header = Some("X-Session".into());
        let v = c.validate().unwrap();
        assert_eq!(v.upstream_scheme(), "https");
        assert_eq!(v.upstream_authority(), "gpu.example:8443");
        assert_eq!(v.upstream_path_prefix(), "/v1-proxy");
        assert_eq!(v.session_header().unwrap().as_str(), "x-session");
        assert!(!v.tls());
    }

    #[test]
    fn each_check_names_what_it_refused() {
        for (url, why) in [
            ("gpu:8000", "needs http:// or https://"),
            ("ftp://gpu:8000", "only http and https are supported"),
            (
                "http://u:p@gpu:8000",
                "credentials in the URL are not supported",
            ),
            ("http://gpu:8000/?a=1", "a query string is not supported"),
        ] {
            assert_eq!(
                config_error(cfg(url)),
                ConfigError::Upstream {
                    url: url.into(),
                    why
                }
            );
        }
        let ok = || cfg("http://127.0.0.1:9");
        let mut c = ok();
        c.sample_rate = 0.0;
        assert_eq!(config_error(c), ConfigError::SampleRate(0.0));
        type Zero = fn(&mut ProxyConfig);
        let zeroed: [(Setting, Zero); 10] = [
            (Setting::BlockSize, |c| c.block_size = 0),
            (Setting::MaxFileBytes, |c| c.max_file_bytes = 0),
            (Setting::MaxRequestBody, |c| c.max_request_body = 0),
            (Setting::QueueCapacity, |c| c.queue_capacity = 0),
            (Setting::MaxSseEvent, |c| c.max_sse_event = 0),
            (Setting::ClientFirstByte, |c| {
                c.client.first_byte = Duration::ZERO
            }),
            (Setting::ClientHeader, |c| c.client.header = Duration::ZERO),
            (Setting::ClientKeepalive, |c| {
                c.client.keepalive = Duration::ZERO
            }),
            (Setting::ClientBody, |c| c.client.body = Duration::ZERO),
            (Setting::Threads, |c| c.threads = 0),
        ];
        for (setting, zero) in zeroed {
            let mut c = ok();
            zero(&mut c);
            assert_eq!(config_error(c), ConfigError::Zero(setting));
        }
        let mut c = ok();
        c.session_header = Some("bad header".into());
        assert_eq!(
            config_error(c),
            ConfigError::SessionHeader("bad header".into())
        );
        let mut c = ok();
        c.session_header = Some("Authorization".into());
        assert_eq!(
            config_error(c),
            ConfigError::SecretSessionHeader("Authorization".into())
        );
        let mut c = ok();
        c.tls = Some(crate::TlsFiles {
            cert: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
        });
        assert!(matches!(c.validate(), Err(ProxyError::Tls { .. })));
    }

    fn target(name: &str, url: &str) -> crate::ShadowTarget {
        crate::ShadowTarget {
            name: name.into(),
            url: url.into(),
            headers: vec![],
            model: None,
        }
    }

    #[test]
    fn validation_names_the_flag_and_what_it_refused() {
        let ok = crate::ShadowConfig::new(vec![target("cand", "http://127.0.0.1:9")]);
        assert_eq!(validate_shadow(&ok).unwrap()[0].name, "cand");
        let why = |c: &crate::ShadowConfig| match validate_shadow(c) {
            Err(ConfigError::Shadow { flag, why, .. }) => (flag, why),
            other => panic!("{other:?}"),
        };
        let mut c = ok.clone();
        c.targets.push(target("cand", "http://127.0.0.1:10"));
        assert_eq!(why(&c), ("--shadow", "NAME given twice".into()));
        let c = crate::ShadowConfig::new(vec![target("a b", "http://x:1")]);
        assert_eq!(why(&c).0, "--shadow");
        let c = crate::ShadowConfig::new(vec![target("a", "ftp://x:1")]);
        assert_eq!(
            why(&c),
            ("--shadow", "only http and https are supported".into())
        );
        let mut c = ok.clone();
        c.sample = 0.0;
        assert_eq!(why(&c).0, "--shadow-sample");
        let mut c = ok.clone();
        c.max_in_flight = 0;
        assert_eq!(why(&c).0, "--shadow-max-in-flight");
        c.max_in_flight = 1;
        c.timeout = std::time::Duration::ZERO;
        assert_eq!(why(&c).0, "--shadow-timeout");
        let mut c = ok.clone();
        c.targets[0].headers.push(("Host".into(), "x".into()));
        assert_eq!(
            why(&c),
            ("--shadow-header", "capture sets this header itself".into())
        );
        let mut c = ok;
        c.targets[0].headers.push(("bad name".into(), "x".into()));
        assert_eq!(why(&c), ("--shadow-header", "not a header name".into()));
    }
}
