//! The tables the system uses, described once. The local stack and the tests create them from these
//! definitions, and a test holds `infra/template.yaml` to them, so local and deployed tables cannot drift.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType, StreamSpecification, StreamViewType, TimeToLiveSpecification, TimeToLiveStatus,
};

/// Sweeper and stream processor: JSON `{"service": "data table name"}`.
pub const PARTICIPANT_TABLES: &str = "PARTICIPANT_TABLES";

/// Attribute names of the transactions table.
pub mod tx_attr {
    pub const ID: &str = "transactionId";
    pub const STATUS: &str = "status";
    pub const PARTICIPANTS: &str = "participants";
    pub const CREATED_AT: &str = "createdAt";
    pub const UPDATED_AT: &str = "updatedAt";
    pub const DEADLINE: &str = "deadline";
    pub const REASON: &str = "reason";
    pub const REQUEST_HASH: &str = "requestHash";
    pub const EXPIRE_AT: &str = "expireAt";
    /// Present only while the transaction is open: the partition key of the open-transactions index.
    pub const OPEN_SHARD: &str = "openShard";
    /// Present only while the transaction is open: when the sweeper should next look at it (the deadline at
    /// first, later when it could not finish it), the sort key of the open-transactions index.
    pub const SWEEP_AT: &str = "sweepAt";
    pub const SWEEP_ATTEMPTS: &str = "sweepAttempts";
    /// Why the sweeper's last attempt at finishing the transaction failed.
    pub const SWEEP_ERROR: &str = "sweepError";
    /// The coordinator execution that wrote the record: a write whose reply was lost is recognised as its own.
    pub const EXECUTION_ID: &str = "executionId";
    /// Who created the transaction (canonical, [`crate::principal`] / [`crate::access`]).
    pub const PRINCIPAL: &str = "principal";
    /// A held transaction (`holdMs` of its request): how long its prepares are held for a caller's decision.
    pub const HOLD_MS: &str = "holdMs";
    /// A held transaction recorded PREPARED: until when (epoch ms) its caller may commit it.
    pub const HOLD_UNTIL: &str = "holdUntil";
    /// An attempt of a request refused for contention and retried (issue 35): its age, the first attempt's
    /// start, which wait-die orders it by.
    pub const STARTED_AT: &str = "startedAt";
    /// An attempt's number in its request (absent: 1).
    pub const ATTEMPT: &str = "attempt";
    /// The id of the request's first attempt (absent: this record's own).
    pub const FIRST_TRANSACTION_ID: &str = "firstTransactionId";
    /// An aborted attempt that its coordinator retried: the next attempt's id (the coordinator's link,
    /// written in the same write as the attempt's abort).
    pub const RETRIED_AS: &str = "retriedAs";
    /// An attempt whose recorded abort is its own coordinator's refusal for contention (issue 41): set only in
    /// the same conditional write as that abort, the one thing that lets a successor or an age token follow it.
    pub const REFUSED_FOR_CONTENTION: &str = "refusedForContention";
    /// A refused attempt whose age a caller's retry took with an age token: that retry's id (a token's link,
    /// which a key's replay, a held decision and the fan-out do not follow).
    pub const AGE_CLAIMED_BY: &str = "ageClaimedBy";
    /// A caller's retry with an age token: the refused attempt whose age it keeps (its request is its own).
    pub const AGE_OF: &str = "ageOf";
    /// The canonical hash of the request body every attempt of a request runs (issue 42): a step along a
    /// chain (a token's claim, a key's replay, a held decision) follows only attempts of the same body.
    /// Not `requestHash`, which also marks a keyed record, kept for ever.
    pub const BODY_HASH: &str = "bodyHash";
    /// What operators did to the transaction (`/admin`): its last entries, each who, when, what.
    pub const AUDIT: &str = "audit";
}

