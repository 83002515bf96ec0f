//! Held tasks ([`Held`]) and flows of them ([`Flow`]): a task that waits in
//! waymark's ledger for its turn in a key's order, for the tasks it depends
//! on to succeed, or for an event, and becomes an ordinary cairnq task in
//! the transaction that lets it go. Checked, and put in an order the
//! database can take them in, before any I/O.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde_json::{json, Value as Json};

use crate::error::{Error, Result};
use crate::id::new_task_id;
use crate::new_task::{NewTask, MAX_DELAY_MS};
use crate::options::{millis, non_empty};

/// What happens to a task held for an event when its deadline passes first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDeadline {
    /// The task is canceled in the ledger, with every task held behind it.
    #[default]
    Cancel,
    /// The task goes without the event: its metadata's `waymark_event` says
    /// `timed_out`.
    Release,
}

impl OnDeadline {
    fn as_str(self) -> &'static str {
        match self {
            OnDeadline::Cancel => "cancel",
            OnDeadline::Release => "release",
        }
    }
}

/// A task held until its turn in a key's order, until the tasks it names
/// succeed, and until an event, whichever of these it is given; with none,
/// it goes at once. Made from a [`NewTask`] (`NewTask::ordered_by`,
/// `after`, `on_event`, or `Held::from`); its id is made here, so that
/// other held tasks can name it before it is submitted.
///
/// ```
/// use waymark_store::{Held, NewTask};
/// let charge = NewTask::new("charge", serde_json::json!({})).ordered_by("account:42");
/// let ship = NewTask::new("ship", serde_json::json!({})).after([charge.id()]);
/// assert!(ship.id().starts_with("task_"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    id: String,
    task: NewTask,
    order_key: Option<String>,
    after: Vec<String>,
    event: Option<String>,
    deadline: Option<(Duration, OnDeadline)>,
    flow_id: Option<String>,
}

impl From<NewTask> for Held {
    fn from(task: NewTask) -> Self {
        Held {
            id: new_task_id(),
            task,
            order_key: None,
            after: Vec::new(),
            event: None,
            deadline: None,
            flow_id: None,
        }
    }
}

impl NewTask {
    /// This task, held for its turn in `key`'s order: see [`Held::ordered_by`].
    pub fn ordered_by(self, key: impl Into<String>) -> Held {
        Held::from(self).ordered_by(key)
    }

    /// This task, held until the tasks `ids` name succeed: see [`Held::after`].
    pub fn after<I: Into<String>>(self, ids: impl IntoIterator<Item = I>) -> Held {
        Held::from(self).after(ids)
    }

    /// This task, held until the event `name`: see [`Held::on_event`].
    pub fn on_event(self, name: impl Into<String>) -> Held {
        Held::from(self).on_event(name)
    }
}

impl Held {
    /// The id the task has, held and after its release.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The task it becomes.
    pub fn task(&self) -> &NewTask {
        &self.task
    }

    /// Holds the task for its turn in `key`: the tasks of one key run one
    /// at a time, in the order their submits commit, each released when
    /// the one before it has succeeded. One that fails for good or is
    /// canceled after its release holds the key until an operator skips,
    /// drops or retries it; other keys go on.
    pub fn ordered_by(mut self, key: impl Into<String>) -> Self {
        self.order_key = Some(key.into());
        self
    }

    /// Holds the task until every task `ids` name has succeeded (held tasks,
    /// of this flow or submitted before, or plain tasks of `cairnq_tasks`).
    /// When one ends without success, this task is canceled in the ledger,
    /// and so is every task held behind it.
    pub fn after<I: Into<String>>(mut self, ids: impl IntoIterator<Item = I>) -> Self {
        self.after.extend(ids.into_iter().map(Into::into));
        self
    }

    /// Holds the task until the event `name` is emitted
    /// ([`Store::emit`](crate::Store::emit)); an event emitted earlier and
    /// still kept counts. Its payload reaches the task in its metadata, as
    /// `waymark_event: {name, payload}`.
    pub fn on_event(mut self, name: impl Into<String>) -> Self {
        self.event = Some(name.into());
        self
    }

    /// How long the task waits for its event before `then` applies. Needs
    /// [`Held::on_event`]. Defaults to no deadline.
    pub fn deadline(mut self, after: Duration, then: OnDeadline) -> Self {
        self.deadline = Some((after, then));
        self
    }

