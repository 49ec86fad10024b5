"""Publishes an order's payment timeout to order-timeout, with pika (PyPI:
pika; Debian: python3-pika).

Call it right after the transaction that INSERTs the order has committed::

    timeouts = OrderTimeoutPublisher(os.environ["AMQP_URL"])
    timeouts.publish_timeout(order.id, cancel_at=order.expires_at)

Keep one publisher per process (per thread: pika's BlockingConnection is not
thread-safe) and reuse it. The contract it follows is README.md's "Publishing a
timeout"; clients/README.md has the command-line form the tests drive:
``python3 order_timeout_publisher.py AMQP_URL [--lane SECONDS] SPEC...``.
"""

import json
import sys
import time
from datetime import datetime, timedelta, timezone

import pika
from pika.exceptions import AMQPError, NackError, UnroutableError

EXCHANGE = "order-timeout"  # the service's entry exchange (durable, direct)
SCHEDULE = "schedule"  # the routing key for any deadline
MAX_ATTEMPTS = 5
FIRST_BACKOFF_S = 0.1


class PublishFailed(Exception):
    """Every attempt to publish a timeout failed."""


def lane_routing_key(window: timedelta) -> str:
    """The routing key of the lane for a payment window: 30 min -> "schedule.1800s"."""
    return f"{SCHEDULE}.{int(window.total_seconds())}s"


def _rfc3339(at: datetime) -> str:
    if at.tzinfo is None:
        raise ValueError("give an aware datetime (a naive one has no time zone)")
    return at.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class OrderTimeoutPublisher:
    """Publishes timeouts with publisher confirms on one connection.

    ``routing_key`` is SCHEDULE, or lane_routing_key(window) when the shop gives
    every order the same payment window and the service runs that window as a
    lane. It connects on first use.
    """

    def __init__(self, amqp_url: str, routing_key: str = SCHEDULE):
        self._params = pika.URLParameters(amqp_url)
        self._params.socket_timeout = 5
        self._params.blocked_connection_timeout = 5
        self._params.client_properties = {"connection_name": "order-service"}
        self._routing_key = routing_key
        self._connection = None
        self._channel = None

    def publish_timeout(self, order_id, cancel_at=None, created_at=None, timeout_ms=None):
        """Publishes one of the body forms:

        - cancel_at: ``{"order_id", "cancel_at"}``, the deadline the order row
          holds (its expires_at);
        - created_at and timeout_ms: ``{"order_id", "created_at", "timeout_ms"}``;
        - neither: ``{"order_id"}``, the service reads the deadline from the row.
        """
        body = {"order_id": order_id}
        if cancel_at is not None:
            body["cancel_at"] = _rfc3339(cancel_at)
        elif timeout_ms is not None:
            body["created_at"] = _rfc3339(created_at or datetime.now(timezone.utc))
            body["timeout_ms"] = int(timeout_ms)
        self._publish(order_id, json.dumps(body).encode())

    def _publish(self, order_id, body: bytes):
        """One persistent, confirmed, mandatory publish, tried up to MAX_ATTEMPTS
        times with doubling backoff (a nack, a message no queue took, a lost
        connection). If every attempt fails this raises PublishFailed, and the
        caller must NOT roll the order back: its row is committed and the
        service's sweeper cancels every unpaid order whose deadline passed more
        than its grace period ago (60 s by default), message or not. A failed
        publish makes that order's cancellation late, never lost; log it."""
        properties = pika.BasicProperties(
            content_type="application/json",
            delivery_mode=2,  # persistent: survives a broker restart
        )
        last = ""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                # With confirm_delivery, basic_publish waits for the broker's
                # confirm. mandatory: a message no queue takes (a lane key the
                # service has not bound yet) comes back instead of vanishing.
                self._channel_or_connect().basic_publish(
                    EXCHANGE, self._routing_key, body, properties, mandatory=True
                )
                return
            except UnroutableError:
                last = "no queue took it: is the service running with this routing key?"
            except NackError:
                last = "the broker refused it (nack)"
            except (AMQPError, OSError) as e:
                last = f"{type(e).__name__}: {e}"
                self.close()
            if attempt < MAX_ATTEMPTS:
                time.sleep(FIRST_BACKOFF_S * 2 ** (attempt - 1))
        raise PublishFailed(f"timeout of order {order_id} not published: {last}")

    def _channel_or_connect(self):
        if self._channel is None or not self._channel.is_open:
            self.close()
            self._connection = pika.BlockingConnection(self._params)
            self._channel = self._connection.channel()
            self._channel.confirm_delivery()
        return self._channel

    def close(self):
        try:
            if self._connection is not None and self._connection.is_open:
                self._connection.close()
        except AMQPError:
            pass  # already gone
        self._connection = None
        self._channel = None


def main(argv):
    """AMQP_URL [--lane SECONDS] SPEC..., SPEC = ID@CANCEL_AT | ID+TIMEOUT_MS | ID.
    Never prints the URL."""
    args = argv[1:]
    if len(args) < 2:
        print("usage: order_timeout_publisher.py AMQP_URL [--lane SECONDS] ID@CANCEL_AT|ID+TIMEOUT_MS|ID...",
              file=sys.stderr)
        return 2
    url, rest = args[0], args[1:]
    key, specs = SCHEDULE, []
    while rest:
        arg = rest.pop(0)
        if arg == "--lane" and rest:
            key = lane_routing_key(timedelta(seconds=int(rest.pop(0))))
        else:
            specs.append(arg)
    timeouts = OrderTimeoutPublisher(url, key)
    failed = 0
    for spec in specs:
        try:
            if "@" in spec:
                order_id, at = spec.split("@", 1)
                timeouts.publish_timeout(order_id, cancel_at=datetime.fromisoformat(at.replace("Z", "+00:00")))
            elif "+" in spec:
                order_id, ms = spec.rsplit("+", 1)
                timeouts.publish_timeout(order_id, created_at=datetime.now(timezone.utc), timeout_ms=int(ms))
            else:
                order_id = spec
                timeouts.publish_timeout(order_id)
            print(f"published {order_id}", flush=True)
        except PublishFailed as e:
            # The order stands; the sweeper cancels it if it stays unpaid.
            print(f"FAILED {order_id}: {e}", file=sys.stderr, flush=True)
            failed += 1
    timeouts.close()
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
