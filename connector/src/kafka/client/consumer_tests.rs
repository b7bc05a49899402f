//! Tests of `consumer.rs`.
use super::*;

fn key(topic: &str, partition: i32, offset: i64) -> Key {
    Key { topic: Arc::from(topic), partition, offset }
}

#[test]
fn a_delivered_record_is_found_by_topic_partition_and_offset() {
    let mut delivered: HashMap<Key, u32, std::hash::BuildHasherDefault<OffsetHasher>> = HashMap::default();
    let shared: Arc<str> = Arc::from("orders");
    for partition in 0..4 {
        for offset in 0..2_000 {
            delivered.insert(Key { topic: shared.clone(), partition, offset }, 1);
            delivered.insert(key("payments", partition, offset), 2);
        }
    }
    assert_eq!(delivered.len(), 16_000, "two topics with the same partitions and offsets are distinct");
    #[rustfmt::skip]
    let cases: &[(&str, Key, Option<u32>)] = &[
        ("the fetch's own topic",                      Key { topic: shared.clone(), partition: 3, offset: 1_999 }, Some(1)),
        ("an equal topic name in another allocation",  key("orders", 3, 1_999),   Some(1)),
        ("the other topic",                            key("payments", 0, 0),     Some(2)),
        ("an offset never delivered",                  key("orders", 0, 2_000),   None),
        ("a partition never delivered",                key("orders", 4, 0),       None),
        ("a topic never delivered",                    key("refunds", 0, 0),      None),
    ];
    for (case, k, want) in cases {
        assert_eq!(delivered.get(k).copied(), *want, "{case}: {k:?}");
    }
}

/// A poll's records: partitions 0 and 1 of "orders" interleaved, then one of
/// "payments" with offsets equal to some of "orders".
fn poll() -> Vec<ConsumerRecord> {
    let orders: Arc<str> = Arc::from("orders");
    let mut records: Vec<ConsumerRecord> =
        (0..6).map(|i| ConsumerRecord::new(orders.clone(), i % 2, 100 + i64::from(i / 2), None, None)).collect();
    records.push(ConsumerRecord::new("payments", 0, 100, None, None));
    records
}

fn position(d: &Delivered, k: &Key) -> Option<usize> {
    d.position(&k.topic, k.partition, k.offset)
}

/// A `Delivered` holding [`poll`]'s records, all handed out, and their keys in
/// poll order.
fn holding_a_poll() -> (Delivered, Vec<Key>) {
    let mut d = Delivered::default();
    let records = poll();
    let keys = records.iter().map(|r| key(&r.topic, r.partition, r.offset)).collect();
    d.replace(records, 1, std::time::Instant::now());
    assert_eq!(d.hand_out(100).len(), 7, "a poll of more than the fetch hands all of it out");
    (d, keys)
}

const ACCEPT: Held = Held::Pending(Settle::Accept);

/// Takes the fetch out of `d`, as a fetch or close does, and names its open
/// records: those the client's thread gives back.
fn open_names(d: &mut Delivered) -> Vec<(String, i32, i64)> {
    let (records, held) = d.take_fetch();
    records
        .iter()
        .zip(held)
        .filter(|(_, h)| *h == Held::Open)
        .map(|(r, _)| (r.topic.to_string(), r.partition, r.offset))
        .collect()
}

#[test]
fn a_poll_settled_in_order_is_found_at_the_cursor_without_an_index() {
    let (mut d, keys) = holding_a_poll();
    assert_eq!(d.open(), 7);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(position(&d, k), Some(i), "{k:?}");
        d.mark(i, ACCEPT);
        assert_eq!(d.open(), 6 - i);
    }
    assert!(d.index.get().is_none(), "settling in poll order must not build the hash index");
    for k in &keys {
        assert_eq!(position(&d, k), None, "{k:?} is settled already");
    }
    assert_eq!(d.pending(), 7, "kept until the next fetch");
    assert_eq!(d.take_pending().filter(|(_, s)| *s == Settle::Accept).count(), 7);
    assert_eq!(d.pending(), 0);
    assert_eq!(d.take_pending().count(), 0, "each acknowledgement is passed on once");
}

