//! TLS material: the listener's certificate and key, and the roots trusted for an https
//! upstream (the web PKI by default, or a private CA bundle). rustls with the ring provider.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsFiles;
use crate::error::{ConfigError, ProxyError, Result};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(path: &Path, reason: impl std::fmt::Display) -> ProxyError {
    ProxyError::Tls {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_err(path, e))?;
    if certs.is_empty() {
        return Err(tls_err(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// The listener's server configuration (ALPN h2 and http/1.1).
pub(crate) fn server_config(files: &TlsFiles) -> Result<rustls::ServerConfig> {
    let certs = load_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| tls_err(&files.key, e))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(&files.cert, e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls_err(&files.key, e))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The upstream client configuration: `ca` (PEM bundle) or the web PKI roots.
pub(crate) fn client_config(ca: Option<&Path>) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            for c in load_certs(path)? {
                roots.add(c).map_err(|e| tls_err(path, e))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::TlsClient(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(cfg)
}
