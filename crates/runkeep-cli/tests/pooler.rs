//! `runkeep` behind pgbouncer in transaction mode (the private pgbouncer
//! of runkeep-postgres's tests): without `--pg-direct-url` it exits 78
//! naming the flag; with it and a role carrying runkeep's settings it
//! migrates, writes through the pooler and reads (read-only, on the direct
//! URL); a role without them exits 78 naming the `ALTER ROLE` statements.

mod common;

#[path = "../../runkeep-postgres/tests/common/pgbouncer.rs"]
#[allow(dead_code, reason = "this test uses part of the helper")]
mod pgbouncer;

use common::runkeep;
use runkeep_postgres::{role_settings, PgOptions};

const URL_VAR: &str = "RUNKEEP_TEST_POSTGRES_URL";

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Out {
    let out = runkeep().args(args).output().unwrap();
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn runkeep_behind_pgbouncer_needs_the_direct_url_and_the_role_settings() {
    let Ok(url) = std::env::var(URL_VAR) else {
        eprintln!("SKIPPED: {URL_VAR} is not set");
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bouncer = rt.block_on(pgbouncer::Bouncer::start(&url));
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let (set, bare) = (
        format!("rkc_pool_{}_{n:x}", std::process::id()),
        format!("rkc_bare_{}_{n:x}", std::process::id()),
    );
    let (_, _, database) = pgbouncer::target(&url);
    let options = PgOptions {
        schema: set.clone(),
        ..PgOptions::default()
    };
    let _set_role =
        pgbouncer::RoleGuard::create(&url, &set, &role_settings(&options, &set, &database));
    let _bare_role = pgbouncer::RoleGuard::create(&url, &bare, &[]);
    rt.block_on(bouncer.add_role(&set));
    rt.block_on(bouncer.add_role(&bare));
    let store = |role: &str| {
        format!(
            "{}?schema={role}",
            pgbouncer::with_user_port(&url, role, Some(bouncer.port))
        )
    };
    let direct = |role: &str| pgbouncer::with_user_port(&url, role, None);

    // A pooler without the direct URL: refused, nothing created.
    let r = run(&["--store", &store(&set), "migrate"]);
    assert_eq!(r.code, Some(78), "{}", r.stderr);
    assert!(r.stderr.contains("--pg-direct-url"), "{}", r.stderr);

    // With it: migrate (direct), write (through the pooler), read.
    let with = |role: &str, args: &[&str]| {
        let mut all = vec![
            "--store".to_string(),
            store(role),
            "--pg-direct-url".to_string(),
            direct(role),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        run(&all)
    };
    let r = with(&set, &["migrate"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = with(&set, &["enqueue", "run_x"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = with(&set, &["--json", "runs"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("run_x"), "{}", r.stdout);

    // A role without runkeep's settings: migrated (direct), then refused
    // at its first pooled connection with the statements to run.
    let r = with(&bare, &["migrate"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = with(&bare, &["enqueue", "run_y"]);
    assert_eq!(r.code, Some(78), "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "ALTER ROLE \"{bare}\" IN DATABASE \"{database}\" SET search_path = \"{bare}\";"
        )),
        "{}",
        r.stderr
    );
    drop(bouncer);
}
