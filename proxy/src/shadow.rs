//! Shadow traffic (`--shadow NAME=URL`): recorded production generation requests mirrored to
//! candidate endpoints, their answers measured like production's and discarded.
//!
//! The production path only decides and hands over: whether shadowing is on (an atomic, see
//! `POST /shadow/off` in [`crate::admin`]), the sample draw when it needs no parsing (by request
//! id, or by the session header's value), a slot in the bounded hand-over queue, and one spawn
//! onto the shadow thread's runtime. Everything else runs on that thread (`capture-shadow`, at
//! the recorder threads' lower priority): the draw by a chat request's conversation root, the
//! model rewrite, the candidate's connections (a [`Forward`] per candidate, its own pool) and the
//! response, observed by the same [`ObservedBody`] as production's and read to its end. A
//! candidate that is slow, failing or unreachable costs only its own shadow requests: each
//! candidate has at most `max_in_flight` in flight, and a request that finds them all busy, or
//! the hand-over queue full, is not mirrored and is counted (`llmreplay_shadow_dropped_total`).
//!
//! Each mirrored request is a row of its own in the same trace (same writer): its own
//! `request_id` (the production row's, `-NAME`), `target` = the candidate's name,
//! `pair_request_id` = the production row's `request_id`, timed from the production request's
//! t0 (so the two TTFTs compare directly). When the production request's client cancels, its
//! shadows are cancelled at that moment (outcome `client_cancelled`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Either, Full};
use serde_json::{Map, Value};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use trace_format::tracectx::{TraceContext, TRACEPARENT};
use trace_format::{Outcome, TraceRecord};

use crate::capture_metrics::Metrics;
use crate::config::validated::{ValidTarget, SECRET_HEADERS};
use crate::config::{Privacy, ProxyConfig, ShadowConfig, ShadowSampleBy};
use crate::recording::observe::Strip;
use crate::recording::request::RequestInfo;
use crate::recording::row::{ObservedBody, Recorder, Recording};
use crate::recording::writer::Sink;
use crate::upstream::route::{ClientAddr, Forward};

/// Why a mirrored request did not complete, as `llmreplay_shadow_dropped_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// The hand-over queue to the shadow thread was full: not mirrored (no row).
    QueueFull,
    /// The candidate had `max_in_flight` requests in flight: not sent (no row).
    MaxInFlight,
    /// No connection to the candidate (row: `upstream_error`).
    Connect,
    /// No response head, or a gap in its body, within capture's timeouts, or no end of the
    /// answer within `--shadow-timeout` (row: `timeout`).
    Timeout,
    /// Any other failure of the candidate's connection or stream (row: `upstream_error`).
    UpstreamError,
    /// The production request's client cancelled it (row: `client_cancelled`).
    Cancelled,
    /// Cut by capture's shutdown (row: `client_cancelled`).
    Shutdown,
}

impl Dropped {
    const ALL: [Dropped; 7] = [
        Dropped::QueueFull,
        Dropped::MaxInFlight,
        Dropped::Connect,
        Dropped::Timeout,
        Dropped::UpstreamError,
        Dropped::Cancelled,
        Dropped::Shutdown,
    ];

    fn name(self) -> &'static str {
        match self {
            Dropped::QueueFull => "queue_full",
            Dropped::MaxInFlight => "max_in_flight",
            Dropped::Connect => "connect",
            Dropped::Timeout => "timeout",
            Dropped::UpstreamError => "upstream_error",
            Dropped::Cancelled => "cancelled",
            Dropped::Shutdown => "shutdown",
        }
    }

    /// Why a finished shadow row did not complete (`None`: it did, with any status).
    fn of(r: &TraceRecord) -> Option<Dropped> {
        let error = r.error.as_deref().unwrap_or("");
        match r.outcome {
            Outcome::Ok | Outcome::HttpError => None,
            Outcome::ClientCancelled if error.contains("shutdown") => Some(Dropped::Shutdown),
            Outcome::ClientCancelled => Some(Dropped::Cancelled),
            Outcome::Timeout => Some(Dropped::Timeout),
            Outcome::UpstreamError if r.status.is_none() && error.contains("(Connect)") => {
                Some(Dropped::Connect)
            }
            Outcome::UpstreamError => Some(Dropped::UpstreamError),
        }
    }
}

/// The error of a shadow row whose production request's client cancelled it.
const CANCELLED: &str = "its production request was cancelled by the client";

