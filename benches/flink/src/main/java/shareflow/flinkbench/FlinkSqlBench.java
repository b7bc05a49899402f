package shareflow.flinkbench;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.api.TableResult;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The Flink SQL side of scripts/flink-bench: a tumbling 10 s event-time window count per
 * key over the whole of the topic INPUT, written exactly once to OUTPUT, in a local
 * MiniCluster in this JVM, as a user runs a SQL job from the Table API.
 *
 * <ul>
 *   <li>The source reads INPUT from the earliest offsets to the offsets that were the
 *       latest when the job started (a bounded source, so the job ends); the key is the
 *       record key as a string, the event time the record timestamp, the watermark the
 *       event time less OUT_OF_ORDER_MS.
 *   <li>The sink writes key = the key, value = {@code WINDOW_START_MS,COUNT} in Kafka
 *       transactions (transactional ids prefixed NAME) that commit with each checkpoint.
 *   <li>Checkpoints are EXACTLY_ONCE every CHECKPOINT_MS; every operator runs PARALLELISM
 *       subtasks. At the end of input the source sends the final watermark, every window
 *       fires, and a last checkpoint commits the last transaction before the job ends.
 * </ul>
 *
 * The input ends with a sentinel record per partition (see {@link Main}): their
 * watermark closes every real window before the end of input does, and their own window
 * (key {@link Main#SENTINEL_KEY}) is emitted at the end of input; it is left out below.
 *
 * <p>It prints one JSON line at the end ({@code "event":"flink"}): the real records read
 * (the input's offsets less one sentinel per partition), the seconds from submitting the
 * INSERT to the job's end (wall_s, which includes the MiniCluster's start), records /
 * wall_s, Flink's own net run time, and the rows of OUTPUT a read_committed consumer
 * finds after the end with the sum of their counts (RECORDS when every record was
 * counted once), the sentinel key's rows apart. Exit status 1 if the job fails or has
 * not ended within an hour.
 */
final class FlinkSqlBench {
    private FlinkSqlBench() {}

    /** A job that runs longer than this fails the program. */
    static final long LIMIT_MS = 3_600_000;

    static void run(String[] args) throws Exception {
        Main.expect(args, 7);
        String bootstrap = args[0];
        String input = args[1];
        String output = args[2];
        String name = args[3];
        long checkpointMs = Main.number("CHECKPOINT_MS", args[4]);
        long parallelism = Main.number("PARALLELISM", args[5]);
        long outOfOrderMs = Main.number("OUT_OF_ORDER_MS", args[6]);
        if (checkpointMs < 10 || parallelism < 1) {
            Main.usage("CHECKPOINT_MS must be at least 10 and PARALLELISM at least 1");
        }
        // A SECOND interval literal has two digits of seconds at most.
        if (outOfOrderMs >= 100_000) {
            Main.usage("OUT_OF_ORDER_MS must be under 100000, got " + outOfOrderMs);
        }
        long records = inputRecords(bootstrap, input);

        Map<String, String> settings = new HashMap<>();
        settings.put("execution.runtime-mode", "streaming");
        settings.put("parallelism.default", Long.toString(parallelism));
        settings.put("execution.checkpointing.interval", checkpointMs + " ms");
        settings.put("execution.checkpointing.mode", "EXACTLY_ONCE");
        // Window starts are computed as times of day in UTC (see the INSERT).
        settings.put("table.local-time-zone", "UTC");
        TableEnvironment sql = TableEnvironment.create(EnvironmentSettings.newInstance().inStreamingMode()
                .withConfiguration(Configuration.fromMap(settings)).build());

        String interval = String.format(Locale.ROOT, "%d.%03d", outOfOrderMs / 1000, outOfOrderMs % 1000);
        sql.executeSql("CREATE TABLE input (\n"
                + "  k STRING,\n"
                + "  v BYTES,\n"
                + "  ts TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL,\n"
                + "  WATERMARK FOR ts AS ts - INTERVAL '" + interval + "' SECOND\n"
                + ") WITH (\n"
                + "  'connector' = 'kafka',\n"
                + "  'topic' = '" + input + "',\n"
                + "  'properties.bootstrap.servers' = '" + bootstrap + "',\n"
                + "  'properties.group.id' = '" + name + "',\n"
                + "  'scan.startup.mode' = 'earliest-offset',\n"
                + "  'scan.bounded.mode' = 'latest-offset',\n"
                + "  'key.format' = 'raw',\n"
                + "  'key.fields' = 'k',\n"
                + "  'value.format' = 'raw',\n"
                + "  'value.fields-include' = 'EXCEPT_KEY'\n"
                + ")");
        // The broker's transaction.max.timeout.ms (scripts/kafka: 15 min) is below the
        // sink's default transaction timeout (1 h), which the broker would refuse.
        sql.executeSql("CREATE TABLE output (\n"
                + "  k STRING,\n"
                + "  v STRING\n"
                + ") WITH (\n"
                + "  'connector' = 'kafka',\n"
                + "  'topic' = '" + output + "',\n"
                + "  'properties.bootstrap.servers' = '" + bootstrap + "',\n"
                + "  'properties.transaction.timeout.ms' = '600000',\n"
                + "  'key.format' = 'raw',\n"
                + "  'key.fields' = 'k',\n"
                + "  'value.format' = 'raw',\n"
                + "  'value.fields-include' = 'EXCEPT_KEY',\n"
                + "  'sink.delivery-guarantee' = 'exactly-once',\n"
                + "  'sink.transactional-id-prefix' = '" + name + "'\n"
                + ")");
        // window_start is a TIMESTAMP(3) in the session's zone (UTC): its seconds since
        // the epoch times 1000 are its epoch milliseconds, windows being whole seconds.
        String insert = "INSERT INTO output\n"
                + "SELECT k, CONCAT(\n"
                + "    CAST(CAST(TIMESTAMPDIFF(SECOND, TIMESTAMP '1970-01-01 00:00:00', window_start) AS BIGINT)"
                + " * 1000 AS STRING),\n"
                + "    ',', CAST(COUNT(*) AS STRING))\n"
                + "FROM TABLE(TUMBLE(TABLE input, DESCRIPTOR(ts), INTERVAL '10' SECOND))\n"
                + "GROUP BY k, window_start, window_end";

        long submitted = System.nanoTime();
        TableResult result = sql.executeSql(insert);
        long running = System.nanoTime();
        JobClient job = result.getJobClient().orElseThrow();
        JobExecutionResult done;
        try {
            done = job.getJobExecutionResult().get(LIMIT_MS, TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.TimeoutException e) {
            System.err.println("flink-bench: the job did not end within " + LIMIT_MS / 1000 + " s");
            job.cancel();
            System.exit(1);
            return;
        } catch (java.util.concurrent.ExecutionException e) {
            System.err.println("flink-bench: the job failed");
            e.printStackTrace();
            System.exit(1);
            return;
        }
        long ended = System.nanoTime();
        double wall = (ended - submitted) / 1e9;
        long[] rows = outputRows(bootstrap, output);
        System.out.printf(Locale.ROOT, "{\"event\":\"flink\",\"job_id\":\"%s\",\"records\":%d,\"submit_s\":%.3f,"
                + "\"wall_s\":%.3f,\"rate\":%d,\"net_runtime_s\":%.3f,\"output_rows\":%d,\"sum_counts\":%d,"
                + "\"sentinel_rows\":%d,\"parallelism\":%d,\"checkpoint_ms\":%d,\"out_of_order_ms\":%d}%n",
                job.getJobID(), records, (running - submitted) / 1e9, wall, Math.round(records / wall),
                done.getNetRuntime(TimeUnit.MILLISECONDS) / 1000.0, rows[0], rows[1], rows[2], parallelism,
                checkpointMs, outOfOrderMs);
        System.out.flush();
        // The MiniCluster's threads need not stop the JVM from ending.
        System.exit(0);
    }

    static KafkaConsumer<byte[], byte[]> consumer(String bootstrap) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return new KafkaConsumer<>(props);
    }

    static List<TopicPartition> partitions(KafkaConsumer<?, ?> consumer, String topic) {
        List<TopicPartition> out = new ArrayList<>();
        List<PartitionInfo> infos = consumer.partitionsFor(topic, Duration.ofSeconds(30));
        if (infos == null || infos.isEmpty()) {
            System.err.println("flink-bench: topic " + topic + " does not exist");
            System.exit(1);
        }
        for (PartitionInfo info : infos) {
            out.add(new TopicPartition(topic, info.partition()));
        }
        return out;
    }

    /** The real records of TOPIC: the sum over its partitions of end less beginning
     * offsets (the input is written without transactions, so every offset is a record),
     * less the one sentinel per partition that {@link Produce} writes last. */
    static long inputRecords(String bootstrap, String topic) {
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap)) {
            List<TopicPartition> partitions = partitions(consumer, topic);
            Map<TopicPartition, Long> begin = consumer.beginningOffsets(partitions, Duration.ofSeconds(30));
            Map<TopicPartition, Long> end = consumer.endOffsets(partitions, Duration.ofSeconds(30));
            long records = 0;
            for (TopicPartition p : partitions) {
                records += end.get(p) - begin.get(p) - 1;
            }
            return records;
        }
    }

    /** The committed rows of TOPIC but the sentinel key's, the sum of their counts, and
     * the sentinel key's rows, read up to the last stable offsets as they are now. */
    static long[] outputRows(String bootstrap, String topic) {
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap)) {
            List<TopicPartition> partitions = partitions(consumer, topic);
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            Map<TopicPartition, Long> end = consumer.endOffsets(partitions, Duration.ofSeconds(30));
            long rows = 0;
            long sum = 0;
            long sentinels = 0;
            long deadline = System.currentTimeMillis() + 120_000;
            while (!caughtUp(consumer, end)) {
                if (System.currentTimeMillis() > deadline) {
                    System.err.println("flink-bench: could not read " + topic + " to its end within 120 s");
                    System.exit(1);
                }
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
                    if (record.key() != null
                            && Main.SENTINEL_KEY.equals(new String(record.key(), StandardCharsets.UTF_8))) {
                        sentinels++;
                        continue;
                    }
                    rows++;
                    String value = new String(record.value(), StandardCharsets.UTF_8);
                    sum += Long.parseLong(value.substring(value.indexOf(',') + 1));
                }
            }
            return new long[] {rows, sum, sentinels};
        }
    }

    static boolean caughtUp(KafkaConsumer<?, ?> consumer, Map<TopicPartition, Long> end) {
        for (Map.Entry<TopicPartition, Long> e : end.entrySet()) {
            if (consumer.position(e.getKey()) < e.getValue()) {
                return false;
            }
        }
        return true;
    }
}
