//! What is checked: the items, the transactions, the fault budgets, and which fixes are on.

/// A transaction, by its index in [`Config::txs`]. The index is also its wait-die age: a smaller
/// index started earlier (`startedAt`), so it is the older one.
pub type Tx = u8;
/// A participant service, by index (0 = service-a, 1 = service-b, ...).
pub type Svc = u8;
/// An item, by its index in [`Config::items`].
pub type ItemId = u8;

/// The fixes (of issue 19, issue 27's shortened writes, issue 28's clock margin and replay answer, issue
/// 29's version condition, issue 30's pending value, issue 31's barrier and recheck, issue 32's held owner
/// left undecided until its `holdUntil` and its lock moved there by the resolver) that the model can switch
/// back to the behaviour before them, one at a time. `Switches::default()` is the protocol as the
/// code implements it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Switches {
    /// Defect 1. On: a prepare locks with a fresh token, a commit or roll-forward applies only under
    /// the voted token. Off (today): the lock condition lets `lock.tx = T` lock again, and commit's
    /// condition is `lock.tx = T AND lastTx <> T`.
    pub token_check: bool,
    /// Defect 8. On: a keyed create that finds a record with its own executionId goes on. Off
    /// (today): it takes that record for another execution's and replays it.
    pub recognise_own_writes: bool,
    /// Defect 9. On: an abort goes to every participant except read-only PREPARED voters. Off
    /// (today): it skips the participants that voted REFUSED.
    pub abort_everyone: bool,
    /// Defect 10. On: a decision write DynamoDB refused (4xx, not applied) is fenced (the abort written
    /// over it conditionally), and the abort is driven; if the fence fails too, the transaction is
    /// aborted and its locks released before the 503 (`unrecorded_decision`). Off (before issue 19):
    /// it answers 503 at once and releases nothing.
    pub release_on_refused_decision: bool,
    /// Not one of the four switches of the brief: a correction the model found. On: every DynamoDB
    /// attempt of a lock write carries a fresh token (no SDK retry of the same request). Off: the
    /// SDK's retry re-sends the same request, hence the same token, as design.md has it ("token: NEW
    /// random token of this execution"); then the retry of a lock write whose first attempt took a
    /// lock that was voted (via another copy) and committed can take the voted token again after
    /// another transaction committed the item, and the next commit applies twice. See DETAILS.md.
    pub fresh_token_per_attempt: bool,
    /// Not one of the four switches of the brief: how the coordinator reads a decision write that
    /// DynamoDB refused *on the SDK's retry* of an attempt whose reply was lost. On (the code): the
    /// outcome is unknown (the first attempt may have applied): the abort is written over it (the
    /// fence) and the record says what happened; if the fence fails too, nothing is released (503,
    /// outcome unknown). Off: a refusal is taken as "certainly not applied", as a literal reading of
    /// design.md ("REFUSED (a 4xx ...) — certainly not applied") would do: the coordinator aborts at
    /// once, releasing the locks, and records the abort after. See DETAILS.md.
    pub refusal_after_unknown_is_unknown: bool,
    /// Issue 27. On: a write that makes an existing record larger, refused by DynamoDB as invalid (the
    /// record would pass 400 KB), is written again in its shortened form, which never makes the record
    /// larger (record/store.rs `transition` → `shortened_transition_update`, `postpone` →
    /// `shortened_postpone_update`); only a commit decision's shortened form can still be refused, and
    /// then the coordinator writes the abort over it (the fence, itself shortened). Off (before the
    /// fix): the refused write is an error, as any other: the decision's fence fails too, the sweeper's
    /// `recover` and `postpone` fail for ever, and lock resolution cannot abort the owner.
    pub shortened_writes: bool,
    /// Issue 28. On: a resolver (a prepare meeting a lock, the sweeper, a retried key's `abort_expired`)
    /// acts on a lock or an undecided owner only after `expiry + 2M` by its own clock
    /// (`clock::resolvable_after`): never while the coordinator's clock is at or before the deadline.
    /// Off (before the fix): after the plain expiry by its own clock, which with a skew below M may
    /// already be while the coordinator's clock is before the deadline (phase 0 reads either way), and
    /// the coordinator could still decide commit.
    pub resolver_margin: bool,
    /// Issue 28. On: a participant writes no lock after `deadline + M` by its clock (`clock::lock_cutoff`),
    /// checked before every attempt of a lock write (prepare, check-only prepare, one-phase commit); a
    /// refusal then is TIMEOUT. Off (before the fix): checked only when the message arrives, against the
    /// plain deadline (phase 0 reads either way; later attempts, after a wait or a lock resolution, are
    /// not checked and may write a lock at any time).
    pub lock_cutoff: bool,
    /// Issue 28. On: a retried key answers what the record says (`Reply::answering`): PREPARING is a 503
    /// with the id, the outcome unknown. Off (before the fix): `Reply::for_record`, which answers
    /// PREPARING as 202, what the contract reads as "decided commit". (The answer budget is the fixed
    /// code's in both: the replay may stop waiting or driving at any moment.)
    pub replay_answers_record: bool,
    /// Issue 29. On: a judged operation (a service's rule, or its own operation, reads the item and judges
    /// it: participant/prepare.rs `judge`) is locked by a write conditioned on the item's `version` being
    /// the one read (participant/expressions.rs `Seen::Version`): an item changed in between fails the write, and the prepare
    /// reads and judges again. Off: the lock write carries no such condition, and a rule may have judged an
    /// item another commit changed since.
    pub rule_version_condition: bool,
    /// Issue 30. On: a service's own operation computes the item's new value at prepare, keeps it in
    /// `pending` beside the lock, and its commit (and every roll-forward) applies exactly that (`SET data =
    /// pending`). Off: the commit computes the value again with the operation as deployed at commit time.
    pub apply_pending: bool,
    /// Issue 31. On: a resource participant writes its barrier entry TRYING (`attribute_not_exists`) before
    /// it sends a try, and an abort that finds no entry writes one CANCELLED (empty rollback). Off: the try
    /// is sent first and its answer recorded after (TRIED if no entry), and an abort that finds no entry
    /// writes nothing.
    pub barrier: bool,
    /// Issue 31. On: an abort that cancels a TRYING or TRIED entry keeps its lock, due once every try
    /// request has landed or never will, and the sweeper's abort then repeats the cancel: the try's request
    /// again under its key (the stored first answer), then a void of what it reserved. Off: the cancel is
    /// not repeated (the entry's lock is released with the cancel).
    pub recheck: bool,
    /// Issue 32. On: lock resolution (recovery.rs `decide`) treats a PREPARED owner (a held transaction) as
    /// undecided until `holdUntil + 2M` by the resolver's clock (a prepare meeting its lock is refused
    /// CONFLICT, the sweeper counts it as waiting; each moves the lock to `holdUntil`: `resolver_extends_hold`),
    /// then aborts it. Off: a PREPARED owner is taken like a PREPARING one
    /// past its deadline: a resolver that found its lock expired (its deadline, when the hold message did not
    /// extend it) aborts it, while its caller may still commit.
    pub held_undecided: bool,
    /// Issue 32 (`git show e14f8bd`). On: a resolver that finds a lock of a PREPARED owner within its hold
    /// (recovery.rs `OwnerFate::Held`) moves the lock to `holdUntil` with the record's voted lockToken: the
    /// sweeper's `resolve_lock` sends the participant the hold message (`Action::Hold`) and counts the lock as
    /// waiting; a prepare that resolves it extends it itself (`extend_lock`) and is refused CONFLICT. Off
    /// (before the fix): the lock is left at its deadline (its hold message lost): every sweeper run lists
    /// it, finds the owner held and leaves it, changing nothing, for the whole hold.
    pub resolver_extends_hold: bool,
    /// Issue 42. On: no participant's role may write a decision or change a record (the templates grant a
    /// participant GetItem on the transactions table, and PutItem only under its own one-phase ids); a lock
    /// whose owner is past its deadline is aborted by the coordinator (asked by the participant's refusal,
    /// from the owner's own record) or the sweeper, with the same conditional write the model's resolver
    /// makes, so who performs it changes no interleaving the model tells apart. Off (the grants before the
    /// fix: PutItem of any record, UpdateItem of a status): a participant's operator writes a record
    /// straight to the table, once, at any moment: COMMITTING over a held, aborting or aborted record.
    pub participants_cannot_write_records: bool,
    /// Issue 47. On: an operator's abort writes ABORTING conditionally on the status it read (PREPARING or
    /// PREPARED); a decided record is followed. Off: it writes ABORTING whatever the record says by its write
    /// (a read of PREPARING before the coordinator's commit, then an unconditional write).
    pub operator_writes_conditionally: bool,
    /// Issue 48, item 2 (fewer write units): not a fix but the planned change itself. On: a lock taken for an
    /// attempt recorded first (keyed: PREPARING in the open-transactions index before any prepare is sent) that
    /// is not held is written without `lockShard`/`lockExpiresAt`, so it is not in the locks index: the
    /// sweeper's `expired_locks` never lists it (only the record's recovery, or another prepare meeting it, can
    /// release it). Locks of attempts recorded at their decision, of held transactions, and a resource's
    /// barrier entries stay indexed. Off (today): every lock write puts the item in the locks index.
    pub unindexed_recorded_locks: bool,
    /// Issue 48, the fix that makes `unindexed_recorded_locks` safe (its point 2). On: a recorded attempt that
    /// aborts with an unclean prepare (one it sent and got no vote for: lost, late, its reply lost, timed out)
    /// sends its releases at once but leaves its record ABORTING (open, `sweepAt` = its deadline) instead of
    /// writing ABORTED; the sweeper, past deadline + 2M (after every participant's lock cutoff), re-sends the
    /// releases and writes ABORTED, which releases a stray lock the late prepare wrote meanwhile. Off (the plan
    /// without it): the coordinator writes ABORTED once its releases are acknowledged, as today.
    pub revisit_unclean_prepares: bool,
    /// Issue 48, the fix's point 1. On: a prepare of an attempt whose locks are unindexed is sent once (no SDK
    /// retry of its Lambda invoke, an HTTPS participant called once): the network's `dup` fault never copies
    /// it (loss and late delivery remain). Then a vote received means no other execution of that prepare is
    /// in flight. Off: such a prepare may be duplicated, like every other message.
    pub recorded_prepares_sent_once: bool,
    /// Issue 48, a correction the model found (not in the plan): an operator's abort (issue 47) writes ABORTED
    /// at once, whatever the clock, while a prepare of the attempt may still land after its release. On: for
    /// an attempt with unindexed locks it leaves the record ABORTING (answering 200 ABORTED), for the sweeper to
    /// finish past deadline + 2M, as an unclean abort. Off: it writes ABORTED once its releases are
    /// acknowledged.
    pub operator_abort_left_open: bool,
}

