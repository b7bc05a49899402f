package shareflow.flinkbench;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
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
 * input's key, its value is {@code WINDOW_START_MS,COUNT}. It tells rows by (key,
 * window start) and prints, as JSON lines:
 *
 * <ul>
 *   <li>{@code ready}: reading;
 *   <li>{@code complete}: when PAIRS distinct (key, window) pairs have arrived, with the
 *       wall-clock times (ms) of the first row and of the moments 10 %, 90 % and 100 % of
 *       the pairs had arrived;
 *   <li>{@code stalled}: instead of {@code complete}, when rows came but none for
 *       IDLE_MS before all PAIRS did (a system that emits a window only when later
 *       records move its watermark keeps its last windows until more input comes), with
 *       the same times over the pairs that did arrive;
 *   <li>{@code final}: after GRACE_MS more of reading, every check: rows read, distinct
 *       pairs, pairs read twice (duplicates), values that are not two numbers
 *       (malformed), and the sum of the counts, which is RECORDS when every record was
 *       counted once.
 * </ul>
 *
 * Exit status 0 when every pair came once and the counts add up to RECORDS; 3 when a
 * check failed; 4 when no row came within TIMEOUT_MS, or not every pair came and rows
 * never stalled; 5 after {@code stalled}.
 */
final class Count {
    private Count() {}

    static void run(String[] args) throws Exception {
        Main.expect(args, 7);
        String bootstrap = args[0];
        String topic = args[1];
        long pairs = Main.number("PAIRS", args[2]);
        long records = Main.number("RECORDS", args[3]);
        long grace = Main.number("GRACE_MS", args[4]);
        long timeout = Main.number("TIMEOUT_MS", args[5]);
        long idle = Main.number("IDLE_MS", args[6]);
        if (pairs == 0 || pairs > Integer.MAX_VALUE) {
            Main.usage("PAIRS must be between 1 and " + Integer.MAX_VALUE + ", got " + pairs);
        }
        long tenth = (long) Math.ceil(pairs * 0.1);
        long ninetieth = (long) Math.ceil(pairs * 0.9);

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        long deadline = System.currentTimeMillis() + timeout;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> partitions = new ArrayList<>();
            while (partitions.isEmpty()) {
                List<PartitionInfo> infos = consumer.partitionsFor(topic, Duration.ofSeconds(5));
                if (infos != null) {
                    for (PartitionInfo info : infos) {
                        partitions.add(new TopicPartition(topic, info.partition()));
                    }
                }
                if (partitions.isEmpty()) {
                    if (System.currentTimeMillis() > deadline) {
                        System.err.println("flink-bench count: topic " + topic + " does not exist; create it first");
                        System.exit(4);
                    }
                    Thread.sleep(100);
                }
            }
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            for (TopicPartition p : partitions) {
                consumer.position(p);
            }
            System.out.printf("{\"event\":\"ready\",\"unix_ms\":%d,\"partitions\":%d}%n",
                    System.currentTimeMillis(), partitions.size());
            System.out.flush();

            Set<String> seen = new HashSet<>();
            long read = 0;
            long duplicates = 0;
            long malformed = 0;
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
                    latest = now;
                    if (first == 0) {
                        first = now;
                    }
                    String key = record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8);
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
                    if (!seen.add(key + "," + start)) {
                        duplicates++;
                        continue;
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
            boolean ok = !stalled && duplicates == 0 && malformed == 0 && seen.size() == pairs && sum == records;
            System.out.printf("{\"event\":\"final\",\"rows\":%d,\"distinct\":%d,\"duplicates\":%d,\"malformed\":%d,"
                    + "\"sum_counts\":%d,\"records\":%d,\"ok\":%b}%n",
                    read, seen.size(), duplicates, malformed, sum, records, ok);
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
