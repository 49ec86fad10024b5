// Publishes an order's payment timeout to order-timeout, with the RabbitMQ Java
// client (com.rabbitmq:amqp-client 5.x; Debian: librabbitmq-client-java).
//
// Call it right after the transaction that INSERTs the order has committed:
//
//     try (OrderTimeoutPublisher timeouts = new OrderTimeoutPublisher(amqpUri, "schedule")) {
//         timeouts.publishTimeout(order.getId(), order.getExpiresAt());
//     }
//
// Keep one publisher (one connection, one channel) per process and reuse it;
// it is not thread-safe, so guard it or keep one per thread. The contract it
// follows is README.md's "Publishing a timeout"; clients/README.md has the
// command-line form the tests drive.
//
// Build and run (Debian: librabbitmq-client-java, libslf4j-java; slf4j-nop.jar is
// SLF4J's no-op binding: without a binding SLF4J prints three warnings):
//   javac -cp /usr/share/java/amqp-client.jar OrderTimeoutPublisher.java
//   java -cp .:/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-nop.jar \
//     OrderTimeoutPublisher amqp://guest:guest@127.0.0.1:5672/%2f 202611210001@2026-11-21T10:30:00Z

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeoutException;

public final class OrderTimeoutPublisher implements AutoCloseable {
    /** The service's entry exchange (durable, direct). */
    public static final String EXCHANGE = "order-timeout";
    /** The routing key for any deadline. */
    public static final String SCHEDULE = "schedule";

    private static final int MAX_ATTEMPTS = 5;
    private static final long FIRST_BACKOFF_MS = 100;
    private static final long CONFIRM_TIMEOUT_MS = 5_000;

    private final ConnectionFactory factory = new ConnectionFactory();
    private final String routingKey;
    private Connection connection;
    private Channel channel;
    private volatile String returned;

    /**
     * A publisher for the broker at {@code amqpUri} (amqp:// or amqps://, the
     * vhost in the path) routing with {@code routingKey}: {@link #SCHEDULE},
     * or {@link #laneRoutingKey} when the shop gives every order the same
     * payment window and the service runs that window as a lane.
     */
    public OrderTimeoutPublisher(String amqpUri, String routingKey) throws Exception {
        factory.setUri(amqpUri);
        factory.setConnectionTimeout(5_000);
        // Reconnecting is done here, per publish, so that a publish never
        // waits on a recovery in the background.
        factory.setAutomaticRecoveryEnabled(false);
        this.routingKey = routingKey;
    }

    /** The routing key of the lane for a payment window: 30 min → "schedule.1800s". */
    public static String laneRoutingKey(Duration window) {
        return SCHEDULE + "." + window.getSeconds() + "s";
    }

    /** {"order_id": …, "cancel_at": …}: the deadline the order row holds (its expires_at). */
    public void publishTimeout(String orderId, Instant cancelAt) throws PublishFailedException {
        publish(orderId, "{\"order_id\":" + json(orderId) + ",\"cancel_at\":\"" + cancelAt + "\"}");
    }

    /** {"order_id": …, "created_at": …, "timeout_ms": …}: a creation time and a window. */
    public void publishTimeout(String orderId, Instant createdAt, long timeoutMs) throws PublishFailedException {
        publish(orderId, "{\"order_id\":" + json(orderId) + ",\"created_at\":\"" + createdAt
                + "\",\"timeout_ms\":" + timeoutMs + "}");
    }

    /** {"order_id": …}: the service reads the deadline from the order row. */
    public void publishTimeout(String orderId) throws PublishFailedException {
        publish(orderId, "{\"order_id\":" + json(orderId) + "}");
    }

    // The same three for an integer id (a Long or long order.getId()): the id
    // is published as a JSON integer, {"order_id": 202611210001, …}, which
    // the contract accepts as it does the string "202611210001".

    /** {"order_id": 123, "cancel_at": …}: the deadline the order row holds (its expires_at). */
    public void publishTimeout(long orderId, Instant cancelAt) throws PublishFailedException {
        publish(Long.toString(orderId), "{\"order_id\":" + orderId + ",\"cancel_at\":\"" + cancelAt + "\"}");
    }

    /** {"order_id": 123, "created_at": …, "timeout_ms": …}: a creation time and a window. */
    public void publishTimeout(long orderId, Instant createdAt, long timeoutMs) throws PublishFailedException {
        publish(Long.toString(orderId), "{\"order_id\":" + orderId + ",\"created_at\":\"" + createdAt
                + "\",\"timeout_ms\":" + timeoutMs + "}");
    }

    /** {"order_id": 123}: the service reads the deadline from the order row. */
    public void publishTimeout(long orderId) throws PublishFailedException {
        publish(Long.toString(orderId), "{\"order_id\":" + orderId + "}");
    }

