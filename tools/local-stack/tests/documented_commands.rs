//! Every `cargo run -p local-stack -- ...` line the docs give is a command `twopc-local` takes: each
//! is run with `--help` added (which parses the command and its flags, then stops), so a renamed
//! command or flag fails here instead of on a reader's machine.
//!
//! It is also why `cargo test --workspace` builds `twopc-local` itself: the browser and API runs then
//! find it built with the tests' own features, and CI does not build it a second time.

use std::path::Path;
use std::process::Command;

const INVOCATION: &str = "cargo run -p local-stack --";
const DOCS: [&str; 6] =
    ["README.md", "docs/LOCAL.md", "docs/api.md", "docs/authorization.md", "docs/participants.md", "infra/DEPLOY.md"];

fn documented_commands() -> Vec<(String, Vec<String>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut commands = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        for line in text.lines() {
            let Some(at) = line.find(INVOCATION) else { continue };
            // The command ends where its code span, its shell comment, a redirection or a pipe does.
            let rest = &line[at + INVOCATION.len()..];
            let rest = rest.split(['`', '#', '>', '|', '&']).next().unwrap_or_default();
            let args: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
            if !commands.iter().any(|(_, known)| *known == args) {
                commands.push((doc.to_owned(), args));
            }
        }
    }
    commands
}

#[test]
fn every_command_the_docs_give_parses() {
    let commands = documented_commands();
    let named: Vec<&str> = commands.iter().filter_map(|(_, args)| args.first().map(String::as_str)).collect();
    for command in ["demo", "up", "replay", "reset", "sign"] {
        assert!(named.contains(&command), "the docs show `{INVOCATION} {command}`: {commands:?}");
    }
    for (doc, args) in &commands {
        let output = Command::new(env!("CARGO_BIN_EXE_twopc-local"))
            .args(args)
            .arg("--help")
            .output()
            .expect("twopc-local runs");
        assert!(
            output.status.success() && String::from_utf8_lossy(&output.stdout).contains("Usage:"),
            "{doc}: `{INVOCATION} {}` does not parse: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
