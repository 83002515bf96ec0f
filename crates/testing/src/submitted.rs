//! What a piece of code submitted: tasks by name and a part of the payload.

use serde_json::Value as Json;
use waymark_store::{ListFilter, PgExecutor, Store, Task};

/// The tasks named `name` whose payload contains `payload` (every field of
/// `payload` is in the task's, recursively; `json!({})` matches any),
/// newest first, whatever their status.
pub async fn submitted<E: PgExecutor>(store: &Store<E>, name: &str, payload: Json) -> Vec<Task> {
    let filter = ListFilter { name: Some(name.to_owned()), limit: 10_000, ..ListFilter::default() };
    let tasks = store.list(&filter).await.unwrap_or_else(|e| panic!("listing tasks named {name:?}: {e}"));
    tasks.into_iter().filter(|t| contains(&t.payload, &payload)).collect()
}

/// The one task named `name` whose payload contains `payload`. Panics,
/// listing what was submitted under that name, if there is none or more
/// than one.
pub async fn require_submitted<E: PgExecutor>(store: &Store<E>, name: &str, payload: Json) -> Task {
    let mut found = submitted(store, name, payload.clone()).await;
    if found.len() == 1 {
        return found.remove(0);
    }
    let all = submitted(store, name, Json::Object(Default::default())).await;
    let seen: Vec<String> = all.iter().map(|t| format!("{} {} {}", t.id, t.status, t.payload)).collect();
    panic!(
        "expected one task {name:?} with a payload containing {payload}, found {}; submitted under that name: {seen:#?}",
        found.len()
    )
}

/// Whether `have` holds everything in `want`: objects field by field,
/// anything else equal.
fn contains(have: &Json, want: &Json) -> bool {
    match (have, want) {
        (Json::Object(have), Json::Object(want)) => {
            want.iter().all(|(k, w)| have.get(k).is_some_and(|h| contains(h, w)))
        }
        _ => have == want,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::contains;

    #[test]
    fn a_payload_contains_its_parts() {
        let have = json!({"to": "a", "n": 1, "deep": {"x": [1, 2], "y": null}});
        assert!(contains(&have, &json!({})));
        assert!(contains(&have, &json!({"to": "a"})));
        assert!(contains(&have, &json!({"deep": {"x": [1, 2]}})));
        assert!(!contains(&have, &json!({"to": "b"})));
        assert!(!contains(&have, &json!({"deep": {"x": [1]}})));
        assert!(!contains(&have, &json!({"missing": null})));
        assert!(contains(&json!(5), &json!(5)));
    }
}
