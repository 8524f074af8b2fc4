//! What checking a bearer token costs per request: `TokenStore::authenticate`
//! (parse, SHA-256, constant-time compare, and the file look) with the
//! default reload interval (1 s: a stat at most once a second) and with a
//! stat on every request (interval zero), over a file of 100 tokens.
//!
//! `cargo bench -p runkeep-server --bench tokens`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use runkeep::TenantId;
use runkeep_server::auth::{Authenticator, Role};
use runkeep_server::tokens::{TokenFile, TokenStore};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let file = TokenFile::new(dir.path().join("tokens.json"));
    let tenant = TenantId::new("acme").unwrap();
    let mut last = None;
    for _ in 0..100 {
        last = Some(file.create(&tenant, Role::Worker, None).unwrap());
    }
    let token = last.unwrap().secret().to_string();
    let mut wrong = token.clone();
    wrong.pop();
    wrong.push('x');

    let cached = TokenStore::open(file.clone(), Duration::from_secs(1)).unwrap();
    let every = TokenStore::open(file.clone(), Duration::ZERO).unwrap();
    assert!(cached.authenticate(&token).is_some());
    assert!(every.authenticate(&token).is_some());
    c.bench_function("authenticate/valid/reload 1s", |b| {
        b.iter(|| cached.authenticate(&token))
    });
    c.bench_function("authenticate/wrong secret/reload 1s", |b| {
        b.iter(|| cached.authenticate(&wrong))
    });
    c.bench_function("authenticate/valid/stat every request", |b| {
        b.iter(|| every.authenticate(&token))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
