//! The token store: hashed at rest, constant-time compare, revocation
//! without a restart, no lost update between two writers, fail closed.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use runkeep::TenantId;
use runkeep_server::auth::{Authenticator, Role};
use runkeep_server::tokens::{Revoked, TokenFile, TokenStore};
use sha2::{Digest, Sha256};

fn tenant(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}

fn file_in(dir: &tempfile::TempDir) -> TokenFile {
    TokenFile::new(dir.path().join("tokens.json"))
}

#[test]
fn a_created_token_authenticates_as_its_tenant_and_role_and_the_file_never_holds_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    let created = file
        .create(&tenant("acme"), Role::Worker, Some("ci"))
        .unwrap();
    let secret = created.secret().to_string();
    assert!(secret.starts_with("rk_"), "{secret}");
    // 256 bits of secret in hex after the id.
    let (_, hex) = secret["rk_".len()..].split_once('_').unwrap();
    assert_eq!(hex.len(), 64);

    let text = std::fs::read_to_string(file.path()).unwrap();
    assert!(!text.contains(&secret), "the file holds the token");
    assert!(!text.contains(hex), "the file holds the secret part");
    let digest: String = Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(text.contains(&digest), "the file keeps the SHA-256: {text}");
    let mode = std::fs::metadata(file.path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "token file mode {mode:o}");
    assert!(
        !format!("{created:?}").contains(hex),
        "Debug shows the secret"
    );

    let store = TokenStore::open(file.clone(), Duration::ZERO).unwrap();
    let who = store
        .authenticate(&secret)
        .expect("the new token is accepted");
    assert_eq!(who.tenant, tenant("acme"));
    assert_eq!(who.role, Role::Worker);
    assert_eq!(who.token_id, created.record.id);
    let listed = file.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].label.as_deref(), Some("ci"));
    assert!(listed[0].is_active());
}

#[test]
fn a_wrong_secret_of_the_same_length_and_malformed_tokens_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    let created = file.create(&tenant("acme"), Role::Operator, None).unwrap();
    let other = file.create(&tenant("acme"), Role::Reader, None).unwrap();
    let store = TokenStore::open(file.clone(), Duration::ZERO).unwrap();
    let secret = created.secret();

    // Same id, same length, last hex digit changed.
    let mut wrong = secret.to_string();
    let last = wrong.pop().unwrap();
    wrong.push(if last == '0' { '1' } else { '0' });
    assert_eq!(wrong.len(), secret.len());
    assert!(store.authenticate(&wrong).is_none());
    // One token's id with another's secret.
    let (_, other_secret) = other.secret()["rk_".len()..].split_once('_').unwrap();
    let spliced = format!("rk_{}_{other_secret}", created.record.id);
    assert!(store.authenticate(&spliced).is_none());
    // The stored hash presented as if it were the token.
    let stored = &file.list().unwrap()[0].sha256;
    assert!(store
        .authenticate(&format!("rk_{}_{stored}", created.record.id))
        .is_none());
    for bad in [
        "",
        "rk_",
        "Bearer x",
        &secret[..secret.len() - 1],
        &format!("{secret}0"),
    ] {
        assert!(store.authenticate(bad).is_none(), "{bad:?} was accepted");
    }
    assert!(store.authenticate(secret).is_some());
}

#[test]
fn a_revoked_token_is_refused_by_a_running_store_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    let created = file.create(&tenant("acme"), Role::Worker, None).unwrap();
    let store = TokenStore::open(file.clone(), Duration::ZERO).unwrap();
    assert!(store.authenticate(created.secret()).is_some());

    // Another process's `runkeep token revoke`: its own TokenFile.
    let elsewhere = TokenFile::new(file.path());
    assert!(matches!(
        elsewhere.revoke(&created.record.id).unwrap(),
        Revoked::Now(_)
    ));
    assert!(store.authenticate(created.secret()).is_none());
    assert!(matches!(
        elsewhere.revoke(&created.record.id).unwrap(),
        Revoked::Already(_)
    ));
    assert!(elsewhere.revoke("nosuchtoken0").is_err());

    // A token created after the store opened works at once.
    let later = elsewhere
        .create(&tenant("acme"), Role::Reader, None)
        .unwrap();
    assert_eq!(
        store.authenticate(later.secret()).map(|p| p.role),
        Some(Role::Reader)
    );
    // Revoked stays in the list, marked.
    let listed = file.list().unwrap();
    assert_eq!(listed.len(), 2);
    assert!(!listed[0].is_active() && listed[1].is_active());
}

