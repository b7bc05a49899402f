package shareflow.bench;

import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Writes the bench's input: RECORDS records, each keyed by its id as eight decimal
 * digits, with a value of VALUE_BYTES lowercase ASCII that starts with the id, so that
 * the counter can tell every record and whether it was upper-cased. BATCH_BYTES is the
 * producer's batch.size (Kafka's default is 16384); the records go round-robin over the
 * topic's partitions by key hash.
 */
final class Produce {
    private Produce() {}

    static void run(String[] args) throws Exception {
        Main.expect(args, 5, 5);
        String bootstrap = args[0];
        String topic = args[1];
        long records = Main.number("RECORDS", args[2]);
        int valueBytes = (int) Main.number("VALUE_BYTES", args[3]);
        int batchBytes = (int) Main.number("BATCH_BYTES", args[4]);
        if (records > 99_999_999L) {
            Main.usage("RECORDS must fit in eight digits, got " + records);
        }
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, Integer.toString(batchBytes));
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        long started = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (long id = 0; id < records; id++) {
                byte[] key = String.format("%08d", id).getBytes(StandardCharsets.US_ASCII);
                producer.send(new ProducerRecord<>(topic, key, value(id, valueBytes)));
            }
            producer.flush();
        }
        double seconds = (System.nanoTime() - started) / 1e9;
        System.out.printf(java.util.Locale.ROOT, "{\"event\":\"produced\",\"records\":%d,\"seconds\":%.3f}%n", records, seconds);
    }

    /** "record-00000042 " and then lowercase letters up to `bytes`. */
    static byte[] value(long id, int bytes) {
        byte[] head = String.format("record-%08d ", id).getBytes(StandardCharsets.US_ASCII);
        byte[] value = new byte[Math.max(bytes, head.length)];
        System.arraycopy(head, 0, value, 0, head.length);
        for (int i = head.length; i < value.length; i++) {
            value[i] = (byte) ('a' + (int) ((id + i) % 26));
        }
        return value;
    }
}
