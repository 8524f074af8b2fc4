//! `cancel_on_signal` turns SIGTERM into a graceful shutdown. Its own test
//! binary with one test: installing a SIGTERM handler is process-wide, and
//! the test checks that the call itself installed it.

#![cfg(unix)]

use std::time::Duration;

use runkeep_worker::cancel_on_signal;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn sigterm_cancels_the_shutdown_token() {
    let shutdown = CancellationToken::new();
    let listener = cancel_on_signal(shutdown.clone());
    // The handler is in place when the call returns, before this
    // (single-threaded) test yields even once: a SIGTERM sent at any point
    // after the call is a graceful stop, never the default action that
    // kills the process. It is the only test of this binary, so no other
    // listener can have installed the handler first.
    assert!(
        sigterm_caught(),
        "cancel_on_signal returned before installing its SIGTERM handler"
    );
    assert!(!shutdown.is_cancelled());
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("kill(1) runs");
    assert!(status.success());
    tokio::time::timeout(Duration::from_secs(5), shutdown.cancelled())
        .await
        .expect("SIGTERM cancels the shutdown token");
    listener.await.unwrap();
}

/// True when this process has a handler installed for SIGTERM.
fn sigterm_caught() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).expect("SigCgt is hex"))
        .expect("SigCgt in /proc/self/status");
    mask & (1 << (15 - 1)) != 0
}
