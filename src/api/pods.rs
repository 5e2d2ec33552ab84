//! `GET /v1/pods`: the targets and their resident blocks, as ingest reports them.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::state::ApiState;
use crate::ingest::PodStatus;

#[derive(Serialize)]
pub(super) struct PodsBody {
    pods: Vec<PodStatus>,
}

pub(super) async fn pods_handler(State(state): State<ApiState>) -> Json<PodsBody> {
    Json(PodsBody {
        pods: state.pods.pods(),
    })
}