/// One candidate: its route, what it gets instead of the client's credentials, and its counts.
struct Candidate {
    name: String,
    forward: Forward,
    headers: Vec<(HeaderName, HeaderValue)>,
    model: Option<String>,
    slots: Arc<Semaphore>,
    max_in_flight: usize,
    sent: AtomicU64,
    completed: AtomicU64,
    dropped: [AtomicU64; Dropped::ALL.len()],
}

impl Candidate {
    fn drop_one(&self, why: Dropped) {
        let i = Dropped::ALL.iter().position(|d| *d == why).unwrap_or(0);
        self.dropped[i].fetch_add(1, Relaxed);
    }

    /// Counts a finished shadow row.
    fn count(&self, r: &TraceRecord) {
        match Dropped::of(r) {
            None => {
                self.completed.fetch_add(1, Relaxed);
            }
            Some(d) => self.drop_one(d),
        }
    }
}

/// A production request to mirror, as the serving thread handed it over.
struct Job {
    id: String,
    t0: Instant,
    arrival: i64,
    path: String,
    session: Option<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    client: Option<ClientAddr>,
    body: Bytes,
    strip: Strip,
    /// The sample was drawn already (else by the body, on the shadow thread).
    drawn: bool,
}

/// Shadow traffic of a running proxy (in [`crate::serving::state::Shared`]).
pub(crate) struct Shadow {
    on: AtomicBool,
    sample: f64,
    by: ShadowSampleBy,
    candidates: Vec<Arc<Candidate>>,
    /// The shadow rows' recorder: the trace's writer, metrics of their own (production's
    /// `/metrics` and drain do not count shadow requests).
    recorder: Arc<Recorder>,
    handle: tokio::runtime::Handle,
    /// Jobs handed to the shadow thread and not yet started there.
    queued: AtomicUsize,
    queue_cap: usize,
    stop: watch::Sender<bool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    record_full: bool,
    /// Capture's id prefix, to start each shadow request's own trace (None: `--no-traceparent`).
    scope: Option<String>,
    idle_timeout: Duration,
    max_sse_event: usize,
    /// `--shadow-timeout`: each mirrored request's deadline, from when it is sent.
    timeout: Duration,
}

impl Shadow {
    /// Starts the shadow thread and the candidates' routes for `targets` (shadow settings
    /// `sc`), with the timeouts and TLS of the proxy's upstream.
    pub(crate) fn start(
        targets: Vec<ValidTarget>,
        sc: &ShadowConfig,
        cfg: &ProxyConfig,
        tls: &rustls::ClientConfig,
        sink: Sink,
        id_prefix: &str,
    ) -> std::io::Result<Shadow> {
        let metrics = Arc::new(Metrics::default());
        let candidates = targets
            .into_iter()
            .map(|t| {
                let mut c = cfg.clone();
                c.upstream = t.url.clone();
                c.upstream_h2 = false;
                c.threads = 1;
                Arc::new(Candidate {
                    forward: Forward::new(t.upstream, tls.clone(), &c, metrics.clone()),
                    name: t.name,
                    headers: t.headers,
                    model: t.model,
                    slots: Arc::new(Semaphore::new(sc.max_in_flight)),
                    max_in_flight: sc.max_in_flight,
                    sent: AtomicU64::new(0),
                    completed: AtomicU64::new(0),
                    dropped: Default::default(),
                })
            })
            .collect::<Vec<_>>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        let (stop, mut stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("capture-shadow".into())
            .spawn(move || {
                crate::runtime::threads::background();
                rt.block_on(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                });
                // What is left is dropped with the runtime: its rows finish, cancelled.
                drop(rt);
            })?;
        Ok(Shadow {
            on: AtomicBool::new(true),
            sample: sc.sample,
            by: sc.sample_by,
            queue_cap: (sc.max_in_flight * candidates.len()).max(64),
            candidates,
            recorder: Arc::new(Recorder {
                metrics,
                sink,
                hard_stop: AtomicBool::new(false),
                idle: tokio::sync::Notify::new(),
                phases: None,
            }),
            handle,
            queued: AtomicUsize::new(0),
            stop,
            thread: Mutex::new(Some(thread)),
            record_full: cfg.privacy == Privacy::Full,
            scope: cfg.traceparent.then(|| id_prefix.to_string()),
            idle_timeout: cfg.idle_timeout,
            max_sse_event: cfg.max_sse_event,
            timeout: sc.timeout,
        })
    }