    /// Checks everything that needs no database.
    fn check(&self) -> Result<()> {
        self.task.validate()?;
        let id = &self.id;
        if self.task.key.is_some() {
            return Err(Error::invalid(format!(
                "held task {id} has a key: a key names a task of cairnq_tasks, which a held task \
                 is not in until its release; use ordered_by for a key's order"
            )));
        }
        let texts = [("order key", self.order_key.as_ref()), ("event name", self.event.as_ref())];
        for (what, text) in texts.into_iter().filter_map(|(w, t)| t.map(|t| (w, t))) {
            non_empty(what, text)?;
            if text.contains('\0') {
                return Err(Error::invalid(format!("held task {id}: {what} holds a NUL character")));
            }
        }
        for dep in &self.after {
            non_empty("an id in after", dep)?;
            if dep.contains('\0') {
                return Err(Error::invalid(format!("held task {id}: an id in after holds a NUL character")));
            }
            if dep == id {
                return Err(Error::invalid(format!("held task {id} names itself in after")));
            }
        }
        if let Some((after, _)) = self.deadline {
            if self.event.is_none() {
                return Err(Error::invalid(format!(
                    "held task {id} has a deadline but waits for no event: deadline needs on_event"
                )));
            }
            longest_wait("deadline", after)?;
        }
        Ok(())
    }

    fn to_json(&self) -> Result<Json> {
        let t = &self.task;
        let deps: BTreeSet<&String> = self.after.iter().collect();
        Ok(json!({
            "id": self.id,
            "flow_id": self.flow_id,
            "name": t.name,
            "queue": t.queue,
            "payload": t.payload,
            "metadata": t.metadata,
            "max_attempts": t.max_attempts,
            "priority": t.priority,
            "delay_ms": millis("delay", t.delay)?,
            "parent_id": t.parent_id,
            "root_id": t.root_id,
            "correlation_id": t.correlation_id,
            "order_key": self.order_key,
            "after": deps,
            "event": self.event,
            "deadline_ms": self.deadline.map(|(d, _)| millis("deadline", d)).transpose()?,
            "on_deadline": self.deadline.map(|(_, then)| then.as_str()),
        }))
    }
}

/// `d` in ms, refused (naming `what`) past a task's longest delay
/// ([`MAX_DELAY_MS`]).
pub(crate) fn longest_wait(what: &str, d: Duration) -> Result<i64> {
    let ms = millis(what, d)?;
    if ms > MAX_DELAY_MS {
        return Err(Error::invalid(format!("{what} of {d:?} is too long: at most 10,000 years")));
    }
    Ok(ms)
}

/// Held tasks that go in together, in one transaction: a graph of
/// dependencies (checked for cycles), keys' orders, events. Their ledger
/// rows share the flow's id, which the CLI and the dashboard show them by.
///
/// ```
/// use serde_json::json;
/// use waymark_store::{Flow, NewTask};
/// let mut flow = Flow::new();
/// let charge = flow.add(NewTask::new("charge", json!({"order": 7})));
/// let ship = flow.add(NewTask::new("ship", json!({"order": 7})).after([&charge]));
/// flow.add(NewTask::new("email", json!({"order": 7})).after([&ship]));
/// assert_eq!(flow.tasks().len(), 3);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    id: String,
    tasks: Vec<Held>,
}

impl Default for Flow {
    fn default() -> Self {
        Flow::new()
    }
}

impl Flow {
    /// An empty flow with a fresh id.
    pub fn new() -> Self {
        Flow { id: format!("flow_{}", &new_task_id()["task_".len()..]), tasks: Vec::new() }
    }

    /// The flow's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Adds a task (a [`Held`], or a [`NewTask`] that waits for nothing
    /// but what [`Held::after`] may add later) and answers its id.
    pub fn add(&mut self, task: impl Into<Held>) -> String {
        let mut held = task.into();
        held.flow_id = Some(self.id.clone());
        let id = held.id.clone();
        self.tasks.push(held);
        id
    }

    /// The tasks, in the order they were added.
    pub fn tasks(&self) -> &[Held] {
        &self.tasks
    }
}

