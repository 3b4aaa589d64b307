//! A fleet of captures as one trace (issue 56): where each row was captured
//! ([`CaptureInfo`]: the capture's id and start on every row, its clock against a reference
//! in the file metadata under [`crate::schema::meta::CAPTURES`]), and the link keys every
//! capture row carries ([`LinkKeys`], the `link_*` columns) so that a pass over the rows of
//! several captures links them as one capture would have.
//!
//! The link keys are the values capture's linkers look up and leave (`proxy::linking`),
//! hashed under the trace's key (the key of `prefix_hashes`, [`crate::keyed`]): captures
//! given the same `--hash-key-file` write keys that compare; under `perf` none are written.
//! What each capture contributed to a trace is counted by [`crate::captures`].

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// What capture's linkers look up and leave for one row (see the `link_*` columns of
/// [`crate::schema::col`]); every value keyed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LinkKeys {
    /// The chat keys it looks up, oldest first (None: not chat-shaped).
    #[serde(default)]
    pub chat: Option<Vec<u64>>,
    /// The chat key it leaves for its successor.
    #[serde(default)]
    pub answer: Option<u64>,
    /// Its response's tool call ids.
    #[serde(default)]
    pub calls: Option<Vec<u64>>,
    /// Its response's tool call argument strings.
    #[serde(default)]
    pub args: Option<Vec<u64>>,
    /// The tool call id whose results it carries.
    #[serde(default)]
    pub result: Option<u64>,
    /// The first user message of a conversation opening here.
    #[serde(default)]
    pub opening: Option<u64>,
    /// Who sent it.
    #[serde(default)]
    pub client: Option<u64>,
    /// Its Responses response's id.
    #[serde(default)]
    pub response: Option<u64>,
    /// The `previous_response_id` it names.
    #[serde(default)]
    pub previous_response: Option<u64>,
}

impl LinkKeys {
    /// Whether the row carries any key (a capture of 1.6 or later, not under `perf`).
    pub fn any(&self) -> bool {
        *self != LinkKeys::default()
    }

    /// Calls `f` on every key the row carries (to re-key them: [`crate::rekey`]).
    pub fn for_each_value(&mut self, mut f: impl FnMut(&mut u64)) {
        for list in [&mut self.chat, &mut self.calls, &mut self.args] {
            list.iter_mut().flatten().for_each(&mut f);
        }
        for one in [
            &mut self.answer,
            &mut self.result,
            &mut self.opening,
            &mut self.client,
            &mut self.response,
            &mut self.previous_response,
        ] {
            one.iter_mut().for_each(&mut f);
        }
    }

    /// A rough size in bytes.
    pub fn approx_bytes(&self) -> usize {
        let list = |l: &Option<Vec<u64>>| l.as_ref().map_or(0, |v| 8 * v.len());
        list(&self.chat) + list(&self.calls) + list(&self.args) + 56
    }
}

/// A capture process: its id and start (on every row it writes) and its clock as it read it
/// at start (in each file's metadata).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureInfo {
    /// `capture_id` of its rows ([`capture_id`]).
    pub id: String,
    /// When the process started, µs since the epoch by its own clock.
    pub started_us: i64,
    /// Its clock against a reference.
    pub clock: Clock,
}

/// A capture's clock against a reference time, as read at its start; unknown is said, never
/// guessed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Clock {
    /// Where the estimate came from (`chronyc tracking`); None: no estimate.
    pub source: Option<String>,
    /// The reference it was measured against (chrony's reference id and name).
    pub reference: Option<String>,
    /// This clock minus the reference, µs.
    pub offset_us: Option<i64>,
    /// The bound on the offset's error, µs (chrony: root delay / 2 + root dispersion).
    pub error_us: Option<i64>,
    /// Why the offset is unknown, when it is.
    pub unknown: Option<String>,
}

impl Clock {
    /// An unknown offset, and why.
    pub fn unknown(why: impl Into<String>) -> Clock {
        Clock {
            unknown: Some(why.into()),
            ..Clock::default()
        }
    }

