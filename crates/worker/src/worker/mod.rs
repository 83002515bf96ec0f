//! On top of the stages: the builder (every setting and its check, the
//! handlers), the [`Worker`] and its run (the stages started, the
//! heartbeat beside them, shutdown after), its handle, and `serve`.

mod builder;
mod handle;
mod handlers;
mod heartbeat;
mod held_sweep;
mod run;
mod shutdown;

pub use builder::WorkerBuilder;
pub use handle::WorkerHandle;
pub use handlers::TaskName;
pub use run::Worker;
