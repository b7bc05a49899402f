package shareflow.bench;

import java.util.Arrays;

/**
 * The Java side of scripts/streams-bench: one jar, three programs.
 *
 * <pre>
 *   produce BOOTSTRAP TOPIC RECORDS VALUE_BYTES BATCH_BYTES   the bench's input
 *   streams BOOTSTRAP APP_ID INPUT OUTPUT COMMIT_MS THREADS   the Kafka Streams reference
 *   count   BOOTSTRAP TOPIC RECORDS GRACE_MS TIMEOUT_MS [JMX_PORT]   the read_committed counter
 * </pre>
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
            case "streams" -> Uppercase.run(rest);
            case "count" -> Count.run(rest);
            default -> usage("unknown program " + args[0]);
        }
    }

    static void usage(String why) {
        System.err.println("streams-bench: " + why + "\nusage:\n"
                + "  produce BOOTSTRAP TOPIC RECORDS VALUE_BYTES BATCH_BYTES\n"
                + "  streams BOOTSTRAP APP_ID INPUT OUTPUT COMMIT_MS THREADS\n"
                + "  count BOOTSTRAP TOPIC RECORDS GRACE_MS TIMEOUT_MS [JMX_PORT]");
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

    static void expect(String[] args, int min, int max) {
        if (args.length < min || args.length > max) {
            usage("expected " + min + (max > min ? "-" + max : "") + " arguments, got " + args.length);
        }
    }
}
