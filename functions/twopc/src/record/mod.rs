//! The transactions table: the record of each transaction and its status, every change of status a
//! conditional write on the status before it, so status only moves forward and exactly one decision wins.
//!
//! A record's data ([`data`]), the table's writes ([`store`]) and the changes they make ([`update`]).
//! Everything is re-exported here: `twopc::record::TransactionRecord` names it as before.

mod data;
mod store;
mod update;

#[cfg(test)]
mod tests;

pub use data::*;
pub use store::*;
pub use update::*;
