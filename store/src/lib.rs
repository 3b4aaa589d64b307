//! Object storage: traces and results at URLs (`s3://bucket/prefix`, `gs://…`, `az://…`,
//! `https://…`) as well as at local paths, through the `object_store` crate.
//!
//! Credentials and endpoints come from the environment exactly as each store's own tools
//! read them (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP=true` for a plain-http endpoint such as MinIO or moto on
//! loopback; `GOOGLE_SERVICE_ACCOUNT`; `AZURE_STORAGE_ACCOUNT_NAME`, ...).
//!
//! Captures land in Hive-style partitions, `PREFIX/date=YYYY-MM-DD/hour=HH/FILE.parquet`
//! (UTC, the hour the file was started), so DuckDB, Spark or Trino read a month of captures
//! as one table with `date` and `hour` columns. A capture writes and journals locally in a
//! spool directory as always (the crash-safety of [`trace_format::writer`] is unchanged) and a
//! [`SpoolUploader`] moves each finished file to the store, deleting the local copy only once
//! the upload succeeded: a store that is down delays files, it never loses them.
//!
//! [`read_traces`] (and [`open_stream`], the same inputs read in arrival order with bounded
//! memory; [`open_stream_in`], only the rows of a time window) and [`write_trace`] are the trace reader and writer of `trace-format` for
//! inputs and outputs that may be URLs; [`write_bytes`] writes any other output (a result
//! document) to a path or a URL alike.
//!
//! The API is synchronous, like `trace-format`'s: the async store runs on one small
//! runtime of this crate's own, so callers need no runtime (and may be inside one). Errors
//! are `trace-format`'s [`Error`] (its `Store` variant for the store's own failures), so a
//! trace read from a URL fails the way one read from a path does.
#![deny(missing_docs)]

use std::future::Future;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, ObjectStoreScheme};
use trace_format::reader::{RemoteFile, RemoteFiles};
use trace_format::{FileMeta, Trace, TraceFileWriter, TraceRecord, TraceStream, Window};

mod connector;
mod uploader;

use connector::HyperConnector;
pub use trace_format::{Error, Result};
pub use uploader::{hive_partition, SpoolUploader, UploadReport};

/// URL schemes read as object-store locations; anything else is a local path.
pub const SCHEMES: &[&str] = &[
    "s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss", "http", "https",
];

/// Whether `s` names an object-store location (`s3://…` and the other [`SCHEMES`]) rather
/// than a local path.
pub fn is_url(s: &str) -> bool {
    s.split_once("://")
        .is_some_and(|(scheme, _)| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

/// A prefix or object in an object store, with the store client to reach it.
#[derive(Clone)]
pub struct ObjectLocation {
    /// As given (without a trailing `/`).
    url: String,
    /// The part of `url` before the store path (`s3://bucket`).
    base: String,
    store: Arc<dyn ObjectStore>,
    path: ObjPath,
}

impl std::fmt::Debug for ObjectLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectLocation")
            .field("url", &self.url)
            .finish()
    }
}

impl std::fmt::Display for ObjectLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

