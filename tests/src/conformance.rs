//! The runner for cairnq's shared conformance scenarios (JSON data; the
//! format is `conformance/FORMAT.md` beside the scenarios). It is general:
//! every step is an operation name and arguments, mapped onto the store, and
//! every check is one of the format's checks. Nothing here knows a scenario.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value as Json};
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{
    ClaimRequest, Conflict, Error, Failure, Lease, ListFilter, NewTask, PgExecutor, PurgeFilter, Store,
    TaskStatus,
};

/// A scenario file, parsed.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The scenario's name.
    pub name: String,
    /// Where it was read from.
    pub path: PathBuf,
    /// Its steps, as JSON objects.
    pub steps: Vec<Json>,
}

/// Reads every `*.json` scenario in `dir`, sorted by file name.
pub fn load_scenarios(dir: &Path) -> Result<Vec<Scenario>, String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            let doc: Json =
                serde_json::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
            let name = doc.get("name").and_then(Json::as_str).map(str::to_owned).unwrap_or_else(|| {
                path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
            });
            let steps = doc
                .get("steps")
                .and_then(Json::as_array)
                .cloned()
                .ok_or_else(|| format!("{}: no \"steps\" array", path.display()))?;
            Ok(Scenario { name, path, steps })
        })
        .collect()
}

/// Runs one scenario on `store` (which must be a fresh installation).
/// `Err` names the failing step and why.
pub async fn run_scenario<E: PgExecutor>(store: &Store<E>, scenario: &Scenario) -> Result<(), String> {
    let mut saved: HashMap<String, Json> = HashMap::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        let op = step.get("op").and_then(Json::as_str).unwrap_or("?");
        run_step(store, step, &mut saved).await.map_err(|e| format!("step {} ({op}): {e}", i + 1))?;
    }
    Ok(())
}

async fn run_step<E: PgExecutor>(
    store: &Store<E>,
    step: &Json,
    saved: &mut HashMap<String, Json>,
) -> Result<(), String> {
    let op = step.get("op").and_then(Json::as_str).ok_or("step has no \"op\"")?;
    let raw_args = step.get("args").cloned().unwrap_or_else(|| json!({}));
    let args = resolve(&raw_args, saved);
    let args = Args(args.as_object().cloned().unwrap_or_default());

    if op == "expect" {
        let target = step.get("target").ok_or("expect step has no \"target\"")?;
        let value = resolve(target, saved);
        return check(step, &value, saved);
    }
    if op == "sleep" {
        let ms = args.int("ms")?.unwrap_or(0);
        // The scenario's own step: real time is what it asks for.
        tokio::time::sleep(Duration::from_millis(ms.max(0) as u64)).await;
        return Ok(());
    }

    let outcome = perform(store, op, &args).await?;
    let expected_error = step.get("expectError").and_then(Json::as_str);
    let result = match (outcome, expected_error) {
        (Ok(value), None) => value,
        (Ok(value), Some(class)) => return Err(format!("expected error {class}, got success: {value}")),
        (Err(e), None) => return Err(format!("unexpected error: {e}")),
        (Err(e), Some(class)) if e.class_name() == class => error_object(&e),
        (Err(e), Some(class)) => return Err(format!("expected error {class}, got {}: {e}", e.class_name())),
    };
    if let Some(alias) = step.get("save").and_then(Json::as_str) {
        saved.insert(alias.to_owned(), result.clone());
    }
    if step.get("expect").is_some() {
        check(step.get("expect").unwrap_or(&Json::Null), &result, saved)?;
    }
    Ok(())
}

fn error_object(e: &Error) -> Json {
    json!({ "type": e.class_name(), "message": e.to_string(), "task_id": e.task_id() })
}

/// Replaces `$alias`, `$alias.field`, `$alias.0.field` strings, recursively.
fn resolve(value: &Json, saved: &HashMap<String, Json>) -> Json {
    match value {
        Json::String(s) if s.starts_with('$') => lookup(&s[1..], saved),
        Json::Array(items) => Json::Array(items.iter().map(|v| resolve(v, saved)).collect()),
        Json::Object(map) => Json::Object(map.iter().map(|(k, v)| (k.clone(), resolve(v, saved))).collect()),
        other => other.clone(),
    }
}

