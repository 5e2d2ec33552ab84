//! `GET /v1/pods`: the targets and their resident blocks, as ingest reports them.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::state::ApiState;
use crate::ingest::PodStatus;
use crate::store::redis::lease::HaView;

#[derive(Serialize)]
pub(super) struct PodsBody {
    pods: Vec<PodStatus>,
    /// With `ha:`: this replica's role and the lease holder (which replica writes Redis).
    #[serde(skip_serializing_if = "Option::is_none")]
    writer: Option<HaView>,
}

pub(super) async fn pods_handler(State(state): State<ApiState>) -> Json<PodsBody> {
    Json(PodsBody {
        pods: state.pods.pods(),
        writer: state.writer.as_ref().map(|w| w.view()),
    })
}