/// Attribute names of a participant data table.
pub mod item_attr {
    pub const KEY: &str = "entityId";
    pub const DATA: &str = "data";
    pub const VERSION: &str = "version";
    pub const LAST_TX: &str = "lastTx";
    pub const LOCK: &str = "lock";
    /// In the lock: what the prepare voted to apply (`participant::operations::Voted`, JSON), which is what
    /// the commit applies whatever a later message or record says.
    pub const LOCK_VOTED: &str = "op";
    /// Present only while locked: the partition key of the locks index (sharded to spread writes).
    pub const LOCK_SHARD: &str = "lockShard";
    /// Present only while locked: the lock's expiry, the sort key of the locks index.
    pub const LOCK_EXPIRES_AT: &str = "lockExpiresAt";
    /// Present only while locked: what the commit will write, reserved by the prepare so that the item
    /// already has the size the commit gives it.
    pub const PENDING: &str = "pending";
    /// The prefix of a pending credit's entry, `credit#<transaction>` (`participant::credits`): present
    /// from a credit's prepare to its commit or abort.
    pub const CREDIT_PREFIX: &str = "credit#";
    /// How many credits are pending on the item (its `credit#` entries).
    pub const PENDING_CREDITS: &str = "pendingCredits";
    /// The marker of an exclusive lock waiting for the pending credits to drain: new credits wait behind it.
    pub const DRAIN: &str = "drain";
    /// The table's TTL attribute (epoch seconds), on a resource's finished barrier entries only (no item
    /// of data carries it): DynamoDB deletes such an entry once nothing can need it
    /// (`participant::resource`, docs/participants.md, "Barrier entries expire").
    pub const EXPIRE_AT: &str = "expireAt";
}

/// Attribute names of the WebSocket connections table: one item per (connection, topic), plus one
/// item per connection under [`connection_attr::CONNECTION_TOPIC`].
pub mod connection_attr {
    pub const CONNECTION_ID: &str = "connectionId";
    pub const TOPIC: &str = "topic";
    /// The topic value of the item that records the connection itself.
    pub const CONNECTION_TOPIC: &str = "$connection";
    pub const CONNECTED_AT: &str = "connectedAt";
    /// On the connection's own item: how many topics it holds (or has reserved). Subscribes raise it
    /// with a conditional ADD that keeps it at most the cap; see `twopc_fanout::connections`.
    pub const TOPIC_COUNT: &str = "topicCount";
    pub const EXPIRE_AT: &str = "expireAt";
    /// On the connection's own item: its caller, as `$connect` established it ([`crate::access`]).
    pub const PRINCIPAL: &str = "principal";
    pub const CALLER_KIND: &str = "callerKind";
    pub const SUB: &str = "sub";
    pub const ADMIN: &str = "admin";
    /// One item per principal, `connectionId = principal#<principal>`, under this topic: its open
    /// connections (`connections`, connection id → until when it counts) and a `version` for the
    /// conditional writes that keep it under the per-principal cap.
    pub const PRINCIPAL_PREFIX: &str = "principal#";
    pub const PRINCIPAL_TOPIC: &str = "$principal";
    pub const CONNECTIONS: &str = "connections";
    pub const VERSION: &str = "version";
}

pub const OPEN_TRANSACTIONS_INDEX: &str = "open-transactions";
pub const LOCKS_INDEX: &str = "locks-by-expiry";
pub const TOPIC_INDEX: &str = "by-topic";
/// Shards of the sparse indexes: writes spread over this many partition key values; readers query each.
pub const INDEX_SHARDS: u32 = 4;

