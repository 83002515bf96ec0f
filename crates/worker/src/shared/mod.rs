//! The floor: what every stage of the worker shares, and imports none of
//! them. The settings (fixed for the worker's life) and the state (the
//! running map, the counters that bound calls, the stop signals), each
//! run's record and its state, a call's slot, the events, the errors, and
//! the statement budget that claims and settlement flushes share.

mod budget;
mod error;
mod events;
mod one_or_many;
mod run_state;
mod running;
mod settings;
mod settled;
mod slot;
mod state;

pub(crate) use budget::StatementBudget;
pub use error::TaskError;
pub(crate) use error::{envelope, panic_message};
pub(crate) use events::Events;
pub use events::WorkerEvent;
pub(crate) use one_or_many::OneOrMany;
pub use run_state::CancelReason;
pub(crate) use running::{CallHold, Hold, Running};
pub(crate) use settings::{ErrorHook, Settings};
pub use settings::{HandlerOptions, WorkerError};
pub(crate) use settled::SettledCount;
pub(crate) use slot::{Ended, Slot};
pub(crate) use state::{Shared, State};
