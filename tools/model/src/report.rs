//! Running the checker and printing what it found: states explored, and traces step by step. The runner
//! serves the four models, the main one ([`TwoPc`]), issue 35's ([`crate::age::AgeModel`]), issue 41's
//! ([`crate::chain::ChainModel`]) and issue 48's ([`crate::escrow::EscrowModel`]), through [`Traced`].

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path};

use crate::state::*;
use crate::{Action, TwoPc};

/// What [`check`] and [`print_trace`] need of a model besides stateright's `Model`.
pub trait Traced:
    Model<State: Clone + PartialEq + Hash + Send + Sync + 'static, Action: Copy + PartialEq + Debug>
    + Clone
    + Send
    + Sync
    + 'static
{
    /// What is checked (its configuration), printed before the counts.
    fn heading(&self) -> String;
    /// Printed after the counts, once the check is done.
    fn tail(&self) -> String {
        String::new()
    }
    /// One step replayed, `None` if it is not enabled: the lines saying what it did.
    fn explain(&self, s: &Self::State, action: Self::Action) -> Option<Vec<String>>;
    /// A state in one line (a trace's final state).
    fn summary(&self, s: &Self::State) -> String;
}

impl Traced for TwoPc {
    fn heading(&self) -> String {
        format!("model {:?} ({})", self.cfg.name, switches_text(self))
    }

    fn explain(&self, s: &State, action: Action) -> Option<Vec<String>> {
        self.apply(s, action, true).map(|(_, lines)| lines)
    }

    fn summary(&self, s: &State) -> String {
        summary(self, s)
    }
}

/// What one exhaustive check found.
pub struct Run<M: Model = TwoPc> {
    pub model: M,
    /// States generated, counting repeats.
    pub states: usize,
    /// Distinct states explored.
    pub unique: usize,
    pub depth: usize,
    pub elapsed: Duration,
    pub discoveries: HashMap<&'static str, Path<M::State, M::Action>>,
}

/// Threads for the checker: `MODEL_THREADS`, else 2 (CI machines have 2 cores).
fn threads() -> usize {
    std::env::var("MODEL_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(2)
}

/// One check at a time: `cargo test` runs tests in parallel, and each check already uses every
/// thread it is given (and memory in proportion to the states it explores).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Checks every reachable state (breadth first, so a counterexample is a shortest one). With
/// `stop_at`, stops as soon as that property has a discovery.
pub fn check<M: Traced>(model: M, stop_at: Option<&'static str>) -> Run<M> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let started = Instant::now();
    let mut builder = model.clone().checker().threads(threads());
    if let Some(name) = stop_at {
        builder = builder.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])));
    }
    let checker = builder.spawn_bfs().join();
    let run = Run {
        model,
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed: started.elapsed(),
        discoveries: checker.discoveries(),
    };
    println!(
        "{}: {} distinct states explored ({} generated), max depth {}, in {:.1} s{}",
        run.model.heading(),
        run.unique,
        run.states,
        run.depth,
        run.elapsed.as_secs_f64(),
        run.model.tail()
    );
    run
}