impl Default for Switches {
    fn default() -> Self {
        Switches {
            token_check: true,
            recognise_own_writes: true,
            abort_everyone: true,
            release_on_refused_decision: true,
            fresh_token_per_attempt: true,
            refusal_after_unknown_is_unknown: true,
            shortened_writes: true,
            resolver_margin: true,
            lock_cutoff: true,
            replay_answers_record: true,
            rule_version_condition: true,
            apply_pending: true,
            barrier: true,
            recheck: true,
            held_undecided: true,
            resolver_extends_hold: true,
            participants_cannot_write_records: true,
            operator_writes_conditionally: true,
            unindexed_recorded_locks: true,
            revisit_unclean_prepares: true,
            recorded_prepares_sent_once: true,
            operator_abort_left_open: true,
        }
    }
}

/// How many faults of each kind may still happen (each is consumed when it happens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Budget {
    /// Coordinator crashes (at any step).
    pub crash: u8,
    /// DynamoDB writes that take effect but whose reply is lost (then retried by the SDK).
    pub db_reply: u8,
    /// Duplicate copies of a participant message.
    pub dup: u8,
    /// Lost participant messages or replies, and invocations given up while still in flight
    /// (a timeout: the message may still be delivered later).
    pub loss: u8,
    /// Writes DynamoDB refuses with a 4xx (not applied), once: decision writes, the abort written over
    /// a failed decision (the fence), abort records, and the sweeper's postponements.
    pub refused: u8,
    /// Records that DynamoDB refuses to make larger (a `ValidationException`: the record would pass
    /// 400 KB), from the first write that would grow it: that write and every later one that would
    /// grow the record are refused, for ever (this does not stop when faults stop). Only writes that
    /// add bytes to an existing record can be refused so (DETAILS.md, "Faults").
    pub oversized: u8,
    /// Faults of all kinds together.
    pub total: u8,
}