#[test]
fn the_reload_interval_bounds_how_long_a_revocation_takes() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    let created = file.create(&tenant("acme"), Role::Worker, None).unwrap();
    let store = TokenStore::open(file.clone(), Duration::from_millis(200)).unwrap();
    assert!(store.authenticate(created.secret()).is_some());
    file.revoke(&created.record.id).unwrap();
    // Within the interval the store has not looked; once it has passed, it
    // must have (the bound the module doc promises).
    std::thread::sleep(Duration::from_millis(250));
    assert!(store.authenticate(created.secret()).is_none());
}

#[test]
fn an_unreadable_token_file_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    let created = file.create(&tenant("acme"), Role::Worker, None).unwrap();
    let store = TokenStore::open(file.clone(), Duration::ZERO).unwrap();
    assert!(store.authenticate(created.secret()).is_some());
    // A hand edit gone wrong (written by rename, as an editor would).
    let tmp = dir.path().join("edit");
    std::fs::write(&tmp, b"{ not json").unwrap();
    std::fs::rename(&tmp, file.path()).unwrap();
    assert!(store.authenticate(created.secret()).is_none());
    assert!(TokenStore::open(file.clone(), Duration::ZERO).is_err());
    assert!(file.create(&tenant("acme"), Role::Worker, None).is_err());
    // Deleted: no tokens at all.
    std::fs::remove_file(file.path()).unwrap();
    assert!(store.authenticate(created.secret()).is_none());
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    assert!(file
        .create(&tenant("acme"), Role::Worker, Some("two\nlines"))
        .is_err());
    assert!(!file.path().exists());
    assert!("admin".parse::<Role>().is_err());
    assert_eq!("operator".parse::<Role>().unwrap(), Role::Operator);
}

/// Two writers: A reads the file and is held (the hook) while B tries to
/// create a token. B must wait for A's lock, so neither token is lost.
/// Without the lock, B reads, writes and finishes while A is held, then A
/// writes its stale list over B's token.
#[test]
fn two_concurrent_creates_lose_neither_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.json");
    TokenFile::new(&path)
        .create(&tenant("acme"), Role::Reader, Some("first"))
        .unwrap();

    let (read_tx, read_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let a_path = path.clone();
    let a = std::thread::spawn(move || {
        TokenFile::new(&a_path)
            .update(|tokens| {
                read_tx.send(tokens.len()).unwrap();
                go_rx.recv().unwrap();
                let mut t = tokens[0].clone();
                t.id = "aaaaaaaaaaaa".into();
                t.label = Some("from A".into());
                tokens.push(t);
                Ok(())
            })
            .unwrap();
    });
    assert_eq!(read_rx.recv().unwrap(), 1, "A read the file");

    let b_started = Arc::new(AtomicBool::new(false));
    let b_done = Arc::new(AtomicBool::new(false));
    let (b_path, started, done) = (path.clone(), b_started.clone(), b_done.clone());
    let b = std::thread::spawn(move || {
        started.store(true, Ordering::SeqCst);
        let t = TokenFile::new(&b_path)
            .create(&tenant("acme"), Role::Worker, Some("from B"))
            .unwrap();
        done.store(true, Ordering::SeqCst);
        t
    });
    // Give B every chance to race past A.
    while !b_started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(300));
    let b_finished_while_a_held = b_done.load(Ordering::SeqCst);
    go_tx.send(()).unwrap();
    a.join().unwrap();
    let b_token = b.join().unwrap();

    let tokens = TokenFile::new(&path).list().unwrap();
    let labels: Vec<_> = tokens.iter().filter_map(|t| t.label.clone()).collect();
    assert!(
        !b_finished_while_a_held,
        "B wrote while A held the file: there is no lock"
    );
    assert_eq!(labels, ["first", "from A", "from B"], "{labels:?}");
    let store = TokenStore::open(TokenFile::new(&path), Duration::ZERO).unwrap();
    assert!(store.authenticate(b_token.secret()).is_some());
}

/// One request over a fresh connection: the status code.
async fn status_of(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{auth}\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut text))
        .await
        .unwrap()
        .unwrap();
    let code = text.split(' ').nth(1).unwrap().parse().unwrap();
    (code, text)
}

