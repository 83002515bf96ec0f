//! The page and its JSON API, each on one of the store's operations.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use waymark_store::{ListFilter, PgExecutor, TaskStatus};

use crate::App;

/// The page: one file, no build step; the action header's value filled in.
const PAGE: &str = include_str!("page.html");

/// The most tasks one page of the list asks for.
pub(crate) const MAX_PAGE: i64 = 500;

pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

pub(crate) fn failed(e: waymark_store::Error) -> Response {
    if e.is_invalid_argument() {
        return error(StatusCode::BAD_REQUEST, e.to_string());
    }
    tracing::warn!(error = %e, "waymark dashboard: a store call failed");
    error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

pub(crate) async fn page<E: PgExecutor + 'static>(State(app): State<Arc<App<E>>>) -> Response {
    let html = PAGE.replace("{{CSRF}}", &app.guard.csrf);
    ([(header::CACHE_CONTROL, "no-store")], Html(html)).into_response()
}

pub(crate) async fn stats<E: PgExecutor + 'static>(State(app): State<Arc<App<E>>>) -> Response {
    match app.store.stats(None).await {
        Ok(counts) => Json(counts).into_response(),
        Err(e) => failed(e),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    status: Option<String>,
    queue: Option<String>,
    name: Option<String>,
    root: Option<String>,
    correlation: Option<String>,
    limit: Option<i64>,
    offset: Option<i64>,
}

/// An empty field of the form means "any".
pub(crate) fn given(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.is_empty())
}

pub(crate) async fn list<E: PgExecutor + 'static>(
    State(app): State<Arc<App<E>>>,
    Query(q): Query<ListQuery>,
) -> Response {
    let status = match given(q.status).map(|s| s.parse::<TaskStatus>().map_err(|_| s)).transpose() {
        Ok(status) => status,
        Err(s) => return error(StatusCode::BAD_REQUEST, format!("unknown status {s:?}")),
    };
    let (limit, offset) = (q.limit.unwrap_or(50), q.offset.unwrap_or(0));
    if !(1..=MAX_PAGE).contains(&limit) || offset < 0 {
        return error(
            StatusCode::BAD_REQUEST,
            format!("limit must be 1 to {MAX_PAGE} and offset not negative"),
        );
    }
    let filter = ListFilter {
        status,
        queue: given(q.queue),
        name: given(q.name),
        root_id: given(q.root),
        correlation_id: given(q.correlation),
        limit,
        offset,
    };
    match app.store.list(&filter).await {
        Ok(tasks) => Json(tasks).into_response(),
        Err(e) => failed(e),
    }
}

/// A task with its children (the tasks of its tree whose parent it is,
/// up to a page).
pub(crate) async fn task<E: PgExecutor + 'static>(
    State(app): State<Arc<App<E>>>,
    Path(id): Path<String>,
) -> Response {
    let task = match app.store.get(&id).await {
        Ok(Some(task)) => task,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no task {id}")),
        Err(e) => return failed(e),
    };
    let root = task.root_id.clone().unwrap_or_else(|| task.id.clone());
    let tree = ListFilter { root_id: Some(root), limit: MAX_PAGE, ..ListFilter::default() };
    let children: Vec<_> = match app.store.list(&tree).await {
        Ok(tree) => tree.into_iter().filter(|t| t.parent_id.as_deref() == Some(id.as_str())).collect(),
        Err(e) => return failed(e),
    };
    Json(json!({ "task": task, "children": children })).into_response()
}

pub(crate) async fn cancel<E: PgExecutor + 'static>(
    State(app): State<Arc<App<E>>>,
    Path(id): Path<String>,
) -> Response {
    match app.store.cancel(&id).await {
        Ok(Some(task)) => Json(task).into_response(),
        Ok(None) => not_acted_on(&app, &id, "canceled").await,
        Err(e) => failed(e),
    }
}

pub(crate) async fn retry<E: PgExecutor + 'static>(
    State(app): State<Arc<App<E>>>,
    Path(id): Path<String>,
) -> Response {
    match app.store.retry(&id, false).await {
        Ok(Some(task)) => Json(task).into_response(),
        Ok(None) => not_acted_on(&app, &id, "retried").await,
        Err(e) => failed(e),
    }
}

/// Why an action found nothing to do: no such task, or its status.
async fn not_acted_on<E: PgExecutor + 'static>(app: &App<E>, id: &str, action: &str) -> Response {
    match app.store.get(id).await {
        Ok(Some(t)) => {
            error(StatusCode::CONFLICT, format!("task {id} is {}: it cannot be {action}", t.status))
        }
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no task {id}")),
        Err(e) => failed(e),
    }
}
