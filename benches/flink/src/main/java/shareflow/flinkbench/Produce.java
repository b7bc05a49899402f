package shareflow.flinkbench;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Writes the bench's input, once, for every system: RECORDS records in key-interleaved
 * order, record i keyed by key number i % KEYS (eight decimal digits), with the record
 * timestamp BASE_MS + i * SPAN_MS / RECORDS, so that the records span SPAN_MS of event
 * time evenly and each key's timestamps rise. The value is VALUE_BYTES lowercase ASCII,
 * which no query reads. The default partitioner places a key on one partition, so each
 * partition's timestamps rise too: no record is late for any watermark. BATCH_BYTES is
 * the producer's batch.size (Kafka's default is 16384).
 *
 * <p>After the records (flushed first), it writes one sentinel record to each partition:
 * key {@link Main#SENTINEL_KEY}, timestamp BASE_MS + SPAN_MS + {@link
 * Main#SENTINEL_AFTER_MS}. Each partition's last record then moves the watermark (the
 * newest event time less the out-of-orderness) past the end of every real window, in
 * Flink and in shareflow alike; see {@link Main}.
 *
 * scripts/flink_bench.py computes the expected (key, window) pairs from the same formula;
 * the two must change together.
 */
final class Produce {
    private Produce() {}

    static void run(String[] args) throws Exception {
        Main.expect(args, 8);
        String bootstrap = args[0];
        String topic = args[1];
        long records = Main.number("RECORDS", args[2]);
        long keys = Main.number("KEYS", args[3]);
        long base = Main.number("BASE_MS", args[4]);
        long span = Main.number("SPAN_MS", args[5]);
        int valueBytes = (int) Main.number("VALUE_BYTES", args[6]);
        int batchBytes = (int) Main.number("BATCH_BYTES", args[7]);
        if (keys == 0 || keys > 99_999_999L) {
            Main.usage("KEYS must be between 1 and 99999999, got " + keys);
        }
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, Integer.toString(batchBytes));
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        long started = System.nanoTime();
        int sentinels;
        AtomicReference<Exception> failure = new AtomicReference<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (long id = 0; id < records; id++) {
                byte[] key = Main.key(id, keys).getBytes(StandardCharsets.US_ASCII);
                long timestamp = base + id * span / records;
                producer.send(new ProducerRecord<>(topic, null, timestamp, key, value(id, valueBytes)),
                        (metadata, e) -> {
                            if (e != null) {
                                failure.compareAndSet(null, e);
                            }
                        });
            }
            producer.flush();
            if (failure.get() != null) {
                throw new IllegalStateException("flink-bench produce: a record was not written", failure.get());
            }
            // After every record of its partition (flushed, and the producer keeps each
            // partition's order anyway).
            byte[] key = Main.SENTINEL_KEY.getBytes(StandardCharsets.US_ASCII);
            long timestamp = base + span + Main.SENTINEL_AFTER_MS;
            List<PartitionInfo> infos = producer.partitionsFor(topic);
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (PartitionInfo info : infos) {
                sent.add(producer.send(
                        new ProducerRecord<>(topic, info.partition(), timestamp, key, value(records, valueBytes))));
            }
            producer.flush();
            for (Future<RecordMetadata> f : sent) {
                f.get(); // a refused sentinel (its timestamp, say) fails the input
            }
            sentinels = infos.size();
        }
        double seconds = (System.nanoTime() - started) / 1e9;
        System.out.printf(Locale.ROOT, "{\"event\":\"produced\",\"records\":%d,\"sentinels\":%d,\"seconds\":%.3f}%n",
                records, sentinels, seconds);
    }

    /** VALUE_BYTES lowercase letters, varying with the id. */
    static byte[] value(long id, int bytes) {
        byte[] value = new byte[bytes];
        for (int i = 0; i < bytes; i++) {
            value[i] = (byte) ('a' + (int) ((id + i) % 26));
        }
        return value;
    }
}
