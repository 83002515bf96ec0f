//! Submitting: one task, keyed or not, and batches.

use serde_json::Value as Json;
use waymark_protocol::Statement;

use super::admin::cancel;
use super::{finish, task_opt, Store};
use crate::cells::{int8, opt_text};
use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor, PgSession};
use crate::id::new_task_id;
use crate::new_task::{Conflict, NewTask};
use crate::observe;
use crate::options::millis;
use crate::statements::{run, run_opt, Binds};
use crate::task::{Task, TaskStatus};
use crate::value::Value;

impl<E: PgExecutor> Store<E> {
    /// Submits a task. With a key, the whole decision (reuse, reject, replace)
    /// happens in one transaction under the key's advisory lock.
    pub async fn submit(&self, mut task: NewTask) -> Result<Task> {
        let scope = observe::start(self.observer(), |o| o.submit(std::slice::from_mut(&mut task)));
        observe::within(scope, self.submit_one(task)).await
    }

    async fn submit_one(&self, task: NewTask) -> Result<Task> {
        task.validate()?;
        self.life.check()?;
        self.admit_one(&task).await?;
        if task.key.is_none() {
            let id = new_task_id();
            return match insert(&mut self.session()?, &task, &id).await {
                // The executor resent an insert whose first run committed
                // (the connection was lost before the answer): the id is ours,
                // so the row there is this submit's task, not a second one.
                Err(e) if e.sqlstate() == Some("23505") => self.fetch(&id).await,
                other => other,
            };
        }
        let mut tx = self.begin(Lane::Ordinary).await?;
        let out = submit_keyed(&mut tx, &task).await;
        finish(tx, out, "submit").await
    }