/// The names of the switches (name, on) that are off: what a heading lists.
pub fn switched_off(switches: &[(&'static str, bool)]) -> Vec<&'static str> {
    switches.iter().filter(|(_, on)| !on).map(|(name, _)| *name).collect()
}

fn switches_text(model: &TwoPc) -> String {
    let s = model.cfg.switches;
    let off = switched_off(&[
        ("token_check", s.token_check),
        ("recognise_own_writes", s.recognise_own_writes),
        ("abort_everyone", s.abort_everyone),
        ("release_on_refused_decision", s.release_on_refused_decision),
        ("fresh_token_per_attempt", s.fresh_token_per_attempt),
        ("refusal_after_unknown_is_unknown", s.refusal_after_unknown_is_unknown),
        ("shortened_writes", s.shortened_writes),
        ("resolver_margin", s.resolver_margin),
        ("lock_cutoff", s.lock_cutoff),
        ("replay_answers_record", s.replay_answers_record),
        ("rule_version_condition", s.rule_version_condition),
        ("apply_pending", s.apply_pending),
        ("barrier", s.barrier),
        ("recheck", s.recheck),
        ("held_undecided", s.held_undecided),
        ("resolver_extends_hold", s.resolver_extends_hold),
        ("operator_writes_conditionally", s.operator_writes_conditionally),
        ("unindexed_recorded_locks", s.unindexed_recorded_locks),
        ("revisit_unclean_prepares", s.revisit_unclean_prepares),
        ("recorded_prepares_sent_once", s.recorded_prepares_sent_once),
        ("operator_abort_left_open", s.operator_abort_left_open),
    ]);
    let b = model.cfg.budget;
    let budget = format!(
        "faults: at most {} in all, of which crash {} lost-db-reply {} duplicate {} loss {} refused {} oversized {}; sweeper reads {} per run{}{}",
        b.total,
        b.crash,
        b.db_reply,
        b.dup,
        b.loss,
        b.refused,
        b.oversized,
        model.cfg.sweep_k,
        if model.cfg.sweeper_races_coordinators { ", races live coordinators" } else { ", runs between coordinators" },
        if model.cfg.margin { "; clock margin" } else { "; no clock margin" }
    );
    let budget = if model.cfg.routes.is_empty() {
        budget
    } else {
        let routes: Vec<String> =
            model.cfg.routes.iter().map(|&(tx, r)| format!("{} {}", route_name(r), model.tx_name(tx))).collect();
        format!("{budget}; calls, each once at any moment: {}", routes.join(", "))
    };
    let budget = match (model.cfg.redeploy, model.cfg.resource) {
        (true, _) => format!("{budget}; a service redeployed once at any moment"),
        (_, Some(svc)) => {
            format!("{budget}; {} is a resource (cards good or declined)", model.cfg.services[svc as usize])
        }
        _ => budget,
    };
    if off.is_empty() { format!("fixed protocol; {budget}") } else { format!("OFF: {}; {budget}", off.join(", ")) }
}

fn route_name(r: crate::config::Route) -> &'static str {
    match r {
        crate::config::Route::Commit => "the caller's commit of",
        crate::config::Route::Abort => "the caller's abort of",
        crate::config::Route::Operator => "an operator's abort of",
    }
}

impl<M: Traced> Run<M> {
    /// Panics (after printing the trace) if an `always`/`eventually` property has a counterexample,
    /// or a `sometimes` property was never seen.
    pub fn assert_all_hold(&self) {
        let mut failures = vec![];
        for p in self.model.properties() {
            let found = self.discoveries.get(p.name);
            match (p.expectation, found) {
                (Expectation::Always | Expectation::Eventually, Some(path)) => {
                    println!("\nCOUNTEREXAMPLE to \"{}\":", p.name);
                    print_trace(&self.model, path);
                    failures.push(p.name);
                }
                (Expectation::Sometimes, None) => {
                    println!("never seen: \"{}\"", p.name);
                    failures.push(p.name);
                }
                (Expectation::Sometimes, Some(path)) => {
                    println!("  seen ({} steps): {}", path.clone().into_actions().len(), p.name);
                }
                _ => println!("  holds: {}", p.name),
            }
        }
        assert!(failures.is_empty(), "properties failed: {failures:?}");
    }

    /// The counterexample to `name`, printed; panics if there is none.
    pub fn expect_counterexample(&self, name: &'static str) -> Path<M::State, M::Action> {
        let path =
            self.discoveries.get(name).unwrap_or_else(|| panic!("the checker found no counterexample to \"{name}\""));
        println!("\nCOUNTEREXAMPLE to \"{name}\" ({} steps):", path.clone().into_actions().len());
        print_trace(&self.model, path);
        path.clone()
    }
}

impl<M: Traced> Run<M>
where
    M::State: PartialEq,
{
    /// The counterexample to the `always` property `name`, cut at the first state that violates it, and
    /// printed; panics if there is none. The checker keeps the last violating state it met before it stopped
    /// (its threads hand out work in batches), which may lie steps past the first one on its path.
    pub fn expect_violation(&self, name: &'static str) -> Path<M::State, M::Action> {
        let found =
            self.discoveries.get(name).unwrap_or_else(|| panic!("the checker found no counterexample to \"{name}\""));
        let property = self.model.properties().into_iter().find(|p| p.name == name).expect("a property of the model");
        assert_eq!(property.expectation, Expectation::Always, "\"{name}\" is an `always` property");
        let steps = found.clone().into_vec();
        let first = steps
            .iter()
            .position(|(s, _)| !(property.condition)(&self.model, s))
            .expect("the path reaches a state that violates it");
        let actions: Vec<M::Action> = steps[..first].iter().filter_map(|(_, a)| *a).collect();
        let path = Path::from_actions(&self.model, steps[0].0.clone(), &actions).expect("the path replays");
        println!("\nCOUNTEREXAMPLE to \"{name}\" ({first} steps, cut where it first fails):");
        print_trace(&self.model, &path);
        path
    }
}

/// Prints a path step by step: each action, what it did, and the state at the end.
pub fn print_trace<M: Traced>(model: &M, path: &Path<M::State, M::Action>) {
    let steps = path.clone().into_vec();
    for (n, (state, action)) in steps.iter().enumerate() {
        let Some(action) = action else { continue };
        println!("{:>3}. {:?}", n + 1, action);
        for line in model.explain(state, *action).unwrap_or_default() {
            println!("       {line}");
        }
    }
    println!("     final: {}", model.summary(path.last_state()));
}

/// One line: items, records, answers.
pub fn summary(model: &TwoPc, s: &State) -> String {
    let items: Vec<String> = s
        .items
        .iter()
        .enumerate()
        .map(|(i, it)| {
            format!(
                "{}={}{}{}{}",
                model.cfg.items[i].name,
                it.balance,
                if it.version > 0 { format!(" v{}", it.version) } else { String::new() },
                it.last_tx.map(|t| format!(" lastTx={}", model.tx_name(t))).unwrap_or_default(),
                it.lock
                    .map(|l| format!(
                        " lock={}/{}{}{}",
                        model.tx_name(l.tx),
                        l.token,
                        if l.held { " held" } else { "" },
                        l.pending.map(|p| format!(" pending={p}")).unwrap_or_default()
                    ))
                    .unwrap_or_default()
            )
        })
        .collect();
    let records: Vec<String> = s
        .records
        .iter()
        .enumerate()
        .map(|(t, r)| {
            format!("{}:{}", model.tx_name(t as u8), r.as_ref().map_or("-".to_owned(), |r| format!("{:?}", r.status)))
        })
        .collect();
    let answers: Vec<String> =
        (0..s.coords.len()).map(|ci| format!("{}→{:?}", model.coord_name(ci as u8), s.coords[ci].answer)).collect();
    let resource: Vec<String> = (0..s.res.len())
        .map(|t| {
            let e =
                s.barriers[t].map_or("-".to_owned(), |e| format!("{:?}{}", e.state, if e.lock { "+lock" } else { "" }));
            format!("{}: barrier {e}, resource {:?}", model.tx_name(t as u8), s.res[t])
        })
        .collect();
    let resource = if resource.is_empty() { String::new() } else { format!("; {}", resource.join(", ")) };
    format!(
        "items [{}]; records [{}]; answers [{}]{resource}",
        items.join(", "),
        records.join(", "),
        answers.join(", ")
    )
}
