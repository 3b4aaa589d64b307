//! Connections to one upstream: connect, a keep-alive pool, and the retry rule.
//!
//! **The retry rule.** A request is sent again only when not one byte of it was accepted by
//! the kernel of the connection it was written to (the write failed at once, on a pooled
//! connection the server had reset meanwhile). Then the server cannot have seen any of it,
//! and it goes out on the next usable connection. Once any byte was accepted, the request is
//! never sent again, whatever happens next — the server may have read it and started a
//! generation even if it closes without answering — and the caller gets the failure (capture
//! answers 502 and records it, replay records it). So no server ever sees a request twice.
//!
//! What keeps that rule from costing failures is checking a connection before it is used:
//! - an idle connection is kept at most [`PoolConfig::idle_timeout`] (4 s by default, under
//!   the 5 s keep-alive timeout of uvicorn, which serves vLLM and SGLang, and of llama.cpp's
//!   server; nginx keeps 75 s), so the pool does not write to a connection in the instant the
//!   server's own timer closes it;
//! - before reuse the kernel is asked whether the connection is still open and quiet (a
//!   `recv` with `MSG_PEEK`, not the reactor's last readiness event, which may not yet have
//!   seen a FIN that just arrived): a closed one, or one with unasked bytes (a `408` some
//!   servers send before closing), is dropped and counted as found closed;
//! - a response that says `connection: close`, is HTTP/1.0 without keep-alive, is
//!   close-delimited, or left bytes after its end, does not return its connection to the pool.
//!
//! A server can still close a keep-alive connection in the microseconds between that check
//! and the write reaching it; that failure is the server's (RFC 9112 §9.6 lets a client retry
//! only idempotent requests, and a generation is not one), and it is recorded as such.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::conn::{Conn, Io, Stamped, WriteError};
use crate::habit::{After, Checkin, Habit, SETTLE};

/// Where the connections go: host, port, and TLS when `https`.
#[derive(Clone)]
pub struct Target {
    host: String,
    port: u16,
    authority: String,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("authority", &self.authority)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Target {
    /// Plain TCP to `host` (IPv6 with or without brackets) and `port`; `authority` names it
    /// in errors.
    pub fn plain(host: &str, port: u16, authority: &str) -> Target {
        Target {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            authority: authority.to_string(),
            tls: None,
        }
    }

    /// TLS through `connector` to `host` and `port`, verified as `host`.
    pub fn tls(
        host: &str,
        port: u16,
        authority: &str,
        connector: tokio_rustls::TlsConnector,
    ) -> Result<Target, String> {
        let mut t = Target::plain(host, port, authority);
        let name = rustls::pki_types::ServerName::try_from(t.host.clone())
            .map_err(|e| format!("server name {}: {e}", t.host))?;
        t.tls = Some((connector, name));
        Ok(t)
    }

    /// `host:port` as given.
    pub fn authority(&self) -> &str {
        &self.authority
    }
}

/// How a pool connects and how long it keeps connections.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    /// Longest TCP (and TLS) connect, apart from any request timeout.
    pub connect_timeout: Duration,
    /// Longest an idle connection is kept for reuse.
    pub idle_timeout: Duration,
    /// Idle connections kept at most.
    pub max_idle: usize,
    /// Ask the kernel to stamp every read with its receive time (replay's measuring path).
    pub stamp_reads: bool,
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(4),
            max_idle: 4096,
            stamp_reads: false,
        }
    }
}

/// What a pool did with its connections, counted since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Opened by [`Pool::preconnect`] / [`Pool::refresh`].
    pub preconnected: u64,
    /// Opened for a request that found no usable idle connection.
    pub opened: u64,
    /// Requests that went out on a pooled connection.
    pub reused: u64,
    /// Pooled connections found closed by the server (or with unasked bytes) and replaced.
    pub found_closed: u64,
    /// Pooled connections dropped for having been idle over the idle timeout.
    pub expired: u64,
    /// Lookups of the target's host name (none for an IP address): at most one per
    /// [`RESOLVED_FOR`], however many connections are opened meanwhile.
    pub resolved: u64,
    /// Connections not reused because the server closes them after such a response
    /// without saying so ([`Habit`]).
    pub retired: u64,
    /// Opened ahead of the next request in place of a retired one.
    pub spares: u64,
}

impl PoolStats {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &PoolStats) -> PoolStats {
        PoolStats {
            preconnected: self.preconnected - earlier.preconnected,
            opened: self.opened - earlier.opened,
            reused: self.reused - earlier.reused,
            found_closed: self.found_closed - earlier.found_closed,
            expired: self.expired - earlier.expired,
            resolved: self.resolved - earlier.resolved,
            retired: self.retired - earlier.retired,
            spares: self.spares - earlier.spares,
        }
    }
}

