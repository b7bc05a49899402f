//! Model-based property test of the embedded broker: random sequences of poll, acks of
//! every type with and without a transaction, begin, prepare, commit, abort, output,
//! clock advances and broker restarts, checked after every step against a small
//! reference model of KIP-1289's state machines.
//!
//! Checked each step: every record is in exactly the state (and delivery count) the
//! model says, every LOCKED record belongs to an undecided transaction, each call
//! succeeds or fails as the model predicts, and read_committed shows exactly the
//! output of committed transactions (never aborted or pending output).

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use shareflow::connector::broker::{EmbeddedShareConsumer, EmbeddedTransactionCoordinator};
use shareflow::connector::share::AcknowledgementMode::*;
use shareflow::connector::share::*;
use support::*;

const RECORDS: usize = 12;
const LIMIT: u16 = 3;
const CAP: usize = 6;
const MAX_PENDING: usize = 3;
const LOCK_MS: u64 = 30_000;
const TXN_MS: u64 = 60_000;

#[derive(Debug, Clone)]
enum Op {
    Poll { member: usize, max: usize },
    Ack { member: usize, ty: AcknowledgeType, count: usize },
    AckTxn { member: usize, txn: u64, count: usize, reject: bool },
    AckAnyOffset { member: usize, txn: u64, offset: i64 },
    Begin(u64),
    Prepare(u64),
    Commit(u64),
    Abort(u64),
    Output(u64),
    Advance(u64),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let member = 0..2usize;
    let txn = 1..5u64;
    let ty = prop_oneof![
        Just(AcknowledgeType::Accept),
        Just(AcknowledgeType::Reject),
        Just(AcknowledgeType::Release),
        Just(AcknowledgeType::Renew)
    ];
    prop_oneof![
        4 => (member.clone(), 1..5usize).prop_map(|(member, max)| Op::Poll { member, max }),
        2 => (member.clone(), ty, 1..3usize).prop_map(|(member, ty, count)| Op::Ack { member, ty, count }),
        4 => (member.clone(), txn.clone(), 1..4usize, any::<bool>())
            .prop_map(|(member, txn, count, reject)| Op::AckTxn { member, txn, count, reject }),
        1 => (member, txn.clone(), 0..RECORDS as i64).prop_map(|(member, txn, offset)| Op::AckAnyOffset { member, txn, offset }),
        3 => txn.clone().prop_map(Op::Begin),
        2 => txn.clone().prop_map(Op::Prepare),
        2 => txn.clone().prop_map(Op::Commit),
        1 => txn.clone().prop_map(Op::Abort),
        2 => txn.prop_map(Op::Output),
        2 => prop_oneof![Just(1_000u64), Just(29_000), Just(31_000), Just(61_000)].prop_map(Op::Advance),
        1 => Just(Op::Restart),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum M {
    Avail(u16),
    Acq { member: usize, d: u16, deadline: u64 },
    Locked { txn: u64, accept: bool, d: u16 },
    Acked,
    Archived,
}

impl M {
    fn status(self) -> (RecordState, u16) {
        match self {
            M::Avail(d) => (RecordState::Available, d),
            M::Acq { d, .. } => (RecordState::Acquired, d),
            M::Locked { d, .. } => (RecordState::Locked, d),
            M::Acked => (RecordState::Acknowledged, 0),
            M::Archived => (RecordState::Archived, 0),
        }
    }
    fn d(self) -> u16 {
        self.status().1
    }
}

fn failed(d: u16) -> M {
    if d >= LIMIT {
        M::Archived
    } else {
        M::Avail(d)
    }
}

struct Model {
    recs: Vec<M>,
    txns: BTreeMap<u64, (TransactionState, u64)>,
    out: Vec<u64>,
    now: u64,
}

impl Model {
    fn state(&self, t: u64) -> TransactionState {
        self.txns.get(&t).map_or(TransactionState::Empty, |s| s.0)
    }
    fn set_state(&mut self, t: u64, s: TransactionState) {
        if let Some(e) = self.txns.get_mut(&t) {
            e.0 = s;
        }
    }
    fn held(&self, member: usize) -> Vec<i64> {
        (0..RECORDS)
            .filter(|&o| matches!(self.recs[o], M::Acq { member: m, .. } if m == member))
            .map(|o| o as i64)
            .collect()
    }
    fn finish(&mut self, t: u64, commit: bool) {
        self.set_state(t, if commit { TransactionState::Committed } else { TransactionState::Aborted });
        for r in &mut self.recs {
            if let M::Locked { txn, accept, d } = *r {
                if txn == t {
                    *r = match (commit, accept) {
                        (true, true) => M::Acked,
                        (true, false) => M::Archived,
                        (false, _) => failed(d),
                    };
                }
            }
        }
    }
    fn expire(&mut self) {
        for r in &mut self.recs {
            if let M::Acq { d, deadline, .. } = *r {
                if deadline <= self.now {
                    *r = failed(d);
                }
            }
        }
        let timed_out: Vec<u64> = self
            .txns
            .iter()
            .filter(|(_, (s, begun))| *s == TransactionState::Ongoing && begun + TXN_MS <= self.now)
            .map(|(t, _)| *t)
            .collect();
        for t in timed_out {
            self.finish(t, false);
        }
    }
    fn acquire(&mut self, member: usize, max: usize) -> Vec<i64> {
        let in_flight = self.recs.iter().filter(|r| matches!(r, M::Acq { .. } | M::Locked { .. })).count();
        let budget = max.min(CAP.saturating_sub(in_flight));
        let picked: Vec<usize> = (0..RECORDS).filter(|&o| matches!(self.recs[o], M::Avail(_))).take(budget).collect();
        for &o in &picked {
            let d = self.recs[o].d() + 1;
            self.recs[o] = M::Acq { member, d, deadline: self.now + LOCK_MS };
        }
        picked.into_iter().map(|o| o as i64).collect()
    }
    fn committed_output(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for &t in &self.out {
            match self.state(t) {
                TransactionState::Committed => out.push(t),
                TransactionState::Aborted => {}
                _ => break, // the last stable offset
            }
        }
        out
    }
}

/// The member in transactional mode; the other is explicit.
const TRANSACTIONAL: usize = 1;

struct Sut {
    f: Fixture,
    consumers: Vec<EmbeddedShareConsumer>,
    coord: EmbeddedTransactionCoordinator,
    held: Vec<Vec<Record>>,
}

impl Sut {
    async fn connect(f: Fixture) -> Self {
        // Member 0 settles on its own (explicit mode); member 1 stages its ACCEPTs into
        // transactions (transactional mode, which is opt-in: the broker refuses staged
        // acknowledgements of a member in any other mode).
        let consumers = vec![f.consumer(Explicit).await, f.consumer(Transactional).await];
        let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
        Sut { f, consumers, coord, held: vec![Vec::new(), Vec::new()] }
    }
    fn handle(&self, t: u64) -> TransactionHandle {
        TransactionHandle { id: txn_id(t), epoch: self.coord.epoch() }
    }
    fn records(&self, member: usize, offsets: &[i64]) -> Vec<Record> {
        self.held[member].iter().filter(|r| offsets.contains(&r.offset)).cloned().collect()
    }
}

async fn run(ops: Vec<Op>) {
    let cfg = ShareConfig::builder()
        .delivery_count_limit(LIMIT)
        .partition_max_record_locks(CAP as u32)
        .max_pending_transactions(MAX_PENDING as u32)
        .record_lock_duration(Duration::from_millis(LOCK_MS))
        .build()
        .unwrap();
    let f = Fixture::new(1, cfg).await;
    f.produce(0, RECORDS).await;
    let mut model = Model {
        recs: vec![M::Avail(0); RECORDS],
        txns: BTreeMap::new(),
        out: Vec::new(),
        now: f.clock.now_ms_for_tests(),
    };
    let mut sut = Sut::connect(f).await;

    for (step, op) in ops.into_iter().enumerate() {
        let ctx = format!("step {step}: {op:?}");
        match op {
            Op::Poll { member, max } => {
                model.expire();
                let expected = model.acquire(member, max);
                let got = sut.consumers[member].poll(max, Duration::ZERO).await.unwrap();
                let offsets: Vec<i64> = got.iter().map(|r| r.offset).collect();
                assert_eq!(offsets, expected, "{ctx}");
                for r in &got {
                    assert_eq!(r.delivery_count as u16, model.recs[r.offset as usize].d(), "{ctx}");
                }
                for held in &mut sut.held {
                    held.retain(|h| !got.iter().any(|r| r.offset == h.offset));
                }
                sut.held[member].extend(got);
            }
            Op::Ack { member, ty, count } => {
                let offsets: Vec<i64> = model.held(member).into_iter().take(count).collect();
                if offsets.is_empty() {
                    continue;
                }
                let records = sut.records(member, &offsets);
                if member == TRANSACTIONAL && ty == AcknowledgeType::Accept {
                    let refused = sut.consumers[member].acknowledge(&records[0], ty).await;
                    assert!(refused.is_err(), "{ctx}: a transactional member's ACCEPT outside a transaction");
                    continue;
                }
                for r in &records {
                    sut.consumers[member].acknowledge(r, ty).await.unwrap();
                }
                model.expire();
                let still_held =
                    offsets.iter().all(|&o| matches!(model.recs[o as usize], M::Acq { member: m, .. } if m == member));
                let result = sut.consumers[member].commit().await;
                assert_eq!(result.is_ok(), still_held, "{ctx}: {result:?}");
                if still_held {
                    for &o in &offsets {
                        let r = &mut model.recs[o as usize];
                        let d = r.d();
                        *r = match ty {
                            AcknowledgeType::Accept => M::Acked,
                            AcknowledgeType::Reject => M::Archived,
                            AcknowledgeType::Release => failed(d),
                            AcknowledgeType::Renew => M::Acq { member, d, deadline: model.now + LOCK_MS },
                        };
                    }
                }
            }
            Op::AckTxn { member, txn, count, reject } => {
                let offsets: Vec<i64> = model.held(member).into_iter().take(count).collect();
                if offsets.is_empty() {
                    continue;
                }
                let ty = if reject { AcknowledgeType::Reject } else { AcknowledgeType::Accept };
                let acks = acks(&sut.records(member, &offsets), ty);
                model.expire();
                let ok = member == TRANSACTIONAL
                    && model.state(txn) == TransactionState::Ongoing
                    && offsets
                        .iter()
                        .all(|&o| matches!(model.recs[o as usize], M::Acq { member: m, .. } if m == member));
                let member_id = sut.consumers[member].member_id().clone();
                let result = sut.coord.send_share_acks_to_transaction(&sut.handle(txn), &member_id, &acks).await;
                assert_eq!(result.is_ok(), ok, "{ctx}: {result:?}");
                if ok {
                    for &o in &offsets {
                        let d = model.recs[o as usize].d();
                        model.recs[o as usize] = M::Locked { txn, accept: !reject, d };
                    }
                }
            }
            Op::AckAnyOffset { member, txn, offset } => {
                let mut a = ShareAcknowledgements::new();
                a.add(tp(0), AcknowledgementBatch::new(offset, offset, AcknowledgeType::Accept)).unwrap();
                model.expire();
                let ok = member == TRANSACTIONAL
                    && model.state(txn) == TransactionState::Ongoing
                    && matches!(model.recs[offset as usize], M::Acq { member: m, .. } if m == member);
                let member_id = sut.consumers[member].member_id().clone();
                let result = sut.coord.send_share_acks_to_transaction(&sut.handle(txn), &member_id, &a).await;
                assert_eq!(result.is_ok(), ok, "{ctx}: {result:?}");
                if ok {
                    let d = model.recs[offset as usize].d();
                    model.recs[offset as usize] = M::Locked { txn, accept: true, d };
                }
            }
            Op::Begin(t) => {
                model.expire();
                let pending = model.txns.values().filter(|(s, _)| s.is_pending()).count();
                let ok = match model.state(t) {
                    TransactionState::Empty => pending < MAX_PENDING,
                    // KIP-1289: begin "returns existing if already started".
                    TransactionState::Ongoing | TransactionState::Prepare => true,
                    _ => false,
                };
                let result = sut.coord.begin_transaction(&txn_id(t), Duration::from_millis(TXN_MS)).await;
                assert_eq!(result.is_ok(), ok, "{ctx}: {result:?}");
                if ok && model.state(t) == TransactionState::Empty {
                    model.txns.insert(t, (TransactionState::Ongoing, model.now));
                }
            }
            Op::Prepare(t) => {
                model.expire();
                let s = model.state(t);
                let result = sut.coord.prepare_transaction(&txn_id(t)).await;
                assert_eq!(result.is_ok(), s.is_pending(), "{ctx}: {result:?}");
                if s == TransactionState::Ongoing {
                    model.set_state(t, TransactionState::Prepare);
                }
            }
            Op::Commit(t) => {
                model.expire();
                let s = model.state(t);
                let result = sut.coord.commit_transaction(&txn_id(t)).await;
                let ok = matches!(s, TransactionState::Prepare | TransactionState::Committed);
                assert_eq!(result.is_ok(), ok, "{ctx}: {result:?}");
                if s == TransactionState::Prepare {
                    model.finish(t, true);
                }
            }
            Op::Abort(t) => {
                model.expire();
                let s = model.state(t);
                let result = sut.coord.abort_transaction(&txn_id(t)).await;
                assert_eq!(result.is_ok(), s != TransactionState::Empty, "{ctx}: {result:?}");
                if s.is_pending() {
                    model.finish(t, false);
                }
            }
            Op::Output(t) => {
                model.expire();
                let ok = model.state(t) == TransactionState::Ongoing;
                let result = sut.coord.send(&sut.handle(t), vec![ProducerRecord::new(OUT, 0, t.to_string())]).await;
                assert_eq!(result.is_ok(), ok, "{ctx}: {result:?}");
                if ok {
                    model.out.push(t);
                }
            }
            Op::Advance(ms) => {
                sut.f.advance(Duration::from_millis(ms));
                model.now += ms;
                model.expire();
                sut.f.broker.tick().await.unwrap();
            }
            Op::Restart => {
                let mut f = std::mem::replace(&mut sut.f, Fixture::new(1, ShareConfig::default()).await);
                f.restart().await;
                // Decision 0003, "Restart": the cut-short delivery counts.
                for r in &mut model.recs {
                    if let M::Acq { d, .. } = *r {
                        *r = failed(d);
                    }
                }
                model.expire();
                // The job instance reconnects: its new coordinator fences the old epoch
                // and aborts what was ONGOING.
                let ongoing: Vec<u64> =
                    model.txns.iter().filter(|(_, (s, _))| *s == TransactionState::Ongoing).map(|(t, _)| *t).collect();
                for t in ongoing {
                    model.finish(t, false);
                }
                sut = Sut::connect(f).await;
            }
        }
        check(&sut.f, &model, &ctx).await;
    }
}

async fn check(f: &Fixture, model: &Model, ctx: &str) {
    let txns: BTreeMap<TransactionId, TransactionState> =
        f.broker.transactions().await.unwrap().into_iter().map(|t| (t.id, t.state)).collect();
    for (o, m) in model.recs.iter().enumerate() {
        let s = f.broker.record_status(GROUP, &tp(0), o as i64).await.unwrap();
        assert_eq!((s.state, s.delivery_count), m.status(), "{ctx}: offset {o}");
        // A LOCKED record belongs to exactly one undecided transaction; nothing else is in one.
        match (s.state, &s.transaction) {
            (RecordState::Locked, Some(id)) => {
                assert!(txns[id].is_pending(), "{ctx}: offset {o} locked in decided {id}")
            }
            (RecordState::Locked, None) => panic!("{ctx}: offset {o} LOCKED without a transaction"),
            (_, Some(id)) => panic!("{ctx}: offset {o} is {} yet names {id}", s.state),
            (_, None) => {}
        }
    }
    for (t, (s, _)) in &model.txns {
        assert_eq!(txns.get(&txn_id(*t)), Some(s), "{ctx}: transaction {t}");
    }
    let committed: Vec<u64> = f
        .broker
        .fetch_all(&out_tp(), IsolationLevel::ReadCommitted)
        .await
        .unwrap()
        .into_iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).parse().unwrap())
        .collect();
    assert_eq!(committed, model.committed_output(), "{ctx}: read_committed output");
    assert!(committed.iter().all(|t| model.state(*t) == TransactionState::Committed), "{ctx}: aborted output visible");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn broker_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..80)) {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(run(ops));
    }
}
