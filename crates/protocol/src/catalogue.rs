//! The statement catalogue: one entry per file in `protocol-sql/statements/`.

use std::sync::OnceLock;

use crate::header::{parse_params, Param};

/// A statement of the catalogue, resolved: its SQL with `:name` parameters and
/// the parameters its header declares, in header order.
#[derive(Debug)]
pub struct StatementDef {
    /// Which statement this is.
    pub id: Statement,
    /// The SQL text, `:name` parameters and all, header comment included.
    pub sql: &'static str,
    /// The declared parameters, in the header's order.
    pub params: Vec<Param>,
}

impl StatementDef {
    /// The statement's name, such as `claim_one_queue`.
    pub fn name(&self) -> &'static str {
        self.id.name()
    }

    /// The file name under `protocol-sql/statements/`.
    pub fn file_name(&self) -> String {
        format!("{}.sql", self.id.name())
    }

    /// The declared parameter called `name`, if any.
    pub fn param(&self, name: &str) -> Option<Param> {
        self.params.iter().copied().find(|p| p.name == name)
    }
}

macro_rules! catalogue {
    ($($variant:ident => $name:literal,)*) => {
        /// Every statement of protocol v1 (plus waymark's additions).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Statement {
            $(
                #[doc = concat!("`", $name, ".sql`")]
                $variant,
            )*
        }

        impl Statement {
            /// Every statement, in catalogue order.
            pub const ALL: &'static [Statement] = &[$(Statement::$variant,)*];

            /// The statement's name (its file name without `.sql`).
            pub fn name(self) -> &'static str {
                match self {
                    $(Statement::$variant => $name,)*
                }
            }

            fn source(self) -> &'static str {
                match self {
                    $(Statement::$variant => include_str!(concat!(
                        "../protocol-sql/statements/", $name, ".sql"
                    )),)*
                }
            }
        }
    };
}

catalogue! {
    ProtocolVersion => "protocol_version",
    Installations => "installations",
    InsertTask => "insert_task",
    InsertTaskBatch => "insert_task_batch",
    InsertTaskBatchAlike => "insert_task_batch_alike",
    LockKey => "lock_key",
    LockKeyShared => "lock_key_shared",
    GetKey => "get_key",
    UpsertKey => "upsert_key",
    Get => "get",
    GetByKey => "get_by_key",
    GetStatus => "get_status",
    GetStatusByKey => "get_status_by_key",
    List => "list",
    Stats => "stats",
    QueueDepth => "queue_depth",
    Cancel => "cancel",
    Retry => "retry",
    Purge => "purge",
    PurgeCount => "purge_count",
    ClaimableProbe => "claimable_probe",
    RecoverLeases => "recover_leases",
    Claim => "claim",
    ClaimOneQueue => "claim_one_queue",
    ClaimOneName => "claim_one_name",
    ClaimOneQueueOneName => "claim_one_queue_one_name",
    ClaimLimited => "claim_limited",
    Heartbeat => "heartbeat",
    HeartbeatBatch => "heartbeat_batch",
    HeartbeatBatchSkipLocked => "heartbeat_batch_skip_locked",
    Progress => "progress",
    Succeed => "succeed",
    Complete => "complete",
    CompleteBatch => "complete_batch",
    Fail => "fail",
    Release => "release",
    LockTasks => "lock_tasks",
    LedgerCreate => "ledger_create",
    LedgerExists => "ledger_exists",
    LedgerLock => "ledger_lock",
    LedgerList => "ledger_list",
    LedgerRecord => "ledger_record",
    SetLockTimeout => "set_lock_timeout",
    SetTimeouts => "set_timeouts",
    Clock => "clock",
    WaymarkLedgerCreate => "waymark_ledger_create",
    WaymarkLedgerExists => "waymark_ledger_exists",
    WaymarkLedgerLock => "waymark_ledger_lock",
    WaymarkLedgerList => "waymark_ledger_list",
    WaymarkLedgerRecord => "waymark_ledger_record",
    HeldSubmit => "held_submit",
    HeldSettled => "held_settled",
    HeldEmit => "held_emit",
    HeldOperate => "held_operate",
    HeldSweep => "held_sweep",
    HeldList => "held_list",
    HeldPurge => "held_purge",
    StepList => "step_list",
    StepRecord => "step_record",
    StepForget => "step_forget",
    StepWait => "step_wait",
    StepWaitClose => "step_wait_close",
}

impl Statement {
    /// The resolved definition: SQL and declared parameters.
    pub fn def(self) -> &'static StatementDef {
        static DEFS: OnceLock<Vec<StatementDef>> = OnceLock::new();
        let defs = DEFS.get_or_init(|| {
            Statement::ALL
                .iter()
                .map(|&id| StatementDef {
                    id,
                    sql: id.source(),
                    params: parse_params(&format!("{}.sql", id.name()), id.source()),
                })
                .collect()
        });
        &defs[self as usize]
    }

    /// Looks a statement up by name.
    pub fn from_name(name: &str) -> Option<Statement> {
        Statement::ALL.iter().copied().find(|s| s.name() == name)
    }
}