/// One secondary index: partition key and optional sort key, keys-only or full projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexSpec {
    pub name: &'static str,
    pub hash_key: (&'static str, ScalarAttributeType),
    pub range_key: Option<(&'static str, ScalarAttributeType)>,
    pub projection: ProjectionType,
}

/// One table as the system needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    pub name: String,
    pub hash_key: (&'static str, ScalarAttributeType),
    pub range_key: Option<(&'static str, ScalarAttributeType)>,
    pub indexes: Vec<IndexSpec>,
    /// Every table streams NEW_AND_OLD_IMAGES: the fan-out reads commits from participant tables and
    /// transaction outcomes from the transactions table.
    pub stream: bool,
    pub ttl_attribute: Option<&'static str>,
}

pub fn transactions_table(name: &str) -> TableSpec {
    TableSpec {
        name: name.to_owned(),
        hash_key: (tx_attr::ID, ScalarAttributeType::S),
        range_key: None,
        indexes: vec![IndexSpec {
            name: OPEN_TRANSACTIONS_INDEX,
            hash_key: (tx_attr::OPEN_SHARD, ScalarAttributeType::S),
            range_key: Some((tx_attr::SWEEP_AT, ScalarAttributeType::N)),
            projection: ProjectionType::KeysOnly,
        }],
        stream: true,
        ttl_attribute: Some(tx_attr::EXPIRE_AT),
    }
}

pub fn participant_table(name: &str) -> TableSpec {
    TableSpec {
        name: name.to_owned(),
        hash_key: (item_attr::KEY, ScalarAttributeType::S),
        range_key: None,
        indexes: vec![IndexSpec {
            name: LOCKS_INDEX,
            hash_key: (item_attr::LOCK_SHARD, ScalarAttributeType::S),
            range_key: Some((item_attr::LOCK_EXPIRES_AT, ScalarAttributeType::N)),
            projection: ProjectionType::KeysOnly,
        }],
        stream: true,
        ttl_attribute: Some(item_attr::EXPIRE_AT),
    }
}

pub fn connections_table(name: &str) -> TableSpec {
    TableSpec {
        name: name.to_owned(),
        hash_key: (connection_attr::CONNECTION_ID, ScalarAttributeType::S),
        range_key: Some((connection_attr::TOPIC, ScalarAttributeType::S)),
        indexes: vec![IndexSpec {
            name: TOPIC_INDEX,
            hash_key: (connection_attr::TOPIC, ScalarAttributeType::S),
            range_key: Some((connection_attr::CONNECTION_ID, ScalarAttributeType::S)),
            projection: ProjectionType::KeysOnly,
        }],
        stream: false,
        ttl_attribute: Some(connection_attr::EXPIRE_AT),
    }
}

fn key_schema(
    hash: &(&'static str, ScalarAttributeType),
    range: &Option<(&'static str, ScalarAttributeType)>,
) -> Vec<KeySchemaElement> {
    let mut keys = vec![element(hash.0, KeyType::Hash)];
    if let Some((name, _)) = range {
        keys.push(element(name, KeyType::Range));
    }
    keys
}

fn element(name: &str, key_type: KeyType) -> KeySchemaElement {
    KeySchemaElement::builder().attribute_name(name).key_type(key_type).build().expect("name and key type are set")
}

impl TableSpec {
    /// Every attribute that appears in a key of the table or of an index, once.
    pub fn attribute_definitions(&self) -> Vec<(&'static str, ScalarAttributeType)> {
        let mut defs: Vec<(&'static str, ScalarAttributeType)> = Vec::new();
        let keys = std::iter::once(&self.hash_key)
            .chain(self.range_key.iter())
            .chain(self.indexes.iter().flat_map(|i| std::iter::once(&i.hash_key).chain(i.range_key.iter())));
        for key in keys {
            if !defs.iter().any(|(name, _)| *name == key.0) {
                defs.push(key.clone());
            }
        }
        defs
    }

    /// Creates the table (on-demand, streams as specified) unless it exists, waits until it is usable, and
    /// turns its TTL on (`ttl_attribute`) unless it is on: a table created by an older version gets it too.
    pub async fn create_if_missing(&self, client: &Client) -> Result<(), aws_sdk_dynamodb::Error> {
        let mut request = client
            .create_table()
            .table_name(&self.name)
            .billing_mode(BillingMode::PayPerRequest)
            .set_key_schema(Some(key_schema(&self.hash_key, &self.range_key)));
        for (name, kind) in self.attribute_definitions() {
            request = request.attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(name)
                    .attribute_type(kind)
                    .build()
                    .expect("name and type are set"),
            );
        }
        for index in &self.indexes {
            request = request.global_secondary_indexes(
                GlobalSecondaryIndex::builder()
                    .index_name(index.name)
                    .set_key_schema(Some(key_schema(&index.hash_key, &index.range_key)))
                    .projection(Projection::builder().projection_type(index.projection.clone()).build())
                    .build()
                    .expect("name and keys are set"),
            );
        }
        if self.stream {
            request = request.stream_specification(
                StreamSpecification::builder()
                    .stream_enabled(true)
                    .stream_view_type(StreamViewType::NewAndOldImages)
                    .build()
                    .expect("enabled is set"),
            );
        }
        match request.send().await {
            Ok(_) => {}
            Err(err) if err.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => {}
            Err(err) => return Err(err.into()),
        }
        // DynamoDB Local creates tables synchronously, the service does not: wait for ACTIVE either way.
        loop {
            let table = client.describe_table().table_name(&self.name).send().await?;
            let active = table
                .table()
                .and_then(|t| t.table_status())
                .is_some_and(|s| *s == aws_sdk_dynamodb::types::TableStatus::Active);
            if active {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let Some(attribute) = self.ttl_attribute else { return Ok(()) };
        let ttl = client.describe_time_to_live().table_name(&self.name).send().await?;
        let on = ttl.time_to_live_description().is_some_and(|d| {
            d.attribute_name() == Some(attribute)
                && matches!(d.time_to_live_status(), Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling))
        });
        if !on {
            let specification = TimeToLiveSpecification::builder()
                .attribute_name(attribute)
                .enabled(true)
                .build()
                .expect("name and enabled are set");
            client
                .update_time_to_live()
                .table_name(&self.name)
                .time_to_live_specification(specification)
                .send()
                .await?;
        }
        Ok(())
    }
}
