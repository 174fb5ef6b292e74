//! Process shutdown: the signals a container runtime or a terminal sends.

/// Completes on SIGINT (Ctrl-C) or SIGTERM (what Kubernetes sends before killing a pod).
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
