//! The held ledger on the dashboard: held tasks with what each waits for,
//! a flow as a tree of its tasks and their states, and an operator's
//! release, skip and drop.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use waymark_store::{HeldFilter, HeldState, HeldTask, PgExecutor};

use crate::api::{error, failed, given, MAX_PAGE};
use crate::App;

#[derive(Debug, Deserialize)]
pub(crate) struct HeldQuery {
    state: Option<String>,
    key: Option<String>,
    flow: Option<String>,
}

/// A ledger row with what it waits for in words.
fn row(t: &HeldTask) -> Value {
    let mut v = serde_json::to_value(t).unwrap_or(Value::Null);
    v["waiting_for"] = json!(t.waiting_for());
    v
}

pub(crate) async fn list<E: PgExecutor + 'static>(
    State(app): State<Arc<App<E>>>,
    Query(q): Query<HeldQuery>,
) -> Response {
    let state = match given(q.state).as_deref() {
        None | Some("held") => Some(HeldState::Held),
        Some("all") => None,
        Some("released") => Some(HeldState::Released),
        Some("done") => Some(HeldState::Done),
        Some("canceled") => Some(HeldState::Canceled),
        Some(other) => return error(StatusCode::BAD_REQUEST, format!("unknown held state {other:?}")),
    };
    let filter = HeldFilter { state, order_key: given(q.key), flow_id: given(q.flow), limit: MAX_PAGE };
    match app.store.list_held(&filter).await {
        Ok(rows) => Json(rows.iter().map(row).collect::<Vec<_>>()).into_response(),
        Err(e) => failed(e),
    }
}

/// One ledger row (404 for a task the ledger does not hold).
pub(crate) async fn one<E: PgExecutor + 'static>(
    State(app): State<Arc<App<E>>>,
    Path(id): Path<String>,
) -> Response {
    match app.store.held(&id).await {
        Ok(Some(t)) => Json(row(&t)).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no task {id} in the held ledger")),
        Err(e) => failed(e),
    }
}

/// A flow's tasks, each with its ledger row and, once released, the
/// status of its cairnq task: the page draws the tree from `after`.
pub(crate) async fn flow<E: PgExecutor + 'static>(
    State(app): State<Arc<App<E>>>,
    Path(id): Path<String>,
) -> Response {
    let filter = HeldFilter { state: None, order_key: None, flow_id: Some(id.clone()), limit: MAX_PAGE };
    let rows = match app.store.list_held(&filter).await {
        Ok(rows) if rows.is_empty() => return error(StatusCode::NOT_FOUND, format!("no flow {id}")),
        Ok(rows) => rows,
        Err(e) => return failed(e),
    };
    let mut tasks = Vec::with_capacity(rows.len());
    for t in rows.iter().rev() {
        let status = match t.state {
            HeldState::Held | HeldState::Canceled => None,
            _ => match app.store.get(&t.id).await {
                Ok(task) => task.map(|task| task.status),
                Err(e) => return failed(e),
            },
        };
        let mut v = row(t);
        v["status"] = json!(status);
        tasks.push(v);
    }
    Json(json!({ "flow": id, "tasks": tasks })).into_response()
}

pub(crate) async fn act<E: PgExecutor + 'static>(
    State(app): State<Arc<App<E>>>,
    Path((id, action)): Path<(String, String)>,
) -> Response {
    let out = match action.as_str() {
        "release" => app.store.release_held(&id).await,
        "skip" => app.store.skip_held(&id).await,
        "drop" => app.store.drop_held(&id).await,
        other => return error(StatusCode::NOT_FOUND, format!("no action {other:?}: release, skip or drop")),
    };
    match out {
        Ok(state) => Json(json!({ "id": id, "state": state })).into_response(),
        Err(e) if e.is_not_found() => error(StatusCode::NOT_FOUND, e.to_string()),
        Err(e) if e.is_invalid_argument() => error(StatusCode::CONFLICT, e.to_string()),
        Err(e) => failed(e),
    }
}
