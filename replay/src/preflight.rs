//! The pre-flight of a target, before anything is sent: what it serves (its models and
//! version), and whether a path prefix given with its URL is where it serves the API.

use std::time::Duration;

use crate::client::Client;
use crate::config::Target;
use crate::error::ReplayError;
use crate::output::TargetInfo;

/// Asks the target for its models and version. Unreachable is an error: nothing can run.
pub async fn discover(client: &Client, target: &Target) -> Result<TargetInfo, ReplayError> {
    let (status, body) = client
        .get("/v1/models")
        .await
        .map_err(|e| ReplayError::Target {
            target: target.name.clone(),
            message: format!("unreachable: {e}{}", tls_hint(&e)),
        })?;
    let mut info = TargetInfo::default();
    if status == 200 {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
            if let Some(data) = v.get("data").and_then(|d| d.as_array()) {
                info.models = data
                    .iter()
                    .filter_map(|m| m.get("id")?.as_str().map(String::from))
                    .collect();
            }
        }
    }
    if let Ok((200, body)) = client.get("/version").await {
        info.version = serde_json::from_slice(&body).ok();
    }
    Ok(info)
}

/// What to do about a TLS handshake that read plain HTTP: an `https://` target that speaks
/// `http://` (rustls reads the HTTP answer as a corrupt TLS record).
fn tls_hint(e: &str) -> &'static str {
    if e.contains("InvalidContentType") || e.contains("corrupt message") {
        " (the target answered in plain HTTP, not TLS: give its URL with http:// instead of https://)"
    } else {
        ""
    }
}

/// The pre-flight of a target with a path prefix: when `{prefix}/v1/models` lists no model
/// but the server's own `/v1/models` does, the prefix is wrong and every request would fail,
/// so nothing runs (a gateway that serves the API under its prefix lists models there).
pub(crate) async fn check_prefix(
    ep: &crate::config::Endpoint,
    opts: &crate::config::RequestOptions,
    target: &Target,
) -> Result<(), ReplayError> {
    let origin = crate::config::Endpoint {
        base_path: String::new(),
        ..ep.clone()
    };
    let client = Client::new(&origin, opts, Duration::from_secs(10))?;
    let lists_models = |body: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("data")?.as_array().map(|d| !d.is_empty()))
            .unwrap_or(false)
    };
    match client.get("/v1/models").await {
        Ok((200, body)) if lists_models(&body) => Err(ReplayError::Target {
            target: target.name.clone(),
            message: format!(
                "{prefix}/v1/models lists no model, but /v1/models at the server's root does: \
                 the path prefix {prefix} looks wrong (every request would fail); give the base \
                 URL without it, e.g. {scheme}://{host}",
                prefix = ep.base_path,
                scheme = if ep.https { "https" } else { "http" },
                host = ep.authority,
            ),
        }),
        _ => Ok(()),
    }
}
