//! An OTLP/HTTP receiver on 127.0.0.1 for tests: decodes every POST to `/v1/traces` and
//! `/v1/metrics` with the official protobuf definitions (`opentelemetry-proto`) and keeps
//! the spans and metrics, or stalls (reads requests, never answers) to play a receiver that
//! hangs. It stops when dropped.

use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::Metric;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// What the receiver got.
#[derive(Debug, Default)]
pub struct Received {
    /// Every span, in arrival order, with its resource's `service.name`.
    pub spans: Vec<(String, Span)>,
    /// Every metric, in arrival order.
    pub metrics: Vec<Metric>,
    /// POSTs that did not decode, or went to another path.
    pub bad: Vec<String>,
    /// The headers of every request (lowercase names).
    pub headers: Vec<Vec<(String, String)>>,
}

/// The receiver; stops when dropped.
pub struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Received>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Answers every POST 200.
    pub fn start() -> Receiver {
        Self::spawn(false)
    }

    /// Reads every request and never answers (until dropped).
    pub fn stalled() -> Receiver {
        Self::spawn(true)
    }

    fn spawn(stall: bool) -> Receiver {
        let l = TcpListener::bind("127.0.0.1:0").expect("binding the receiver");
        let addr = l.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Received::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, s) = (got.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let mut held = Vec::new();
            for c in l.incoming() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(mut c) = c else { continue };
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                if let Some((path, headers, body)) = read_request(&mut c) {
                    decode(&g, &path, headers, &body);
                    if stall {
                        held.push(c);
                        continue;
                    }
                    let _ = c.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    );
                }
            }
        });
        Receiver {
            addr,
            got,
            stop,
            handle: Some(handle),
        }
    }

    /// `http://127.0.0.1:PORT`, for `--otlp-endpoint`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What was received so far.
    pub fn received(&self) -> std::sync::MutexGuard<'_, Received> {
        self.got.lock().unwrap()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

type Request = (String, Vec<(String, String)>, Vec<u8>);

fn read_request(c: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = c.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split_whitespace().nth(1)?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())?;
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = c.read(&mut chunk).ok().filter(|n| *n > 0)?;
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    Some((path, headers, body))
}

fn decode(got: &Mutex<Received>, path: &str, headers: Vec<(String, String)>, body: &[u8]) {
    let mut g = got.lock().unwrap();
    g.headers.push(headers);
    match path {
        "/v1/traces" => match ExportTraceServiceRequest::decode(body) {
            Ok(r) => {
                for rs in r.resource_spans {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|k| k.key == "service.name")
                        .and_then(|k| match k.value.as_ref()?.value.as_ref()? {
                            opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s) => {
                                Some(s.clone())
                            }
                            _ => None,
                        })
                        .unwrap_or_default();
                    for ss in rs.scope_spans {
                        for sp in ss.spans {
                            g.spans.push((service.clone(), sp));
                        }
                    }
                }
            }
            Err(e) => g.bad.push(format!("{path}: {e}")),
        },
        "/v1/metrics" => match ExportMetricsServiceRequest::decode(body) {
            Ok(r) => {
                for rm in r.resource_metrics {
                    for sm in rm.scope_metrics {
                        g.metrics.extend(sm.metrics);
                    }
                }
            }
            Err(e) => g.bad.push(format!("{path}: {e}")),
        },
        other => g.bad.push(format!("POST to {other}")),
    }
}

/// The value of attribute `key` of `span`, when it has one.
fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValueKind> {
    span.attributes
        .iter()
        .find(|k| k.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()
}

/// The string value of attribute `key` of `span`.
pub fn attr_str<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key)? {
        AnyValueKind::StringValue(v) => Some(v),
        _ => None,
    }
}

/// The integer value of attribute `key` of `span`.
pub fn attr_int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key)? {
        AnyValueKind::IntValue(v) => Some(*v),
        _ => None,
    }
}

/// The double value of attribute `key` of `span`.
pub fn attr_f64(span: &Span, key: &str) -> Option<f64> {
    match attr(span, key)? {
        AnyValueKind::DoubleValue(v) => Some(*v),
        _ => None,
    }
}
