//! The bank test: concurrent random transfers among 10 accounts on two services, with faults drawn at
//! random (coordinator crashes at every step, lost replies, duplicate deliveries, late answers), a
//! sweeper running alongside, then sweeps until quiet. Every invariant is checked against the records.
//!
//! `BANK_SEED` replays a run; `BANK_TRANSFERS`, `BANK_CLIENTS` size it; `BANK_SOAK_SECS` turns it into
//! a soak that keeps transferring for that long.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bigdecimal::BigDecimal;
use serde_json::{Value, json};
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::Action;
use twopc_tests::{EdgeFault, TestEnv, call_coordinator, rest_event};

/// SplitMix64: a seeded generator, so a printed seed replays the same draws.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    Crash(CoordinatorCrash),
    Edge(EdgeFault, Action),
}

impl Fault {
    fn kind(&self) -> String {
        match self {
            Fault::None => "none".into(),
            Fault::Crash(c) => format!("crash:{c:?}").replace("(", "").replace(")", ""),
            Fault::Edge(EdgeFault::DelayReply(_), a) => format!("late:{}", a.as_str()),
            Fault::Edge(e, a) => format!("{}:{}", format!("{e:?}").to_lowercase(), a.as_str()),
        }
    }
}

fn draw_fault(rng: &mut Rng, rate_percent: u64, timeout: Duration) -> Fault {
    if rng.below(100) >= rate_percent {
        return Fault::None;
    }
    let crashes = [
        CoordinatorCrash::AfterCreate,
        CoordinatorCrash::AfterPrepares(1),
        CoordinatorCrash::AfterPrepares(2),
        CoordinatorCrash::AfterDecision,
        CoordinatorCrash::AfterCommits(1),
        CoordinatorCrash::BeforeTerminal,
    ];
    let actions = [Action::Prepare, Action::Commit, Action::Abort];
    match rng.below(4) {
        0 | 1 => Fault::Crash(crashes[rng.below(crashes.len() as u64) as usize]),
        2 => {
            let edge = if rng.below(2) == 0 { EdgeFault::LoseReply } else { EdgeFault::Duplicate };
            Fault::Edge(edge, actions[rng.below(3) as usize])
        }
        _ => Fault::Edge(EdgeFault::Delay(timeout + Duration::from_millis(300)), Action::Prepare),
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

const ACCOUNTS: [(&str, &str); 10] = [
    ("service-a", "a0"),
    ("service-a", "a1"),
    ("service-a", "a2"),
    ("service-a", "a3"),
    ("service-a", "a4"),
    ("service-b", "b0"),
    ("service-b", "b1"),
    ("service-b", "b2"),
    ("service-b", "b3"),
    ("service-b", "b4"),
];
const OPENING_BALANCE: u64 = 100;

fn transfer_body(from: (&str, &str), to: (&str, &str), amount: u64, timeout_ms: u64) -> Value {
    let debit =
        json!({"op": "add", "key": {"entityId": from.1}, "field": "balance", "delta": -(amount as i64), "min": 0});
    let credit = json!({"op": "add", "key": {"entityId": to.1}, "field": "balance", "delta": amount});
    let participants = if from.0 == to.0 {
        json!([{"service": from.0, "operations": [debit, credit]}])
    } else {
        json!([{"service": from.0, "operations": [debit]}, {"service": to.0, "operations": [credit]}])
    };
    json!({"participants": participants, "timeoutMs": timeout_ms})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bank_stays_balanced_under_random_faults() {
    let seed = env_number(
        "BANK_SEED",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    );
    let transfers = env_number("BANK_TRANSFERS", 240);
    let clients = env_number("BANK_CLIENTS", 8);
    let soak = Duration::from_secs(env_number("BANK_SOAK_SECS", 0));
    let fault_rate = env_number("BANK_FAULT_PERCENT", 35);
    println!("bank: seed={seed} (replay with BANK_SEED={seed})");
    let timeout = Duration::from_millis(800);

    let env = Arc::new(TestEnv::new().await);
    for (service, id) in ACCOUNTS {
        env.put_account(service, id, &OPENING_BALANCE.to_string()).await;
    }
    // A sweeper runs alongside the clients, as the schedule would, racing live coordinators.
    let stop = Arc::new(AtomicBool::new(false));
    let background = {
        let (env, stop) = (env.clone(), stop.clone());
        tokio::spawn(async move {
            let sweeper = env.sweeper(None);
            let mut runs = 0u32;
            while !stop.load(Ordering::SeqCst) {
                sweeper.sweep().await.expect("background sweep");
                runs += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            runs
        })
    };

    let outcomes: Arc<Mutex<Vec<(String, u16, String)>>> = Arc::default();
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|client| {
            let (env, outcomes) = (env.clone(), outcomes.clone());
            tokio::spawn(async move {
                let mut rng = Rng(seed ^ (client + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
                let mut done = 0;
                while done < transfers / clients || started.elapsed() < soak {
                    done += 1;
                    let from = ACCOUNTS[rng.below(10) as usize];
                    let mut to = ACCOUNTS[rng.below(10) as usize];
                    while to == from {
                        to = ACCOUNTS[rng.below(10) as usize];
                    }
                    // Up to 120 out of accounts near 100: the min guard refuses some.
                    let amount = 1 + rng.below(120);
                    let fault = draw_fault(&mut rng, fault_rate, timeout);
                    let invoker = env.fresh_invoker();
                    let crash = match fault {
                        Fault::Crash(c) => Faults::crash_at(c),
                        Fault::Edge(edge, action) => {
                            let service = if rng.below(2) == 0 { from.0 } else { to.0 };
                            invoker.set(service, action, edge);
                            Faults::default()
                        }
                        Fault::None => Faults::default(),
                    };
                    let coordinator = env.coordinator_with(&invoker, crash);
                    let body = transfer_body(from, to, amount, timeout.as_millis() as u64).to_string();
                    // One transfer in four is keyed: its record is written before the prepares (PREPARING),
                    // the others' only at the decision (presumed abort).
                    let headers = match rng.below(4) {
                        0 => json!({"Idempotency-Key": format!("bank-{seed}-{}", rng.below(u64::MAX))}),
                        _ => json!({}),
                    };
                    let event = rest_event("POST", "/transactions", "/transactions", None, headers, Some(&body));
                    let (status, answer) = call_coordinator(&coordinator, &event).await;
                    assert!([200, 202, 409, 500].contains(&status), "unexpected answer {status}: {answer}");
                    let id = answer["transactionId"].as_str().unwrap_or_default().to_owned();
                    outcomes.lock().unwrap().push((fault.kind(), status, id));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("client");
    }
    stop.store(true, Ordering::SeqCst);
    let background_runs = background.await.unwrap();

    // Faults stop: every deadline and lock expiry passes, and sweeps bring everything to an end.
    env.clock.advance(10 * 60_000);
    let sweeps = env.sweep_until_quiet().await;

    let mut violations: Vec<String> = vec![];
    let records = env.records().await;
    let mut expected: HashMap<(String, String), BigDecimal> =
        ACCOUNTS.iter().map(|(s, id)| ((s.to_string(), id.to_string()), BigDecimal::from(OPENING_BALANCE))).collect();
    let mut touches: HashMap<(String, String), u64> = HashMap::new();
    let mut committed_ids = std::collections::HashSet::new();
    let (mut committed, mut aborted) = (0, 0);
    for record in &records {
        match record["status"].as_str() {
            Some("COMMITTED") => committed += 1,
            Some("ABORTED") => {
                aborted += 1;
                continue;
            }
            other => {
                violations.push(format!("transaction {} is not terminal: {other:?}", record["transactionId"]));
                continue;
            }
        }
        committed_ids.insert(record["transactionId"].as_str().unwrap().to_owned());
        for participant in record["participants"].as_array().unwrap() {
            let service = participant["service"].as_str().unwrap();
            for op in participant["operations"].as_array().unwrap() {
                let key = (service.to_owned(), op["key"]["entityId"].as_str().unwrap().to_owned());
                let delta: BigDecimal = op["delta"].to_string().parse().unwrap();
                *expected.get_mut(&key).expect("a known account") += delta;
                *touches.entry(key).or_default() += 1;
            }
        }
    }
    let mut total = BigDecimal::from(0);
    for (service, id) in ACCOUNTS {
        let item = env.item(service, id).await.expect("account exists");
        let balance: BigDecimal = item["data"]["balance"].to_string().parse().unwrap();
        total += &balance;
        let key = (service.to_owned(), id.to_owned());
        if balance < 0 {
            violations.push(format!("{service}/{id} is below its guard: {balance}"));
        }
        if balance != expected[&key] {
            violations.push(format!(
                "{service}/{id} holds {balance} but its committed transactions make {}: an aborted transaction left an effect or a commit applied twice",
                expected[&key]
            ));
        }
        let version = item["version"].as_u64().unwrap();
        let applied = touches.get(&key).copied().unwrap_or(0);
        if version != applied {
            violations.push(format!("{service}/{id} is at version {version} after {applied} committed transactions"));
        }
        if let Some(last) = item.get("lastTx").and_then(Value::as_str)
            && !committed_ids.contains(last)
        {
            violations.push(format!("{service}/{id} was last written by {last}, which did not commit"));
        }
    }
    if total != OPENING_BALANCE * ACCOUNTS.len() as u64 {
        violations.push(format!("the total is {total}, not {}", OPENING_BALANCE * ACCOUNTS.len() as u64));
    }
    for (service, item) in env.locked_items().await {
        violations.push(format!("a lock is left on {service}: {item}"));
    }

    let outcomes = outcomes.lock().unwrap();
    let mut faults: BTreeMap<String, u32> = BTreeMap::new();
    for (kind, _, _) in outcomes.iter().filter(|(kind, _, _)| kind != "none") {
        *faults.entry(kind.clone()).or_default() += 1;
    }
    let refused = outcomes.iter().filter(|(_, s, _)| *s == 409).count();
    // Presumed abort: a transfer without an Idempotency-Key has a record once it is decided. Every answer
    // names its transaction; every decided one (200, 202, 409) has exactly its record, and one whose
    // coordinator crashed has one only if it got as far as a decision or left a lock to resolve.
    let statuses: HashMap<&str, &str> = records
        .iter()
        .map(|r| (r["transactionId"].as_str().unwrap(), r["status"].as_str().unwrap_or_default()))
        .collect();
    for (kind, status, id) in outcomes.iter() {
        let recorded = statuses.get(id.as_str()).copied();
        let expected = match status {
            200 | 202 => Some("COMMITTED"),
            409 => Some("ABORTED"),
            _ => recorded,
        };
        if id.is_empty() || recorded != expected {
            violations.push(format!("answer {status} ({kind}) for {id:?} but its record is {recorded:?}"));
        }
    }
    println!(
        "bank: seed={seed} transfers={} committed={committed} aborted={aborted} refused_answers={refused} faults={} {faults:?} background_sweeps={background_runs} final_sweeps={} violations={}",
        outcomes.len(),
        faults.values().sum::<u32>(),
        sweeps.len(),
        violations.len()
    );
    assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
    assert!(records.len() <= outcomes.len(), "a record for every transfer at most");
    assert!(committed > 0 && aborted > 0, "the run exercised both outcomes");
}