#[tokio::test]
async fn a_running_server_answers_401_for_a_revoked_token_and_404_for_another_tenant() {
    use runkeep_server::server::{self, Server, ServerConfig};
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    let acme = file.create(&tenant("acme"), Role::Reader, None).unwrap();
    let other = file
        .create(&tenant("globex"), Role::Operator, None)
        .unwrap();
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        tokens: file.path().to_path_buf(),
        token_reload_every: Duration::ZERO,
        ..ServerConfig::default()
    };
    let store: Arc<dyn runkeep::RunStore> = Arc::new(runkeep::MemoryStore::new());
    let state = server::state(&config, store).unwrap();
    let server = Server::bind(config, state).await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(std::future::pending()));

    assert_eq!(
        status_of(addr, "/v1/tenants/acme/runs", Some(acme.secret()))
            .await
            .0,
        200
    );
    // Another tenant's token: as if the tenant's runs did not exist.
    let (code, body) = status_of(addr, "/v1/tenants/acme/runs", Some(other.secret())).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(status_of(addr, "/v1/tenants/acme/runs", None).await.0, 401);

    file.revoke(&acme.record.id).unwrap();
    let (code, body) = status_of(addr, "/v1/tenants/acme/runs", Some(acme.secret())).await;
    assert_eq!(code, 401, "a revoked token still works: {body}");
    assert!(!body.contains(acme.secret()));
    // The open routes need no token at all.
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(status_of(addr, open, None).await.0, 200, "{open}");
    }
}

/// A token file that group or other users may read or change is refused
/// when a server starts, with an error naming the file, its mode and the
/// fix; owner-only modes pass.
#[test]
fn a_token_file_group_or_others_can_read_is_refused_at_start_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    let created = file.create(&tenant("acme"), Role::Operator, None).unwrap();
    let path = file.path().to_path_buf();
    for mode in [0o640, 0o604, 0o644, 0o660, 0o606, 0o610] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = TokenStore::open(file.clone(), Duration::ZERO).unwrap_err();
        assert!(
            matches!(e, runkeep_server::tokens::TokenError::Permissions { .. }),
            "{mode:o}: {e:?}"
        );
        let text = e.to_string();
        for needle in [
            path.display().to_string(),
            format!("{mode:04o}"),
            format!("chmod 600 {}", path.display()),
        ] {
            assert!(text.contains(&needle), "{needle:?} missing from {text:?}");
        }
        // The whole server refuses to start with it.
        let config = runkeep_server::server::ServerConfig {
            tokens: path.clone(),
            ..Default::default()
        };
        let store = Arc::new(runkeep::MemoryStore::new()) as Arc<dyn runkeep::RunStore>;
        assert!(matches!(
            runkeep_server::server::state(&config, store),
            Err(runkeep_server::server::ServeError::Tokens(_))
        ));
    }
    for mode in [0o600, 0o400] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let store = TokenStore::open(file.clone(), Duration::ZERO).unwrap();
        assert!(store.authenticate(created.secret()).is_some(), "{mode:o}");
    }
}

/// A running server that finds the file replaced by one others can read
/// fails closed, as for an unreadable file; a rewrite by runkeep (0600)
/// heals it.
#[test]
fn a_reload_that_finds_a_file_others_can_read_fails_closed_and_a_rewrite_heals_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    let created = file.create(&tenant("acme"), Role::Worker, None).unwrap();
    let store = TokenStore::open(file.clone(), Duration::ZERO).unwrap();
    assert!(store.authenticate(created.secret()).is_some());
    // A hand copy with the default umask's 0644, renamed into place.
    let tmp = dir.path().join("edit");
    std::fs::copy(file.path(), &tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::rename(&tmp, file.path()).unwrap();
    assert!(store.authenticate(created.secret()).is_none());
    // `runkeep token create` rewrites it 0600: served again.
    let other = file.create(&tenant("acme"), Role::Reader, None).unwrap();
    let mode = std::fs::metadata(file.path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(store.authenticate(created.secret()).is_some());
    assert!(store.authenticate(other.secret()).is_some());
}

/// The token file and its lock file are created 0600 whatever the umask.
#[test]
fn the_token_file_and_its_lock_are_created_owner_only_even_under_umask_0() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    let old = rustix::process::umask(rustix::fs::Mode::empty());
    let created = file.create(&tenant("acme"), Role::Operator, None);
    rustix::process::umask(old);
    created.unwrap();
    let lock = dir.path().join("tokens.json.lock");
    for p in [file.path(), lock.as_path()] {
        let mode = std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} is {mode:o}", p.display());
    }
}

