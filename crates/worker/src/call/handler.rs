//! Typed handlers behind one object-safe shape: the payload is
//! deserialised into the handler's type and its result serialised, so the
//! worker deals only in JSON.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value as Json;

use super::context::TaskContext;
use super::pace::Pace;
use crate::settle::Outcome;
use crate::shared::{HandlerOptions, TaskError};

/// A registered handler: one task per call, or batches of up to `.1`.
pub(crate) enum Kind<E> {
    One(Arc<dyn Handler<E>>),
    Batch(Arc<dyn BatchHandler<E>>, usize),
}

/// The handlers, by task name (a fast hash: looked up per call).
pub(crate) type Handlers<E> = foldhash::HashMap<String, Registration<E>>;

/// What the builder recorded for one task name.
pub(crate) struct Registration<E> {
    pub(crate) kind: Kind<E>,
    pub(crate) options: HandlerOptions,
    /// A quick handler's record of its calls' first polls, which decides
    /// whether they run in groups (see `pace`); `None` for others.
    pub(crate) pace: Option<Arc<Pace>>,
}

pub(crate) type BoxOutcome = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// A handler with its types erased. The payload is read where it lies (in
/// the claimed task): a handler's type is built from it with no copy of
/// the JSON first.
pub(crate) trait Handler<E>: Send + Sync {
    fn call(&self, ctx: TaskContext<E>, payload: &Json) -> BoxOutcome;
}

/// The payload as a handler's type. A handler of `serde_json::Value`
/// gets a clone: through `Deserialize` the same value would be rebuilt
/// node by node, each map key classified on the way.
fn payload_as<P: DeserializeOwned + 'static>(payload: &Json) -> Result<P, serde_json::Error> {
    if TypeId::of::<P>() == TypeId::of::<Json>() {
        let mut same = Some(payload.clone());
        if let Some(p) = (&mut same as &mut dyn Any).downcast_mut::<Option<P>>().and_then(Option::take) {
            return Ok(p);
        }
    }
    P::deserialize(payload)
}

/// A handler's result as JSON. A `serde_json::Value` is one already, and
/// is moved as it is rather than serialised into a copy of itself.
fn result_json<R: Serialize + 'static>(result: R) -> Result<Json, serde_json::Error> {
    let mut result = Some(result);
    if let Some(json) = (&mut result as &mut dyn Any).downcast_mut::<Option<Json>>().and_then(Option::take) {
        return Ok(json);
    }
    serde_json::to_value(result.take().expect("the result is still here"))
}

/// A typed handler function; the marker pins its payload, result and
/// future types (a `fn` marker, so it is `Send` and `Sync` whatever they are).
pub(crate) struct Typed<F, P, R, Fut>(pub(crate) F, pub(crate) PhantomData<fn(P) -> (R, Fut)>);

impl<E, F, P, R, Fut> Handler<E> for Typed<F, P, R, Fut>
where
    E: Send + Sync + 'static,
    F: Fn(TaskContext<E>, P) -> Fut + Send + Sync + 'static,
    P: DeserializeOwned + Send + 'static,
    R: Serialize + Send + 'static,
    Fut: Future<Output = Result<R, TaskError>> + Send + 'static,
{
    fn call(&self, ctx: TaskContext<E>, payload: &Json) -> BoxOutcome {
        let payload = match payload_as::<P>(payload) {
            Ok(p) => p,
            Err(e) => return Box::pin(std::future::ready(Outcome::BadPayload(e.to_string()))),
        };
        let fut = (self.0)(ctx, payload);
        Box::pin(async move {
            match fut.await {
                Ok(result) => match result_json(result) {
                    Ok(v) => Outcome::Done(v),
                    Err(e) => Outcome::Unserializable(e.to_string()),
                },
                Err(e) => Outcome::Failed(e),
            }
        })
    }
}

/// A synchronous handler, run on tokio's blocking threads so it never
/// holds an async one. Its future ends when the closure returns; if it is
/// dropped first (a time limit, shutdown), the closure runs on and the
/// run's `Running` says so until it returns.
pub(crate) struct Blocking<F, P, R>(pub(crate) Arc<F>, pub(crate) PhantomData<fn(P) -> R>);

