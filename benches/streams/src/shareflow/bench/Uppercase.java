package shareflow.bench;

import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

/**
 * The Kafka Streams reference: a stateless topology that upper-cases each value of INPUT
 * into OUTPUT, exactly_once_v2, as a user would write it; everything not named here is
 * Kafka Streams' default. It runs until SIGTERM, then closes the application.
 */
final class Uppercase {
    private Uppercase() {}

    static void run(String[] args) throws Exception {
        Main.expect(args, 6, 6);
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.toString(Main.number("COMMIT_MS", args[4])));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Long.toString(Main.number("THREADS", args[5])));
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[2], Consumed.with(Serdes.ByteArray(), Serdes.String()))
                .mapValues(value -> value == null ? null : value.toUpperCase(Locale.ROOT))
                .to(args[3], Produced.with(Serdes.ByteArray(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            stopped.countDown();
        }));
        streams.setUncaughtExceptionHandler(e -> {
            System.err.println("streams-bench: the Streams application failed: " + e);
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
                    .SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.ERROR) {
                System.err.println("streams-bench: the Streams application is in state ERROR; stopping");
                System.err.flush();
                Runtime.getRuntime().halt(1);
            }
        });
        streams.start();
        System.out.println("{\"event\":\"started\"}");
        stopped.await();
    }
}