/// A token file owned by another user than the server's is refused at
/// start, naming the owner, this uid and the `chown` that fixes it. As
/// root (CI) the file is given to uid 65534; as another user, a file root
/// owns (`/etc/passwd`) is presented: the owner is checked before anything
/// else, so either way the refusal is the owner's.
#[test]
fn a_token_file_another_user_owns_is_refused_naming_the_fix() {
    use runkeep_server::tokens::TokenError;
    let euid = rustix::process::geteuid().as_raw();
    let dir = tempfile::tempdir().unwrap();
    let (file, owner) = if euid == 0 {
        let file = file_in(&dir);
        file.create(&tenant("acme"), Role::Operator, None).unwrap();
        std::os::unix::fs::chown(file.path(), Some(65534), None).unwrap();
        (file, 65534)
    } else {
        (TokenFile::new("/etc/passwd"), 0)
    };
    let e = TokenStore::open(file.clone(), Duration::ZERO).unwrap_err();
    assert!(
        matches!(e, TokenError::Owner { uid, euid: e2, .. } if uid == owner && e2 == euid),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!("chown {euid} {}", file.path().display())),
        "{text}"
    );
    if euid == 0 {
        // Given back to the server's uid, it is served.
        std::os::unix::fs::chown(file.path(), Some(0), None).unwrap();
        TokenStore::open(file, Duration::ZERO).unwrap();
    }
}

/// The token file's directory: group- or world-writable without the
/// sticky bit is refused (another user could rename a file of their own
/// over the token file), naming the fix; 0700, 0755 and a sticky 1777
/// (`/tmp`: only the file's owner may replace it there) pass. As root, a
/// directory owned by another user is refused too.
#[test]
fn a_token_file_in_a_directory_others_can_write_is_refused_naming_the_fix() {
    use runkeep_server::tokens::TokenError;
    let dir = tempfile::tempdir().unwrap();
    let file = file_in(&dir);
    let created = file.create(&tenant("acme"), Role::Operator, None).unwrap();
    let set =
        |mode| std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    for mode in [0o777, 0o775, 0o757, 0o770] {
        set(mode);
        let e = TokenStore::open(file.clone(), Duration::ZERO).unwrap_err();
        assert!(matches!(e, TokenError::Directory { .. }), "{mode:o}: {e:?}");
        let text = e.to_string();
        for needle in [
            dir.path().display().to_string(),
            format!("{mode:04o}"),
            format!("chmod go-w {}", dir.path().display()),
        ] {
            assert!(text.contains(&needle), "{needle:?} missing from {text:?}");
        }
        // The whole server refuses to start with it.
        let config = runkeep_server::server::ServerConfig {
            tokens: file.path().to_path_buf(),
            ..Default::default()
        };
        let store = Arc::new(runkeep::MemoryStore::new()) as Arc<dyn runkeep::RunStore>;
        assert!(matches!(
            runkeep_server::server::state(&config, store),
            Err(runkeep_server::server::ServeError::Tokens(_))
        ));
    }
    for mode in [0o700, 0o755, 0o1777, 0o1770] {
        set(mode);
        let store = TokenStore::open(file.clone(), Duration::ZERO)
            .unwrap_or_else(|e| panic!("{mode:o}: {e}"));
        assert!(store.authenticate(created.secret()).is_some(), "{mode:o}");
    }
    // A running server whose directory becomes writable fails closed.
    set(0o700);
    let store = TokenStore::open(file.clone(), Duration::ZERO).unwrap();
    set(0o777);
    // The reload happens when the file changes: rewrite it (as an edit would).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    file.create(&tenant("acme"), Role::Reader, None).unwrap();
    set(0o777);
    assert!(store.authenticate(created.secret()).is_none());
    set(0o700);
    if rustix::process::geteuid().as_raw() == 0 {
        std::os::unix::fs::chown(dir.path(), Some(65534), None).unwrap();
        let e = TokenStore::open(file.clone(), Duration::ZERO).unwrap_err();
        assert!(matches!(e, TokenError::Directory { .. }), "{e:?}");
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        std::os::unix::fs::chown(dir.path(), Some(0), None).unwrap();
    }
}
