//! Hot reload: the config file changed (notify) or SIGHUP arrived → apply its targets.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::targets::Supervisor;
use crate::config::{Config, ProcessEnv};

/// Quiet time after a change before the file is read (editors write in several steps).
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Watches `path` and SIGHUP until cancelled; an invalid new config is logged and ignored
/// (the running targets stay).
pub async fn reload_loop(path: PathBuf, supervisor: Arc<Supervisor>, cancel: CancellationToken) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(16);
    let file_name = path.file_name().map(|n| n.to_os_string());
    let watch_tx = tx.clone();
    // Watch the directory: editors and ConfigMap updates replace the file rather than
    // writing it in place, which a watch on the file itself would miss.
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            let ours = event
                .paths
                .iter()
                .any(|p| p.file_name().map(|n| n.to_os_string()) == file_name);
            if ours && !matches!(event.kind, notify::EventKind::Access(_)) {
                let _ = watch_tx.try_send(());
            }
        }
    });
    let _watcher = match watcher {
        Ok(mut w) => {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), PathBuf::from);
            if let Err(err) = w.watch(&dir, RecursiveMode::NonRecursive) {
                warn!(error = %err, path = %path.display(), "Cannot watch the config file; only SIGHUP reloads.");
            }
            Some(w)
        }
        Err(err) => {
            warn!(error = %err, "Cannot watch files; only SIGHUP reloads.");
            None
        }
    };
    #[cfg(unix)]
    {
        let hup_tx = tx.clone();
        let hup_cancel = cancel.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else {
                return;
            };
            loop {
                tokio::select! {
                    biased;
                    _ = hup_cancel.cancelled() => return,
                    got = hup.recv() => {
                        if got.is_none() { return; }
                        info!("SIGHUP: reloading the config.");
                        let _ = hup_tx.try_send(());
                    }
                }
            }
        });
    }
    drop(tx);
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            got = rx.recv() => if got.is_none() { return },
        }
        // Coalesce a burst of events into one reload.
        loop {
            tokio::select! {
                _ = tokio::time::sleep(DEBOUNCE) => break,
                got = rx.recv() => if got.is_none() { break },
            }
        }
        match Config::from_path(&path, &ProcessEnv) {
            Ok(config) => {
                let summary = supervisor.apply(config.targets).await;
                info!(
                    added = summary.added.len(),
                    removed = summary.removed.len(),
                    restarted = summary.restarted.len(),
                    "Config reloaded; only targets change at run time."
                );
            }
            Err(err) => {
                warn!(path = %path.display(), "Config reload refused; keeping the running targets: {err}")
            }
        }
    }
}