impl ObjectLocation {
    /// Parses a URL such as `s3://bucket/prefix` and builds its store client from the
    /// environment. No request is made yet.
    pub fn parse(s: &str) -> Result<ObjectLocation> {
        // `s3://b/p/` names `s3://b/p`; `s3://` stays as given, for the error message.
        let trimmed = s.trim_end_matches('/');
        let s = if trimmed.ends_with(':') { s } else { trimmed };
        let url = url::Url::parse(s).map_err(|e| Error::Invalid(format!("{s}: {e}")))?;
        let (scheme, path) = ObjectStoreScheme::parse(&url).map_err(|e| store_err(s, e))?;
        let path = ObjPath::parse(path).map_err(|e| store_err(s, e))?;
        let store: Arc<dyn ObjectStore> = match scheme {
            ObjectStoreScheme::AmazonS3 => Arc::new(
                object_store::aws::AmazonS3Builder::from_env()
                    .with_url(s)
                    .with_retry(retry())
                    .with_http_connector(HyperConnector)
                    .build()
                    .map_err(|e| store_err(s, e))?,
            ),
            ObjectStoreScheme::GoogleCloudStorage => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(s)
                    .with_retry(retry())
                    .with_http_connector(HyperConnector)
                    .build()
                    .map_err(|e| store_err(s, e))?,
            ),
            ObjectStoreScheme::MicrosoftAzure => Arc::new(
                object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(s)
                    .with_retry(retry())
                    .with_http_connector(HyperConnector)
                    .build()
                    .map_err(|e| store_err(s, e))?,
            ),
            // A plain `http://` URL typed by the user is plain http on purpose.
            ObjectStoreScheme::Http => Arc::new(
                object_store::http::HttpBuilder::new()
                    .with_url(&url[..url::Position::BeforePath])
                    .with_client_options(
                        ClientOptions::new().with_allow_http(url.scheme() == "http"),
                    )
                    .with_retry(retry())
                    .with_http_connector(HyperConnector)
                    .build()
                    .map_err(|e| store_err(s, e))?,
            ),
            other => {
                return Err(Error::Invalid(format!(
                    "{s}: {other:?} is not an object store this build reads (use a local path)"
                )))
            }
        };
        let base = match s.strip_suffix(path.as_ref()) {
            Some(b) if !path.as_ref().is_empty() => b.trim_end_matches('/').to_string(),
            _ => s.to_string(),
        };
        Ok(ObjectLocation {
            url: s.to_string(),
            base,
            store,
            path,
        })
    }

    /// The URL as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL of an object of this store.
    pub fn object_url(&self, p: &ObjPath) -> String {
        format!("{}/{}", self.base, p)
    }

    /// The location `rel` (a `/`-separated relative key) below this one.
    pub fn child(&self, rel: &str) -> Result<ObjPath> {
        let mut key = self.path.as_ref().to_string();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            if !key.is_empty() {
                key.push('/');
            }
            key.push_str(part);
        }
        ObjPath::parse(&key).map_err(|e| store_err(&self.url, e))
    }

    /// The `*.parquet` objects this location names, sorted by key: the object itself, every
    /// `*.parquet` below the prefix (recursively, so Hive partitions are included), or the
    /// matches of a glob (`s3://b/caps/date=2026-11-*/**/*.parquet`).
    pub fn list_parquet(&self) -> Result<Vec<ObjPath>> {
        let key = self.path.as_ref();
        let wild = key.find(['*', '?', '[']);
        let (prefix, pattern) = match wild {
            None => (self.path.clone(), None),
            Some(i) => {
                let literal = key[..i].rsplit_once('/').map(|(p, _)| p).unwrap_or("");
                let pattern = glob::Pattern::new(key)
                    .map_err(|e| Error::Invalid(format!("{}: invalid glob: {e}", self.url)))?;
                (ObjPath::from(literal), Some(pattern))
            }
        };
        if pattern.is_none() && key.ends_with(".parquet") {
            let store = self.store.clone();
            let p = self.path.clone();
            return match run(async move { store.head(&p).await }) {
                Ok(_) => Ok(vec![self.path.clone()]),
                Err(object_store::Error::NotFound { .. }) => Ok(Vec::new()),
                Err(e) => Err(store_err(&self.url, e)),
            };
        }
        let store = self.store.clone();
        let listed = run(async move {
            let prefix = (!prefix.as_ref().is_empty()).then_some(prefix);
            let mut stream = store.list(prefix.as_ref());
            let mut out = Vec::new();
            while let Some(meta) = stream.next().await {
                out.push(meta?.location);
            }
            Ok::<_, object_store::Error>(out)
        })
        .map_err(|e| store_err(&self.url, e))?;
        let opts = glob::MatchOptions {
            require_literal_separator: true,
            ..Default::default()
        };
        let mut out: Vec<ObjPath> = listed
            .into_iter()
            .filter(|p| p.as_ref().ends_with(".parquet"))
            .filter(|p| {
                pattern
                    .as_ref()
                    .is_none_or(|pat| pat.matches_with(p.as_ref(), opts))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// The whole content of one object.
    pub fn get(&self, p: &ObjPath) -> Result<Bytes> {
        let store = self.store.clone();
        let p2 = p.clone();
        run(async move { store.get(&p2).await?.bytes().await })
            .map_err(|e| store_err(&self.object_url(p), e))
    }

    /// Streams the object this location names into the local file `dest` (created or
    /// truncated); returns the bytes written. The whole object never sits in memory.
    pub fn download(&self, dest: &Path) -> Result<u64> {
        use std::io::Write as _;
        let store = self.store.clone();
        let p = self.path.clone();
        let url = self.url.clone();
        let dest_buf = dest.to_path_buf();
        run(async move {
            let mut file = std::io::BufWriter::new(
                std::fs::File::create(&dest_buf).map_err(|e| Error::io(&dest_buf, e))?,
            );
            let mut stream = store
                .get(&p)
                .await
                .map_err(|e| store_err(&url, e))?
                .into_stream();
            let mut n = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| store_err(&url, e))?;
                file.write_all(&chunk)
                    .map_err(|e| Error::io(&dest_buf, e))?;
                n += chunk.len() as u64;
            }
            file.flush().map_err(|e| Error::io(&dest_buf, e))?;
            Ok(n)
        })
    }

    /// Uploads the local file `local` to `key` (multipart for large files, aborted on error
    /// so no partial object is left) and returns the object's URL.
    pub fn put_file(&self, key: &ObjPath, local: &Path) -> Result<String> {
        let store = self.store.clone();
        let k = key.clone();
        let path = local.to_path_buf();
        let url = self.object_url(key);
        run(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut file = tokio::fs::File::open(&path)
                .await
                .map_err(|e| Error::io(&path, e))?;
            let mut w = object_store::buffered::BufWriter::new(store, k);
            let mut buf = vec![0u8; 8 << 20];
            let filled: std::result::Result<(), String> = async {
                loop {
                    let n = file.read(&mut buf).await.map_err(|e| e.to_string())?;
                    if n == 0 {
                        return Ok(());
                    }
                    w.put(Bytes::copy_from_slice(&buf[..n]))
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            .await;
            let result = match filled {
                // Cancels a multipart upload already begun (BufWriter refuses an abort
                // after shutdown, which cleans up itself).
                Err(message) => {
                    let _ = w.abort().await;
                    Err(message)
                }
                Ok(()) => w.shutdown().await.map_err(|e| e.to_string()),
            };
            result
                .map(|()| url.clone())
                .map_err(|message| Error::Store {
                    url: url.clone(),
                    message,
                })
        })
    }

    /// Writes `data` as the object at this location.
    pub fn put_bytes(&self, data: Bytes) -> Result<String> {
        let store = self.store.clone();
        let p = self.path.clone();
        run(async move { store.put(&p, data.into()).await })
            .map_err(|e| store_err(&self.url, e))?;
        Ok(self.url.clone())
    }
}

/// The object URL `dest` names, if it names one (a path given on the command line).
fn url_of(dest: &Path) -> Option<&str> {
    dest.to_str().filter(|s| is_url(s))
}

/// Reads traces (see [`trace_format::read_traces`]) from inputs that are local files,
/// directories and globs or object-store locations (`s3://bucket/prefix`: every `*.parquet`
/// below the prefix, Hive partitions included; an object; or a glob of keys).
pub fn read_traces<S: AsRef<str>>(inputs: &[S]) -> Result<Trace> {
    trace_format::reader::read_traces_with(inputs, &ObjectStores)
}

/// Opens traces for streaming (see [`trace_format::stream::TraceStream`]) from the inputs
/// [`read_traces`] reads: local files, directories and globs or object-store locations. An
/// object is fetched whole each time the stream reads it (once for the first pass, once per
/// pass over its records), one object at a time unless objects overlap in time.
pub fn open_stream<S: AsRef<str>>(inputs: &[S]) -> Result<TraceStream> {
    open_stream_in(inputs, Window::ALL)
}

/// [`open_stream`], reading only the rows arriving in `window` (see
/// [`TraceStream::open_in`]): an object whose rows all arrive outside it is fetched once, for
/// its footer, and never decoded.
pub fn open_stream_in<S: AsRef<str>>(inputs: &[S], window: Window) -> Result<TraceStream> {
    TraceStream::open_in(inputs, &ObjectStores, window)
}

/// The object stores as a source of trace files for [`trace_format::reader`].
struct ObjectStores;

impl RemoteFiles for ObjectStores {
    fn claims(&self, input: &str) -> bool {
        is_url(input)
    }

    fn list(&self, input: &str) -> Result<Vec<RemoteFile>> {
        let loc = ObjectLocation::parse(input)?;
        let found = loc.list_parquet()?;
        Ok(found
            .into_iter()
            .map(|key| {
                let loc = loc.clone();
                RemoteFile {
                    name: loc.object_url(&key),
                    fetch: Box::new(move || loc.get(&key)),
                }
            })
            .collect())
    }
}

/// Writes a trace file (see [`trace_format::write_trace_file`]) to `dest`: a local path, or
/// an object URL (written to a private temporary file first, then uploaded). Returns where it
/// went, for messages.
pub fn write_trace(dest: &Path, records: &[TraceRecord], meta: &FileMeta) -> Result<String> {
    let Some(url) = url_of(dest) else {
        trace_format::write_trace_file(dest, records, meta)?;
        return Ok(dest.display().to_string());
    };
    let loc = ObjectLocation::parse(url)?;
    let tmp = std::env::temp_dir().join(format!(
        "llmreplay-upload-{}-{}.parquet",
        std::process::id(),
        UPLOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let result = trace_format::write_trace_file(&tmp, records, meta)
        .and_then(|()| loc.put_file(&loc.path, &tmp));
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Writes a trace file to `dest` (a local path or an object URL) as its rows come: `fill`
/// pushes the rows into the [`TraceFileWriter`] and returns the file's metadata (known only
/// once every row is read) with its own result. An object URL is written to a private
/// temporary file first, then uploaded. Returns `fill`'s result and where the file went.
pub fn write_trace_streaming<T>(
    dest: &Path,
    fill: impl FnOnce(&mut TraceFileWriter) -> Result<(T, FileMeta)>,
) -> Result<(T, String)> {
    let Some(url) = url_of(dest) else {
        let mut w = TraceFileWriter::create(dest)?;
        let (t, meta) = fill(&mut w)?;
        w.finish(&meta)?;
        return Ok((t, dest.display().to_string()));
    };
    let loc = ObjectLocation::parse(url)?;
    let tmp = std::env::temp_dir().join(format!(
        "llmreplay-upload-{}-{}.parquet",
        std::process::id(),
        UPLOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let result = (|| {
        let mut w = TraceFileWriter::create(&tmp)?;
        let (t, meta) = fill(&mut w)?;
        w.finish(&meta)?;
        loc.put_file(&loc.path, &tmp).map(|at| (t, at))
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Uploads the finished local file `local` to the object URL `dest` (see
/// [`ObjectLocation::put_file`]). Returns the object's URL.
pub fn upload_file(dest: &str, local: &Path) -> Result<String> {
    let loc = ObjectLocation::parse(dest)?;
    loc.put_file(&loc.path, local)
}

/// Writes `data` to `dest`: a local path or an object URL. Returns where it went.
pub fn write_bytes(dest: &Path, data: Vec<u8>) -> Result<String> {
    match url_of(dest) {
        Some(url) => ObjectLocation::parse(url)?.put_bytes(Bytes::from(data)),
        None => {
            // Private like every trace file (mode 0600 on Unix).
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            std::io::Write::write_all(&mut opts.open(dest).map_err(|e| Error::io(dest, e))?, &data)
                .map_err(|e| Error::io(dest, e))?;
            Ok(dest.display().to_string())
        }
    }
}

static UPLOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Retries of one request: a few, within 10 s (object_store's default waits up to 3
/// minutes, which would hold a capture's shutdown that long when the store is down; the
/// spool keeps what could not be uploaded).
fn retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(10),
        ..Default::default()
    }
}

/// A store error in one line: object_store's messages can carry a whole HTML error page.
fn store_err(url: &str, e: impl std::fmt::Display) -> Error {
    let text = e.to_string();
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").trim_end();
    let message = if lines.any(|l| !l.trim().is_empty()) {
        format!("{} …", first.trim_end_matches(':'))
    } else {
        first.to_string()
    };
    Error::Store {
        url: url.to_string(),
        message,
    }
}

/// The runtime the store clients run on: one worker thread, started on first use.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("llmreplay-store")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the object-store runtime: {e}"))
    })
}

/// Runs `fut` on the store runtime and waits for it; callable from any thread, including a
/// thread of another runtime.
fn run<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handle = runtime().spawn(fut);
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(handle.await);
    });
    match rx.recv() {
        Ok(Ok(v)) => v,
        Ok(Err(join)) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        _ => panic!("the object-store runtime stopped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths_are_told_apart() {
        assert!(is_url("s3://bucket/prefix"));
        assert!(is_url("S3://bucket"));
        assert!(is_url("gs://b/p"));
        assert!(is_url("https://host/b/x.parquet"));
        assert!(!is_url("trace.parquet"));
        assert!(!is_url("/data/caps/*.parquet"));
        assert!(!is_url("file:///data/x.parquet"));
        assert!(!is_url("C:\\data\\x.parquet"));
    }

    #[test]
    fn hive_partition_comes_from_the_file_stamp() {
        let now = chrono::DateTime::parse_from_rfc3339("2030-01-02T03:04:05Z")
            .map(|d| d.with_timezone(&chrono::Utc))
            .unwrap_or_default();
        assert_eq!(
            hive_partition("capture-20261129T183000Z-000001.parquet", now),
            "date=2026-11-29/hour=18"
        );
        assert_eq!(
            hive_partition("my-prefix-20260101T000959Z-000000.parquet", now),
            "date=2026-01-01/hour=00"
        );
        assert_eq!(
            hive_partition("other.parquet", now),
            "date=2030-01-02/hour=03"
        );
    }

    #[test]
    fn object_urls_keep_the_bucket() {
        let loc = ObjectLocation::parse("s3://bucket/caps/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loc.url(), "s3://bucket/caps");
        let key = loc
            .child("date=2026-11-29/hour=18/a.parquet")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            loc.object_url(&key),
            "s3://bucket/caps/date=2026-11-29/hour=18/a.parquet"
        );
        let root = ObjectLocation::parse("s3://bucket").unwrap_or_else(|e| panic!("{e}"));
        let key = root.child("x/y.parquet").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(root.object_url(&key), "s3://bucket/x/y.parquet");
    }

    #[test]
    fn unknown_store_is_a_clear_error() {
        let err = ObjectLocation::parse("memory:///x").map(|_| ());
        assert!(err.is_err());
    }
}
