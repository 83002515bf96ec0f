//! Registering handlers on a [`WorkerBuilder`]: async, blocking and batch,
//! each under a name or a [`TaskDef`], with or without [`HandlerOptions`].

use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use waymark_store::{PgExecutor, TaskDef};

use super::builder::WorkerBuilder;
use crate::call::{BatchItem, Blocking, Kind, TaskContext, Typed, TypedBatch};
use crate::shared::{HandlerOptions, TaskError};

impl<E: PgExecutor + 'static> WorkerBuilder<E> {
    /// Registers the handler for tasks named `name` (a string, or a
    /// [`TaskDef`], whose payload and result types the handler must then
    /// have). The payload is deserialised into `P` (a mismatch fails the
    /// task for good); the result `R` is serialised as the task's result.
    pub fn task<N, F, P, R, Fut>(self, name: N, handler: F) -> Self
    where
        N: TaskName<P, R>,
        F: Fn(TaskContext<E>, P) -> Fut + Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        Fut: Future<Output = Result<R, TaskError>> + Send + 'static,
    {
        self.task_with(name, HandlerOptions::new(), handler)
    }

    /// [`WorkerBuilder::task`] with limits: a resource, a `max_running`.
    pub fn task_with<N, F, P, R, Fut>(self, name: N, options: HandlerOptions, handler: F) -> Self
    where
        N: TaskName<P, R>,
        F: Fn(TaskContext<E>, P) -> Fut + Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        Fut: Future<Output = Result<R, TaskError>> + Send + 'static,
    {
        self.register(name.into_name(), Kind::One(Arc::new(Typed(handler, PhantomData))), options)
    }

    /// Registers a synchronous handler: each call runs on tokio's blocking
    /// threads (never an async one), with the same lease renewal,
    /// cancellation (poll [`TaskContext::is_cancelled`]) and settlement.
    /// Past `max_run_time` or the shutdown grace its task is settled or
    /// handled as for any handler, but the closure cannot be stopped: it
    /// runs on, its writes refused; at shutdown its task is left to its
    /// lease rather than given back while it still runs.
    pub fn blocking_task<N, F, P, R>(self, name: N, handler: F) -> Self
    where
        N: TaskName<P, R>,
        F: Fn(TaskContext<E>, P) -> Result<R, TaskError> + Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
    {
        self.blocking_task_with(name, HandlerOptions::new(), handler)
    }

    /// [`WorkerBuilder::blocking_task`] with limits.
    pub fn blocking_task_with<N, F, P, R>(self, name: N, options: HandlerOptions, handler: F) -> Self
    where
        N: TaskName<P, R>,
        F: Fn(TaskContext<E>, P) -> Result<R, TaskError> + Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
    {
        // Its calls await their thread: never run in a group.
        let options = HandlerOptions { quick: false, ..options };
        self.register(
            name.into_name(),
            Kind::One(Arc::new(Blocking(Arc::new(handler), PhantomData))),
            options,
        )
    }

    /// Registers a batch handler (`max` from 1 to 10,000): each call takes up to `max` claimed tasks
    /// of `name` at once (as many as are due, never waiting to fill), and
    /// counts as one call against the concurrency and the limits. It may
    /// settle tasks itself ([`TaskContext::complete`], [`TaskContext::fail`]);
    /// the rest settle by how it returned: `Ok(results)` completes each with
    /// its entry by task id (null if it has none), `Err` fails each with
    /// that error. A task whose payload does not fit `P` fails alone and is
    /// not passed on. A lost lease drops that task's settlement only.
    pub fn batch_task<N, F, P, R, Fut>(self, name: N, max: usize, handler: F) -> Self
    where
        N: TaskName<P, R>,
        F: Fn(Vec<BatchItem<E, P>>) -> Fut + Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        Fut: Future<Output = Result<HashMap<String, R>, TaskError>> + Send + 'static,
    {
        self.batch_task_with(name, max, HandlerOptions::new(), handler)
    }

    /// [`WorkerBuilder::batch_task`] with limits (each counts calls).
    pub fn batch_task_with<N, F, P, R, Fut>(
        self,
        name: N,
        max: usize,
        options: HandlerOptions,
        handler: F,
    ) -> Self
    where
        N: TaskName<P, R>,
        F: Fn(Vec<BatchItem<E, P>>) -> Fut + Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        Fut: Future<Output = Result<HashMap<String, R>, TaskError>> + Send + 'static,
    {
        self.register(name.into_name(), Kind::Batch(Arc::new(TypedBatch(handler, PhantomData)), max), options)
    }
}

/// What a handler can be registered under: a name (any payload and result
/// types), or a [`TaskDef`] (exactly its types, so a handler of other types
/// does not compile).
///
/// ```
/// # fn demo(store: waymark_store::Store<waymark_pool::PgPool>) {
/// use waymark_store::TaskDef;
/// use waymark_worker::Worker;
///
/// const DOUBLE: TaskDef<i64, i64> = TaskDef::new("double");
/// let _ = Worker::builder(store).task(DOUBLE, |_ctx, n: i64| async move { Ok(n * 2) });
/// # }
/// ```
///
/// A handler whose payload is not the definition's is refused by the compiler:
///
/// ```compile_fail
/// # fn demo(store: waymark_store::Store<waymark_pool::PgPool>) {
/// use waymark_store::TaskDef;
/// use waymark_worker::Worker;
///
/// const DOUBLE: TaskDef<i64, i64> = TaskDef::new("double");
/// let _ = Worker::builder(store).task(DOUBLE, |_ctx, n: String| async move { Ok(n.len() as i64) });
/// # }
/// ```
pub trait TaskName<P, R> {
    /// The task name.
    fn into_name(self) -> String;
}

impl<P, R> TaskName<P, R> for &str {
    fn into_name(self) -> String {
        self.to_owned()
    }
}

impl<P, R> TaskName<P, R> for String {
    fn into_name(self) -> String {
        self
    }
}

impl<P, R> TaskName<P, R> for &String {
    fn into_name(self) -> String {
        self.clone()
    }
}

impl<P, R> TaskName<P, R> for TaskDef<P, R> {
    fn into_name(self) -> String {
        self.name().to_owned()
    }
}

impl<P, R> TaskName<P, R> for &TaskDef<P, R> {
    fn into_name(self) -> String {
        self.name().to_owned()
    }
}
