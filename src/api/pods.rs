//! `GET /v1/pods`: the targets and their resident blocks, as ingest reports them.
//! [`PodsBody`] is the body the handler writes and `kvindex top` reads.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::state::ApiState;
use crate::ingest::PodStatus;
use crate::store::redis::lease::HaView;

/// The `GET /v1/pods` body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodsBody {
    /// The targets.
    pub pods: Vec<PodStatus>,
    /// With `ha:`: this replica's role and the lease holder (which replica writes Redis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<WriterStatus>,
}

/// Which replica writes Redis for this replica's shard, as `GET /v1/pods` reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WriterStatus {
    /// `leader` (this replica writes Redis) or `standby`.
    pub role: String,
    /// This replica's identity (its pod name, or host name and pid).
    #[serde(default)]
    pub replica: String,
    /// The identity of the lease holder as last seen (`None`: nobody holds it).
    pub holder: Option<String>,
    /// Whether this replica has caught up with its sources and may take the lease.
    #[serde(default)]
    pub ready_to_lead: bool,
    /// The lease's time to live, milliseconds.
    #[serde(default)]
    pub lease_ttl_ms: u64,
    /// The lease key.
    #[serde(default)]
    pub lease_key: String,
}

impl From<HaView> for WriterStatus {
    fn from(view: HaView) -> WriterStatus {
        WriterStatus {
            role: view.role.to_owned(),
            replica: view.replica,
            holder: view.holder,
            ready_to_lead: view.ready_to_lead,
            lease_ttl_ms: view.lease_ttl_ms,
            lease_key: view.lease_key,
        }
    }
}

pub(super) async fn pods_handler(State(state): State<ApiState>) -> Json<PodsBody> {
    Json(PodsBody {
        pods: state.pods.pods(),
        writer: state.writer.as_ref().map(|w| w.view().into()),
    })
}
