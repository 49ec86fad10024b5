<?php
// Publishes an order's payment timeout to order-timeout, with php-amqplib 3.x
// (composer: php-amqplib/php-amqplib; Debian: php-amqplib).
//
// Call it right after the transaction that INSERTs the order has committed:
//
//     $timeouts = new OrderTimeoutPublisher(getenv('AMQP_URL'));
//     $timeouts->publishTimeout($order->id, $order->expiresAt);
//
// Keep one publisher per worker process and reuse it. The contract it follows
// is README.md's "Publishing a timeout"; clients/README.md has the command-line
// form the tests drive:  php OrderTimeoutPublisher.php AMQP_URL [--lane SECONDS] SPEC...

declare(strict_types=1);

require_once file_exists(__DIR__ . '/vendor/autoload.php')
    ? __DIR__ . '/vendor/autoload.php'   // composer
    : 'PhpAmqpLib/autoload.php';         // Debian's php-amqplib, on the include path

use PhpAmqpLib\Channel\AMQPChannel;
use PhpAmqpLib\Connection\AbstractConnection;
use PhpAmqpLib\Connection\AMQPSSLConnection;
use PhpAmqpLib\Connection\AMQPStreamConnection;
use PhpAmqpLib\Message\AMQPMessage;

final class PublishFailed extends RuntimeException
{
}

final class OrderTimeoutPublisher
{
    /** The service's entry exchange (durable, direct). */
    public const EXCHANGE = 'order-timeout';
    /** The routing key for any deadline. */
    public const SCHEDULE = 'schedule';

    private const MAX_ATTEMPTS = 5;
    private const FIRST_BACKOFF_MS = 100;
    private const CONFIRM_TIMEOUT_S = 5.0;

    private ?AbstractConnection $connection = null;
    private ?AMQPChannel $channel = null;
    private ?string $outcome = null;

    /**
     * A publisher for the broker at $amqpUrl (amqp:// or amqps://, the vhost in
     * the path) routing with $routingKey: self::SCHEDULE, or laneRoutingKey()
     * when the shop gives every order the same payment window and the service
     * runs that window as a lane.
     */
    public function __construct(private string $amqpUrl, private string $routingKey = self::SCHEDULE)
    {
    }

    /** The routing key of the lane for a payment window: 1800 s → "schedule.1800s". */
    public static function laneRoutingKey(int $windowSeconds): string
    {
        return self::SCHEDULE . '.' . $windowSeconds . 's';
    }

    /** {"order_id": …, "cancel_at": …}: the deadline the order row holds (its expires_at). */
    public function publishTimeout(string|int $orderId, DateTimeInterface $cancelAt): void
    {
        $this->publish($orderId, ['order_id' => $orderId, 'cancel_at' => self::rfc3339($cancelAt)]);
    }

    /** {"order_id": …, "created_at": …, "timeout_ms": …}: a creation time and a window. */
    public function publishTimeoutAfter(string|int $orderId, DateTimeInterface $createdAt, int $timeoutMs): void
    {
        $this->publish($orderId, [
            'order_id' => $orderId,
            'created_at' => self::rfc3339($createdAt),
            'timeout_ms' => $timeoutMs,
        ]);
    }