    /// Turns mirroring on or off (admin `POST /shadow/on`, `/shadow/off`); requests already
    /// mirrored go on.
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Relaxed);
    }

    /// Hands the production request `rec` (head `parts`, the body it sends upstream `body`,
    /// what to strip from its stream `strip`) to the shadow thread when shadowing is on and
    /// the sample draws it. Never waits.
    pub(crate) fn mirror(
        self: &Arc<Self>,
        rec: &mut Recording,
        parts: &http::request::Parts,
        body: &Bytes,
        strip: Strip,
    ) {
        if !self.on.load(Relaxed) {
            return;
        }
        let key = match self.by {
            ShadowSampleBy::Request => Some(key_of(rec.rec.request_id.as_bytes())),
            ShadowSampleBy::Session => rec.rec.session_id.as_deref().map(|s| key_of(s.as_bytes())),
        };
        if key.is_some_and(|k| !drawn(k, self.sample)) {
            return;
        }
        if self.queued.fetch_add(1, Relaxed) >= self.queue_cap {
            self.queued.fetch_sub(1, Relaxed);
            for c in &self.candidates {
                c.drop_one(Dropped::QueueFull);
            }
            return;
        }
        let (cancel_tx, cancel) = watch::channel(false);
        rec.on_finish = Some(Box::new(move |r: &TraceRecord| {
            if r.outcome == Outcome::ClientCancelled {
                let _ = cancel_tx.send(true);
            }
        }));
        let job = Job {
            id: rec.rec.request_id.clone(),
            t0: rec.t0,
            arrival: rec.rec.arrival_time_us,
            path: rec.rec.endpoint.clone(),
            session: rec.rec.session_id.clone(),
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
            client: parts.extensions.get::<ClientAddr>().copied(),
            body: body.clone(),
            strip,
            drawn: key.is_some(),
        };
        let this = self.clone();
        self.handle.spawn(async move {
            this.queued.fetch_sub(1, Relaxed);
            this.dispatch(job, cancel);
        });
    }

    /// On the shadow thread: the draw by the body when it is still to be made, then one task
    /// per candidate with a free slot.
    fn dispatch(self: Arc<Self>, job: Job, cancel: watch::Receiver<bool>) {
        if !job.drawn {
            let key = chat_root(&job.body).unwrap_or_else(|| key_of(job.id.as_bytes()));
            if !drawn(key, self.sample) {
                return;
            }
        }
        let job = Arc::new(job);
        for c in &self.candidates {
            let Ok(slot) = c.slots.clone().try_acquire_owned() else {
                c.drop_one(Dropped::MaxInFlight);
                continue;
            };
            c.sent.fetch_add(1, Relaxed);
            let (this, c, job, mut cancel) = (self.clone(), c.clone(), job.clone(), cancel.clone());
            let mut stop = self.stop.subscribe();
            tokio::spawn(async move {
                tokio::select! {
                    _ = this.one(&c, &job, slot) => {}
                    true = async { cancel.wait_for(|c| *c).await.is_ok() } => {}
                    true = async { stop.wait_for(|s| *s).await.is_ok() } => {}
                }
            });
        }
    }

    /// Sends `job` to candidate `c` and reads the answer to its end, within `--shadow-timeout`
    /// (past it: a `timeout` row, the candidate's); the row finishes as production's do
    /// (dropped unfinished: `client_cancelled`).
    async fn one(&self, c: &Arc<Candidate>, job: &Job, slot: OwnedSemaphorePermit) {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let body = match &c.model {
            Some(m) => with_model(&job.body, m).unwrap_or_else(|| job.body.clone()),
            None => job.body.clone(),
        };
        let info = RequestInfo::parse(&body);
        let mut rec = TraceRecord::new(
            format!("{}-{}", job.id, c.name),
            job.arrival,
            job.path.clone(),
        );
        rec.target = Some(c.name.clone());
        rec.pair_request_id = Some(job.id.clone());
        rec.session_id = job.session.clone();
        rec.request_bytes = body.len() as i64;
        rec.model = info.model;
        rec.stream = info.stream;
        rec.max_tokens = info.max_tokens;
        if self.record_full {
            rec.body = Some(String::from_utf8_lossy(&body).into_owned());
        }
        let mut recording = Recording::new(self.recorder.clone(), job.t0, rec, true);
        recording.cancel_note = Some(CANCELLED);
        let counted = c.clone();
        recording.on_finish = Some(Box::new(move |r: &TraceRecord| {
            counted.count(r);
            drop(slot);
        }));
        let mut headers = job.headers.clone();
        for h in SECRET_HEADERS {
            headers.remove(*h);
        }
        headers.remove(TRACEPARENT);
        for (n, v) in &c.headers {
            headers.insert(n.clone(), v.clone());
        }
        if let Some(scope) = &self.scope {
            let ctx = TraceContext::derive(scope, &recording.rec.request_id);
            if let Ok(v) = HeaderValue::from_bytes(&ctx.value()) {
                headers.insert(TRACEPARENT, v);
                ctx.fill(&mut recording.rec);
                recording.trace_started = true;
            }
        }
        let (mut parts, ()) = Request::new(()).into_parts();
        parts.method = job.method.clone();
        parts.uri = job.uri.clone();
        parts.headers = headers;
        if let Some(a) = job.client {
            parts.extensions.insert(a);
        }
        let send = async {
            match c
                .forward
                .send_lean(&parts, &body, &mut recording.phases)
                .await
            {
                Some(sent) => Some(sent),
                None => {
                    let len = body.len();
                    let up = c.forward.request(
                        &parts,
                        Either::Left(Full::new(body.clone())),
                        Some(len),
                    )?;
                    Some(c.forward.send_generation(up).await)
                }
            }
        };
        let sent = match tokio::time::timeout_at(deadline, send).await {
            Ok(Some(sent)) => sent,
            Ok(None) => {
                recording.finish(Outcome::HttpError, Some("bad path".into()), Instant::now());
                return;
            }
            Err(_) => {
                let why = format!(
                    "no response head within --shadow-timeout {:?}",
                    self.timeout
                );
                recording.finish(Outcome::Timeout, Some(why), Instant::now());
                return;
            }
        };
        match sent {
            Ok((head, body)) => {
                recording.rec.status = Some(head.status.as_u16());
                let sse = head
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
                let mut observed = Box::pin(ObservedBody::new(
                    body,
                    sse,
                    job.strip,
                    recording,
                    self.idle_timeout,
                    self.max_sse_event,
                ));
                let read = async {
                    while let Some(frame) = observed.frame().await {
                        if frame.is_err() {
                            break;
                        }
                    }
                };
                if tokio::time::timeout_at(deadline, read).await.is_err() {
                    let why = format!(
                        "answer not finished within --shadow-timeout {:?}",
                        self.timeout
                    );
                    observed.as_mut().get_mut().time_out(why);
                }
            }
            Err((outcome, _, msg)) => recording.finish(outcome, Some(msg), Instant::now()),
        }
    }

    /// Stops mirroring new requests (those in flight go on).
    pub(crate) fn mirror_off(&self) {
        self.on.store(false, Relaxed);
    }

    /// Mirrored requests in flight, over every candidate.
    pub(crate) fn in_flight(&self) -> usize {
        self.candidates
            .iter()
            .map(|c| c.max_in_flight - c.slots.available_permits())
            .sum()
    }

    /// Stops mirroring and cuts what is in flight (rows `client_cancelled`, reason
    /// `shutdown`), before the trace writer closes.
    pub(crate) async fn stop(&self) {
        self.on.store(false, Relaxed);
        self.recorder.hard_stop.store(true, Relaxed);
        let _ = self.stop.send(true);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }

    /// The shadow metrics, in the Prometheus text format.
    pub(crate) fn render(&self, s: &mut String) {
        use wire::prometheus::{escape_label, head, sample, single};
        let p = "llmreplay_shadow";
        let on = format!("{p}_on");
        let help = "1 while production requests are mirrored (admin POST /shadow/off, /shadow/on).";
        single(s, &on, help, "gauge", "", u8::from(self.on.load(Relaxed)));
        type Value = fn(&Candidate) -> u64;
        let series: [(&str, &str, &str, Value); 3] = [
            (
                "sent_total",
                "counter",
                "Mirrored requests sent to each candidate.",
                |c| c.sent.load(Relaxed),
            ),
            (
                "completed_total",
                "counter",
                "Mirrored requests whose candidate's response ended (any status).",
                |c| c.completed.load(Relaxed),
            ),
            (
                "in_flight",
                "gauge",
                "Mirrored requests in flight to each candidate.",
                |c| (c.max_in_flight - c.slots.available_permits()) as u64,
            ),
        ];
        for (name, kind, help, value) in series {
            let name = format!("{p}_{name}");
            head(s, &name, help, kind);
            for c in &self.candidates {
                let target = format!("target=\"{}\"", escape_label(&c.name));
                sample(s, &name, &target, value(c));
            }
        }
        let name = format!("{p}_dropped_total");
        let help = "Mirrored requests that did not complete, by reason (queue_full and max_in_flight: never sent, no row).";
        head(s, &name, help, "counter");
        for c in &self.candidates {
            for (d, n) in Dropped::ALL.iter().zip(&c.dropped) {
                let labels = format!(
                    "target=\"{}\",reason=\"{}\"",
                    escape_label(&c.name),
                    d.name()
                );
                sample(s, &name, &labels, n.load(Relaxed));
            }
        }
    }
}