impl<E, F, P, R> Handler<E> for Blocking<F, P, R>
where
    E: Send + Sync + 'static,
    F: Fn(TaskContext<E>, P) -> Result<R, TaskError> + Send + Sync + 'static,
    P: DeserializeOwned + Send + 'static,
    R: Serialize + Send + 'static,
{
    fn call(&self, ctx: TaskContext<E>, payload: &Json) -> BoxOutcome {
        let payload = match payload_as::<P>(payload) {
            Ok(p) => p,
            Err(e) => return Box::pin(std::future::ready(Outcome::BadPayload(e.to_string()))),
        };
        let f = self.0.clone();
        let blocking = ctx.blocking_guard();
        let join = tokio::task::spawn_blocking(move || {
            let blocking = blocking;
            blocking.enter(|| f(ctx, payload))
        });
        Box::pin(async move {
            match join.await {
                Ok(Ok(result)) => match result_json(result) {
                    Ok(v) => Outcome::Done(v),
                    Err(e) => Outcome::Unserializable(e.to_string()),
                },
                Ok(Err(e)) => Outcome::Failed(e),
                // The run's catch_unwind turns it into a handler_error.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => {
                    Outcome::Failed(TaskError::new(format!("the blocking handler did not finish: {e}")))
                }
            }
        })
    }
}

/// One task of a batch: its context and its payload.
#[derive(Debug)]
pub struct BatchItem<E, P> {
    /// The task's context: settle it alone with
    /// [`TaskContext::complete`] or [`TaskContext::fail`].
    pub ctx: TaskContext<E>,
    /// Its payload.
    pub payload: P,
}

/// How a batch handler's call ended: an outcome per task id it named (a
/// result, or one that does not serialise; tasks not named succeed with a
/// null result), or one error for every task it did not settle itself.
pub(crate) enum BatchOutcome {
    Done(HashMap<String, Outcome>),
    Failed(TaskError),
}

pub(crate) type BoxBatchOutcome = Pin<Box<dyn Future<Output = BatchOutcome> + Send>>;

/// A batch handler with its types erased. Items whose payload does not
/// fit come back in the second list, with why, and are not passed on.
pub(crate) trait BatchHandler<E>: Send + Sync {
    fn call(&self, items: Vec<(TaskContext<E>, &Json)>) -> (BoxBatchOutcome, Vec<(String, String)>);
}

pub(crate) struct TypedBatch<F, P, R, Fut>(pub(crate) F, pub(crate) PhantomData<fn(P) -> (R, Fut)>);

impl<E, F, P, R, Fut> BatchHandler<E> for TypedBatch<F, P, R, Fut>
where
    E: Send + Sync + 'static,
    F: Fn(Vec<BatchItem<E, P>>) -> Fut + Send + Sync + 'static,
    P: DeserializeOwned + Send + 'static,
    R: Serialize + Send + 'static,
    Fut: Future<Output = Result<HashMap<String, R>, TaskError>> + Send + 'static,
{
    fn call(&self, items: Vec<(TaskContext<E>, &Json)>) -> (BoxBatchOutcome, Vec<(String, String)>) {
        let mut good = Vec::with_capacity(items.len());
        let mut bad = Vec::new();
        for (ctx, payload) in items {
            match payload_as::<P>(payload) {
                Ok(payload) => good.push(BatchItem { ctx, payload }),
                Err(e) => bad.push((ctx.id().to_owned(), e.to_string())),
            }
        }
        if good.is_empty() {
            return (Box::pin(std::future::ready(BatchOutcome::Done(HashMap::new()))), bad);
        }
        let fut = (self.0)(good);
        let outcome = Box::pin(async move {
            match fut.await {
                Ok(results) => BatchOutcome::Done(
                    results
                        .into_iter()
                        .map(|(id, r)| {
                            let outcome = match result_json(r) {
                                Ok(v) => Outcome::Done(v),
                                Err(e) => Outcome::Unserializable(e.to_string()),
                            };
                            (id, outcome)
                        })
                        .collect(),
                ),
                Err(e) => BatchOutcome::Failed(e),
            }
        });
        (outcome, bad)
    }
}