/// One operation of a participant. The model's workload is a bank: `add` with an optional
/// minimum (a transfer's debit carries `min: 0`), and read-only `check`s; and for issues 29 to 31 an
/// `add` a service's rule judges, a service's own operation, and a resource's charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// `add` `delta` to the item's balance; prepare's guard is `balance + delta >= min`.
    Add { delta: i8, min: Option<i8> },
    /// `check` `exists: true`: read-only, locks nothing when it is all a participant does.
    Check,
    /// Issue 29: `add` `delta` at a service with rules. The rule (no overdraft: `balance + delta >= 0`) is
    /// judged on the item as read (`Rules::check`), which the lock write cannot repeat: it holds the item to
    /// the version the rule saw (`rule_version_condition`). A refusal is REFUSED with code RULE.
    Ruled { delta: i8 },
    /// Issue 30: a service's own operation (`Operation::Custom`, the inventory's `reserve`): at prepare it
    /// computes the item's new value from the value as read, `balance - q * k`, where k is the operation's
    /// code as deployed (1; 2 once the service is redeployed, `Config::redeploy`), refused
    /// (CONDITION_FAILED) below zero; the lock write keeps it in `pending` (version-conditioned as a
    /// rule's), and the commit applies it.
    Custom { q: i8 },
    /// Issue 31: a resource's operation (the payments' `charge`): authorized by the try at prepare,
    /// captured by the confirm at commit, voided by the cancel at abort. Its `item` is [`NO_ITEM`]: the
    /// participant keeps a barrier entry per transaction instead (`State::barriers`).
    Charge,
}

