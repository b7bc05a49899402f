package shareflow.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The read_committed counter every system is measured by. It reads all partitions of
 * TOPIC from the beginning, without a group, and tells each record by its key (the id
 * that `produce` wrote). It prints, as JSON lines:
 *
 * <ul>
 *   <li>{@code ready}: reading, with the broker's request counters at that moment;
 *   <li>{@code complete}: when every id 0..RECORDS-1 has arrived, with the wall-clock
 *       times (ms) of the first record and of the moments 10 %, 90 % and 100 % of the ids
 *       had arrived, and the broker's request counters again;
 *   <li>{@code final}: after GRACE_MS more of reading, every check: records read, ids
 *       read twice (duplicates), keys that are no id of the run, values not upper-cased.
 * </ul>
 *
 * Exit status 0 when every id came once, upper-cased; 3 when a check failed; 4 when not
 * every id came within TIMEOUT_MS of {@code ready}; 6 when the topic's partitions could
 * not be learned within two minutes. With JMX_PORT, the request counters come from the
 * broker's JMX on 127.0.0.1 (requests and their local time by API).
 */
final class Count {
    /** How long the counter waits to learn the topic's partitions before it gives up (status 6). */
    private static final long METADATA_WAIT_MS = 120_000;

    private Count() {}

    static void run(String[] args) throws Exception {
        Main.expect(args, 5, 6);
        String bootstrap = args[0];
        String topic = args[1];
        long expectedLong = Main.number("RECORDS", args[2]);
        long grace = Main.number("GRACE_MS", args[3]);
        long timeout = Main.number("TIMEOUT_MS", args[4]);
        Integer jmxPort = args.length == 6 ? (int) Main.number("JMX_PORT", args[5]) : null;
        if (expectedLong == 0 || expectedLong > Integer.MAX_VALUE) {
            Main.usage("RECORDS must be between 1 and " + Integer.MAX_VALUE + ", got " + expectedLong);
        }
        int expected = (int) expectedLong;
        int tenth = (int) Math.ceil(expected * 0.1);
        int ninetieth = (int) Math.ceil(expected * 0.9);

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
        try (Jmx jmx = jmxPort == null ? null : Jmx.connect(jmxPort);
                KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
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
                        System.err.println("streams-bench count: no partitions of topic " + topic + " within "
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
            System.out.printf("{\"event\":\"ready\",\"unix_ms\":%d,\"partitions\":%d,\"requests\":%s}%n",
                    System.currentTimeMillis(), partitions.size(), Jmx.json(jmx));
            System.out.flush();

            BitSet seen = new BitSet(expected);
            int distinct = 0;
            long read = 0;
            long duplicates = 0;
            long unknown = 0;
            long notUpper = 0;
            long first = 0;
            long atTenth = 0;
            long atNinetieth = 0;
            long last = 0;
            long graceEnd = Long.MAX_VALUE;
            while (System.currentTimeMillis() < graceEnd) {
                if (last == 0 && System.currentTimeMillis() > deadline) {
                    System.out.printf("{\"event\":\"timeout\",\"records\":%d,\"distinct\":%d,\"expected\":%d}%n",
                            read, distinct, expected);
                    System.exit(4);
                }
                ConsumerRecords<byte[], byte[]> batch = consumer.poll(Duration.ofMillis(100));
                long now = System.currentTimeMillis();
                for (ConsumerRecord<byte[], byte[]> record : batch) {
                    read++;
                    if (first == 0) {
                        first = now;
                    }
                    if (!upperCased(record.value())) {
                        notUpper++;
                    }
                    int id = id(record.key());
                    if (id < 0 || id >= expected) {
                        unknown++;
                        continue;
                    }
                    if (seen.get(id)) {
                        duplicates++;
                        continue;
                    }
                    seen.set(id);
                    distinct++;
                    if (distinct == tenth) {
                        atTenth = now;
                    }
                    if (distinct == ninetieth) {
                        atNinetieth = now;
                    }
                    if (distinct == expected) {
                        last = now;
                        graceEnd = now + grace;
                        System.out.printf("{\"event\":\"complete\",\"unix_ms\":%d,\"first_ms\":%d,\"p10_ms\":%d,"
                                + "\"p90_ms\":%d,\"last_ms\":%d,\"records\":%d,\"requests\":%s}%n",
                                System.currentTimeMillis(), first, atTenth, atNinetieth, last, expected,
                                Jmx.json(jmx));
                        System.out.flush();
                    }
                }
            }
            boolean ok = duplicates == 0 && unknown == 0 && notUpper == 0;
            System.out.printf("{\"event\":\"final\",\"read\":%d,\"distinct\":%d,\"duplicates\":%d,\"unknown\":%d,"
                    + "\"not_upper_cased\":%d,\"ok\":%b}%n", read, distinct, duplicates, unknown, notUpper, ok);
            System.out.flush();
            if (!ok) {
                System.exit(3);
            }
        }
    }

    /** The key's eight decimal digits, or -1. */
    static int id(byte[] key) {
        if (key == null || key.length == 0 || key.length > 9) {
            return -1;
        }
        int id = 0;
        for (byte b : key) {
            if (b < '0' || b > '9') {
                return -1;
            }
            id = id * 10 + (b - '0');
        }
        return id;
    }

    static boolean upperCased(byte[] value) {
        if (value == null) {
            return false;
        }
        for (byte b : value) {
            if (b >= 'a' && b <= 'z') {
                return false;
            }
        }
        return true;
    }

    /** The broker's request metrics over JMX. */
    static final class Jmx implements AutoCloseable {
        private final JMXConnector connector;
        private final MBeanServerConnection server;

        private Jmx(JMXConnector connector) throws Exception {
            this.connector = connector;
            this.server = connector.getMBeanServerConnection();
        }

        static Jmx connect(int port) throws Exception {
            JMXServiceURL url = new JMXServiceURL("service:jmx:rmi:///jndi/rmi://127.0.0.1:" + port + "/jmxrmi");
            try {
                return new Jmx(JMXConnectorFactory.connect(url));
            } catch (java.io.IOException e) {
                System.err.println("streams-bench count: cannot reach the broker's JMX on 127.0.0.1:" + port
                        + " (" + e.getMessage() + "); open it with jcmd PID ManagementAgent.start");
                System.exit(2);
                return null;
            }
        }

        /** {"API": [requests, local ms], ...}, summed over versions; "{}" without JMX. */
        static String json(Jmx jmx) throws Exception {
            if (jmx == null) {
                return "{}";
            }
            Map<String, double[]> byApi = new TreeMap<>();
            for (ObjectName name : jmx.server.queryNames(
                    new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,request=*,version=*"), null)) {
                String api = name.getKeyProperty("request");
                if (api.equals("FetchConsumer") || api.equals("FetchFollower")) {
                    continue;
                }
                long n = ((Number) jmx.server.getAttribute(name, "Count")).longValue();
                byApi.computeIfAbsent(api, k -> new double[2])[0] += n;
            }
            for (ObjectName name : jmx.server.queryNames(
                    new ObjectName("kafka.network:type=RequestMetrics,name=LocalTimeMs,request=*"), null)) {
                String api = name.getKeyProperty("request");
                if (!byApi.containsKey(api)) {
                    continue;
                }
                long n = ((Number) jmx.server.getAttribute(name, "Count")).longValue();
                double mean = ((Number) jmx.server.getAttribute(name, "Mean")).doubleValue();
                byApi.get(api)[1] = n * mean;
            }
            StringBuilder out = new StringBuilder("{");
            for (Map.Entry<String, double[]> e : byApi.entrySet()) {
                if (out.length() > 1) {
                    out.append(',');
                }
                out.append(String.format(java.util.Locale.ROOT, "\"%s\":[%d,%.1f]", e.getKey(), (long) e.getValue()[0], e.getValue()[1]));
            }
            return out.append('}').toString();
        }

        @Override
        public void close() throws java.io.IOException {
            connector.close();
        }
    }
}