/// How long a host name's addresses are used for new connections before it is looked up
/// again (Envoy's default DNS refresh rate); they are dropped sooner when connecting to them
/// fails. A lookup per connection put a blocking `getaddrinfo` on the path of every new
/// connection: a 500-connection burst through capture to `http://localhost:…` (resolved from
/// /etc/hosts, the fastest case) had TTFT p99 147–192 ms against 100–121 ms to `127.0.0.1`.
pub const RESOLVED_FOR: Duration = Duration::from_secs(5);

/// A host name's addresses and when they were looked up.
#[derive(Debug)]
struct Resolved {
    at: Instant,
    addrs: Arc<[SocketAddr]>,
}

/// One host name's addresses, looked up at most once per [`RESOLVED_FOR`] however many
/// connections are opened meanwhile (one lookup at a time: the others wait for its answer),
/// and forgotten when connecting to them fails. The pool's, and capture's for the
/// connections hyper-util's client opens (`https://` and h2c upstreams).
#[derive(Debug)]
pub struct Resolver {
    host: String,
    port: u16,
    slot: tokio::sync::Mutex<Option<Resolved>>,
    lookups: AtomicU64,
}

impl Resolver {
    /// The resolver of the host name `host` and `port`.
    pub fn new(host: &str, port: u16) -> Resolver {
        Resolver {
            host: host.to_string(),
            port,
            slot: tokio::sync::Mutex::new(None),
            lookups: AtomicU64::new(0),
        }
    }

    /// The host name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Lookups made so far.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Relaxed)
    }

    /// The addresses: those looked up less than [`RESOLVED_FOR`] ago, else a new lookup.
    pub async fn addrs(&self) -> io::Result<Arc<[SocketAddr]>> {
        let mut r = self.slot.lock().await;
        if let Some(x) = r.as_ref().filter(|x| x.at.elapsed() < RESOLVED_FOR) {
            return Ok(x.addrs.clone());
        }
        self.lookups.fetch_add(1, Relaxed);
        let addrs: Arc<[SocketAddr]> = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .collect::<Vec<_>>()
            .into();
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "could not resolve to any address",
            ));
        }
        *r = Some(Resolved {
            at: Instant::now(),
            addrs: addrs.clone(),
        });
        Ok(addrs)
    }

    /// Connecting to `addrs` (as [`Resolver::addrs`] gave them) failed: the next connect
    /// looks the name up again, unless a newer lookup replaced them meanwhile.
    pub async fn forget(&self, addrs: &Arc<[SocketAddr]>) {
        let mut cached = self.slot.lock().await;
        if cached
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(&c.addrs, addrs))
        {
            *cached = None;
        }
    }
}

#[derive(Default)]
struct Counters {
    preconnected: AtomicU64,
    opened: AtomicU64,
    reused: AtomicU64,
    found_closed: AtomicU64,
    expired: AtomicU64,
    retired: AtomicU64,
    spares: AtomicU64,
}

/// Why no connection could be had.
#[derive(Debug)]
pub enum ConnectError {
    /// TCP connect failed.
    Io(String, io::Error),
    /// TCP or TLS connect took longer than the connect timeout.
    Timeout(String, Duration),
    /// The TLS handshake failed.
    Tls(String, io::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Io(a, e) => write!(f, "connect {a}: {e}"),
            ConnectError::Timeout(a, d) => write!(f, "connect {a}: timed out after {d:?}"),
            ConnectError::Tls(a, e) => write!(f, "TLS {a}: {e}"),
        }
    }
}

impl std::error::Error for ConnectError {}

/// A connection taken from the pool or newly opened.
pub struct Lease {
    /// The connection.
    pub conn: Conn,
    /// It came from the pool (else it was opened for this request).
    pub reused: bool,
    /// Time spent connecting (zero for a pooled connection).
    pub connect: Duration,
}

/// A request written to a connection.
pub struct Sent {
    /// The connection, to read the response from.
    pub conn: Conn,
    /// It came from the pool.
    pub reused: bool,
    /// Time spent connecting (zero for a pooled connection).
    pub connect: Duration,
    /// When the request was handed to the connection (right before its write, after any
    /// connecting).
    pub t0: Instant,
}

