//! The claim stage: the claim loop ([`claim_loop()`]) claims for the slots
//! free (and, while calls are short, some ahead of them) through the plan
//! (which names draw together, within the limits and the statement
//! budget), registers what it drew in the running map, and hands each call
//! to the call stage as a slot frees, or gives back one that waited too
//! long. It imports the call and settle stages and the floor.

mod claim_loop;
mod draws;
mod limits;
mod plan;
mod ready;
mod register;

pub(crate) use claim_loop::claim_loop;
pub(crate) use draws::plan;
pub(crate) use limits::check;
pub(crate) use plan::Planner;
