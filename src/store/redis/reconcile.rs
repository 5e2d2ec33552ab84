//! Bringing Redis back in line with the index after an outage (or at start-up). Once Redis
//! answers a PING, writes resume at once and the reconcile runs as a background pass (see
//! `anti_entropy/`): recorded keys whose last write may not have landed and that the
//! index no longer holds are deleted, then every field and mapping key the index holds is
//! written, in chunks between flushes, so ingest never waits for it and no copy of the index
//! is made. Flush waiters are answered once it is done. Only kvindex's own keys are touched.

use super::mirror::{connect, is_auth_error, Writer};

impl Writer {
    /// One reconcile attempt; on failure the writer stays dirty and retries after backoff.
    pub(super) async fn try_reconcile(&mut self) {
        if self.standby {
            return;
        }
        // Redis must answer before the background rewrite starts.
        if let Err(err) = redis::cmd("PING").query_async::<()>(&mut self.conn).await {
            self.go_dirty(&err);
            if is_auth_error(&err) {
                self.renew_connection().await;
            }
            return;
        }
        let stale = std::mem::take(&mut self.touched);
        self.start_rewrite(stale);
        self.go_clean();
    }

    /// A fresh connection after an authentication failure: the connection manager reconnects
    /// by itself only after I/O errors, so once its credentials were refused (a password
    /// rotated and back) it would keep answering with that refusal forever.
    async fn renew_connection(&mut self) {
        match connect(&self.config().target).await {
            Ok(conn) => self.conn = conn,
            Err(err) => {
                tracing::debug!(error = %err, "Could not open a fresh Redis connection; retrying after the backoff.")
            }
        }
    }
}