/// Why a request could not be written.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be had.
    Connect {
        /// Why.
        error: ConnectError,
        /// Time spent trying.
        spent: Duration,
    },
    /// The write failed; if any of it had gone out, it was not sent again.
    Write {
        /// Why, and whether any of it went out.
        error: WriteError,
        /// When the write began.
        t0: Instant,
        /// The connection was a pooled one.
        reused: bool,
        /// Time spent connecting.
        connect: Duration,
    },
    /// The write did not finish within its timeout (the server reads nothing).
    WriteTimeout {
        /// When the write began.
        t0: Instant,
        /// The connection was a pooled one.
        reused: bool,
        /// Time spent connecting.
        connect: Duration,
    },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect { error, .. } => write!(f, "{error}"),
            SendError::Write { error, .. } => write!(f, "request failed: {error}"),
            SendError::WriteTimeout { .. } => f.write_str("request not sent within the timeout"),
        }
    }
}

impl std::error::Error for SendError {}

struct Idle {
    conn: Conn,
    since: Instant,
    /// Kept although the origin closes connections after its response (a [`Checkin::Probe`]).
    probe: bool,
}

impl Idle {
    fn new(conn: Conn, probe: bool) -> Idle {
        Idle {
            conn,
            since: Instant::now(),
            probe,
        }
    }
}

/// Keep-alive connections to one [`Target`].
pub struct Pool {
    target: Target,
    cfg: PoolConfig,
    /// Idle connections, the most recently used last.
    idle: Mutex<Vec<Idle>>,
    stats: Counters,
    /// The target's address when its host is an IP address.
    fixed: Option<SocketAddr>,
    /// The host name's addresses while fresh.
    resolver: Resolver,
    /// What the origin does with a connection after a response.
    habit: Arc<Habit>,
    /// Spares being opened.
    opening: AtomicUsize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("target", &self.target)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool for `target`, learning its habits afresh.
    pub fn new(target: Target, cfg: PoolConfig) -> Pool {
        Pool::with_habit(target, cfg, Arc::new(Habit::new()))
    }

