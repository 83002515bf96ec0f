//! The settle stage: a run's end becomes its one settlement
//! ([`Settler::settlement_for`]), written batched or alone
//! ([`Settler::settle`], [`Settler::hand_off`]), sent again after a
//! passing failure, and answered: counted, reported, and the call ended by
//! dropping what was left of it. Giving a task back (`release`) is a
//! settlement of its own. It imports only the floor.

mod answer;
mod batch;
mod give_back;
mod outcome;
mod resend;
mod settler;

pub(crate) use batch::FLUSHES_IN_FLIGHT;
pub(crate) use give_back::{release, GiveBack};
pub(crate) use outcome::{HandlerEnd, Outcome};
pub(crate) use settler::Settler;
