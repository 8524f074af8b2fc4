//! `cancel_on_signal` turns SIGTERM into a graceful shutdown. Its own test
//! binary: installing a SIGTERM handler is process-wide.

#![cfg(unix)]

use std::time::Duration;

use runkeep_worker::cancel_on_signal;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn sigterm_cancels_the_shutdown_token() {
    let shutdown = CancellationToken::new();
    let listener = cancel_on_signal(shutdown.clone());
    // The signal is sent only once the listener has installed its SIGTERM
    // handler (bit 15 of SigCgt in /proc/self/status), not after a guessed
    // sleep: sent before, SIGTERM would kill this test process instead. The
    // listener registers on its first poll, which runs while this
    // (single-threaded) test first yields; the handler may also be another
    // test's listener, so yield at least once before trusting the mask.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    tokio::time::sleep(Duration::from_millis(1)).await;
    while !sigterm_caught() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener never installed its SIGTERM handler"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
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

#[tokio::test]
async fn the_listener_ends_when_shutdown_comes_from_elsewhere() {
    let shutdown = CancellationToken::new();
    let listener = cancel_on_signal(shutdown.clone());
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), listener)
        .await
        .expect("the listener task ends")
        .unwrap();
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