/// The rows for `waymark_held_submit`: each task checked, ordered so that
/// every task comes after those of the call it depends on (and otherwise
/// as given), as a JSON array. A cycle, an id given twice, or an order
/// that a key's order contradicts is refused.
pub(crate) fn submit_rows(tasks: &[Held]) -> Result<Json> {
    if tasks.is_empty() {
        return Err(Error::invalid("a flow must hold at least one task"));
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(tasks.len());
    for (i, held) in tasks.iter().enumerate() {
        held.check()?;
        if index.insert(held.id(), i).is_some() {
            return Err(Error::invalid(format!("task id {} is given twice", held.id())));
        }
    }
    let order = dependency_order(tasks, &index)?;
    let mut last_of_key: HashMap<&str, usize> = HashMap::new();
    for &i in &order {
        if let Some(key) = tasks[i].order_key.as_deref() {
            if let Some(before) = last_of_key.insert(key, i).filter(|&before| before > i) {
                return Err(Error::invalid(format!(
                    "task {} comes before {} in key {key:?} but depends on it: neither could run",
                    tasks[i].id(),
                    tasks[before].id()
                )));
            }
        }
    }
    let rows = order.iter().map(|&i| tasks[i].to_json()).collect::<Result<Vec<_>>>()?;
    Ok(Json::Array(rows))
}

/// Kahn's order over the dependencies inside the call, taking the earliest
/// given task that is free at each step; a cycle is named.
fn dependency_order(tasks: &[Held], index: &HashMap<&str, usize>) -> Result<Vec<usize>> {
    let mut waiting = vec![0usize; tasks.len()];
    let mut freed_by: Vec<Vec<usize>> = vec![Vec::new(); tasks.len()];
    for (i, held) in tasks.iter().enumerate() {
        let inside: BTreeSet<usize> =
            held.after.iter().filter_map(|d| index.get(d.as_str()).copied()).collect();
        waiting[i] = inside.len();
        for d in inside {
            freed_by[d].push(i);
        }
    }
    let mut free: BTreeSet<usize> = (0..tasks.len()).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(tasks.len());
    while let Some(i) = free.pop_first() {
        order.push(i);
        for &next in &freed_by[i] {
            waiting[next] -= 1;
            if waiting[next] == 0 {
                free.insert(next);
            }
        }
    }
    if order.len() < tasks.len() {
        let stuck: Vec<&str> = (0..tasks.len()).filter(|&i| waiting[i] > 0).map(|i| tasks[i].id()).collect();
        return Err(Error::invalid(format!(
            "the dependencies among {} form a cycle: none of them could ever run",
            stuck.join(", ")
        )));
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(name: &str) -> NewTask {
        NewTask::new(name, json!({}))
    }

    fn ids(rows: &Json) -> Vec<String> {
        rows.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect()
    }

    #[test]
    fn a_flow_goes_in_dependency_order_and_otherwise_as_given() {
        let mut flow = Flow::new();
        let last = Held::from(task("c"));
        let last_id = last.id().to_owned();
        let a = flow.add(task("a").after([&last_id]));
        let b = flow.add(task("b"));
        flow.add(last);
        assert_eq!(ids(&submit_rows(flow.tasks()).unwrap()), vec![b, last_id, a]);
    }

    #[test]
    fn a_cycle_is_named() {
        let a = Held::from(task("a"));
        let b = task("b").after([a.id()]);
        let a = a.after([b.id()]);
        let err = submit_rows(&[a.clone(), b.clone()]).unwrap_err().to_string();
        assert!(err.contains("cycle") && err.contains(a.id()) && err.contains(b.id()), "{err}");
    }

    #[test]
    fn bad_input_is_refused_before_any_io() {
        let cases: Vec<(Vec<Held>, &str)> = vec![
            (vec![], "at least one task"),
            (vec![task("a").ordered_by("")], "order key"),
            (vec![task("a").on_event("")], "event name"),
            (vec![task("a").key("k").ordered_by("x")], "has a key"),
            (
                vec![task("a").ordered_by("x").deadline(Duration::from_secs(1), OnDeadline::Cancel)],
                "needs on_event",
            ),
            (vec![task("").ordered_by("x")], "task name"),
        ];
        for (tasks, expect) in cases {
            let err = submit_rows(&tasks).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
            assert!(err.to_string().contains(expect), "{err} should say {expect}");
        }
        let a = Held::from(task("a"));
        let own = a.clone().after([a.id().to_owned()]);
        assert!(submit_rows(&[own]).unwrap_err().to_string().contains("names itself"));
        assert!(submit_rows(&[a.clone(), a]).unwrap_err().to_string().contains("given twice"));
    }

    #[test]
    fn a_dependency_against_the_key_order_is_refused() {
        let first = task("a").ordered_by("k");
        let second = task("b").ordered_by("k");
        let first = first.after([second.id()]);
        let err = submit_rows(&[first, second]).unwrap_err().to_string();
        assert!(err.contains("neither could run"), "{err}");
    }
}
