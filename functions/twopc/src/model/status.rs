//! A transaction's status, as its record and the REST API's answers say it.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Preparing,
    /// Every participant prepared, and the decision is held (`holdMs`) for a caller to commit or abort.
    Prepared,
    Committing,
    Committed,
    Aborting,
    Aborted,
}

impl Status {
    pub const ALL: [Status; 6] =
        [Status::Preparing, Status::Prepared, Status::Committing, Status::Committed, Status::Aborting, Status::Aborted];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Preparing => "PREPARING",
            Status::Prepared => "PREPARED",
            Status::Committing => "COMMITTING",
            Status::Committed => "COMMITTED",
            Status::Aborting => "ABORTING",
            Status::Aborted => "ABORTED",
        }
    }
    pub fn parse(text: &str) -> Option<Status> {
        Some(match text {
            "PREPARING" => Status::Preparing,
            "PREPARED" => Status::Prepared,
            "COMMITTING" => Status::Committing,
            "COMMITTED" => Status::Committed,
            "ABORTING" => Status::Aborting,
            "ABORTED" => Status::Aborted,
            _ => return None,
        })
    }
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Committed | Status::Aborted)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
