//! The call stage: a claimed call takes a slot, waits for a runner, and
//! runs its handler (a task's, or a batch's) under a supervisor; each
//! task's end goes to the settle stage, and a one-task call hands its
//! settlement off with its slot and ends. Its entry is [`Runs`]: `start`
//! and `start_all` for what the claim stage hands over, `all_ended` and
//! `abort` for shutdown. It imports the settle stage and the floor.

mod blocking;
mod context;
mod handler;
mod pace;
mod queue;
mod run;
mod runners;
mod start;
mod steps;
mod supervise;

pub use context::TaskContext;
pub use handler::BatchItem;
pub(crate) use handler::{Blocking, Handlers, Kind, Registration, Typed, TypedBatch};
pub(crate) use runners::Runs;
pub(crate) use start::Call;
pub(crate) use supervise::STOP_GRACE;
