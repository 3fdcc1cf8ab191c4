//! The transactions table's writes: every change of status a conditional write on the status before it,
//! so status only moves forward and exactly one decision wins.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use tracing::warn;

use crate::expr::{Expr, n, s};
use crate::model::Status;
use crate::record::data::*;
use crate::record::update::*;
use crate::store::write::{Decided, Sending, Write, conditional};
use crate::store::{Item, StoreError};
use crate::tables::tx_attr as a;

/// What a conditional status change found.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// This write made the change.
    Done(TransactionRecord),
    /// The record was not in the expected status: here it is as it is (None: there is no record).
    Lost(Option<TransactionRecord>),
}

#[derive(Debug, Clone)]
pub struct TransactionStore {
    pub(crate) client: Client,
    pub(crate) table: String,
}

impl TransactionStore {
    pub fn new(client: Client, table: impl Into<String>) -> TransactionStore {
        TransactionStore { client, table: table.into() }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub(crate) fn key(id: &str) -> Item {
        Item::from([(a::ID.to_owned(), s(id))])
    }

    /// Writes a new record unless one with its id exists; returns the existing one then. Free text is cut
    /// to what a record keeps. A terminal record DynamoDB refuses as invalid (it would pass 400 KB) is
    /// written again shortened ([`TransactionRecord::shortened`]): an ended transaction's record always
    /// gets written.
    pub async fn create(&self, record: &TransactionRecord) -> Result<Option<TransactionRecord>, StoreError> {
        let record = record.clone().bounded();
        match self.put_new(&record).await {
            Err(e) if e.invalid && record.status.is_terminal() => {
                warn!(tx = %record.transaction_id, error = %e, "record refused as invalid; writing it shortened");
                self.put_new(&record.shortened()).await
            }
            other => other,
        }
    }

    async fn put_new(&self, record: &TransactionRecord) -> Result<Option<TransactionRecord>, StoreError> {
        let mut e = Expr::new();
        let id = e.name(a::ID);
        let write = Write::put(&self.table, record.to_item(), format!("attribute_not_exists({id})"), e);
        match conditional(&self.client, vec![write], Sending::default()).await?.decided()? {
            Decided::Applied(_) => Ok(None),
            refused => {
                match refused.refused_item() {
                    Some(item) => Ok(Some(TransactionRecord::from_item(&item)?)),
                    None => self.get(&record.transaction_id).await?.map(Some).ok_or_else(|| {
                        StoreError::internal("PutItem", &self.table, "record exists but cannot be read")
                    }),
                }
            }
        }
    }

    pub async fn get(&self, id: &str) -> Result<Option<TransactionRecord>, StoreError> {
        // An id DynamoDB would refuse as a key (a client's `GET /transactions/{id}`) names no record: that
        // is the answer, not the store's ValidationException, which would read as the store failing.
        if id.is_empty() || id.len() > crate::model::MAX_KEY_BYTES {
            return Ok(None);
        }
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::new("GetItem", &self.table, e))?;
        out.item.as_ref().map(TransactionRecord::from_item).transpose()
    }

    /// Moves the record from `from` to `to` if, and only if, it is in `from`. Votes and a reason may be
    /// written with the change. Terminal states drop the record from the open-transactions index and,
    /// unless it is `keyed`, start its retention clock.
    ///
    /// If DynamoDB refuses the change as invalid (the record would pass 400 KB: one written before
    /// records were bounded, or a size this code misjudged), it is written again in its shortened form
    /// ([`shortened_transition_update`]), which never makes the record larger than it is, so that a
    /// transaction always reaches its end.
    #[allow(clippy::too_many_arguments)]
    pub async fn transition(
        &self,
        id: &str,
        from: Status,
        to: Status,
        keyed: bool,
        now_ms: u64,
        participants: Option<&[ParticipantEntry]>,
        reason: Option<&str>,
    ) -> Result<Transition, StoreError> {
        self.transition_with(id, from, to, keyed, now_ms, participants, reason, &[]).await
    }

