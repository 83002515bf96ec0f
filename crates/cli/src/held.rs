//! `waymark held ...` and `waymark emit`: the held ledger seen (what each
//! task waits for: its key's turn, the tasks it names, its event) and
//! operated (release, skip, drop), and events emitted by hand.

use serde_json::{json, Value as Json};
use waymark_store::{HeldFilter, HeldState, HeldTask};

use crate::error::CliError;
use crate::held_args::{EmitArgs, HeldCommand, HeldListArgs};
use crate::render;
use crate::shared::{doc, open, Out};

pub async fn held(url: &str, schema: Option<&str>, command: HeldCommand, json: bool) -> Out {
    let filter = match &command {
        HeldCommand::List(args) => Some(filter(args)?),
        _ => None,
    };
    let store = open(url, schema).await?;
    let (id, action) = match command {
        HeldCommand::List(_) => {
            let rows = store.list_held(&filter.expect("checked above")).await?;
            return Ok(if json { doc(&rows) } else { list(&rows) });
        }
        HeldCommand::Show { id } => {
            let row = store.held(&id).await?.ok_or_else(|| not_held(&id))?;
            return Ok(if json { doc(&row) } else { show(&row) });
        }
        HeldCommand::Release { id } => (id, "release"),
        HeldCommand::Skip { id } => (id, "skip"),
        HeldCommand::Drop { id } => (id, "drop"),
    };
    let out = match action {
        "release" => store.release_held(&id).await,
        "skip" => store.skip_held(&id).await,
        _ => store.drop_held(&id).await,
    };
    let state = out.map_err(|e| match e {
        // Not in a state the command acts on, or no such task: exit 3.
        waymark_store::Error::InvalidArgument(why) => CliError::not_found(why),
        e if e.is_not_found() => not_held(&id),
        e => CliError::from(e),
    })?;
    Ok(if json { doc(&json!({"id": id, "state": state})) } else { format!("{id}: {state}\n") })
}

pub async fn emit(url: &str, schema: Option<&str>, args: EmitArgs, json: bool) -> Out {
    let payload: Json = serde_json::from_str(&args.payload)
        .map_err(|e| CliError::usage(format!("--payload is not JSON: {e}")))?;
    let store = open(url, schema).await?;
    let reached = store.emit(&args.name, payload).await?;
    Ok(if json {
        doc(&json!({"event": args.name, "reached": reached}))
    } else {
        format!("emitted {}: {reached} held task(s) were waiting for it\n", render::clean(&args.name))
    })
}

fn filter(args: &HeldListArgs) -> Result<HeldFilter, CliError> {
    let state = match args.state.as_str() {
        "all" => None,
        "held" => Some(HeldState::Held),
        "released" => Some(HeldState::Released),
        "done" => Some(HeldState::Done),
        "canceled" => Some(HeldState::Canceled),
        other => {
            return Err(CliError::usage(format!(
                "unknown --state {other:?}: expected held, released, done, canceled or all"
            )))
        }
    };
    if args.limit < 1 {
        return Err(CliError::usage(format!("--limit must be at least 1, got {}", args.limit)));
    }
    Ok(HeldFilter { state, order_key: args.key.clone(), flow_id: args.flow.clone(), limit: args.limit })
}

fn not_held(id: &str) -> CliError {
    CliError::not_found(format!("no task {id} in the held ledger"))
}

/// What a row waits for, or how it ended.
fn where_it_is(t: &HeldTask) -> String {
    match t.state {
        HeldState::Held => t.waiting_for().join("; "),
        _ => t.outcome.clone().unwrap_or_default(),
    }
}

fn list(rows: &[HeldTask]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.name.clone(),
                t.queue.clone(),
                t.state.to_string(),
                t.order_key.clone().unwrap_or_default(),
                where_it_is(t),
                render::utc(t.created_at_ms),
            ]
        })
        .collect();
    render::table(&["id", "name", "queue", "state", "key", "waits for / outcome", "submitted (UTC)"], &cells)
}

fn show(t: &HeldTask) -> String {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
    let at = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), render::utc);
    let rows = vec![
        vec!["id".to_owned(), t.id.clone()],
        vec!["name".to_owned(), t.name.clone()],
        vec!["queue".to_owned(), t.queue.clone()],
        vec!["state".to_owned(), t.state.to_string()],
        vec!["outcome".to_owned(), opt(&t.outcome)],
        vec!["flow".to_owned(), opt(&t.flow_id)],
        vec!["key".to_owned(), opt(&t.order_key)],
        vec!["place in key".to_owned(), t.order_seq.map_or_else(|| "-".to_owned(), |s| s.to_string())],
        vec!["after".to_owned(), t.after.join(", ")],
        vec!["still waiting on".to_owned(), t.waiting_on.join(", ")],
        vec!["event".to_owned(), opt(&t.event)],
        vec!["waits for".to_owned(), t.waiting_for().join("; ")],
        vec!["event deadline (UTC)".to_owned(), at(t.event_deadline_ms)],
        vec!["submitted (UTC)".to_owned(), render::utc(t.created_at_ms)],
        vec!["released (UTC)".to_owned(), at(t.released_at_ms)],
        vec!["ended (UTC)".to_owned(), at(t.done_at_ms)],
    ];
    render::table(&["field", "value"], &rows)
}