    /// The offset from `chronyc tracking`'s output: `System time : X seconds slow|fast of
    /// NTP time` (slow: this clock is behind, a negative offset), the error bound from the
    /// root delay and dispersion; unknown when chrony is not synchronised or the output has
    /// no system time.
    pub fn from_chronyc_tracking(text: &str) -> Clock {
        let field = |name: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        let seconds = |v: &str| -> Option<f64> { v.split_whitespace().next()?.parse().ok() };
        let us = |s: f64| (s * 1e6).round() as i64;
        if field("Leap status").is_some_and(|s| s.contains("Not synchronised")) {
            return Clock::unknown("chronyc tracking: not synchronised");
        }
        let Some(system) = field("System time") else {
            return Clock::unknown("chronyc tracking: no System time line");
        };
        let Some(x) = seconds(&system) else {
            return Clock::unknown(format!("chronyc tracking: System time {system:?}"));
        };
        let offset = if system.contains(" slow ") {
            -x
        } else if system.contains(" fast ") {
            x
        } else {
            return Clock::unknown(format!("chronyc tracking: System time {system:?}"));
        };
        let delay = field("Root delay").and_then(|v| seconds(&v));
        let dispersion = field("Root dispersion").and_then(|v| seconds(&v));
        Clock {
            source: Some("chronyc tracking".into()),
            reference: field("Reference ID"),
            offset_us: Some(us(offset)),
            error_us: delay.zip(dispersion).map(|(d, r)| us(d / 2.0 + r)),
            unknown: None,
        }
    }

    /// One line for a human.
    pub fn describe(&self) -> String {
        match (self.offset_us, &self.unknown) {
            (Some(o), _) => format!(
                "{o:+} µs{} against {} ({})",
                self.error_us.map_or(String::new(), |e| format!(" ± {e}")),
                self.reference.as_deref().unwrap_or("its reference"),
                self.source.as_deref().unwrap_or("?")
            ),
            (None, Some(why)) => format!("unknown ({why})"),
            (None, None) => "unknown".into(),
        }
    }
}

/// A capture's id: `flag` (`--capture-id`), else the pod's name (`POD_NAME`, or `HOSTNAME`
/// where Kubernetes set it: `KUBERNETES_SERVICE_HOST` is set), else `host:port` of its
/// listener (`host` from `hostname`, else the listen address). `env` reads the environment.
pub fn capture_id(
    flag: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
    hostname: Option<String>,
    listen: SocketAddr,
) -> String {
    let set = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    if let Some(f) = flag.filter(|f| !f.trim().is_empty()) {
        return f.to_string();
    }
    if let Some(p) = set("POD_NAME") {
        return p;
    }
    if set("KUBERNETES_SERVICE_HOST").is_some() {
        if let Some(h) = set("HOSTNAME") {
            return h;
        }
    }
    let host = hostname
        .filter(|h| !h.trim().is_empty())
        .map_or_else(|| listen.ip().to_string(), |h| h.trim().to_string());
    format!("{host}:{}", listen.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capture_id_is_the_flag_the_pod_or_host_and_port() {
        let listen: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let pod = env(&[("POD_NAME", "capture-2"), ("HOSTNAME", "h")]);
        assert_eq!(capture_id(Some("c9"), pod, None, listen), "c9");
        assert_eq!(capture_id(None, pod, None, listen), "capture-2");
        let k8s = env(&[
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("HOSTNAME", "cap-7f"),
        ]);
        assert_eq!(capture_id(None, k8s, None, listen), "cap-7f");
        // Outside Kubernetes HOSTNAME is the machine's, not a pod's: host and port.
        let shell = env(&[("HOSTNAME", "laptop")]);
        assert_eq!(
            capture_id(None, shell, Some("laptop\n".into()), listen),
            "laptop:8080"
        );
        assert_eq!(capture_id(None, shell, None, listen), "0.0.0.0:8080");
    }

    #[test]
    fn chronyc_tracking_gives_the_offset_or_says_it_is_unknown() {
        let text = "Reference ID    : A9FEA97B (169.254.169.123)\n\
                    Stratum         : 4\n\
                    Ref time (UTC)  : Mon Dec 07 20:00:00 2026\n\
                    System time     : 0.000012345 seconds slow of NTP time\n\
                    Last offset     : -0.000001234 seconds\n\
                    Root delay      : 0.000400 seconds\n\
                    Root dispersion : 0.000150 seconds\n\
                    Leap status     : Normal\n";
        let c = Clock::from_chronyc_tracking(text);
        assert_eq!(c.offset_us, Some(-12));
        assert_eq!(c.error_us, Some(350));
        assert_eq!(c.reference.as_deref(), Some("A9FEA97B (169.254.169.123)"));
        assert!(c.describe().starts_with("-12 µs ± 350 against A9FEA97B"));
        let fast = text.replace("slow", "fast");
        assert_eq!(Clock::from_chronyc_tracking(&fast).offset_us, Some(12));
        let lost = text.replace("Normal", "Not synchronised");
        let c = Clock::from_chronyc_tracking(&lost);
        assert_eq!(c.offset_us, None);
        assert!(
            c.describe().contains("not synchronised"),
            "{}",
            c.describe()
        );
        assert_eq!(Clock::from_chronyc_tracking("").offset_us, None);
        let round = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Clock>(&round).unwrap(), c);
    }
}
