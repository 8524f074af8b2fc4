//! `cancel_on_signal` turns SIGTERM into a graceful shutdown. Its own test
//! binary: installing a SIGTERM handler is process-wide.

#![cfg(unix)]

use std::time::Duration;

use runkeep::worker::cancel_on_signal;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn sigterm_cancels_the_shutdown_token() {
    let shutdown = CancellationToken::new();
    let listener = cancel_on_signal(shutdown.clone());
    // Let the listener install its handlers before the signal is sent.
    tokio::time::sleep(Duration::from_millis(200)).await;
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
