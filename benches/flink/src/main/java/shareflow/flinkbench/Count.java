package shareflow.flinkbench;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The read_committed counter of window rows every system is measured by. It reads all
 * partitions of TOPIC from the beginning, without a group; each row is keyed by the
 * input's key, its value is {@code WINDOW_START_MS,COUNT}. It knows the answer: the
 * input that {@link Produce} writes from RECORDS, KEYS, BASE_MS and SPAN_MS has one
 * (key, window start) pair per key and 10 s window its records fall in, and each pair's
 * count. Rows of {@link Main#SENTINEL_KEY} (the input's end markers' own window, which a
 * system may or may not emit) are counted apart and checked no further. It prints, as
 * JSON lines:
 *
 * <ul>
 *   <li>{@code ready}: reading, with the number of expected pairs;
 *   <li>{@code complete}: when every expected pair has arrived, with the wall-clock
 *       times (ms) of the first row and of the moments 10 %, 90 % and 100 % of the pairs
 *       had arrived;
 *   <li>{@code stalled}: instead of {@code complete}, when rows came but none for
 *       IDLE_MS before every pair did, with the same times over the pairs that did arrive
 *       and the number of them;
 *   <li>{@code final}: after GRACE_MS more of reading, every check: rows read, sentinel
 *       rows, distinct expected pairs, pairs read twice (duplicates), rows of a pair the
 *       input does not have (unexpected), rows whose count is not their pair's
 *       (wrong_counts), values that are not two numbers (malformed), and the sum of the
 *       counts of the other rows, which is RECORDS when every record was counted once;
 *       with up to five examples of unexpected pairs and wrong counts.
 * </ul>
 *
 * Exit status 0 when every pair came once with its count and nothing else came but
 * sentinel rows; 3 when a check failed; 4 when no row came within TIMEOUT_MS, or not
 * every pair came and rows never stalled; 5 after {@code stalled}; 6 when the topic's
 * partitions could not be learned within two minutes. TIMEOUT_MS counts from
 * {@code ready}.
 */
final class Count {
    /** How long the counter waits to learn the topic's partitions before it gives up (status 6). */
    private static final long METADATA_WAIT_MS = 120_000;

    private Count() {}

    /** The window the query groups by, 10 s, as Flink's and shareflow's SQL say. */
    static final long WINDOW_MS = 10_000;

    /** The input's (key, window start) pairs, "KEY,START", and each one's record count:
     * record i has key {@link Main#key}(i, KEYS) and timestamp BASE_MS + i * SPAN_MS /
     * RECORDS, as {@link Produce} writes it. */
    static Map<String, Long> expected(long records, long keys, long base, long span) {
        Map<String, Long> pairs = new HashMap<>();
        for (long id = 0; id < records; id++) {
            long timestamp = base + id * span / records;
            long start = Math.floorDiv(timestamp, WINDOW_MS) * WINDOW_MS;
            pairs.merge(Main.key(id, keys) + "," + start, 1L, Long::sum);
        }
        return pairs;
    }

