//! A private pgbouncer (Debian's `pgbouncer`, 1.18; `scripts/prepare.sh`
//! installs it) in **transaction** pool mode in front of the test server:
//! its own ini, user list and port in a temporary directory, started as a
//! child and stopped when dropped, or when the test process exits (a shell
//! between them kills it, and removes the directory, once its stdin, held
//! here, closes).
//!
//! Roles are added to its user list (trust authentication still wants the
//! name listed) with [`Bouncer::add_role`], which reloads it through the
//! admin console.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

/// Where Debian installs it.
const BINARY: &str = "/usr/sbin/pgbouncer";

pub struct Bouncer {
    pub port: u16,
    dir: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Its admin console ([`Bouncer::admin`]).
    admin_url: String,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        // The shell kills pgbouncer once its stdin closes.
        drop(self.stdin.take());
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `(host, port, database)` of `url`.
pub fn target(url: &str) -> (String, u16, String) {
    let config: tokio_postgres::Config = url.parse().unwrap();
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or("postgres").to_string();
    (host, port, db)
}

/// `url` with its user and port replaced (host kept).
pub fn with_user_port(url: &str, user: &str, port: Option<u16>) -> String {
    let (host, p, db) = target(url);
    format!("postgres://{user}@{host}:{}/{db}", port.unwrap_or(p))
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

impl Bouncer {
    /// Starts one in front of `url`'s server, 3 server sessions per role;
    /// panics saying what to install when the binary is missing.
    pub async fn start(url: &str) -> Self {
        Self::start_with(url, 3).await
    }

    /// [`Bouncer::start`] with `pool_size` server sessions per role.
    pub async fn start_with(url: &str, pool_size: usize) -> Self {
        assert!(
            std::path::Path::new(BINARY).exists(),
            "{BINARY} is missing: install Debian's pgbouncer (scripts/prepare.sh does, as root)"
        );
        let (host, pg_port, _) = target(url);
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let dir =
            std::env::temp_dir().join(format!("runkeep-pgbouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ini = format!(
            "[databases]\n\
             * = host={host} port={pg_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {users}\n\
             admin_users = postgres\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_db_connections = {max_db}\n\
             max_client_conn = 400\n\
             server_idle_timeout = 2\n\
             logfile =\n\
             pidfile =\n",
            users = dir.join("users.txt").display(),
            max_db = (4 * pool_size).max(12)
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        // pgbouncer will not run as root: it drops to postgres, which must
        // read the files.
        set_mode(&dir, 0o755);
        set_mode(&dir.join("pgbouncer.ini"), 0o644);
        set_mode(&dir.join("users.txt"), 0o644);
        let user = if running_as_root() { "-u postgres" } else { "" };
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{BINARY} {user} {ini} & p=$!; read _; kill $p; wait $p; rm -rf {dir}",
                ini = dir.join("pgbouncer.ini").display(),
                dir = dir.display()
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let stdin = child.stdin.take();
        let b = Self {
            port,
            dir,
            child,
            stdin,
            admin_url: format!("postgres://postgres@127.0.0.1:{port}/pgbouncer"),
        };
        // Up when it accepts (it starts in milliseconds; the bound only
        // stops a broken start from hanging the test).
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return b;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("pgbouncer did not start on port {port}");
    }

    /// Lists `role` for trust authentication and reloads.
    pub async fn add_role(&self, role: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join("users.txt"))
            .unwrap();
        // One write of the whole line: `writeln!` writes in pieces, and two
        // tests adding roles at once interleaved them into lines that
        // listed neither role.
        f.write_all(format!("\"{role}\" \"\"\n").as_bytes())
            .unwrap();
        drop(f);
        // Reloaded until pgbouncer lists the role (a check, bounded: a
        // role it never lists fails here, not as a login refused later).
        for _ in 0..100 {
            self.admin("RELOAD").await;
            if self
                .admin("SHOW USERS")
                .await
                .iter()
                .any(|u| u.get("name").map(String::as_str) == Some(role))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("pgbouncer never listed role {role} after reloading its auth file");
    }

    /// A command on the admin console; answers its rows, column name to
    /// text.
    pub async fn admin(&self, command: &str) -> Vec<HashMap<String, String>> {
        let (client, conn) = tokio_postgres::connect(&self.admin_url, tokio_postgres::NoTls)
            .await
            .expect("connect to pgbouncer's admin console");
        let driver = tokio::spawn(conn);
        let out = client
            .simple_query(command)
            .await
            .unwrap_or_else(|e| panic!("pgbouncer {command}: {e}"))
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                    r.columns()
                        .iter()
                        .enumerate()
                        .map(|(i, c)| (c.name().to_string(), r.get(i).unwrap_or("").to_string()))
                        .collect(),
                ),
                _ => None,
            })
            .collect();
        drop(client);
        let _ = driver.await;
        out
    }

    /// Server sessions pgbouncer holds for `user` (any state).
    pub async fn server_sessions(&self, user: &str) -> usize {
        self.admin("SHOW SERVERS")
            .await
            .iter()
            .filter(|r| r.get("user").map(String::as_str) == Some(user))
            .count()
    }

    /// Client connections to pgbouncer as `user`.
    pub async fn client_connections(&self, user: &str) -> usize {
        self.admin("SHOW CLIENTS")
            .await
            .iter()
            .filter(|r| r.get("user").map(String::as_str) == Some(user))
            .count()
    }
}

fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `sql` on `url` (PostgreSQL directly), on a thread and runtime of
/// its own (so it works in a guard's `drop` too).
pub fn run_direct(url: &str, sql: &str) -> Result<(), tokio_postgres::Error> {
    let url = url.to_string();
    let sql = sql.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            let driver = tokio::spawn(conn);
            let r = client.batch_execute(&sql).await;
            drop(client);
            let _ = driver.await;
            r
        })
    })
    .join()
    .expect("the direct statement's thread")
}

/// A login role for one test (superuser: it migrates its own schema),
/// dropped with the guard, with what it owns (its test schema, whichever
/// guard drops first).
pub struct RoleGuard {
    url: String,
    pub role: String,
}

impl RoleGuard {
    /// Creates `role` on `url`'s server; `settings` are run after (e.g.
    /// `runkeep_postgres::role_settings`).
    pub fn create(url: &str, role: &str, settings: &[String]) -> Self {
        run_direct(
            url,
            &format!(
                "CREATE ROLE \"{role}\" LOGIN SUPERUSER; {}",
                settings.join(" ")
            ),
        )
        .unwrap_or_else(|e| panic!("create role {role}: {e}"));
        Self {
            url: url.to_string(),
            role: role.to_string(),
        }
    }
}

impl Drop for RoleGuard {
    fn drop(&mut self) {
        if let Err(e) = run_direct(
            &self.url,
            &format!(
                "DROP OWNED BY \"{0}\" CASCADE; DROP ROLE IF EXISTS \"{0}\"",
                self.role
            ),
        ) {
            eprintln!("could not drop test role {}: {e}", self.role);
        }
    }
}
