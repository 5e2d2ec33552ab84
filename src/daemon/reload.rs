//! Hot reload: the config file changed (notify) or SIGHUP arrived → apply its targets.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc::{Receiver, Sender};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Config, ProcessEnv};
use crate::ingest::supervisor::Supervisor;

/// Quiet time after a change before the file is read (editors write in several steps).
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Watches `path` and SIGHUP until cancelled; an invalid new config is logged, counted
/// (`kvindex_reloads_refused_total`) and ignored (the running targets stay).
///
/// The file watch and the SIGHUP handler are in place when this returns, before the caller
/// announces that it started: a change made right after "started" is never missed (the
/// returned future only waits and reloads).
pub fn reload_loop(
    path: PathBuf,
    supervisor: Arc<Supervisor>,
    cancel: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(16);
    let watcher = watch_file(&path, tx.clone());
    #[cfg(unix)]
    let hup = forward_sighup(tx.clone(), cancel.clone());
    drop(tx);
    async move {
        let _watcher = watcher;
        #[cfg(unix)]
        tokio::spawn(hup);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                got = rx.recv() => if got.is_none() { return },
            }
            debounce(&mut rx).await;
            reload(&path, &supervisor).await;
        }
    }
}

/// Watches the file's directory: editors and ConfigMap updates replace the file rather than
/// writing it in place, which a watch on the file itself would miss. `None` when watching
/// is impossible (SIGHUP still reloads).
fn watch_file(path: &Path, tx: Sender<()>) -> Option<notify::RecommendedWatcher> {
    let file_name = path.file_name().map(|n| n.to_os_string());
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            let ours = event
                .paths
                .iter()
                .any(|p| p.file_name().map(|n| n.to_os_string()) == file_name);
            if ours && !matches!(event.kind, notify::EventKind::Access(_)) {
                let _ = tx.try_send(());
            }
        }
    });
    let mut watcher = match watcher {
        Ok(w) => w,
        Err(err) => {
            warn!(error = %err, "Cannot watch files; only SIGHUP reloads.");
            return None;
        }
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    if let Err(err) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        warn!(error = %err, path = %path.display(), "Cannot watch the config file; only SIGHUP reloads.");
    }
    Some(watcher)
}

/// Turns every SIGHUP into a reload request until cancelled. The handler is registered
/// here, synchronously (a SIGHUP right after start-up reloads rather than killing the
/// process); the returned future forwards the signals.
#[cfg(unix)]
fn forward_sighup(
    tx: Sender<()>,
    cancel: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let hup = signal(SignalKind::hangup())
        .inspect_err(|err| warn!(error = %err, "Cannot handle SIGHUP; only file changes reload."))
        .ok();
    async move {
        let Some(mut hup) = hup else { return };
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                got = hup.recv() => {
                    if got.is_none() { return; }
                    info!("SIGHUP: reloading the config.");
                    let _ = tx.try_send(());
                }
            }
        }
    }
}

/// Coalesces a burst of change events into one reload.
async fn debounce(rx: &mut Receiver<()>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(DEBOUNCE) => break,
            got = rx.recv() => if got.is_none() { break },
        }
    }
}

/// Reads the file and applies its targets, or refuses it (counted) when it is invalid.
async fn reload(path: &Path, supervisor: &Supervisor) {
    match Config::from_path(path, &ProcessEnv) {
        Ok(config) => {
            let running = supervisor.shard();
            if config.shard != running {
                // A new owner must restore a moved pod's checkpoint, which happens at start;
                // forgetting here would delete keys the new owner is about to resume.
                warn!(
                    running_index = running.index,
                    running_count = running.count,
                    file_index = config.shard.index,
                    file_count = config.shard.count,
                    "The shard settings changed; they apply at the next restart, the running shard is kept."
                );
            }
            let summary = supervisor.apply(config.targets).await;
            info!(
                added = summary.added.len(),
                removed = summary.removed.len(),
                restarted = summary.restarted.len(),
                "Config reloaded; only targets change at run time."
            );
        }
        Err(err) => {
            crate::metrics::reload_refused();
            warn!(path = %path.display(), "Config reload refused; keeping the running targets: {err}");
        }
    }
}
