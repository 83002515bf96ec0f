//! Typed handlers behind one object-safe shape: the payload is
//! deserialised into the handler's type and its result serialised, so the
//! worker deals only in JSON.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value as Json;

use crate::context::TaskContext;
use crate::error::TaskError;

/// How one run of a handler ended, before settlement.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The result, serialised.
    Done(Json),
    /// The handler returned an error.
    Failed(TaskError),
    /// The payload did not deserialise into the handler's type.
    BadPayload(String),
    /// The result did not serialise.
    Unserializable(String),
}

pub(crate) type BoxOutcome = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// A handler with its types erased.
pub(crate) trait Handler<E>: Send + Sync {
    fn call(&self, ctx: TaskContext<E>, payload: Json) -> BoxOutcome;
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
    fn call(&self, ctx: TaskContext<E>, payload: Json) -> BoxOutcome {
        let payload = match serde_json::from_value::<P>(payload) {
            Ok(p) => p,
            Err(e) => return Box::pin(std::future::ready(Outcome::BadPayload(e.to_string()))),
        };
        let fut = (self.0)(ctx, payload);
        Box::pin(async move {
            match fut.await {
                Ok(result) => match serde_json::to_value(result) {
                    Ok(v) => Outcome::Done(v),
                    Err(e) => Outcome::Unserializable(e.to_string()),
                },
                Err(e) => Outcome::Failed(e),
            }
        })
    }
}
