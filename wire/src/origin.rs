//! An origin URL — `http[s]://host[:port][/base]` — read one way by everything that takes one:
//! replay's targets, capture's upstream and shadow candidates, the OTLP exporter's endpoint
//! and the spans' `server.address`. A host is required; credentials in the URL and a query
//! are refused (nothing here would send them); the path is a prefix put before each
//! request's own, kept without its trailing `/`.

use std::fmt;

/// A parsed origin URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `https://` (else `http://`).
    pub https: bool,
    /// The host, an IPv6 address without its brackets.
    pub host: String,
    /// The port given, else the default the reader asked for, else the scheme's.
    pub port: u16,
    /// `host[:port]` as given.
    pub authority: String,
    /// Path prefix put before each request's path, without a trailing `/` (empty: none).
    pub base_path: String,
}

/// Why a URL is not an origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginError {
    /// Not a URL at all.
    NotAUrl,
    /// No scheme.
    Scheme,
    /// A scheme other than http or https.
    UnsupportedScheme,
    /// No host.
    NoHost,
    /// `user:password@` in the URL.
    Credentials,
    /// A `?query`.
    Query,
    /// A port that is not a number.
    Port,
}

impl OriginError {
    /// What is wrong, in a few words.
    pub fn why(self) -> &'static str {
        match self {
            OriginError::NotAUrl => "not a URL",
            OriginError::Scheme => "needs http:// or https://",
            OriginError::UnsupportedScheme => "only http and https are supported",
            OriginError::NoHost => "needs a host",
            OriginError::Credentials => "credentials in the URL are not supported",
            OriginError::Query => "a query string is not supported",
            OriginError::Port => "the port is not a number",
        }
    }
}

impl fmt::Display for OriginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.why())
    }
}

impl std::error::Error for OriginError {}

impl Origin {
    /// Parses `url`; a port not given is the scheme's (80, 443).
    pub fn parse(url: &str) -> Result<Origin, OriginError> {
        Origin::parse_or_port(url, None)
    }

    /// Parses `url`; a port not given is `default_port`, else the scheme's.
    pub fn parse_or_port(url: &str, default_port: Option<u16>) -> Result<Origin, OriginError> {
        let uri: http::Uri = url.trim().parse().map_err(|_| OriginError::NotAUrl)?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(_) => return Err(OriginError::UnsupportedScheme),
            None => return Err(OriginError::Scheme),
        };
        let auth = uri.authority().ok_or(OriginError::NoHost)?;
        if auth.as_str().contains('@') {
            return Err(OriginError::Credentials);
        }
        if uri.query().is_some() {
            return Err(OriginError::Query);
        }
        let host = auth.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(OriginError::NoHost);
        }
        // What follows the host: nothing, or `:` and a port number.
        let after_host = &auth.as_str()[auth.host().len()..];
        if !after_host.is_empty() && auth.port_u16().is_none() {
            return Err(OriginError::Port);
        }
        let port = auth
            .port_u16()
            .or(default_port)
            .unwrap_or(if https { 443 } else { 80 });
        Ok(Origin {
            https,
            host: host.to_string(),
            port,
            authority: auth.as_str().to_string(),
            base_path: uri.path().trim_end_matches('/').to_string(),
        })
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        if self.https {
            "https"
        } else {
            "http"
        }
    }

    /// `host:port`, the host in brackets when it is an IPv6 address.
    pub fn host_port(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_parse_one_way() {
        let o = Origin::parse("http://127.0.0.1:8000").unwrap();
        assert_eq!(
            (o.https, o.host.as_str(), o.port, o.base_path.as_str()),
            (false, "127.0.0.1", 8000, "")
        );
        let o = Origin::parse("https://api.example.com/proxy/").unwrap();
        assert_eq!(
            (o.https, o.port, o.base_path.as_str()),
            (true, 443, "/proxy")
        );
        assert_eq!(o.authority, "api.example.com");
        let o = Origin::parse_or_port("http://[::1]/otlp", Some(4318)).unwrap();
        assert_eq!((o.host.as_str(), o.port), ("::1", 4318));
        assert_eq!(o.host_port(), "[::1]:4318");
        for (bad, why) in [
            ("ftp://x", OriginError::UnsupportedScheme),
            ("127.0.0.1:4318", OriginError::Scheme),
            ("http://:4318", OriginError::NoHost),
            ("http://x:port", OriginError::Port),
            ("http://u:p@x", OriginError::Credentials),
            ("http://x/?a=1", OriginError::Query),
            ("not a url", OriginError::NotAUrl),
        ] {
            assert_eq!(Origin::parse(bad), Err(why), "{bad}");
        }
    }
}
