//! Tests of `group.rs`.
use super::*;

fn queued(topic: &str, first: i64, last: i64) -> Queued {
    Queued {
        range: LedgerRange { topic: topic.into(), partition: 0, first, last },
        taken: BTreeSet::new(),
        parallelism: 0,
    }
}

fn intent(checkpoint_id: CheckpointId) -> LedgerEntry {
    LedgerEntry::Intent {
        by: Claimant::new("a", 1),
        checkpoint_id,
        subtask: 0,
        ranges: vec![LedgerRange { topic: "in".into(), partition: 0, first: 0, last: 0 }],
    }
}

fn summary(upto: i64) -> LedgerEntry {
    LedgerEntry::Summary(LedgerSummary { upto, ..LedgerSummary::default() })
}

/// Feeds `(offset, entry)` in order; what the reader yields, as
/// `Seed(upto)` / `Entry(offset)`.
fn read(entries: Vec<(i64, LedgerEntry)>) -> (Vec<String>, Option<i64>) {
    let mut reader = IntentsReader::default();
    let mut out = Vec::new();
    for (o, e) in entries {
        for ev in reader.feed(o, e) {
            out.push(match ev {
                ReadEvent::Seed(s) => format!("seed {}", s.upto),
                ReadEvent::Entry(o, _) => format!("entry {o}"),
            });
        }
    }
    (out, reader.waiting())
}

#[test]
fn a_reader_from_offset_zero_applies_everything_and_skips_summaries() {
    let (out, waiting) = read(vec![(0, intent(1)), (1, summary(1)), (2, intent(2))]);
    assert_eq!(out, vec!["entry 0", "entry 2"]);
    assert_eq!(waiting, None);
}

#[test]
fn a_reader_of_a_trimmed_topic_starts_from_the_summary_of_what_is_gone() {
    // Trimmed below 50: the summary (upto 50) was written at 53, after intents
    // 50..=52 (written while it was made). A stale summary (upto 10) is ignored.
    let (out, waiting) = read(vec![
        (50, intent(5)),
        (51, summary(10)),
        (52, intent(6)),
        (53, summary(50)),
        (54, intent(7)),
        (55, summary(54)),
    ]);
    assert_eq!(out, vec!["seed 50", "entry 50", "entry 52", "entry 54"]);
    assert_eq!(waiting, None);
    // A summary above the start also seeds, and what it describes is not applied again.
    let (out, _) = read(vec![(50, intent(5)), (51, intent(6)), (52, summary(51))]);
    assert_eq!(out, vec!["seed 51", "entry 51"]);
}

#[test]
fn a_reader_trimmed_past_while_reading_waits_again_and_without_a_summary_says_so() {
    let (out, waiting) = read(vec![(0, intent(1)), (1, intent(2)), (9, intent(3)), (10, summary(9)), (11, intent(4))]);
    assert_eq!(out, vec!["entry 0", "entry 1", "seed 9", "entry 9", "entry 11"]);
    assert_eq!(waiting, None);
    let (out, waiting) = read(vec![(7, intent(1)), (8, intent(2))]);
    assert!(out.is_empty());
    assert_eq!(waiting, Some(7));
    assert!(unsummarised("g-intents", 7).to_string().contains("starts at offset 7"));
}

#[test]
fn a_catch_up_reads_on_past_a_trim_and_names_a_start_no_summary_explains() {
    // (summary waited for since, end read to, end now) -> what to do
    let table = [
        (None, 100, 100, CatchUp::Done),
        (None, 100, 140, CatchUp::Done),
        // Trimmed by another instance after the end was measured: its summary came
        // before the trim, below the end now.
        (Some(315), 321, 323, CatchUp::ReadTo(323)),
        // Read to the end, nothing new, still no summary: deleted by hand.
        (Some(315), 321, 321, CatchUp::Unsummarised(315)),
        (Some(7), 0, 0, CatchUp::Unsummarised(7)),
    ];
    for (waiting, read_to, now, want) in table {
        assert_eq!(after_catch_up(waiting, read_to, now), want, "{waiting:?} {read_to} {now}");
    }
}

#[test]
fn every_subtask_takes_its_piece_once_and_the_queue_empties() {
    let topics = vec!["in".to_string()];
    let mut queue = vec![queued("in", 0, 999), queued("in", 5_000, 5_000), queued("other", 0, 9)];
    let a = take_pieces(&mut queue, 1, 2, &topics);
    // Taking again returns nothing new.
    assert!(take_pieces(&mut queue, 1, 2, &topics).is_empty());
    // What is left is exactly what subtask 0 will take, and the other topic's range.
    let left = pieces_left(&queue);
    let b = take_pieces(&mut queue, 0, 2, &topics);
    let mut expected_left = b.clone();
    expected_left.push(LedgerRange { topic: "other".into(), partition: 0, first: 0, last: 9 });
    expected_left.sort_by_key(|r| (r.topic.clone(), r.first));
    assert_eq!(left, expected_left);
    // Both together cover the two ranges of "in" exactly, half of the long one each.
    let mut all: Vec<(i64, i64)> = a.iter().chain(&b).map(|r| (r.first, r.last)).collect();
    all.sort();
    assert_eq!(all, vec![(0, 499), (500, 999), (5_000, 5_000)]);
    // Only the range of a topic nobody took is left.
    assert_eq!(queue.len(), 1);
    assert_eq!(pieces_left(&queue), vec![LedgerRange { topic: "other".into(), partition: 0, first: 0, last: 9 }]);
}
