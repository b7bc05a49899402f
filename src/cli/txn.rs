//! `shareflow txn list|resolve|commit|abort`: the transactions a job left on its broker.
//! This module reads the options; [`crate::admin`] does the work.

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::args::fail;
use super::exit::admin_exit;
use super::line::{DecideArgs, TxnCommand};
use crate::admin;

/// `shareflow txn SUBCOMMAND ...`: every option is checked before anything is read.
pub(crate) fn command(command: TxnCommand, runtime: &Runtime) -> ExitCode {
    match command {
        TxnCommand::List { broker, group, prefix, checkpoints, json } => {
            match admin::TxnList::new(broker.dir, broker.kafka, group, prefix, checkpoints, json) {
                Ok(list) => admin_exit("txn list", runtime.block_on(list.run())),
                Err(e) => fail(e),
            }
        }
        TxnCommand::Resolve { broker, checkpoints, group, prefix, dry_run, json } => {
            let resolve = admin::TxnSource::from_options(broker.dir, broker.kafka)
                .and_then(|source| admin::TxnResolve::new(source, checkpoints, group, prefix, dry_run, json));
            match resolve {
                Ok(resolve) => admin_exit("txn resolve", runtime.block_on(resolve.run())),
                Err(e) => fail(e),
            }
        }
        TxnCommand::Commit(args) => decide_by_hand(admin::HandDecision::Commit, args, runtime),
        TxnCommand::Abort(args) => decide_by_hand(admin::HandDecision::Abort, args, runtime),
    }
}

/// `txn commit|abort ID`: decides one transaction of a stopped job by hand.
fn decide_by_hand(op: admin::HandDecision, args: DecideArgs, runtime: &Runtime) -> ExitCode {
    let what = if op == admin::HandDecision::Commit { "txn commit" } else { "txn abort" };
    let decide = admin::TxnSource::from_options(args.broker.dir, args.broker.kafka).and_then(|source| {
        admin::TxnDecide::new(op, args.id, source, args.group, args.checkpoints, args.force, args.json)
    });
    match decide {
        Ok(decide) => admin_exit(what, runtime.block_on(decide.run())),
        Err(e) => fail(e),
    }
}
