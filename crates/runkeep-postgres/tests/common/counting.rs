//! A TCP proxy between a store and the server that counts **round trips**:
//! the times a client waited for the server.
//!
//! # What counts as a round trip
//!
//! A wait is a burst of bytes from the server that follows bytes from the
//! client: every client write sets a per-connection flag, and the first
//! server read that finds it set counts one wait and clears it. So
//! statements the client sends back to back and awaits together (a
//! pipeline: `BEGIN` with the first statement, the writes with `COMMIT`)
//! count once however many protocol messages they take, and however many
//! TCP segments either side splits them into; a statement sent only after
//! the reply to the previous one counts again. That is the latency a
//! caller pays on a real network: one wait per round trip, independent of
//! how much is in each.
//!
//! Counting protocol messages instead would count something else: with
//! the extended query protocol every statement ends with its own `Sync`
//! (tokio-postgres sends one per query), and `BEGIN`/`COMMIT` are simple
//! `Query` messages, so a pipeline of five statements carries five. The
//! proxy counts those too ([`Snapshot::exchanges`]: `Query` + `Sync`
//! messages from the client) as the work the server does, not the
//! latency.
//!
//! The wait count is exact when the client queues a whole pipeline before
//! its connection task writes any of it, which a current-thread runtime
//! guarantees (the connection task cannot run until the operation yields);
//! on a multi-thread runtime a pipeline can leave in two writes, and if the
//! first one's reply arrives before the second write the count only grows,
//! so a test on a current-thread runtime is the tight one.
//!
//! A statement sent with a pipeline but not waited for (the notification a
//! write sends after its `COMMIT`) adds no wait: its reply follows the
//! awaited ones in the same burst, or arrives after the caller moved on.
//! Connections that sent `LISTEN` (the store's listener) are left out of
//! the totals; so is the startup of a connection, when measured after
//! warm-up.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default, Debug)]
struct Conn {
    /// Client bytes arrived since the last server bytes.
    client_spoke: AtomicBool,
    waits: AtomicUsize,
    exchanges: AtomicUsize,
    /// This connection sent `LISTEN`: the store's listener.
    listener: AtomicBool,
}

/// The totals at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Round trips (module docs).
    pub waits: usize,
    /// `Query` and `Sync` messages sent by clients.
    pub exchanges: usize,
    /// Connections opened through the proxy (the listener's included).
    pub connections: usize,
}

impl std::ops::Sub for Snapshot {
    type Output = Snapshot;
    fn sub(self, o: Snapshot) -> Snapshot {
        Snapshot {
            waits: self.waits - o.waits,
            exchanges: self.exchanges - o.exchanges,
            connections: self.connections - o.connections,
        }
    }
}

/// The proxy; it serves until dropped.
pub struct Counter {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    conns: Arc<Mutex<Vec<Arc<Conn>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Counter {
    /// A counting proxy to `target` (`host:port`).
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<Arc<Conn>>>> = Arc::default();
        let target = target.to_string();
        let registry = conns.clone();
        let task = tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(&target).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let conn = Arc::new(Conn::default());
                registry.lock().unwrap().push(conn.clone());
                tasks.spawn(serve(client, server, conn));
            }
        });
        Self { port, conns, task }
    }

    /// `url` with its host and port replaced by the proxy's.
    pub fn url(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let (auth, after) = match rest.split_once('@') {
            Some((a, r)) => (format!("{a}@"), r),
            None => (String::new(), rest),
        };
        let path = after.find(['/', '?']).map_or("", |i| &after[i..]);
        format!("{scheme}://{auth}127.0.0.1:{}{path}", self.port)
    }

    /// The totals now, over the connections that are not listeners.
    pub fn snapshot(&self) -> Snapshot {
        let conns = self.conns.lock().unwrap();
        let mut s = Snapshot {
            connections: conns.len(),
            ..Snapshot::default()
        };
        for c in conns.iter().filter(|c| !c.listener.load(Ordering::SeqCst)) {
            s.waits += c.waits.load(Ordering::SeqCst);
            s.exchanges += c.exchanges.load(Ordering::SeqCst);
        }
        s
    }
}

/// Splits the client's stream into protocol messages: the untyped startup
/// message first, then `type, length, body`.
#[derive(Default)]
struct Frames {
    buf: Vec<u8>,
    started: bool,
}

impl Frames {
    /// Feeds bytes; answers the type bytes of the complete messages and
    /// whether a `Query` among them starts with `LISTEN`.
    fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, bool) {
        self.buf.extend_from_slice(bytes);
        let mut types = Vec::new();
        let mut listen = false;
        loop {
            if !self.started {
                if self.buf.len() < 8 {
                    break;
                }
                let len = u32::from_be_bytes(self.buf[0..4].try_into().unwrap()) as usize;
                if self.buf.len() < len {
                    break;
                }
                let code = u32::from_be_bytes(self.buf[4..8].try_into().unwrap());
                self.buf.drain(..len);
                // An SSL or GSSAPI request precedes the real startup message.
                if code != 80_877_103 && code != 80_877_104 {
                    self.started = true;
                }
                continue;
            }
            if self.buf.len() < 5 {
                break;
            }
            let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
            if self.buf.len() < 1 + len {
                break;
            }
            let t = self.buf[0];
            if t == b'Q' && self.buf[5..1 + len].starts_with(b"LISTEN ") {
                listen = true;
            }
            types.push(t);
            self.buf.drain(..1 + len);
        }
        (types, listen)
    }
}

async fn serve(client: TcpStream, server: TcpStream, conn: Arc<Conn>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up_conn = conn.clone();
    let mut up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut frames = Frames::default();
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let (types, listen) = frames.feed(&buf[..n]);
            if listen {
                up_conn.listener.store(true, Ordering::SeqCst);
            }
            let ex = types.iter().filter(|t| **t == b'Q' || **t == b'S').count();
            up_conn.exchanges.fetch_add(ex, Ordering::SeqCst);
            // Set before forwarding: the server cannot answer bytes it has
            // not received, so the reply always finds the flag set.
            up_conn.client_spoke.store(true, Ordering::SeqCst);
            if sw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            r = sr.read(&mut buf) => {
                let n = match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                // Counted before the client can see the reply.
                if conn.client_spoke.swap(false, Ordering::SeqCst) {
                    conn.waits.fetch_add(1, Ordering::SeqCst);
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            _ = &mut up => break,
        }
    }
    up.abort();
    let _ = cw.shutdown().await;
}