fn lookup(path: &str, saved: &HashMap<String, Json>) -> Json {
    let mut parts = path.split('.');
    let Some(mut current) = parts.next().and_then(|alias| saved.get(alias)).cloned() else {
        return Json::Null;
    };
    for part in parts {
        current = match (&current, part.parse::<usize>()) {
            (Json::Array(items), Ok(i)) => items.get(i).cloned().unwrap_or(Json::Null),
            (Json::Object(map), _) => map.get(part).cloned().unwrap_or(Json::Null),
            _ => Json::Null,
        };
    }
    current
}

/// Applies the checks in `spec` (an `expect` object, or a standalone expect
/// step) to `target`.
fn check(spec: &Json, target: &Json, saved: &HashMap<String, Json>) -> Result<(), String> {
    let field = |name: &str| target.get(name).cloned().unwrap_or(Json::Null);
    if let Some(expected) = spec.get("equals") {
        match expected {
            Json::Object(fields) => {
                for (name, want) in fields {
                    let got = field(name);
                    if !json_eq(&got, want) {
                        return Err(format!("{name}: expected {want}, got {got}"));
                    }
                }
            }
            other if !json_eq(target, other) => return Err(format!("expected {other}, got {target}")),
            _ => {}
        }
    }
    if let Some(reference) = spec.get("equalsRef") {
        let want = resolve(reference, saved);
        if !json_eq(target, &want) {
            return Err(format!("expected {want} ({reference}), got {target}"));
        }
    }
    if let Some(reference) = spec.get("notEqualsRef") {
        let other = resolve(reference, saved);
        if json_eq(target, &other) {
            return Err(format!("expected something other than {other} ({reference})"));
        }
    }
    if let Some(reference) = spec.get("greaterThanRef") {
        let other = resolve(reference, saved);
        match (target.as_f64(), other.as_f64()) {
            (Some(a), Some(b)) if a > b => {}
            _ => return Err(format!("expected {target} > {other} ({reference})")),
        }
    }
    if let Some(n) = spec.get("length").and_then(Json::as_u64) {
        let len = target.as_array().map(Vec::len);
        if len != Some(n as usize) {
            return Err(format!(
                "expected length {n}, got {}",
                len.map_or("no array".to_owned(), |l| l.to_string())
            ));
        }
    }
    for (key, want_null) in [("notNull", false), ("isNull", true)] {
        for name in spec.get(key).and_then(Json::as_array).into_iter().flatten() {
            let name = name.as_str().unwrap_or_default();
            let got = field(name);
            if got.is_null() != want_null {
                return Err(format!(
                    "{name}: expected {}, got {got}",
                    if want_null { "null" } else { "not null" }
                ));
            }
        }
    }
    Ok(())
}

/// JSON equality that keeps integers and floats apart, as the format asks.
fn json_eq(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => {
            x.is_f64() == y.is_f64() && x.as_f64() == y.as_f64() && (x.is_f64() || x == y)
        }
        (Json::Array(x), Json::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b)),
        (Json::Object(x), Json::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// A step's arguments, with typed accessors that name the bad argument.
struct Args(Map<String, Json>);

impl Args {
    fn get(&self, name: &str) -> Option<&Json> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn str(&self, name: &str) -> Result<Option<String>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!("argument {name} must be a string, got {other}")),
        }
    }

    fn req_str(&self, name: &str) -> Result<String, String> {
        self.str(name)?.ok_or_else(|| format!("argument {name} is required"))
    }

    fn int(&self, name: &str) -> Result<Option<i64>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => {
                v.as_i64().map(Some).ok_or_else(|| format!("argument {name} must be an integer, got {v}"))
            }
        }
    }

    /// A count of milliseconds, as the scenarios spell durations.
    fn millis(&self, name: &str) -> Result<Option<Duration>, String> {
        self.int(name)?
            .map(|n| {
                u64::try_from(n)
                    .map(Duration::from_millis)
                    .map_err(|_| format!("argument {name} must not be negative, got {n}"))
            })
            .transpose()
    }

    /// The lease a step's owned write names: its id and worker_id.
    fn lease(&self) -> Result<Lease, String> {
        Ok(Lease::new(self.req_str("id")?, self.req_str("worker_id")?))
    }

    fn int4(&self, name: &str) -> Result<Option<i32>, String> {
        self.int(name)?
            .map(|n| i32::try_from(n).map_err(|_| format!("argument {name} is out of range: {n}")))
            .transpose()
    }

    fn float(&self, name: &str) -> Result<Option<f64>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => {
                v.as_f64().map(Some).ok_or_else(|| format!("argument {name} must be a number, got {v}"))
            }
        }
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => {
                v.as_bool().map(Some).ok_or_else(|| format!("argument {name} must be a boolean, got {v}"))
            }
        }
    }

    fn strings(&self, name: &str) -> Result<Option<Vec<String>>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_owned).ok_or_else(|| format!("argument {name} must hold strings"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(format!("argument {name} must be an array of strings, got {other}")),
        }
    }

    fn json(&self, name: &str) -> Option<Json> {
        self.get(name).cloned()
    }

    fn status(&self, name: &str) -> Result<Option<TaskStatus>, String> {
        self.str(name)?.map(|s| s.parse::<TaskStatus>().map_err(|e| e.to_string())).transpose()
    }
}