#[test]
fn a_record_out_of_order_settled_twice_renewed_or_never_delivered() {
    let (mut d, _) = holding_a_poll();
    // Each step: the key, what position() finds, and where the step moves it.
    #[rustfmt::skip]
    let steps: &[(&str, Key, Option<usize>, Held)] = &[
        ("the last record first (out of order)",      key("payments", 0, 100), Some(6), ACCEPT),
        ("settled already",                          key("payments", 0, 100), None,    ACCEPT),
        ("partition 1, second offset",               key("orders", 1, 101),   Some(3), Held::Open),
        ("renewed: still unsettled",                 key("orders", 1, 101),   Some(3), Held::Pending(Settle::Reject)),
        ("an offset this poll did not deliver",      key("orders", 0, 103),   None,    ACCEPT),
        ("a partition this poll did not deliver",    key("orders", 2, 100),   None,    ACCEPT),
        ("a topic this poll did not deliver",        key("refunds", 0, 100),  None,    ACCEPT),
        ("the first record",                         key("orders", 0, 100),   Some(0), Held::Pending(Settle::Release)),
    ];
    for (case, k, want, to) in steps {
        let got = position(&d, k);
        assert_eq!(got, *want, "{case}: {k:?}");
        if let Some(i) = got {
            d.mark(i, *to);
        }
    }
    assert_eq!(d.open(), 4, "7 delivered, 3 settled");
    let pending: Vec<(i64, Settle)> = d.take_pending().map(|(r, s)| (r.offset, s)).collect();
    assert_eq!(
        pending,
        vec![(100, Settle::Release), (101, Settle::Reject), (100, Settle::Accept)],
        "in fetch order, each as it was settled"
    );
    let rest = open_names(&mut d);
    assert_eq!(
        rest,
        vec![
            ("orders".into(), 1, 100),
            ("orders".into(), 0, 101),
            ("orders".into(), 0, 102),
            ("orders".into(), 1, 102)
        ]
    );
    assert_eq!(d.open(), 0, "taken");
    assert_eq!(position(&d, &key("orders", 1, 100)), None, "a taken record is not found again");
}

#[test]
fn a_new_fetch_replaces_the_old_one_its_flags_and_its_index() {
    let (mut d, _) = holding_a_poll();
    assert_eq!(position(&d, &key("orders", 1, 102)), Some(5), "off the cursor: builds the index");
    for i in 0..7 {
        d.mark(i, ACCEPT);
    }
    assert_eq!(d.take_pending().count(), 7);
    // The same keys again, in another order: a redelivery in the next fetch.
    let mut again = poll();
    again.reverse();
    d.replace(again, 1, std::time::Instant::now());
    assert_eq!(d.hand_out(7).len(), 7);
    assert_eq!(d.open(), 7, "a new fetch's records are all unsettled");
    assert_eq!(position(&d, &key("payments", 0, 100)), Some(0), "at the cursor");
    assert_eq!(position(&d, &key("orders", 1, 102)), Some(1), "through a new index, not the old fetch's (5)");
    assert_eq!(position(&d, &key("orders", 0, 100)), Some(6), "not settled in this fetch");
}

#[test]
fn the_cursor_resting_on_a_settled_record_does_not_find_it() {
    let (mut d, keys) = holding_a_poll();
    // Settle 4, then 3: the cursor comes to rest on 4, which is settled.
    d.mark(position(&d, &keys[4]).expect("4"), ACCEPT);
    d.mark(position(&d, &keys[3]).expect("3"), ACCEPT);
    assert_eq!(d.cursor, 4);
    assert_eq!(position(&d, &keys[4]), None, "settled, though at the cursor");
    assert_eq!(position(&d, &keys[5]), Some(5));
    assert_eq!(d.open(), 5);
}

#[test]
fn a_fetch_larger_than_a_poll_is_handed_out_in_order_over_several_polls() {
    let mut d = Delivered::default();
    let records = poll();
    let keys: Vec<Key> = records.iter().map(|r| key(&r.topic, r.partition, r.offset)).collect();
    d.replace(records, 1, std::time::Instant::now());
    let mut handed = Vec::new();
    for (want, settle) in [(3, Settle::Accept), (3, Settle::Release), (1, Settle::Reject)] {
        let out = d.hand_out(3);
        assert_eq!(out.len(), want);
        let first = handed.len();
        if let Some(next) = keys.get(first + want) {
            assert_eq!(position(&d, next), None, "{next:?} is not handed out yet");
        }
        for r in &out {
            let i = d.position(&r.topic, r.partition, r.offset).expect("a record handed out is found");
            d.mark(i, Held::Pending(settle));
            handed.push((r.partition, r.offset, settle));
        }
        assert_eq!(d.open(), 0);
        if d.surplus() == 0 {
            break;
        }
    }
    assert!(d.hand_out(3).is_empty(), "the fetch is all handed out");
    let passed: Vec<(i32, i64, Settle)> = d.take_pending().map(|(r, s)| (r.partition, r.offset, s)).collect();
    assert_eq!(passed, handed, "every acknowledgement of the fetch, kept until it was all handed out");
}

#[test]
fn a_fetch_taken_out_gives_back_what_was_never_handed_out() {
    let mut d = Delivered::default();
    let records = poll();
    d.replace(records, 1, std::time::Instant::now());
    let out = d.hand_out(2);
    assert_eq!(d.surplus(), 5);
    for r in &out {
        let i = d.position(&r.topic, r.partition, r.offset).expect("handed out");
        d.mark(i, ACCEPT);
    }
    let back = open_names(&mut d);
    assert_eq!(back.len(), 5, "the records not handed out");
    assert_eq!(back[0], ("orders".into(), 0, 101));
    assert_eq!(d.surplus(), 0, "nothing left to hand out");
    assert!(d.hand_out(10).is_empty());
    assert_eq!(d.open(), 0);
    for r in &out {
        assert!(d.position(&r.topic, r.partition, r.offset).is_none(), "{r:?} is taken out with the fetch");
    }
}