    /** {"order_id": …}: the service reads the deadline from the order row. */
    public function publishOrderId(string|int $orderId): void
    {
        $this->publish($orderId, ['order_id' => $orderId]);
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
    private function publish(string|int $orderId, array $body): void
    {
        $message = new AMQPMessage(json_encode($body, JSON_THROW_ON_ERROR | JSON_UNESCAPED_SLASHES), [
            'content_type' => 'application/json',
            'delivery_mode' => AMQPMessage::DELIVERY_MODE_PERSISTENT, // survives a broker restart
        ]);
        $last = '';
        for ($attempt = 1; $attempt <= self::MAX_ATTEMPTS; $attempt++) {
            try {
                $channel = $this->channel();
                $this->outcome = null;
                // mandatory: a message no queue takes (a lane key the service has
                // not bound yet) comes back instead of vanishing.
                $channel->basic_publish($message, self::EXCHANGE, $this->routingKey, true);
                $channel->wait_for_pending_acks_returns(self::CONFIRM_TIMEOUT_S);
                if ($this->outcome === 'ack') {
                    return;
                }
                $last = $this->outcome ?? 'no confirm';
            } catch (Throwable $e) {
                $last = get_class($e) . ': ' . $e->getMessage();
                $this->close();
            }
            if ($attempt < self::MAX_ATTEMPTS) {
                usleep((self::FIRST_BACKOFF_MS << ($attempt - 1)) * 1000);
            }
        }
        throw new PublishFailed("timeout of order $orderId not published: $last");
    }

    private function channel(): AMQPChannel
    {
        if ($this->channel !== null && $this->channel->is_open()) {
            return $this->channel;
        }
        $this->close();
        $url = parse_url($this->amqpUrl);
        if ($url === false || !in_array($url['scheme'] ?? '', ['amqp', 'amqps'], true)) {
            throw new InvalidArgumentException('AMQP URL must be amqp:// or amqps://');
        }
        $path = $url['path'] ?? '';
        $vhost = ($path === '' || $path === '/') ? '/' : rawurldecode(substr($path, 1));
        $user = rawurldecode($url['user'] ?? 'guest');
        $password = rawurldecode($url['pass'] ?? 'guest');
        $this->connection = $url['scheme'] === 'amqps'
            ? new AMQPSSLConnection($url['host'], $url['port'] ?? 5671, $user, $password, $vhost, ['verify_peer' => true])
            : new AMQPStreamConnection($url['host'], $url['port'] ?? 5672, $user, $password, $vhost);
        $channel = $this->connection->channel();
        $channel->confirm_select();
        // A return arrives before the ack of the same message.
        $channel->set_return_listener(function ($code, $text) {
            $this->outcome = "no queue took it ($code $text): is the service running with this routing key?";
        });
        $channel->set_ack_handler(function () {
            $this->outcome ??= 'ack';
        });
        $channel->set_nack_handler(function () {
            $this->outcome = 'the broker refused it (nack)';
        });
        return $this->channel = $channel;
    }

    public function close(): void
    {
        try {
            $this->connection?->close();
        } catch (Throwable) {
            // already gone
        }
        $this->connection = null;
        $this->channel = null;
    }

    private static function rfc3339(DateTimeInterface $at): string
    {
        return DateTimeImmutable::createFromInterface($at)
            ->setTimezone(new DateTimeZone('UTC'))
            ->format('Y-m-d\TH:i:s.v\Z');
    }
}

// Command line (clients/README.md): AMQP_URL [--lane SECONDS] SPEC...,
// SPEC = ID@CANCEL_AT | ID+TIMEOUT_MS | ID. Never prints the URL.
if (PHP_SAPI === 'cli' && realpath($argv[0]) === __FILE__) {
    $args = array_slice($argv, 1);
    $url = array_shift($args);
    $key = OrderTimeoutPublisher::SCHEDULE;
    $specs = [];
    for ($i = 0; $i < count($args); $i++) {
        if ($args[$i] === '--lane' && isset($args[$i + 1])) {
            $key = OrderTimeoutPublisher::laneRoutingKey((int) $args[++$i]);
        } else {
            $specs[] = $args[$i];
        }
    }
    if ($url === null || $specs === []) {
        fwrite(STDERR, "usage: php OrderTimeoutPublisher.php AMQP_URL [--lane SECONDS] ID@CANCEL_AT|ID+TIMEOUT_MS|ID...\n");
        exit(2);
    }
    $timeouts = new OrderTimeoutPublisher($url, $key);
    $failed = 0;
    foreach ($specs as $spec) {
        try {
            if (str_contains($spec, '@')) {
                [$id, $at] = explode('@', $spec, 2);
                $timeouts->publishTimeout($id, new DateTimeImmutable($at));
            } elseif (str_contains($spec, '+')) {
                [$id, $ms] = explode('+', $spec, 2);
                $timeouts->publishTimeoutAfter($id, new DateTimeImmutable('now'), (int) $ms);
            } else {
                $id = $spec;
                $timeouts->publishOrderId($id);
            }
            echo "published $id\n";
        } catch (PublishFailed $e) {
            // The order stands; the sweeper cancels it if it stays unpaid.
            fwrite(STDERR, "FAILED $id: {$e->getMessage()}\n");
            $failed++;
        }
    }
    $timeouts->close();
    exit($failed === 0 ? 0 : 1);
}
