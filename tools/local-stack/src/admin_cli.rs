//! `twopc-local admin`: the operators' API (`/admin`) from a terminal, against the local stack or, with
//! `--api URL`, a deployed one (signed with SigV4 from the default AWS credentials, or `--token`'s JWT).
//! A table by default, the API's JSON with `--json`.

use clap::{Args, Subcommand};
use serde_json::Value;
use twopc_client::{AdminQuery, Client};

#[derive(Args, Clone, Debug)]
pub struct AdminArgs {
    #[command(subcommand)]
    pub command: AdminCommand,
    /// The REST API: the local stack's by default; a deployed stack's `ApiUrl` output.
    #[arg(long, global = true, value_name = "URL", default_value = "http://127.0.0.1:3000")]
    pub api: String,
    /// A JWT of an operator (`operatorGroups`), instead of signing with the default AWS credentials. The
    /// local stack without `--auth` needs neither.
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// The region a deployed API is signed for [default: the AWS configuration's].
    #[arg(long, global = true)]
    pub region: Option<String>,
    /// Print the API's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Clone, Debug)]
pub enum AdminCommand {
    /// Open transactions, oldest due first, a page at a time.
    List {
        /// Only this status: PREPARING, PREPARED, COMMITTING or ABORTING.
        #[arg(long)]
        status: Option<String>,
        /// Only those started at least this long ago (milliseconds).
        #[arg(long)]
        min_age_ms: Option<u64>,
        /// At most this many (1 to 100).
        #[arg(long)]
        limit: Option<u32>,
        /// The page token the page before printed.
        #[arg(long)]
        next: Option<String>,
    },
    /// One transaction: participants, votes, chain, sweeps, audit, and the locks its keys hold.
    Show { id: String },
    /// Open transactions past their due time, and old locks whose owner has no record or ended.
    Stuck {
        /// Locks expired at least this long ago (milliseconds) [default: the API's, 60000].
        #[arg(long)]
        lock_age_ms: Option<u64>,
    },
    /// Request outcomes of late (COMMITTED, ABORTED), oldest first, from the outcome events.
    Outcomes {
        /// How far back (milliseconds) [default: the API's, an hour].
        #[arg(long)]
        since_ms: Option<u64>,
        /// At most this many (1 to 100).
        #[arg(long)]
        limit: Option<u32>,
        /// The page token the page before printed.
        #[arg(long)]
        next: Option<String>,
    },
    /// Drive a decided (COMMITTING, ABORTING) transaction to its end now, as the sweeper would.
    Retry { id: String },
    /// Abort an undecided (PREPARING, PREPARED) transaction: its request ends.
    Abort { id: String },
}

/// The client the arguments name: unsigned for the local stack, a bearer token, or SigV4.
async fn client(args: &AdminArgs) -> Result<Client, String> {
    let client = Client::new(&args.api).map_err(|e| e.to_string())?;
    if let Some(token) = &args.token {
        return Ok(client.with_bearer(token));
    }
    let local = args.api.starts_with("http://127.0.0.1") || args.api.starts_with("http://localhost");
    if local {
        return Ok(client);
    }
    let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let credentials =
        aws.credentials_provider().ok_or("no AWS credentials to sign with (configure them, or pass --token)")?;
    let region = args
        .region
        .clone()
        .or_else(|| aws.region().map(|r| r.to_string()))
        .ok_or("no region to sign for: pass --region")?;
    Ok(client.with_iam(region, credentials))
}

/// Runs the command; the text to print.
pub async fn run(args: &AdminArgs) -> Result<String, String> {
    let client = client(args).await?;
    let answer = match &args.command {
        AdminCommand::List { status, min_age_ms, limit, next } => {
            let query =
                AdminQuery { status: status.clone(), min_age_ms: *min_age_ms, limit: *limit, next: next.clone() };
            client.admin_list(&query).await
        }
        AdminCommand::Show { id } => client.admin_show(id).await,
        AdminCommand::Stuck { lock_age_ms } => client.admin_stuck(*lock_age_ms).await,
        AdminCommand::Outcomes { since_ms, limit, next } => {
            client.admin_outcomes(*since_ms, *limit, next.as_deref()).await
        }
        AdminCommand::Retry { id } => client.admin_retry(id).await,
        AdminCommand::Abort { id } => client.admin_abort(id).await,
    }
    .map_err(|e| format!("{}: {e}", args.api))?;
    if args.json {
        return Ok(serde_json::to_string_pretty(&answer).expect("JSON prints"));
    }
    Ok(match &args.command {
        AdminCommand::List { .. } => {
            let mut text = transactions_table(&answer["transactions"]);
            if let Some(next) = answer["next"].as_str() {
                text.push_str(&format!("\nmore: --next {next}\n"));
            }
            text
        }
        AdminCommand::Stuck { .. } => format!(
            "{}\n{}",
            transactions_table(&answer["transactions"]),
            table(
                &["SERVICE", "KEY", "OWNER", "EXPIRED AT", "WHY"],
                answer["locks"].as_array().into_iter().flatten().map(|lock| {
                    vec![
                        text(&lock["service"]),
                        lock["key"]["entityId"].as_str().map_or_else(|| lock["key"].to_string(), str::to_owned),
                        text(&lock["lock"]["transactionId"]),
                        text(&lock["lock"]["expiresAt"]),
                        text(&lock["why"]),
                    ]
                })
            )
        ),
        AdminCommand::Outcomes { .. } => {
            let mut text = table(
                &["TIME", "TRANSACTION", "STATUS", "FIRST", "REASON"],
                answer["outcomes"].as_array().into_iter().flatten().map(|o| {
                    vec![
                        text(&o["time"]),
                        text(&o["transactionId"]),
                        text(&o["status"]),
                        text(&o["firstTransactionId"]),
                        o["reason"].as_str().map_or_else(|| "-".to_owned(), str::to_owned),
                    ]
                }),
            );
            if let Some(next) = answer["next"].as_str() {
                text.push_str(&format!("\nmore: --next {next}\n"));
            }
            text
        }
        AdminCommand::Show { .. } | AdminCommand::Retry { .. } | AdminCommand::Abort { .. } => detail(&answer),
    })
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

fn transactions_table(transactions: &Value) -> String {
    table(
        &["TRANSACTION", "STATUS", "AGE", "ATTEMPT", "SWEEPS", "PARTICIPANTS"],
        transactions.as_array().into_iter().flatten().map(|t| {
            let parts: Vec<String> = t["participants"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| format!("{}:{}", text(&p["service"]), p["vote"].as_str().unwrap_or("-")))
                .collect();
            vec![
                text(&t["transactionId"]),
                text(&t["recordedStatus"]),
                format!("{:.1}s", t["ageMs"].as_f64().unwrap_or(0.0) / 1000.0),
                text(&t["attempt"]),
                text(&t["sweepAttempts"]),
                parts.join(" "),
            ]
        }),
    )
}

fn detail(t: &Value) -> String {
    let mut out = String::new();
    for (name, field) in [
        ("transaction", "transactionId"),
        ("status", "recordedStatus"),
        ("reason", "reason"),
        ("principal", "principal"),
        ("attempt", "attempt"),
        ("first", "firstTransactionId"),
        ("sweeps", "sweepAttempts"),
        ("last error", "lastError"),
        ("hold until", "holdUntil"),
    ] {
        if !t[field].is_null() {
            out.push_str(&format!("{name:<12} {}\n", text(&t[field])));
        }
    }
    if let Some(chain) = t["chain"].as_array() {
        out.push_str(&format!("{:<12} {}\n", "chain", chain.iter().map(text).collect::<Vec<_>>().join(" → ")));
    }
    out.push_str(&table(
        &["SERVICE", "VOTE", "REASON"],
        t["participants"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| vec![text(&p["service"]), text(&p["vote"]), text(&p["reason"])]),
    ));
    if let Some(locks) = t["locks"].as_array() {
        out.push_str(&table(
            &["SERVICE", "KEY", "LOCKED BY", "EXPIRES AT"],
            locks.iter().flat_map(|p| {
                p["items"].as_array().cloned().unwrap_or_default().into_iter().map(move |item| {
                    vec![
                        text(&p["service"]),
                        item["key"]["entityId"].as_str().map_or_else(|| item["key"].to_string(), str::to_owned),
                        text(&item["lock"]["transactionId"]),
                        text(&item["lock"]["expiresAt"]),
                    ]
                })
            }),
        ));
    }
    if let Some(audit) = t["audit"].as_array().filter(|a| !a.is_empty()) {
        out.push_str(&table(
            &["AT", "BY", "ACTION", "RESULT"],
            audit.iter().map(|e| vec![text(&e["at"]), text(&e["by"]), text(&e["action"]), text(&e["result"])]),
        ));
    }
    out
}

/// Columns padded to their widest cell.
fn table(header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows.collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    if rows.is_empty() {
        out.push_str("(none)\n");
    }
    for row in rows {
        out.push_str(&line(row));
    }
    out
}
