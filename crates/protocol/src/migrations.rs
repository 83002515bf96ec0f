//! The ordered migrations of protocol v1.

/// One migration file. The ledger (`cairnq_migrations`) records `name`, the
/// full file name, so these names are part of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The file name, such as `0001_init.sql`.
    pub name: &'static str,
    /// The script, run with the simple query protocol.
    pub sql: &'static str,
}

impl Migration {
    /// The file name's number: its leading four digits, after the
    /// `waymark_` of a waymark ledger migration.
    pub fn number(&self) -> u32 {
        let digits = self.name.strip_prefix("waymark_").unwrap_or(self.name);
        digits.get(..4).and_then(|n| n.parse().ok()).unwrap_or(0)
    }
}

macro_rules! migration {
    ($file:literal) => {
        Migration { name: $file, sql: include_str!(concat!("../protocol-sql/migrations/", $file)) }
    };
}

static MIGRATIONS: [Migration; 10] = [
    migration!("0001_init.sql"),
    migration!("0002_purge_index.sql"),
    migration!("0003_notify.sql"),
    migration!("0004_lease_index.sql"),
    migration!("0005_clear_terminal_lease.sql"),
    migration!("0006_claim_name_index.sql"),
    migration!("0007_purge_status_index.sql"),
    migration!("0008_claim_due_index.sql"),
    migration!("0009_purge_queue_index.sql"),
    migration!("0010_drop_status_index.sql"),
];

/// Every migration, in the order it must be applied.
pub fn migrations() -> &'static [Migration] {
    &MIGRATIONS
}

macro_rules! ledger_migration {
    ($file:literal) => {
        Migration { name: $file, sql: include_str!(concat!("../protocol-sql/ledgers/", $file)) }
    };
}

static LEDGER_MIGRATIONS: [Migration; 2] =
    [ledger_migration!("waymark_0001_held_tasks.sql"), ledger_migration!("waymark_0002_steps.sql")];

/// waymark's own migrations, in order: the ledgers beside cairnq's tables
/// (held tasks, keys' order, events, a run's durable steps), recorded in `waymark_migrations`
/// rather than in cairnq's ledger. None touches a cairnq table, index,
/// trigger or version.
pub fn ledger_migrations() -> &'static [Migration] {
    &LEDGER_MIGRATIONS
}
