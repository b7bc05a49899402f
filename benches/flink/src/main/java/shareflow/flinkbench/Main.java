package shareflow.flinkbench;

import java.util.Arrays;

/**
 * The Java side of scripts/flink-bench: one class path, three programs.
 *
 * <pre>
 *   produce BOOTSTRAP TOPIC RECORDS KEYS BASE_MS SPAN_MS VALUE_BYTES BATCH_BYTES   the bench's input
 *   flink   BOOTSTRAP INPUT OUTPUT NAME CHECKPOINT_MS PARALLELISM OUT_OF_ORDER_MS  the Flink SQL job
 *   count   BOOTSTRAP TOPIC RECORDS KEYS BASE_MS SPAN_MS GRACE_MS TIMEOUT_MS IDLE_MS  the window-row counter
 * </pre>
 *
 * The input ends with one sentinel record per partition ({@link #SENTINEL_KEY}, its
 * timestamp {@link #SENTINEL_AFTER_MS} past the input's span): it moves every system's
 * watermark past the input's last window, so that a system that emits a window only when
 * its watermark passes (an unbounded source) closes every real window as a bounded one
 * does at its end. Rows of the sentinel key are not the query's answer: the counter and
 * FlinkSqlBench leave them out.
 *
 * Every program reports on stdout in JSON lines and logs on stderr; a bad argument is a
 * message on stderr and exit status 2.
 */
public final class Main {
    private Main() {}

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            usage("no program named");
        }
        String[] rest = Arrays.copyOfRange(args, 1, args.length);
        switch (args[0]) {
            case "produce" -> Produce.run(rest);
            case "flink" -> FlinkSqlBench.run(rest);
            case "count" -> Count.run(rest);
            default -> usage("unknown program " + args[0]);
        }
    }

    static void usage(String why) {
        System.err.println("flink-bench: " + why + "\nusage:\n"
                + "  produce BOOTSTRAP TOPIC RECORDS KEYS BASE_MS SPAN_MS VALUE_BYTES BATCH_BYTES\n"
                + "  flink BOOTSTRAP INPUT OUTPUT NAME CHECKPOINT_MS PARALLELISM OUT_OF_ORDER_MS\n"
                + "  count BOOTSTRAP TOPIC RECORDS KEYS BASE_MS SPAN_MS GRACE_MS TIMEOUT_MS IDLE_MS");
        System.exit(2);
    }

    static long number(String name, String text) {
        try {
            long n = Long.parseLong(text);
            if (n < 0) {
                usage(name + " must not be negative, got " + text);
            }
            return n;
        } catch (NumberFormatException e) {
            usage(name + " must be a whole number, got " + text);
            return 0;
        }
    }

    static void expect(String[] args, int count) {
        if (args.length != count) {
            usage("expected " + count + " arguments, got " + args.length);
        }
    }

    /** The sentinels' key: real keys are eight decimal digits, so it cannot be one. */
    static final String SENTINEL_KEY = "~end";

    /** How far past BASE_MS + SPAN_MS the sentinels' timestamp lies: more than a window
     * plus the largest out-of-orderness (99.999 s), and well under the broker's limit on
     * timestamps in the future (log.message.timestamp.after.max.ms, 1 h by default in
     * Kafka 4), the input's span ending about a minute before it is written. */
    static final long SENTINEL_AFTER_MS = 600_000;

    /** The key of record `id` among `keys` keys: its key number as eight decimal digits. */
    static String key(long id, long keys) {
        return String.format("%08d", id % keys);
    }
}