    /// A pool for `target` that shares what `habit` learned (and adds to it) with the other
    /// pools of the same origin.
    pub fn with_habit(target: Target, cfg: PoolConfig, habit: Arc<Habit>) -> Pool {
        let fixed = target
            .host
            .parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, target.port));
        let resolver = Resolver::new(&target.host, target.port);
        Pool {
            target,
            cfg,
            idle: Mutex::new(Vec::new()),
            stats: Counters::default(),
            fixed,
            resolver,
            habit,
            opening: AtomicUsize::new(0),
        }
    }

    /// What the pool learned about how its origin ends connections.
    pub fn habit(&self) -> &Arc<Habit> {
        &self.habit
    }

    /// The target.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The counts so far.
    pub fn stats(&self) -> PoolStats {
        let s = &self.stats;
        PoolStats {
            preconnected: s.preconnected.load(Relaxed),
            opened: s.opened.load(Relaxed),
            reused: s.reused.load(Relaxed),
            found_closed: s.found_closed.load(Relaxed),
            expired: s.expired.load(Relaxed),
            resolved: self.resolver.lookups(),
            retired: s.retired.load(Relaxed),
            spares: s.spares.load(Relaxed),
        }
    }

    /// Idle connections in the pool (unchecked).
    pub fn idle_count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A TCP connection to the target: its IP address, or its host name's addresses in
    /// turn (forgotten when none of them connects, so the next connect looks again).
    async fn connect_tcp(&self) -> io::Result<TcpStream> {
        if let Some(a) = self.fixed {
            return crate::direct::connect(&[a]).await;
        }
        let addrs = self.resolver.addrs().await?;
        let r = crate::direct::connect(&addrs).await;
        if r.is_err() {
            self.resolver.forget(&addrs).await;
        }
        r
    }

    /// Opens a new connection, within the connect timeout.
    async fn connect(&self) -> Result<Conn, ConnectError> {
        let t = &self.target;
        let a = || t.authority.clone();
        let attempt = async {
            let tcp = self
                .connect_tcp()
                .await
                .map_err(|e| ConnectError::Io(a(), e))?;
            let _ = tcp.set_nodelay(true);
            let tcp = Stamped::new(tcp, self.cfg.stamp_reads);
            match &t.tls {
                None => Ok(Conn::new(Io::Plain(tcp))),
                Some((tls, name)) => {
                    let s = tls
                        .connect(name.clone(), tcp)
                        .await
                        .map_err(|e| ConnectError::Tls(a(), e))?;
                    Ok(Conn::new(Io::Tls(Box::new(s))))
                }
            }
        };
        match tokio::time::timeout(self.cfg.connect_timeout, attempt).await {
            Ok(Ok(mut conn)) => {
                conn.watch(self.habit.clone());
                Ok(conn)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ConnectError::Timeout(a(), self.cfg.connect_timeout)),
        }
    }

    /// The most recently used idle connection that is young enough, still open and quiet,
    /// and that the origin's habit lets be reused now; the expired, closed and retired ones
    /// met on the way are dropped and counted, and those still settling are left for later.
    ///
    /// The kernel is asked whether the candidate is still open (a syscall) and the
    /// connections met on the way are closed (two syscalls each) after the pool's lock is
    /// released: every request takes that lock, and with several workers one holding it
    /// through a syscall made the others wait (769 futex calls in a burst of 1,000 requests on
    /// two workers, against 3 without).
    fn checkout(&self) -> Option<Conn> {
        loop {
            let mut dropped = Vec::new();
            let picked = self.pick(&mut dropped);
            drop(dropped);
            let (mut conn, age) = picked?;
            if conn.is_usable() {
                conn.reused_after(age);
                return Some(conn);
            }
            self.stats.found_closed.fetch_add(1, Relaxed);
            conn.closed_after(age);
        }
    }

    /// Under the pool's lock: takes the [`Pool::checkout`] candidate out of the idle list
    /// (with how long it idled), and moves the connections to drop into `dropped`.
    fn pick(&self, dropped: &mut Vec<Conn>) -> Option<(Conn, Duration)> {
        let mut idle = self.lock();
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            let age = idle[i].since.elapsed();
            if age >= self.cfg.idle_timeout {
                dropped.push(idle.remove(i).conn);
                self.stats.expired.fetch_add(1, Relaxed);
                continue;
            }
            let after = idle[i].conn.last_kind().map(|k| self.habit.after(k));
            match after {
                None | Some(After::Keeps) => {}
                Some(After::Closes) if !idle[i].probe => {
                    // The habit was learned while it sat idle.
                    dropped.push(idle.remove(i).conn);
                    self.stats.retired.fetch_add(1, Relaxed);
                    continue;
                }
                // Not known to stay open after its response (or a probe): reused once a close
                // that follows the response would have arrived; one that already has is
                // learned from at once. (Asked in place: it stays when still settling.)
                Some(_) if age < SETTLE => {
                    if !idle[i].conn.is_usable() {
                        let conn = idle.remove(i).conn;
                        self.stats.found_closed.fetch_add(1, Relaxed);
                        conn.closed_after(age);
                        dropped.push(conn);
                    }
                    continue;
                }
                Some(_) => {}
            }
            return Some((idle.remove(i).conn, age));
        }
        None
    }

    /// Gives back a connection whose response ended cleanly and allows keep-alive: kept for
    /// reuse, unless the origin closes connections after such a response without saying so
    /// ([`Habit`]); then a spare is opened in its place, ahead of the next request.
    pub fn checkin(self: &Arc<Self>, conn: Conn) {
        if !conn.is_clean() {
            return;
        }
        let probe = match conn.last_kind().map(|k| self.habit.checkin(k)) {
            Some(Checkin::Retire) => {
                self.stats.retired.fetch_add(1, Relaxed);
                drop(conn);
                self.spare();
                return;
            }
            Some(Checkin::Probe) => true,
            _ => false,
        };
        let now = Instant::now();
        let mut idle = self.lock();
        // The oldest are at the front: drop the expired ones (closed once the lock is released,
        // as is a connection the full pool does not keep).
        let stale = idle
            .iter()
            .take_while(|i| now.duration_since(i.since) >= self.cfg.idle_timeout)
            .count();
        let expired: Vec<Idle> = idle.drain(..stale).collect();
        self.stats.expired.fetch_add(stale as u64, Relaxed);
        let unkept = if idle.len() < self.cfg.max_idle {
            idle.push(Idle::new(conn, probe));
            None
        } else {
            Some(conn)
        };
        drop(idle);
        drop((expired, unkept));
    }

    /// Opens a connection into the idle pool in the background (on the caller's runtime, whose
    /// reactor its requests will use), unless the pool is full.
    fn spare(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let opening = self.opening.fetch_add(1, Relaxed);
        if opening + self.idle_count() >= self.cfg.max_idle {
            self.opening.fetch_sub(1, Relaxed);
            return;
        }
        let me = self.clone();
        rt.spawn(async move {
            if let Ok(conn) = me.connect().await {
                me.stats.spares.fetch_add(1, Relaxed);
                me.lock().push(Idle::new(conn, false));
            }
            me.opening.fetch_sub(1, Relaxed);
        });
    }

    /// A usable pooled connection, or a new one.
    pub async fn lease(&self) -> Result<Lease, ConnectError> {
        if let Some(conn) = self.checkout() {
            return Ok(Lease {
                conn,
                reused: true,
                connect: Duration::ZERO,
            });
        }
        let c0 = Instant::now();
        let conn = self.connect().await?;
        self.stats.opened.fetch_add(1, Relaxed);
        Ok(Lease {
            conn,
            reused: false,
            connect: c0.elapsed(),
        })
    }

    /// Writes `request` (a whole HTTP/1.1 request) on a usable connection, under the retry
    /// rule of this module: it is written again, on another connection, only when not one
    /// byte of it was accepted by a pooled connection's kernel. `write_timeout` bounds the
    /// write itself (from `t0`).
    pub async fn send(&self, request: &[u8], write_timeout: Duration) -> Result<Sent, SendError> {
        let began = Instant::now();
        loop {
            let Lease {
                mut conn,
                reused,
                connect,
            } = match self.lease().await {
                Ok(l) => l,
                Err(error) => {
                    return Err(SendError::Connect {
                        error,
                        spent: began.elapsed(),
                    })
                }
            };
            let t0 = Instant::now();
            match within(write_timeout, conn.write_request(request)).await {
                Ok(Ok(())) => {
                    if reused {
                        self.stats.reused.fetch_add(1, Relaxed);
                    }
                    return Ok(Sent {
                        conn,
                        reused,
                        connect,
                        t0,
                    });
                }
                Ok(Err(WriteError::NothingSent(_))) if reused => {
                    self.stats.found_closed.fetch_add(1, Relaxed);
                    conn.closed_in_use();
                }
                Ok(Err(error)) => {
                    return Err(SendError::Write {
                        error,
                        t0,
                        reused,
                        connect,
                    })
                }
                Err(_) => {
                    return Err(SendError::WriteTimeout {
                        t0,
                        reused,
                        connect,
                    })
                }
            }
        }
    }

    /// Opens `n` connections into the idle pool at once (before a clock starts); the number
    /// opened, or the first error when none could be.
    pub async fn preconnect(self: &Arc<Self>, n: usize) -> Result<usize, ConnectError> {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            let me = self.clone();
            set.spawn(async move { me.connect().await });
        }
        let mut opened = Vec::with_capacity(n);
        let mut first_err = None;
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(c)) => opened.push(c),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err.get_or_insert(ConnectError::Io(
                        self.target.authority.clone(),
                        io::Error::other(e.to_string()),
                    ));
                }
            }
        }
        let count = opened.len();
        self.stats.preconnected.fetch_add(count as u64, Relaxed);
        self.lock()
            .extend(opened.into_iter().map(|conn| Idle::new(conn, false)));
        match (count, first_err) {
            (0, Some(e)) if n > 0 => Err(e),
            _ => Ok(count),
        }
    }

    /// Makes the pool hold `n` usable idle connections: drops the idle ones that expired or
    /// that the server closed, and opens the rest. Returns (kept, opened). A connection still
    /// settling after a response ([`SETTLE`]) stays in the pool but is not counted as usable:
    /// a request right after the refresh would not take it.
    pub async fn refresh(self: &Arc<Self>, n: usize) -> Result<(usize, usize), ConnectError> {
        let kept = {
            let mut idle = self.lock();
            let before = idle.len();
            let bound = self.cfg.idle_timeout;
            let (mut expired, mut closed, mut retired, mut settling) = (0, 0, 0, 0);
            idle.retain_mut(|i| {
                let age = i.since.elapsed();
                if age >= bound {
                    expired += 1;
                    false
                } else if !i.probe
                    && i.conn.last_kind().map(|k| self.habit.after(k)) == Some(After::Closes)
                {
                    retired += 1;
                    false
                } else if !i.conn.is_usable() {
                    closed += 1;
                    i.conn.closed_after(age);
                    false
                } else {
                    let after = i.conn.last_kind().map(|k| self.habit.after(k));
                    if !matches!(after, None | Some(After::Keeps)) && age < SETTLE {
                        settling += 1;
                    }
                    true
                }
            });
            self.stats.expired.fetch_add(expired, Relaxed);
            self.stats.found_closed.fetch_add(closed, Relaxed);
            self.stats.retired.fetch_add(retired, Relaxed);
            debug_assert_eq!(
                before as u64 - expired - closed - retired,
                idle.len() as u64
            );
            idle.len() - settling
        };
        let opened = self.preconnect(n.saturating_sub(kept)).await?;
        Ok((kept, opened))
    }
}