/// The sampling key of some bytes (FNV-1a, the project's one stable hash).
fn key_of(bytes: &[u8]) -> u64 {
    trace_format::fnv::fnv1a(trace_format::fnv::OFFSET, bytes)
}

/// Whether `key` falls in the sample `rate` (splitmix64 spreads similar keys).
use trace_format::fnv::drawn;

/// A chat request's conversation root: the chain hash of its messages up to its first user
/// message ([`crate::linking::sessions::chat_chain`]), the same in every turn of the conversation.
fn chat_root(body: &[u8]) -> Option<u64> {
    let obj: Map<String, Value> = serde_json::from_slice(body).ok()?;
    let messages = obj.get("messages")?.as_array()?;
    let first_user = messages
        .iter()
        .position(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    crate::linking::sessions::chat_chain(&obj)?
        .get(first_user)
        .copied()
}

/// The body with `model` in place of the client's (None: not a JSON object).
fn with_model(body: &[u8], model: &str) -> Option<Bytes> {
    let mut obj: Map<String, Value> = serde_json::from_slice(body).ok()?;
    obj.insert("model".into(), Value::String(model.to_string()));
    serde_json::to_vec(&obj).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every turn of a conversation has the same root (so a session is drawn whole); another
    /// conversation's first question gives another; a completion has none.
    #[test]
    fn a_conversation_keeps_its_root_across_turns() {
        let t1 = br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#;
        let t2 = br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]}"#;
        let other = br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"bye"}]}"#;
        assert_eq!(chat_root(t1), chat_root(t2));
        assert!(chat_root(t1).is_some());
        assert_ne!(chat_root(t1), chat_root(other));
        assert_eq!(chat_root(br#"{"prompt":"x"}"#), None);
    }

    /// The draw keeps about the rate asked for, and the same key always draws the same.
    #[test]
    fn the_draw_keeps_the_rate() {
        let n = (0..10_000u64)
            .filter(|i| drawn(key_of(format!("id-{i}").as_bytes()), 0.1))
            .count();
        assert!((800..1200).contains(&n), "{n}");
        assert_eq!(drawn(7, 0.5), drawn(7, 0.5));
        assert!(drawn(7, 1.0));
    }

    #[test]
    fn the_model_is_rewritten_and_the_rest_kept() {
        let b = with_model(br#"{"model":"a","stream":true,"x":[1]}"#, "b").unwrap();
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            (v["model"].as_str(), v["stream"].as_bool()),
            (Some("b"), Some(true))
        );
        assert_eq!(v["x"][0], 1);
        assert!(with_model(b"not json", "b").is_none());
    }

    #[test]
    fn each_outcome_has_its_reason() {
        let mut r = TraceRecord::new("x", 0, "/v1/completions");
        r.outcome = Outcome::HttpError;
        assert_eq!(Dropped::of(&r), None);
        r.outcome = Outcome::UpstreamError;
        r.error = Some("client error (Connect): refused".into());
        assert_eq!(Dropped::of(&r), Some(Dropped::Connect));
        r.status = Some(200);
        assert_eq!(Dropped::of(&r), Some(Dropped::UpstreamError));
        r.outcome = Outcome::ClientCancelled;
        r.error = Some(CANCELLED.into());
        assert_eq!(Dropped::of(&r), Some(Dropped::Cancelled));
        r.error = Some("cut by the proxy's shutdown after the drain timeout".into());
        assert_eq!(Dropped::of(&r), Some(Dropped::Shutdown));
    }
}
