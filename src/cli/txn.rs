//! `shareflow txn list|resolve|commit|abort`: the transactions a job left on its broker.
//! This module reads the options; [`crate::admin`] does the work.

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::args::{fail, Args};
use super::exit::admin_exit;
use crate::admin;

/// `shareflow txn SUBCOMMAND ...`; `txn` alone or with another word is an unknown command.
pub(crate) fn command(args: &mut Args, runtime: &Runtime) -> ExitCode {
    let subcommand = args.0.first().cloned();
    match subcommand.as_deref() {
        Some("resolve") => resolve(args, runtime),
        Some("commit" | "abort") => decide_by_hand(args, runtime),
        Some("list") => list(args, runtime),
        // What main says of any unknown command, as before the commands were split.
        _ => fail("unknown command \"txn\""),
    }
}

/// `txn resolve`: decides what a stopped job left pending, as its restart would.
fn resolve(args: &mut Args, runtime: &Runtime) -> ExitCode {
    args.0.remove(0);
    let resolve = match txn_resolve_options(args).and_then(|o| args.finish().map(|()| o)) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    admin_exit("txn resolve", runtime.block_on(resolve.run()))
}

/// `txn commit|abort ID`: decides one transaction of a stopped job by hand.
fn decide_by_hand(args: &mut Args, runtime: &Runtime) -> ExitCode {
    let op = if args.0.remove(0) == "commit" { admin::HandDecision::Commit } else { admin::HandDecision::Abort };
    let what = if op == admin::HandDecision::Commit { "txn commit" } else { "txn abort" };
    let decide = match txn_decide_options(op, args).and_then(|o| args.finish().map(|()| o)) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    admin_exit(what, runtime.block_on(decide.run()))
}

/// `txn list`: the transactions of a broker (read-only).
fn list(args: &mut Args, runtime: &Runtime) -> ExitCode {
    args.0.remove(0);
    // Every option is checked before anything is read.
    let list = match txn_list_options(args).and_then(|o| args.finish().map(|()| o)) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    admin_exit("txn list", runtime.block_on(list.run()))
}

/// The options of `txn resolve`.
fn txn_resolve_options(args: &mut Args) -> Result<admin::TxnResolve, String> {
    admin::TxnResolve::new(
        admin::TxnSource::from_options(args.value("--dir")?, args.value("--kafka")?)?,
        args.value("--checkpoints")?,
        args.value("--group")?,
        args.value("--prefix")?,
        args.flag("--dry-run"),
        args.flag("--json"),
    )
}

/// The options of `txn commit|abort`: the transaction's id first, then the rest.
fn txn_decide_options(op: admin::HandDecision, args: &mut Args) -> Result<admin::TxnDecide, String> {
    let id = match args.0.first() {
        Some(a) if !a.starts_with("--") => Some(args.0.remove(0)),
        _ => None,
    };
    admin::TxnDecide::new(
        op,
        id,
        admin::TxnSource::from_options(args.value("--dir")?, args.value("--kafka")?)?,
        args.value("--group")?,
        args.value("--checkpoints")?,
        args.flag("--force"),
        args.flag("--json"),
    )
}

/// The options of `txn list`.
fn txn_list_options(args: &mut Args) -> Result<admin::TxnList, String> {
    admin::TxnList::new(
        args.value("--dir")?,
        args.value("--kafka")?,
        args.value("--group")?,
        args.value("--prefix")?,
        args.value("--checkpoints")?,
        args.flag("--json"),
    )
}
