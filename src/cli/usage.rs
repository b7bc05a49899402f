//! The usage text: what `shareflow help` prints, and what follows every error of a
//! command line that does not parse ([`super::args::fail`]).

/// Every command and its options.
pub(crate) const USAGE: &str = "usage: shareflow <command> [options]

options of every command:
  --log-format text|json  how logs (SHAREFLOW_LOG=info, ...) are written to stderr: text
                       (default) or one JSON object per line

progress: on a terminal demo and run show a live bar; elsewhere (and under --json) a plain
line per second (SHAREFLOW_PROGRESS=plain forces lines)

commands:
  demo         run the exactly-once demo job on the embedded broker
    --records N          records to produce (default 1000000)
    --interval MS        checkpoint interval in ms (default 100)
    --crashes K          crashes to inject at random fault points (default 3, at most 8)
    --seed S             seed of the crash schedule (default 1)
    --crash-at POINT[:N] crash at the (N+1)-th hit of fault point POINT (N default 0); repeat
                         it for more crashes, all armed at once; replaces --crashes and --seed.
                         POINT: source.after_poll, source.after_lock, sink.after_write,
                         checkpoint.after_state_before_manifest, checkpoint.after_manifest,
                         commit.before, commit.mid, commit.after_broker_before_notify,
                         recovery.mid, recovery.after (a point the run does not reach does not fire)
    --dir PATH           broker and checkpoint directory, cleared first (default ./target/shareflow-demo)
    --resume             continue the run a stopped or killed demo left in --dir: produce only
                         what it had not produced, recover, run to the end, check the whole input
                         (SIGTERM or Ctrl-C stops a run gracefully: a final checkpoint, then the
                         summary says stopped; --resume finishes it)
    --checkpoints URL    checkpoint storage: file://..., memory://..., s3://... (default file://DIR/checkpoints)
    --partitions P       topic partitions (default 4)
    --parallelism P      job parallelism (default 2)
    --at-least-once      explicit acknowledgement instead of transactions
    --instances N        run N instances of the job in one share group, in this process: the
                         seeded crashes hit instances 2..N (which restart), instance 1 dies for
                         good and is adopted, one more instance joins late (default 1)
    --json               print the summary as one JSON object on the last line
    --metrics-addr HOST:PORT  serve Prometheus metrics at http://HOST:PORT/metrics while it
                         runs (port 0: any free one; the address is printed); one job only
  demo --kafka HOST:PORT   run the same job against a real Kafka 4.x broker (this and `run`
                         on Kafka need the kafka feature, on by default)
    --name NAME          group, topics NAME-input/NAME-output and job id (default: fresh)
    --records N          records to produce first; 0 resumes without producing (default 100000)
    --value-bytes B      bytes per record value (default 100)
    --interval MS        checkpoint interval (default 1000)
    --partitions P, --parallelism P, --checkpoints URL, --at-least-once, --json as above
    --crashes K --seed S crashes at K of the in-process fault points
    --crash-at POINT[:N] as above
    --no-verify          skip the read_committed check at the end (with --at-least-once the
                         check passes when nothing is lost: duplicates are allowed)
    --max-rate R         at most R records per second through the job
    --metrics-addr HOST:PORT  as above
  demo --kafka HOST:PORT --instances N
               run N `shareflow run` processes of the job in one share group, then check the
               output read_committed; --json adds per-instance counts and the adoptions
    --kills K            K SIGKILLs of random instances at seeded moments, each restarted; with
                         K >= 1 also: i1 is killed for good first (and adopted), a new instance
                         joins halfway, and one is paused with SIGSTOP past the adoption
                         timeout, then resumed (it must stop fenced) (default 0)
    --seed S             seed of the schedule (default: the clock; printed)
    --name, --records, --value-bytes, --partitions, --parallelism, --checkpoints as above
    --interval MS        checkpoint interval (default 500)
    --checkpoint-timeout MS, --adoption-timeout MS  as for run (defaults 3000, 5000)
    --max-rate R         at most R records per second through each instance
    --logs DIR           append each instance process's whole stderr to DIR/ID.log (set
                         SHAREFLOW_LOG for more than warnings)
  run JOB.toml [--instance ID] [--kafka HOST:PORT] [--checkpoints URL] [--metrics-addr A] [--json]
               run one instance of your own pipeline from a job file (source, SQL
               transforms, sink, checkpoints; examples/jobs/*.toml); the whole file is
               checked first, and each error names its line and key. With broker = \"DIR\"
               in the file (instead of kafka = ...) it runs on an embedded broker in DIR,
               no server needed, until SIGTERM or Ctrl-C
  produce --dir DIR --topic T [--partitions N]
               append each line of standard input as one record (its value) to topic T of
               the embedded broker in DIR (created with N partitions, default 4, if
               missing); the input of a job file with broker = \"DIR\"
  run --kafka HOST:PORT --group G --instance ID --checkpoints URL
               run one instance of the main job in share group G on a real Kafka 4.x broker,
               until SIGTERM or Ctrl-C (a final checkpoint, then it retires). Start more with
               other IDs and the same G and URL: exactly-once holds across them, and a live
               instance adopts one silent for longer than the adoption timeout
    --input T, --output T  topics (default G-input, G-output)
    --interval MS        checkpoint interval (default 1000)
    --checkpoint-timeout MS  how long a checkpoint may take (default 10000)
    --adoption-timeout MS  silence before adoption (default 30000; more than interval plus
                         checkpoint timeout); the instance beats every quarter of it, at
                         most every interval
    --parallelism P      subtasks per operator (default 2)
    --partitions P       partitions of topics this instance creates (default 4)
    --max-rate R         at most R records per second through this instance
    --metrics-addr HOST:PORT  serve this instance's Prometheus metrics (as for demo)
    --delete-ledger-on-retire  after SIGTERM or Ctrl-C retired it, delete its ledger topic
                         ({group}-{instance}-ledger; `instances gc` deletes it later otherwise)
    --json               print the summary as one JSON object on the last line
  txn list     list transactions: id, state, age, timeout; on the embedded broker also the
               acknowledgements staged and records produced, and with --checkpoints the
               checkpoint whose manifest decides each (read-only, safe next to a live job)
    --dir PATH           an embedded broker's directory (default ./target/shareflow-demo/broker)
    --kafka HOST:PORT    a Kafka broker instead (ids G-P-gN-sK: the slot pool, decision 0008;
                         every --kafka needs the kafka feature, on by default)
    --group G, --prefix P  only the transactions of share group G (and its instance P)
    --checkpoints URL    the checkpoint root of the group's instances (embedded broker)
    --json               one JSON array
  txn resolve --checkpoints URL --group G --prefix P
               decide what a stopped job left pending, as its restart would: commit what a
               complete checkpoint covers, abort the rest; refused while the job runs
    --dir PATH           the broker directory (default ./target/shareflow-demo/broker)
    --kafka HOST:PORT    a Kafka broker instead (the prefix's prepared transactions)
    --dry-run            print what it would do, change nothing (safe next to a live job)
    --json               one JSON array
  txn commit|abort ID --group G --checkpoints URL
               decide one transaction of a stopped job by hand (ID: G-P-N); refused when
               the job's checkpoints decided otherwise (a commit no complete checkpoint
               covers, an abort of one that one covers) unless --force, and while the job
               runs (embedded: its broker holds the directory; Kafka: its heartbeat moves)
    --dir PATH | --kafka HOST:PORT  the broker (default the demo's embedded directory)
    --force              act against the checkpoints (exactly-once does not hold then)
    --json               one JSON object
  checkpoints  list a job's checkpoints
    --checkpoints URL    storage (default file://$PWD/target/shareflow-demo/checkpoints)
    --job NAME           job id (default demo)
  checkpoints inspect N  one checkpoint: its manifest, the transactions it decides, its
               state files, each read back and checked (size, CRC-32C); --checkpoints,
               --job as above, --json
  instances    list the instances registered under a checkpoint root: incarnation, last
               heartbeat, and whether each is live, retired or adopted (and by whom)
    --checkpoints URL    the shared checkpoint root (default file://$PWD/target/shareflow-demo/checkpoints)
  instances gc --checkpoints URL --kafka HOST:PORT --group G [--apply]
               the ledger topics ({group}-{instance}-ledger) of instances that retired or
               whose adoption ended: lists what it would delete (the default), or deletes
               them with --apply; a live instance's ledger (or one being adopted) is kept
  dlq list --topic DLQ (--dir DIR | --kafka HOST:PORT)
               a job's dead letters: where each sits, its cause, the record it came from
               (KIP-1191 headers) and its error; --json: one JSON object per line
  dlq redrive --topic DLQ --to INPUT (--dir DIR | --kafka HOST:PORT)
               put dead letters back into INPUT after a fix, exactly once: a killed
               redrive started again with the same options redrives nothing twice
    --filter SQL         only rows where this holds (a WHERE over topic, partition,
                         offset, key, value, timestamp)
    --max-rate N         at most N records per second
    --checkpoints URL    the redrive's checkpoints (default DIR/redrive-checkpoints, or
                         file://$PWD/target/shareflow-redrive/checkpoints on Kafka)
  help         print this message";