    /**
     * One persistent, confirmed, mandatory publish, tried up to MAX_ATTEMPTS
     * times with doubling backoff (a nack, no confirm in time, a message no
     * queue took, a lost connection). If every attempt fails this throws, and
     * the caller must NOT roll the order back: its row is committed and the
     * service's sweeper cancels every unpaid order whose deadline passed more
     * than its grace period ago (60 s by default), message or not. A failed
     * publish makes that order's cancellation late, never lost; log it.
     */
    private void publish(String orderId, String body) throws PublishFailedException {
        AMQP.BasicProperties props = new AMQP.BasicProperties.Builder()
                .contentType("application/json")
                .deliveryMode(2) // persistent: survives a broker restart
                .build();
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        String last = "";
        for (int attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
            try {
                Channel ch = channel();
                returned = null;
                // mandatory: a message no queue takes (a lane key the service has
                // not bound yet) comes back instead of vanishing.
                ch.basicPublish(EXCHANGE, routingKey, true, props, bytes);
                if (!ch.waitForConfirms(CONFIRM_TIMEOUT_MS)) {
                    last = "the broker refused it (nack)";
                } else if (returned != null) {
                    last = "no queue took it (" + returned + "): is the service running with this routing key?";
                } else {
                    return;
                }
            } catch (TimeoutException e) {
                last = "no confirm within " + CONFIRM_TIMEOUT_MS + " ms";
                reset();
            } catch (Exception e) {
                last = e.getClass().getSimpleName() + ": " + e.getMessage();
                reset();
            }
            if (attempt < MAX_ATTEMPTS) {
                try {
                    Thread.sleep(FIRST_BACKOFF_MS << (attempt - 1));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    break;
                }
            }
        }
        throw new PublishFailedException("timeout of order " + orderId + " not published: " + last);
    }

    private Channel channel() throws Exception {
        if (channel == null || !channel.isOpen()) {
            reset();
            connection = factory.newConnection("order-service");
            channel = connection.createChannel();
            channel.confirmSelect();
            channel.addReturnListener((code, text, exchange, key, properties, body) ->
                    returned = code + " " + text);
        }
        return channel;
    }

    private void reset() {
        try {
            if (connection != null) {
                connection.close(2_000);
            }
        } catch (Exception ignored) {
            // already gone
        }
        connection = null;
        channel = null;
    }

    @Override
    public void close() {
        reset();
    }

    /** A JSON string literal. */
    private static String json(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                default:
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        return out.append('"').toString();
    }

    /** Every attempt to publish a timeout failed. */
    public static final class PublishFailedException extends Exception {
        public PublishFailedException(String message) {
            super(message);
        }
    }

    /**
     * Command line (clients/README.md): AMQP_URL [--lane SECONDS] SPEC...,
     * SPEC = ID@CANCEL_AT | ID+TIMEOUT_MS | ID. Never prints the URL.
     */
    public static void main(String[] args) throws Exception {
        List<String> specs = new ArrayList<>();
        String key = SCHEDULE;
        for (int i = 1; i < args.length; i++) {
            if (args[i].equals("--lane") && i + 1 < args.length) {
                key = laneRoutingKey(Duration.ofSeconds(Long.parseLong(args[++i])));
            } else {
                specs.add(args[i]);
            }
        }
        if (args.length < 2 || specs.isEmpty()) {
            System.err.println("usage: OrderTimeoutPublisher AMQP_URL [--lane SECONDS] ID@CANCEL_AT|ID+TIMEOUT_MS|ID...");
            System.exit(2);
        }
        int failed = 0;
        try (OrderTimeoutPublisher timeouts = new OrderTimeoutPublisher(args[0], key)) {
            for (String spec : specs) {
                int at = spec.indexOf('@');
                int plus = spec.lastIndexOf('+');
                String id = at >= 0 ? spec.substring(0, at) : plus >= 0 ? spec.substring(0, plus) : spec;
                try {
                    if (at >= 0) {
                        timeouts.publishTimeout(id, Instant.parse(spec.substring(at + 1)));
                    } else if (plus >= 0) {
                        timeouts.publishTimeout(id, Instant.now(), Long.parseLong(spec.substring(plus + 1)));
                    } else {
                        timeouts.publishTimeout(id);
                    }
                    System.out.println("published " + id);
                } catch (PublishFailedException e) {
                    // The order stands; the sweeper cancels it if it stays unpaid.
                    System.err.println("FAILED " + id + ": " + e.getMessage());
                    failed++;
                }
            }
        }
        System.exit(failed == 0 ? 0 : 1);
    }
}
