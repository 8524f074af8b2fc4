//! `runkeep serve` and its secrets, through the real binary: the first
//! start's operator token written to `--token-out` (0600, never over a
//! file, nothing secret on stdout), and a token file other users can read
//! refused at start.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::runkeep;

const BOUND: Duration = Duration::from_secs(20);

/// A running `runkeep serve` and everything it printed up to its address.
struct Serve {
    child: Child,
    addr: SocketAddr,
    printed: Vec<String>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn command(dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runkeep"));
    for var in [
        "RUNKEEP_STORE",
        "RUNKEEP_TENANT",
        "RUNKEEP_PROJECT",
        "RUNKEEP_SESSION",
        "RUNKEEP_TOKENS",
        "RUNKEEP_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("NO_COLOR", "1")
        .arg("--store")
        .arg(format!("fs:{}", dir.join("data").display()))
        .args(extra)
        .args(["serve", "--listen", "127.0.0.1:0", "--tokens"])
        .arg(dir.join("tokens.json"));
    cmd
}

/// Starts `runkeep [pre…] serve … [args…]` and waits for its address.
fn serve(dir: &Path, pre: &[&str], args: &[&str]) -> Serve {
    let mut cmd = command(dir, pre);
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("start runkeep serve");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + BOUND;
    let mut printed = Vec::new();
    let addr = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("runkeep serve printed no address: {printed:?}"));
        printed.push(line.clone());
        let rest = line
            .split("listening on http://")
            .nth(1)
            .or_else(|| line.split("\"address\":\"http://").nth(1));
        if let Some(rest) = rest {
            let addr = rest
                .split(|c: char| c.is_whitespace() || c == '"')
                .next()
                .unwrap();
            break addr.parse().expect("a socket address");
        }
    };
    Serve {
        child,
        addr,
        printed,
    }
}

/// Runs a `runkeep serve` that must refuse to start: its exit code and
/// stderr.
fn refused(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = command(dir, &[]);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = common::output_within(&mut cmd, BOUND, "a refused runkeep serve");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!stdout.contains("listening on"), "it served: {stdout}");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn whoami(addr: SocketAddr, token: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(BOUND)).unwrap();
    write!(
        s,
        "GET /v1/whoami HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn token_out_gets_the_first_token_0600_and_stdout_never_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("first-token");
    let out_arg = out.to_str().unwrap();
    let s = serve(dir.path(), &[], &["--token-out", out_arg]);
    for line in &s.printed {
        assert!(!line.contains("rk_"), "a token on stdout: {line}");
    }
    let said = s.printed.join("\n");
    assert!(said.contains(out_arg), "{said}");
    assert_eq!(mode_of(&out), 0o600);
    let text = std::fs::read_to_string(&out).unwrap();
    let token = text.strip_suffix('\n').expect("one line");
    assert!(
        token.starts_with("rk_") && !token.contains('\n'),
        "{text:?}"
    );
    let (status, answer) = whoami(s.addr, token);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"role\":\"operator\""), "{answer}");
    drop(s);

    // A restart with the same command line makes no token and leaves the
    // file as it is.
    let s = serve(dir.path(), &[], &["--token-out", out_arg]);
    for line in &s.printed {
        assert!(!line.contains("rk_"), "a token on stdout: {line}");
    }
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    assert_eq!(whoami(s.addr, token).0, 200);
    let listed = runkeep()
        .args(["--json", "token", "list", "--tokens"])
        .arg(dir.path().join("tokens.json"))
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
}

#[test]
fn token_out_with_json_names_the_file_and_carries_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("first-token");
    let s = serve(
        dir.path(),
        &["--json"],
        &["--token-out", out.to_str().unwrap()],
    );
    let created: serde_json::Value = s
        .printed
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "token-created")
        .unwrap_or_else(|| panic!("no token-created event: {:?}", s.printed));
    assert!(created.get("token").is_none(), "{created}");
    assert_eq!(created["tokenOut"], out.to_str().unwrap());
    assert_eq!(created["role"], "operator");
    for line in &s.printed {
        assert!(!line.contains("rk_"), "a token on stdout: {line}");
    }
    assert_eq!(mode_of(&out), 0o600);
}

#[test]
fn token_out_over_an_existing_file_or_link_is_refused_before_any_token_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("first-token");
    std::fs::write(&out, "another server's token\n").unwrap();
    let (code, stderr) = refused(dir.path(), &["--token-out", out.to_str().unwrap()]);
    assert_eq!(code, Some(78), "{stderr}");
    assert!(
        stderr.contains(out.to_str().unwrap()) && stderr.contains("exists"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "another server's token\n"
    );
    assert!(
        !dir.path().join("tokens.json").exists(),
        "a token was made that nobody has"
    );

    // A planted link: never followed.
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, "keep\n").unwrap();
    let link = dir.path().join("link-token");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (code, stderr) = refused(dir.path(), &["--token-out", link.to_str().unwrap()]);
    assert_eq!(code, Some(78), "{stderr}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n");
    assert!(!dir.path().join("tokens.json").exists());

    // A directory that does not exist: refused, nothing made.
    let nowhere = dir.path().join("no/such/dir/token");
    let (code, stderr) = refused(dir.path(), &["--token-out", nowhere.to_str().unwrap()]);
    assert_eq!(code, Some(78), "{stderr}");
    assert!(!dir.path().join("tokens.json").exists());

    // --demo prints its own tokens: --token-out makes no sense there.
    let (code, stderr) = refused(
        dir.path(),
        &[
            "--demo",
            "--token-out",
            dir.path().join("t").to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("--token-out"), "{stderr}");
}

#[test]
fn a_token_file_other_users_can_read_is_refused_at_start_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    runkeep()
        .args(["token", "create", "--role", "operator", "--tokens"])
        .arg(&tokens)
        .assert()
        .success();
    assert_eq!(mode_of(&tokens), 0o600, "runkeep creates it 0600");
    for mode in [0o644, 0o640, 0o604] {
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(mode)).unwrap();
        let (code, stderr) = refused(dir.path(), &[]);
        assert_eq!(code, Some(78), "{mode:o}: {stderr}");
        for needle in [
            tokens.display().to_string(),
            format!("{mode:04o}"),
            format!("chmod 600 {}", tokens.display()),
        ] {
            assert!(stderr.contains(&needle), "{needle:?} missing: {stderr}");
        }
    }
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let s = serve(dir.path(), &[], &[]);
    drop(s);
}