    /// [`TransactionStore::transition`], setting `extra` attributes too (in the shortened form as well).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn transition_with(
        &self,
        id: &str,
        from: Status,
        to: Status,
        keyed: bool,
        now_ms: u64,
        participants: Option<&[ParticipantEntry]>,
        reason: Option<&str>,
        extra: &[(&'static str, AttributeValue)],
    ) -> Result<Transition, StoreError> {
        let with_extra = |mut update: RecordUpdate| {
            for (name, value) in extra {
                update = update.set(name, value.clone());
            }
            update
        };
        let full = with_extra(transition_update(to, keyed, now_ms, participants, reason));
        match self.update_status(id, from, &full).await {
            Err(e) if e.invalid => {
                warn!(tx = id, to = %to, error = %e, "status change refused as invalid; writing it shortened");
                let Some(current) = self.get(id).await? else { return Ok(Transition::Lost(None)) };
                if current.status != from {
                    return Ok(Transition::Lost(Some(current)));
                }
                let shortened = with_extra(shortened_transition_update(&current, to, keyed, now_ms, participants));
                self.update_status(id, from, &shortened).await
            }
            other => other,
        }
    }

    /// The hold of a transaction whose participants all prepared: PREPARING → PREPARED with the votes,
    /// `holdUntil`, and its entry in the sweeper's index moved to `holdUntil` (the sweeper's grace adds
    /// twice the clock margin, as for a deadline). Conditional like every status change.
    pub async fn hold(
        &self,
        id: &str,
        now_ms: u64,
        participants: &[ParticipantEntry],
        hold_until: u64,
    ) -> Result<Transition, StoreError> {
        let extra = [(a::HOLD_UNTIL, n(hold_until)), (a::SWEEP_AT, n(hold_until))];
        self.transition_with(id, Status::Preparing, Status::Prepared, true, now_ms, Some(participants), None, &extra)
            .await
    }

    /// [`TransactionStore::transition`] of an open transaction that also moves its entry in the sweeper's
    /// index to `sweep_at`: a held transaction's decision, whose `sweepAt` was its `holdUntil`.
    #[allow(clippy::too_many_arguments)]
    pub async fn transition_due(
        &self,
        id: &str,
        from: Status,
        to: Status,
        keyed: bool,
        now_ms: u64,
        reason: Option<&str>,
        sweep_at: u64,
    ) -> Result<Transition, StoreError> {
        debug_assert!(!to.is_terminal());
        self.transition_with(id, from, to, keyed, now_ms, None, reason, &[(a::SWEEP_AT, n(sweep_at))]).await
    }

    /// One conditional status change: `update` if the record is in `from`.
    async fn update_status(&self, id: &str, from: Status, update: &RecordUpdate) -> Result<Transition, StoreError> {
        let mut e = Expr::new();
        let expression = update.expression(&mut e);
        let condition = format!("{} = {}", e.name(a::STATUS), e.value(s(from.as_str())));
        self.update_if(id, e, expression, condition).await
    }

    /// One conditional UpdateItem of record `id` (`e` holds the expressions' names and values): the record
    /// it wrote, or, when the condition failed, the record as it is (`Lost(None)`: there is none).
    async fn update_if(
        &self,
        id: &str,
        e: Expr,
        expression: String,
        condition: String,
    ) -> Result<Transition, StoreError> {
        let write = Write::update(&self.table, Self::key(id), expression, condition, e);
        match conditional(&self.client, vec![write], Sending::default().returning_new()).await?.decided()? {
            Decided::Applied(item) => Ok(Transition::Done(TransactionRecord::from_item(&item.unwrap_or_default())?)),
            // An update on a missing key fails the condition with no item: there is no record.
            refused => match refused.refused_item() {
                Some(item) => Ok(Transition::Lost(Some(TransactionRecord::from_item(&item)?))),
                None => Ok(Transition::Lost(self.get(id).await?)),
            },
        }
    }

    /// Records that a transaction with no record is aborted, unless a record appears first. Lock
    /// resolution does this before releasing a lock whose owner never wrote its record, so that owner
    /// can never commit afterwards. Returns the record as it now is.
    pub async fn abort_if_absent(&self, id: &str, now_ms: u64, reason: &str) -> Result<TransactionRecord, StoreError> {
        let record = absent_owner_record(id, now_ms, reason);
        Ok(self.create(&record).await?.unwrap_or(record))
    }

    /// Puts an open transaction the sweeper could not finish behind the others until `sweep_at`, with why
    /// (cut to [`MAX_SWEEP_ERROR_BYTES`]), so that the next runs reach what stands behind it. Only while it
    /// is open (whatever its status now: the sweeper's own recovery may have moved it on before failing),
    /// never once it ended. Refused as invalid (the record would pass 400 KB), it is postponed shortened
    /// ([`shortened_postpone_update`]), which does not make a postponed record larger: the entry still moves
    /// back in the index.
    pub async fn postpone(&self, id: &str, sweep_at: u64, attempts: u32, error: &str) -> Result<bool, StoreError> {
        match self.update_open(id, &postpone_update(sweep_at, attempts, error)).await {
            Err(e) if e.invalid => {
                warn!(tx = id, error = %e, "postponement refused as invalid; postponing without the error");
                self.update_open(id, &shortened_postpone_update(sweep_at)).await
            }
            other => other,
        }
    }

    /// `update` on a record that is still open: whether it was.
    async fn update_open(&self, id: &str, update: &RecordUpdate) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let expression = update.expression(&mut e);
        let condition = format!("attribute_exists({})", e.name(a::OPEN_SHARD));
        let write = Write::update(&self.table, Self::key(id), expression, condition, e);
        Ok(conditional(&self.client, vec![write], Sending::default()).await?.decided()?.applied())
    }

