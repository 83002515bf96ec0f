//! An executor over a real one that lets a test act between statements:
//! [`Tapped`] asks a tap before and after every statement outside a
//! transaction; [`hooked`] taps one statement's `nth` run to run a hook just
//! before it (how a test lands a write between two reads, or makes one call
//! panic, where no timing could put it). Every other call goes to the real
//! executor untouched.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};
use waymark_store::protocol::Statement;
use waymark_store::{ExecError, Lane, NotificationStream, PgExecutor, Row, Sql, Store, Value};

/// What a hook or a tap awaits.
pub type Hook = Pin<Box<dyn Future<Output = ()> + Send>>;

/// An executor that runs a hook once, just before its `nth` run (from 1) of
/// one statement, says when that run has answered, and otherwise passes
/// everything to the executor it wraps: how a test lands a write between
/// two reads of a wait, where no timing could put it. Listening is the
/// wrapped executor's, so a wait is pushed or polled as it would be without
/// the hook. A [`Tapped`] executor whose tap watches for that run.
pub type Hooked<E> = Tapped<E>;

/// A store on `store`'s executor (and installation) that runs `hook` just
/// before its `nth` run of `statement`, and a receiver told once that run
/// has answered.
pub fn hooked<E, F>(
    store: &Store<E>,
    statement: Statement,
    nth: usize,
    hook: F,
) -> (Store<Hooked<E>>, oneshot::Receiver<()>)
where
    E: PgExecutor + Clone,
    F: Future<Output = ()> + Send + 'static,
{
    hooked_with(store, statement, &[], nth, hook)
}

/// [`hooked`] for the statement as sent with the optional filters named in
/// `bound` on (bound non-null), such as an optional filter of `list`.
pub fn hooked_with<E, F>(
    store: &Store<E>,
    statement: Statement,
    bound: &[&str],
    nth: usize,
    hook: F,
) -> (Store<Hooked<E>>, oneshot::Receiver<()>)
where
    E: PgExecutor + Clone,
    F: Future<Output = ()> + Send + 'static,
{
    let sql = sql_of(statement, bound);
    let (answered, on_answer) = oneshot::channel();
    let runs = AtomicUsize::new(0);
    let hook: Mutex<Option<Hook>> = Mutex::new(Some(Box::pin(hook)));
    let answered = Mutex::new(Some(answered));
    // The executor's number of the statement's `nth` run, once it began.
    let nth_run = AtomicU64::new(u64::MAX);
    let tap = move |text: &str, at: Tap, run: u64| -> Option<Hook> {
        if text != sql {
            return None;
        }
        match at {
            Tap::Before if runs.fetch_add(1, Ordering::SeqCst) + 1 == nth => {
                nth_run.store(run, Ordering::SeqCst);
                hook.lock().expect("hook lock").take()
            }
            Tap::After if nth_run.load(Ordering::SeqCst) == run => {
                if let Some(answered) = answered.lock().expect("hook lock").take() {
                    let _ = answered.send(());
                }
                None
            }
            _ => None,
        }
    };
    (tapped(store, tap), on_answer)
}

/// A store on `store`'s executor (and installation) that counts its runs
/// of `statement` that have answered, and the count, for a test to wait
/// on: the moment a wait has read its row, say, which nothing else marks.
pub fn counted<E>(store: &Store<E>, statement: Statement) -> (Store<Tapped<E>>, Answers)
where
    E: PgExecutor + Clone,
{
    let sql = sql_of(statement, &[]);
    let (count, answers) = watch::channel(0);
    let tap = move |text: &str, at: Tap, _run: u64| -> Option<Hook> {
        if at == Tap::After && text == sql {
            count.send_modify(|n| *n += 1);
        }
        None
    };
    (tapped(store, tap), Answers { name: statement.name(), count: answers })
}

/// How many runs of one statement a [`counted`] store has seen answered.
#[derive(Debug, Clone)]
pub struct Answers {
    name: &'static str,
    count: watch::Receiver<u64>,
}

impl Answers {
    /// Runs answered so far.
    pub fn so_far(&self) -> u64 {
        *self.count.borrow()
    }

    /// Waits until `n` runs in all have answered; the test fails past 20 s.
    pub async fn reach(&mut self, n: u64) {
        let reached = matches!(
            tokio::time::timeout(Duration::from_secs(20), self.count.wait_for(|seen| *seen >= n)).await,
            Ok(Ok(_))
        );
        assert!(reached, "{} answered {} times in 20 s, not {n}", self.name, self.so_far());
    }
}

/// Before or after a run of a statement, for a [`Tapped`] executor's tap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tap {
    Before,
    After,
}

type TapFn = dyn Fn(&str, Tap, u64) -> Option<Hook> + Send + Sync;

/// An executor that asks a tap, just before and just after each statement
/// it runs outside a transaction (those of `begin` go untapped), for
/// something to await there: how a test holds one claim
/// between its statements while the worker sends another, whatever order
/// the claim's statements come in. Everything else is the wrapped
/// executor's, listening too.
pub struct Tapped<E> {
    inner: E,
    tap: Box<TapFn>,
    /// Statements begun so far: each run's number, which its tap calls
    /// before and after share.
    runs: AtomicU64,
}

impl<E> std::fmt::Debug for Tapped<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tapped").finish_non_exhaustive()
    }
}

/// A store on `store`'s executor that calls `tap` with each statement's SQL
/// (as [`sql_of`] gives it) and the run's number (from 0, in the order the
/// runs began) before and after the statement runs, and awaits what it
/// returns.
pub fn tapped<E, T>(store: &Store<E>, tap: T) -> Store<Tapped<E>>
where
    E: PgExecutor + Clone,
    T: Fn(&str, Tap, u64) -> Option<Hook> + Send + Sync + 'static,
{
    Store::new(Tapped { inner: store.executor().clone(), tap: Box::new(tap), runs: AtomicU64::new(0) })
}

/// The SQL the store sends for `statement` with the optional filters named
/// in `bound` on.
pub fn sql_of(statement: Statement, bound: &[&str]) -> String {
    let specialised = waymark_dialect::specialise(statement.def().sql, bound).expect("specialise");
    waymark_dialect::rewrite(&specialised).expect("rewrite").sql().to_owned()
}

#[async_trait]
impl<E: PgExecutor> PgExecutor for Tapped<E> {
    type Transaction = E::Transaction;

    async fn query(&self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst);
        if let Some(hold) = (self.tap)(sql.text, Tap::Before, run) {
            hold.await;
        }
        let text = sql.text;
        let answer = self.inner.query(sql, params).await;
        if let Some(hold) = (self.tap)(text, Tap::After, run) {
            hold.await;
        }
        answer
    }

    async fn execute_script(&self, script: &str) -> Result<(), ExecError> {
        self.inner.execute_script(script).await
    }

    async fn begin(&self) -> Result<Self::Transaction, ExecError> {
        self.inner.begin().await
    }

    async fn begin_in_lane(&self, lane: Lane) -> Result<Self::Transaction, ExecError> {
        self.inner.begin_in_lane(lane).await
    }

    async fn listen(&self, channels: &[&str]) -> Result<Option<NotificationStream>, ExecError> {
        self.inner.listen(channels).await
    }
}