/// `f`'s output, or `Err` when `limit` passes first; the timer is made only when `f` does not
/// finish on its first poll. A request's write almost always does (the kernel takes it at
/// once), so the send path registers no timer for it: a timer is a handle to the runtime
/// taken, an entry made and dropped, per request.
async fn within<F: Future>(
    limit: Duration,
    f: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut f = std::pin::pin!(f);
    match std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await {
        Poll::Ready(v) => Ok(v),
        Poll::Pending => tokio::time::timeout(limit, f).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A request to a new loopback connection is connected and written on the first poll of
    /// [`Pool::send`], not a reactor turn later (`crate::direct`): in a burst on a
    /// single-threaded runtime, that turn came after every other ready task.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "current_thread")]
    async fn a_new_connection_sends_its_request_on_the_first_poll() {
        use std::future::Future;
        use std::io::Read;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let pool = Pool::new(Target::plain("127.0.0.1", port, "x"), PoolConfig::default());
        let req = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
        let mut send = Box::pin(pool.send(req, Duration::from_secs(5)));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let sent = match send.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Ok(s)) => s,
            std::task::Poll::Ready(Err(e)) => panic!("send: {e}"),
            std::task::Poll::Pending => panic!("the request waited for the reactor"),
        };
        assert!(!sent.reused);
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = vec![0u8; req.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got[..], &req[..]);
    }

    /// A request larger than the socket buffers: the direct writes stop at the first
    /// `EAGAIN`, and the rest goes through the reactor as the server reads, whole and once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_larger_than_the_socket_buffers_goes_out_whole() {
        use std::io::Read;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut req = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 16777216\r\n\r\n".to_vec();
        req.extend((0..16usize << 20).map(|i| (i % 251) as u8));
        let want = req.clone();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut got = Vec::with_capacity(want.len());
            let mut b = vec![0u8; 1 << 16];
            while got.len() < want.len() {
                std::thread::sleep(Duration::from_micros(100));
                let n = s.read(&mut b).unwrap();
                assert!(n > 0, "closed after {} bytes", got.len());
                got.extend_from_slice(&b[..n]);
            }
            assert!(got == want, "the request arrived changed");
        });
        let pool = Pool::new(Target::plain("127.0.0.1", port, "x"), PoolConfig::default());
        let sent = tokio::time::timeout(
            Duration::from_secs(30),
            pool.send(&req, Duration::from_secs(30)),
        )
        .await
        .expect("written within 30 s")
        .expect("written");
        let (direct, written) = sent.conn.write_state();
        assert!(!direct, "16 MiB went out without the socket ever filling");
        assert_eq!(written, req.len() as u64);
        reader.join().unwrap();
    }

    /// A server that answers each request on a connection with a 2-byte body, closing the
    /// connection `linger` after its `per_conn`th answer (without saying so) or, when
    /// `drop_second`, reading the second request of a connection and closing without an
    /// answer. Reports (connection number, request number on it) for every request it read.
    async fn server(
        per_conn: usize,
        drop_second: bool,
    ) -> (Target, tokio::sync::mpsc::UnboundedReceiver<(usize, usize)>) {
        lingering_server(per_conn, drop_second, Duration::ZERO).await
    }

    async fn lingering_server(
        per_conn: usize,
        drop_second: bool,
        linger: Duration,
    ) -> (Target, tokio::sync::mpsc::UnboundedReceiver<(usize, usize)>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut conn_no = 0;
            while let Ok((mut s, _)) = l.accept().await {
                conn_no += 1;
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut served = 0;
                    loop {
                        let mut b = [0u8; 1024];
                        let n = s.read(&mut b).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        got.extend_from_slice(&b[..n]);
                        while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                            got.drain(..end + 4);
                            served += 1;
                            let _ = tx.send((conn_no, served));
                            if drop_second && served == 2 {
                                return;
                            }
                            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                                .await
                                .unwrap();
                            if served == per_conn {
                                tokio::time::sleep(linger).await;
                                return;
                            }
                        }
                    }
                });
            }
        });
        (
            Target::plain("127.0.0.1", port, &format!("127.0.0.1:{port}")),
            rx,
        )
    }

    async fn exchange(pool: &Arc<Pool>) -> Result<Vec<u8>, String> {
        let mut sent = pool
            .send(b"GET / HTTP/1.1\r\n\r\n", Duration::from_secs(5))
            .await
            .map_err(|e| e.to_string())?;
        let (h, t) = sent
            .conn
            .read_head(1024, |_| Ok(()))
            .await
            .map_err(|e| e.to_string())?;
        let mut body = Vec::new();
        let reusable = sent
            .conn
            .read_body(h.framing, t, |d, _| body.extend_from_slice(d))
            .await
            .map_err(|e| e.to_string())?;
        if reusable && h.keep_alive {
            pool.checkin(sent.conn);
        }
        Ok(body)
    }

    /// Long enough for a connection to settle ([`SETTLE`]).
    async fn settle() {
        tokio::time::sleep(SETTLE + Duration::from_millis(10)).await;
    }

    /// A server that closes every connection after one answer, without `connection:
    /// close`: the next requests find their pooled connection closed and replace it before
    /// writing a byte; after two, the pool has learned the habit and no longer keeps a
    /// connection after such a response, but opens a spare in its place. Every request is
    /// read exactly once.
    #[tokio::test]
    async fn a_connection_the_server_closed_is_replaced_before_any_byte_is_written() {
        let (target, mut log) = server(1, false).await;
        let pool = Arc::new(Pool::new(target, PoolConfig::default()));
        for _ in 0..5 {
            assert_eq!(exchange(&pool).await.unwrap(), b"ok");
            // The server's close arrives while the connection is idle.
            settle().await;
        }
        let mut seen = Vec::new();
        while let Ok(r) = log.try_recv() {
            seen.push(r);
        }
        assert_eq!(seen, (1..=5).map(|c| (c, 1)).collect::<Vec<_>>());
        let s = pool.stats();
        assert_eq!(
            (s.opened, s.found_closed, s.retired, s.spares, s.reused),
            (3, 2, 3, 3, 2),
            "{s:?}"
        );
        assert_eq!(pool.habit().after_sized(), After::Closes);
    }

    /// A server that closes each connection a millisecond after its one answer, advertising
    /// keep-alive all along (llama.cpp's server after a stream): before the pool learned that,
    /// a request written in between failed ("closed before a response") — every back-to-back
    /// one, here. Now a connection is not reused until a close would have been seen, the habit
    /// is learned from the first closes, and 200 requests back to back all succeed, each read
    /// once, with spares opened ahead.
    #[tokio::test]
    async fn a_server_that_closes_right_after_each_answer_fails_no_request() {
        let (target, mut log) = lingering_server(1, false, Duration::from_millis(1)).await;
        let pool = Arc::new(Pool::new(target, PoolConfig::default()));
        for i in 0..200 {
            let r = exchange(&pool).await;
            assert_eq!(r, Ok(b"ok".to_vec()), "request {i}: {:?}", pool.stats());
        }
        let mut seen = Vec::new();
        while let Ok(r) = log.try_recv() {
            seen.push(r);
        }
        assert_eq!(seen.len(), 200);
        assert!(
            seen.iter().all(|&(_, n)| n == 1),
            "a connection carried two"
        );
        assert_eq!(pool.habit().after_sized(), After::Closes);
        let s = pool.stats();
        assert!(
            s.retired >= 150 && s.reused >= 50 && s.spares >= 50,
            "{s:?}"
        );
    }

    /// A well-behaved server is learned as one: after the first reuse, connections go back
    /// to work at once, and 200 requests back to back share a couple of connections.
    #[tokio::test]
    async fn a_server_that_keeps_connections_open_gets_them_reused() {
        let (target, mut log) = server(usize::MAX, false).await;
        let pool = Arc::new(Pool::new(target, PoolConfig::default()));
        assert_eq!(exchange(&pool).await.unwrap(), b"ok");
        settle().await;
        for _ in 0..200 {
            assert_eq!(exchange(&pool).await.unwrap(), b"ok");
        }
        assert_eq!(pool.habit().after_sized(), After::Keeps);
        let s = pool.stats();
        assert_eq!((s.opened, s.reused, s.retired), (1, 200, 0), "{s:?}");
        let mut conns = std::collections::BTreeSet::new();
        while let Ok((c, _)) = log.try_recv() {
            conns.insert(c);
        }
        assert_eq!(conns.len(), 1);
    }

    /// A server that reads a request on a reused connection and closes without answering
    /// sees it once: the failure goes to the caller, nothing is sent twice.
    #[tokio::test]
    async fn a_request_the_server_read_is_never_sent_again() {
        let (target, mut log) = server(usize::MAX, true).await;
        let pool = Arc::new(Pool::new(target, PoolConfig::default()));
        assert_eq!(exchange(&pool).await.unwrap(), b"ok");
        settle().await;
        let e = exchange(&pool).await.unwrap_err();
        assert!(e.contains("closed before a response"), "{e}");
        assert_eq!(exchange(&pool).await.unwrap(), b"ok");
        let mut seen = Vec::new();
        while let Ok(r) = log.try_recv() {
            seen.push(r);
        }
        assert_eq!(seen, vec![(1, 1), (1, 2), (2, 1)]);
    }

    /// Idle connections older than the idle timeout are not reused, and a refresh replaces
    /// the ones the server closed.
    #[tokio::test]
    async fn expired_and_closed_connections_are_dropped_by_a_refresh() {
        let (target, _log) = server(1, false).await;
        let cfg = PoolConfig {
            idle_timeout: Duration::from_millis(200),
            ..PoolConfig::default()
        };
        let pool = Arc::new(Pool::new(target, cfg));
        assert_eq!(pool.preconnect(3).await.unwrap(), 3);
        assert_eq!(pool.refresh(3).await.unwrap(), (3, 0));
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(pool.refresh(3).await.unwrap(), (0, 3));
        assert_eq!(pool.stats().expired, 3);
        // One round trip closes its connection (the server's close after one answer).
        assert_eq!(exchange(&pool).await.unwrap(), b"ok");
        settle().await;
        assert_eq!(pool.idle_count(), 3);
        assert_eq!(pool.refresh(3).await.unwrap(), (2, 1));
        assert_eq!(pool.stats().found_closed, 1);
    }

    /// A host name is looked up once for a burst of new connections, not once for each:
    /// 40 connections opened at once to `localhost` make one lookup (a lookup per connect,
    /// before, made 40); an IP address is never looked up; when connecting to the addresses
    /// fails they are forgotten, and the next connect looks the name up again.
    #[tokio::test]
    async fn a_burst_of_connects_looks_the_host_name_up_once() {
        let (t, _seen) = server(100, false).await;
        let port = t.port;
        let pool = Arc::new(Pool::new(
            Target::plain("localhost", port, &format!("localhost:{port}")),
            PoolConfig::default(),
        ));
        let mut burst = tokio::task::JoinSet::new();
        for _ in 0..40 {
            let pool = pool.clone();
            burst.spawn(async move { pool.lease().await.map(|l| l.conn) });
        }
        let mut conns = Vec::new();
        while let Some(r) = burst.join_next().await {
            conns.push(r.unwrap().expect("connect to localhost"));
        }
        assert_eq!(conns.len(), 40);
        assert_eq!(pool.stats().opened, 40);
        assert_eq!(pool.stats().resolved, 1);

        let by_ip = Pool::new(t, PoolConfig::default());
        let _c = by_ip.lease().await.expect("connect to 127.0.0.1");
        assert_eq!(by_ip.stats().resolved, 0);

        // A name whose addresses refuse: each failed connect forgets them.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let refused = Pool::new(
            Target::plain("localhost", closed, &format!("localhost:{closed}")),
            PoolConfig::default(),
        );
        assert!(refused.lease().await.is_err());
        assert!(refused.lease().await.is_err());
        assert_eq!(refused.stats().resolved, 2);
    }

    #[tokio::test]
    async fn connect_errors_name_the_target() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let a = format!("127.0.0.1:{port}");
        let pool = Pool::new(Target::plain("127.0.0.1", port, &a), PoolConfig::default());
        let e = pool.send(b"x", Duration::from_secs(1)).await.err().unwrap();
        assert!(e.to_string().starts_with(&format!("connect {a}: ")), "{e}");
    }

    /// A write's timer is made only when the write does not finish at once, and then it
    /// still bounds it.
    #[tokio::test(start_paused = true)]
    async fn within_times_only_what_does_not_finish_at_once() {
        assert_eq!(
            within(Duration::from_secs(1), async { 5 }).await.ok(),
            Some(5)
        );
        let t = tokio::time::Instant::now();
        let slow = tokio::time::sleep(Duration::from_millis(500));
        assert!(within(Duration::from_secs(1), slow).await.is_ok());
        assert_eq!(t.elapsed(), Duration::from_millis(500));
        let never = within(Duration::from_secs(1), std::future::pending::<()>());
        let r = tokio::time::timeout(Duration::from_secs(60), never).await;
        assert!(r.expect("the limit ended it").is_err());
        assert_eq!(t.elapsed(), Duration::from_millis(1500));
    }

    /// A request the target does not take (it never reads, so the socket buffers fill) ends
    /// as a write timeout at the limit, not a hang.
    #[tokio::test(start_paused = true)]
    async fn a_request_the_target_does_not_take_is_a_write_timeout() {
        // Never accepts: the kernel completes the handshake and buffers what it can.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let pool = Pool::new(Target::plain("127.0.0.1", port, "x"), PoolConfig::default());
        let big = vec![b'x'; 64 << 20];
        let t = tokio::time::Instant::now();
        let send = tokio::time::timeout(
            Duration::from_secs(60),
            pool.send(&big, Duration::from_secs(30)),
        );
        match send.await.expect("the write timeout ended it") {
            Err(SendError::WriteTimeout { reused, .. }) => assert!(!reused),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("64 MiB written to a socket nobody reads"),
        }
        assert!(t.elapsed() >= Duration::from_secs(30), "{:?}", t.elapsed());
        drop(l);
    }
}