    /// Appends `entry` to `record`'s audit, keeping the last [`MAX_AUDIT_ENTRIES`]: a write conditional on
    /// the audit's last entry being the one `record` holds. When another entry came in between, the
    /// record is read again and the write made from it (that entry is kept). The audit as written, or
    /// `None` when the record no longer exists.
    pub async fn append_audit(
        &self,
        record: &TransactionRecord,
        entry: AuditEntry,
    ) -> Result<Option<Vec<AuditEntry>>, StoreError> {
        let id = record.transaction_id.as_str();
        let mut known = record.audit.clone();
        for _ in 0..8 {
            let mut audit = known.clone();
            audit.push(entry.clone());
            let keep_from = audit.len().saturating_sub(MAX_AUDIT_ENTRIES);
            let audit: Vec<AuditEntry> = audit.split_off(keep_from);
            let mut e = Expr::new();
            let name = e.name(a::AUDIT);
            let value = serde_json::to_value(&audit).expect("audit entries serialize");
            let expression = format!("SET {name} = {}", e.value(crate::attr::to_attribute(&value)));
            let condition = match known.last() {
                None => format!("attribute_exists({}) AND attribute_not_exists({name})", e.name(a::ID)),
                Some(last) => {
                    let index = known.len() - 1;
                    let (at, by, action) = (e.name("at"), e.name("by"), e.name("action"));
                    format!(
                        "{name}[{index}].{at} = {} AND {name}[{index}].{by} = {} AND {name}[{index}].{action} = {}",
                        e.value(n(last.at)),
                        e.value(s(&last.by)),
                        e.value(s(&last.action))
                    )
                }
            };
            let write = Write::update(&self.table, Self::key(id), expression, condition, e);
            if conditional(&self.client, vec![write], Sending::default()).await?.decided()?.applied() {
                return Ok(Some(audit));
            }
            match self.get(id).await? {
                Some(now) => known = now.audit,
                None => return Ok(None),
            }
        }
        Err(StoreError::internal("UpdateItem", &self.table, format!("the audit of {id} kept changing under its write")))
    }

    /// Reads several records in BatchGetItem calls (100 keys each); the ones that do not exist are left
    /// out. Eventually consistent: a page of a list, not a decision.
    pub async fn get_many(&self, ids: &[String]) -> Result<Vec<TransactionRecord>, StoreError> {
        let keys: Vec<Item> = ids.iter().map(|id| Self::key(id)).collect();
        let items = crate::store::batch_get(&self.client, &self.table, &keys, false).await?;
        items.iter().map(TransactionRecord::from_item).collect()
    }

    /// A page of the open transactions in the order of their `sweepAt` (then id), after `after` (the last
    /// entry of the page before), at most `limit`: the sparse open-transactions index, every shard read
    /// from `after` on and merged. Returns the page's `(sweepAt, id)` entries and whether more follow.
    pub async fn open_page(
        &self,
        after: Option<(u64, &str)>,
        limit: usize,
    ) -> Result<(Vec<(u64, String)>, bool), StoreError> {
        let mut entries = Vec::new();
        let mut more = false;
        for shard in 0..crate::tables::INDEX_SHARDS {
            let (mut found, mut start) = (0, None);
            loop {
                let mut e = Expr::new();
                let shard_name = e.name(a::OPEN_SHARD);
                let shard_value = e.value(s(format!("open#{shard}")));
                let condition = match after {
                    Some((sweep_at, _)) => {
                        format!("{shard_name} = {shard_value} AND {} >= {}", e.name(a::SWEEP_AT), e.value(n(sweep_at)))
                    }
                    None => format!("{shard_name} = {shard_value}"),
                };
                let out = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(crate::tables::OPEN_TRANSACTIONS_INDEX)
                    .key_condition_expression(condition)
                    .set_expression_attribute_names(e.names())
                    .set_expression_attribute_values(e.values())
                    .limit((limit + 1) as i32)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|err| StoreError::new("Query", &self.table, err))?;
                for item in out.items.unwrap_or_default() {
                    let id = crate::store::get_s(&item, a::ID).unwrap_or_default().to_owned();
                    let sweep_at = crate::store::get_n(&item, a::SWEEP_AT).and_then(|t| t.parse().ok()).unwrap_or(0);
                    // Entries at `after`'s time that sort before it, or are it, were on an earlier page.
                    if after.is_some_and(|(t, last)| (sweep_at, id.as_str()) <= (t, last)) {
                        continue;
                    }
                    entries.push((sweep_at, id));
                    found += 1;
                }
                start = out.last_evaluated_key;
                if start.is_none() {
                    break;
                }
                if found > limit {
                    more = true;
                    break;
                }
            }
        }
        entries.sort();
        more |= entries.len() > limit;
        entries.truncate(limit);
        Ok((entries, more))
    }

    /// Ids of open transactions due for the sweeper before `before_ms`, at most `limit` from each shard.
    pub async fn open_before(&self, before_ms: u64, limit: i32) -> Result<Vec<String>, StoreError> {
        let open = crate::store::ShardedIndex {
            table: &self.table,
            index: crate::tables::OPEN_TRANSACTIONS_INDEX,
            shard_attr: a::OPEN_SHARD,
            prefix: "open",
            sort_attr: a::SWEEP_AT,
        };
        let entries = open.due_before(&self.client, before_ms, limit).await?;
        Ok(entries.iter().filter_map(|i| crate::store::get_s(i, a::ID).map(str::to_owned)).collect())
    }
}