    /// Submits many tasks in one statement and one commit, and returns
    /// their ids in the order given (read a task back with [`Store::get`]).
    /// Keyed tasks are refused (each key needs its own lock and check:
    /// submit those one by one). At most 10,000 tasks per call.
    ///
    /// The tasks are taken by value: their payloads and names move into the
    /// statement's arrays instead of being copied (a batch of small tasks
    /// spends most of its client time on copies). When the tasks differ in
    /// their payloads only (one name, queue, metadata and the same options),
    /// what they share is sent once rather than once per task, which the
    /// server inserts faster (`cargo xtask bench` enqueue).
    pub async fn submit_batch(&self, tasks: impl IntoIterator<Item = NewTask>) -> Result<Vec<String>> {
        let (batch, scope) = self.observed_batch(tasks);
        observe::within(scope, async {
            let Some(batch) = self.admitted(batch?).await? else { return Ok(Vec::new()) };
            let ids = batch.ids.clone();
            match insert_batch(&mut self.session()?, batch).await {
                Ok(()) => Ok(ids),
                // Resent after its commit (see `submit`): the ids are ours and
                // the insert is one statement, so if one row is there, all are.
                Err(e) if e.sqlstate() == Some("23505") => {
                    self.fetch(&ids[0]).await?;
                    Ok(ids)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// [`Store::submit_batch`] inside the caller's transaction.
    pub async fn submit_batch_in(
        &self,
        tx: &mut E::Transaction,
        tasks: impl IntoIterator<Item = NewTask>,
    ) -> Result<Vec<String>> {
        let (batch, scope) = self.observed_batch(tasks);
        observe::within(scope, async {
            let Some(batch) = self.admitted(batch?).await? else { return Ok(Vec::new()) };
            let ids = batch.ids.clone();
            insert_batch(tx, batch).await?;
            Ok(ids)
        })
        .await
    }

    /// Submits a task inside the caller's transaction: it exists only if the
    /// caller commits. (An observer counts it submitted when the insert
    /// answers, before the caller's commit.)
    pub async fn submit_in(&self, tx: &mut E::Transaction, mut task: NewTask) -> Result<Task> {
        let scope = observe::start(self.observer(), |o| o.submit(std::slice::from_mut(&mut task)));
        observe::within(scope, async {
            task.validate()?;
            self.life.check()?;
            self.admit_one(&task).await?;
            if task.key.is_none() {
                insert(tx, &task, &new_task_id()).await
            } else {
                submit_keyed(tx, &task).await
            }
        })
        .await
    }

    /// A checked batch with its queues admitted; `None` when it is empty
    /// (nothing to do).
    async fn admitted(&self, batch: Batch) -> Result<Option<Batch>> {
        if batch.ids.is_empty() {
            return Ok(None);
        }
        self.life.check()?;
        self.admit_batch(batch.queues.iter().map(String::as_str)).await?;
        Ok(Some(batch))
    }

    /// The batch's columns, shown to the observer first when there is one
    /// (which may add to each task's metadata).
    fn observed_batch(
        &self,
        tasks: impl IntoIterator<Item = NewTask>,
    ) -> (Result<Batch>, Option<Box<dyn observe::Scope<()>>>) {
        match self.observer() {
            None => (Batch::new(tasks), None),
            Some(observer) => {
                let mut tasks: Vec<NewTask> = tasks.into_iter().collect();
                // An empty batch does nothing, and one over the bound is
                // refused before anything: neither is a submit to observe.
                if tasks.is_empty() || tasks.len() > MAX_BATCH {
                    return (Batch::new(tasks), None);
                }
                let scope = observer.submit(&mut tasks);
                (Batch::new(tasks), scope)
            }
        }
    }
}

async fn insert<S: PgSession + ?Sized>(s: &mut S, t: &NewTask, id: &str) -> Result<Task> {
    let root_id = t.root_id.clone().unwrap_or_else(|| id.to_owned());
    let binds: Binds = vec![
        ("id", id.into()),
        ("name", t.name.as_str().into()),
        ("queue", t.queue.as_str().into()),
        ("payload", t.payload.clone().into()),
        ("metadata", t.metadata.clone().into()),
        ("max_attempts", t.max_attempts.into()),
        ("priority", t.priority.into()),
        ("delay_ms", millis("delay", t.delay)?.into()),
        ("parent_id", t.parent_id.as_deref().into()),
        ("root_id", root_id.into()),
        ("correlation_id", t.correlation_id.as_deref().into()),
    ];
    task_opt(s, Statement::InsertTask, binds)
        .await?
        .ok_or_else(|| Error::Decode("insert_task returned no row".to_owned()))
}

/// Most tasks in one batched submit.
const MAX_BATCH: usize = 10_000;

/// Validates a batch and makes its ids and its JSON rows.
/// A batched submit's columns, one array each, checked and with fresh ids.
struct Batch {
    ids: Vec<String>,
    names: Vec<String>,
    queues: Vec<String>,
    payloads: Vec<Json>,
    metadata: Vec<Json>,
    max_attempts: Vec<i32>,
    priorities: Vec<i32>,
    delays_ms: Vec<i64>,
    parent_ids: Vec<Option<String>>,
    root_ids: Vec<Option<String>>,
    correlation_ids: Vec<Option<String>>,
}

impl Batch {
    fn new(tasks: impl IntoIterator<Item = NewTask>) -> Result<Batch> {
        let tasks: Vec<NewTask> = tasks.into_iter().collect();
        if tasks.len() > MAX_BATCH {
            return Err(Error::invalid(format!(
                "a batch holds at most {MAX_BATCH} tasks, got {}",
                tasks.len()
            )));
        }
        let n = tasks.len();
        let mut b = Batch {
            ids: Vec::with_capacity(n),
            names: Vec::with_capacity(n),
            queues: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            metadata: Vec::with_capacity(n),
            max_attempts: Vec::with_capacity(n),
            priorities: Vec::with_capacity(n),
            delays_ms: Vec::with_capacity(n),
            parent_ids: Vec::with_capacity(n),
            root_ids: Vec::with_capacity(n),
            correlation_ids: Vec::with_capacity(n),
        };
        for (i, t) in tasks.into_iter().enumerate() {
            t.validate().map_err(|e| match e {
                Error::InvalidArgument(why) => Error::invalid(format!("task {i} of the batch: {why}")),
                other => other,
            })?;
            if t.key.is_some() {
                return Err(Error::invalid(format!(
                    "task {i} of the batch has a key; keyed tasks are submitted one by one"
                )));
            }
            b.ids.push(new_task_id());
            b.names.push(t.name);
            b.queues.push(t.queue);
            b.payloads.push(t.payload);
            b.metadata.push(t.metadata);
            b.max_attempts.push(t.max_attempts);
            b.priorities.push(t.priority);
            b.delays_ms.push(millis("delay", t.delay)?);
            b.parent_ids.push(t.parent_id);
            // NULL: the statement makes a top-level task its own root.
            b.root_ids.push(t.root_id);
            b.correlation_ids.push(t.correlation_id);
        }
        Ok(b)
    }

    /// Whether every task shares each column but its id and payload: a
    /// bulk load of one kind, which `insert_task_batch_alike` sends once.
    fn alike(&self) -> bool {
        fn same<T: PartialEq>(column: &[T]) -> bool {
            column.iter().all(|v| *v == column[0])
        }
        !self.ids.is_empty()
            && same(&self.names)
            && same(&self.queues)
            && same(&self.max_attempts)
            && same(&self.priorities)
            && same(&self.delays_ms)
            && same(&self.parent_ids)
            && same(&self.root_ids)
            && same(&self.correlation_ids)
            && same(&self.metadata)
    }

    /// The statement for this batch and its binds: the shared columns once
    /// when the tasks are alike, else one array per column.
    fn binds(self) -> (Statement, Binds) {
        if self.alike() {
            fn first<T>(column: Vec<T>) -> T {
                column.into_iter().next().expect("a batch is not empty")
            }
            let binds: Binds = vec![
                ("ids", Value::TextArray(self.ids)),
                ("payloads", Value::JsonbArray(self.payloads)),
                ("name", first(self.names).into()),
                ("queue", first(self.queues).into()),
                ("metadata", first(self.metadata).into()),
                ("max_attempts", first(self.max_attempts).into()),
                ("priority", first(self.priorities).into()),
                ("delay_ms", first(self.delays_ms).into()),
                ("parent_id", first(self.parent_ids).into()),
                ("root_id", first(self.root_ids).into()),
                ("correlation_id", first(self.correlation_ids).into()),
            ];
            return (Statement::InsertTaskBatchAlike, binds);
        }
        let binds: Binds = vec![
            ("ids", Value::TextArray(self.ids)),
            ("names", Value::TextArray(self.names)),
            ("queues", Value::TextArray(self.queues)),
            ("payloads", Value::JsonbArray(self.payloads)),
            ("metadata", Value::JsonbArray(self.metadata)),
            ("max_attempts", Value::Int4Array(self.max_attempts)),
            ("priorities", Value::Int4Array(self.priorities)),
            ("delays_ms", Value::Int8Array(self.delays_ms)),
            ("parent_ids", Value::NullableTextArray(self.parent_ids)),
            ("root_ids", Value::NullableTextArray(self.root_ids)),
            ("correlation_ids", Value::NullableTextArray(self.correlation_ids)),
        ];
        (Statement::InsertTaskBatch, binds)
    }
}

/// Runs a batched insert and checks that every row went in.
async fn insert_batch<S: PgSession + ?Sized>(s: &mut S, batch: Batch) -> Result<()> {
    let expected = batch.ids.len();
    let (statement, binds) = batch.binds();
    let inserted = match run_opt(s, statement, binds).await? {
        Some(mut row) => int8(&mut row, "inserted")?,
        None => 0,
    };
    if inserted != expected as i64 {
        return Err(Error::Decode(format!("a batched submit of {expected} tasks inserted {inserted} rows")));
    }
    Ok(())
}

async fn submit_keyed<S: PgSession + ?Sized>(s: &mut S, t: &NewTask) -> Result<Task> {
    let key = t.key.as_deref().unwrap_or_default();
    let existing = match key_target(s, key).await? {
        Some(id) => task_opt(s, Statement::Get, vec![("id", id.into())]).await?,
        None => None,
    };
    if let Some(current) = existing {
        let live = !current.status.is_terminal();
        match t.conflict {
            Conflict::Reject => {
                return Err(Error::AlreadyExists { key: key.to_owned(), task_id: current.id });
            }
            Conflict::Reuse | Conflict::ReuseSucceeded if live => return Ok(current),
            Conflict::ReuseSucceeded if current.status == TaskStatus::Succeeded => return Ok(current),
            _ if live => {
                cancel(s, &current.id).await?;
            }
            _ => {}
        }
    }
    let task = insert(s, t, &new_task_id()).await?;
    run(s, Statement::UpsertKey, vec![("key", key.into()), ("task_id", task.id.as_str().into())]).await?;
    Ok(task)
}

/// Takes the key's transaction lock and returns the task id it names.
pub(super) async fn key_target<S: PgSession + ?Sized>(s: &mut S, key: &str) -> Result<Option<String>> {
    run(s, Statement::LockKey, vec![("key", key.into())]).await?;
    match run_opt(s, Statement::GetKey, vec![("key", key.into())]).await? {
        Some(mut row) => opt_text(&mut row, "task_id"),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    /// The statement a batch of `tasks` goes as; its binds fit the
    /// statement's header, each bound and used once.
    fn statement(tasks: Vec<NewTask>) -> Statement {
        let (statement, binds) = Batch::new(tasks).expect("a valid batch").binds();
        let (_, params) = crate::statements::bound(statement, binds).expect("the binds fit the statement");
        assert_eq!(params.len(), 11, "{}", statement.name());
        statement
    }

    #[test]
    fn alike_tasks_share_one_set_of_columns_and_any_difference_sends_arrays() {
        let task = |i: i32| NewTask::new("n", json!({ "i": i })).queue("q").metadata(json!({ "m": 1 }));
        assert_eq!(statement(vec![task(0)]), Statement::InsertTaskBatchAlike, "one task is alike");
        assert_eq!(statement((0..3).map(task).collect()), Statement::InsertTaskBatchAlike, "payloads differ");
        let differ: [fn(NewTask) -> NewTask; 9] = [
            |t| NewTask { name: "other".into(), ..t },
            |t| t.queue("other"),
            |t| t.metadata(json!({ "m": 2 })),
            |t| t.max_attempts(9),
            |t| t.priority(1),
            |t| t.delay(Duration::from_millis(5)),
            |t| t.parent_id("task_p"),
            |t| t.root_id("task_r"),
            |t| t.correlation_id("c"),
        ];
        for (column, change) in differ.into_iter().enumerate() {
            let tasks = vec![task(0), task(1), change(task(2))];
            assert_eq!(statement(tasks), Statement::InsertTaskBatch, "column {column} differs");
        }
    }
}
