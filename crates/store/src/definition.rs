//! Typed task definitions: one name bound to its payload and result types,
//! used by the submitting side and by the worker that registers the
//! handler, so a payload or result of the wrong type is a compile error
//! instead of a task that fails on its first run.
//!
//! Only the name crosses the database: a cairnq Python or TypeScript
//! client submits to the same handler by the name alone.

use std::marker::PhantomData;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::executor::PgExecutor;
use crate::new_task::NewTask;
use crate::store::Store;
use crate::task::Task;

/// A task name with its payload type `P` and result type `R`.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use waymark_store::TaskDef;
///
/// #[derive(Serialize, Deserialize)]
/// struct Email { to: String }
/// #[derive(Serialize, Deserialize)]
/// struct Sent { id: u64 }
///
/// const SEND: TaskDef<Email, Sent> = TaskDef::new("email.send");
/// let task = SEND.task(&Email { to: "ada@example.com".into() }).unwrap().queue("mail");
/// assert_eq!(task.name, "email.send");
/// ```
pub struct TaskDef<P, R> {
    name: &'static str,
    // `fn` marker: Send, Sync and Copy whatever P and R are.
    types: PhantomData<fn(P) -> R>,
}

impl<P, R> TaskDef<P, R> {
    /// A definition of the tasks named `name`.
    pub const fn new(name: &'static str) -> Self {
        TaskDef { name, types: PhantomData }
    }

    /// The task name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<P: Serialize, R> TaskDef<P, R> {
    /// A task of this definition with `payload`, to be given options
    /// ([`NewTask::queue`], a key, ...) and submitted. A payload that does
    /// not serialise to JSON is refused, naming the task.
    pub fn task(&self, payload: &P) -> Result<NewTask> {
        let payload = serde_json::to_value(payload).map_err(|e| {
            Error::invalid(format!("the payload of a {:?} task does not serialise: {e}", self.name))
        })?;
        Ok(NewTask::new(self.name, payload))
    }
}

impl<P, R: DeserializeOwned> TaskDef<P, R> {
    /// The typed result of a succeeded task of this definition.
    /// [`Error::Decode`] names the task when its result does not fit `R`
    /// (written by another client, or an older handler).
    pub fn result(&self, task: &Task) -> Result<R> {
        let raw = task.result.clone().unwrap_or(serde_json::Value::Null);
        serde_json::from_value(raw).map_err(|e| {
            Error::Decode(format!(
                "the result of task {} ({:?}) does not fit its definition: {e}",
                task.id, self.name
            ))
        })
    }
}

impl<P, R> Clone for TaskDef<P, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P, R> Copy for TaskDef<P, R> {}

impl<P, R> std::fmt::Debug for TaskDef<P, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TaskDef").field(&self.name).finish()
    }
}

impl<E: PgExecutor> Store<E> {
    /// [`Store::call`] for a definition: submits `task` (made with
    /// [`TaskDef::task`]) and answers the typed result. A `task` of another
    /// name is refused before anything is submitted.
    pub async fn call_as<P, R: DeserializeOwned>(
        &self,
        def: &TaskDef<P, R>,
        task: NewTask,
        timeout: Duration,
    ) -> Result<R> {
        if task.name != def.name {
            return Err(Error::invalid(format!(
                "call_as({:?}) was given a task named {:?}; make it with the definition's task()",
                def.name, task.name
            )));
        }
        let done = self.call(task, timeout).await?;
        def.result(&done)
    }
}
