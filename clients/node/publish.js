// Publishes an order's payment timeout to order-timeout, with amqplib (npm).
//
// Call it right after the transaction that INSERTs the order has committed:
//
//   const timeouts = new OrderTimeoutPublisher(process.env.AMQP_URL);
//   await timeouts.publishTimeout(order.id, { cancelAt: order.expiresAt });
//
// Keep one publisher per process and reuse it (publishes are serialised on its
// one confirm channel). The contract it follows is README.md's "Publishing a
// timeout"; clients/README.md has the command-line form the tests drive:
//   node publish.js AMQP_URL [--lane SECONDS] SPEC...
'use strict';

const amqp = require('amqplib');

const EXCHANGE = 'order-timeout'; // the service's entry exchange (durable, direct)
const SCHEDULE = 'schedule'; // the routing key for any deadline
const MAX_ATTEMPTS = 5;
const FIRST_BACKOFF_MS = 100;
const CONFIRM_TIMEOUT_MS = 5000;

/** The routing key of the lane for a payment window in seconds: 1800 → "schedule.1800s". */
function laneRoutingKey(windowSeconds) {
  return `${SCHEDULE}.${Math.trunc(windowSeconds)}s`;
}

class PublishFailed extends Error {}

class OrderTimeoutPublisher {
  /**
   * A publisher for the broker at amqpUrl (amqp:// or amqps://, the vhost in the
   * path) routing with routingKey: SCHEDULE, or laneRoutingKey(window) when the
   * shop gives every order the same payment window and the service runs that
   * window as a lane. It connects on first use.
   */
  constructor(amqpUrl, routingKey = SCHEDULE) {
    this.url = amqpUrl;
    this.routingKey = routingKey;
    this.channel = null;
    this.connection = null;
    this.queue = Promise.resolve();
  }

  /**
   * Publishes one of the body forms:
   * - { cancelAt }: {"order_id", "cancel_at"}, the deadline the order row holds (its expires_at);
   * - { createdAt, timeoutMs }: {"order_id", "created_at", "timeout_ms"};
   * - {}: {"order_id"}, the service reads the deadline from the row.
   */
  publishTimeout(orderId, { cancelAt, createdAt, timeoutMs } = {}) {
    const body = { order_id: orderId };
    if (cancelAt !== undefined) {
      body.cancel_at = new Date(cancelAt).toISOString();
    } else if (timeoutMs !== undefined) {
      body.created_at = new Date(createdAt ?? Date.now()).toISOString();
      body.timeout_ms = timeoutMs;
    }
    // One publish at a time: a return then belongs to the message in flight.
    const next = this.queue.then(() => this.publish(orderId, Buffer.from(JSON.stringify(body))));
    this.queue = next.catch(() => {});
    return next;
  }

  /**
   * One persistent, confirmed, mandatory publish, tried up to MAX_ATTEMPTS
   * times with doubling backoff (a nack, no confirm in time, a message no queue
   * took, a lost connection). If every attempt fails this rejects, and the
   * caller must NOT roll the order back: its row is committed and the service's
   * sweeper cancels every unpaid order whose deadline passed more than its grace
   * period ago (60 s by default), message or not. A failed publish makes that
   * order's cancellation late, never lost; log it.
   */
  async publish(orderId, content) {
    let last = '';
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      try {
        const channel = await this.open();
        this.returned = null;
        await withTimeout(
          new Promise((resolve, reject) => {
            channel.publish(
              EXCHANGE,
              this.routingKey,
              content,
              {
                contentType: 'application/json',
                persistent: true, // delivery_mode 2: survives a broker restart
                // A message no queue takes (a lane key the service has not
                // bound yet) comes back instead of vanishing.
                mandatory: true,
              },
              (err) => (err ? reject(new Error('the broker refused it (nack)')) : resolve()),
            );
          }),
          CONFIRM_TIMEOUT_MS,
        );
        // The broker sends a return before the ack of the same message.
        if (this.returned === null) return;
        last = `no queue took it (${this.returned}): is the service running with this routing key?`;
      } catch (err) {
        last = err.message;
        await this.close();
      }
      if (attempt < MAX_ATTEMPTS) await sleep(FIRST_BACKOFF_MS * 2 ** (attempt - 1));
    }
    throw new PublishFailed(`timeout of order ${orderId} not published: ${last}`);
  }

  async open() {
    if (this.channel) return this.channel;
    this.connection = await amqp.connect(this.url, {
      timeout: 5000,
      clientProperties: { connection_name: 'order-service' },
    });
    this.connection.on('error', () => {}); // reported through the publish that fails
    this.connection.on('close', () => {
      this.channel = null;
      this.connection = null;
    });
    const channel = await this.connection.createConfirmChannel();
    channel.on('error', () => {});
    channel.on('close', () => {
      this.channel = null;
    });
    channel.on('return', (msg) => {
      this.returned = `${msg.fields.replyCode} ${msg.fields.replyText}`;
    });
    this.channel = channel;
    return channel;
  }

  async close() {
    const connection = this.connection;
    this.channel = null;
    this.connection = null;
    if (connection) {
      try {
        await connection.close();
      } catch {
        // already gone
      }
    }
  }
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function withTimeout(promise, ms) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no confirm within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// Command line (clients/README.md): AMQP_URL [--lane SECONDS] SPEC...,
// SPEC = ID@CANCEL_AT | ID+TIMEOUT_MS | ID. Never prints the URL.
async function main(argv) {
  const [url, ...rest] = argv;
  let key = SCHEDULE;
  const specs = [];
  for (let i = 0; i < rest.length; i++) {
    if (rest[i] === '--lane' && i + 1 < rest.length) key = laneRoutingKey(Number(rest[++i]));
    else specs.push(rest[i]);
  }
  if (!url || specs.length === 0) {
    console.error('usage: node publish.js AMQP_URL [--lane SECONDS] ID@CANCEL_AT|ID+TIMEOUT_MS|ID...');
    return 2;
  }
  const timeouts = new OrderTimeoutPublisher(url, key);
  let failed = 0;
  for (const spec of specs) {
    let id = spec;
    try {
      if (spec.includes('@')) {
        const at = spec.indexOf('@');
        id = spec.slice(0, at);
        await timeouts.publishTimeout(id, { cancelAt: spec.slice(at + 1) });
      } else if (spec.includes('+')) {
        const plus = spec.lastIndexOf('+');
        id = spec.slice(0, plus);
        await timeouts.publishTimeout(id, { createdAt: Date.now(), timeoutMs: Number(spec.slice(plus + 1)) });
      } else {
        await timeouts.publishTimeout(id);
      }
      console.log(`published ${id}`);
    } catch (err) {
      if (!(err instanceof PublishFailed)) throw err;
      // The order stands; the sweeper cancels it if it stays unpaid.
      console.error(`FAILED ${id}: ${err.message}`);
      failed++;
    }
  }
  await timeouts.close();
  return failed === 0 ? 0 : 1;
}

module.exports = { OrderTimeoutPublisher, PublishFailed, laneRoutingKey, EXCHANGE, SCHEDULE };

if (require.main === module) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err) => {
      console.error(err.message);
      process.exit(1);
    },
  );
}
