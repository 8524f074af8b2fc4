//! A TCP proxy between a store and the server, for connection faults:
//! - `partition(true)`: stop forwarding in both directions, without a reset
//!   (bytes wait; sockets stay open, keepalives still pass);
//! - `arm(CommitFault::…)`: the next `COMMIT` a client sends is forwarded
//!   and its reply swallowed (the commit happens, the acknowledgement is
//!   lost), or swallowed itself (the commit never happens); either way the
//!   client's connection is then closed. Statements pipelined with the
//!   `COMMIT` (in the same read) share its fate: forwarded and their
//!   replies swallowed too, or swallowed with it;
//! - `arm(CommitFault::Hold)`: the next `COMMIT` (with what is pipelined
//!   with it) waits in the proxy until `release()`, then is forwarded as
//!   usual: the client's transaction stays open, its row locks held, for as
//!   long as the test likes (`held()` says it is waiting).

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// tokio-postgres commits with the simple query `COMMIT`.
const COMMIT_QUERY: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
/// The server's CommandComplete for it.
const COMMIT_DONE: &[u8] = b"C\0\0\0\x0bCOMMIT\0";

/// What the next `COMMIT` suffers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CommitFault {
    /// Forwarded; the server's reply is swallowed, then the client is cut.
    LoseAck,
    /// Swallowed; the client is cut (the server sees the client vanish mid
    /// transaction and rolls back).
    LoseCommit,
    /// Held until [`Proxy::release`], then forwarded.
    Hold,
}

#[derive(Default)]
struct State {
    /// 0 none, 1 LoseAck, 2 LoseCommit.
    armed: AtomicU8,
    /// Commits the server acknowledged whose reply was swallowed.
    acks_lost: AtomicUsize,
    /// Commits swallowed before the server.
    commits_lost: AtomicUsize,
    /// Connections accepted.
    accepted: AtomicUsize,
    /// Commits waiting for `release` (Hold).
    held: AtomicUsize,
}

/// The proxy; it serves until dropped (its tasks are aborted then).
pub struct Proxy {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    state: Arc<State>,
    partitioned: watch::Sender<bool>,
    released: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// A proxy to `target` (`host:port`).
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let (partitioned, rx) = watch::channel(false);
        let (released, rel_rx) = watch::channel(false);
        let target = target.to_string();
        let st = state.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                st.accepted.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(&target).await else {
                    continue;
                };
                conns.spawn(serve(
                    client,
                    server,
                    st.clone(),
                    rx.clone(),
                    rel_rx.clone(),
                ));
            }
        });
        Self {
            port,
            state,
            partitioned,
            released,
            task,
        }
    }

    /// `url` with its host and port replaced by the proxy's.
    pub fn url(&self, url: &str) -> String {
        // postgres://user@host:port/db?…
        let (scheme, rest) = url.split_once("://").unwrap();
        let (auth, after) = match rest.split_once('@') {
            Some((a, r)) => (format!("{a}@"), r),
            None => (String::new(), rest),
        };
        let path = after.find(['/', '?']).map_or("", |i| &after[i..]);
        format!("{scheme}://{auth}127.0.0.1:{}{path}", self.port)
    }

    /// Stops (true) or resumes (false) forwarding.
    pub fn partition(&self, on: bool) {
        self.partitioned.send_replace(on);
    }

    /// The next COMMIT suffers `fault`.
    pub fn arm(&self, fault: CommitFault) {
        let v = match fault {
            CommitFault::LoseAck => 1,
            CommitFault::LoseCommit => 2,
            CommitFault::Hold => 3,
        };
        self.state.armed.store(v, Ordering::SeqCst);
    }

    /// Commits acknowledged by the server whose reply was swallowed.
    pub fn acks_lost(&self) -> usize {
        self.state.acks_lost.load(Ordering::SeqCst)
    }

    /// Commits held (`CommitFault::Hold`) and not yet released.
    pub fn held(&self) -> usize {
        self.state.held.load(Ordering::SeqCst)
    }

    /// Forwards the held commits (and every later armed `Hold` at once).
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// Commits swallowed before they reached the server.
    pub fn commits_lost(&self) -> usize {
        self.state.commits_lost.load(Ordering::SeqCst)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

async fn pass(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|p| !*p).await;
}

async fn serve(
    client: TcpStream,
    server: TcpStream,
    st: Arc<State>,
    rx: watch::Receiver<bool>,
    mut released: watch::Receiver<bool>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // Set by the upstream pump when it forwarded an armed COMMIT.
    let (cut_tx, mut cut_rx) = watch::channel(false);
    let mut up_rx = rx.clone();
    let st_up = st.clone();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            pass(&mut up_rx).await;
            let chunk = &buf[..n];
            if find(chunk, COMMIT_QUERY) {
                match st_up.armed.swap(0, Ordering::SeqCst) {
                    1 => {
                        let _ = cut_tx.send(true);
                        let _ = sw.write_all(chunk).await;
                        // Keep the server side open until its reply came.
                        std::future::pending::<()>().await;
                    }
                    2 => {
                        st_up.commits_lost.fetch_add(1, Ordering::SeqCst);
                        // Cut both sides without forwarding it.
                        return;
                    }
                    3 => {
                        st_up.held.fetch_add(1, Ordering::SeqCst);
                        let _ = released.wait_for(|r| *r).await;
                        st_up.held.fetch_sub(1, Ordering::SeqCst);
                    }
                    _ => {}
                }
            }
            if sw.write_all(chunk).await.is_err() {
                return;
            }
        }
    });
    let mut up = up;
    let mut down_rx = rx;
    let mut buf = vec![0u8; 64 * 1024];
    // What the server sent since the armed COMMIT left (the replies to the
    // statements pipelined before it come first, possibly in chunks of
    // their own).
    let mut swallowed: Vec<u8> = Vec::new();
    loop {
        tokio::select! {
            r = sr.read(&mut buf) => {
                let n = match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                pass(&mut down_rx).await;
                if *cut_rx.borrow() {
                    // Swallow every reply up to the armed COMMIT's, then cut.
                    swallowed.extend_from_slice(&buf[..n]);
                    if find(&swallowed, COMMIT_DONE) {
                        st.acks_lost.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    continue;
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            _ = &mut up => break,
            _ = cut_rx.changed() => {}
        }
    }
    up.abort();
    let _ = cw.shutdown().await;
}