/// The execution number of the first route call (issue 32): a coordinator at work on
/// `POST /transactions/{id}/commit` or `/abort`, not an execution of the transaction's POST.
pub const ROUTE: u8 = 0x40;

/// The item of an operation that has none (a resource's charge).
pub const NO_ITEM: ItemId = 0xFF;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    pub item: ItemId,
    pub kind: OpKind,
}

impl Op {
    /// Judged at prepare on the item as read (a rule, or a service's own operation): the prepare reads,
    /// then locks on condition of the version it read (participant/prepare.rs `judge`).
    pub fn judged(&self) -> bool {
        matches!(self.kind, OpKind::Ruled { .. } | OpKind::Custom { .. })
    }
}

/// One participant entry of a transaction: a service and its operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub svc: Svc,
    pub ops: Vec<Op>,
}

impl Part {
    /// Only `check`s: the participant reads, votes and locks nothing (`prepare_read_only`).
    /// (A held transaction's check-only participant locks all the same: `TxSpec::held`.)
    pub fn read_only(&self) -> bool {
        self.ops.iter().all(|o| o.kind == OpKind::Check)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxSpec {
    pub name: &'static str,
    /// Sent with an `Idempotency-Key`: the record is written first (PREPARING).
    pub keyed: bool,
    /// Coordinator executions of this transaction: 2 = the client sends the same key and body again
    /// (at any moment, also while the first execution runs).
    pub executions: u8,
    pub parts: Vec<Part>,
    /// Issue 32: a held transaction (`holdMs`): recorded first (the model's `keyed` is set with it), never one
    /// phase, its check-only participants lock what they check; all prepared in time → PREPARED (202), and its
    /// caller commits or aborts it later (`Config::routes`), or the hold expires.
    pub held: bool,
}

impl TxSpec {
    /// the coordinator's `takes_one_phase`: a sole participant that writes something (no deletes in the model)
    /// and is not a resource (a resource cannot commit in the same write as the record).
    pub fn one_phase(&self) -> bool {
        !self.held
            && self.parts.len() == 1
            && !self.parts[0].read_only()
            && !self.parts[0].ops.iter().any(|o| o.kind == OpKind::Charge)
    }

    /// The participant entry of a service, by index.
    pub fn part_of(&self, svc: Svc) -> Option<usize> {
        self.parts.iter().position(|p| p.svc == svc)
    }

    /// What a commit adds to the sum of the balances of the items a service's own operation never
    /// touches (`Config::money_item`; a custom operation's effect is its own, checked otherwise).
    pub fn net_delta(&self) -> i32 {
        self.parts
            .iter()
            .flat_map(|p| &p.ops)
            .map(|o| match o.kind {
                OpKind::Add { delta, .. } | OpKind::Ruled { delta } => delta as i32,
                OpKind::Check | OpKind::Custom { .. } | OpKind::Charge => 0,
            })
            .sum()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemSpec {
    pub name: &'static str,
    pub svc: Svc,
    pub balance: i8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub name: &'static str,
    pub services: Vec<&'static str>,
    pub items: Vec<ItemSpec>,
    pub txs: Vec<TxSpec>,
    pub budget: Budget,
    /// The sweeper's bounded read: at most this many open transactions, and this many expired locks
    /// per table, per run (`SweepLimits::per_shard`, one shard).
    pub sweep_k: u8,
    /// Whether a sweeper run may start while a coordinator execution is still at work (one slower
    /// than its deadline and the sweeper's grace). When false, runs start only while every execution
    /// has answered, crashed or not started; the sweeper still races participant handlers, late
    /// copies, lock resolution and client retries. True multiplies the state space by about ten.
    pub sweeper_races_coordinators: bool,
    /// Whether the clock has the margin phases (`state::phase::CUTOFF` and `RESOLVABLE`, issue 28), in
    /// which a participant's cutoff check, then a resolver's check, may read either way. Off: a deadline
    /// passes for every clock at once (phase 0 → 3), as before issue 28: smaller, and still checks
    /// everything else.
    pub margin: bool,
    /// Issue 30: the service of the custom operations may be redeployed once, at any moment, with another
    /// version of its operation (`balance - 2q` instead of `balance - q`): [`crate::Action::Redeploy`].
    pub redeploy: bool,
    /// Issue 31: the service that is a resource participant (its operations are [`OpKind::Charge`]), if any.
    pub resource: Option<Svc>,
    /// Issue 32: the caller's calls on held transactions, each sent at most once, at any moment once it may
    /// be (a commit once the caller has the 202; an abort once the record exists, also before the hold is
    /// recorded), or never: `POST /transactions/{id}/commit` and `/abort`. Two calls race each other and
    /// the expiry; the same route twice is a repeated call.
    pub routes: Vec<(Tx, Route)>,
    /// Issue 48 (`Prefer: respond-async`): a POST's own coordinator answers 202 COMMITTING as soon as it
    /// knows its commit decision is durable (`two_phase.rs`, `answer_on_decision`), and drives the second
    /// phase after answering (on Lambda in the coordinator's internal extension, `after_answer`); a crash
    /// there leaves it to the sweeper. A retried key, a held decision and the sweeper answer as before.
    pub answer_on_decision: bool,
    pub switches: Switches,
}

/// Issue 32: the caller's decision of a held transaction (the coordinator's `commit_held`, `abort_held`);
/// issue 47: an operator's abort of any keyed transaction, held or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    Commit,
    Abort,
    /// Issue 47, `POST /admin/transactions/{id}/abort` (`coordinator/admin.rs`, `abort`): the record read
    /// (absent: 404, nothing written: the call is sent once the record exists), PREPARING or PREPARED →
    /// ABORTING ("aborted by an operator") conditionally on the status read, held or not, whatever the
    /// clock; decided → driven and answered as the caller's abort (200 aborted, 409 committed).
    Operator,
}

fn add(item: ItemId, delta: i8) -> Op {
    Op { item, kind: OpKind::Add { delta, min: if delta < 0 { Some(0) } else { None } } }
}

fn check(item: ItemId) -> Op {
    Op { item, kind: OpKind::Check }
}

fn ruled(item: ItemId, delta: i8) -> Op {
    Op { item, kind: OpKind::Ruled { delta } }
}

fn custom(item: ItemId, q: i8) -> Op {
    Op { item, kind: OpKind::Custom { q } }
}

fn charge() -> Op {
    Op { item: NO_ITEM, kind: OpKind::Charge }
}

fn part(svc: Svc, ops: Vec<Op>) -> Part {
    Part { svc, ops }
}

/// A transfer of 1 from `from` (on service `sf`) to `to` (on service `st`), debit guarded by `min: 0`.
fn transfer(
    name: &'static str,
    keyed: bool,
    executions: u8,
    (sf, from): (Svc, ItemId),
    (st, to): (Svc, ItemId),
) -> TxSpec {
    TxSpec {
        name,
        keyed,
        executions,
        parts: vec![part(sf, vec![add(from, -1)]), part(st, vec![add(to, 1)])],
        held: false,
    }
}

/// A deposit of 1 into `item` (on service `svc`): a sole participant, so one phase.
fn deposit(name: &'static str, keyed: bool, executions: u8, (svc, item): (Svc, ItemId)) -> TxSpec {
    TxSpec { name, keyed, executions, parts: vec![part(svc, vec![add(item, 1)])], held: false }
}

const A: ItemId = 0;
const B: ItemId = 1;
const SA: Svc = 0;
const SB: Svc = 1;

fn two_items() -> (Vec<&'static str>, Vec<ItemSpec>) {
    (
        vec!["service-a", "service-b"],
        vec![ItemSpec { name: "A", svc: SA, balance: 1 }, ItemSpec { name: "B", svc: SB, balance: 1 }],
    )
}

/// The default fault budget of the small configurations: at most one of each of the first five kinds, two
/// in all (records refused for size have configurations of their own, `tests/fixed.rs`).
pub const SMALL: Budget = Budget { crash: 1, db_reply: 1, dup: 1, loss: 1, refused: 1, oversized: 0, total: 2 };

impl Config {
    fn with(name: &'static str, txs: Vec<TxSpec>, budget: Budget) -> Config {
        let (services, items) = two_items();
        Config {
            name,
            services,
            items,
            txs,
            budget,
            sweep_k: 1,
            sweeper_races_coordinators: true,
            margin: true,
            redeploy: false,
            resource: None,
            routes: vec![],
            answer_on_decision: false,
            switches: Switches::default(),
        }
    }

    /// T1 moves 1 from A to B while T2 moves 1 from B to A, both without a key (presumed abort).
    pub fn transfers(budget: Budget) -> Config {
        Config::with(
            "transfers",
            vec![transfer("T1", false, 1, (SA, A), (SB, B)), transfer("T2", false, 1, (SB, B), (SA, A))],
            budget,
        )
    }

    /// T1 is keyed (record first) and its client sends the same key and body a second time, at any
    /// moment; T2 deposits 1 into A in one phase.
    pub fn keyed(budget: Budget) -> Config {
        Config::with("keyed", vec![transfer("T1", true, 2, (SA, A), (SB, B)), deposit("T2", false, 1, (SA, A))], budget)
    }

    /// T1 moves A to B in two phases; T2 deposits 1 into A in one phase (sole participant).
    pub fn one_phase(budget: Budget) -> Config {
        Config::with(
            "one-phase",
            vec![transfer("T1", false, 1, (SA, A), (SB, B)), deposit("T2", false, 1, (SA, A))],
            budget,
        )
    }

    /// T1 moves A to B; T2 deposits 1 into A on condition that B exists, checked by service-b, a
    /// check-only participant that reads, votes and locks nothing.
    pub fn check_only(budget: Budget) -> Config {
        Config::with(
            "check-only",
            vec![
                transfer("T1", false, 1, (SA, A), (SB, B)),
                TxSpec {
                    name: "T2",
                    keyed: false,
                    executions: 1,
                    parts: vec![part(SA, vec![add(A, 1)]), part(SB, vec![check(B)])],
                    held: false,
                },
            ],
            budget,
        )
    }

    /// Issue 29: service-a has rules (no overdraft, judged on the item as read). T1 moves 1 from A to B, its
    /// debit of A judged by the rule; T2 deposits 1 into A in one phase, judged too (every operation of a
    /// service with rules is). A commit of either between the other's read and its lock write changes A's
    /// version: the write fails and the prepare judges again.
    pub fn rules(budget: Budget) -> Config {
        Config::with(
            "rules",
            vec![
                TxSpec {
                    name: "T1",
                    keyed: false,
                    executions: 1,
                    parts: vec![part(SA, vec![ruled(A, -1)]), part(SB, vec![add(B, 1)])],
                    held: false,
                },
                TxSpec {
                    name: "T2",
                    keyed: false,
                    executions: 1,
                    parts: vec![part(SA, vec![ruled(A, 1)])],
                    held: false,
                },
            ],
            budget,
        )
    }

    /// Issue 30: A is an inventory item (stock 2) of service-a, which has its own operation, reserve q
    /// (`stock - q`, computed at prepare; `stock - 2q` once service-a is redeployed, at any moment). T1
    /// reserves 1 from A and debits B by 1 in two phases; T2 reserves 1 from A in one phase.
    pub fn custom(budget: Budget) -> Config {
        let mut cfg = Config::with(
            "custom",
            vec![
                TxSpec {
                    name: "T1",
                    keyed: false,
                    executions: 1,
                    parts: vec![part(SA, vec![custom(A, 1)]), part(SB, vec![add(B, -1)])],
                    held: false,
                },
                TxSpec {
                    name: "T2",
                    keyed: false,
                    executions: 1,
                    parts: vec![part(SA, vec![custom(A, 1)])],
                    held: false,
                },
            ],
            budget,
        );
        cfg.items[A as usize].balance = 2;
        cfg.redeploy = true;
        cfg
    }

    /// Issue 31: payments is a resource participant (an external payment API behind try, confirm, cancel,
    /// with a barrier entry per transaction); service-a's item A is the stock of an order. T1 takes 1 from
    /// A and charges a card through payments. Whether the card is declined is chosen at the start (both
    /// are explored).
    pub fn resource(budget: Budget) -> Config {
        let (mut services, items) = two_items();
        services[1] = "payments";
        Config {
            name: "resource",
            services,
            items: vec![items[0].clone()],
            txs: vec![TxSpec {
                name: "T1",
                keyed: false,
                executions: 1,
                parts: vec![part(SA, vec![add(A, -1)]), part(SB, vec![charge()])],
                held: false,
            }],
            budget,
            sweep_k: 1,
            sweeper_races_coordinators: false,
            margin: false,
            redeploy: false,
            resource: Some(SB),
            routes: vec![],
            answer_on_decision: false,
            switches: Switches::default(),
        }
    }

    /// Issue 32: T1 is a held transfer A→B (recorded first, PREPARED and answered 202 once both prepared in
    /// time, then hold messages extend its locks' expiry to `holdUntil`); its caller may commit it and may
    /// abort it, each call once at any moment (neither: the hold expires; both: they race). T2 deposits 1 into
    /// A in one phase: it meets T1's held lock, refused CONFLICT while the hold lasts, resolving it after.
    pub fn held(budget: Budget) -> Config {
        let mut t1 = transfer("T1", true, 1, (SA, A), (SB, B));
        t1.held = true;
        let mut cfg = Config::with("held", vec![t1, deposit("T2", false, 1, (SA, A))], budget);
        cfg.routes = vec![(0, Route::Commit), (0, Route::Abort)];
        cfg
    }

    /// Issue 47: T1 is a keyed transfer A→B, not held; an operator aborts it once, at any moment once its
    /// record exists (racing its coordinator's commit, PREPARING → COMMITTING, and its prepares). T2
    /// deposits 1 into A in one phase (it meets T1's lock).
    pub fn operator(budget: Budget) -> Config {
        let t1 = transfer("T1", true, 1, (SA, A), (SB, B));
        let mut cfg = Config::with("operator", vec![t1, deposit("T2", false, 1, (SA, A))], budget);
        cfg.routes = vec![(0, Route::Operator)];
        cfg
    }

    /// Issue 47, held: [`Config::held`] (the caller's commit and abort, the hold's expiry) and an operator's
    /// abort of T1 too.
    pub fn operator_held(budget: Budget) -> Config {
        let mut cfg = Config::held(budget);
        cfg.name = "operator_held";
        cfg.routes.push((0, Route::Operator));
        cfg
    }

    /// Issue 48: T1 (unkeyed) moves 1 from A to B and T2 (keyed, its key sent twice) moves 1 from B to A,
    /// both asking to be answered on their commit decision (`Prefer: respond-async`).
    pub fn answer_on_decision(budget: Budget) -> Config {
        let txs = vec![transfer("T1", false, 1, (SA, A), (SB, B)), transfer("T2", true, 2, (SB, B), (SA, A))];
        let mut cfg = Config::with("answer_on_decision", txs, budget);
        cfg.answer_on_decision = true;
        cfg
    }

    pub fn switches(mut self, switches: Switches) -> Config {
        self.switches = switches;
        self
    }

    pub fn sweep_k(mut self, k: u8) -> Config {
        self.sweep_k = k;
        self
    }

    pub fn sweeper_races_coordinators(mut self, races: bool) -> Config {
        self.sweeper_races_coordinators = races;
        self
    }

    pub fn margin(mut self, margin: bool) -> Config {
        self.margin = margin;
        self
    }

    /// Coordinator executions in order: (transaction, execution number), then the caller's route calls
    /// (issue 32), numbered from [`ROUTE`].
    pub fn executions(&self) -> Vec<(Tx, u8)> {
        let posts = self.txs.iter().enumerate().flat_map(|(t, spec)| (0..spec.executions).map(move |e| (t as Tx, e)));
        posts.chain(self.routes.iter().enumerate().map(|(k, &(tx, _))| (tx, ROUTE + k as u8))).collect()
    }

    /// Index of the first op of each transaction in the flattened op list (ghost `applied`).
    pub fn op_index(&self, tx: Tx, part: usize, op: usize) -> usize {
        let before: usize =
            self.txs[..tx as usize].iter().map(|t| t.parts.iter().map(|p| p.ops.len()).sum::<usize>()).sum();
        before + self.txs[tx as usize].parts[..part].iter().map(|p| p.ops.len()).sum::<usize>() + op
    }

    pub fn op_count(&self) -> usize {
        self.txs.iter().map(|t| t.parts.iter().map(|p| p.ops.len()).sum::<usize>()).sum()
    }

    /// An item no service's own operation touches: its balance is money, conserved by transfers.
    pub fn money_item(&self, item: ItemId) -> bool {
        !self
            .txs
            .iter()
            .flat_map(|t| &t.parts)
            .flat_map(|p| &p.ops)
            .any(|o| o.item == item && matches!(o.kind, OpKind::Custom { .. }))
    }

    pub fn initial_sum(&self) -> i32 {
        (0..self.items.len()).filter(|&i| self.money_item(i as ItemId)).map(|i| self.items[i].balance as i32).sum()
    }

    /// Whether the service is a resource participant.
    pub fn is_resource(&self, svc: Svc) -> bool {
        self.resource == Some(svc)
    }
}