    static void run(String[] args) throws Exception {
        Main.expect(args, 9);
        String bootstrap = args[0];
        String topic = args[1];
        long records = Main.number("RECORDS", args[2]);
        long keys = Main.number("KEYS", args[3]);
        long base = Main.number("BASE_MS", args[4]);
        long span = Main.number("SPAN_MS", args[5]);
        long grace = Main.number("GRACE_MS", args[6]);
        long timeout = Main.number("TIMEOUT_MS", args[7]);
        long idle = Main.number("IDLE_MS", args[8]);
        if (records == 0 || keys == 0) {
            Main.usage("RECORDS and KEYS must be positive");
        }
        Map<String, Long> expected = expected(records, keys, base, span);
        long pairs = expected.size();
        long tenth = (long) Math.ceil(pairs * 0.1);
        long ninetieth = (long) Math.ceil(pairs * 0.9);

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        // Learning the topic's partitions has a bound of its own: on a loaded machine a cold
        // consumer took longer than a short TIMEOUT_MS to get them, and that is no verdict
        // on the records.
        long metadataDeadline = System.currentTimeMillis() + METADATA_WAIT_MS;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> partitions = new ArrayList<>();
            while (partitions.isEmpty()) {
                // A cold consumer on a loaded machine may need more than the 5 s to learn
                // the metadata: that is "not yet", not a failure (it exited 1 before).
                List<PartitionInfo> infos;
                try {
                    infos = consumer.partitionsFor(topic, Duration.ofSeconds(5));
                } catch (org.apache.kafka.common.errors.TimeoutException e) {
                    infos = null;
                }
                if (infos != null) {
                    for (PartitionInfo info : infos) {
                        partitions.add(new TopicPartition(topic, info.partition()));
                    }
                }
                if (partitions.isEmpty()) {
                    if (System.currentTimeMillis() > metadataDeadline) {
                        System.err.println("flink-bench count: no partitions of topic " + topic + " within "
                                + METADATA_WAIT_MS / 1000 + " s: create it first, and check the broker answers");
                        System.exit(6);
                    }
                    Thread.sleep(100);
                }
            }
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            for (TopicPartition p : partitions) {
                consumer.position(p);
            }
            long deadline = System.currentTimeMillis() + timeout;
            System.out.printf("{\"event\":\"ready\",\"unix_ms\":%d,\"partitions\":%d,\"pairs\":%d}%n",
                    System.currentTimeMillis(), partitions.size(), pairs);
            System.out.flush();

            Set<String> seen = new HashSet<>();
            long read = 0;
            long sentinels = 0;
            long duplicates = 0;
            long unexpected = 0;
            long wrongCounts = 0;
            long malformed = 0;
            List<String> examples = new ArrayList<>();
            long sum = 0;
            long first = 0;
            long atTenth = 0;
            long atNinetieth = 0;
            long last = 0;
            long latest = 0;
            boolean stalled = false;
            long graceEnd = Long.MAX_VALUE;
            while (System.currentTimeMillis() < graceEnd) {
                long now = System.currentTimeMillis();
                if (last == 0 && first != 0 && idle > 0 && now - latest > idle) {
                    stalled = true;
                    last = latest;
                    graceEnd = now;
                    System.out.printf("{\"event\":\"stalled\",\"unix_ms\":%d,\"first_ms\":%d,\"p10_ms\":%d,"
                            + "\"p90_ms\":%d,\"last_ms\":%d,\"distinct\":%d,\"pairs\":%d}%n",
                            now, first, atTenth, atNinetieth, latest, seen.size(), pairs);
                    System.out.flush();
                    break;
                }
                if (last == 0 && now > deadline) {
                    System.out.printf("{\"event\":\"timeout\",\"rows\":%d,\"distinct\":%d,\"pairs\":%d}%n",
                            read, seen.size(), pairs);
                    System.exit(4);
                }
                ConsumerRecords<byte[], byte[]> batch = consumer.poll(Duration.ofMillis(100));
                now = System.currentTimeMillis();
                for (ConsumerRecord<byte[], byte[]> record : batch) {
                    read++;
                    String key = record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8);
                    if (key.equals(Main.SENTINEL_KEY)) {
                        // Not the query's answer, and no measure of it: its times do not count.
                        sentinels++;
                        continue;
                    }
                    latest = now;
                    if (first == 0) {
                        first = now;
                    }
                    String value = record.value() == null ? "" : new String(record.value(), StandardCharsets.UTF_8);
                    int comma = value.indexOf(',');
                    long start;
                    long count;
                    try {
                        start = Long.parseLong(value.substring(0, Math.max(comma, 0)));
                        count = Long.parseLong(value.substring(comma + 1));
                    } catch (NumberFormatException e) {
                        malformed++;
                        continue;
                    }
                    sum += count;
                    String pair = key + "," + start;
                    Long want = expected.get(pair);
                    if (want == null) {
                        unexpected++;
                        if (examples.size() < 5) {
                            examples.add("\"" + pair + " counted " + count + ", not in the input\"");
                        }
                        continue;
                    }
                    if (!seen.add(pair)) {
                        duplicates++;
                        continue;
                    }
                    if (count != want) {
                        wrongCounts++;
                        if (examples.size() < 5) {
                            examples.add("\"" + pair + " counted " + count + ", input has " + want + "\"");
                        }
                    }
                    long distinct = seen.size();
                    if (distinct == tenth) {
                        atTenth = now;
                    }
                    if (distinct == ninetieth) {
                        atNinetieth = now;
                    }
                    if (distinct == pairs) {
                        last = now;
                        graceEnd = now + grace;
                        System.out.printf("{\"event\":\"complete\",\"unix_ms\":%d,\"first_ms\":%d,\"p10_ms\":%d,"
                                + "\"p90_ms\":%d,\"last_ms\":%d,\"pairs\":%d}%n",
                                System.currentTimeMillis(), first, atTenth, atNinetieth, last, pairs);
                        System.out.flush();
                    }
                }
            }
            boolean ok = !stalled && duplicates == 0 && unexpected == 0 && wrongCounts == 0 && malformed == 0
                    && seen.size() == pairs && sum == records;
            System.out.printf("{\"event\":\"final\",\"rows\":%d,\"sentinel_rows\":%d,\"distinct\":%d,"
                    + "\"duplicates\":%d,\"unexpected\":%d,\"wrong_counts\":%d,\"malformed\":%d,"
                    + "\"sum_counts\":%d,\"records\":%d,\"ok\":%b,\"examples\":[%s]}%n",
                    read - sentinels, sentinels, seen.size(), duplicates, unexpected, wrongCounts, malformed, sum,
                    records, ok, String.join(",", examples));
            System.out.flush();
            if (stalled) {
                System.exit(5);
            }
            if (!ok) {
                System.exit(3);
            }
        }
    }
}