fn to_json<T: serde::Serialize>(value: T) -> Json {
    serde_json::to_value(value).unwrap_or(Json::Null)
}

/// Runs one store operation. The outer `Err` is a malformed step; the inner
/// result is the operation's own outcome.
async fn perform<E: PgExecutor>(store: &Store<E>, op: &str, a: &Args) -> Result<Result<Json, Error>, String> {
    let out = match op {
        "submit" => {
            let mut t = NewTask::new(a.req_str("name")?, a.json("payload").unwrap_or_else(|| json!({})));
            t.key = a.str("key")?;
            if let Some(c) = a.str("conflict")? {
                match c.parse::<Conflict>() {
                    Ok(c) => t.conflict = c,
                    Err(e) => return Ok(Err(e)),
                }
            }
            if let Some(q) = a.str("queue")? {
                t.queue = q;
            }
            t.max_attempts = a.int4("max_attempts")?.unwrap_or(t.max_attempts);
            t.priority = a.int4("priority")?.unwrap_or(t.priority);
            t.metadata = a.json("metadata").unwrap_or(t.metadata);
            t.delay = a.millis("delay_ms")?.unwrap_or_default();
            t.parent_id = a.str("parent_id")?;
            t.root_id = a.str("root_id")?;
            t.correlation_id = a.str("correlation_id")?;
            store.submit(t).await.map(to_json)
        }
        "get" => store.get(&a.req_str("id")?).await.map(to_json),
        "get_by_key" => store.get_by_key(&a.req_str("key")?).await.map(to_json),
        "get_status" => store.get_status(&a.req_str("id")?).await.map(to_json),
        "get_status_by_key" => store.get_status_by_key(&a.req_str("key")?).await.map(to_json),
        "list" => {
            let defaults = ListFilter::default();
            let filter = ListFilter {
                status: a.status("status")?,
                queue: a.str("queue")?,
                name: a.str("name")?,
                root_id: a.str("root_id")?,
                correlation_id: a.str("correlation_id")?,
                limit: a.int("limit")?.unwrap_or(defaults.limit),
                offset: a.int("offset")?.unwrap_or(defaults.offset),
            };
            store.list(&filter).await.map(to_json)
        }
        "stats" => store.stats(a.str("queue")?.as_deref()).await.map(to_json),
        "queue_depth" => {
            let depth = a.int("max_depth")?.ok_or("argument max_depth is required")?;
            store.queue_depth(&a.req_str("queue")?, depth).await.map(to_json)
        }
        "cancel" => store.cancel(&a.req_str("id")?).await.map(to_json),
        "cancel_by_key" => store.cancel_by_key(&a.req_str("key")?).await.map(to_json),
        "retry" => {
            store.retry(&a.req_str("id")?, a.bool("reset_attempt")?.unwrap_or(false)).await.map(to_json)
        }
        "retry_by_key" => store
            .retry_by_key(&a.req_str("key")?, a.bool("reset_attempt")?.unwrap_or(false))
            .await
            .map(to_json),
        "purge" => {
            let mut filter = PurgeFilter::older_than(a.millis("older_than_ms")?.unwrap_or_default());
            filter.queue = a.str("queue")?;
            filter.status = a.status("status")?;
            filter.name = a.str("name")?;
            filter.limit = a.int("limit")?.unwrap_or(filter.limit);
            store.purge(&filter).await.map(to_json)
        }
        "claim" => {
            let mut req =
                ClaimRequest::new(a.req_str("worker_id")?, a.strings("queues")?.unwrap_or_default());
            req.names = a.strings("names")?;
            req.lease = a.millis("lease_ms")?.unwrap_or(req.lease);
            req.limit = a.int("limit")?.unwrap_or(req.limit);
            store.claim(&req).await.map(to_json)
        }
        "heartbeat" => store
            .heartbeat(&a.lease()?, a.millis("lease_ms")?.unwrap_or(Duration::from_secs(30)))
            .await
            .map(to_json),
        "heartbeat_batch" => store
            .heartbeat_batch(
                &a.strings("ids")?.unwrap_or_default(),
                &a.req_str("worker_id")?,
                a.millis("lease_ms")?.unwrap_or(Duration::from_secs(30)),
            )
            .await
            // FORMAT.md: each row is {id, cancel_requested} with a boolean,
            // as the SDKs answer id -> cancel requested.
            .map(|beats| {
                beats
                    .iter()
                    .map(|b| json!({"id": b.id, "cancel_requested": b.cancel_requested_at_ms.is_some()}))
                    .collect::<Json>()
            }),
        "progress" => {
            store.progress(&a.lease()?, a.float("progress")?, a.str("message")?.as_deref()).await.map(to_json)
        }
        "succeed" => store
            .succeed(&a.lease()?, a.json("result").unwrap_or(Json::Null), a.str("message")?.as_deref())
            .await
            .map(to_json),
        "complete" => store.complete(&a.lease()?, a.json("result").unwrap_or(Json::Null)).await.map(to_json),
        "fail" => {
            let failure = Failure {
                error: a.json("error").unwrap_or_else(|| json!({})),
                retryable: a.bool("retryable")?.unwrap_or(true),
                delay: a.millis("delay_ms")?.unwrap_or_default(),
            };
            store.fail(&a.lease()?, &failure).await.map(to_json)
        }
        other => return Err(format!("unknown op {other:?}")),
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_by_type() {
        assert!(json_eq(&json!(1), &json!(1)));
        assert!(!json_eq(&json!(1), &json!(1.0)));
        assert!(json_eq(&json!(1.0), &json!(1.0)));
        assert!(json_eq(&json!({"a": [1, {"b": null}]}), &json!({"a": [1, {"b": null}]})));
        assert!(!json_eq(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
    }

    #[test]
    fn references_resolve_through_fields_and_indexes() {
        let mut saved = HashMap::new();
        saved.insert("c".to_owned(), json!([{"id": "x"}]));
        assert_eq!(resolve(&json!("$c.0.id"), &saved), json!("x"));
        assert_eq!(resolve(&json!({"k": ["$c.0.id"]}), &saved), json!({"k": ["x"]}));
        assert_eq!(resolve(&json!("$missing.id"), &saved), Json::Null);
        assert_eq!(resolve(&json!("plain"), &saved), json!("plain"));
    }

    #[test]
    fn checks_fail_with_a_reason() {
        let saved = HashMap::new();
        let target = json!({"status": "queued", "attempt": 1});
        assert!(check(&json!({"equals": {"status": "queued"}}), &target, &saved).is_ok());
        let err = check(&json!({"equals": {"attempt": 2}}), &target, &saved).expect_err("mismatch");
        assert!(err.contains("attempt"), "{err}");
        assert!(check(&json!({"isNull": ["queued"]}), &Json::Null, &saved).is_ok());
        assert!(check(&json!({"notNull": ["status"]}), &target, &saved).is_ok());
        assert!(check(&json!({"length": 1}), &json!([1, 2]), &saved).is_err());
    }
}
